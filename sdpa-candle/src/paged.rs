//! A paged K/V cache shared by many sequences ([`PagedKvCache`]): vLLM's page pools and block
//! tables behind a candle interface, on sdpa's serving APIs ([`sdpa::append`], [`sdpa::Plan`]).
//!
//! The cache owns, per layer, a K pool `[pages, page_size, H_kv, d_k]` and a V pool `[pages,
//! page_size, H_kv, d_v]` of one [`KvType`] (`i8` with a scale per (token, kv head) beside
//! them), one free list of pages, and each sequence's pages (its block table row). A model
//! step is a [`PagedStep`], begun with the step's sequences and new-token counts:
//! [`PagedKvCache::begin_step`] takes the pages the new tokens need and plans the step's
//! attention once; then per layer [`PagedStep::append`] writes the layer's new K/V rows into
//! their slots (K rotated by the step's [`Rope`], if any) and [`PagedStep::attention`] runs the
//! layer's queries over the cache. The step is committed when every layer was appended: the
//! sequences then hold the new tokens.

use std::collections::HashMap;
use std::fmt;

use candle_core::{bail, Device, Result, Tensor};
use sdpa::half::{bf16, f16};
use sdpa::{Heads, Plan, Rope, StepKv, TensorMut, Workspace};

use crate::Attention;

pub use step::PagedStep;

/// The element type of a cache's K/V pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvType {
    /// `f32`.
    F32,
    /// `f16`.
    F16,
    /// `bf16`.
    BF16,
    /// `i8` with an `f32` scale per (token, kv head): `max |x| / 127` of the row, computed by
    /// [`sdpa::append`] when the row is written.
    I8,
}

/// The shape and element type of a [`PagedKvCache`]: every count positive, `heads` a multiple
/// of `kv_heads`, at most 2³² pages (block table entries are `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKvConfig {
    /// Layers, each with its own pools.
    pub layers: usize,
    /// Pages in each pool.
    pub pages: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Query heads `H` (the step's attention is planned for them).
    pub heads: usize,
    /// Key/value heads `H_kv`.
    pub kv_heads: usize,
    /// Head size of Q and K.
    pub d_k: usize,
    /// Head size of V and the output.
    pub d_v: usize,
    /// The pools' element type.
    pub kv_type: KvType,
}

impl PagedKvConfig {
    /// Dims of a pool of head size `d`.
    fn pool(&self, d: usize) -> [usize; 4] {
        [self.pages, self.page_size, self.kv_heads, d]
    }
}

/// A sequence of a [`PagedKvCache`], as [`PagedKvCache::add_sequence`] returned it. Ids are
/// never reused: a freed sequence's id stays unknown to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}

/// One layer's pools.
struct Kv<T> {
    k: Vec<T>,
    v: Vec<T>,
    /// `i8`'s scale pools `[pages, page_size, H_kv, 1]`.
    scales: Option<(Vec<f32>, Vec<f32>)>,
}

/// One layer's pools, by element type.
enum Pools {
    F32(Kv<f32>),
    F16(Kv<f16>),
    BF16(Kv<bf16>),
    I8(Kv<i8>),
}

/// Runs `$body` with `$kv` bound to the typed pools.
macro_rules! with_kv {
    ($pools:expr, $kv:ident => $body:expr) => {
        match $pools {
            Pools::F32($kv) => $body,
            Pools::F16($kv) => $body,
            Pools::BF16($kv) => $body,
            Pools::I8($kv) => $body,
        }
    };
}

mod step;

/// A sequence: its pages (block table row) and the tokens in them.
struct SeqState {
    pages: Vec<u32>,
    len: usize,
}

/// The current step's arrays (kept across steps so that they are allocated once).
#[derive(Default)]
struct StepData {
    ids: Vec<SeqId>,
    /// Tokens before the step (`cache_seqlens`).
    cached: Vec<usize>,
    /// Pages before the step (what a rollback truncates to).
    pages_before: Vec<usize>,
    cu_q: Vec<usize>,
    table: Vec<u32>,
    pages_per_seq: usize,
    slots: Vec<usize>,
    positions: Vec<u32>,
}

/// A paged K/V cache for many sequences, on the CPU (module docs): the paged, shared
/// counterpart of `candle_nn::kv_cache::KvCache`.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use sdpa_candle::{Alignment, Attention, KvType, PagedKvCache, PagedKvConfig, Rope, RopeStyle};
///
/// let config = PagedKvConfig {
///     layers: 2, pages: 16, page_size: 4, heads: 4, kv_heads: 2, d_k: 8, d_v: 8,
///     kv_type: KvType::F16,
/// };
/// let mut cache = PagedKvCache::new(config)?;
/// let (a, b) = (cache.add_sequence(), cache.add_sequence());
/// // One step: a 5-token prompt chunk of `a` and 3 of `b`, packed in this order.
/// let rope = Rope::new(RopeStyle::Halves, 8, 10_000.0);
/// let causal = Attention::new().causal(Alignment::BottomRight);
/// let mut step = cache.begin_step(&[(a, 5), (b, 3)], causal, Some(rope))?;
/// let dev = Device::Cpu;
/// for layer in 0..2 {
///     let k = Tensor::randn(0f32, 1., (8, 2, 8), &dev)?; // [total_new, H_kv, d_k]
///     let v = Tensor::randn(0f32, 1., (8, 2, 8), &dev)?;
///     let q = Tensor::randn(0f32, 1., (1, 8, 4, 8), &dev)?; // [1, total_q, H, d_k]
///     step.append(layer, &k, &v)?; // K rotated at positions 0..5 and 0..3
///     let out = step.attention(layer, &step.rotate(&q)?, None)?;
///     assert_eq!(out.dims(), &[1, 8, 4, 8]);
/// }
/// step.finish()?;
/// assert_eq!((cache.seq_len(a)?, cache.seq_len(b)?), (5, 3));
/// assert_eq!(cache.block_table(a)?.len(), 2); // 5 tokens in pages of 4
/// # Ok::<(), candle_core::Error>(())
/// ```
pub struct PagedKvCache {
    config: PagedKvConfig,
    pools: Vec<Pools>,
    seqs: HashMap<SeqId, SeqState>,
    free: Vec<u32>,
    next_id: u64,
    workspace: Workspace,
    step: StepData,
}

impl fmt::Debug for PagedKvCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PagedKvCache")
            .field("config", &self.config)
            .field("sequences", &self.seqs.len())
            .field("free_pages", &self.free.len())
            .finish()
    }
}

/// A zeroed vector of `n` elements (`None`: a size that overflowed), or an error.
fn zeroed<T: Clone + Default>(n: Option<usize>) -> Result<Vec<T>> {
    let Some(n) = n else {
        bail!("sdpa-candle: the cache's pools overflow usize");
    };
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        bail!("sdpa-candle: cannot allocate a pool of {n} elements");
    }
    v.resize(n, T::default());
    Ok(v)
}

impl<T: Clone + Default> Kv<T> {
    fn new(k: Option<usize>, v: Option<usize>, scales: Option<Option<usize>>) -> Result<Self> {
        let scales = match scales {
            Some(n) => Some((zeroed(n)?, zeroed(n)?)),
            None => None,
        };
        Ok(Kv {
            k: zeroed(k)?,
            v: zeroed(v)?,
            scales,
        })
    }
}

impl PagedKvCache {
    /// An empty cache: every page free, pools zeroed.
    ///
    /// # Errors
    /// A count of 0, `heads` not a multiple of `kv_heads`, more than 2³² pages, pools whose
    /// size overflows or cannot be allocated.
    pub fn new(config: PagedKvConfig) -> Result<Self> {
        let c = config;
        let counts = [
            ("layers", c.layers),
            ("pages", c.pages),
            ("page_size", c.page_size),
            ("heads", c.heads),
            ("kv_heads", c.kv_heads),
            ("d_k", c.d_k),
            ("d_v", c.d_v),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, n)| *n == 0) {
            bail!("sdpa-candle: PagedKvConfig::{name} must be positive");
        }
        if !c.heads.is_multiple_of(c.kv_heads) {
            bail!(
                "sdpa-candle: query heads ({}) must be a multiple of kv heads ({})",
                c.heads,
                c.kv_heads
            );
        }
        let Ok(last_page) = u32::try_from(c.pages - 1) else {
            bail!("sdpa-candle: at most 2^32 pages (block table entries are u32)");
        };
        let rows = c.pages.checked_mul(c.page_size);
        let heads = rows.and_then(|r| r.checked_mul(c.kv_heads));
        let (k, v) = (
            heads.and_then(|n| n.checked_mul(c.d_k)),
            heads.and_then(|n| n.checked_mul(c.d_v)),
        );
        let scales = (c.kv_type == KvType::I8).then_some(heads);
        let mut pools = Vec::new();
        if pools.try_reserve_exact(c.layers).is_err() {
            bail!("sdpa-candle: cannot allocate {} layers", c.layers);
        }
        for _ in 0..c.layers {
            pools.push(match c.kv_type {
                KvType::F32 => Pools::F32(Kv::new(k, v, None)?),
                KvType::F16 => Pools::F16(Kv::new(k, v, None)?),
                KvType::BF16 => Pools::BF16(Kv::new(k, v, None)?),
                KvType::I8 => Pools::I8(Kv::new(k, v, scales)?),
            });
        }
        let mut free = Vec::new();
        if free.try_reserve_exact(c.pages).is_err() {
            bail!(
                "sdpa-candle: cannot allocate a free list of {} pages",
                c.pages
            );
        }
        // pop() hands out page 0 first.
        free.extend((0..=last_page).rev());
        Ok(PagedKvCache {
            config,
            pools,
            seqs: HashMap::new(),
            free,
            next_id: 0,
            workspace: Workspace::new(),
            step: StepData::default(),
        })
    }

    /// The cache's shape and type.
    pub fn config(&self) -> &PagedKvConfig {
        &self.config
    }

    /// A new, empty sequence (it takes pages as steps give it tokens).
    pub fn add_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(
            id,
            SeqState {
                pages: Vec::new(),
                len: 0,
            },
        );
        id
    }

    /// Removes a sequence; its pages go back to the free list.
    ///
    /// # Errors
    /// `seq` is not in the cache (never added, or already freed).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<()> {
        let Some(s) = self.seqs.remove(&seq) else {
            bail!("sdpa-candle: {seq} is not in the cache (never added, or freed)");
        };
        self.free.extend(s.pages.iter().rev());
        Ok(())
    }

    /// Tokens the sequence holds.
    ///
    /// # Errors
    /// `seq` is not in the cache.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.seq(seq)?.len)
    }

    /// The sequence's pages, in token order: token `t` is in slot `t % page_size` of page
    /// `block_table(seq)[t / page_size]`.
    ///
    /// # Errors
    /// `seq` is not in the cache.
    pub fn block_table(&self, seq: SeqId) -> Result<&[u32]> {
        Ok(&self.seq(seq)?.pages)
    }

    /// Sequences in the cache.
    pub fn sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Pages on the free list.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    fn seq(&self, seq: SeqId) -> Result<&SeqState> {
        match self.seqs.get(&seq) {
            Some(s) => Ok(s),
            None => bail!("sdpa-candle: {seq} is not in the cache (never added, or freed)"),
        }
    }

    /// A copy of one layer's keys and values of a sequence, dense: `[1, len, H_kv, d_k]` and
    /// `[1, len, H_kv, d_v]`, of the cache's type (`i8`: dequantized to `f32`, each value
    /// `x as f32 · scale` rounded once, as the kernel reads it).
    ///
    /// # Errors
    /// `layer` past the cache's layers, `seq` not in the cache.
    pub fn sequence_kv(&self, layer: usize, seq: SeqId) -> Result<(Tensor, Tensor)> {
        let c = &self.config;
        let Some(pools) = self.pools.get(layer) else {
            bail!(
                "sdpa-candle: layer {layer} of a cache of {} layers",
                c.layers
            );
        };
        let s = self.seq(seq)?;
        let (len, ps, h) = (s.len, c.page_size, c.kv_heads);
        let dense = |d: usize| (1, len, h, d);
        let dev = &Device::Cpu;
        macro_rules! rows {
            ($pool:expr, $d:expr) => {
                gather($pool, &s.pages, ps, h * $d, len)
            };
        }
        macro_rules! float {
            ($kv:expr) => {
                (
                    Tensor::from_vec(rows!(&$kv.k, c.d_k), dense(c.d_k), dev)?,
                    Tensor::from_vec(rows!(&$kv.v, c.d_v), dense(c.d_v), dev)?,
                )
            };
        }
        Ok(match pools {
            Pools::F32(kv) => float!(kv),
            Pools::F16(kv) => float!(kv),
            Pools::BF16(kv) => float!(kv),
            Pools::I8(kv) => {
                let Some((ks, vs)) = &kv.scales else {
                    bail!("sdpa-candle: an i8 cache without scales");
                };
                // Row `i / d` of the scales (one per (token, kv head)) scales element `i`.
                let deq = |x: Vec<i8>, scales: &[f32], d: usize| -> Vec<f32> {
                    let s = rows!(scales, 1);
                    let x = x.iter().enumerate();
                    x.map(|(i, &x)| f32::from(x) * s[i / d]).collect()
                };
                let k = deq(rows!(&kv.k, c.d_k), ks, c.d_k);
                let v = deq(rows!(&kv.v, c.d_v), vs, c.d_v);
                (
                    Tensor::from_vec(k, dense(c.d_k), dev)?,
                    Tensor::from_vec(v, dense(c.d_v), dev)?,
                )
            }
        })
    }

    /// Begins a step: `batch` lists its sequences in the order of the packed rows, each with
    /// its new tokens (0 is allowed: the sequence has no rows this step). Takes the pages the
    /// new tokens need from the free list, computes their slots and positions (a sequence's
    /// token `t` is at position `t`), and plans the step's attention once for every layer:
    /// `attention`'s scale, causal alignment, window, softcap and bf16 products, with the
    /// sequences' lengths before the step as [`sdpa::Options::cache_seqlens`]. A cache step
    /// wants `Attention::new().causal(Alignment::BottomRight)`: each new row sees the cached
    /// tokens and the new ones up to itself. `rope`, if given, rotates K in
    /// [`PagedStep::append`] and Q in [`PagedStep::rotate`].
    ///
    /// Nothing changes on error.
    ///
    /// # Errors
    /// A sequence not in the cache or listed twice, fewer free pages than the step needs,
    /// a position past `u32::MAX`, the rope's errors for these positions and `d_k`
    /// ([`Rope::apply`]), and the plan's ([`Plan::new`]: options) as candle errors.
    pub fn begin_step<'s>(
        &'s mut self,
        batch: &[(SeqId, usize)],
        attention: Attention,
        rope: Option<Rope<'s>>,
    ) -> Result<PagedStep<'s>> {
        let c = self.config;
        let d = &mut self.step;
        for v in [
            &mut d.cached,
            &mut d.pages_before,
            &mut d.cu_q,
            &mut d.slots,
        ] {
            v.clear();
        }
        d.ids.clear();
        d.positions.clear();
        d.cu_q.push(0);
        let mut need = 0usize;
        for (i, &(id, n)) in batch.iter().enumerate() {
            let Some(s) = self.seqs.get(&id) else {
                bail!("sdpa-candle: {id} is not in the cache (never added, or freed)");
            };
            if batch[..i].iter().any(|&(other, _)| other == id) {
                bail!("sdpa-candle: {id} appears twice in one step");
            }
            let total = d.cu_q.last().and_then(|&t| t.checked_add(n));
            let (Some(len), Some(total)) = (s.len.checked_add(n), total) else {
                bail!("sdpa-candle: {id}: {n} new tokens overflow usize");
            };
            if len
                .checked_sub(1)
                .is_some_and(|p| u32::try_from(p).is_err())
            {
                bail!("sdpa-candle: {id}: positions past u32::MAX");
            }
            need = need.saturating_add(len.div_ceil(c.page_size).saturating_sub(s.pages.len()));
            d.ids.push(id);
            d.cached.push(s.len);
            d.pages_before.push(s.pages.len());
            d.cu_q.push(total);
        }
        if need > self.free.len() {
            bail!(
                "sdpa-candle: out of pages: the step needs {need} new pages, {} are free",
                self.free.len()
            );
        }
        // The new tokens fit in the free pages, so these arrays fit in memory; every position
        // fits in u32 (checked above).
        for (b, &from) in d.cached.iter().enumerate() {
            let n = d.cu_q[b + 1] - d.cu_q[b];
            d.positions.extend((from..from + n).map(|t| t as u32));
        }
        if let Some(rope) = &rope {
            // Checks the rotary dim against d_k and the positions against any tables, on a
            // view with no heads (nothing to rotate).
            let mut none: [f32; 0] = [];
            let mut probe = TensorMut::new(&mut none, [1, d.positions.len(), 0, c.d_k], [0; 4])
                .map_err(candle_core::Error::wrap)?;
            rope.apply(&mut probe, &d.positions)
                .map_err(candle_core::Error::wrap)?;
        }
        // Take the pages (page 0 of the list's tail first) and lay out the step.
        let mut taken = self
            .free
            .split_off(self.free.len() - need)
            .into_iter()
            .rev();
        for (b, id) in d.ids.iter().enumerate() {
            let Some(s) = self.seqs.get_mut(id) else {
                continue; // checked above
            };
            let len = d.cached[b] + (d.cu_q[b + 1] - d.cu_q[b]);
            while s.pages.len() * c.page_size < len {
                match taken.next() {
                    Some(p) => s.pages.push(p),
                    None => break, // counted above
                }
            }
            d.slots.extend(
                (d.cached[b]..len)
                    .map(|t| s.pages[t / c.page_size] as usize * c.page_size + t % c.page_size),
            );
        }
        let pps = d
            .ids
            .iter()
            .filter_map(|id| self.seqs.get(id).map(|s| s.pages.len()))
            .max()
            .unwrap_or(0)
            .max(1);
        d.pages_per_seq = pps;
        d.table.clear();
        d.table.resize(d.ids.len() * pps, 0);
        for (row, id) in d.table.chunks_mut(pps).zip(&d.ids) {
            if let Some(s) = self.seqs.get(id) {
                row[..s.pages.len()].copy_from_slice(&s.pages);
            }
        }

        let PagedKvCache {
            config,
            pools,
            seqs,
            free,
            workspace,
            step,
            ..
        } = self;
        let data: &'s StepData = step;
        let opts = attention.options(None, None).cache_seqlens(&data.cached);
        let kv = StepKv::Paged {
            block_table: &data.table,
            pages_per_seq: data.pages_per_seq,
            page_size: config.page_size,
        };
        let heads = Heads {
            heads: config.heads,
            kv_heads: config.kv_heads,
            d_k: config.d_k,
            d_v: config.d_v,
        };
        match Plan::in_workspace(workspace, &data.cu_q, kv, heads, &opts) {
            Ok(plan) => Ok(PagedStep::new(plan, config, data, pools, seqs, free, rope)),
            Err(e) => {
                rollback(data, seqs, free);
                Err(candle_core::Error::wrap(e))
            }
        }
    }
}

/// Gives back the pages a step took: each sequence's pages past those it had, in reverse.
fn rollback(data: &StepData, seqs: &mut HashMap<SeqId, SeqState>, free: &mut Vec<u32>) {
    for (id, &before) in data.ids.iter().zip(&data.pages_before).rev() {
        if let Some(s) = seqs.get_mut(id) {
            while s.pages.len() > before {
                if let Some(p) = s.pages.pop() {
                    free.push(p);
                }
            }
        }
    }
}

/// The first `len` tokens of a sequence with pages `pages`, `row` elements each, from a pool.
fn gather<T: Copy>(pool: &[T], pages: &[u32], page_size: usize, row: usize, len: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(len * row);
    for t in 0..len {
        let slot = pages[t / page_size] as usize * page_size + t % page_size;
        out.extend_from_slice(&pool[slot * row..][..row]);
    }
    out
}
