//! The fused kernel: work items scheduled on the caller's rayon pool, each streaming its query
//! rows against the key blocks with the online softmax ([`item`]), then combining and writing
//! normalized output rows and log-sum-exps ([`rows`]).
//!
//! * [`blocking`]: the cache model (every block size, the split-KV rule);
//! * [`kv`]: where key and value rows come from (the one abstraction storage formats plug into);
//! * [`item`]: one work item as named stages;
//! * [`rows`]: the split-KV combine and the row writer;
//! * [`scratch`]: per-worker buffers and the pool that lends them.
//!
//! Extra memory is one [`scratch::Scratch`] per thread that runs at once (a few hundred KiB
//! that depends on the head sizes and the GQA group, never on the sequence lengths), plus the
//! split-KV partial results of at most 32 work units.

mod blocking;
mod item;
mod kv;
mod quant;
mod rows;
mod scratch;

use crate::element::{Element, KvElement};
use crate::error::Error;
use crate::kv_cache::{AnyKv, RowMap, TensorKv};
use crate::problem::Problem;
use crate::simd::{dispatch, geometry, Kernel, Simd};
use crate::tensor::{AnyTensor, AnyTensorMut, Tensor, TensorMut};
use blocking::{split_range, Blocking, MAX_SPLITS};
use item::{stream_item, Ctx, Item};
use kv::KvSource;
use quant::QuantKv;
use rayon::prelude::*;
use rows::{finish_item, Part, RowWriter};
use scratch::{Scratch, ScratchPool};
use std::sync::atomic::{AtomicU64, Ordering};

/// One work item run on the dispatched backend.
struct ItemKernel<'a, 'c, KV> {
    cx: &'a Ctx<'c, KV>,
    q: &'a AnyTensor<'c>,
    item: &'a Item,
    scratch: &'a mut Scratch,
}

impl<KV: KvSource> Kernel for ItemKernel<'_, '_, KV> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        stream_item(s, self.cx, self.q, self.item, self.scratch)
    }
}

/// The work of one call: (batch, kv head group, query block) items, each split into `splits`
/// key ranges. Dense batches have `q_blocks` blocks per sequence; a packed batch has each
/// sequence's own (`first`), so that its items follow its rows: sequences without query rows
/// cost nothing, and a short one beside a long one costs its own blocks, not the long one's.
struct Schedule<'p> {
    problem: &'p Problem<'p>,
    q_blocks: usize,
    /// Packed batches: `first[b]` = the query blocks of the sequences before `b` (`B + 1`
    /// entries, the last the total); empty for dense batches.
    first: &'p [usize],
    splits: usize,
    q_rows: usize,
    /// Key/value heads per item ([`Blocking::heads`]).
    heads: usize,
}

/// Fills `first` with the packed batch's cumulative query blocks (see [`Schedule::first`]),
/// or empties it for a dense batch.
fn block_offsets(problem: &Problem<'_>, q_rows: usize, first: &mut Vec<usize>) {
    first.clear();
    if problem.seqs.q.is_none() {
        return;
    }
    // (At most one entry per packed query row plus one: the offsets were validated.)
    first.reserve(problem.batch + 1);
    let mut total = 0;
    first.push(0);
    for b in 0..problem.batch {
        total += problem.q_len(b).div_ceil(q_rows);
        first.push(total);
    }
}

impl<'p> Schedule<'p> {
    /// Plans `problem` with `blocking` (`first`: [`block_offsets`]' result): the split count
    /// is shape-only (it depends on the lengths and options, never on the threads), so results
    /// are bitwise identical for any pool.
    fn new(problem: &'p Problem<'p>, blocking: &Blocking, first: &'p [usize]) -> Self {
        let q_blocks = problem.n_q.div_ceil(blocking.q_rows);
        let mut sched = Schedule {
            problem,
            q_blocks,
            first,
            splits: 1,
            q_rows: blocking.q_rows,
            heads: blocking.heads,
        };
        let items = sched.items();
        if blocking.kv_splits(problem.n_kv, items) > 1 {
            // Few items (decode): split by the keys the rows can actually see — a 32k-token
            // buffer holding 4k keys, or a 4k window over it, is split into ranges of its
            // live keys, not of the buffer.
            let live = (0..items)
                .map(|index| {
                    let (lo, hi) = sched.live_keys(index);
                    hi - lo
                })
                .max()
                .unwrap_or(0);
            sched.splits = blocking.kv_splits(live, items);
        }
        sched
    }

    /// Groups of kv heads per batch entry.
    fn head_groups(&self) -> usize {
        self.problem.kv_heads.div_ceil(self.heads)
    }

    /// Work items. Cannot overflow: the output view (or, with d_v = 0, the LSE slice) holds
    /// one element per (batch, head, query row), at least as many.
    fn items(&self) -> usize {
        match self.first.last() {
            Some(&blocks) => blocks * self.head_groups(),
            None => self.problem.batch * self.head_groups() * self.q_blocks,
        }
    }

    /// (batch, first kv head, first query row, query rows) of item `index`: batch-major, then
    /// kv head group, then query block.
    fn coords(&self, index: usize) -> (usize, usize, usize, usize) {
        let p = self.problem;
        let groups = self.head_groups();
        let (batch, q_block, group) = if self.first.is_empty() {
            let q_block = index % self.q_blocks;
            let group = (index / self.q_blocks) % groups;
            (index / (self.q_blocks * groups), q_block, group)
        } else {
            // The last sequence whose items start at or before `index` (sequences without
            // rows start where the next one does, and are passed over).
            let batch = self.first.partition_point(|&f| f * groups <= index) - 1;
            let (start, blocks) = (self.first[batch], self.first[batch + 1] - self.first[batch]);
            let r = index - start * groups;
            (batch, r % blocks, r / blocks)
        };
        let q_start = q_block * self.q_rows;
        // The rows of the query block that exist (a sequence's last block may be short).
        let q_len = self.q_rows.min(p.q_len(batch).saturating_sub(q_start));
        (batch, group * self.heads, q_start, q_len)
    }

    /// The keys some row of item `index` can see (causal, window, key length): `[lo, hi)`,
    /// empty as `(0, 0)`.
    fn live_keys(&self, index: usize) -> (usize, usize) {
        let (batch, _, q_start, q_len) = self.coords(index);
        let mut union = (usize::MAX, 0);
        for i in q_start..q_start + q_len {
            let (lo, hi) = self.problem.visible_keys(batch, i);
            if lo < hi {
                union = (union.0.min(lo), union.1.max(hi));
            }
        }
        if union.0 < union.1 {
            union
        } else {
            (0, 0)
        }
    }

    /// Work unit `split` of item `index`: its share of the item's live keys.
    fn item(&self, index: usize, split: usize) -> Item {
        let (batch, kv_head, q_start, q_len) = self.coords(index);
        let (kv_start, kv_end) = if self.splits == 1 {
            (0, self.problem.n_kv)
        } else {
            let (lo, hi) = self.live_keys(index);
            let (a, b) = split_range(split, self.splits, hi - lo);
            (lo + a, lo + b)
        };
        Item {
            batch,
            kv_head,
            heads: self.heads.min(self.problem.kv_heads - kv_head),
            q_start,
            q_len,
            kv_start,
            kv_end,
        }
    }
}

/// Per-worker buffers needed by a call of this shape, in bytes (what
/// [`crate::scratch_bytes_per_thread`] reports).
pub(crate) fn scratch_bytes<KV: KvElement>(
    problem: &Problem<'_>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
) -> Result<usize, Error> {
    let blocking = Blocking::for_problem(problem, geometry(), std::mem::size_of::<KV>())?;
    let kv = TensorKv {
        k: *k,
        v: *v,
        map: RowMap::Dense,
    };
    let packs_keys = match kv.erase() {
        AnyKv::F32(kv) => kv.packs_keys(),
        AnyKv::F16(kv) => kv.packs_keys(),
        AnyKv::Bf16(kv) => kv.packs_keys(),
        AnyKv::I8(_) => true,
    };
    Ok(Scratch::bytes(&blocking, packs_keys))
}

/// Memory kept between calls: the per-worker scratches and the split-KV partial results.
/// A call takes what fits its sizes and gives everything back, so steady-state calls of one
/// shape allocate nothing in the kernel.
#[derive(Default)]
pub(crate) struct Workspace {
    scratches: Vec<Scratch>,
    partials: Vec<f32>,
    /// A packed batch's query block offsets ([`block_offsets`]), for `first_rows` query rows
    /// per block.
    first: Vec<usize>,
    first_rows: usize,
    /// Whether every call has the same sequences (a [`crate::Plan`]'s), so that `first` is
    /// computed once.
    planned: bool,
}

impl Workspace {
    /// Marks the calls from now on as a [`crate::Plan`]'s (`true`: they all have its
    /// sequences, so the schedule's block offsets are computed by the first and kept), or as
    /// anyone's.
    pub fn set_planned(&mut self, planned: bool) {
        self.planned = planned;
        self.first_rows = 0;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let scratch = self
            .scratches
            .iter()
            .map(|s| Scratch::bytes(&s.fits().0, s.fits().1))
            .sum::<usize>();
        scratch + self.partials.capacity() * 4
    }
}

/// Computes attention for a validated problem with the fused kernel, K and V read from `kv`
/// (dense, packed or paged tensors), with the memory of `ws`. The element types are named
/// here ([`AnyTensor`], [`AnyKv`]), so that the kernel below is compiled once, in this crate,
/// not again in each crate (and test binary) that calls the generic API, and only once per
/// K/V source: Q's type reaches the kernel only where queries are packed, the output's only
/// where rows are written.
pub(crate) fn run<Q: Element, KV: KvElement, O: Element>(
    ws: &mut Workspace,
    problem: &Problem<'_>,
    q: &Tensor<'_, Q>,
    kv: TensorKv<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: Option<&mut [f32]>,
    tile_counter: Option<&AtomicU64>,
) -> Result<(), Error> {
    let call = Call {
        problem,
        q: q.erase(),
        out: out.erase(),
        lse,
        tile_counter,
    };
    run_erased(ws, call, kv.erase())
}

/// The operands of one call besides K/V.
struct Call<'c, 'o> {
    problem: &'c Problem<'c>,
    q: AnyTensor<'c>,
    out: AnyTensorMut<'o>,
    lse: Option<&'o mut [f32]>,
    tile_counter: Option<&'c AtomicU64>,
}

/// [`run`] with the element types named: one driver per K/V source.
#[inline(never)]
fn run_erased(ws: &mut Workspace, call: Call<'_, '_>, kv: AnyKv<'_>) -> Result<(), Error> {
    match kv {
        AnyKv::F32(kv) => run_source(ws, call, kv),
        AnyKv::F16(kv) => run_source(ws, call, kv),
        AnyKv::Bf16(kv) => run_source(ws, call, kv),
        AnyKv::I8(kv) => {
            // Present for i8 K/V: the problem's validation requires them.
            let Some(scales) = call.problem.kv_scales else {
                return Err(Error::KvScales { kv_type: "i8" });
            };
            run_source(ws, call, QuantKv::new(kv, scales))
        }
    }
}

/// The driver's part that depends on the K/V source: runs each work unit through
/// [`stream_item`] on the dispatched backend; [`drive`] does the rest.
fn run_source<KV: KvSource>(ws: &mut Workspace, call: Call<'_, '_>, kv: KV) -> Result<(), Error> {
    let problem = call.problem;
    if problem.batch == 0 || problem.n_q == 0 || (problem.d_v == 0 && call.lse.is_none()) {
        return Ok(());
    }
    let blocking = Blocking::for_problem(problem, geometry(), KV::ELEMENT_BYTES)?;
    let packs_keys = kv.packs_keys();
    let cx = Ctx {
        problem,
        blocking,
        kv,
    };
    let q = call.q;
    let compute = |item: &Item, scratch: &mut Scratch| {
        dispatch(ItemKernel {
            cx: &cx,
            q: &q,
            item,
            scratch,
        })
    };
    drive(ws, call, &blocking, packs_keys, &compute)
}

/// The driver: schedules the work units on the current rayon pool, runs each through
/// `compute`, combines and writes the rows. Not generic (`compute` is called once per work
/// unit), so the scheduling and rayon's machinery are compiled once.
fn drive(
    ws: &mut Workspace,
    call: Call<'_, '_>,
    blocking: &Blocking,
    packs_keys: bool,
    compute: &(dyn Fn(&Item, &mut Scratch) + Sync),
) -> Result<(), Error> {
    let Call {
        problem,
        out,
        lse,
        tile_counter,
        ..
    } = call;
    let mut first = std::mem::take(&mut ws.first);
    let known = ws.planned && ws.first_rows == blocking.q_rows && first.len() == problem.batch + 1;
    if !known {
        block_offsets(problem, blocking.q_rows, &mut first);
        ws.first_rows = blocking.q_rows;
    }
    let sched = Schedule::new(problem, blocking, &first);
    let result = run_schedule(
        ws,
        &sched,
        blocking,
        packs_keys,
        (out, lse, tile_counter),
        compute,
    );
    ws.first = first;
    result
}

/// The output and counter of [`drive`]'s call.
type Outputs<'c, 'o> = (
    AnyTensorMut<'o>,
    Option<&'o mut [f32]>,
    Option<&'c AtomicU64>,
);

/// [`drive`] once the schedule is made.
fn run_schedule(
    ws: &mut Workspace,
    sched: &Schedule<'_>,
    blocking: &Blocking,
    packs_keys: bool,
    (out, lse, tile_counter): Outputs<'_, '_>,
    compute: &(dyn Fn(&Item, &mut Scratch) + Sync),
) -> Result<(), Error> {
    let problem = sched.problem;
    let (items, splits) = (sched.items(), sched.splits);
    let units = items * splits;
    let pool = ScratchPool::new(
        blocking,
        packs_keys,
        rayon::current_num_threads().min(units),
        std::mem::take(&mut ws.scratches),
    )?;
    let writer = RowWriter::new(out, lse);
    let d_vp = blocking.d_v_pad;

    // Stream one work unit into the scratch's tile buffers.
    let compute = |unit: usize, scratch: &mut Scratch| -> Item {
        let item = sched.item(unit / splits, unit % splits);
        compute(&item, scratch);
        if let Some(counter) = tile_counter {
            counter.fetch_add(std::mem::take(&mut scratch.tiles), Ordering::Relaxed);
        }
        item
    };

    if splits == 1 {
        // Each item is its own single part, finished straight from the scratch.
        // One job per item: rayon splits a range adaptively, so a chunk it never splits again
        // runs on one thread; with uneven items (a packed batch of long prefill chunks and
        // decode rows, or sequences past their ends) that left one thread idle for 20% of a
        // call. Items are large enough (a block of rows × their keys) for a job each.
        (0..items).into_par_iter().with_max_len(1).for_each_init(
            || pool.take(),
            |loan, index| {
                let scratch = loan.get();
                let item = compute(index, scratch);
                let Scratch { tile, kv, .. } = scratch;
                let part = Part {
                    o: &tile.o,
                    m: &tile.m,
                    l: &tile.l,
                };
                finish_item(&writer, problem, &item, d_vp, &[part], &mut kv.v_row);
            },
        );
    } else {
        split_kv(
            sched,
            blocking,
            &pool,
            &mut ws.partials,
            &compute,
            &|item, parts, acc| finish_item(&writer, problem, item, d_vp, parts, acc),
        )?;
    }
    ws.scratches = pool.into_scratches();
    Ok(())
}

/// Combines an item's parts (in key order) and writes its rows, with a row of scratch.
type FinishItem<'a> = dyn Fn(&Item, &[Part<'_>], &mut [f32]) + Sync + 'a;

/// Split-KV: every unit streams its key range into a slot of partial results (o, m, l per
/// row) in `partials`; then each item combines its slots in key order (`finish`), so the
/// result does not depend on which thread ran what.
fn split_kv(
    sched: &Schedule<'_>,
    blocking: &Blocking,
    pool: &ScratchPool,
    partials: &mut Vec<f32>,
    compute: &(dyn Fn(usize, &mut Scratch) -> Item + Sync),
    finish: &FinishItem<'_>,
) -> Result<(), Error> {
    let (items, splits) = (sched.items(), sched.splits);
    debug_assert!(splits <= MAX_SPLITS);
    let (group, d_vp) = (blocking.group, blocking.d_v_pad);
    let rows = blocking.rows();
    let slot = rows * (d_vp + 2);
    let units = items * splits;
    let too_large = Error::ScratchTooLarge {
        bytes: units.saturating_mul(slot).saturating_mul(4),
    };
    let len = units.checked_mul(slot).ok_or(too_large.clone())?;
    partials.clear();
    partials.try_reserve_exact(len).map_err(|_| too_large)?;
    partials.resize(len, 0.0f32);
    partials
        .par_chunks_mut(slot)
        .enumerate()
        .with_max_len(1)
        .for_each_init(
            || pool.take(),
            |loan, (unit, part)| {
                let scratch = loan.get();
                let item = compute(unit, scratch);
                let n = item.rows(group);
                let tile = &scratch.tile;
                let (o, ml) = part.split_at_mut(rows * d_vp);
                o[..n * d_vp].copy_from_slice(&tile.o[..n * d_vp]);
                ml[..n].copy_from_slice(&tile.m[..n]);
                ml[rows..rows + n].copy_from_slice(&tile.l[..n]);
            },
        );
    partials
        .par_chunks(splits * slot)
        .enumerate()
        .for_each_init(
            || pool.take(),
            |loan, (index, slots)| {
                let item = sched.item(index, 0);
                let empty = Part {
                    o: &[],
                    m: &[],
                    l: &[],
                };
                let mut parts = [empty; MAX_SPLITS];
                for (part, p) in parts.iter_mut().zip(slots.chunks(slot)) {
                    let (o, ml) = p.split_at(rows * d_vp);
                    *part = Part {
                        o,
                        m: &ml[..rows],
                        l: &ml[rows..],
                    };
                }
                finish(&item, &parts[..splits], &mut loan.get().kv.v_row);
            },
        );
    Ok(())
}
