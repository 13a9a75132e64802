//! The reference's attention over every layout: dense, paged and packed operands read where
//! the calls read them, each (sequence, head) computed from its whole score matrix in f64.

use super::rows::{dots, erase_kv, max_keys, paged_kv, row_index, varlen_kv, weighted_sum, write};
use crate::element::{Element, KvElement};
use crate::error::Error;
use crate::kv_cache::{AnyKv, PagedKv, RowMap, VarlenKv};
use crate::options::Options;
use crate::problem::Problem;
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
    let (n_q, kv) = (q.dims()[1], erase_kv(k, v, RowMap::Dense));
    run(&problem, q.erase(), n_q, kv, out.erase(), None)
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
    let (n_q, kv) = (q.dims()[1], erase_kv(k, v, RowMap::Dense));
    run(&problem, q.erase(), n_q, kv, out.erase(), Some(lse))
}

/// Reference attention over a paged K/V cache: [`crate::attention_paged`]'s operands,
/// semantics, checks and errors (`lse` `[B, H, n_q]` if given), computed as
/// [`attention_lse`] on each sequence's keys `0 .. kv_len` read through the block table.
///
/// # Errors
/// As [`crate::attention_paged`], plus [`Error::ScoreMatrixTooLarge`].
pub fn attention_paged<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    kv: &PagedKv<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), Error> {
    let problem = Problem::new_paged(q, kv, out.dims(), lse.as_deref(), opts)?;
    let n_q = q.dims()[1];
    run(&problem, q.erase(), n_q, paged_kv(kv), out.erase(), lse)
}

/// Reference attention over a packed batch of variable-length sequences:
/// [`crate::attention_varlen`]'s operands, semantics, checks and errors (`lse` `[H, total_q]`
/// if given; packed rows outside every sequence are not written), each sequence computed as
/// [`attention_lse`] on its own rows and keys.
///
/// # Errors
/// As [`crate::attention_varlen`], plus [`Error::ScoreMatrixTooLarge`].
pub fn attention_varlen<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    cu_seqlens_q: &[usize],
    kv: &VarlenKv<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), Error> {
    let problem = Problem::new_varlen(q, cu_seqlens_q, kv, out.dims(), lse.as_deref(), opts)?;
    let total_q = q.dims()[1];
    run(
        &problem,
        q.erase(),
        total_q,
        varlen_kv(kv),
        out.erase(),
        lse,
    )
}

/// The reference of every layout (`total_q`: dim 1 of Q, which places the LSE of packed
/// queries, see [`row_index`]): for each sequence `b`, head `h`, its rows `0 .. q_len(b)` against
/// its keys `0 .. kv_len(b)`.
fn run(
    p: &Problem,
    q: AnyTensor<'_>,
    total_q: usize,
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
    let n_kv = max_keys(p);
    let too_large = Error::ScoreMatrixTooLarge { n_q: p.n_q, n_kv };
    let len = p.n_q.checked_mul(n_kv).ok_or(too_large.clone())?;
    let mut scores = Vec::new();
    scores
        .try_reserve_exact(len)
        .map_err(|_| too_large.clone())?;
    scores.resize(len, 0.0f64);
    // Which keys a row sees (no larger than a row of the score matrix).
    let mut seen = Vec::new();
    seen.try_reserve_exact(n_kv).map_err(|_| too_large)?;
    seen.resize(n_kv, false);
    for b in 0..p.batch {
        // This sequence's rows and keys (keys past its length are hidden: never read).
        let (n_q, n_kv) = (p.q_len(b), p.kv_len(b));
        let seen = &mut seen[..n_kv];
        for h in 0..p.heads {
            let hk = p.kv_head(h);
            // 1. Scores.
            for i in 0..n_q {
                for j in 0..n_kv {
                    let [dot, ..] = dots(p, &q, &kv, k_scales, ([b, i, h], [j, hk]));
                    scores[i * n_kv + j] = scale * dot;
                }
            }
            // 2. Softcap, then the additive terms (ALiBi, bias).
            let off = p.diag_offset(b) as f64;
            for i in 0..n_q {
                for j in 0..n_kv {
                    let s = &mut scores[i * n_kv + j];
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
            for i in 0..n_q {
                for j in 0..n_kv {
                    if !visible(i, j) {
                        scores[i * n_kv + j] = f64::NEG_INFINITY;
                    }
                }
            }
            let sink = p.sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
            for i in 0..n_q {
                let row = &mut scores[i * n_kv..(i + 1) * n_kv];
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
                        acc = weighted_sum(&kv, v_scales, [b, hk, c], row, seen);
                        acc /= sum;
                    }
                    write(p, &mut out, [b, i, h, c], acc as f32);
                }
                if let Some(lse) = lse.as_deref_mut() {
                    lse[row_index(p, total_q, [b, h, i])] = if m > f64::NEG_INFINITY || m.is_nan() {
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
