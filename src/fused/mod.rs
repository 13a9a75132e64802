//! The fused kernel: work items scheduled on the caller's rayon pool, each streaming its query
//! rows against the key blocks with the online softmax ([`stream`]), then writing normalized
//! output rows and log-sum-exps.
//!
//! Extra memory is one [`stream::Scratch`] per concurrently running rayon job: a few hundred KiB
//! that depends on the head sizes and the GQA group, never on the sequence lengths.

mod blocking;
mod stream;

use crate::error::Error;
use crate::problem::Problem;
use crate::simd::{dispatch, geometry, Kernel, Simd};
use crate::tensor::{Tensor, TensorMut};
use blocking::Blocking;
use rayon::prelude::*;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use stream::{stream, Item, Operands, Scratch};

/// Writes output rows and LSE values from several threads at once.
///
/// Holds raw pointers because rows of one output view are written by different rayon workers:
/// no safe borrow can split a strided view into per-row pieces.
struct RowWriter {
    out: *mut f32,
    dims: [usize; 4],
    strides: [usize; 4],
    lse: *mut f32,
    lse_len: usize,
}

// SAFETY: the pointers come from `&mut` borrows that outlive the parallel loop, and every
// element is written by exactly one work item (see `write_row`), so sharing the writer across
// threads creates no data race.
unsafe impl Send for RowWriter {}
// SAFETY: as above.
unsafe impl Sync for RowWriter {}

impl RowWriter {
    fn new(out: &mut TensorMut<'_, f32>, lse: Option<&mut [f32]>) -> Self {
        let (data, dims, strides) = out.raw_parts();
        let (lse, lse_len) = match lse {
            Some(l) => (l.as_mut_ptr(), l.len()),
            None => (std::ptr::null_mut(), 0),
        };
        RowWriter {
            out: data.as_mut_ptr(),
            dims,
            strides,
            lse,
            lse_len,
        }
    }

    /// Writes one finished row: `out[b, i, h, ..]` and `lse[b][h][i]` from the row's
    /// unnormalized accumulator `o`, max `m` and sum `l` (log2 domain), adding the attention
    /// sink `sink2 = σ_h·log₂e` (or −∞) to the denominator:
    /// `M = max(m, sink2)`, `L = l·2^(m−M) + 2^(sink2−M)`, `out = o·2^(m−M) / L`,
    /// `lse = (M + log₂ L)·ln 2`; a row with `L = 0` gets 0 and −∞.
    ///
    /// # Safety
    /// No other thread may write row `(b, i, h)` concurrently. Indices must be inside the dims;
    /// then every offset is inside the slices, because `TensorMut` validated the view
    /// (largest reachable index < len) and that it is injective (distinct rows never share
    /// an element), and the LSE slice was checked to hold `batch · heads · n_q` values.
    #[allow(clippy::too_many_arguments)]
    unsafe fn write_row(
        &self,
        b: usize,
        i: usize,
        h: usize,
        o: &[f32],
        m: f32,
        l: f32,
        sink2: f32,
    ) {
        let [_, n_q, heads, d_v] = self.dims;
        debug_assert!(b < self.dims[0] && i < n_q && h < heads && o.len() >= d_v);
        // No weight from any key: the output is exactly 0 even with a sink, and even if the
        // accumulator caught a NaN or ∞ from V through an exact-zero weight (0 · NaN).
        let saw_no_key = l == 0.0;
        let top = m.max(sink2);
        let (o_scale, l) = if sink2 == f32::NEG_INFINITY {
            (1.0, l)
        } else {
            let o_scale = (m - top).exp2();
            (o_scale, l * o_scale + (sink2 - top).exp2())
        };
        let inv = if l == 0.0 { 0.0 } else { o_scale / l };
        let base = b * self.strides[0] + i * self.strides[1] + h * self.strides[2];
        for (x, &ox) in o[..d_v].iter().enumerate() {
            let value = if saw_no_key { 0.0 } else { ox * inv };
            // SAFETY: see the function's contract.
            unsafe { *self.out.add(base + x * self.strides[3]) = value };
        }
        if !self.lse.is_null() {
            let idx = (b * heads + h) * n_q + i;
            debug_assert!(idx < self.lse_len);
            let value = if l == 0.0 {
                f32::NEG_INFINITY
            } else {
                (top + l.log2()) * std::f32::consts::LN_2
            };
            // SAFETY: see the function's contract.
            unsafe { *self.lse.add(idx) = value };
        }
    }
}

/// Scratch buffers of one call, handed to rayon jobs and taken back when they finish.
///
/// `for_each_init` runs its init once per rayon *job*, and rayon splits a parallel loop into
/// many jobs; a fresh `Scratch` per job (hundreds of KiB, zeroed, often a fresh mmap) made two
/// threads only 1.3× faster than one. The pool holds at most as many scratches as jobs ran at
/// once, so memory stays O(threads × block).
struct ScratchPool<'b> {
    blocking: &'b Blocking,
    pack_k: bool,
    free: Mutex<Vec<Scratch>>,
}

/// A scratch on loan from a [`ScratchPool`]; returns to it when dropped.
struct Loan<'p, 'b> {
    pool: &'p ScratchPool<'b>,
    scratch: Option<Scratch>,
}

impl<'b> ScratchPool<'b> {
    /// A pool holding one scratch, or the error if even one cannot be allocated.
    fn new(blocking: &'b Blocking, pack_k: bool) -> Result<Self, Error> {
        let first = Scratch::try_new(blocking, pack_k).ok_or(Error::ScratchTooLarge {
            bytes: Scratch::bytes(blocking, pack_k),
        })?;
        Ok(ScratchPool {
            blocking,
            pack_k,
            free: Mutex::new(vec![first]),
        })
    }

    fn take(&self) -> Loan<'_, 'b> {
        let reused = self.free.lock().ok().and_then(|mut free| free.pop());
        let scratch = reused.unwrap_or_else(|| {
            // The first scratch of this size was allocated in `new`; failing now means the
            // process ran out of memory mid-call, which std's allocation functions abort on.
            Scratch::try_new(self.blocking, self.pack_k)
                .unwrap_or_else(|| std::alloc::handle_alloc_error(std::alloc::Layout::new::<f32>()))
        });
        Loan {
            pool: self,
            scratch: Some(scratch),
        }
    }
}

impl Loan<'_, '_> {
    fn get(&mut self) -> &mut Scratch {
        self.scratch
            .as_mut()
            .expect("a loan holds its scratch until dropped")
    }
}

impl Drop for Loan<'_, '_> {
    fn drop(&mut self) {
        if let (Some(scratch), Ok(mut free)) = (self.scratch.take(), self.pool.free.lock()) {
            free.push(scratch);
        }
    }
}

/// One work item run on the dispatched backend.
struct ItemKernel<'a, 'o> {
    ops: &'a Operands<'o>,
    item: &'a Item,
    scratch: &'a mut Scratch,
}

impl Kernel for ItemKernel<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        stream(s, self.ops, self.item, self.scratch)
    }
}

/// Computes attention for a validated problem with the fused kernel.
pub(crate) fn run(
    problem: &Problem<'_>,
    q: &Tensor<'_, f32>,
    k: &Tensor<'_, f32>,
    v: &Tensor<'_, f32>,
    out: &mut TensorMut<'_, f32>,
    lse: Option<&mut [f32]>,
) -> Result<(), Error> {
    if problem.batch == 0 || problem.n_q == 0 || (problem.d_v == 0 && lse.is_none()) {
        return Ok(());
    }
    let blocking = Blocking::for_problem(problem, geometry());
    let ops = Operands {
        problem,
        blocking,
        q: *q,
        k: *k,
        v: *v,
    };
    let writer = RowWriter::new(out, lse);
    let q_blocks = problem.n_q.div_ceil(blocking.q_rows);
    let n_items = problem.batch * problem.kv_heads * q_blocks;
    let splits = blocking.kv_splits(problem, n_items);
    let item = |index: usize, split: usize| {
        let q_block = index % q_blocks;
        let kv_head = (index / q_blocks) % problem.kv_heads;
        let batch = index / (q_blocks * problem.kv_heads);
        let q_start = q_block * blocking.q_rows;
        let chunk = problem.n_kv.div_ceil(splits);
        Item {
            batch,
            kv_head,
            q_start,
            q_len: blocking.q_rows.min(problem.n_q - q_start),
            kv_start: (split * chunk).min(problem.n_kv),
            kv_end: ((split + 1) * chunk).min(problem.n_kv),
        }
    };
    let sink2 = |h: usize| {
        problem
            .sinks
            .map_or(f32::NEG_INFINITY, |s| s[h] * std::f32::consts::LOG2_E)
    };
    let count_tiles = |scratch: &mut Scratch| {
        if let Some(counter) = problem.tile_counter {
            counter.fetch_add(std::mem::take(&mut scratch.tiles), Ordering::Relaxed);
        }
    };
    let group = blocking.group;
    let d_vp = blocking.d_v_pad;
    let pool = ScratchPool::new(&blocking, k.strides()[3] != 1)?;

    if splits == 1 {
        (0..n_items).into_par_iter().for_each_init(
            || pool.take(),
            |loan, index| {
                let scratch = loan.get();
                let item = item(index, 0);
                dispatch(ItemKernel {
                    ops: &ops,
                    item: &item,
                    scratch,
                });
                count_tiles(scratch);
                for r in 0..item.rows(group) {
                    let (h, i) = item.row_origin(group, r);
                    let o = &scratch.o[r * d_vp..(r + 1) * d_vp];
                    // SAFETY: row (batch, i, h) belongs to this item alone: items partition
                    // (batch, kv head, query block) and `row_origin` maps rows to distinct
                    // (head, position) pairs inside the item's heads and query block.
                    unsafe {
                        writer.write_row(item.batch, i, h, o, scratch.m[r], scratch.l[r], sink2(h))
                    };
                }
            },
        );
        return Ok(());
    }

    // Split-KV: every (item, split) streams its key range into a slot of partial results
    // (o, m, l per row); then each item merges its slots in split order, so the result does not
    // depend on which thread ran what.
    let rows = blocking.rows();
    let slot = rows * (d_vp + 2);
    let mut partials = vec![0.0f32; n_items * splits * slot];
    partials.par_chunks_mut(slot).enumerate().for_each_init(
        || pool.take(),
        |loan, (unit, part)| {
            let scratch = loan.get();
            let item = item(unit / splits, unit % splits);
            dispatch(ItemKernel {
                ops: &ops,
                item: &item,
                scratch,
            });
            count_tiles(scratch);
            let n = item.rows(group);
            let (o, ml) = part.split_at_mut(rows * d_vp);
            o[..n * d_vp].copy_from_slice(&scratch.o[..n * d_vp]);
            ml[..n].copy_from_slice(&scratch.m[..n]);
            ml[rows..rows + n].copy_from_slice(&scratch.l[..n]);
        },
    );
    partials
        .par_chunks(splits * slot)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; d_vp],
            |o, (index, parts)| {
                let item = item(index, 0);
                for r in 0..item.rows(group) {
                    let m_part = |p: &[f32]| p[rows * d_vp + r];
                    let top = parts.chunks(slot).map(m_part).fold(-f32::MAX, f32::max);
                    o.fill(0.0);
                    let mut l = 0.0;
                    for p in parts.chunks(slot) {
                        let w = (m_part(p) - top).exp2();
                        l += p[rows * d_vp + rows + r] * w;
                        for (acc, &x) in o.iter_mut().zip(&p[r * d_vp..(r + 1) * d_vp]) {
                            *acc += x * w;
                        }
                    }
                    let (h, i) = item.row_origin(group, r);
                    // SAFETY: as in the unsplit path, rows of distinct items are distinct.
                    unsafe { writer.write_row(item.batch, i, h, o, top, l, sink2(h)) };
                }
            },
        );
    Ok(())
}
