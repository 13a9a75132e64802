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

/// Fills `first` with the packed batch's cumulative query blocks (see [`Schedule::first`]) of
/// the sequences with `rows.0 ..= rows.1` query rows (the others get none), or empties it for
/// a dense batch.
fn block_offsets(
    problem: &Problem<'_>,
    q_rows: usize,
    rows: (usize, usize),
    first: &mut Vec<usize>,
) {
    first.clear();
    if problem.seqs.q.is_none() {
        return;
    }
    // (At most one entry per packed query row plus one: the offsets were validated.)
    first.reserve(problem.batch + 1);
    let mut total = 0;
    first.push(0);
    for b in 0..problem.batch {
        let n = problem.q_len(b);
        if (rows.0..=rows.1).contains(&n) {
            total += n.div_ceil(q_rows);
        }
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
    /// A packed batch's query block offsets of each pass ([`block_offsets`]), for the
    /// (query rows per block, sequence rows from, to) of `first_key`.
    first: [Vec<usize>; 2],
    first_key: [(usize, usize, usize); 2],
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
        self.first_key = [(0, 0, 0); 2];
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
/// [`stream_item`] on the dispatched backend, in one pass or two ([`decode_rows`]); [`run_schedule`]
/// does the rest.
fn run_source<KV: KvSource>(ws: &mut Workspace, call: Call<'_, '_>, kv: KV) -> Result<(), Error> {
    let Call {
        problem,
        q,
        out,
        lse,
        tile_counter,
    } = call;
    if problem.batch == 0 || problem.n_q == 0 || (problem.d_v == 0 && lse.is_none()) {
        return Ok(());
    }
    let blocking = Blocking::for_problem(problem, geometry(), KV::ELEMENT_BYTES)?;
    let short = decode_rows(problem, &blocking);
    let short_problem = short.map(|n_q| Problem {
        n_q,
        ..problem.clone()
    });
    let short_blocking = match &short_problem {
        Some(p) => Some(Blocking::for_problem(p, geometry(), KV::ELEMENT_BYTES)?),
        None => None,
    };
    // (problem, blocking, the query rows of its sequences): the decode rows first.
    let mut passes = [None, None];
    if let (Some(p), Some(b), Some(n)) = (&short_problem, short_blocking, short) {
        passes[0] = Some((p, b, (1, n)));
        passes[1] = Some((problem, blocking, (n + 1, usize::MAX)));
    } else {
        passes[0] = Some((problem, blocking, (0, usize::MAX)));
    }
    let packs_keys = kv.packs_keys();
    // Every pass's schedule and memory before any row is written: running out of memory is
    // an error with nothing written.
    let mut firsts = std::mem::take(&mut ws.first);
    let mut scheds: [Option<Schedule<'_>>; 2] = [None, None];
    let mut sizes = [None, None];
    let threads = rayon::current_num_threads();
    for (i, pass) in passes.iter().enumerate() {
        let Some((p, b, rows)) = pass else { continue };
        let key = (b.q_rows, rows.0, rows.1);
        let first = &mut firsts[i];
        let known = ws.planned && ws.first_key[i] == key && first.len() == p.batch + 1;
        if !known {
            block_offsets(p, b.q_rows, *rows, first);
            ws.first_key[i] = key;
        }
    }
    let result = (|| {
        for (i, pass) in passes.iter().enumerate() {
            let Some((p, b, _)) = pass else { continue };
            let sched = Schedule::new(p, b, &firsts[i]);
            let units = sched.items() * sched.splits;
            sizes[i] = Some(((*b, packs_keys), threads.min(units)));
            if sched.splits > 1 {
                reserve_partials(&mut ws.partials, &sched, b)?;
            }
            scheds[i] = Some(sched);
        }
        let pool = ScratchPool::new(&sizes, std::mem::take(&mut ws.scratches))?;
        let writer = RowWriter::new(out, lse);
        let mut kv = Some(kv);
        for (pass, sched) in passes.iter().zip(&scheds) {
            let (Some((p, b, _)), Some(sched)) = (pass, sched) else {
                continue;
            };
            let cx = Ctx {
                problem: p,
                blocking: *b,
                kv: kv.take().expect("one source, moved from pass to pass"),
            };
            let compute = |item: &Item, scratch: &mut Scratch| {
                dispatch(ItemKernel {
                    cx: &cx,
                    q: &q,
                    item,
                    scratch,
                })
            };
            let outputs = (&writer, tile_counter);
            run_schedule(
                &mut ws.partials,
                sched,
                b,
                (&pool, packs_keys),
                outputs,
                &compute,
            )?;
            kv = Some(cx.kv);
        }
        ws.scratches = pool.into_scratches();
        Ok(())
    })();
    ws.first = firsts;
    result
}

/// A packed batch whose longest sequence has the rows of prefill, but where some sequences
/// have few enough query rows to run by channels (decode rows; a call of their own would),
/// runs in two passes: those sequences with the blocking of their own longest row count, the
/// others with the call's. Returns that row count, or `None` for one pass. (In one pass, a
/// decode row beside a prefill chunk took the transposed tile of 16 or 32 rows for its one
/// row: a continuous-batching step of 16 chunks and 48 decode rows ran 0.72–0.76× as fast as
/// one call per sequence, Zen 3, 2026-12-07.)
fn decode_rows(problem: &Problem<'_>, blocking: &Blocking) -> Option<usize> {
    if problem.seqs.q.is_none() || blocking.by_channels() {
        return None;
    }
    let most = blocking.geometry.lanes / 2 / problem.group();
    (0..problem.batch)
        .map(|b| problem.q_len(b))
        .filter(|&n| n <= most)
        .max()
        .filter(|&n| n > 0)
}

/// Reserves the split-KV partial results of `sched` in `partials` (kept between calls).
fn reserve_partials(
    partials: &mut Vec<f32>,
    sched: &Schedule<'_>,
    blocking: &Blocking,
) -> Result<(), Error> {
    let slot = blocking.rows() * (blocking.d_v_pad + 2);
    let units = sched.items() * sched.splits;
    let too_large = Error::ScratchTooLarge {
        bytes: units.saturating_mul(slot).saturating_mul(4),
    };
    let len = units.checked_mul(slot).ok_or(too_large.clone())?;
    partials
        .try_reserve_exact(len.saturating_sub(partials.len()))
        .map_err(|_| too_large)
}

/// The row writer and tile counter of [`run_source`]'s call.
type Outputs<'w, 'c> = (&'w RowWriter, Option<&'c AtomicU64>);

/// One pass's work units on the current rayon pool, each through `compute`, with the
/// scratches of `pool` (`packs_keys`: the scratches' kind); then the rows combined and
/// written. Not generic (`compute` is called once per work unit), so the scheduling and
/// rayon's machinery are compiled once.
fn run_schedule(
    partials: &mut Vec<f32>,
    sched: &Schedule<'_>,
    blocking: &Blocking,
    (pool, packs_keys): (&ScratchPool, bool),
    (writer, tile_counter): Outputs<'_, '_>,
    compute: &(dyn Fn(&Item, &mut Scratch) + Sync),
) -> Result<(), Error> {
    let problem = sched.problem;
    let fits = (*blocking, packs_keys);
    let (items, splits) = (sched.items(), sched.splits);
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
            || pool.take(&fits),
            |loan, index| {
                let scratch = loan.get();
                let item = compute(index, scratch);
                let Scratch { tile, kv, .. } = scratch;
                let part = Part {
                    o: &tile.o,
                    m: &tile.m,
                    l: &tile.l,
                };
                finish_item(writer, problem, &item, d_vp, &[part], &mut kv.v_row);
            },
        );
    } else {
        split_kv(
            sched,
            blocking,
            (pool, &fits),
            partials,
            &compute,
            &|item, parts, acc| finish_item(writer, problem, item, d_vp, parts, acc),
        )?;
    }
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
    (pool, fits): (&ScratchPool, &(Blocking, bool)),
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
            || pool.take(fits),
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
            || pool.take(fits),
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
