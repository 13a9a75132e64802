//! One small case per feature, expected numbers worked out by hand.
//!
//! Head size 1 and `scale = 1`, so the score of query `i` and key `j` is just `q_i · k_j`, and
//! the visible key sets, distances and biases are written out literally below. The expected row
//! comes from the textbook formula (`softmax`), evaluated in f64; both the fused kernel and the
//! reference must match it to a few f32 ulps (`TOL`).

use super::{run, Buffer, Layout, Path, Run};
use crate::support::alibi_slopes;
use sdpa::{merge_partials, Alignment, Options, Partial, Tensor, TensorMut};

/// A hidden score.
const X: f64 = f64::NEG_INFINITY;
/// Relative tolerance of the hand checks (d = 1 and a handful of keys: only the polynomial
/// `2^x`, 2e-7, and a few roundings separate the kernels from the exact value).
const TOL: f64 = 2e-6;

/// `p_j = e^{s_j − m} / (Σ_j e^{s_j − m} + e^{σ − m})`, `out = Σ_j p_j v_j`,
/// `lse = m + ln(Σ_j e^{s_j − m} + e^{σ − m})`; no visible key and no sink: (0, −∞).
fn softmax(s: &[f64], v: &[f64], sink: f64) -> (f64, f64) {
    assert_eq!(s.len(), v.len());
    let m = s.iter().copied().fold(sink, f64::max);
    if m == X {
        return (0.0, X);
    }
    let den: f64 = s.iter().map(|&x| (x - m).exp()).sum::<f64>() + (sink - m).exp();
    let num: f64 = s.iter().zip(v).map(|(&x, &vj)| (x - m).exp() * vj).sum();
    (num / den, m + den.ln())
}

/// `s` with every key not in `keys` hidden.
fn only(s: &[f64], keys: &[usize]) -> Vec<f64> {
    (0..s.len())
        .map(|j| if keys.contains(&j) { s[j] } else { X })
        .collect()
}

fn close(got: f32, want: f64) -> bool {
    if want == X || want == 0.0 {
        return f64::from(got) == want;
    }
    (f64::from(got) - want).abs() <= TOL * want.abs().max(1.0)
}

/// Fused kernel and reference on contiguous BSHD operands (`d_v = 1` unless `v_dims` says).
fn both(
    q: &[f32],
    q_dims: [usize; 4],
    k: &[f32],
    k_dims: [usize; 4],
    v: &[f32],
    opts: &Options,
) -> [Run; 2] {
    let v_dims = [
        k_dims[0],
        k_dims[1],
        k_dims[2],
        v.len() / (k_dims[0] * k_dims[1] * k_dims[2]),
    ];
    let q = Tensor::bshd(q, q_dims).unwrap();
    let k = Tensor::bshd(k, k_dims).unwrap();
    let v = Tensor::bshd(v, v_dims).unwrap();
    [Path::Fused, Path::Reference]
        .map(|p| run(p, &q, &k, &v, opts, Layout::BSHD).expect("a valid call"))
}

/// Row `(b, i, h)` of both runs (d_v = 1) is `want = (out, lse)`.
#[track_caller]
fn expect(runs: &[Run; 2], b: usize, i: usize, h: usize, want: (f64, f64)) {
    for (run, name) in runs.iter().zip(["fused", "reference"]) {
        let (out, lse) = (run.row(b, i, h)[0], run.lse_at(b, i, h));
        assert!(
            close(out, want.0) && close(lse, want.1),
            "{name} b={b} i={i} h={h}: got ({out}, {lse}), want {want:?}"
        );
    }
}

/// The outputs of two runs are bitwise equal (same kernel, equivalent options).
#[track_caller]
fn same_bits(a: &Run, b: &Run) {
    let bits = |r: &Run| -> Vec<u32> { r.out.iter().chain(&r.lse).map(|x| x.to_bits()).collect() };
    assert_eq!(bits(a), bits(b));
}

// ---------------------------------------------------------------------------------------------
// Sliding window
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_window_by_hand() {
    // n_q = 2 < n_kv = 5: top-left off = 0, bottom-right off = 3.
    let q = [1.0f32, 1.0];
    let k = [0.3f32, -0.2, 0.5, 0.1, -0.4];
    let v = [1.0f32, 2.0, 4.0, 8.0, 16.0];
    let s: Vec<f64> = k.iter().map(|&x| f64::from(x)).collect();
    let vv: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    let cases: [(Options, [&[usize]; 2]); 7] = [
        // Row i sees i + off − left ≤ j ≤ i + off + right.
        (
            Options::new().sliding_window(1, 1, Alignment::TopLeft),
            [&[0, 1], &[0, 1, 2]],
        ),
        (
            Options::new().sliding_window(1, 1, Alignment::BottomRight),
            [&[2, 3, 4], &[3, 4]],
        ),
        (
            Options::new().sliding_window(0, 0, Alignment::TopLeft),
            [&[0], &[1]],
        ),
        (
            Options::new()
                .causal(Alignment::BottomRight)
                .sliding_window(2, 0, Alignment::BottomRight),
            [&[1, 2, 3], &[2, 3, 4]],
        ),
        // usize::MAX: that side unbounded.
        (
            Options::new().sliding_window(usize::MAX, 0, Alignment::TopLeft),
            [&[0], &[0, 1]],
        ),
        (
            Options::new().sliding_window(0, usize::MAX, Alignment::BottomRight),
            [&[3, 4], &[4]],
        ),
        // With causal the right edge is the diagonal, whatever `right` says.
        (
            Options::new()
                .causal(Alignment::TopLeft)
                .sliding_window(3, 1, Alignment::TopLeft),
            [&[0], &[0, 1]],
        ),
    ];
    for (opts, keys) in &cases {
        let runs = both(
            &q,
            [1, 2, 1, 1],
            &k,
            [1, 5, 1, 1],
            &v,
            &opts.clone().scale(1.0),
        );
        for (i, keys) in keys.iter().enumerate() {
            expect(&runs, 0, i, 0, softmax(&only(&s, keys), &vv, X));
        }
    }
    // A window of one key: the output is that key's value and the LSE its score, exactly up
    // to rounding.
    let runs = both(
        &q,
        [1, 2, 1, 1],
        &k,
        [1, 5, 1, 1],
        &v,
        &Options::new()
            .scale(1.0)
            .sliding_window(0, 0, Alignment::BottomRight),
    );
    expect(&runs, 0, 0, 0, (8.0, 0.1f32.into()));
    expect(&runs, 0, 1, 0, (16.0, (-0.4f32).into()));
}

#[test]
fn sliding_window_with_more_queries_than_keys() {
    // n_q = 4 > n_kv = 2: bottom-right off = −2, so the first row's window lies before key 0.
    let q = [1.0f32; 4];
    let k = [0.7f32, -0.3];
    let v = [1.0f32, 2.0];
    let s = [0.7f32 as f64, -0.3f32 as f64];
    let vv = [1.0, 2.0];
    let cases: [(Alignment, [&[usize]; 4]); 2] = [
        (Alignment::BottomRight, [&[], &[0], &[0, 1], &[1]]),
        (Alignment::TopLeft, [&[0, 1], &[1], &[], &[]]),
    ];
    for (align, keys) in cases {
        let opts = Options::new().scale(1.0).sliding_window(0, 1, align);
        let runs = both(&q, [1, 4, 1, 1], &k, [1, 2, 1, 1], &v, &opts);
        for (i, keys) in keys.iter().enumerate() {
            expect(&runs, 0, i, 0, softmax(&only(&s, keys), &vv, X));
        }
    }
}

/// `usize::MAX` is documented as "unbounded"; any other width is the literal formula
/// `i + off − left ≤ j ≤ i + off + right`, so a width just below `usize::MAX` (what
/// `window_size − 1` gives for an "infinite" window size) must hide nothing either.
///
/// Fails as of this writing: `Problem::is_visible`/`visible_keys` (src/problem.rs) compute
/// `center.saturating_sub(l as i64)` and `center.saturating_add(r as i64)`, and `l as i64`
/// wraps to a negative number for `l > i64::MAX` (`usize::MAX − 1` becomes −2), so the window
/// turns into `center + 2 ≤ j ≤ center − 2`: no key at all, in the fused kernel and the
/// reference alike.
#[test]
fn sliding_window_wider_than_i64_max_hides_nothing() {
    let q = [1.0f32, 1.0];
    let k = [0.3f32, -0.2, 0.5];
    let v = [1.0f32, 2.0, 4.0];
    let s: Vec<f64> = k.iter().map(|&x| f64::from(x)).collect();
    let vv = [1.0, 2.0, 4.0];
    let huge = usize::MAX - 1;
    let cases: [(Options, [&[usize]; 2]); 3] = [
        (
            Options::new().sliding_window(huge, huge, Alignment::TopLeft),
            [&[0, 1, 2], &[0, 1, 2]],
        ),
        (
            Options::new().sliding_window(1 << 63, 0, Alignment::TopLeft),
            [&[0], &[0, 1]],
        ),
        (
            Options::new().sliding_window(0, huge, Alignment::TopLeft),
            [&[0, 1, 2], &[1, 2]],
        ),
    ];
    for (opts, keys) in &cases {
        let runs = both(
            &q,
            [1, 2, 1, 1],
            &k,
            [1, 3, 1, 1],
            &v,
            &opts.clone().scale(1.0),
        );
        for (i, keys) in keys.iter().enumerate() {
            expect(&runs, 0, i, 0, softmax(&only(&s, keys), &vv, X));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Key lengths
// ---------------------------------------------------------------------------------------------

#[test]
fn kv_lens_by_hand() {
    // Three sequences of one query and 3 keys; lengths 2, 0 and 3.
    let q = [1.0f32; 3];
    let k = [0.2f32, -0.1, 0.4, 0.5, 0.5, 0.5, -0.3, 0.6, 0.1];
    let v = [1.0f32, 2.0, 4.0, 8.0, 8.0, 8.0, 1.0, 3.0, 9.0];
    let s = |b: usize| -> Vec<f64> { k[3 * b..3 * b + 3].iter().map(|&x| x.into()).collect() };
    let vv = |b: usize| -> Vec<f64> { v[3 * b..3 * b + 3].iter().map(|&x| x.into()).collect() };
    let lens = [2, 0, 3];
    let opts = Options::new().scale(1.0).kv_lens(&lens);
    let runs = both(&q, [3, 1, 1, 1], &k, [3, 3, 1, 1], &v, &opts);
    expect(&runs, 0, 0, 0, softmax(&only(&s(0), &[0, 1]), &vv(0), X));
    expect(&runs, 1, 0, 0, (0.0, X)); // no key: output 0, lse −∞
    expect(&runs, 2, 0, 0, softmax(&s(2), &vv(2), X));

    // Full lengths change nothing, bit for bit.
    let full = both(
        &q,
        [3, 1, 1, 1],
        &k,
        [3, 3, 1, 1],
        &v,
        &Options::new().scale(1.0).kv_lens(&[3; 3]),
    );
    let plain = both(
        &q,
        [3, 1, 1, 1],
        &k,
        [3, 3, 1, 1],
        &v,
        &Options::new().scale(1.0),
    );
    same_bits(&full[0], &plain[0]);
}

#[test]
fn kv_lens_with_causal_aligns_each_sequence_at_its_length() {
    // n_q = 2, n_kv = 4, kv_lens = [3]. Bottom-right: off = kv_lens[0] − n_q = 1 (the
    // sequence's own length, not the buffer's): row 0 sees j ≤ 1, row 1 sees j ≤ 2.
    let q = [1.0f32, 1.0];
    let k = [0.2f32, -0.1, 0.4, 0.9];
    let v = [1.0f32, 2.0, 4.0, 8.0];
    let s: Vec<f64> = k.iter().map(|&x| f64::from(x)).collect();
    let vv = [1.0, 2.0, 4.0, 8.0];
    let lens = [3];
    let cases: [(Alignment, [&[usize]; 2]); 2] = [
        (Alignment::BottomRight, [&[0, 1], &[0, 1, 2]]),
        (Alignment::TopLeft, [&[0], &[0, 1]]),
    ];
    for (align, keys) in cases {
        let opts = Options::new().scale(1.0).kv_lens(&lens).causal(align);
        let runs = both(&q, [1, 2, 1, 1], &k, [1, 4, 1, 1], &v, &opts);
        for (i, keys) in keys.iter().enumerate() {
            expect(&runs, 0, i, 0, softmax(&only(&s, keys), &vv, X));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bias and boolean mask
// ---------------------------------------------------------------------------------------------

/// B = 2, H = 2 query heads over one kv head, one query, 3 keys: `q[b, 0, h] = 1 + h`, so head 1
/// doubles the scores: `s[b, h, j] = (1 + h) · k[b, j] + bias[b, 0, h, j]`.
struct BiasCase {
    q: [f32; 4],
    k: [f32; 6],
    v: [f32; 6],
}

impl BiasCase {
    fn new() -> Self {
        BiasCase {
            q: [1.0, 2.0, 1.0, 2.0],
            k: [0.2, -0.1, 0.4, -0.5, 0.3, 0.1],
            v: [1.0, 2.0, 4.0, 1.0, 3.0, 9.0],
        }
    }
    fn runs(&self, opts: Options) -> [Run; 2] {
        both(
            &self.q,
            [2, 1, 2, 1],
            &self.k,
            [2, 3, 1, 1],
            &self.v,
            &opts.scale(1.0),
        )
    }
    /// Checks every row against `bias(b, h, j)`.
    fn expect(&self, runs: &[Run; 2], bias: impl Fn(usize, usize, usize) -> f64) {
        for b in 0..2 {
            for h in 0..2 {
                let s: Vec<f64> = (0..3)
                    .map(|j| (1.0 + h as f64) * f64::from(self.k[3 * b + j]) + bias(b, h, j))
                    .collect();
                let v: Vec<f64> = self.v[3 * b..3 * b + 3].iter().map(|&x| x.into()).collect();
                expect(runs, b, 0, h, softmax(&s, &v, X));
            }
        }
    }
}

#[test]
fn bias_broadcasts_over_heads_and_batches() {
    let c = BiasCase::new();
    let per_batch = [0.5f32, 0.0, -1.0, 0.0, 1.0, -0.5];
    let pb = |b: usize, _h: usize, j: usize| f64::from(per_batch[3 * b + j]);

    // One bias per batch, shared by the heads: head dim of size 1.
    let t = Tensor::bshd(&per_batch, [2, 1, 1, 3]).unwrap();
    let a = c.runs(Options::new().bias(t));
    c.expect(&a, pb);

    // The same through stride 0 on full-size query and head dims: bitwise the same result.
    let t = Tensor::new(&per_batch, [2, 1, 2, 3], [3, 0, 0, 1]).unwrap();
    let b = c.runs(Options::new().bias(t));
    c.expect(&b, pb);
    same_bits(&a[0], &b[0]);
    same_bits(&a[1], &b[1]);

    // One bias for all batches and heads.
    let t = Tensor::bshd(&per_batch[..3], [1, 1, 1, 3]).unwrap();
    let r = c.runs(Options::new().bias(t));
    c.expect(&r, |_, _, j| f64::from(per_batch[j]));

    // One per head (shared by the batches), −∞ entries hiding a key of one head only.
    let per_head = [0.0f32, f32::NEG_INFINITY, 0.0, 1.0, 0.0, f32::NEG_INFINITY];
    let t = Tensor::bshd(&per_head, [1, 1, 2, 3]).unwrap();
    let r = c.runs(Options::new().bias(t));
    c.expect(&r, |_, h, j| f64::from(per_head[3 * h + j]));
}

#[test]
fn bool_mask_by_hand() {
    // One kv head, two query heads with equal queries, 3 queries × 3 keys.
    let q = [1.0f32; 6];
    let k = [0.2f32, -0.1, 0.4];
    let v = [1.0f32, 2.0, 4.0];
    let s = [0.2f32 as f64, -0.1f32 as f64, 0.4f32 as f64];
    let vv = [1.0, 2.0, 4.0];
    let (t, f) = (true, false);

    // One mask for both heads; row 1 fully masked.
    let rows = [t, f, t, f, f, f, t, t, t];
    let mask = Tensor::bshd(&rows, [1, 3, 1, 3]).unwrap();
    let runs = both(
        &q,
        [1, 3, 2, 1],
        &k,
        [1, 3, 1, 1],
        &v,
        &Options::new().scale(1.0).mask(mask),
    );
    for h in 0..2 {
        expect(&runs, 0, 0, h, softmax(&only(&s, &[0, 2]), &vv, X));
        expect(&runs, 0, 1, h, (0.0, X));
        expect(&runs, 0, 2, h, softmax(&s, &vv, X));
    }

    // One mask per head, shared by the rows through stride 0.
    let heads = [t, t, f, f, t, t];
    let mask = Tensor::new(&heads, [1, 3, 2, 3], [0, 0, 3, 1]).unwrap();
    let runs = both(
        &q,
        [1, 3, 2, 1],
        &k,
        [1, 3, 1, 1],
        &v,
        &Options::new().scale(1.0).mask(mask),
    );
    for i in 0..3 {
        expect(&runs, 0, i, 0, softmax(&only(&s, &[0, 1]), &vv, X));
        expect(&runs, 0, i, 1, softmax(&only(&s, &[1, 2]), &vv, X));
    }

    // A mask is a bias of 0 / −∞: bitwise the same result.
    let mask = Tensor::bshd(&rows, [1, 3, 1, 3]).unwrap();
    let as_bias: Vec<f32> = rows
        .iter()
        .map(|&m| if m { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    let bias = Tensor::bshd(&as_bias, [1, 3, 1, 3]).unwrap();
    let a = both(
        &q,
        [1, 3, 2, 1],
        &k,
        [1, 3, 1, 1],
        &v,
        &Options::new().scale(1.0).mask(mask),
    );
    let b = both(
        &q,
        [1, 3, 2, 1],
        &k,
        [1, 3, 1, 1],
        &v,
        &Options::new().scale(1.0).bias(bias),
    );
    same_bits(&a[0], &b[0]);
    same_bits(&a[1], &b[1]);
}

// ---------------------------------------------------------------------------------------------
// ALiBi
// ---------------------------------------------------------------------------------------------

#[test]
fn alibi_by_hand() {
    // Two query heads (slopes 1/2 and 1/4) over one kv head; 2 queries, 4 keys.
    // s_ij = k_j − slope_h · |i + off − j|.
    let q = [1.0f32; 4];
    let k = [0.1f32, 0.2, 0.3, 0.4];
    let v = [1.0f32, 2.0, 4.0, 8.0];
    let vv = [1.0, 2.0, 4.0, 8.0];
    let slopes = [0.5f32, 0.25];
    // (options, distance |i + off − j| per row and key, visible keys per row)
    type Case<'a> = (Options<'a>, [[f64; 4]; 2], [&'a [usize]; 2]);
    let cases: [Case; 3] = [
        // Top-left, off = 0.
        (
            Options::new().alibi(&slopes, Alignment::TopLeft),
            [[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 1.0, 2.0]],
            [&[0, 1, 2, 3], &[0, 1, 2, 3]],
        ),
        // Bottom-right, off = 2.
        (
            Options::new().alibi(&slopes, Alignment::BottomRight),
            [[2.0, 1.0, 0.0, 1.0], [3.0, 2.0, 1.0, 0.0]],
            [&[0, 1, 2, 3], &[0, 1, 2, 3]],
        ),
        // With the causal mask on the same diagonal.
        (
            Options::new()
                .alibi(&slopes, Alignment::BottomRight)
                .causal(Alignment::BottomRight),
            [[2.0, 1.0, 0.0, 1.0], [3.0, 2.0, 1.0, 0.0]],
            [&[0, 1, 2], &[0, 1, 2, 3]],
        ),
    ];
    for (opts, dist, keys) in &cases {
        let runs = both(
            &q,
            [1, 2, 2, 1],
            &k,
            [1, 4, 1, 1],
            &v,
            &opts.clone().scale(1.0),
        );
        for i in 0..2 {
            for (h, &slope) in slopes.iter().enumerate() {
                let s: Vec<f64> = (0..4)
                    .map(|j| f64::from(k[j]) - f64::from(slope) * dist[i][j])
                    .collect();
                expect(&runs, 0, i, h, softmax(&only(&s, keys[i]), &vv, X));
            }
        }
    }

    // More queries than keys, bottom-right: off = 2 − 3 = −1.
    let q = [1.0f32; 3];
    let dist = [[1.0, 2.0], [0.0, 1.0], [1.0, 0.0]];
    let opts = Options::new()
        .scale(1.0)
        .alibi(&slopes[..1], Alignment::BottomRight);
    let runs = both(&q, [1, 3, 1, 1], &k[..2], [1, 2, 1, 1], &v[..2], &opts);
    for (i, d) in dist.iter().enumerate() {
        let s: Vec<f64> = (0..2).map(|j| f64::from(k[j]) - 0.5 * d[j]).collect();
        expect(&runs, 0, i, 0, softmax(&s, &vv[..2], X));
    }
}

#[test]
fn alibi_slopes_follow_the_paper() {
    // Press et al.'s reference code: for a power of two n, start = 2^(−2^−(log2 n − 3)) and
    // slope_h = start^(h+1); otherwise the slopes of the largest power of two n below, then the
    // even-indexed slopes of 2n.
    fn power_of_2(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0))));
        (0..n).map(|h| start * start.powi(h as i32)).collect()
    }
    let s8 = alibi_slopes(8).unwrap();
    let want8 = power_of_2(8);
    assert_eq!(s8.len(), 8);
    for (h, (&got, &want)) in s8.iter().zip(&want8).enumerate() {
        // 1/2, 1/4, …, 1/256: exact in f32.
        assert_eq!(f64::from(got), want, "h = {h}");
        assert_eq!(got, 0.5f32.powi(h as i32 + 1));
    }
    let s12 = alibi_slopes(12).unwrap();
    let mut want12 = power_of_2(8);
    want12.extend(power_of_2(16).into_iter().step_by(2).take(4));
    assert_eq!(s12.len(), 12);
    for (h, (&got, &want)) in s12.iter().zip(&want12).enumerate() {
        assert!(
            (f64::from(got) - want).abs() <= want * 1e-7,
            "h = {h}: {got} vs {want}"
        );
    }
    // Heads 8..12 are 2^−0.5, 2^−1.5, 2^−2.5, 2^−3.5.
    assert!((f64::from(s12[8]) - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-7);
    assert!((f64::from(s12[11]) - 2f64.powf(-3.5)).abs() < 1e-8);
}

// ---------------------------------------------------------------------------------------------
// Softcap
// ---------------------------------------------------------------------------------------------

#[test]
fn softcap_comes_before_bias_alibi_and_masking() {
    // cap = 1, raw scores 3, 0, 2; the third value is large so that its weight shows.
    let q = [1.0f32];
    let k = [3.0f32, 0.0, 2.0];
    let v = [1.0f32, 2.0, 40.0];
    let vv = [1.0, 2.0, 40.0];
    let t = |x: f64| x.tanh();
    let bias = [0.0f32, 3.0, 0.0];
    let run1 = |opts: Options| both(&q, [1, 1, 1, 1], &k, [1, 3, 1, 1], &v, &opts.scale(1.0));

    // Bias after the cap: s = (tanh 3, tanh 0 + 3, tanh 2). Capping after the bias would give
    // (tanh 3, tanh 3, tanh 2), a visibly different output.
    let want = softmax(&[t(3.0), 3.0, t(2.0)], &vv, X);
    let wrong = softmax(&[t(3.0), t(3.0), t(2.0)], &vv, X);
    assert!((want.0 - wrong.0).abs() > 0.1);
    let r = run1(
        Options::new()
            .softcap(1.0)
            .bias(Tensor::bshd(&bias, [1, 1, 1, 3]).unwrap()),
    );
    expect(&r, 0, 0, 0, want);

    // Masking after the cap: a masked key stays hidden (capping −∞ would make it −1, visible).
    let mask = [true, true, false];
    let r = run1(
        Options::new()
            .softcap(1.0)
            .bias(Tensor::bshd(&bias, [1, 1, 1, 3]).unwrap())
            .mask(Tensor::bshd(&mask, [1, 1, 1, 3]).unwrap()),
    );
    let want = softmax(&[t(3.0), 3.0, X], &vv, X);
    let wrong = softmax(&[t(3.0), 3.0, -1.0], &vv, X);
    assert!((want.0 - wrong.0).abs() > 0.1);
    expect(&r, 0, 0, 0, want);

    // A −∞ bias hides its key too.
    let hide = [0.0f32, 3.0, f32::NEG_INFINITY];
    let r = run1(
        Options::new()
            .softcap(1.0)
            .bias(Tensor::bshd(&hide, [1, 1, 1, 3]).unwrap()),
    );
    expect(&r, 0, 0, 0, softmax(&[t(3.0), 3.0, X], &vv, X));

    // ALiBi after the cap (slope 1, top-left, distance j): s_j = tanh(k_j) − j, not
    // tanh(k_j − j).
    let slope = [1.0f32];
    let r = run1(
        Options::new()
            .softcap(1.0)
            .alibi(&slope, Alignment::TopLeft),
    );
    let want = softmax(&[t(3.0), t(0.0) - 1.0, t(2.0) - 2.0], &vv, X);
    let wrong = softmax(&[t(3.0), t(-1.0), t(0.0)], &vv, X);
    assert!((want.0 - wrong.0).abs() > 0.1);
    expect(&r, 0, 0, 0, want);

    // The cap applies to the *scaled* score: scale 0.5, cap 2 → s = 2 tanh(0.5 k / 2).
    let r = both(
        &q,
        [1, 1, 1, 1],
        &k,
        [1, 3, 1, 1],
        &v,
        &Options::new().scale(0.5).softcap(2.0),
    );
    let s: Vec<f64> = k
        .iter()
        .map(|&x| 2.0 * (0.25 * f64::from(x)).tanh())
        .collect();
    expect(&r, 0, 0, 0, softmax(&s, &vv, X));

    // Huge scores are squashed: 5·tanh(6), 0, 5·tanh(4).
    let big = [30.0f32, 0.0, 20.0];
    let r = both(
        &q,
        [1, 1, 1, 1],
        &big,
        [1, 3, 1, 1],
        &v,
        &Options::new().scale(1.0).softcap(5.0),
    );
    expect(
        &r,
        0,
        0,
        0,
        softmax(&[5.0 * t(6.0), 0.0, 5.0 * t(4.0)], &vv, X),
    );
}

// ---------------------------------------------------------------------------------------------
// Attention sinks
// ---------------------------------------------------------------------------------------------

#[test]
fn sinks_join_the_denominator_only() {
    // Two query heads over one kv head, 2 queries × 2 keys; row 1 fully masked.
    let q = [1.0f32; 4];
    let k = [0.3f32, -0.2];
    let v = [1.0f32, 2.0];
    let s = [0.3f32 as f64, -0.2f32 as f64];
    let vv = [1.0, 2.0];
    let mask = [true, true, false, false];
    let mask = Tensor::bshd(&mask, [1, 2, 1, 2]).unwrap();
    let sinks = [0.5f32, f32::NEG_INFINITY];
    let opts = Options::new().scale(1.0).mask(mask).sinks(&sinks);
    let runs = both(&q, [1, 2, 2, 1], &k, [1, 2, 1, 1], &v, &opts);
    // Head 0: p_j = e^{s_j} / (e^{0.3} + e^{−0.2} + e^{0.5}).
    let den = 0.3f64.exp() + (-0.2f64).exp() + 0.5f64.exp();
    let want = ((0.3f64.exp() + 2.0 * (-0.2f64).exp()) / den, den.ln());
    let by_formula = softmax(&s, &vv, 0.5);
    assert!((want.0 - by_formula.0).abs() < 1e-6 && (want.1 - by_formula.1).abs() < 1e-6);
    expect(&runs, 0, 0, 0, by_formula);
    // Head 1: its sink is −∞, i.e. no sink.
    expect(&runs, 0, 0, 1, softmax(&s, &vv, X));
    // Fully masked row: output 0; lse = σ_h with a sink, −∞ without.
    expect(&runs, 0, 1, 0, (0.0, 0.5));
    expect(&runs, 0, 1, 1, (0.0, X));

    // Every key of the row `−∞`-biased and a NaN value behind one of them: a row with no
    // visible key, with a sink as without (output 0, lse = σ_h or −∞); the NaN reaches
    // neither. One finite bias brings the NaN back (`0 · NaN`), sink or not.
    let v_nan = [f32::NAN, 2.0];
    let all_hidden = [f32::NEG_INFINITY; 4];
    let all_hidden = Tensor::bshd(&all_hidden, [1, 1, 2, 2]).unwrap();
    let opts = Options::new().scale(1.0).bias(all_hidden).sinks(&sinks);
    let runs = both(&q[..2], [1, 1, 2, 1], &k, [1, 2, 1, 1], &v_nan, &opts);
    expect(&runs, 0, 0, 0, (0.0, 0.5));
    expect(&runs, 0, 0, 1, (0.0, X));
    let one_seen = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
    let one_seen = Tensor::bshd(&one_seen, [1, 1, 2, 2]).unwrap();
    let opts = Options::new().scale(1.0).bias(one_seen).sinks(&sinks);
    for run in both(&q[..2], [1, 1, 2, 1], &k, [1, 2, 1, 1], &v_nan, &opts) {
        for h in 0..2 {
            assert!(
                run.row(0, 0, h)[0].is_nan(),
                "head {h}: a NaN value seen with weight 0"
            );
        }
    }

    // A large sink takes almost all the weight: out ≈ e^{−10}·(…).
    let big = [10.0f32, 10.0];
    let runs = both(
        &q[..2],
        [1, 1, 2, 1],
        &k,
        [1, 2, 1, 1],
        &v,
        &Options::new().scale(1.0).sinks(&big),
    );
    for h in 0..2 {
        expect(&runs, 0, 0, h, softmax(&s, &vv, 10.0));
    }

    // Sinks of −∞ everywhere: bitwise the same as no sinks, in both implementations.
    let none = [f32::NEG_INFINITY; 2];
    let with = both(
        &q,
        [1, 2, 2, 1],
        &k,
        [1, 2, 1, 1],
        &v,
        &Options::new().scale(1.0).sinks(&none),
    );
    let without = both(
        &q,
        [1, 2, 2, 1],
        &k,
        [1, 2, 1, 1],
        &v,
        &Options::new().scale(1.0),
    );
    same_bits(&with[0], &without[0]);
    same_bits(&with[1], &without[1]);
}

// ---------------------------------------------------------------------------------------------
// merge_partials
// ---------------------------------------------------------------------------------------------

#[test]
fn merge_partials_by_hand() {
    // [batch 1, 3 queries, 1 head, d_v 2].
    let dims = [1, 3, 1, 2];
    let nan = f32::NAN;
    let o1 = [1.0f32, 2.0, nan, nan, 5.0, 5.0];
    let l1 = [0.0f32, f32::NEG_INFINITY, f32::NEG_INFINITY];
    let o2 = [5.0f32, 6.0, 7.0, 8.0, 6.0, 6.0];
    let l2 = [3f32.ln(), 1.0, f32::NEG_INFINITY];
    let parts = [
        Partial {
            out: Tensor::bshd(&o1, dims).unwrap(),
            lse: &l1,
        },
        Partial {
            out: Tensor::bshd(&o2, dims).unwrap(),
            lse: &l2,
        },
    ];
    let mut out = [9.0f32; 6];
    let mut lse = [9.0f32; 3];
    merge_partials(
        &parts,
        &mut TensorMut::bshd(&mut out, dims).unwrap(),
        &mut lse,
    )
    .unwrap();
    // Row 0: lse = ln(e^0 + e^{ln 3}) = ln 4; weights 1/4, 3/4: out = [1,2]/4 + 3·[5,6]/4.
    // Row 1: the first partial saw nothing (its NaN output is ignored): lse 1, out [7, 8].
    // Row 2: nobody saw anything: 0 and −∞.
    let want = [4.0, 5.0, 7.0, 8.0, 0.0, 0.0];
    for (c, (&g, &w)) in out.iter().zip(&want).enumerate() {
        assert!(close(g, w), "out[{c}] = {g}, want {w}");
    }
    assert!(close(lse[0], 4f64.ln()), "{}", lse[0]);
    assert_eq!(lse[1], 1.0);
    assert_eq!(lse[2], f32::NEG_INFINITY);

    // Three partials, one of them in another layout (BHSD with a padded head dim), and the
    // merged output strided too: lse = ln(e^1 + e^2 + e^3), out = Σ w_k o_k.
    let dims = [1, 1, 1, 2];
    let a = [1.0f32, 0.0];
    let b = Buffer::from_fn(dims, Layout::BHSD, 0.0, |[_, _, _, c]| [0.0f32, 1.0][c]);
    let c = Buffer::from_fn(
        dims,
        Layout::strided([0, 1, 2, 3], 3, 1, 2),
        f32::NAN,
        |[_, _, _, c]| [2.0f32, -2.0][c],
    );
    let (la, lb, lc) = ([1.0f32], [2.0f32], [3.0f32]);
    let parts = [
        Partial {
            out: Tensor::bshd(&a, dims).unwrap(),
            lse: &la,
        },
        Partial {
            out: b.view(),
            lse: &lb,
        },
        Partial {
            out: c.view(),
            lse: &lc,
        },
    ];
    let mut out = Buffer::from_fn(dims, Layout::BHSD, 0.0f32, |_| f32::NAN);
    let mut lse = [0.0f32];
    merge_partials(&parts, &mut out.view_mut(), &mut lse).unwrap();
    let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
    let w = [1f64.exp() / z, 2f64.exp() / z, 3f64.exp() / z];
    let want = [w[0] + 2.0 * w[2], w[1] - 2.0 * w[2]];
    let got = out.logical();
    assert!(
        close(got[0], want[0]) && close(got[1], want[1]),
        "{got:?} vs {want:?}"
    );
    assert!(close(lse[0], z.ln()));
}
