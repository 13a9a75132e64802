//! `append`: new K/V rows into paged and dense caches of every K/V type at scattered slots
//! (checked element by element, and everything else left as it was), K rotated by a RoPE on the
//! way, `i8` rows with their per-(token, kv head) scales, and errors that write nothing.

use sdpa::half::{bf16, f16};
use sdpa::{append, Element, Error, KvElement, Operand, Rope, RopeStyle, Tensor, TensorMut};

use crate::support::values::SplitMix;

const PAGES: usize = 5;
const PAGE: usize = 4;
const HEADS: usize = 2;
const D_K: usize = 6;
const D_V: usize = 4;

/// New rows `[B = 2, S = 3, HEADS, d]` of values in [-4, 4).
fn rows(d: usize, seed: u64) -> Vec<f32> {
    SplitMix::unit_values(2 * 3 * HEADS * d, seed)
        .into_iter()
        .map(|x| 4.0 * x)
        .collect()
}

/// Slots of the six tokens: scattered over the pages, none twice.
const SLOTS: [usize; 6] = [17, 2, 9, 0, 19, 12];

/// The pool's element `[page, offset, h, c]` in BSHD (`[P, page, H, d]`) or BHSD (`[P, H, page,
/// d]`) order.
fn index(bhsd: bool, d: usize, [p, o, h, c]: [usize; 4]) -> usize {
    if bhsd {
        ((p * HEADS + h) * PAGE + o) * d + c
    } else {
        ((p * PAGE + o) * HEADS + h) * d + c
    }
}

fn pool_mut<T>(data: &mut [T], bhsd: bool, d: usize) -> TensorMut<'_, T> {
    if bhsd {
        TensorMut::bhsd(data, [PAGES, HEADS, PAGE, d]).unwrap()
    } else {
        TensorMut::bshd(data, [PAGES, PAGE, HEADS, d]).unwrap()
    }
}

/// Appends into float caches of type `T` and checks every element: written ones are the rows
/// (K rotated by `rope` at `positions` first) rounded to `T`, the others the sentinel 7.
fn float_case<T: Element + KvElement + PartialEq>(bhsd: bool, rope: Option<(&Rope<'_>, &[u32])>) {
    let (k, v) = (rows(D_K, 1), rows(D_V, 2));
    let sentinel = T::from_f32(7.0);
    let mut kc = vec![sentinel; PAGES * PAGE * HEADS * D_K];
    let mut vc = vec![sentinel; PAGES * PAGE * HEADS * D_V];
    let (kt, vt) = (
        Tensor::bshd(&k, [2, 3, HEADS, D_K]).unwrap(),
        Tensor::bshd(&v, [2, 3, HEADS, D_V]).unwrap(),
    );
    append(
        &kt,
        &vt,
        &mut pool_mut(&mut kc, bhsd, D_K),
        &mut pool_mut(&mut vc, bhsd, D_V),
        &SLOTS,
        None,
        rope,
    )
    .unwrap();
    // The rotated K, as Rope::apply gives it in f32 (the same rounding to f32 first).
    let mut k_rot = k.clone();
    if let Some((rope, positions)) = rope {
        rope.apply(
            &mut TensorMut::bshd(&mut k_rot, [2, 3, HEADS, D_K]).unwrap(),
            positions,
        )
        .unwrap();
    }
    for (cache, src, d) in [(&kc, &k_rot, D_K), (&vc, &v, D_V)] {
        let mut written = vec![false; cache.len()];
        for (token, &slot) in SLOTS.iter().enumerate() {
            for h in 0..HEADS {
                for c in 0..d {
                    let at = index(bhsd, d, [slot / PAGE, slot % PAGE, h, c]);
                    let want = T::from_f32(src[(token * HEADS + h) * d + c]);
                    assert!(cache[at] == want, "{} token {token} h {h} c {c}", T::NAME);
                    written[at] = true;
                }
            }
        }
        for (x, w) in cache.iter().zip(&written) {
            assert!(*w || *x == sentinel, "an element outside the slots changed");
        }
    }
}

#[test]
fn float_caches_hold_the_rows() {
    for bhsd in [false, true] {
        float_case::<f32>(bhsd, None);
        float_case::<f16>(bhsd, None);
        float_case::<bf16>(bhsd, None);
    }
    let rope = Rope::new(RopeStyle::Halves, 4, 10_000.0);
    let positions = [5, 6, 7, 100, 101, 102];
    float_case::<f32>(false, Some((&rope, &positions)));
    float_case::<bf16>(true, Some((&rope, &positions)));
    let rope = Rope::new(RopeStyle::Interleaved, 6, 500_000.0);
    float_case::<f16>(false, Some((&rope, &positions)));
}

#[test]
fn i8_caches_hold_rows_and_their_scales() {
    let (mut k, v) = (rows(D_K, 3), rows(D_V, 4));
    k[..D_K].fill(0.0); // token 0, head 0: a row of zeros
    let mut kc = vec![99i8; PAGES * PAGE * HEADS * D_K];
    let mut vc = vec![99i8; PAGES * PAGE * HEADS * D_V];
    let mut ks = vec![-1.0f32; PAGES * PAGE * HEADS];
    let mut vs = vec![-1.0f32; PAGES * PAGE * HEADS];
    let (kt, vt) = (
        Tensor::bshd(&k, [2, 3, HEADS, D_K]).unwrap(),
        Tensor::bshd(&v, [2, 3, HEADS, D_V]).unwrap(),
    );
    let dims = [PAGES, PAGE, HEADS, 1];
    let (mut kst, mut vst) = (
        TensorMut::bshd(&mut ks, dims).unwrap(),
        TensorMut::bshd(&mut vs, dims).unwrap(),
    );
    append(
        &kt,
        &vt,
        &mut pool_mut(&mut kc, false, D_K),
        &mut pool_mut(&mut vc, false, D_V),
        &SLOTS,
        Some((&mut kst, &mut vst)),
        None,
    )
    .unwrap();
    for (cache, scales, src, d) in [(&kc, &ks, &k, D_K), (&vc, &vs, &v, D_V)] {
        for (token, &slot) in SLOTS.iter().enumerate() {
            for h in 0..HEADS {
                let row = &src[(token * HEADS + h) * d..][..d];
                let amax = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let scale = scales[slot * HEADS + h];
                assert_eq!(scale, amax / 127.0, "token {token} h {h}");
                for (c, &x) in row.iter().enumerate() {
                    let q = cache[index(false, d, [slot / PAGE, slot % PAGE, h, c])];
                    assert!(q != i8::MIN, "saturated to ±127");
                    let err = (f64::from(q) * f64::from(scale) - f64::from(x)).abs();
                    assert!(
                        err <= f64::from(scale) * 0.5 * (1.0 + 1e-6),
                        "{err} > scale/2"
                    );
                }
            }
        }
        let written = SLOTS.len() * HEADS;
        assert_eq!(scales.iter().filter(|&&s| s != -1.0).count(), written);
    }
    assert_eq!(ks[SLOTS[0] * HEADS], 0.0, "a row of zeros has scale 0");
    assert_eq!(
        kc.iter().filter(|&&q| q == 99).count(),
        (PAGES * PAGE - 6) * HEADS * D_K
    );
}

#[test]
fn errors_write_nothing() {
    let (k, v) = (rows(D_K, 5), rows(D_V, 6));
    let kt = Tensor::bshd(&k, [2, 3, HEADS, D_K]).unwrap();
    let vt = Tensor::bshd(&v, [2, 3, HEADS, D_V]).unwrap();
    let run = |slots: &[usize], kt: &Tensor<'_, f32>| {
        let mut kc = vec![0.0f32; PAGES * PAGE * HEADS * D_K];
        let mut vc = vec![0.0f32; PAGES * PAGE * HEADS * D_V];
        let err = append(
            kt,
            &vt,
            &mut pool_mut(&mut kc, false, D_K),
            &mut pool_mut(&mut vc, false, D_V),
            slots,
            None,
            None,
        )
        .unwrap_err();
        assert!(
            kc.iter().chain(&vc).all(|&x| x == 0.0),
            "nothing written: {err:?}"
        );
        err
    };
    let invalid = |err: Error, want: Operand, at: usize| match err {
        Error::InvalidValue { operand, index, .. } => operand == want && index == at,
        _ => false,
    };
    assert!(invalid(run(&[0, 1, 2, 3, 4, 20], &kt), Operand::Slots, 5));
    assert!(invalid(run(&[0, 1, 2, 3, 1, 5], &kt), Operand::Slots, 4));
    assert!(matches!(
        run(&[0, 1, 2], &kt),
        Error::LengthMismatch {
            operand: Operand::Slots,
            expected: 6,
            got: 3
        }
    ));
    let k3 = Tensor::bshd(&k[..2 * 3 * HEADS * 3], [2, 3, HEADS, 3]).unwrap();
    assert!(matches!(
        run(&SLOTS, &k3),
        Error::ShapeMismatch {
            operand: Operand::Key,
            ..
        }
    ));

    // i8: scales required, finite values only; scales refused for a float cache.
    let mut kc = vec![0i8; PAGES * PAGE * HEADS * D_K];
    let mut vc = vec![0i8; PAGES * PAGE * HEADS * D_V];
    let err = append(
        &kt,
        &vt,
        &mut pool_mut(&mut kc, false, D_K),
        &mut pool_mut(&mut vc, false, D_V),
        &SLOTS,
        None,
        None,
    )
    .unwrap_err();
    assert_eq!(err, Error::KvScales { kv_type: "i8" });
    let mut bad = k.clone();
    bad[3 * HEADS * D_K + 1] = f32::NAN; // token 3
    let bt = Tensor::bshd(&bad, [2, 3, HEADS, D_K]).unwrap();
    let (mut ks, mut vs) = (
        vec![0.0f32; PAGES * PAGE * HEADS],
        vec![0.0f32; PAGES * PAGE * HEADS],
    );
    let dims = [PAGES, PAGE, HEADS, 1];
    let mut kst = TensorMut::bshd(&mut ks, dims).unwrap();
    let mut vst = TensorMut::bshd(&mut vs, dims).unwrap();
    let err = append(
        &bt,
        &vt,
        &mut pool_mut(&mut kc, false, D_K),
        &mut pool_mut(&mut vc, false, D_V),
        &SLOTS,
        Some((&mut kst, &mut vst)),
        None,
    )
    .unwrap_err();
    assert!(invalid(err, Operand::Key, 3));
    assert!(kc.iter().all(|&q| q == 0) && ks.iter().all(|&s| s == 0.0));
    let mut fk = vec![0.0f32; PAGES * PAGE * HEADS * D_K];
    let mut fv = vec![0.0f32; PAGES * PAGE * HEADS * D_V];
    let mut kst = TensorMut::bshd(&mut ks, dims).unwrap();
    let mut vst = TensorMut::bshd(&mut vs, dims).unwrap();
    let err = append(
        &kt,
        &vt,
        &mut pool_mut(&mut fk, false, D_K),
        &mut pool_mut(&mut fv, false, D_V),
        &SLOTS,
        Some((&mut kst, &mut vst)),
        None,
    )
    .unwrap_err();
    assert_eq!(err, Error::KvScales { kv_type: "f32" });
}

#[test]
fn an_i8_paged_cache_written_by_append_serves_attention() {
    // Two sequences of 6 and 9 keys over 4-slot pages (the table's pages out of order), the
    // cache written by `append` in two steps (a prompt, then one token each), then one decode
    // row per sequence: the i8 call with the scales `append` wrote against the same call on the
    // dequantized f32 pool (the values the kernel dequantizes to), within the f32 bound's
    // order of magnitude.
    let (h, hkv, d) = (4, 2, 8);
    let table: [u32; 6] = [3, 0, 4, 1, 2, 5];
    let slot = |b: usize, j: usize| table[b * 3 + j / PAGE] as usize * PAGE + j % PAGE;
    let lens = [6usize, 9];
    let mut kc = vec![0i8; 6 * PAGE * hkv * d];
    let mut vc = vec![0i8; 6 * PAGE * hkv * d];
    let mut ks = vec![0.0f32; 6 * PAGE * hkv];
    let mut vs = vec![0.0f32; 6 * PAGE * hkv];
    let pool = [6, PAGE, hkv, d];
    let scale_dims = [6, PAGE, hkv, 1];
    let rope = Rope::new(RopeStyle::Halves, d, 10_000.0);
    for (step, tokens) in [(0, [5usize, 8]), (1, [1, 1])] {
        for b in 0..2 {
            let first = if step == 0 { 0 } else { lens[b] - 1 };
            let n = tokens[b];
            let k = SplitMix::unit_values(n * hkv * d, 40 + (step * 2 + b) as u64);
            let v = SplitMix::unit_values(n * hkv * d, 50 + (step * 2 + b) as u64);
            let slots: Vec<usize> = (first..first + n).map(|j| slot(b, j)).collect();
            let positions: Vec<u32> = (first..first + n).map(|j| j as u32).collect();
            let (mut kst, mut vst) = (
                TensorMut::bshd(&mut ks, scale_dims).unwrap(),
                TensorMut::bshd(&mut vs, scale_dims).unwrap(),
            );
            append(
                &Tensor::bshd(&k, [1, n, hkv, d]).unwrap(),
                &Tensor::bshd(&v, [1, n, hkv, d]).unwrap(),
                &mut TensorMut::bshd(&mut kc, pool).unwrap(),
                &mut TensorMut::bshd(&mut vc, pool).unwrap(),
                &slots,
                Some((&mut kst, &mut vst)),
                Some((&rope, &positions)),
            )
            .unwrap();
        }
    }
    let deq = |q: &[i8], s: &[f32]| -> Vec<f32> {
        q.iter()
            .enumerate()
            .map(|(i, &x)| f32::from(x) * s[i / d])
            .collect()
    };
    let (kf, vf) = (deq(&kc, &ks), deq(&vc, &vs));
    let q = SplitMix::unit_values(2 * h * d, 60);
    let qt = Tensor::bshd(&q, [2, 1, h, d]).unwrap();
    let opts = sdpa::Options::new().kv_lens(&lens);
    let call = |kv: &dyn Fn(&mut TensorMut<'_, f32>, &sdpa::Options<'_>)| {
        let mut out = vec![0.0f32; 2 * h * d];
        kv(&mut TensorMut::bshd(&mut out, [2, 1, h, d]).unwrap(), &opts);
        out
    };
    let with_i8 = call(&|out, opts| {
        let kv = sdpa::PagedKv::new(
            Tensor::bshd(&kc, pool).unwrap(),
            Tensor::bshd(&vc, pool).unwrap(),
            &table,
            3,
        )
        .unwrap();
        let opts = opts.clone().kv_scales(
            Tensor::bshd(&ks, scale_dims).unwrap(),
            Tensor::bshd(&vs, scale_dims).unwrap(),
        );
        sdpa::attention_paged(&qt, &kv, out, None, &opts).unwrap();
    });
    let with_f32 = call(&|out, opts| {
        let kv = sdpa::PagedKv::new(
            Tensor::bshd(&kf, pool).unwrap(),
            Tensor::bshd(&vf, pool).unwrap(),
            &table,
            3,
        )
        .unwrap();
        sdpa::attention_paged(&qt, &kv, out, None, opts).unwrap();
    });
    for (a, b) in with_i8.iter().zip(&with_f32) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    assert!(with_i8.iter().any(|&x| x != 0.0));
}
