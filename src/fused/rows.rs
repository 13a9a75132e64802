//! The end of a work item: combining the partial results of its key ranges (split-KV) and
//! writing normalized output rows and log-sum-exps. The unsplit path is the one-range case of
//! the same combine.

use super::item::Item;
use crate::element::Element;
use crate::math::{exp2, log2};
use crate::problem::Problem;
use crate::simd::{dispatch, Kernel, Simd};
use crate::tensor::AnyTensorMut;
use half::{bf16, f16};
use std::f32::consts::{LN_2, LOG2_E};

/// The unnormalized result of one key range for the stacked rows of one item: row `r`'s
/// accumulator `o[r · d_vp ..][..d_vp]`, max `m[r]` and weight sum `l[r]` (log2 domain).
#[derive(Clone, Copy)]
pub(crate) struct Part<'a> {
    pub o: &'a [f32],
    pub m: &'a [f32],
    pub l: &'a [f32],
}

/// Combines row `r` of `parts` (disjoint key ranges, in key order) into `acc` (`d_vp`
/// values, whole vectors of the backend's lanes) and returns its `(m, l)`: `m = max_k m_k`,
/// `l = Σ_k l_k·2^(m_k − m)`, `acc = Σ_k o_k·2^(m_k − m)`, summed in the order of `parts`, so
/// the result does not depend on which thread computed which part. With one part every weight
/// is exactly 1: the part itself. On the backend's lanes (a multiply, then an add, rounded
/// as the scalar loop before it): compiled for the crate's baseline target, that loop was 3–6%
/// of a decode step in the L3 (up to 32 key splits of 32 rows each).
struct CombineRow<'a, 'p> {
    parts: &'a [Part<'p>],
    r: usize,
    d_vp: usize,
    acc: &'a mut [f32],
}

impl Kernel for CombineRow<'_, '_> {
    type Output = (f32, f32);
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> (f32, f32) {
        let CombineRow {
            parts,
            r,
            d_vp,
            acc,
        } = self;
        debug_assert_eq!(d_vp % S::LANES, 0);
        let top = parts.iter().map(|p| p.m[r]).fold(-f32::MAX, f32::max);
        acc.fill(0.0);
        let mut l = 0.0;
        for p in parts {
            let w = exp2(p.m[r] - top);
            l += p.l[r] * w;
            let wv = s.splat(w);
            for (a, x) in acc[..d_vp]
                .chunks_exact_mut(S::LANES)
                .zip(p.o[r * d_vp..(r + 1) * d_vp].chunks_exact(S::LANES))
            {
                s.store(a, s.add(s.load(a), s.mul(s.load(x), wv)));
            }
        }
        (top, l)
    }
}

/// Combines the parts of `item` and writes each of its rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_item(
    writer: &RowWriter,
    problem: &Problem<'_>,
    item: &Item,
    d_vp: usize,
    parts: &[Part<'_>],
    acc: &mut [f32],
) {
    let group = problem.group();
    let sinks = problem.sinks;
    for r in 0..item.rows(group) {
        // One part: the row itself (every weight of the combine would be exactly 1).
        let (o, m, l) = match parts {
            [p] => (&p.o[r * d_vp..(r + 1) * d_vp], p.m[r], p.l[r]),
            _ => {
                let (m, l) = dispatch(CombineRow {
                    parts,
                    r,
                    d_vp,
                    acc,
                });
                (&acc[..], m, l)
            }
        };
        let (h, i) = item.row_origin(group, r);
        let (b, i) = problem.q_row(item.batch, i);
        // SAFETY: row (b, i, h) belongs to this item alone: items partition (batch, kv head,
        // query block), `row_origin` maps rows to distinct (head, position) pairs inside the
        // item's heads and query block, and `q_row` maps distinct (batch, position) pairs to
        // distinct rows of the view (packed sequences occupy the disjoint ranges
        // `cu[b] .. cu[b + 1]` of validated, non-decreasing offsets).
        unsafe { writer.write_row(b, i, h, o, m, l, sinks.map(|s| s[h])) };
    }
}

/// Writes output rows and LSE values from several threads at once.
///
/// Holds raw pointers because rows of one output view are written by different rayon workers:
/// no safe borrow can split a strided view into per-row pieces. Not generic: each row is
/// converted to the output's type as it is written (one `match` per row).
pub(crate) struct RowWriter {
    out: OutPtr,
    dims: [usize; 4],
    strides: [usize; 4],
    lse: *mut f32,
    lse_len: usize,
}

/// The output's first element, by its type.
#[derive(Clone, Copy)]
enum OutPtr {
    F32(*mut f32),
    F16(*mut f16),
    Bf16(*mut bf16),
}

// SAFETY: the pointers come from `&mut` borrows that outlive the parallel loop, and every
// element is written by exactly one work item (see `write_row`), so sharing the writer across
// threads creates no data race.
unsafe impl Send for RowWriter {}
// SAFETY: as above.
unsafe impl Sync for RowWriter {}

impl RowWriter {
    pub fn new(out: AnyTensorMut<'_>, lse: Option<&mut [f32]>) -> Self {
        let (out, dims, strides) = match out {
            AnyTensorMut::F32(mut t) => {
                let (data, dims, strides) = t.raw_parts();
                (OutPtr::F32(data.as_mut_ptr()), dims, strides)
            }
            AnyTensorMut::F16(mut t) => {
                let (data, dims, strides) = t.raw_parts();
                (OutPtr::F16(data.as_mut_ptr()), dims, strides)
            }
            AnyTensorMut::Bf16(mut t) => {
                let (data, dims, strides) = t.raw_parts();
                (OutPtr::Bf16(data.as_mut_ptr()), dims, strides)
            }
        };
        let (lse, lse_len) = match lse {
            Some(l) => (l.as_mut_ptr(), l.len()),
            None => (std::ptr::null_mut(), 0),
        };
        RowWriter {
            out,
            dims,
            strides,
            lse,
            lse_len,
        }
    }

    /// Writes one finished row: `out[b, i, h, ..]` and `lse[b][h][i]` from the row's
    /// unnormalized accumulator `o`, max `m` and sum `l` (log2 domain), with the attention
    /// sink `σ` (natural units) joining the denominator:
    /// `M = max(m, σ·log₂e)`, `L = l·2^(m−M) + 2^(σ·log₂e−M)`, `out = o·2^(m−M) / L`,
    /// `lse = (M + log₂ L)·ln 2`; the output is rounded once to `O`. A row that saw no key (`l = 0`) gets exactly 0 and `lse = σ`
    /// (`−∞` without a sink), even if its accumulator caught a NaN through a zero weight.
    ///
    /// # Safety
    /// No other thread may write row `(b, i, h)` concurrently. Indices must be inside the dims;
    /// then every offset is inside the slices, because `TensorMut` validated the view
    /// (largest reachable index < len) and that it is injective (distinct rows never share
    /// an element), and the LSE slice was checked to hold `batch · heads · n_q` values.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_row(
        &self,
        b: usize,
        i: usize,
        h: usize,
        o: &[f32],
        m: f32,
        l: f32,
        sink: Option<f32>,
    ) {
        let [_, n_q, heads, d_v] = self.dims;
        debug_assert!(b < self.dims[0] && i < n_q && h < heads && o.len() >= d_v);
        // Validated: a sink is −∞ or has a finite σ·log₂e.
        let sink = sink.filter(|&s| s > f32::NEG_INFINITY);
        // `1/L` and `log₂ L` (the latter only where the LSE is asked for: it is a scalar
        // series, 3% of a short prefill).
        let with_lse = !self.lse.is_null();
        let (inv, lse) = if l == 0.0 {
            (0.0, sink.unwrap_or(f32::NEG_INFINITY))
        } else {
            let (top, total, scale) = match sink {
                Some(sigma) => {
                    let s2 = sigma * LOG2_E;
                    let top = m.max(s2);
                    let o_scale = exp2(m - top);
                    (top, l * o_scale + exp2(s2 - top), o_scale)
                }
                None => (m, l, 1.0),
            };
            let lse = if with_lse {
                (top + log2(total)) * LN_2
            } else {
                0.0
            };
            (scale / total, lse)
        };
        // A view with d_v = 0 has no element (its strides may be anything, even overflowing
        // once multiplied): no offset is formed for it.
        if d_v > 0 {
            let base = b * self.strides[0] + i * self.strides[1] + h * self.strides[2];
            let (o, inv) = (&o[..d_v], if l == 0.0 { None } else { Some(inv) });
            let (sd, ptr) = (self.strides[3], self.out);
            // SAFETY: the function's contract.
            unsafe {
                match ptr {
                    OutPtr::F32(out) => write_values(out, base, sd, o, inv),
                    OutPtr::F16(out) => write_values(out, base, sd, o, inv),
                    OutPtr::Bf16(out) => write_values(out, base, sd, o, inv),
                }
            }
        }
        if with_lse {
            let idx = (b * heads + h) * n_q + i;
            debug_assert!(idx < self.lse_len);
            // SAFETY: see the function's contract.
            unsafe { *self.lse.add(idx) = lse };
        }
    }
}

/// Writes `o[x] · inv` (0 for every `x` without `inv`: a row that saw no key), rounded to `O`,
/// to the `o.len()` elements `out[base + x · sd]`.
///
/// # Safety
/// Those elements lie inside a validated output view and no other thread writes them
/// concurrently ([`RowWriter::write_row`]'s contract).
#[inline(always)]
unsafe fn write_values<O: Element>(
    out: *mut O,
    base: usize,
    sd: usize,
    o: &[f32],
    inv: Option<f32>,
) {
    let value = |ox: f32| O::from_f32(inv.map_or(0.0, |inv| ox * inv));
    if sd == 1 {
        // SAFETY: with unit channel stride the row is the `o.len()` elements from `base`,
        // inside the view's validated span, and written by this thread alone.
        let row = unsafe { std::slice::from_raw_parts_mut(out.add(base), o.len()) };
        for (x, &ox) in row.iter_mut().zip(o) {
            *x = value(ox);
        }
    } else {
        for (x, &ox) in o.iter().enumerate() {
            // SAFETY: an element of the row, inside the view's validated span (the view is
            // non-empty: d_v > 0).
            unsafe { *out.add(base + x * sd) = value(ox) };
        }
    }
}
