//! The naive reference: the definition of attention, step by step as the math reads, in f64.
//!
//! For every (batch, head) it materializes the full `n_q × n_kv` score matrix, then
//! 1. `s_ij = scale · (q_i · k_j)`,
//! 2. softcap `cap · tanh(s/cap)`, then ALiBi `− slope_h·|i + off − j|` and the bias,
//! 3. marks invisible scores `−∞` (causal, window, key length, boolean mask; element by element),
//! 4. takes the row softmax `p_ij = exp(s_ij − m_i) / (Σ_j exp(s_ij − m_i) + exp(σ_h − m_i))`
//!    (the sink term only with sinks),
//! 5. and the weighted sum `out_i = Σ_{visible j} p_ij · v_j`,
//!    `lse_i = m_i + ln(Σ_j exp(s_ij − m_i) + exp(σ_h − m_i))`.
//!
//! Clarity over speed: it is the oracle every fast path is tested against, and its memory grows
//! as `n_q · n_kv`. Rows with no visible key get output 0 and `lse = −∞`; NaN inputs propagate to
//! every output they touch (a NaN in `v_j` reaches exactly the rows that give key `j` a non-zero
//! weight).
//!
//! [`rope`] is the rotary embedding's definition in the same spirit (f64 throughout).

use crate::element::{Element, KvElement};
use crate::error::Error;
use crate::kv_cache::{AnyKv, RowMap, TensorKv};
use crate::options::Options;
use crate::problem::{Broadcast, Problem};
use crate::rope::{rotate, Rope};
use crate::tensor::{AnyTensor, AnyTensorMut, Tensor, TensorMut};

/// Reference attention: `out = softmax(Q·Kᵀ·scale) · V` with the semantics of
/// [`crate::attention`], computed in f64 with the whole score matrix in memory.
///
/// # Errors
/// The same as [`crate::attention`], plus [`Error::ScoreMatrixTooLarge`] when the score matrix
/// of one (batch, head) cannot be allocated.
pub fn attention<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut TensorMut<'_, O>,
    opts: &Options<'_>,
) -> Result<(), Error> {
    let problem = Problem::new(q, k, v, out.dims(), None, opts)?;
    run(&problem, q.erase(), erase_kv(k, v), out.erase(), None)
}

/// Reference attention that also writes the natural-log log-sum-exp of each row's scores,
/// `lse` laid out `[batch][heads][n_q]`; `−∞` for rows with no visible key.
///
/// # Errors
/// The same as [`crate::attention_lse`], plus [`Error::ScoreMatrixTooLarge`].
pub fn attention_lse<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: &mut [f32],
    opts: &Options<'_>,
) -> Result<(), Error> {
    let problem = Problem::new(q, k, v, out.dims(), Some(lse), opts)?;
    run(&problem, q.erase(), erase_kv(k, v), out.erase(), Some(lse))
}

/// K and V, their element type named (so that [`run`] is compiled once, not per type).
fn erase_kv<'a, KV: KvElement>(k: &Tensor<'a, KV>, v: &Tensor<'a, KV>) -> AnyKv<'a> {
    let map = RowMap::Dense;
    TensorKv { k: *k, v: *v, map }.erase()
}

/// Over the channels of Q's row `qi = (b, i, h)` and K's row `kj = (b, j, kv head)` (K as the
/// call defines it: times its scales for `i8`), in channel order: `Σ q·k`, `Σ |q·k|` and
/// `Σ (|q| + |k|)`. (One match on the types per row pair, not per element.)
fn dots(
    q: &AnyTensor<'_>,
    kv: &AnyKv<'_>,
    scales: Option<Broadcast<'_, f32>>,
    (qi, kj): ([usize; 3], [usize; 3]),
) -> [f64; 3] {
    macro_rules! with_q {
        ($q:expr) => {
            match kv {
                AnyKv::F32(kv) => typed_dots($q, &kv.k, scales, qi, kj),
                AnyKv::F16(kv) => typed_dots($q, &kv.k, scales, qi, kj),
                AnyKv::Bf16(kv) => typed_dots($q, &kv.k, scales, qi, kj),
                AnyKv::I8(kv) => typed_dots($q, &kv.k, scales, qi, kj),
            }
        };
    }
    match q {
        AnyTensor::F32(q) => with_q!(q),
        AnyTensor::F16(q) => with_q!(q),
        AnyTensor::Bf16(q) => with_q!(q),
    }
}

/// [`dots`] of one pair of types.
fn typed_dots<Q: KvElement, K: KvElement>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, K>,
    scales: Option<Broadcast<'_, f32>>,
    [b, i, h]: [usize; 3],
    [_, j, hk]: [usize; 3],
) -> [f64; 3] {
    let (qs, ks) = (q.strides(), k.strides());
    let (qd, kd) = (q.data(), k.data());
    // Rows inside the validated views (indices inside their dims).
    let (qb, kb) = (
        b * qs[0] + i * qs[1] + h * qs[2],
        b * ks[0] + j * ks[1] + hk * ks[2],
    );
    let (mut dot, mut abs, mut norms) = (0.0, 0.0, 0.0);
    for c in 0..q.dims()[3] {
        let qc = qd[qb + c * qs[3]].to_f64();
        let mut kc = kd[kb + c * ks[3]].to_f64();
        if let Some(s) = scales {
            kc *= f64::from(s.at([b, j, hk, c]));
        }
        let x = qc * kc;
        dot += x;
        abs += x.abs();
        norms += qc.abs() + kc.abs();
    }
    [dot, abs, norms]
}

/// V's channel `c` of kv head `hk` of batch `b` weighed by `weights[j]` over the keys `j` with
/// `seen[j]`, in key order: `Σ_j w_j·v_jc` (V times its scales for `i8`). Called for channels
/// that exist only, so V's view is not empty.
fn weighted_sum(
    kv: &AnyKv<'_>,
    scales: Option<Broadcast<'_, f32>>,
    [b, hk, c]: [usize; 3],
    weights: &[f64],
    seen: &[bool],
) -> f64 {
    fn typed<T: KvElement>(
        v: &Tensor<'_, T>,
        scales: Option<Broadcast<'_, f32>>,
        [b, hk, c]: [usize; 3],
        weights: &[f64],
        seen: &[bool],
    ) -> f64 {
        let st = v.strides();
        let (data, base) = (v.data(), b * st[0] + hk * st[2] + c * st[3]);
        let mut acc = 0.0;
        for (j, (&w, _)) in weights
            .iter()
            .zip(seen)
            .enumerate()
            .filter(|(_, (_, &s))| s)
        {
            let mut x = data[base + j * st[1]].to_f64();
            if let Some(s) = scales {
                x *= f64::from(s.at([b, j, hk, c]));
            }
            acc += w * x;
        }
        acc
    }
    match kv {
        AnyKv::F32(kv) => typed(&kv.v, scales, [b, hk, c], weights, seen),
        AnyKv::F16(kv) => typed(&kv.v, scales, [b, hk, c], weights, seen),
        AnyKv::Bf16(kv) => typed(&kv.v, scales, [b, hk, c], weights, seen),
        AnyKv::I8(kv) => typed(&kv.v, scales, [b, hk, c], weights, seen),
    }
}

/// The largest `|v|` of V's row `(b, j, kv head)` (times its scales for `i8`).
fn value_max(kv: &AnyKv<'_>, scales: Option<Broadcast<'_, f32>>, at: [usize; 3]) -> f64 {
    fn typed<T: KvElement>(
        v: &Tensor<'_, T>,
        scales: Option<Broadcast<'_, f32>>,
        [b, j, hk]: [usize; 3],
    ) -> f64 {
        if v.dims()[3] == 0 {
            // An empty view: its strides may be anything, even overflowing once multiplied,
            // so no offset is formed.
            return 0.0;
        }
        let st = v.strides();
        let (data, base) = (v.data(), b * st[0] + j * st[1] + hk * st[2]);
        let mut max = 0.0f64;
        for c in 0..v.dims()[3] {
            let mut x = data[base + c * st[3]].to_f64();
            if let Some(s) = scales {
                x *= f64::from(s.at([b, j, hk, c]));
            }
            max = max.max(x.abs());
        }
        max
    }
    match kv {
        AnyKv::F32(kv) => typed(&kv.v, scales, at),
        AnyKv::F16(kv) => typed(&kv.v, scales, at),
        AnyKv::Bf16(kv) => typed(&kv.v, scales, at),
        AnyKv::I8(kv) => typed(&kv.v, scales, at),
    }
}

/// Writes `x` to `out[index]`, rounded to the output's type.
fn write(out: &mut AnyTensorMut<'_>, index: [usize; 4], x: f32) {
    fn put<O: Element>(out: &mut TensorMut<'_, O>, index: [usize; 4], x: f32) {
        *out.get_mut(index).expect("index inside validated dims") = O::from_f32(x);
    }
    match out {
        AnyTensorMut::F32(out) => put(out, index, x),
        AnyTensorMut::F16(out) => put(out, index, x),
        AnyTensorMut::Bf16(out) => put(out, index, x),
    }
}

fn run(
    p: &Problem,
    q: AnyTensor<'_>,
    kv: AnyKv<'_>,
    mut out: AnyTensorMut<'_>,
    mut lse: Option<&mut [f32]>,
) -> Result<(), Error> {
    // Nothing to compute: no row, or no output element and no LSE (checked before the score
    // matrix is allocated, which broadcast views can make enormous).
    if p.batch == 0 || p.heads == 0 || p.n_q == 0 || (p.d_v == 0 && lse.is_none()) {
        return Ok(());
    }
    let scale = f64::from(p.scale);
    let (k_scales, v_scales) = (p.kv_scales.map(|s| s.k), p.kv_scales.map(|s| s.v));
    // The whole score matrix of one (batch, head): broadcast views can make it larger than
    // memory, which must be an error, not an abort.
    let too_large = Error::ScoreMatrixTooLarge {
        n_q: p.n_q,
        n_kv: p.n_kv,
    };
    let len = p.n_q.checked_mul(p.n_kv).ok_or(too_large.clone())?;
    let mut scores = Vec::new();
    scores.try_reserve_exact(len).map_err(|_| too_large)?;
    scores.resize(len, 0.0f64);
    // Which keys a row sees (no larger than a row of the score matrix).
    let mut seen = Vec::new();
    seen.try_reserve_exact(p.n_kv)
        .map_err(|_| Error::ScoreMatrixTooLarge {
            n_q: p.n_q,
            n_kv: p.n_kv,
        })?;
    seen.resize(p.n_kv, false);
    for b in 0..p.batch {
        for h in 0..p.heads {
            let hk = p.kv_head(h);
            // 1. Scores.
            for i in 0..p.n_q {
                for j in 0..p.n_kv {
                    let [dot, ..] = dots(&q, &kv, k_scales, ([b, i, h], [b, j, hk]));
                    scores[i * p.n_kv + j] = scale * dot;
                }
            }
            // 2. Softcap, then the additive terms (ALiBi, bias).
            let off = p.diag_offset(b) as f64;
            for i in 0..p.n_q {
                for j in 0..p.n_kv {
                    let s = &mut scores[i * p.n_kv + j];
                    if let Some(cap) = p.softcap {
                        let cap = f64::from(cap);
                        *s = cap * (*s / cap).tanh();
                    }
                    if let Some(slopes) = p.alibi {
                        *s -= f64::from(slopes[h]) * (i as f64 + off - j as f64).abs();
                    }
                    if let Some(bias) = &p.bias {
                        *s += f64::from(bias.at([b, i, h, j]));
                    }
                }
            }
            // 3. Visibility: causal, window, key length, boolean mask.
            let visible = |i: usize, j: usize| {
                p.is_visible(b, i, j) && p.mask.as_ref().is_none_or(|m| m.at([b, i, h, j]))
            };
            for i in 0..p.n_q {
                for j in 0..p.n_kv {
                    if !visible(i, j) {
                        scores[i * p.n_kv + j] = f64::NEG_INFINITY;
                    }
                }
            }
            let sink = p.sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
            for i in 0..p.n_q {
                let row = &mut scores[i * p.n_kv..(i + 1) * p.n_kv];
                // 4. Row softmax, the sink logit joining the max and the denominator only.
                //    `fold(max)` would drop NaN; keep it so it propagates.
                let m_keys = row.iter().copied().fold(f64::NEG_INFINITY, |m, s| {
                    if s.is_nan() || m.is_nan() {
                        f64::NAN
                    } else {
                        m.max(s)
                    }
                });
                // A row whose every key is hidden or carries a −∞ bias is empty: output 0
                // (a NaN value behind a −∞ bias does not reach it), with a sink as without.
                let visible_any = m_keys > f64::NEG_INFINITY || m_keys.is_nan();
                let m = if m_keys.is_nan() {
                    f64::NAN
                } else {
                    m_keys.max(sink)
                };
                let mut sum = if sink > f64::NEG_INFINITY {
                    (sink - m).exp()
                } else {
                    0.0
                };
                for s in row.iter_mut() {
                    *s = if *s == f64::NEG_INFINITY {
                        0.0
                    } else {
                        (*s - m).exp()
                    };
                    sum += *s;
                }
                // 5. Weighted sum over the visible keys.
                for (j, s) in seen.iter_mut().enumerate() {
                    *s = visible(i, j);
                }
                for c in 0..p.d_v {
                    let mut acc = 0.0;
                    if visible_any {
                        acc = weighted_sum(&kv, v_scales, [b, hk, c], row, &seen);
                        acc /= sum;
                    }
                    write(&mut out, [b, i, h, c], acc as f32);
                }
                if let Some(lse) = lse.as_deref_mut() {
                    lse[(b * p.heads + h) * p.n_q + i] = if m > f64::NEG_INFINITY || m.is_nan() {
                        (m + sum.ln()) as f32
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
        }
    }
    Ok(())
}

/// How far the fused kernel's result may be from the f64 reference for one query row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorBound {
    /// Bound on `|out_fused − out_reference|` for every element of the row, both written to
    /// an f32 output (see [`ErrorBound::for_output`] for f16/bf16 outputs).
    pub out: f64,
    /// Bound on `|lse_fused − lse_reference|`.
    pub lse: f64,
    /// The largest `|v|` over the row's visible keys: both results are convex combinations of
    /// those values (0 for a row without visible keys).
    pub value_max: f64,
}

impl ErrorBound {
    /// The bound when both results are written to an output of type `O`: each is rounded once
    /// more, by at most `u_O · value_max` (`u_O` = [`Element::UNIT_ROUNDOFF`], `2⁻¹¹` for f16,
    /// `2⁻⁸` for bf16), so `out + 2·u_O·value_max`; unchanged for f32. (An f16 output whose
    /// value exceeds 65504 is ±∞ on both paths, outside this bound.)
    pub fn for_output<O: Element>(self) -> ErrorBound {
        // f32 outputs are already covered by `out` (its final 2u).
        let extra = if O::UNIT_ROUNDOFF > U {
            2.0 * O::UNIT_ROUNDOFF * self.value_max
        } else {
            0.0
        };
        ErrorBound {
            out: self.out + extra,
            ..self
        }
    }
}

/// Unit roundoff of f32, `2⁻²⁴`.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Largest absolute error of an f32 rounding into the subnormal range, `2⁻¹⁵⁰`.
const ETA: f64 = 1.0 / (1u128 << 100) as f64 / (1u64 << 50) as f64;
/// Unit roundoff of bf16, `2⁻⁸` ([`Options::bf16_products`]).
const U_BF16: f64 = 1.0 / 256.0;
/// The smallest normal f32 and bf16, `2⁻¹²⁶`: bf16 dot products flush anything below it to 0.
const NU: f64 = f32::MIN_POSITIVE as f64;
/// Relative error of the fused kernel's polynomial `2^x` (measured 8.4e-8; see `simd::exp2`).
const EXP2_REL: f64 = 2e-7;

/// `γ_n = n·u / (1 − n·u)`, the classic bound on the relative error of an n-term f32 sum or dot
/// product (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1).
fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    if nu >= 1.0 {
        f64::INFINITY
    } else {
        nu / (1.0 - nu)
    }
}

/// The accuracy contract of the fused kernel against this reference, one bound per query row,
/// laid out like LSE: `[(b·H + h)·n_q + i]`.
///
/// Derivation (worst case, f32 unit roundoff `u = 2⁻²⁴`), for row `i` with visible keys `J`:
/// 1. Each score is an f32 dot product of `d_k` terms with `q` pre-scaled by one rounded
///    multiply: `|s̃_ij − s_ij| ≤ γ_{d_k+2} · |scale| · Σ_p |q_ip k_jp|`. A softcap adds
///    `cap · (2e-7 + 4u)` (tanh is 1-Lipschitz, evaluated through `2^x`); ALiBi and bias terms
///    add `3u` of their magnitude. Subtracting the running max and rounding the log2-domain
///    score add `2u · (|s_ij| + |m_i|)`. Call the largest total over `j ∈ J` (and the sink) `Δ`.
/// 2. Each weight `exp(s̃ − m̃)` is then off by a factor within `e^{±Δ}`, and the polynomial
///    `2^x` adds a relative `2e-7`: per weight relative error `θ = e^Δ − 1 + 2e-7`.
/// 3. Normalizing weights that are each off by at most `θ` moves the convex combination
///    `Σ p_j v_j` by at most `2θ/(1 − θ) · max_{j∈J} ‖v_j‖_∞`.
/// 4. Accumulating `n = |J|` weighted values and weights (plus one for a sink, which acts as a
///    key of value 0) in f32 adds `γ_n` on each sum, and the
///    final division and f32 rounding of the reference add `2u`, all relative to `max ‖v_j‖_∞`.
///
/// 5. Underflow: an f32 rounding whose result is subnormal errs by up to `η = 2⁻¹⁵⁰` in absolute
///    terms, which no relative bound covers (values near 1e-45). At most `3n + 66` of them
///    reach one output element (a product, a sum and a rescale per key, the split-KV combine of
///    at most 32 parts, the final division, the reference's own rounding), and none is
///    amplified (the accumulators are divided by `l ≥ 1`).
///
/// 6. i8 K/V: the kernel rounds each dequantized value `x_i8 · scale` to f32, a relative `u`:
///    one more rounding in every score product (`γ_{d_k+3}` in step 1) and values off by
///    `u · max‖v‖` (one more `u` in the output bound below). Decode may instead take rows
///    with one scale each as integers and round `(q·k_i8) · scale` once per score and
///    `p · scale` once per weight, or, with scales that vary along channels only, round
///    `q_p · scale_p` once per product (Q folded) and `o_p · scale_p` once per output: the
///    same relative `u` per term. Where such a product, or a dequantized value, rounds to a
///    subnormal it errs by up to `η` absolute: a score by `|scale| · η · (1 + Σ_p |q_ip| +
///    128 d_k)` (a folded query's error times an integer), the output by `128 η` per key (a
///    weight's error times an integer, or a value's times a weight ≤ 1; a folded output's
///    one `η` is within it).
///
/// 7. [`Options::bf16_products`] (bf16 Q and K/V; the option changes nothing for other types):
///    the kernel rounds the weights `P` to bf16 (unit roundoff `u_b = 2⁻⁸`) and its bf16 dot
///    products flush bf16 subnormals (below `ν = 2⁻¹²⁶`) to zero; products of bf16 values are
///    exact in f32 unless they underflow (flushed too, as are partial sums below `ν`). So a
///    score gains `|scale| · ν · (2 Σ_p (|q_ip| + |k_jp|) + 3 d_k)` in step 1; rounding the
///    weights multiplies each by a factor within `1 ± u_b` in the numerator only, so step 3
///    runs with `θ_b = (1 + θ)(1 + u_b) − 1`; flushed weights, values and products add
///    `ν · (n(2‖v‖ + 4) + 2)` (the sums stay divided by `l ≥ 1`); the convex-combination cap
///    grows by `2u_b · max‖v‖`. On AMX tiles the same operands are summed in the tiles' order
///    (even and odd products apart, then added to the accumulator): the `γ` terms above hold
///    for any order.
///
/// So `out ≤ max‖v‖ · min(2θ/(1−θ) + 2γ_n + 2u, 2 + 4u) + (3n + 66)·η` (the `min`'s second
/// term: both results are convex combinations of the values, whatever the weights; it takes
/// over when `θ ≥ 1`) and `lse ≤ Δ + θ + γ_n + u·|lse|`.
/// Rows with no visible key and no sink get 0 (the fused kernel writes exactly 0 and −∞ there).
/// The bound is NaN where inputs are NaN; non-finite inputs follow the documented semantics
/// instead.
///
/// # Errors
/// The same as [`attention`] for the shapes and options (no output is needed), plus
/// [`Error::TooManyRows`] when `batch · heads · n_q` bounds cannot be allocated.
pub fn error_bounds<Q: Element, KV: KvElement>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    opts: &Options<'_>,
) -> Result<Vec<ErrorBound>, Error> {
    let [batch, n_q, heads, _] = q.dims();
    let d_v = v.dims()[3];
    let p = Problem::new(q, k, v, [batch, n_q, heads, d_v], None, opts)?;
    bounds(&p, q.erase(), erase_kv(k, v), KV::QUANTIZED)
}

/// [`error_bounds`] with the element types named (`quantized`: i8 K/V).
fn bounds(
    p: &Problem<'_>,
    q: AnyTensor<'_>,
    kv: AnyKv<'_>,
    quantized: bool,
) -> Result<Vec<ErrorBound>, Error> {
    let (batch, n_q, heads) = (p.batch, p.n_q, p.heads);
    let scale = f64::from(p.scale).abs();
    let (k_scales, v_scales) = (p.kv_scales.map(|s| s.k), p.kv_scales.map(|s| s.v));
    // i8 K/V: the kernel rounds each dequantized value `x_i8 · scale` to f32 once — one more
    // rounding in every score product, and values off by a relative u.
    let dequantized = usize::from(quantized);
    // bf16 products (step 7; bf16 Q and K/V only): the weights' rounding to bf16.
    let u_p = if p.bf16_products { U_BF16 } else { 0.0 };
    let rows = batch
        .checked_mul(heads)
        .and_then(|x| x.checked_mul(n_q))
        .unwrap_or(usize::MAX);
    let mut bounds = Vec::new();
    bounds
        .try_reserve_exact(rows)
        .map_err(|_| Error::TooManyRows { rows })?;
    for b in 0..p.batch {
        let off = p.diag_offset(b) as f64;
        for h in 0..p.heads {
            let hk = p.kv_head(h);
            let sink = p.sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
            for i in 0..p.n_q {
                let mut v_max = 0.0f64;
                let mut s_max = sink;
                let mut n = 0usize;
                // max over visible keys of (a score's own rounding error + 2u·|score|); the
                // running-max term 2u·|s_max| is the same for every key and added after.
                let mut worst = 0.0f64;
                // Only the keys inside the row's causal/window/length range (a window problem
                // costs O(window), not O(n_kv)); the boolean mask inside it.
                let (lo, hi) = p.visible_keys(b, i);
                for j in lo..hi {
                    if p.mask.as_ref().is_some_and(|m| !m.at([b, i, h, j])) {
                        continue;
                    }
                    let [dot, abs, norms] = dots(&q, &kv, k_scales, ([b, i, h], [b, j, hk]));
                    let mut s = f64::from(p.scale) * dot;
                    let mut e = gamma(p.d_k + 2 + dequantized) * scale * abs;
                    if p.bf16_products {
                        e += scale * NU * (2.0 * norms + 3.0 * p.d_k as f64);
                    }
                    if quantized {
                        // Subnormal roundings (step 6): `norms` ≥ Σ|q|.
                        e += scale * ETA * (1.0 + norms + 128.0 * p.d_k as f64);
                    }
                    if let Some(cap) = p.softcap {
                        // tanh is 1-Lipschitz, so e does not grow; evaluating it through the
                        // polynomial 2^x and a division adds ~EXP2_REL + 4u relative to cap.
                        let cap = f64::from(cap);
                        s = cap * (s / cap).tanh();
                        e += cap * (EXP2_REL + 4.0 * U);
                    }
                    let mut additive = 0.0f64;
                    // Each additive term is rounded to f32, scaled by log2(e) and added: 3u of
                    // it. An ALiBi distance of 2²⁴ or more is itself rounded to f32: one more u.
                    let mut rounding = 3.0 * U;
                    if let Some(slopes) = p.alibi {
                        let dist = (i as f64 + off - j as f64).abs();
                        additive -= f64::from(slopes[h]) * dist;
                        if dist >= (1u64 << 24) as f64 {
                            rounding += U;
                        }
                    }
                    if let Some(bias) = &p.bias {
                        additive += f64::from(bias.at([b, i, h, j]));
                    }
                    e += rounding * additive.abs();
                    s += additive;
                    if s == f64::NEG_INFINITY {
                        continue; // a −∞ bias hides the key exactly on both paths
                    }
                    n += 1;
                    s_max = s_max.max(s);
                    worst = worst.max(e + 2.0 * U * s.abs());
                    v_max = v_max.max(value_max(&kv, v_scales, [b, j, hk]));
                }
                let mut delta = if n > 0 {
                    worst + 2.0 * U * s_max.abs()
                } else {
                    0.0
                };
                if sink > f64::NEG_INFINITY {
                    delta = delta.max(3.0 * U * (sink.abs() + s_max.abs()));
                }
                let theta = delta.exp_m1() + EXP2_REL;
                // The weights' own rounding to bf16 (step 7), in the numerator only.
                let theta_b = (1.0 + theta) * (1.0 + u_p) - 1.0;
                let terms = n + usize::from(sink > f64::NEG_INFINITY);
                let lse_mag = s_max.abs() + (terms.max(1) as f64).ln();
                bounds.push(if terms == 0 {
                    ErrorBound {
                        out: 0.0,
                        lse: 0.0,
                        value_max: 0.0,
                    }
                } else {
                    // Both results are convex combinations of the visible values (rounded), so
                    // they are never further apart than 2·max‖v‖ (plus rounding): the cap when
                    // θ is too large for the first-order formula (θ ≥ 1 makes it negative).
                    let cap = v_max * (2.0 + 4.0 * U + 2.0 * u_p);
                    let first_order = if theta_b < 1.0 {
                        v_max
                            * (2.0 * theta_b / (1.0 - theta_b)
                                + 2.0 * gamma(terms)
                                + (2 + dequantized) as f64 * U)
                    } else {
                        f64::INFINITY
                    };
                    // Subnormal roundings (step 5) and bf16 flushes (step 7), absolute.
                    let mut underflow = (3 * terms + 66 + 128 * terms * dequantized) as f64 * ETA;
                    if p.bf16_products {
                        underflow += NU * (terms as f64 * (2.0 * v_max + 4.0) + 2.0);
                    }
                    ErrorBound {
                        out: first_order.min(cap) + underflow,
                        lse: delta + theta + gamma(terms) + U * lse_mag,
                        value_max: v_max,
                    }
                });
            }
        }
    }
    Ok(bounds)
}

/// [`Rope::apply`]'s definition in f64: `x` rotated (angles, cosines, sines and the rotation in
/// f64; a table's values read as they are), as a dense `[batch, seq, heads, head_dim]` array.
/// The same checks and errors as [`Rope::apply`].
///
/// # Errors
/// As [`Rope::apply`].
pub fn rope<T: Element>(
    rope: &Rope<'_>,
    x: &Tensor<'_, T>,
    positions: &[u32],
) -> Result<Vec<f64>, Error> {
    let [batch, seq, heads, d] = x.dims();
    rope.check(d, batch * seq, positions)?;
    let mut out = Vec::with_capacity(batch * seq * heads * d);
    for b in 0..batch {
        for s in 0..seq {
            let p = positions[b * seq + s];
            for h in 0..heads {
                let mut row: Vec<f64> = (0..d)
                    .map(|c| {
                        x.get([b, s, h, c])
                            .map_or(f64::NAN, |v| f64::from(v.to_f32()))
                    })
                    .collect();
                for i in 0..rope.rotary_dim() / 2 {
                    let (ja, jb) = rope.pair(i);
                    let (c, sn) = rope.angle(p, i);
                    (row[ja], row[jb]) = rotate(row[ja], row[jb], c, sn);
                }
                out.extend(row);
            }
        }
    }
    Ok(out)
}
