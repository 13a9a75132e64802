//! The accuracy contract of the fused kernel against the reference: a bound per query row
//! ([`error_bounds`] and its paged and packed forms), derived from the f32 rounding of each
//! step of the kernel.

use super::rows::{dots, erase_kv, paged_kv, row_index, value_max, varlen_kv};
use crate::element::{Element, KvElement};
use crate::error::Error;
use crate::kv_cache::{AnyKv, PagedKv, RowMap, VarlenKv};
use crate::options::Options;
use crate::problem::Problem;
use crate::tensor::{AnyTensor, Tensor};

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

/// The bound of a row without visible key and sink (and of a packed row outside every
/// sequence): both paths write exactly 0 and −∞ there.
const NO_KEY: ErrorBound = ErrorBound {
    out: 0.0,
    lse: 0.0,
    value_max: 0.0,
};

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
/// The same as [`attention`](super::attention) for the shapes and options (no output is
/// needed), plus [`Error::TooManyRows`] when `batch · heads · n_q` bounds cannot be allocated.
pub fn error_bounds<Q: Element, KV: KvElement>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    opts: &Options<'_>,
) -> Result<Vec<ErrorBound>, Error> {
    let [batch, n_q, heads, _] = q.dims();
    let d_v = v.dims()[3];
    let p = Problem::new(q, k, v, [batch, n_q, heads, d_v], None, opts)?;
    let kv = erase_kv(k, v, RowMap::Dense);
    bounds(&p, q.erase(), n_q, kv, KV::QUANTIZED)
}

/// [`error_bounds`] of a call of [`attention_paged`](super::attention_paged) (the same
/// operands but the output): one bound per query row, laid out like its LSE,
/// `[(b·H + h)·n_q + i]`. The bound of a row is the bound of the same row of the dense call
/// on the sequences' keys gathered (the derivation reads values, not where they lie).
///
/// # Errors
/// As [`crate::attention_paged`] for the shapes and options, plus [`Error::TooManyRows`].
pub fn error_bounds_paged<Q: Element, KV: KvElement>(
    q: &Tensor<'_, Q>,
    kv: &PagedKv<'_, KV>,
    opts: &Options<'_>,
) -> Result<Vec<ErrorBound>, Error> {
    let [batch, n_q, heads, _] = q.dims();
    let d_v = kv.v.dims()[3];
    let p = Problem::new_paged(q, kv, [batch, n_q, heads, d_v], None, opts)?;
    bounds(&p, q.erase(), n_q, paged_kv(kv), KV::QUANTIZED)
}

/// [`error_bounds`] of a call of [`attention_varlen`](super::attention_varlen) (the same
/// operands but the output): one bound per packed row and head, laid out like its LSE,
/// `[h · total_q + t]` for packed row `t`; rows outside every sequence get a bound of 0 (the
/// call does not write them). Each sequence's bounds are those of the dense call on that
/// sequence alone.
///
/// # Errors
/// As [`crate::attention_varlen`] for the shapes and options, plus [`Error::TooManyRows`].
pub fn error_bounds_varlen<Q: Element, KV: KvElement>(
    q: &Tensor<'_, Q>,
    cu_seqlens_q: &[usize],
    kv: &VarlenKv<'_, KV>,
    opts: &Options<'_>,
) -> Result<Vec<ErrorBound>, Error> {
    let [one, total_q, heads, _] = q.dims();
    let d_v = match kv {
        VarlenKv::Packed(p) => p.v.dims()[3],
        VarlenKv::Paged(p) => p.v.dims()[3],
    };
    let p = Problem::new_varlen(q, cu_seqlens_q, kv, [one, total_q, heads, d_v], None, opts)?;
    bounds(&p, q.erase(), total_q, varlen_kv(kv), KV::QUANTIZED)
}

/// [`error_bounds`] with the element types named (`quantized`: i8 K/V; `total_q`: dim 1 of Q,
/// which places the rows of packed queries, see [`row_index`]).
fn bounds(
    p: &Problem<'_>,
    q: AnyTensor<'_>,
    total_q: usize,
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
    // Laid out like LSE: `[B][H][n_q]`, or `[H][total_q]` for packed queries.
    let rows = match p.seqs.q {
        None => batch.checked_mul(heads).and_then(|x| x.checked_mul(n_q)),
        Some(_) => heads.checked_mul(total_q),
    }
    .unwrap_or(usize::MAX);
    let mut bounds = Vec::new();
    bounds
        .try_reserve_exact(rows)
        .map_err(|_| Error::TooManyRows { rows })?;
    bounds.resize(rows, NO_KEY);
    for b in 0..p.batch {
        let off = p.diag_offset(b) as f64;
        for h in 0..p.heads {
            let hk = p.kv_head(h);
            let sink = p.sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
            for i in 0..p.q_len(b) {
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
                    let [dot, abs, norms] = dots(p, &q, &kv, k_scales, ([b, i, h], [j, hk]));
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
                bounds[row_index(p, total_q, [b, h, i])] = if terms == 0 {
                    NO_KEY
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
                };
            }
        }
    }
    Ok(bounds)
}
