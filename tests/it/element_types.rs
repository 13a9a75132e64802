//! Element types: Q, K/V and the output in f32, f16 or bf16, in the combinations engines use,
//! against the f64 reference (which converts every input exactly) within
//! `error_bounds(..).for_output::<O>()`, over options, layouts, GQA and decode shapes; a
//! dominant key at block and split boundaries for each type; NaN/∞ and f16 overflow.

use sdpa::half::{bf16, f16};
use sdpa::{Alignment, Element, Options, Tensor, TensorMut};

use crate::support;
use support::contract::RowFacts;
use support::harness::{assert_tensors_against_reference, Layout};
use support::values::SplitMix;

/// `len` values uniform in `[−scale, scale)`: the tests' one filler.
fn values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
        .into_iter()
        .map(|x| x * scale)
        .collect()
}

fn to<T: Element>(xs: &[f32]) -> Vec<T> {
    xs.iter().map(|&x| T::from_f32(x)).collect()
}

/// The shape of one case: `[b, n_q, h, d_k]` queries, `[b, n_kv, h_kv, d]` keys and values.
#[derive(Debug, Clone, Copy)]
struct Shape {
    b: usize,
    h: usize,
    h_kv: usize,
    n_q: usize,
    n_kv: usize,
    d_k: usize,
    d_v: usize,
    bhsd: bool,
}

/// Runs the fused kernel (with and without LSE) and the reference on the same typed inputs and
/// checks every element and LSE against `error_bounds(..).for_output::<O>()` through the
/// harness; returns the worst error / bound.
fn check<Q: Element, KV: Element, O: Element>(s: Shape, opts: &Options<'_>, seed: u64) -> f64 {
    let q = to::<Q>(&values(s.b * s.n_q * s.h * s.d_k, seed, 1.0));
    let k = to::<KV>(&values(s.b * s.n_kv * s.h_kv * s.d_k, seed + 1, 1.0));
    let v = to::<KV>(&values(s.b * s.n_kv * s.h_kv * s.d_v, seed + 2, 1.0));
    fn view<T>(data: &[T], bhsd: bool, [b, n, h, d]: [usize; 4]) -> Tensor<'_, T> {
        if bhsd {
            Tensor::bhsd(data, [b, h, n, d]).unwrap()
        } else {
            Tensor::bshd(data, [b, n, h, d]).unwrap()
        }
    }
    let qv = view(&q, s.bhsd, [s.b, s.n_q, s.h, s.d_k]);
    let kv = view(&k, s.bhsd, [s.b, s.n_kv, s.h_kv, s.d_k]);
    let vv = view(&v, s.bhsd, [s.b, s.n_kv, s.h_kv, s.d_v]);
    let label = format!("{}/{}/{} {s:?} seed {seed}", Q::NAME, KV::NAME, O::NAME);
    let finite = |_| RowFacts::FINITE;
    assert_tensors_against_reference::<Q, KV, O>(&qv, &kv, &vv, Layout::BSHD, opts, finite, &label)
        .worst_ratio
}

/// Every option set of the grid, for a problem with `b` sequences and `h` query heads.
fn option_sets<'a>(lens: &'a [usize], slopes: &'a [f32], sinks: &'a [f32]) -> Vec<Options<'a>> {
    let br = Alignment::BottomRight;
    vec![
        Options::new(),
        Options::new().causal(br),
        Options::new().causal(Alignment::TopLeft).softcap(5.0),
        Options::new().sliding_window(40, 3, br).alibi(slopes, br),
        Options::new().kv_lens(lens).causal(br).sinks(sinks),
        Options::new().scale(0.3).softcap(30.0).kv_lens(lens),
    ]
}

fn grid<Q: Element, KV: Element, O: Element>() -> f64 {
    let shapes = [
        // prefill, GQA 2, BSHD; head sizes not multiples of the lanes
        Shape {
            b: 2,
            h: 4,
            h_kv: 2,
            n_q: 70,
            n_kv: 200,
            d_k: 40,
            d_v: 24,
            bhsd: false,
        },
        // PyTorch layout, MQA, d = 64
        Shape {
            b: 1,
            h: 3,
            h_kv: 1,
            n_q: 33,
            n_kv: 450,
            d_k: 64,
            d_v: 64,
            bhsd: true,
        },
        // decode across the split-KV boundary (few items, ≥ 2048 keys), d = 128
        Shape {
            b: 2,
            h: 8,
            h_kv: 2,
            n_q: 1,
            n_kv: 2500,
            d_k: 128,
            d_v: 128,
            bhsd: false,
        },
    ];
    let mut worst = 0.0f64;
    for (n, s) in shapes.into_iter().enumerate() {
        let lens: Vec<usize> = (0..s.b).map(|bb| s.n_kv - 17 * bb).collect();
        let slopes = sdpa::alibi_slopes(s.h).unwrap();
        let sinks: Vec<f32> = (0..s.h).map(|hh| hh as f32 * 0.5 - 1.0).collect();
        for (o, opts) in option_sets(&lens, &slopes, &sinks).iter().enumerate() {
            worst = worst.max(check::<Q, KV, O>(s, opts, (n * 10 + o) as u64));
        }
    }
    worst
}

#[test]
fn all_f32() {
    let w = grid::<f32, f32, f32>();
    assert!(w < 1.0, "{w}");
}

#[test]
fn all_f16() {
    grid::<f16, f16, f16>();
}

#[test]
fn all_bf16() {
    grid::<bf16, bf16, bf16>();
}

#[test]
fn f32_queries_and_output_with_half_caches() {
    // llama.cpp's way: Q and out f32, the KV cache in f16 (or bf16).
    grid::<f32, f16, f32>();
    grid::<f32, bf16, f32>();
}

#[test]
fn mixed_combinations() {
    grid::<f16, f16, f32>();
    grid::<bf16, bf16, f32>();
    grid::<f32, f32, bf16>();
    grid::<bf16, f32, f16>();
}

/// One key dominates at each block or split boundary: a dropped or duplicated key misses by
/// far more than the bound. For each type of K/V.
fn dominant_key<KV: Element>() {
    let (n_kv, d) = (3000, 16);
    for &j_big in &[0usize, 143, 144, 191, 192, 1499, 1500, 2999] {
        let q = vec![1.0f32; d];
        let mut k = values(n_kv * d, 5, 0.1);
        k[j_big * d..(j_big + 1) * d].fill(1.0);
        let mut v = values(n_kv * d, 6, 1.0);
        v[j_big * d..(j_big + 1) * d].fill(7.0);
        let (k, v) = (to::<KV>(&k), to::<KV>(&v));
        let qv = Tensor::bshd(&q, [1, 1, 1, d]).unwrap();
        let kv = Tensor::bshd(&k, [1, n_kv, 1, d]).unwrap();
        let vv = Tensor::bshd(&v, [1, n_kv, 1, d]).unwrap();
        let opts = Options::new().scale(4.0);
        let label = format!("{} key {j_big}", KV::NAME);
        let c = assert_tensors_against_reference::<f32, KV, f32>(
            &qv,
            &kv,
            &vv,
            Layout::BSHD,
            &opts,
            |_| RowFacts::FINITE,
            &label,
        );
        let out = c.fused.out;
        assert!(out[0] > 6.9, "{} key {j_big}: {}", KV::NAME, out[0]);
    }
}

#[test]
fn a_dominant_key_is_found_at_every_boundary_for_every_type() {
    dominant_key::<f32>();
    dominant_key::<f16>();
    dominant_key::<bf16>();
}

#[test]
fn non_finite_values_and_f16_overflow() {
    let d = 8;
    let q = to::<f16>(&[0.5; 8]);
    // Keys 0..4; key 2's value holds NaN and is hidden from row 0 by causal (top-left).
    let k = to::<f16>(&values(4 * d, 9, 1.0));
    let mut vf = values(4 * d, 10, 1.0);
    vf[2 * d + 1] = f32::NAN;
    let v = to::<f16>(&vf);
    let q2 = [q.clone(), q.clone()].concat();
    let qv = Tensor::bshd(&q2, [1, 2, 1, d]).unwrap();
    let kv = Tensor::bshd(&k, [1, 4, 1, d]).unwrap();
    let vv = Tensor::bshd(&v, [1, 4, 1, d]).unwrap();
    let mut out = vec![f16::from_f32(0.0); 2 * d];
    let opts = Options::new().causal(Alignment::TopLeft);
    let mut ov = TensorMut::bshd(&mut out, [1, 2, 1, d]).unwrap();
    sdpa::attention(&qv, &kv, &vv, &mut ov, &opts).unwrap();
    // Row 0 sees key 0, row 1 keys 0 and 1: neither sees key 2.
    assert!(out.iter().all(|x| x.to_f32().is_finite()), "{out:?}");
    let mut ov = TensorMut::bshd(&mut out, [1, 2, 1, d]).unwrap();
    sdpa::attention(&qv, &kv, &vv, &mut ov, &Options::new()).unwrap();
    // Both rows now see key 2, whose NaN sits in column 1: that column is NaN, the others
    // stay finite.
    for row in out.chunks(d) {
        for (c, x) in row.iter().enumerate() {
            assert_eq!(x.to_f32().is_nan(), c == 1, "column {c}: {row:?}");
        }
    }

    // Values within f32 but beyond f16's 65504 round to ±∞ in an f16 output (IEEE), and stay
    // finite in an f32 output.
    let big = vec![1.0e5f32; 4 * d];
    let big_neg: Vec<f32> = big.iter().map(|x| -x).collect();
    let qf = vec![0.5f32; d];
    let qv = Tensor::bshd(&qf, [1, 1, 1, d]).unwrap();
    let kf = values(4 * d, 11, 1.0);
    let kv = Tensor::bshd(&kf, [1, 4, 1, d]).unwrap();
    for (vals, inf) in [(&big, f32::INFINITY), (&big_neg, f32::NEG_INFINITY)] {
        let vv = Tensor::bshd(vals, [1, 4, 1, d]).unwrap();
        let mut o16 = vec![f16::from_f32(0.0); d];
        let mut ov = TensorMut::bshd(&mut o16, [1, 1, 1, d]).unwrap();
        sdpa::attention(&qv, &kv, &vv, &mut ov, &Options::new()).unwrap();
        assert!(o16.iter().all(|x| x.to_f32() == inf), "{o16:?}");
        let mut o32 = vec![0.0f32; d];
        let mut ov = TensorMut::bshd(&mut o32, [1, 1, 1, d]).unwrap();
        sdpa::attention(&qv, &kv, &vv, &mut ov, &Options::new()).unwrap();
        assert!(o32.iter().all(|x| (x.abs() - 1.0e5).abs() < 1.0), "{o32:?}");
    }
}

#[test]
fn strided_half_views_are_read_in_place() {
    // K and V in f16 with a strided head dimension (every other element) and a padded
    // sequence stride: the conversion path for strided rows.
    let (n_kv, d) = (300, 12);
    let q = values(5 * d, 20, 1.0);
    let kraw = to::<f16>(&values(n_kv * (2 * d + 3), 21, 1.0));
    let vraw = to::<f16>(&values(n_kv * (2 * d + 3), 22, 1.0));
    let qv = Tensor::bshd(&q, [1, 5, 1, d]).unwrap();
    let strides = [0, 2 * d + 3, 0, 2];
    let kv = Tensor::new(&kraw, [1, n_kv, 1, d], strides).unwrap();
    let vv = Tensor::new(&vraw, [1, n_kv, 1, d], strides).unwrap();
    let opts = Options::new().causal(Alignment::BottomRight);
    let label = "strided f16 K/V";
    let finite = |_| RowFacts::FINITE;
    assert_tensors_against_reference::<f32, f16, f32>(
        &qv,
        &kv,
        &vv,
        Layout::BSHD,
        &opts,
        finite,
        label,
    );
}
