//! A serving step's attention as one object ([`Plan`]): what every layer of a step shares —
//! the packed query rows, the key lengths, the block table or packed key offsets, the heads,
//! head sizes and options — validated and scheduled once by [`Plan::new`]; then
//! [`Plan::run`] per layer with that layer's Q, K/V pools, output and (for `i8` caches) scales,
//! checking only those, or [`Plan::run_pool`] with a layer's [`KvPool`], whose `i8` scales are
//! valid by construction and not checked again. FlashInfer's `plan()`/`run()`, ggml's `cplan`.
//!
//! A plan holds its own [`Workspace`] memory, so after the first layers of
//! each kind of step (decode-only, or with prefill rows) its runs allocate nothing. Results
//! are bitwise identical to [`attention_varlen`](crate::attention_varlen) with the same
//! operands.

use crate::element::{Element, KvElement};
use crate::error::{Dim, Error, Operand};
use crate::fused;
use crate::kv_cache::{PackedKv, PagedKv, RowMap, TensorKv, VarlenKv};
use crate::options::Options;
use crate::pool::KvPool;
use crate::problem::{bf16_inputs, check_sinks, expect, Problem};
use crate::tensor::{Tensor, TensorMut};
use crate::workspace::Workspace;

/// Where a step's keys and values are: the part of a [`Plan`] that the layers' K/V pools
/// are read through.
#[derive(Debug, Clone, Copy)]
pub enum StepKv<'s> {
    /// Paged pools `[num_pages, page_size, H_kv, d]` read through `block_table`
    /// (`pages_per_seq` entries per sequence), as [`PagedKv`].
    Paged {
        /// Sequence `b`'s pages: `block_table[b · pages_per_seq ..][..pages_per_seq]`.
        block_table: &'s [u32],
        /// Table entries per sequence.
        pages_per_seq: usize,
        /// Tokens per page (dim 1 of the pools).
        page_size: usize,
    },
    /// Packed rows `[1, total_kv, H_kv, d]`, sequence `b`'s keys in rows `cu_seqlens_k[b] ..
    /// cu_seqlens_k[b + 1]`, as [`PackedKv`].
    Packed {
        /// `B + 1` non-decreasing offsets.
        cu_seqlens_k: &'s [usize],
    },
}

impl StepKv<'_> {
    /// The slot of key `position` of sequence `seq` — where [`append`](crate::append) writes
    /// it in a pool of this layout: paged, `page · page_size + position % page_size` with
    /// `page` the table's entry `position / page_size` of the sequence; packed, the row
    /// `cu_seqlens_k[seq] + position` of `[1, total_kv, H_kv, d]`. `None` past the sequence's
    /// table row or packed keys (or the table's or offsets' end).
    pub fn slot(&self, seq: usize, position: usize) -> Option<usize> {
        match *self {
            StepKv::Paged {
                block_table,
                pages_per_seq,
                page_size,
            } => {
                let entry = position.checked_div(page_size)?;
                if entry >= pages_per_seq {
                    return None;
                }
                let at = seq.checked_mul(pages_per_seq)?.checked_add(entry)?;
                let page = *block_table.get(at)? as usize;
                page.checked_mul(page_size)?
                    .checked_add(position % page_size)
            }
            StepKv::Packed { cu_seqlens_k } => {
                let (start, end) = (*cu_seqlens_k.get(seq)?, *cu_seqlens_k.get(seq + 1)?);
                start.checked_add(position).filter(|&row| row < end)
            }
        }
    }
}

/// The heads and head sizes of a [`Plan`]: `heads` query heads, `kv_heads` K/V heads, `d_k`
/// the head size of Q and K, `d_v` of V and the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads `H` (a positive multiple of `kv_heads`).
    pub heads: usize,
    /// Key/value heads `H_kv`.
    pub kv_heads: usize,
    /// Head size of Q and K.
    pub d_k: usize,
    /// Head size of V and the output.
    pub d_v: usize,
}

/// What one layer brings to [`Plan::run`] besides its tensors: the scales of `i8` K/V pools
/// (as [`Options::kv_scales`]) and per-layer attention sinks (as [`Options::sinks`]; a
/// plan's own sinks, if its options have them, apply where a layer gives none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Layer<'l> {
    kv_scales: Option<(Tensor<'l, f32>, Tensor<'l, f32>)>,
    sinks: Option<&'l [f32]>,
}

impl<'l> Layer<'l> {
    /// Nothing layer-specific.
    pub fn new() -> Self {
        Self::default()
    }

    /// The scales of this layer's `i8` pools (see [`Options::kv_scales`]).
    pub fn kv_scales(mut self, k_scales: Tensor<'l, f32>, v_scales: Tensor<'l, f32>) -> Self {
        self.kv_scales = Some((k_scales, v_scales));
        self
    }

    /// This layer's sink logits, one per query head (see [`Options::sinks`]).
    pub fn sinks(mut self, sinks: &'l [f32]) -> Self {
        self.sinks = Some(sinks);
        self
    }
}

/// A layer's `i8` scales: to be checked where the lengths reach ([`Layer::kv_scales`]), or
/// known valid (a [`KvPool`]'s).
enum Scales<'l> {
    Check(Option<(Tensor<'l, f32>, Tensor<'l, f32>)>),
    Known(Option<(Tensor<'l, f32>, Tensor<'l, f32>)>),
}

/// One step's attention, validated and scheduled once, run per layer (module docs).
///
/// ```
/// use sdpa::{Alignment, Heads, Layer, Options, Plan, StepKv, Tensor, TensorMut};
/// // A step of two sequences: 3 new rows (chunked prefill) with 5 cached keys, and 1 decode
/// // row with 8; pages of 4 tokens, 2 query heads sharing 1 kv head, head size 8.
/// let cu_q = [0usize, 3, 4];
/// let cached = [5usize, 8];
/// let table = [0u32, 1, 2, 3, 4, 5];
/// let step = StepKv::Paged { block_table: &table, pages_per_seq: 3, page_size: 4 };
/// let heads = Heads { heads: 2, kv_heads: 1, d_k: 8, d_v: 8 };
/// let opts = Options::new().causal(Alignment::BottomRight).cache_seqlens(&cached);
/// let mut plan = Plan::new(&cu_q, step, heads, &opts)?;
/// let (q, pool) = (vec![0.5f32; 4 * 2 * 8], vec![0.25f32; 6 * 4 * 8]);
/// let mut out = vec![0.0f32; 4 * 2 * 8];
/// for _layer in 0..2 {
///     let q = Tensor::bshd(&q, [1, 4, 2, 8])?;
///     let k = Tensor::bshd(&pool, [6, 4, 1, 8])?;
///     let mut o = TensorMut::bshd(&mut out, [1, 4, 2, 8])?;
///     plan.run(&q, &k, &k, &mut o, None, &Layer::new())?;
/// }
/// assert!(out.iter().all(|&x| (x - 0.25).abs() < 1e-6));
/// # Ok::<(), sdpa::Error>(())
/// ```
pub struct Plan<'s> {
    /// The step's validated problem (f32 types, no scales: [`Plan::run`] sets both).
    problem: Problem<'s>,
    kv: StepKv<'s>,
    heads: Heads,
    total_q: usize,
    /// Packed K/V rows (0 for paged).
    total_kv: usize,
    /// Pages a layer's pools need: one past the largest entry the lengths reach.
    pages: usize,
    bf16_products: bool,
    tile_counter: Option<&'s std::sync::atomic::AtomicU64>,
    memory: Memory<'s>,
}

/// A plan's kernel memory: its own, or a caller's [`Workspace`] lent for the step.
enum Memory<'s> {
    Own(fused::Workspace),
    Lent(&'s mut fused::Workspace),
}

impl Memory<'_> {
    fn get_ref(&self) -> &fused::Workspace {
        match self {
            Memory::Own(ws) => ws,
            Memory::Lent(ws) => ws,
        }
    }

    fn get(&mut self) -> &mut fused::Workspace {
        match self {
            Memory::Own(ws) => ws,
            Memory::Lent(ws) => ws,
        }
    }
}

impl Drop for Plan<'_> {
    fn drop(&mut self) {
        // The workspace's schedule was this plan's: later calls compute their own.
        self.memory.get().set_planned(false);
    }
}

impl std::fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("sequences", &self.problem.batch)
            .field("total_q", &self.total_q)
            .field("kv", &self.kv)
            .field("heads", &self.heads)
            .finish()
    }
}

/// One element to view shapes through: a plan validates shapes, not values.
static NOTHING: [f32; 1] = [0.0];

/// A view of `dims` over [`NOTHING`] (every stride 0).
fn shape(dims: [usize; 4]) -> Tensor<'static, f32> {
    Tensor::new(&NOTHING, dims, [0; 4]).expect("stride-0 views need one element")
}

impl<'s> Plan<'s> {
    /// Validates a step: packed query rows `cu_seqlens_q` (sequence `b` has rows
    /// `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of every layer's `[1, total_q, H, d_k]` Q, with
    /// `total_q` the last offset), its K/V layout `kv`, the heads and head sizes, and the
    /// options (key lengths by [`Options::kv_lens`] or [`Options::cache_seqlens`], required
    /// for paged K/V; everything else as in [`attention_varlen`](crate::attention_varlen)).
    /// `i8` scales are per layer ([`Layer::kv_scales`]).
    ///
    /// # Errors
    /// The errors of [`attention_varlen`](crate::attention_varlen) for these operands (for a
    /// paged step: a page size of 0, a table whose length is not `B · pages_per_seq`;
    /// [`Error::InvalidValue`] with [`Operand::KeyScales`] when `opts` has `kv_scales`).
    pub fn new(
        cu_seqlens_q: &'s [usize],
        kv: StepKv<'s>,
        heads: Heads,
        opts: &Options<'s>,
    ) -> Result<Self, Error> {
        let memory = Memory::Own(fused::Workspace::default());
        Self::with_memory(memory, cu_seqlens_q, kv, heads, opts)
    }

    /// [`Plan::new`] with the memory of `ws` for the step, so that a serving loop that plans
    /// every step with one workspace allocates nothing once it has seen each kind of step
    /// (decode-only, with prefill rows).
    ///
    /// # Errors
    /// As [`Plan::new`].
    pub fn in_workspace(
        ws: &'s mut Workspace,
        cu_seqlens_q: &'s [usize],
        kv: StepKv<'s>,
        heads: Heads,
        opts: &Options<'s>,
    ) -> Result<Self, Error> {
        let memory = Memory::Lent(ws.kernel_memory());
        Self::with_memory(memory, cu_seqlens_q, kv, heads, opts)
    }

    fn with_memory(
        mut memory: Memory<'s>,
        cu_seqlens_q: &'s [usize],
        kv: StepKv<'s>,
        heads: Heads,
        opts: &Options<'s>,
    ) -> Result<Self, Error> {
        if opts.kv_scales.is_some() {
            return Err(Error::InvalidValue {
                operand: Operand::KeyScales,
                index: 0,
                reason: "a plan takes i8 scales per layer (Layer::kv_scales), not in its options",
            });
        }
        let Heads {
            heads: h,
            kv_heads,
            d_k,
            d_v,
        } = heads;
        let total_q = cu_seqlens_q.last().copied().unwrap_or(0);
        let q = shape([1, total_q, h, d_k]);
        let (problem, total_kv) = match kv {
            StepKv::Paged {
                block_table,
                pages_per_seq,
                page_size,
            } => {
                // Any u32 names a page of this pool: the pools' page counts are checked per
                // layer against the entries the lengths reach.
                let pages = u32::MAX as usize + 1;
                let paged = PagedKv::new(
                    shape([pages, page_size, kv_heads, d_k]),
                    shape([pages, page_size, kv_heads, d_v]),
                    block_table,
                    pages_per_seq,
                )?;
                let kv = VarlenKv::Paged(paged);
                let out = [1, total_q, h, d_v];
                let p = Problem::new_varlen(&q, cu_seqlens_q, &kv, out, None, opts)?;
                (p, 0)
            }
            StepKv::Packed { cu_seqlens_k } => {
                let total_kv = cu_seqlens_k.last().copied().unwrap_or(0);
                let packed = PackedKv::new(
                    shape([1, total_kv, kv_heads, d_k]),
                    shape([1, total_kv, kv_heads, d_v]),
                    cu_seqlens_k,
                );
                let kv = VarlenKv::Packed(packed);
                let out = [1, total_q, h, d_v];
                let p = Problem::new_varlen(&q, cu_seqlens_q, &kv, out, None, opts)?;
                (p, total_kv)
            }
        };
        let pages = match kv {
            StepKv::Paged {
                block_table,
                pages_per_seq,
                page_size,
            } => (0..problem.batch)
                .flat_map(|b| {
                    let used = problem.kv_len(b).div_ceil(page_size);
                    block_table[b * pages_per_seq..][..used].iter()
                })
                .map(|&page| page as usize + 1)
                .max()
                .unwrap_or(0),
            StepKv::Packed { .. } => 0,
        };
        Ok(Plan {
            problem,
            kv,
            heads,
            total_q,
            total_kv,
            pages,
            bf16_products: opts.bf16_products,
            tile_counter: opts.tile_counter,
            memory: {
                memory.get().set_planned(true);
                memory
            },
        })
    }

    /// Sequences in the step.
    pub fn sequences(&self) -> usize {
        self.problem.batch
    }

    /// Where this step's new rows go: for query row `r` of sequence `b` (packed row
    /// `cu_seqlens_q[b] + r`), the key position `kv_len(b) − n_q(b) + r` (the rows are the
    /// sequence's last keys, as with [`Options::cache_seqlens`]: position `cache_seqlens[b] +
    /// r`) into `positions`, for [`Rope`](crate::Rope), and its [`StepKv::slot`] into
    /// `slots`, for [`append`](crate::append) — FlashAttention-2's `flash_attn_with_kvcache(k=,
    /// v=)` addressing, through the block table.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] ([`Operand::Slots`], [`Operand::Positions`]) unless both have
    /// `total_q` entries; [`Error::InvalidValue`] ([`Operand::KvLens`], the sequence) for a
    /// sequence with fewer keys than new rows (its `kv_lens` do not include them), or a
    /// position beyond `u32::MAX`. Nothing is written on error.
    pub fn new_rows(&self, slots: &mut [usize], positions: &mut [u32]) -> Result<(), Error> {
        for (operand, got) in [
            (Operand::Slots, slots.len()),
            (Operand::Positions, positions.len()),
        ] {
            if got != self.total_q {
                return Err(Error::LengthMismatch {
                    operand,
                    expected: self.total_q,
                    got,
                });
            }
        }
        let p = &self.problem;
        let first = |b: usize| p.kv_len(b).checked_sub(p.q_len(b));
        if let Some(b) = (0..p.batch).find(|&b| {
            first(b).is_none_or(|f| f.saturating_add(p.q_len(b)) > u32::MAX as usize + 1)
        }) {
            return Err(Error::InvalidValue {
                operand: Operand::KvLens,
                index: b,
                reason: match first(b) {
                    None => {
                        "fewer keys than new rows: the key lengths must include this step's rows"
                    }
                    Some(_) => "a position beyond u32::MAX",
                },
            });
        }
        let mut row = 0;
        for b in 0..p.batch {
            let first = first(b).expect("checked above");
            for position in first..first + p.q_len(b) {
                // In range: `kv_len(b)` keys fit the sequence's table row or packed keys.
                slots[row] = self.kv.slot(b, position).expect("validated lengths");
                positions[row] = position as u32;
                row += 1;
            }
        }
        Ok(())
    }

    /// Bytes of kernel memory the plan holds (as [`Workspace::bytes`](crate::Workspace::bytes)).
    pub fn bytes(&self) -> usize {
        self.memory.get_ref().bytes()
    }

    /// Attention of one layer: Q `[1, total_q, H, d_k]` and `out` `[1, total_q, H, d_v]` (any
    /// strides), `lse` `[H, total_q]` if given, K/V the layer's pools (paged: `[num_pages,
    /// page_size, H_kv, d]`, at least the pages the step's table reaches; packed: `[1,
    /// total_kv, H_kv, d]` with `total_kv` the last of `cu_seqlens_k`), any element types. Only these are checked; the result is
    /// [`attention_varlen`](crate::attention_varlen)'s, bit for bit.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for a tensor whose dims differ from the plan's (a pool with
    /// fewer pages than the table reaches: dim 0 of K); [`Error::LengthMismatch`] for `lse`
    /// or the layer's sinks; the scale errors of [`Options::kv_scales`] (scales required for
    /// `i8` K/V and refused for others, checked where the lengths reach);
    /// [`Error::ScratchTooLarge`] as the calls.
    pub fn run<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
        layer: &Layer<'_>,
    ) -> Result<(), Error> {
        self.run_layer(
            q,
            (k, v),
            out,
            lse,
            layer.sinks,
            Scales::Check(layer.kv_scales),
        )
    }

    /// [`Plan::run`] on a layer's [`KvPool`] (a paged step's pools): the same result, bit for
    /// bit, as [`Plan::run`] on its views with its scales, but the `i8` scales, valid by
    /// construction, are not read to be checked (at 64 × 64–512 keys per layer that check was
    /// 0.95 of a call's own overhead). `layer` brings sinks only: a pool's scales are its own.
    ///
    /// # Errors
    /// As [`Plan::run`]; [`Error::InvalidValue`] with [`Operand::KeyScales`] for a `layer`
    /// with `kv_scales`.
    pub fn run_pool<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        pool: &KvPool<KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
        layer: &Layer<'_>,
    ) -> Result<(), Error> {
        if layer.kv_scales.is_some() {
            return Err(Error::InvalidValue {
                operand: Operand::KeyScales,
                index: 0,
                reason: "a KvPool brings its own scales: run_pool takes none from the Layer",
            });
        }
        let (k, v, [k_scales, v_scales]) = pool.views()?;
        let scales = Scales::Known(KV::QUANTIZED.then_some((k_scales, v_scales)));
        self.run_layer(q, (&k, &v), out, lse, layer.sinks, scales)
    }

    /// The body of [`Plan::run`] and [`Plan::run_pool`].
    fn run_layer<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        (k, v): (&Tensor<'_, KV>, &Tensor<'_, KV>),
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
        sinks: Option<&[f32]>,
        scales: Scales<'_>,
    ) -> Result<(), Error> {
        let Heads {
            heads,
            kv_heads,
            d_k,
            d_v,
        } = self.heads;
        let total_q = self.total_q;
        expect(Operand::Query, q.dims(), [1, total_q, heads, d_k])?;
        expect(Operand::Output, out.dims(), [1, total_q, heads, d_v])?;
        if let Some(lse) = &lse {
            let expected = heads.saturating_mul(total_q);
            if lse.len() != expected {
                return Err(Error::LengthMismatch {
                    operand: Operand::Lse,
                    expected,
                    got: lse.len(),
                });
            }
        }
        let map = match self.kv {
            StepKv::Paged {
                block_table,
                pages_per_seq,
                page_size,
            } => {
                // At least the pages the table reaches (dim 0 of K may be larger, V's the same).
                let pages = k.dims()[0];
                expect(Operand::Key, k.dims(), [pages, page_size, kv_heads, d_k])?;
                if pages < self.pages {
                    return Err(Error::ShapeMismatch {
                        operand: Operand::Key,
                        dim: Dim::Batch,
                        expected: self.pages,
                        got: pages,
                    });
                }
                expect(Operand::Value, v.dims(), [pages, page_size, kv_heads, d_v])?;
                RowMap::Paged {
                    table: block_table,
                    pages_per_seq,
                    page_size,
                }
            }
            StepKv::Packed { cu_seqlens_k } => {
                let total = self.total_kv;
                expect(Operand::Key, k.dims(), [1, total, kv_heads, d_k])?;
                expect(Operand::Value, v.dims(), [1, total, kv_heads, d_v])?;
                RowMap::Packed(cu_seqlens_k)
            }
        };
        let mut problem = self.problem.clone();
        if let Some(sinks) = sinks {
            check_sinks(sinks, heads)?;
            problem.sinks = Some(sinks);
        }
        problem.bf16_products = self.bf16_products && bf16_inputs::<Q, KV>();
        let kv = TensorKv { k: *k, v: *v, map };
        problem.kv_scales = match scales {
            Scales::Check(s) => problem.layer_scales(&kv, s)?,
            Scales::Known(s) => Problem::known_scales(&kv, s)?,
        };
        fused::run(
            self.memory.get(),
            &problem,
            q,
            kv,
            out,
            lse,
            self.tile_counter,
        )
    }
}
