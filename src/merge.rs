//! Merging partial attention results computed over disjoint key sets (split-KV decode, ring or
//! sequence parallelism across threads, sockets or machines).

use crate::error::{Error, Operand};
use crate::tensor::{Tensor, TensorMut};

/// One partial result: the output and LSE of attention over a subset of the keys, as written by
/// [`attention_lse`](crate::attention_lse) (output `[batch, n_q, heads, d_v]`, `lse` laid out
/// `[batch][heads][n_q]`, `−∞` for rows that saw no key).
#[derive(Debug, Clone, Copy)]
pub struct Partial<'a> {
    /// The partial output.
    pub out: Tensor<'a, f32>,
    /// The partial log-sum-exp.
    pub lse: &'a [f32],
}

/// Merges partial results over disjoint key sets into the result over their union:
/// for each row, `lse = ln Σ_k e^{lse_k}` (computed as `M + ln Σ_k e^{lse_k − M}` with
/// `M = max_k lse_k`) and `out = Σ_k out_k · e^{lse_k − lse}`. Exact up to rounding (the sums
/// are taken in f64). Rows for which every partial has `lse = −∞` get output 0 and `lse = −∞`;
/// partials with `lse = −∞` contribute nothing, whatever their output holds. NaN propagates.
///
/// With attention sinks, pass the sinks to exactly one of the partial computations: the sink acts
/// as one extra key of value 0, and must be counted once.
///
/// # Errors
/// [`Error::NoPartials`] for an empty `parts`; [`Error::ShapeMismatch`] (operand
/// [`Operand::Partial`]) when a partial's output dims differ from `out`'s;
/// [`Error::LengthMismatch`] when a partial's `lse` or `lse` itself does not hold
/// `batch · heads · n_q` values; [`Error::OutOfMemory`] if the per-row accumulator
/// (`d_v` values) cannot be allocated.
pub fn merge_partials(
    parts: &[Partial<'_>],
    out: &mut TensorMut<'_, f32>,
    lse: &mut [f32],
) -> Result<(), Error> {
    if parts.is_empty() {
        return Err(Error::NoPartials);
    }
    let dims = out.dims();
    let [batch, n_q, heads, d_v] = dims;
    let rows = batch
        .checked_mul(heads)
        .and_then(|x| x.checked_mul(n_q))
        .unwrap_or(usize::MAX);
    let check_len = |operand, got: usize| {
        if got == rows {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                operand,
                expected: rows,
                got,
            })
        }
    };
    check_len(Operand::Lse, lse.len())?;
    for part in parts {
        for (k, dim) in crate::error::Dim::ALL.into_iter().enumerate() {
            if part.out.dims()[k] != dims[k] {
                return Err(Error::ShapeMismatch {
                    operand: Operand::Partial,
                    dim,
                    expected: dims[k],
                    got: part.out.dims()[k],
                });
            }
        }
        check_len(Operand::Partial, part.lse.len())?;
    }
    if rows == 0 {
        return Ok(()); // no row: nothing to merge (d_v may be anything for an empty view)
    }
    // A non-empty output view holds at least d_v elements, so these buffers are at most twice
    // the size of memory the caller already has; still allocated fallibly.
    let out_of_memory = |n: usize| Error::OutOfMemory {
        bytes: n.saturating_mul(8),
    };
    let mut weights = Vec::new();
    weights
        .try_reserve_exact(parts.len())
        .map_err(|_| out_of_memory(parts.len()))?;
    weights.resize(parts.len(), 0.0f64);
    let mut acc = Vec::new();
    acc.try_reserve_exact(d_v).map_err(|_| out_of_memory(d_v))?;
    acc.resize(d_v, 0.0f64);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let row = (b * heads + h) * n_q + i;
                let lses = parts.iter().map(|p| f64::from(p.lse[row]));
                let top = lses.clone().fold(f64::NEG_INFINITY, |m, x| {
                    if x.is_nan() || m.is_nan() {
                        f64::NAN
                    } else {
                        m.max(x)
                    }
                });
                acc.fill(0.0);
                let merged_lse = if top == f64::NEG_INFINITY {
                    f64::NEG_INFINITY
                } else {
                    let mut total = 0.0;
                    for (w, x) in weights.iter_mut().zip(lses) {
                        *w = if x == f64::NEG_INFINITY {
                            0.0
                        } else {
                            (x - top).exp()
                        };
                        total += *w;
                    }
                    for (part, &w) in parts.iter().zip(&weights) {
                        if w == 0.0 && !top.is_nan() {
                            continue;
                        }
                        for (c, a) in acc.iter_mut().enumerate() {
                            let x = part.out.get([b, i, h, c]).copied().unwrap_or(f32::NAN);
                            *a += w * f64::from(x);
                        }
                    }
                    for a in acc.iter_mut() {
                        *a /= total;
                    }
                    top + total.ln()
                };
                for (c, &a) in acc.iter().enumerate() {
                    if let Some(x) = out.get_mut([b, i, h, c]) {
                        *x = a as f32;
                    }
                }
                lse[row] = merged_lse as f32;
            }
        }
    }
    Ok(())
}
