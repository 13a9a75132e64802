//! `append`: new K/V rows into paged and dense caches of every K/V type at scattered slots
//! (checked element by element, and everything else left as it was), K rotated by a RoPE on the
//! way, `i8` rows with their per-(token, kv head) scales or with scales the caller gives
//! (`append_scaled`: per channel, per tensor, saturating), and errors that write nothing.

use sdpa::half::{bf16, f16};
use sdpa::{
    append, append_scaled, Element, Error, KvElement, Operand, Rope, RopeStyle, Tensor, TensorMut,
};

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

/// An `i8` cache, the f32 rows it holds, their head size and the scale of `(head, channel)`.
type Side<'x> = (&'x [i8], &'x [f32], usize, &'x dyn Fn(usize, usize) -> f32);

/// `round(x / scale)` (ties to even) saturated to ±127, 0 for a scale of 0: what
/// `append_scaled` stores.
fn quantize(x: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        0
    } else {
        (x / scale).round_ties_even().clamp(-127.0, 127.0) as i8
    }
}

#[test]
fn append_scaled_stores_rows_with_the_given_scales() {
    let (k, v) = (rows(D_K, 7), rows(D_V, 8));
    let kt = Tensor::bshd(&k, [2, 3, HEADS, D_K]).unwrap();
    let vt = Tensor::bshd(&v, [2, 3, HEADS, D_V]).unwrap();
    // K per (kv head, channel): small enough that values of [-4, 4) clip, one channel 0, one
    // negative; V per tensor.
    let mut ks: Vec<f32> = (0..HEADS * D_K).map(|i| 0.01 + 0.004 * i as f32).collect();
    ks[1] = 0.0;
    ks[D_K + 2] = -0.05;
    let vs = [0.02f32];
    let kst = Tensor::bshd(&ks, [1, 1, HEADS, D_K]).unwrap();
    let vst = Tensor::bshd(&vs, [1, 1, 1, 1]).unwrap();
    let rope = Rope::new(RopeStyle::Interleaved, 4, 500.0);
    let positions = [3u32, 0, 9, 1, 2, 40];
    for with_rope in [false, true] {
        let rope = with_rope.then_some((&rope, &positions[..]));
        let mut kc = vec![99i8; PAGES * PAGE * HEADS * D_K];
        let mut vc = vec![99i8; PAGES * PAGE * HEADS * D_V];
        append_scaled(
            &kt,
            &vt,
            &mut pool_mut(&mut kc, true, D_K),
            &mut pool_mut(&mut vc, true, D_V),
            &SLOTS,
            &kst,
            &vst,
            rope,
        )
        .unwrap();
        // The rows as `append` writes them into an f32 cache: rotated, not rounded.
        let mut kf = vec![0.0f32; PAGES * PAGE * HEADS * D_K];
        let mut vf = vec![0.0f32; PAGES * PAGE * HEADS * D_V];
        let (mut kft, mut vft) = (pool_mut(&mut kf, true, D_K), pool_mut(&mut vf, true, D_V));
        append(&kt, &vt, &mut kft, &mut vft, &SLOTS, None, rope).unwrap();
        let k_scale = |h: usize, c: usize| ks[h * D_K + c];
        let v_scale = |_: usize, _: usize| vs[0];
        let sides: [Side<'_>; 2] = [(&kc, &kf, D_K, &k_scale), (&vc, &vf, D_V, &v_scale)];
        let mut clipped = 0;
        for (cache, exact, d, scale) in sides {
            for &slot in &SLOTS {
                for h in 0..HEADS {
                    for c in 0..d {
                        let at = index(true, d, [slot / PAGE, slot % PAGE, h, c]);
                        let want = quantize(exact[at], scale(h, c));
                        assert_eq!(cache[at], want, "slot {slot} h {h} c {c}");
                        clipped += usize::from(want.unsigned_abs() == 127);
                    }
                }
            }
            let untouched = (PAGES * PAGE - SLOTS.len()) * HEADS * d;
            assert_eq!(cache.iter().filter(|&&q| q == 99).count(), untouched);
        }
        assert!(clipped > 0, "some values saturate");
    }
    // A scale of 0 stores zeros.
    let mut kc = vec![99i8; PAGES * PAGE * HEADS * D_K];
    let mut vc = vec![99i8; PAGES * PAGE * HEADS * D_V];
    append_scaled(
        &kt,
        &vt,
        &mut pool_mut(&mut kc, false, D_K),
        &mut pool_mut(&mut vc, false, D_V),
        &SLOTS,
        &kst,
        &vst,
        None,
    )
    .unwrap();
    for &slot in &SLOTS {
        assert_eq!(kc[index(false, D_K, [slot / PAGE, slot % PAGE, 0, 1])], 0);
    }
}

#[test]
fn append_scaled_checks_the_scales_it_reads_and_writes_nothing_on_error() {
    let (k, v) = (rows(D_K, 9), rows(D_V, 10));
    let kt = Tensor::bshd(&k, [2, 3, HEADS, D_K]).unwrap();
    let vt = Tensor::bshd(&v, [2, 3, HEADS, D_V]).unwrap();
    let run = |ks: &Tensor<'_, f32>, vs: &Tensor<'_, f32>| {
        let mut kc = vec![99i8; PAGES * PAGE * HEADS * D_K];
        let mut vc = vec![99i8; PAGES * PAGE * HEADS * D_V];
        let result = append_scaled(
            &kt,
            &vt,
            &mut pool_mut(&mut kc, false, D_K),
            &mut pool_mut(&mut vc, false, D_V),
            &SLOTS,
            ks,
            vs,
            None,
        );
        if result.is_err() {
            assert!(kc.iter().chain(&vc).all(|&q| q == 99), "nothing written");
        }
        result
    };
    let one = [0.05f32];
    let per_tensor = Tensor::bshd(&one, [1, 1, 1, 1]).unwrap();
    // Per-(token, kv head)-shaped scales: a NaN in a slot the call does not write is fine,
    // in one it writes is an error naming the scale's index.
    let mut per_token = vec![0.05f32; PAGES * PAGE * HEADS];
    let unused = (0..PAGES * PAGE).find(|s| !SLOTS.contains(s)).unwrap();
    per_token[unused * HEADS] = f32::NAN;
    let dims = [PAGES, PAGE, HEADS, 1];
    run(&Tensor::bshd(&per_token, dims).unwrap(), &per_tensor).unwrap();
    let used = SLOTS[2] * HEADS + 1;
    for bad in [f32::NAN, f32::INFINITY, f32::MAX / 100.0] {
        per_token[used] = bad;
        let err = run(&per_tensor, &Tensor::bshd(&per_token, dims).unwrap()).unwrap_err();
        assert!(
            matches!(err, Error::InvalidValue { operand: Operand::ValueScales, index, .. } if index == used),
            "{bad}: {err:?}"
        );
    }
    // Scales that do not broadcast against the cache.
    let three = [0.1f32; 3];
    let err = run(&Tensor::bshd(&three, [1, 1, 1, 3]).unwrap(), &per_tensor).unwrap_err();
    assert!(matches!(
        err,
        Error::NotBroadcastable {
            operand: Operand::KeyScales,
            ..
        }
    ));
    // The rows' own errors as `append`'s: a slot past the cache, NaN rows.
    let mut kc = vec![99i8; PAGES * PAGE * HEADS * D_K];
    let mut vc = vec![99i8; PAGES * PAGE * HEADS * D_V];
    let err = append_scaled(
        &kt,
        &vt,
        &mut pool_mut(&mut kc, false, D_K),
        &mut pool_mut(&mut vc, false, D_V),
        &[0, 1, 2, 3, 4, PAGES * PAGE],
        &per_tensor,
        &per_tensor,
        None,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidValue {
            operand: Operand::Slots,
            index: 5,
            ..
        }
    ));
    let mut bad = v.clone();
    bad[4 * HEADS * D_V] = f32::NEG_INFINITY;
    let bt = Tensor::bshd(&bad, [2, 3, HEADS, D_V]).unwrap();
    let err = append_scaled(
        &kt,
        &bt,
        &mut pool_mut(&mut kc, false, D_K),
        &mut pool_mut(&mut vc, false, D_V),
        &SLOTS,
        &per_tensor,
        &per_tensor,
        None,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidValue {
            operand: Operand::Value,
            index: 4,
            ..
        }
    ));
    assert!(kc.iter().chain(&vc).all(|&q| q == 99));
}

#[test]
fn a_cache_with_per_channel_scales_serves_attention() {
    // A dense cache `[1, 12, HEADS, D_K]` filled by `append_scaled` with per-(kv head,
    // channel) K scales and a per-tensor V scale; attention with the same views against the
    // same call on the dequantized f32 cache.
    let n = 12;
    let k = SplitMix::unit_values(n * HEADS * D_K, 70);
    let v = SplitMix::unit_values(n * HEADS * D_V, 71);
    let ks: Vec<f32> = (0..HEADS * D_K)
        .map(|i| (1.0 + i as f32 % 3.0) / 127.0)
        .collect();
    let vs = [1.0f32 / 127.0];
    let (kst, vst) = (
        Tensor::bshd(&ks, [1, 1, HEADS, D_K]).unwrap(),
        Tensor::bshd(&vs, [1, 1, 1, 1]).unwrap(),
    );
    let (mut kc, mut vc) = (vec![0i8; n * HEADS * D_K], vec![0i8; n * HEADS * D_V]);
    let slots: Vec<usize> = (0..n).collect();
    append_scaled(
        &Tensor::bshd(&k, [1, n, HEADS, D_K]).unwrap(),
        &Tensor::bshd(&v, [1, n, HEADS, D_V]).unwrap(),
        &mut TensorMut::bshd(&mut kc, [1, n, HEADS, D_K]).unwrap(),
        &mut TensorMut::bshd(&mut vc, [1, n, HEADS, D_V]).unwrap(),
        &slots,
        &kst,
        &vst,
        None,
    )
    .unwrap();
    let kf: Vec<f32> = (kc.iter().enumerate())
        .map(|(i, &x)| f32::from(x) * ks[i % (HEADS * D_K)])
        .collect();
    let vf: Vec<f32> = vc.iter().map(|&x| f32::from(x) * vs[0]).collect();
    let q = SplitMix::unit_values(3 * 2 * HEADS * D_K, 72);
    let qt = Tensor::bshd(&q, [1, 3, 2 * HEADS, D_K]).unwrap();
    let opts = sdpa::Options::new().causal(sdpa::Alignment::BottomRight);
    let mut with_i8 = vec![0.0f32; 3 * 2 * HEADS * D_V];
    sdpa::attention(
        &qt,
        &Tensor::bshd(&kc, [1, n, HEADS, D_K]).unwrap(),
        &Tensor::bshd(&vc, [1, n, HEADS, D_V]).unwrap(),
        &mut TensorMut::bshd(&mut with_i8, [1, 3, 2 * HEADS, D_V]).unwrap(),
        &opts.clone().kv_scales(kst, vst),
    )
    .unwrap();
    let mut with_f32 = vec![0.0f32; 3 * 2 * HEADS * D_V];
    sdpa::attention(
        &qt,
        &Tensor::bshd(&kf, [1, n, HEADS, D_K]).unwrap(),
        &Tensor::bshd(&vf, [1, n, HEADS, D_V]).unwrap(),
        &mut TensorMut::bshd(&mut with_f32, [1, 3, 2 * HEADS, D_V]).unwrap(),
        &opts,
    )
    .unwrap();
    for (a, b) in with_i8.iter().zip(&with_f32) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    assert!(with_i8.iter().any(|&x| x != 0.0));
}

/// A prompt's append (enough values to be split over the pool): the same cache bits on 1, 2
/// and 3 threads, for f16 pages with RoPE and i8 pages with per-token or given scales; every
/// slot written once (the untouched ones keep their sentinel).
#[test]
fn a_long_append_gives_the_same_bits_on_any_thread_count() {
    use crate::support::append::{append_on, F16_UNWRITTEN, GIVEN};
    let (n, hkv, d, page, pages) = (700, 2, 64, 16, 48);
    // Slots scattered over the pool: page (7·p + 5) mod pages for the token's page p.
    let slots: Vec<usize> = (0..n)
        .map(|t| (7 * (t / page) + 5) % pages * page + t % page)
        .collect();
    let positions: Vec<u32> = (0..n as u32).map(|t| 3 * t).collect();
    let run = |threads| append_on(threads, [n, hkv, d], [pages, page], &slots, &positions);
    let (one, (_, v)) = run(1);
    let unwritten = 2 * (pages * page - n) * hkv * d;
    let sentinel = f16::from_f32(F16_UNWRITTEN).to_bits();
    assert_eq!(
        one.f16.iter().filter(|&&b| b == sentinel).count(),
        unwritten
    );
    for cache in [&one.i8, &one.given] {
        assert_eq!(cache.iter().filter(|&&q| q == i8::MIN).count(), unwritten);
    }
    // The given-scale rows: round(x / 0.004) saturated (|x| < 1: at most 250, so some clip).
    let size = pages * page * hkv * d;
    let at = |t: usize, c: usize| slots[t] * hkv * d + c;
    assert_eq!(
        one.given[size + at(5, 3)],
        quantize(v[5 * hkv * d + 3], GIVEN)
    );
    for threads in [2, 3] {
        assert!(run(threads).0 == one, "{threads} threads");
    }
}

/// `i8` rows round to nearest, ties to even, and saturate: the values `append_scaled` stores
/// for a scale of 1 over every quarter step in [-130, 130] and the edge cases.
#[test]
fn i8_rounding_is_to_nearest_even_and_saturating() {
    let mut xs: Vec<f32> = (-520..=520).map(|i| i as f32 / 4.0).collect();
    xs.extend([
        0.499_999_97,
        -0.499_999_97,
        126.5,
        -126.5,
        1e30,
        -1e30,
        -0.0,
    ]);
    let n = xs.len();
    let (mut kc, mut vc) = (vec![0i8; n], vec![0i8; n]);
    let one = [1.0f32];
    let scale = Tensor::bshd(&one, [1, 1, 1, 1]).unwrap();
    let rows = Tensor::bshd(&xs, [1, n, 1, 1]).unwrap();
    let slots: Vec<usize> = (0..n).collect();
    append_scaled(
        &rows,
        &rows,
        &mut TensorMut::bshd(&mut kc, [1, n, 1, 1]).unwrap(),
        &mut TensorMut::bshd(&mut vc, [1, n, 1, 1]).unwrap(),
        &slots,
        &scale,
        &scale,
        None,
    )
    .unwrap();
    for (&x, &q) in xs.iter().zip(&kc) {
        let want = f64::from(x).round_ties_even().clamp(-127.0, 127.0) as i8;
        assert_eq!(q, want, "{x}");
    }
    assert_eq!(kc, vc);
}
