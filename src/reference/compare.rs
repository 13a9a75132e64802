//! A result held against the reference within its bound, in one call: what an engine's
//! integration test asks of every layer it runs ([`compare`], [`compare_varlen`]).

use super::attention::{attention_lse, attention_varlen};
use super::bounds::{error_bounds, error_bounds_varlen, ErrorBound};
use crate::element::{Element, KvElement};
use crate::error::Error;
use crate::kv_cache::VarlenKv;
use crate::options::Options;
use crate::problem::Problem;
use crate::tensor::{Tensor, TensorMut};

/// How far a result lies from the f64 reference, relative to its [`ErrorBound`]: the worst
/// `error / bound` over every row, head and output channel (and the LSE, when given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deviation {
    /// The largest `|result − reference| / bound` (at most 1: within the bound). Equal values
    /// (infinities of one sign, both NaN) are off by 0; a value off by more than 0 where the
    /// bound is 0 (a row without visible keys) or by an infinity gives `f64::INFINITY`.
    pub ratio: f64,
    /// Where the worst was reached: the batch (0 for a packed call), the query row (the packed
    /// row for a packed call) and the head.
    pub at: [usize; 3],
    /// Whether the worst was the row's LSE (else an output element).
    pub in_lse: bool,
}

impl Deviation {
    /// Whether the result is within its bound everywhere (`ratio ≤ 1`).
    pub fn within_bound(&self) -> bool {
        self.ratio <= 1.0
    }

    /// No deviation yet.
    const NONE: Deviation = Deviation {
        ratio: 0.0,
        at: [0; 3],
        in_lse: false,
    };

    /// Takes `|got − want| / bound` at `at` if it is the worst so far.
    fn note(&mut self, got: f32, want: f32, bound: f64, at: [usize; 3], in_lse: bool) {
        let same = got == want || (got.is_nan() && want.is_nan());
        let error = if same {
            0.0
        } else {
            (f64::from(got) - f64::from(want)).abs()
        };
        let ratio = match error {
            0.0 => 0.0,
            e if e.is_finite() && bound > 0.0 => e / bound,
            _ => f64::INFINITY,
        };
        if ratio > self.ratio {
            *self = Deviation { ratio, at, in_lse };
        }
    }
}

/// Compares a result of [`crate::attention`] or [`crate::attention_lse`] (`out` `[B, n_q, H,
/// d_v]` in any layout; `lse` `[B, H, n_q]` if given) with [`attention_lse`] on the same
/// operands, row by row within [`error_bounds`] (for an output of type `O`:
/// [`ErrorBound::for_output`]).
///
/// # Errors
/// As [`crate::attention_lse`] (`out` is checked as its output, `lse` as its LSE, before
/// anything is computed), plus [`Error::ScoreMatrixTooLarge`] and [`Error::TooManyRows`] from the reference
/// and its bounds, and [`Error::OutOfMemory`] when the reference's output cannot be allocated.
pub fn compare<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &Tensor<'_, O>,
    lse: Option<&[f32]>,
    opts: &Options<'_>,
) -> Result<Deviation, Error> {
    // The call's checks first (`out` as its output, `lse` its length), before any work.
    Problem::new(q, k, v, out.dims(), lse, opts)?;
    let (dims, n_q) = (out.dims(), out.dims()[1]);
    if dims[..3].contains(&0) {
        return Ok(Deviation::NONE); // no row (whatever the other dims: they need no storage)
    }
    let (mut want, mut want_lse) = buffers(dims)?;
    attention_lse(
        q,
        k,
        v,
        &mut TensorMut::bshd(&mut want, dims)?,
        &mut want_lse,
        opts,
    )?;
    let bounds = error_bounds(q, k, v, opts)?;
    Ok(deviation(out, lse, &want, &want_lse, &bounds, 0..n_q))
}

/// Compares a result of [`crate::attention_varlen`] (or of a [`Plan`](crate::Plan)'s run:
/// `out` `[1, total_q, H, d_v]` in any layout; `lse` `[H, total_q]` if given) with
/// [`attention_varlen`] on the same operands, row by row within [`error_bounds_varlen`] (for
/// an output of type `O`: [`ErrorBound::for_output`]). Packed rows outside every sequence are
/// not compared (the call does not write them).
///
/// # Errors
/// As [`crate::attention_varlen`] (`out` is checked as its output, `lse` as its LSE, before
/// anything is computed), plus [`Error::ScoreMatrixTooLarge`] and [`Error::TooManyRows`] from the reference
/// and its bounds, and [`Error::OutOfMemory`] when the reference's output cannot be allocated.
pub fn compare_varlen<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    cu_seqlens_q: &[usize],
    kv: &VarlenKv<'_, KV>,
    out: &Tensor<'_, O>,
    lse: Option<&[f32]>,
    opts: &Options<'_>,
) -> Result<Deviation, Error> {
    // The call's checks first (`out` as its output, `lse` its length), before any work.
    Problem::new_varlen(q, cu_seqlens_q, kv, out.dims(), lse, opts)?;
    let dims = out.dims();
    if dims[..3].contains(&0) {
        return Ok(Deviation::NONE); // no row (whatever the other dims: they need no storage)
    }
    let (mut want, mut want_lse) = buffers(dims)?;
    let mut view = TensorMut::bshd(&mut want, dims)?;
    attention_varlen(q, cu_seqlens_q, kv, &mut view, Some(&mut want_lse), opts)?;
    let bounds = error_bounds_varlen(q, cu_seqlens_q, kv, opts)?;
    // Validated above: offsets non-decreasing, the last at most `total_q`.
    let rows = match (cu_seqlens_q.first(), cu_seqlens_q.last()) {
        (Some(&first), Some(&last)) => first..last,
        _ => 0..0,
    };
    Ok(deviation(out, lse, &want, &want_lse, &bounds, rows))
}

/// The reference's output and LSE for an output of `dims` (checked as the call's output, so
/// against Q and V; allocations fallible all the same).
fn buffers([b, n_q, h, d_v]: [usize; 4]) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let rows = b.checked_mul(h).and_then(|x| x.checked_mul(n_q));
    let elements = rows.and_then(|x| x.checked_mul(d_v));
    let zeros = |n: Option<usize>| {
        let n = n.unwrap_or(usize::MAX);
        let mut x = Vec::new();
        x.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
            bytes: n.saturating_mul(4),
        })?;
        x.resize(n, 0.0f32);
        Ok(x)
    };
    Ok((zeros(elements)?, zeros(rows)?))
}

/// The worst deviation of `out` (and `lse`) from the reference's `want` (contiguous, `out`'s
/// dims) and `want_lse`, over the rows `rows` of every batch and head; `bounds` and both LSEs
/// laid out `[B, H, n_q]` (`lse` of that length, checked).
fn deviation<O: Element>(
    out: &Tensor<'_, O>,
    lse: Option<&[f32]>,
    want: &[f32],
    want_lse: &[f32],
    bounds: &[ErrorBound],
    rows: std::ops::Range<usize>,
) -> Deviation {
    let [b, n_q, h, d_v] = out.dims();
    let mut worst = Deviation::NONE;
    for (batch, head) in (0..b).flat_map(|batch| (0..h).map(move |head| (batch, head))) {
        for row in rows.clone() {
            let at = [batch, row, head];
            let index = (batch * h + head) * n_q + row;
            let bound = bounds[index].for_output::<O>();
            if let Some(lse) = lse {
                worst.note(lse[index], want_lse[index], bound.lse, at, true);
            }
            let want_row = &want[((batch * n_q + row) * h + head) * d_v..][..d_v];
            for (c, &w) in want_row.iter().enumerate() {
                // In range: the reference call checked `out`'s dims as its output.
                let got = out
                    .get([batch, row, head, c])
                    .map_or(f32::NAN, |&x| x.to_f32());
                worst.note(got, w, bound.out, at, false);
            }
        }
    }
    worst
}
