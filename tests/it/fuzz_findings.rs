//! Regression tests for what the fuzz targets found (`tests/support/`), each minimized to a
//! few elements. Every test states the documented behaviour it checks.

use crate::support;

use sdpa::reference;
use sdpa::{Alignment, Options, Tensor, TensorMut};
use support::differential::Shape;
use support::harness::{assert_views_close_to_reference, run_views, Comparison};
use support::harness::{Layout, Outputs, Path, Views};

/// Contiguous BSHD views of `q`, `k` and `v`.
fn views<'a>(shape: Shape, q: &'a [f32], k: &'a [f32], v: &'a [f32]) -> Views<'a> {
    Views {
        q: Tensor::bshd(q, shape.q_dims()).unwrap(),
        k: Tensor::bshd(k, shape.k_dims()).unwrap(),
        v: Tensor::bshd(v, shape.v_dims()).unwrap(),
    }
}

/// Runs fused `attention_lse` and the reference on contiguous BSHD operands; returns
/// (fused, reference).
fn both(shape: Shape, q: &[f32], k: &[f32], v: &[f32], opts: &Options<'_>) -> (Outputs, Outputs) {
    let x = views(shape, q, k, v);
    let run = |path| run_views(path, &x, Layout::BSHD, opts);
    (run(Path::Fused), run(Path::Reference))
}

/// [`both`], checked: every row within `reference::error_bounds` of the reference (inputs
/// finite), and `attention` bitwise equal to `attention_lse`.
fn close(shape: Shape, q: &[f32], k: &[f32], v: &[f32], opts: &Options<'_>) -> Comparison {
    let label = format!("{shape:?} {opts:?}");
    assert_views_close_to_reference(&views(shape, q, k, v), Layout::BSHD, opts, &label)
}

/// Crate docs: "A row with no visible key (…, a causal diagonal that starts past the keys, …):
/// output 0 and lse = −∞ — never NaN". With bottom-right alignment and n_q = 2 > n_kv = 1, row
/// 0 sees no key; a NaN in V (seen by row 1 only) made row 0's output NaN in the fused kernel
/// (masked weight 0 × NaN, then 0 · NaN again in the normalization).
#[test]
fn row_without_visible_keys_is_zero_even_if_v_has_nan() {
    let (f, r) = both(
        Shape::new(1, 1, 1, 2, 1, 1, 1),
        &[1.0, 1.0],
        &[1.0],
        &[f32::NAN],
        &Options::new().causal(Alignment::BottomRight),
    );
    assert_eq!((r.out[0], r.lse[0]), (0.0, f32::NEG_INFINITY), "reference");
    assert!(r.out[1].is_nan() && f.out[1].is_nan(), "row 1 sees the NaN");
    assert_eq!(
        (f.out[0], f.lse[0]),
        (0.0, f32::NEG_INFINITY),
        "fused row 0"
    );
}

/// The same with ±∞ in V (0 · ∞ = NaN).
#[test]
fn row_without_visible_keys_is_zero_even_if_v_has_inf() {
    let (f, _) = both(
        Shape::new(1, 1, 1, 3, 1, 2, 2),
        &[0.5; 6],
        &[1.0, -1.0],
        &[f32::INFINITY, 1.0],
        &Options::new().causal(Alignment::BottomRight),
    );
    assert_eq!(&f.out[..4], &[0.0; 4], "rows 0 and 1 see no key");
    assert_eq!(&f.lse[..2], &[f32::NEG_INFINITY; 2]);
}

/// Every score is exactly 0 (q = 0), so the result is the mean of V, whatever the finite scale.
/// The fused kernel multiplies Q by `scale · log₂e` first: 0 · (3e38 · 1.44 = ∞) = NaN.
#[test]
fn huge_finite_scale_with_zero_scores() {
    let opts = Options::new().scale(3e38);
    let c = close(
        Shape::new(1, 1, 1, 1, 2, 1, 1),
        &[0.0],
        &[1.0, 2.0],
        &[1.0, 3.0],
        &opts,
    );
    let r = &c.reference;
    assert_eq!(
        (r.out[0], r.lse[0]),
        (2.0, std::f32::consts::LN_2),
        "reference"
    );
}

/// The same overflow from a large query component with an ordinary scale: q = 1e10 is fine,
/// scale 1e30 is finite, k = 0 makes every score 0; q · scale · log₂e = ∞ and ∞ · 0 = NaN.
#[test]
fn large_query_times_scale_with_zero_keys() {
    let opts = Options::new().scale(1e30);
    let c = close(
        Shape::new(1, 1, 1, 1, 2, 1, 1),
        &[1e10],
        &[0.0, 0.0],
        &[1.0, 3.0],
        &opts,
    );
    let r = &c.reference;
    assert_eq!(
        (r.out[0], r.lse[0]),
        (2.0, std::f32::consts::LN_2),
        "reference"
    );
}

/// Values near `f32::MAX`. The fused kernel, like every FlashAttention-style kernel, accumulates
/// the unnormalized `Σ_j p_j v_j` with weights up to 1 each and divides by `Σ_j p_j` at the end,
/// so its documented range is `|v| ≤ f32::MAX / n_visible` (crate docs, "Numerics"): inside it
/// the result must be within the bound; the fuzzer found 3 keys of value 2e38, which is outside
/// (3 · 2e38 overflows). This test pins the edge of the documented range with 3 keys of value
/// `f32::MAX / 3` and equal weights, where the accumulator reaches exactly 3 · f32::MAX / 3.
#[test]
fn values_near_f32_max_do_not_overflow() {
    let big = f32::MAX / 3.0;
    let c = close(
        Shape::new(1, 1, 1, 1, 3, 1, 1),
        &[0.0],
        &[0.0; 3],
        &[big; 3],
        &Options::new(),
    );
    let (fo, ro) = (&c.fused.out, &c.reference.out);
    assert!(
        ro[0].is_finite() && fo[0].is_finite(),
        "{} {}",
        ro[0],
        fo[0]
    );
}

/// `error_bounds` is a bound: never negative. With |logits| around 1e7 the per-weight error
/// `θ = e^Δ − 1 + 2e-7` exceeds 1 and `2θ/(1 − θ)` turns negative.
#[test]
fn error_bounds_are_never_negative() {
    let q = [4000.0f32];
    let k = [4000.0f32];
    let v = [1.0f32];
    let qt = Tensor::bshd(&q, [1, 1, 1, 1]).unwrap();
    let kt = Tensor::bshd(&k, [1, 1, 1, 1]).unwrap();
    let vt = Tensor::bshd(&v, [1, 1, 1, 1]).unwrap();
    let b = reference::error_bounds(&qt, &kt, &vt, &Options::new()).unwrap();
    assert!(b[0].out >= 0.0 && b[0].lse >= 0.0, "{:?}", b[0]);
}

/// d_v = 0 (LSE only) with a V view whose slice is empty but whose strides are not 0 (valid:
/// an empty view reaches no element). The fused kernel slices V at `batch · stride` to read it
/// in place and panics ("range start index 1 out of range for slice of length 0").
#[test]
fn lse_only_with_an_empty_strided_value_view() {
    let q = [1.0f32, 2.0];
    let k = [1.0f32, 0.5];
    let qt = Tensor::bshd(&q, [2, 1, 1, 1]).unwrap();
    let kt = Tensor::bshd(&k, [2, 1, 1, 1]).unwrap();
    let vt = Tensor::new(&[], [2, 1, 1, 0], [1, 1, 1, 1]).unwrap();
    let mut out: [f32; 0] = [];
    let mut ov = TensorMut::new(&mut out, [2, 1, 1, 0], [1, 1, 1, 1]).unwrap();
    let mut lse = [f32::NAN; 2];
    sdpa::attention_lse(&qt, &kt, &vt, &mut ov, &mut lse, &Options::new()).unwrap();
    // One key each: lse = its score, q·k (scale 1/√1).
    assert!(
        (lse[0] - 1.0).abs() < 1e-6 && (lse[1] - 1.0).abs() < 1e-6,
        "{lse:?}"
    );
}

/// `Alignment::BottomRight` computes `off = n_kv − n_q` in i64 with plain arithmetic, which
/// overflows (a panic in debug builds, a wrapped offset in release) for lengths ≥ 2^63 — valid
/// with broadcast (stride-0) views. Here n_q = 2^63, n_kv = 0 and d_v = 0: nothing to compute,
/// so the call must return (Ok, or a typed error if such lengths are refused).
#[test]
fn huge_query_length_with_bottom_right_causal_does_not_panic() {
    let q = [1.0f32];
    let n_q = 1usize << 63;
    let qt = Tensor::new(&q, [1, n_q, 1, 1], [0; 4]).unwrap();
    let kt = Tensor::<f32>::new(&[], [1, 0, 1, 1], [0, 1, 1, 1]).unwrap();
    let vt = Tensor::new(&[], [1, 0, 1, 0], [0, 1, 1, 1]).unwrap();
    let mut out: [f32; 0] = [];
    let mut ov = TensorMut::new(&mut out, [1, n_q, 1, 0], [0, 1, 0, 1]).unwrap();
    let opts = Options::new().causal(Alignment::BottomRight);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sdpa::attention(&qt, &kt, &vt, &mut ov, &opts)
    }));
    assert!(r.is_ok(), "attention panicked");
}

/// With n_kv = 2^63 keys (one broadcast key) and top-left causal masking, row 0 sees key 0 only:
/// out = v₀ and lse = q·k. The fused kernel converts `n_kv` to i64 (negative) when clamping the
/// visible range and silently returns a row with no key (0, −∞). Either the right answer or a
/// typed error is acceptable; a wrong number is not.
#[test]
fn key_lengths_past_i64_max_are_not_silently_empty() {
    let (q, k, v) = ([1.0f32], [2.0f32], [5.0f32]);
    let n_kv = 1usize << 63;
    let qt = Tensor::bshd(&q, [1, 1, 1, 1]).unwrap();
    let kt = Tensor::new(&k, [1, n_kv, 1, 1], [0; 4]).unwrap();
    let vt = Tensor::new(&v, [1, n_kv, 1, 1], [0; 4]).unwrap();
    let mut out = [f32::NAN];
    let mut lse = [f32::NAN];
    let mut ov = TensorMut::bshd(&mut out, [1, 1, 1, 1]).unwrap();
    let opts = Options::new().causal(Alignment::TopLeft);
    if sdpa::attention_lse(&qt, &kt, &vt, &mut ov, &mut lse, &opts).is_ok() {
        assert_eq!((out[0], lse[0]), (5.0, 2.0), "row 0 sees exactly key 0");
    }
}

/// `error_bounds` returns one bound per (batch, head, query row). For B · H · n_q = 2^60 rows
/// (broadcast Q, no keys) that vector cannot exist; the call panics with "capacity overflow"
/// instead of returning an error as the other entry points do (`ScoreMatrixTooLarge`,
/// `ScratchTooLarge`).
#[test]
fn error_bounds_of_an_unrepresentable_problem_is_an_error() {
    let q = [1.0f32];
    let n = 1usize << 30;
    let qt = Tensor::new(&q, [n, n, 1, 1], [0; 4]).unwrap();
    let kt = Tensor::<f32>::new(&[], [n, 0, 1, 1], [0; 4]).unwrap();
    let vt = Tensor::new(&[], [n, 0, 1, 0], [0; 4]).unwrap();
    let r = std::panic::catch_unwind(|| reference::error_bounds(&qt, &kt, &vt, &Options::new()));
    assert!(
        matches!(r, Ok(Err(_))),
        "error_bounds panicked or returned Ok"
    );
}

/// The same family: d_v = 0 with LSE, and an empty V view whose head stride is huge (valid: the
/// view reaches no element). `pack_values` computes `kv_head · stride` for kv head 1 and
/// overflows (a panic in debug builds).
#[test]
fn lse_only_with_an_empty_value_view_with_huge_strides() {
    let q = [1.0f32; 3];
    let k = [1.0f32; 3];
    let qt = Tensor::bshd(&q, [1, 1, 3, 1]).unwrap();
    let kt = Tensor::bshd(&k, [1, 1, 3, 1]).unwrap();
    let vt = Tensor::new(&[], [1, 1, 3, 0], [1, 1, usize::MAX / 2 + 7, 2]).unwrap();
    let mut out: [f32; 0] = [];
    let mut ov = TensorMut::new(&mut out, [1, 1, 3, 0], [0; 4]).unwrap();
    let mut lse = [f32::NAN; 3];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sdpa::attention_lse(&qt, &kt, &vt, &mut ov, &mut lse, &Options::new())
    }));
    assert!(matches!(r, Ok(Ok(()))), "attention_lse panicked or failed");
    assert!(
        lse.iter().all(|l| (l - 1.0).abs() < 1e-6),
        "one key per head: lse = q·k = 1, got {lse:?}"
    );
}
