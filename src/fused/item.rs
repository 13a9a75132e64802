//! One work item of the fused kernel: a block of stacked query rows streamed against its key
//! blocks with the online softmax (FlashAttention-2's forward loop; the algorithm is in the
//! crate docs), as a sequence of named stages.
//!
//! ```text
//! pack_queries                 Qᵀ panels, once per item
//! visible_ranges               each row's visible keys [lo, hi); m = −MAX, l = 0, O = 0
//! for each key block:
//!     kv.keys                  K rows, in place or converted          (KvSource)
//!     load_values              V rows, in place or converted; rows holding NaN/±∞ set aside
//!     scores                   Sᵀ = K·Qᵀ · scale·log₂e, softcap, ALiBi — panel by panel
//!     bias_and_masks           + bias; −∞ for keys a row does not see
//!     softmax_update           m' = max(m, rowmax S); P = 2^(S − m'); l = α·l + ΣP
//!                              (bf16 products: P also rounded and paired by keys)
//!     output_product           O = α ⊙ O + P·V
//!     add_non_finite_values    P·v for the set-aside rows, only to the rows that see them
//! ```
//!
//! Scores live in the log2 domain: right after the dot products they are multiplied by `scale`
//! and `log₂e`, so `exp(s − m)` becomes `2^(s' − m')` and every later step (softcap, ALiBi,
//! bias, max, exponent) works on `s' = s·log₂e`. The running max `m` starts at `−f32::MAX`
//! instead of `−∞` and never goes below it, so `s − m` is `−∞` (weight exactly 0) for masked
//! scores and never `−∞ − (−∞) = NaN`, with no branch.

use super::blocking::Blocking;
use super::kv::{convert, KeyRange, KvSource, Rows};
use super::scratch::{KvBuffers, PairBuffers, Scratch, TileBuffers};
use crate::element::Element;
use crate::microkernel::{dot_tile, output_tile, scores_tile};
use crate::problem::Problem;
use crate::simd::dpbf16::{
    Bf16Dot, KeyRows, PairKeys, Pairable, PANEL as PAIR_PANEL, TILE as PAIR_TILE,
};
use crate::simd::{exp2, Kernel, Lanes, RowStream, Simd};
use crate::tensor::{AnyTensor, Tensor};
use half::{bf16, f16};
use std::f32::consts::LOG2_E;
use std::ops::Range;

/// What every work item of one call reads (Q apart: only [`pack_queries`] reads it, so the
/// block loop is compiled once per K/V source, not once per Q type too).
pub(crate) struct Ctx<'a, KV> {
    pub problem: &'a Problem<'a>,
    pub blocking: Blocking,
    pub kv: KV,
}

/// One work item: `group` query heads (those sharing key/value head `kv_head`) × query rows
/// `q_start .. q_start + q_len` of batch `batch`, over keys `kv_start .. kv_end`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub batch: usize,
    pub kv_head: usize,
    /// Key/value heads `kv_head .. kv_head + heads` ([`Blocking::heads`]).
    pub heads: usize,
    pub q_start: usize,
    pub q_len: usize,
    pub kv_start: usize,
    pub kv_end: usize,
}

impl Item {
    /// Stacked rows: `heads × group × q_len`, row `r` is query head `kv_head·group + r /
    /// q_len` (of kv head `kv_head + r / (group·q_len)`), query position `q_start + r % q_len`.
    pub fn rows(&self, group: usize) -> usize {
        self.heads * group * self.q_len
    }

    /// The (query head, query position) of stacked row `r`.
    pub fn row_origin(&self, group: usize, r: usize) -> (usize, usize) {
        (
            self.kv_head * group + r / self.q_len,
            self.q_start + r % self.q_len,
        )
    }
}

/// The tile geometry of one item.
#[derive(Debug, Clone, Copy)]
struct Tiles {
    /// Stacked rows of the item.
    rows: usize,
    /// Rows rounded up to whole vectors: the leading dimension of Sᵀ (key `j`'s scores at
    /// `st[j · ld_s ..]`) and the extent of the per-row vectors the softmax reads.
    ld_s: usize,
    /// Query/key head size.
    d_k: usize,
    /// Value head size, and rounded up to whole vectors (the row length of O and packed V).
    d_v: usize,
    d_vp: usize,
    /// Few rows (decode): Q packed as rows and scores computed with channels along the lanes
    /// ([`dot_tile`]) instead of the transposed tile, which would leave most lanes idle.
    by_channels: bool,
    /// How the item reads 8-bit keys and values ([`plan_int_rows`]; dequantized for every
    /// other K/V type).
    int_keys: IntRows,
    int_values: IntRows,
}

/// How one side (K or V) of an item's 8-bit rows is read, decided once per item by
/// [`plan_int_rows`] (see [`super::quant`] for the scale granularities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntRows {
    /// Converted to f32 with their scales where the block is loaded ([`KvSource::keys`],
    /// [`load_values`]); every K/V type but i8, and i8 wherever the rows are not read in place.
    Dequantized,
    /// Read in place; each key's scale multiplies its scores as the score tile stores them
    /// ([`crate::microkernel::dot_tile`]) or its weights as the softmax writes them
    /// ([`spread_factors`], [`softmax_update`]).
    PerKey,
    /// Read in place; the channel scales, the same for every key, folded into Q's rows (K)
    /// or the output (V) once per item ([`scale_rows_by_channels`]).
    Folded,
}

impl IntRows {
    fn in_place(self) -> bool {
        self != IntRows::Dequantized
    }
}

/// One key block `j0 .. j1` (absolute key indices).
#[derive(Debug, Clone, Copy)]
struct Block {
    j0: usize,
    j1: usize,
    /// Every row of the item sees every key of the block (by its causal/window/length range).
    seen_by_all: bool,
}

impl Block {
    fn len(&self) -> usize {
        self.j1 - self.j0
    }

    /// The keys of the block (relative to `j0`) that some of the rows with visible ranges
    /// `lo[r] .. hi[r]` sees ([`union_range`]), or `None` if none sees any. (Most blocks are
    /// seen whole by every row: then there is no range to find.)
    #[inline(always)]
    fn seen_by(&self, lo: &[usize], hi: &[usize]) -> Option<(usize, usize)> {
        if self.seen_by_all {
            Some((0, self.len()))
        } else {
            union_range(lo, hi, self.j0, self.j1)
        }
    }
}

/// Runs one work item: afterwards `scratch.tile.o[r]` holds the unnormalized output of row
/// `r`, `scratch.tile.l[r]` its sum of weights and `scratch.tile.m[r]` its max score, log2
/// domain (`l = 0` for a row that saw no key).
#[inline(always)]
pub(crate) fn stream_item<S: Simd, KV: KvSource>(
    s: S,
    cx: &Ctx<'_, KV>,
    q: &AnyTensor<'_>,
    item: &Item,
    sc: &mut Scratch,
) {
    let bl = &cx.blocking;
    debug_assert_eq!((S::LANES, S::TILE), (bl.geometry.lanes, bl.geometry.tile));
    let rows = item.rows(bl.group);
    if rows == 0 {
        return; // a query block past its sequence's end (packed batches)
    }
    let mut t = Tiles {
        rows,
        ld_s: rows.div_ceil(S::LANES) * S::LANES,
        d_k: cx.problem.d_k,
        d_v: cx.problem.d_v,
        d_vp: bl.d_v_pad,
        by_channels: bl.by_channels(),
        int_keys: IntRows::Dequantized,
        int_values: IntRows::Dequantized,
    };
    pack_queries(s, cx, q, item, &t, &mut sc.tile.qt);
    if let Some(bf) = bl.pairs {
        pair_queries(bf, &t, &sc.tile.qt, &mut sc.pairs.qt);
    }
    let Some((first, last)) = visible_ranges(cx, item, &t, &mut sc.tile) else {
        return;
    };
    // The K block buffer, unused when keys are read in place, holds the factors then.
    if KV::I8 && t.by_channels && t.ld_s <= t.d_k {
        plan_int_rows(s, cx, q, item, &mut t, first, &mut sc.tile.qt);
    }
    // Its own entry point: compiled once per (backend, K/V source), whatever the Q type.
    s.run(BlockLoop {
        cx,
        item,
        t,
        keys: (first, last),
        sc,
    });
    if t.int_values == IntRows::Folded {
        // `Σ_j p_j·(v_j ⊙ s) = (Σ_j p_j·v_j) ⊙ s`: V's channel scales applied to the item's
        // unnormalized output once, after its last block.
        let o = &mut sc.tile.o[..t.rows * t.d_vp];
        scale_rows_by_channels(s, cx, item, true, o, (t.d_vp, t.d_v));
    }
}

/// How the item reads its 8-bit keys and values (`Tiles::int_keys`, `int_values`), decided
/// once for all its blocks: whether the source gives rows in place depends on the call's
/// shapes and strides only, so the first visible key's rows stand for every block's. Folded
/// scales must never meet dequantized rows (they would apply twice).
///
/// Keys in place need every row's dot product with integers of magnitude ≤ 128 to stay finite
/// in f32 before any scale multiplies it ([`int_dots_finite`], on Q as folded). Scales that
/// vary along channels only ([`KvSource::channel_scales`]) are folded: K's into each head's
/// Q rows (`q·(k ⊙ s) = (q ⊙ s)·k`, one rounding per product as dequantizing has), V's into
/// the output after the last block.
#[inline(always)]
fn plan_int_rows<S: Simd, KV: KvSource>(
    s: S,
    cx: &Ctx<'_, KV>,
    q: &AnyTensor<'_>,
    item: &Item,
    t: &mut Tiles,
    first: usize,
    qt: &mut [f32],
) {
    let at = |g: usize| KeyRange {
        batch: item.batch,
        kv_head: item.kv_head + g,
        j0: first,
        len: 1,
    };
    // The scales' shape is the call's: one head's answer is every head's.
    let folds = |values: bool| {
        cx.kv
            .channel_scales(values, item.batch, item.kv_head)
            .is_some()
    };
    let (per_key, folded) = (IntRows::PerKey, IntRows::Folded);
    if (0..item.heads).all(|g| cx.kv.keys_in::<i8>(at(g)).is_some()) {
        let rows = t.rows * t.d_k;
        let fold = folds(false);
        if fold {
            scale_rows_by_channels(s, cx, item, false, &mut qt[..rows], (t.d_k, t.d_k));
        }
        if int_dots_finite(s, &qt[..rows]) {
            t.int_keys = if fold { folded } else { per_key };
        } else if fold {
            // The keys are dequantized after all: Q as given.
            pack_queries(s, cx, q, item, t, qt);
        }
    }
    if (0..item.heads).all(|g| cx.kv.values_in::<i8>(at(g), t.d_vp).is_some()) {
        // (`(Σ_j p_j·v_j)·s` is the sum the dequantized rows accumulate, so it overflows only
        // where theirs does: values with `|v|·n_visible` near `f32::MAX`, README's documented
        // limit.)
        t.int_values = if folds(true) { folded } else { per_key };
    }
}

/// Each head's rows of `rows` (stacked rows of the item, `ld` apart) times the channel scales
/// of its kv head's keys (`values` false) or values, over their first `width` entries, for
/// scales that vary along channels only ([`KvSource::channel_scales`]; else nothing changes).
/// Contiguous scales (per (kv head, channel)) by whole vectors, one scale (per tensor) as a
/// splat: element by element through the broadcast's indexing, these multiplies were 10% of an
/// i8 decode step with folded scales (an item folds all its heads' rows, once per key split).
#[inline(always)]
fn scale_rows_by_channels<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    values: bool,
    rows: &mut [f32],
    (ld, width): (usize, usize),
) {
    let head_len = rows.len() / item.heads;
    for (g, head) in rows.chunks_exact_mut(head_len).enumerate() {
        let Some(scales) = cx.kv.channel_scales(values, item.batch, item.kv_head + g) else {
            continue;
        };
        let whole = width / S::LANES * S::LANES;
        for row in head.chunks_exact_mut(ld) {
            let row = &mut row[..width];
            match scales.strides[3] {
                0 => {
                    let x = scales.at([0; 4]);
                    let one = s.splat(x);
                    let (body, tail) = row.split_at_mut(whole);
                    for v in body.chunks_exact_mut(S::LANES) {
                        s.store(v, s.mul(s.load(v), one));
                    }
                    tail.iter_mut().for_each(|v| *v *= x);
                }
                1 => {
                    let by = &scales.data[..width];
                    let (body, tail) = row.split_at_mut(whole);
                    for (v, c) in body
                        .chunks_exact_mut(S::LANES)
                        .zip(by.chunks_exact(S::LANES))
                    {
                        s.store(v, s.mul(s.load(v), s.load(c)));
                    }
                    for (v, c) in tail.iter_mut().zip(&by[whole..]) {
                        *v *= c;
                    }
                }
                _ => {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v *= scales.at([0, 0, 0, c]);
                    }
                }
            }
        }
    }
}

/// The key-block loop of one work item, over keys `keys.0 .. keys.1`.
struct BlockLoop<'a, 'c, KV> {
    cx: &'a Ctx<'c, KV>,
    item: &'a Item,
    t: Tiles,
    keys: (usize, usize),
    sc: &'a mut Scratch,
}

impl<KV: KvSource> Kernel for BlockLoop<'_, '_, KV> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let BlockLoop {
            cx,
            item,
            t,
            keys: (first, last),
            sc,
        } = self;
        block_loop(s, cx, item, t, first, last, sc)
    }
}

/// The stages of each key block (module docs).
#[inline(always)]
fn block_loop<S: Simd, KV: KvSource>(
    s: S,
    cx: &Ctx<'_, KV>,
    item: &Item,
    t: Tiles,
    first: usize,
    last: usize,
    sc: &mut Scratch,
) {
    let bl = &cx.blocking;
    let Scratch {
        tile,
        kv,
        pairs,
        tiles,
        ..
    } = sc;
    let KvBuffers {
        k: k_buf,
        v: v_buf,
        v_row,
        non_finite,
        scales,
    } = kv;
    let head_rows = item.q_len * bl.group;
    // bf16 products exist only with bf16 Q and K/V (`Problem::bf16_products`). The paired
    // softmax and the prefill's paired V rows are also matched on `KV::BF16`, which keeps them
    // out of the other types' kernels, whose compiled loops they otherwise change: with the
    // paired softmax in them, i8 decode took 1.2× as long (Zen 4, 2026-12-05). (Taking every
    // paired stage through `KV::BF16` instead, `bl.pairs.filter(|_| KV::BF16)`, made f32 and
    // f16 decode 3–8% slower in sdpa/read, six alternated pairs on the same VM: placement, not
    // work. The two guards stay where they were measured.)
    debug_assert!(
        KV::BF16 || bl.pairs.is_none(),
        "bf16 products with non-bf16 K/V"
    );
    let mut j0 = first;
    while j0 < last {
        let j1 = j0 + (last - j0).min(bl.kv_block);
        let block = Block {
            j0,
            j1,
            seen_by_all: all_rows_see(tile, t.rows, j0, j1),
        };
        // The keys of the block for the item's kv head `g`.
        let at = |g: usize| KeyRange {
            batch: item.batch,
            kv_head: item.kv_head + g,
            j0,
            len: block.len(),
        };
        // Where every row sees every key of the block, a NaN or ±∞ in V reaches exactly the
        // rows that see it anyway: no need to look for one.
        let isolate = cx.problem.mask.is_some() || !block.seen_by_all;
        if t.by_channels {
            // The element type the rows are read in is chosen by constants of the source, so
            // only its own kernels are compiled for each K/V type.
            let (bufs, t_ref) = ((&mut **k_buf, &mut **scales), &t);
            let paired = bl.pairs.map(|bf| (bf, &pairs.qt[..]));
            *tiles += if KV::F16 {
                head_scores::<S, f16, KV>(s, cx, item, t_ref, &block, bufs, tile, None)
            } else if KV::BF16 {
                head_scores::<S, bf16, KV>(s, cx, item, t_ref, &block, bufs, tile, paired)
            } else if KV::I8 && t.int_keys.in_place() {
                head_scores::<S, i8, KV>(s, cx, item, t_ref, &block, bufs, tile, None)
            } else {
                head_scores::<S, f32, KV>(s, cx, item, t_ref, &block, bufs, tile, None)
            };
            alibi_distances(cx, item, &t, &block, tile);
            for r0 in (0..t.ld_s).step_by(2 * S::LANES) {
                if let Some(keys) = panel_keys::<S>(&t, &block, r0, tile) {
                    modify_scores(s, cx, &t, r0, keys, true, tile);
                }
            }
        } else {
            debug_assert_eq!(item.heads, 1);
            let keys = match bl.pairs {
                Some(bf) => BlockKeys::Paired(
                    bf,
                    pair_keys(s, bf, &cx.kv, at(0), t.d_k, k_buf, &mut pairs.k),
                ),
                None => BlockKeys::F32(cx.kv.keys(s, at(0), k_buf)),
            };
            *tiles += scores(s, cx, item, &t, &block, keys, tile, &pairs.qt);
        }
        bias_and_masks(cx, item, &t, &block, tile);
        // The score tiles found each row's maximum; it still holds if nothing changed the
        // scores after them.
        let p = cx.problem;
        let known_max = !t.by_channels
            && !isolate
            && p.softcap.is_none()
            && p.alibi.is_none()
            && p.bias.is_none();
        // 8-bit values in place: every head's weights times their values' scales (unless the
        // scales are folded into the output), so that the output tile takes the integers; the
        // scales spread over the rows as factors, applied as the softmax writes the weights.
        let factors = if KV::I8 && t.int_values == IntRows::PerKey {
            for g in 0..item.heads {
                let rows = g * head_rows..(g + 1) * head_rows;
                cx.kv.value_scales(at(g), scales);
                spread_factors(&scales[..block.len()], rows, t.ld_s, k_buf);
            }
            Some(&k_buf[..])
        } else {
            None
        };
        // bf16 products: the block's weights paired by keys as they are written, once for all
        // heads (every head's output product then takes them, V in place or packed).
        match bl.pairs {
            Some(bf) if KV::BF16 => bf.run(PairedSoftmax {
                t: &t,
                block: &block,
                known_max,
                tile,
                bf,
                p: &mut pairs.p,
            }),
            _ => softmax_update(s, &t, &block, known_max, tile, None, factors),
        }
        for g in 0..item.heads {
            let rows = g * head_rows..(g + 1) * head_rows;
            // Decode: the next block's V rows of this head are requested while the output
            // tile reads this block's, each panel's part as the panel passes its row; the K
            // rows were requested during the dot products. Spread over both stages, the
            // requests leave fewer of the loads waiting for a free line buffer.
            let next_v = if t.by_channels {
                let [_, v] = next_block(cx, at(g));
                v
            } else {
                None
            };
            // Few rows per head (decode): half-precision V rows read in place, converted as
            // the output tile loads them, unless they must be checked for NaN/±∞ and are not
            // all finite.
            let len = block.len();
            if t.by_channels && KV::F16 {
                if let Some(v) = cx.kv.values_in::<f16>(at(g), t.d_vp) {
                    if !isolate || all_finite(s, v, len, t.d_vp) {
                        output_product(s, &t, &block, v, rows, tile, next_v);
                        continue;
                    }
                }
            } else if t.by_channels && KV::BF16 {
                if let Some(v) = cx.kv.values_in::<bf16>(at(g), t.d_vp) {
                    if !isolate || all_finite(s, v, len, t.d_vp) {
                        match bl.pairs {
                            Some(bf) => pair_values_in_place::<S>(
                                bf, &t, &block, v, rows, tile, &pairs.p, next_v,
                            ),
                            None => output_product(s, &t, &block, v, rows, tile, next_v),
                        }
                        continue;
                    }
                }
            } else if let (Some(bf), true) = (bl.pairs, KV::BF16) {
                // bf16 products on bf16 V rows (prefill): their words paired as stored.
                if let Some(v) = cx.kv.values_in::<bf16>(at(g), t.d_vp) {
                    if !isolate || all_finite(s, v, len, t.d_vp) {
                        pair_values(bf, len, t.d_vp, v, &mut pairs.v);
                        pair_output_product(bf, &t, &block, rows, tile, pairs);
                        continue;
                    }
                }
            } else if t.int_values.in_place() {
                // (Never NaN or ±∞: nothing to set aside.)
                if let Some(v) = cx.kv.values_in::<i8>(at(g), t.d_vp) {
                    output_product(s, &t, &block, v, rows, tile, next_v);
                    continue;
                }
            }
            debug_assert!(
                t.int_values != IntRows::Folded,
                "folded value scales on dequantized rows"
            );
            let values = load_values(s, &cx.kv, at(g), &t, isolate, v_buf, non_finite);
            match bl.pairs {
                Some(bf) => {
                    pair_values(bf, len, t.d_vp, values, &mut pairs.v);
                    pair_output_product(bf, &t, &block, rows.clone(), tile, pairs);
                }
                None => output_product(s, &t, &block, values, rows.clone(), tile, next_v),
            }
            add_non_finite_values(s, cx, item, &t, at(g), rows, non_finite, v_row, tile);
        }
        j0 = block.j1;
    }
}

/// The dot products of every head of a by-channels item with the block's keys. Keys in place
/// (f32, or `E` = the cache's half type, converted as the dot products load them): tiles of
/// keys outside, heads inside, so that the rows of all the item's heads for a few tokens — one
/// contiguous stretch of a token-major cache — are read in address order. Other storage is
/// converted head by head through `keys` into `k_buf`. 8-bit keys in place (`E` = `i8`) have
/// their scores multiplied by their scales: read into `scales` at the keys' places in the
/// block, applied by the score tile as it stores each sum. Returns the number of tiles
/// computed. `paired`: the bf16 dot products and Q's pair rows ([`pair_queries`]), for bf16
/// keys in place.
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
fn head_scores<S: Simd, E: Lanes, KV: KvSource>(
    s: S,
    cx: &Ctx<'_, KV>,
    item: &Item,
    t: &Tiles,
    block: &Block,
    (k_buf, scales): (&mut [f32], &mut [f32]),
    tile: &mut TileBuffers,
    paired: Option<(Bf16Dot, &[f32])>,
) -> u64 {
    let head_rows = item.q_len * cx.blocking.group;
    let at = |g: usize| KeyRange {
        batch: item.batch,
        kv_head: item.kv_head + g,
        j0: block.j0,
        len: block.len(),
    };
    let in_place = cx.kv.keys_in::<E>(at(0)).is_some();
    let (tile_keys, passes) = if in_place {
        (KEY_TILE, block.len().div_ceil(KEY_TILE))
    } else {
        (block.len(), 1)
    };
    let mut count = 0;
    for pass in 0..passes {
        let keys = pass * tile_keys..((pass + 1) * tile_keys).min(block.len());
        for g in 0..item.heads {
            let rows = g * head_rows..(g + 1) * head_rows;
            // While this head's keys are computed, the next block's K rows of the head (same
            // offsets, one block ahead) are requested: measured at n_kv = 16384, 1 thread,
            // f16 K/V 41% → 54% of the read bandwidth; further ahead was slower.
            let [next, _] = next_block(cx, at(g));
            let range = (keys.clone(), rows.clone());
            count += match cx.kv.keys_in::<E>(at(g)) {
                Some(k) => {
                    let factors = if KV::I8 && t.int_keys == IntRows::PerKey {
                        let pass = KeyRange {
                            j0: block.j0 + keys.start,
                            len: keys.len(),
                            ..at(g)
                        };
                        // (At the keys' places in the block, as the tile indexes them.)
                        cx.kv.key_scales(pass, &mut scales[keys.clone()]);
                        Some(&scales[..keys.end])
                    } else {
                        None
                    };
                    scores_by_channels(s, t, block, k, range, tile, next, paired, factors)
                }
                None => {
                    debug_assert!(
                        t.int_keys != IntRows::Folded,
                        "folded key scales on dequantized rows"
                    );
                    let k = cx.kv.keys(s, at(g), k_buf);
                    scores_by_channels(s, t, block, k, range, tile, next, None, None)
                }
            };
        }
    }
    count
}

/// Writes `scales[j]` to the entries of `rows` of key `j` in `factors` (laid out like Sᵀ,
/// leading dimension `ld_s`), for every `j`: the per-key scales of one head's 8-bit rows read
/// in place, spread so that [`softmax_update`] multiplies whole vectors of rows (padding rows
/// take whatever `factors` holds there: they are never written out). Written four
/// entries at a time: a head's rows are few (decode: `n_q · group`, often exactly four), and
/// `fill` on a slice of unknown length compiled to a loop of scalar stores, 8% of an i8 decode
/// step in `perf` (Zen 4, 2026-12-04); in fours it is one 16-byte store per key.
#[inline(always)]
fn spread_factors(scales: &[f32], rows: Range<usize>, ld_s: usize, factors: &mut [f32]) {
    for (j, &x) in scales.iter().enumerate() {
        let row = &mut factors[j * ld_s..][rows.clone()];
        let mut quads = row.chunks_exact_mut(4);
        for quad in &mut quads {
            quad.copy_from_slice(&[x; 4]);
        }
        quads.into_remainder().fill(x);
    }
}

/// Whether every query row of `q` (rows of `d_k`, all the rows of a by-channels item) has dot
/// products with integer rows of magnitude ≤ 128 that stay finite in f32: `128 · Σ|q|` over
/// all the rows (which bounds each row's) below half the largest f32 (a margin for the sums'
/// rounding; NaN or ∞ fails). Otherwise 8-bit keys are dequantized first, as the scale may
/// bring the scores back into range. (Whole vectors first: a scalar sum's chain of dependent
/// adds was 7% of an i8 decode step.)
#[inline(always)]
fn int_dots_finite<S: Simd>(s: S, q: &[f32]) -> bool {
    let whole = q.len() / S::LANES * S::LANES;
    let mut acc = s.splat(0.0);
    for c in q[..whole].chunks_exact(S::LANES) {
        acc = s.add(acc, s.abs(s.load(c)));
    }
    let tail: f32 = q[whole..].iter().map(|x| x.abs()).sum();
    (s.reduce_add(acc) + tail) * 128.0 < f32::MAX / 2.0
}

/// The K and V rows of kv head `at.kv_head` one key block ahead of the block at `at.j0`, for
/// prefetching (the dot products request K, the output tile V); keys at or past the cache's
/// end are not requested. Past the work unit's own keys they are the first block of the
/// item's next key split, the unit that the same thread most often runs next (an item's
/// splits are adjacent units), so that block is not read cold. The addresses are found once
/// per block and head, so that a request in a loop is a multiply and the prefetches
/// themselves (the per-key search this replaced was 10% of a decode step's time in `perf`).
#[inline(always)]
fn next_block(cx: &Ctx<'_, impl KvSource>, at: KeyRange) -> [Option<RowStream>; 2] {
    let next = KeyRange {
        j0: at.j0 + cx.blocking.kv_block,
        ..at
    };
    let live = cx.problem.n_kv.saturating_sub(next.j0);
    cx.kv
        .prefetch_streams(next)
        .map(|rows| rows.map(|r| r.limit(live)))
}

/// Q of the item's rows, transposed into panels of two vectors of rows (as given: the scale
/// is applied to the scores; padding rows are zero), or, for few rows, as rows of `d_k`. Run
/// through its own entry point ([`PackQueries`]), compiled once per backend for every Q type
/// and K/V source: it runs once per work item.
#[inline(always)]
fn pack_queries<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    q: &AnyTensor<'_>,
    item: &Item,
    t: &Tiles,
    qt: &mut [f32],
) {
    let (problem, group) = (cx.problem, cx.blocking.group);
    let pack = PackQueries {
        problem,
        group,
        item,
        t,
        qt,
        q: (),
    };
    match *q {
        AnyTensor::F32(q) => s.run(pack.of(q)),
        AnyTensor::F16(q) => s.run(pack.of(q)),
        AnyTensor::Bf16(q) => s.run(pack.of(q)),
    }
}

/// [`pack_queries`] of one Q type, as a [`Kernel`].
struct PackQueries<'a, Q = ()> {
    problem: &'a Problem<'a>,
    group: usize,
    item: &'a Item,
    t: &'a Tiles,
    qt: &'a mut [f32],
    q: Q,
}

impl<'a> PackQueries<'a> {
    fn of<Q>(self, q: Q) -> PackQueries<'a, Q> {
        let PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            ..
        } = self;
        PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            q,
        }
    }
}

impl<Q: Element + Lanes> Kernel for PackQueries<'_, Tensor<'_, Q>> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            q,
        } = self;
        pack_rows(s, problem, group, &q, item, t, qt);
    }
}

/// The body of [`PackQueries`].
#[inline(always)]
fn pack_rows<S: Simd, Q: Element + Lanes>(
    s: S,
    problem: &Problem<'_>,
    group: usize,
    q: &Tensor<'_, Q>,
    item: &Item,
    t: &Tiles,
    qt: &mut [f32],
) {
    let nr = 2 * S::LANES;
    let [qs_b, qs_s, qs_h, qs_d] = q.strides();
    let q = q.data();
    // Where row `r` of the item starts in `q`.
    let base = |r: usize| {
        let (h, i) = item.row_origin(group, r);
        let (b, i) = problem.q_row(item.batch, i);
        b * qs_b + i * qs_s + h * qs_h
    };
    if t.by_channels {
        for r in 0..t.rows {
            let base = base(r);
            let row = &mut qt[r * t.d_k..(r + 1) * t.d_k];
            if qs_d == 1 && t.d_k > 0 {
                // Whole vectors (decode packs these rows once per key split: element by
                // element they were 7% of a decode step at n_kv = 4096).
                convert(s, &q[base..base + t.d_k], row);
            } else {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = q[base + c * qs_d].to_f32();
                }
            }
        }
        return;
    }
    if qs_d == 1 {
        // Whole vectors of channels, transposed in registers: element by element this was
        // 14% of a short prefill (n = 128, d = 64).
        return transpose_rows(s, q, base, t, qt);
    }
    qt[..t.rows.div_ceil(nr) * nr * t.d_k].fill(0.0);
    for r in 0..t.rows {
        let base = base(r);
        let panel = &mut qt[(r / nr) * nr * t.d_k..][..nr * t.d_k];
        for c in 0..t.d_k {
            panel[c * nr + r % nr] = q[base + c * qs_d].to_f32();
        }
    }
}

/// [`pack_queries`] for rows of unit channel stride: row `r` of the item is `q[base(r) ..][..d_k]`.
/// `LANES` rows at a time, a `LANES × LANES` block of them is loaded (converted to f32),
/// transposed in registers and stored as `LANES` steps of the panel; channels past the last
/// whole vector one by one. Padding rows are zero.
#[inline(always)]
fn transpose_rows<S: Simd, E: Lanes>(
    s: S,
    q: &[E],
    base: impl Fn(usize) -> usize,
    t: &Tiles,
    qt: &mut [f32],
) {
    let (lanes, d) = (S::LANES, t.d_k);
    let nr = 2 * lanes;
    let whole = d / lanes * lanes;
    let panels = t.rows.div_ceil(nr);
    for r0 in (0..panels * nr).step_by(lanes) {
        let panel = &mut qt[(r0 / nr) * nr * d..][..nr * d];
        let lane0 = r0 % nr;
        let live = t.rows.saturating_sub(r0).min(lanes);
        let mut rows: [&[E]; 16] = [&[]; 16];
        for (i, row) in rows[..live].iter_mut().enumerate() {
            *row = &q[base(r0 + i)..][..d];
        }
        let mut v = [s.splat(0.0); 16];
        for c0 in (0..whole).step_by(lanes) {
            for (x, row) in v[..live].iter_mut().zip(&rows) {
                *x = E::load(s, &row[c0..c0 + lanes]);
            }
            for x in &mut v[live..lanes] {
                *x = s.splat(0.0);
            }
            s.transpose(&mut v[..lanes]);
            for (c, &x) in v[..lanes].iter().enumerate() {
                s.store(&mut panel[(c0 + c) * nr + lane0..], x);
            }
        }
        for c in whole..d {
            let step = &mut panel[c * nr + lane0..][..lanes];
            for (i, x) in step.iter_mut().enumerate() {
                *x = if i < live { rows[i][c].scalar() } else { 0.0 };
            }
        }
    }
}

/// Q by channel pairs, rounded to bf16: the f32 Qᵀ panels for [`Bf16Dot::scores_panel`] (step
/// `p` of a pair panel holds, for each row, channels `2p` and `2p + 1`; zero past an odd
/// `d_k`), or, by channels, Q's rows for [`Bf16Dot::dots`] (row `r` at `pairs[r · ⌈d_k /
/// 2⌉ ..]`).
fn pair_queries(bf: Bf16Dot, t: &Tiles, qt: &[f32], pairs: &mut [f32]) {
    let (nr, d, d2) = (PAIR_PANEL, t.d_k, t.d_k.div_ceil(2));
    if t.by_channels {
        for r in 0..t.rows {
            bf.pair_row(&qt[r * d..][..d], &mut pairs[r * d2..][..d2]);
        }
        return;
    }
    for panel in 0..t.rows.div_ceil(nr) {
        let src = &qt[panel * nr * d..][..nr * d];
        let dst = &mut pairs[panel * nr * d2..][..nr * d2];
        for (p, step) in dst.chunks_exact_mut(nr).enumerate() {
            let odd = (2 * p + 1 < d).then(|| &src[(2 * p + 1) * nr..][..nr]);
            bf.interleave(&src[2 * p * nr..][..nr], odd, step);
        }
    }
}

/// Each row's visible keys (causal, window, key length) inside the item's key range, the ALiBi
/// slopes, and the initial softmax state. Returns the union of the ranges, or `None` when no
/// row sees any key (the item's rows then stay at `l = 0`).
fn visible_ranges(
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    t: &Tiles,
    tile: &mut TileBuffers,
) -> Option<(usize, usize)> {
    let p = cx.problem;
    let group = cx.blocking.group;
    let mut union = (usize::MAX, 0);
    for r in 0..t.rows {
        let (h, i) = item.row_origin(group, r);
        let (lo, hi) = p.visible_keys(item.batch, i);
        let (lo, hi) = (lo.max(item.kv_start), hi.min(item.kv_end));
        let (lo, hi) = if lo < hi { (lo, hi) } else { (0, 0) };
        tile.lo[r] = lo;
        tile.hi[r] = hi;
        if lo < hi {
            union = (union.0.min(lo), union.1.max(hi));
        }
        // Validated: |slope · log₂e| is finite.
        tile.alibi_slope[r] = p.alibi.map_or(0.0, |slopes| slopes[h] * LOG2_E);
    }
    tile.alibi_slope[t.rows..t.ld_s].fill(0.0);
    tile.alibi_dist[..t.ld_s].fill(0.0);
    tile.m[..t.ld_s].fill(-f32::MAX);
    tile.l[..t.ld_s].fill(0.0);
    tile.o[..t.ld_s * t.d_vp].fill(0.0);
    (union.0 < union.1).then_some(union)
}

/// The V rows of the block as `d_vp`-wide rows. A row holding NaN or ±∞ must reach only the
/// query rows that see its key, but the output tile multiplies every row of a tile with every
/// key of its range (`0 · NaN = NaN`): such rows are listed in `non_finite`, zeroed in a packed
/// copy, and added back by [`add_non_finite_values`]. The check is one vector pass over the
/// block (a sum of `v − v`, NaN iff some value is not finite), per-row only when it fires.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn load_values<'s, S: Simd>(
    s: S,
    kv: &'s impl KvSource,
    at: KeyRange,
    t: &Tiles,
    isolate: bool,
    buf: &'s mut [f32],
    non_finite: &mut Vec<usize>,
) -> Rows<'s> {
    non_finite.clear();
    let d_vp = t.d_vp;
    if t.d_v == 0 {
        return Rows::strided(buf, d_vp);
    }
    match kv.values_in_place(at, d_vp) {
        Some(rows) => {
            if !isolate || all_finite(s, rows, at.len, d_vp) {
                return rows;
            }
            find_non_finite(rows, at.len, t.d_v, non_finite);
            for j in 0..at.len {
                buf[j * d_vp..(j + 1) * d_vp].copy_from_slice(rows.row(j, d_vp));
            }
        }
        None => {
            kv.pack_values(s, at, d_vp, buf);
            let rows = Rows::strided(buf, d_vp);
            if !isolate || all_finite(s, rows, at.len, d_vp) {
                return Rows::strided(buf, d_vp);
            }
            find_non_finite(rows, at.len, t.d_v, non_finite);
        }
    }
    for &j in non_finite.iter() {
        buf[j * d_vp..(j + 1) * d_vp].fill(0.0);
    }
    Rows::strided(buf, d_vp)
}

/// Whether each of the item's `rows` sees every key of `block` by its causal/window/length
/// range.
fn all_rows_see(tile: &TileBuffers, rows: usize, j0: usize, j1: usize) -> bool {
    let lo = tile.lo[..rows].iter().max().copied().unwrap_or(0);
    let hi = tile.hi[..rows].iter().min().copied().unwrap_or(0);
    lo <= j0 && j1 <= hi
}

/// Lists the rows among the first `len` with a NaN or ±∞ in their first `width` values.
fn find_non_finite(rows: Rows<'_>, len: usize, width: usize, out: &mut Vec<usize>) {
    for j in 0..len {
        if rows.row(j, width).iter().any(|x| !x.is_finite()) {
            out.push(j);
        }
    }
}

/// Whether the first `len` rows (`width` values each, a multiple of the lanes) are all finite.
#[inline(always)]
fn all_finite<S: Simd, E: Lanes>(s: S, rows: Rows<'_, E>, len: usize, width: usize) -> bool {
    let mut acc = s.splat(0.0);
    for j in 0..len {
        for chunk in rows.row(j, width).chunks_exact(S::LANES) {
            let x = E::load(s, chunk);
            acc = s.add(acc, s.sub(x, x));
        }
    }
    let mut lanes = [0.0f32; 16];
    s.store(&mut lanes[..S::LANES], acc);
    lanes[..S::LANES].iter().all(|x| *x == 0.0)
}

/// `Sᵀ = K · Qᵀ` panel by panel, only over the keys some row of the panel sees, scaled into the
/// log2 domain and each row's block maximum taken by the tiles, then while the panel is in L1
/// its other element-wise modifiers ([`modify_scores`]), if any. Returns the number of score
/// tiles computed.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn scores<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    t: &Tiles,
    block: &Block,
    keys: BlockKeys<'_>,
    tile: &mut TileBuffers,
    q_pairs: &[f32],
) -> u64 {
    let nr = 2 * S::LANES;
    let ld_s = t.ld_s;
    let p = cx.problem;
    alibi_distances(cx, item, t, block, tile);
    let factors = [p.scale, LOG2_E];
    let mut count = 0;
    let d2 = t.d_k.div_ceil(2);
    for r0 in (0..ld_s).step_by(nr) {
        let Some((plo, phi)) = panel_keys::<S>(t, block, r0, tile) else {
            continue;
        };
        let r1 = (r0 + nr).min(ld_s);
        let qt = &tile.qt[(r0 / nr) * nr * t.d_k..][..nr * t.d_k];
        let max = &mut tile.block_max[r0..r1];
        max.fill(f32::NEG_INFINITY);
        match keys {
            BlockKeys::Paired(bf, k) => {
                count += bf.scores_panel(
                    k,
                    (plo, phi),
                    &q_pairs[(r0 / nr) * nr * d2..][..nr * d2],
                    d2,
                    &mut tile.st[r0..],
                    ld_s,
                    (r1 - r0) / S::LANES,
                    factors,
                    max,
                );
            }
            BlockKeys::F32(keys) => {
                count += s.run(PanelScores {
                    keys,
                    range: (plo, phi),
                    qt,
                    d: t.d_k,
                    st: &mut tile.st[r0..],
                    ld_s,
                    width: r1 - r0,
                    factors,
                    max,
                });
            }
        }
        if p.softcap.is_some() || p.alibi.is_some() {
            modify_scores(s, cx, t, r0, (plo, phi), false, tile);
        }
    }
    count
}

/// The score tiles of one panel: keys `range` of the block against `width` rows (one or two
/// vectors) of the panel's `qt`, into `st` (the panel's first row) at stride `ld_s`, times
/// `factors`, the rows' maxima into `max`. Run as its own function (`Simd::run`): inlined
/// into the key-block loop, its tile shared the registers with values hoisted from the other
/// stages, and AVX2's 12-accumulator tile spilled one or two accumulators on every step.
struct PanelScores<'a> {
    keys: Rows<'a>,
    range: (usize, usize),
    qt: &'a [f32],
    d: usize,
    st: &'a mut [f32],
    ld_s: usize,
    width: usize,
    factors: [f32; 2],
    max: &'a mut [f32],
}

impl Kernel for PanelScores<'_> {
    type Output = u64;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> u64 {
        let PanelScores {
            keys,
            range: (plo, phi),
            qt,
            d,
            st,
            ld_s,
            width,
            factors,
            max,
        } = self;
        let mut count = 0;
        let mut jj = plo;
        while jj < phi {
            let n = (phi - jj).min(S::TILE);
            let out = &mut st[jj * ld_s..];
            score_keys(s, (n, width), keys, jj, qt, d, (out, ld_s), factors, max);
            count += 1;
            jj += n;
        }
        count
    }
}

/// The block keys `[plo, phi)` some row of the score panel starting at row `r0` sees
/// ([`Block::seen_by`] of its real rows; a panel starts below `t.rows`).
#[inline(always)]
fn panel_keys<S: Simd>(
    t: &Tiles,
    block: &Block,
    r0: usize,
    tile: &TileBuffers,
) -> Option<(usize, usize)> {
    let real = r0.min(t.rows)..(r0 + 2 * S::LANES).min(t.rows);
    block.seen_by(&tile.lo[real.clone()], &tile.hi[real])
}

/// With ALiBi: the distance of each row's diagonal to the block's first key, computed exactly
/// in integers and rounded once (exact below 2²⁴), so positions past 2²⁴ lose nothing.
fn alibi_distances(
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    t: &Tiles,
    block: &Block,
    tile: &mut TileBuffers,
) {
    let p = cx.problem;
    if p.alibi.is_some() {
        for r in 0..t.rows {
            let (_, i) = item.row_origin(cx.blocking.group, r);
            tile.alibi_dist[r] = (i as i128 + p.diag_offset(item.batch) - block.j0 as i128) as f32;
        }
    }
}

/// The element-wise modifiers of the scores of keys `[plo, phi)` of the panel starting at row
/// `r0`, in the documented order: scale into the log2 domain (if `scale`: the prefill score
/// tiles have done it), softcap, ALiBi.
#[inline(always)]
fn modify_scores<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    t: &Tiles,
    r0: usize,
    (plo, phi): (usize, usize),
    scale: bool,
    tile: &mut TileBuffers,
) {
    let p = cx.problem;
    let (lanes, ld_s) = (S::LANES, t.ld_s);
    let r1 = (r0 + 2 * lanes).min(ld_s);
    // Scaling after the dot product rather than folding `scale` into Q keeps every
    // representable scaled score exact: a huge scale times zero dot products is 0, not
    // ∞ · 0; the two multiplies cannot overflow unless |scale · q·k| itself is beyond f32
    // (or above 2.3e38 in log2 units).
    let (factor, log2e) = (s.splat(p.scale), s.splat(LOG2_E));
    for r in (r0..r1).step_by(lanes) {
        let dist = s.load(&tile.alibi_dist[r..]);
        let slope = s.load(&tile.alibi_slope[r..]);
        for jj in plo..phi {
            let x = &mut tile.st[jj * ld_s + r..][..lanes];
            let mut y = s.load(x);
            if scale {
                y = s.mul(s.mul(y, factor), log2e);
            }
            if let Some(cap) = p.softcap {
                y = softcap(s, y, cap);
            }
            if p.alibi.is_some() {
                let d = s.abs(s.sub(dist, s.splat(jj as f32)));
                y = s.sub(y, s.mul(slope, d));
            }
            s.store(x, y);
        }
    }
}

/// The caller's bias (in log2 units) on each row's visible keys, then `−∞` for every key the
/// row does not see: outside its causal/window/key-length range, or hidden by the boolean mask.
fn bias_and_masks(
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    t: &Tiles,
    block: &Block,
    tile: &mut TileBuffers,
) {
    let p = cx.problem;
    let c = block.len();
    for r in 0..t.rows {
        let lo = tile.lo[r].clamp(block.j0, block.j1) - block.j0;
        let hi = tile.hi[r].clamp(block.j0, block.j1) - block.j0;
        let (lo, hi) = if lo < hi { (lo, hi) } else { (c, c) };
        if p.bias.is_some() || p.mask.is_some() {
            let (h, i) = item.row_origin(cx.blocking.group, r);
            for jj in lo..hi {
                let at = [item.batch, i, h, block.j0 + jj];
                let x = &mut tile.st[jj * t.ld_s + r];
                if let Some(bias) = &p.bias {
                    *x += bias.at(at) * LOG2_E;
                }
                if p.mask.as_ref().is_some_and(|m| !m.at(at)) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        for jj in (0..lo).chain(hi..c) {
            tile.st[jj * t.ld_s + r] = f32::NEG_INFINITY;
        }
    }
}

/// The online softmax over one block, one query row per lane: new running max, rescale factor
/// `α = 2^(m − m')`, weights `P = 2^(S − m')` in place of the scores, `l ← α·l + ΣP`. The
/// block's maximum per row is the score tiles' (`known_max`) or found by a pass over Sᵀ.
///
/// With `pairs` (bf16 products) the weights are also rounded to bf16 and paired by keys as
/// they are computed, Pᵀ's layout for the output tiles: pair `jp` at `p[jp · ld_s ..]` holds
/// each row's weights of keys `2jp` and `2jp + 1` (0 past the block's end), the words
/// [`Bf16Dot::interleave`] would write from Sᵀ's rows, with no second pass over Sᵀ. (The f32
/// weights stay in Sᵀ for the value rows set aside as non-finite.) The sums run in key order
/// either way.
///
/// With `factors` (laid out like Sᵀ: [`spread_factors`]) each weight is stored times its
/// factor, while `l` sums the weights themselves: 8-bit values in place with a scale per key,
/// `Σ_j (p_j·s_j)·v_j`, in the same pass.
#[inline(always)]
fn softmax_update<S: Simd>(
    s: S,
    t: &Tiles,
    block: &Block,
    known_max: bool,
    tile: &mut TileBuffers,
    mut pairs: Option<(Bf16Dot, &mut [f32])>,
    factors: Option<&[f32]>,
) {
    let c = block.len();
    for r0 in (0..t.ld_s).step_by(S::LANES) {
        let mut mx = s.splat(f32::NEG_INFINITY);
        if known_max {
            mx = s.load(&tile.block_max[r0..]);
        } else {
            for jj in 0..c {
                mx = s.max(mx, s.load(&tile.st[jj * t.ld_s + r0..]));
            }
        }
        let m_old = s.load(&tile.m[r0..]);
        let m_new = s.max(s.splat(-f32::MAX), s.max(m_old, mx));
        let alpha = exp2(s, s.sub(m_old, m_new));
        let mut sum = s.splat(0.0);
        let st = &mut tile.st[r0..];
        match (&mut pairs, factors) {
            (None, None) => {
                for jj in 0..c {
                    sum = s.add(sum, weights(s, &mut st[jj * t.ld_s..], m_new, None));
                }
            }
            (None, Some(f)) => {
                let f = &f[r0..];
                for jj in 0..c {
                    let (x, fj) = (&mut st[jj * t.ld_s..], &f[jj * t.ld_s..]);
                    sum = s.add(sum, weights(s, x, m_new, Some(fj)));
                }
            }
            (Some((bf, p)), _) => {
                debug_assert!(factors.is_none(), "bf16 products of 8-bit values");
                for jp in 0..c.div_ceil(2) {
                    let a = weights(s, &mut st[2 * jp * t.ld_s..], m_new, None);
                    sum = s.add(sum, a);
                    let mut b = s.splat(0.0);
                    if 2 * jp + 1 < c {
                        b = weights(s, &mut st[(2 * jp + 1) * t.ld_s..], m_new, None);
                        sum = s.add(sum, b);
                    }
                    s.pair_bf16(*bf, a, b, &mut p[jp * t.ld_s + r0..]);
                }
            }
        }
        let l = s.mul_add(s.load(&tile.l[r0..]), alpha, sum);
        s.store(&mut tile.l[r0..], l);
        s.store(&mut tile.m[r0..], m_new);
        s.store(&mut tile.alpha[r0..], alpha);
    }
}

/// One key's weights `p = 2^(x − m')` of a lane group of rows, written over its scores `x`
/// (the first `LANES` values of `st`), times `factor` (its first `LANES`) if given; returns
/// `p` unscaled, the term of the row sums. (A function, not a closure: a closure is compiled
/// without the entry point's target features, and its vector operations become calls. The
/// factor is loaded after the exponential: loaded before it, i8 decode ran 3% slower.)
#[inline(always)]
fn weights<S: Simd>(s: S, st: &mut [f32], m_new: S::V, factor: Option<&[f32]>) -> S::V {
    let x = &mut st[..S::LANES];
    let p = exp2(s, s.sub(s.load(x), m_new));
    match factor {
        Some(f) => s.store(x, s.mul(p, s.load(f))),
        None => s.store(x, p),
    }
    p
}

/// [`softmax_update`] with the weights paired for bf16 products, run through
/// [`Bf16Dot::run`]'s entry point (the conversion needs its features).
struct PairedSoftmax<'a> {
    t: &'a Tiles,
    block: &'a Block,
    known_max: bool,
    tile: &'a mut TileBuffers,
    bf: Bf16Dot,
    p: &'a mut [f32],
}

impl Kernel for PairedSoftmax<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let pairs = Some((self.bf, self.p));
        softmax_update(
            s,
            self.t,
            self.block,
            self.known_max,
            self.tile,
            pairs,
            None,
        );
    }
}

/// Keys per pass over all the heads of a decode item (16 keys × 8 heads × 512 B: 64 KiB of a
/// token-major f32 cache, read in address order).
const KEY_TILE: usize = 16;

/// The rescale factor of every accumulator after a block's first run of V rows.
const ONES: [f32; 16] = [1.0; 16];

/// `O = α ⊙ O + P · V`, row groups of the tile height over the keys some row of the group
/// sees. Column panels outside, row groups inside: one V panel (kv_block × 2 vectors: 24 KiB
/// at 192 keys on AVX-512) stays in L1 while every row group's Pᵀ streams past it, so V is
/// read from L2 once per block instead of once per row group.
///
/// For that, prefill copies each panel into `v_panel` first, its rows adjacent: read where
/// they lie, rows `ld` apart (512 B at d = 128 in f32, 4 KiB for heads interleaved) fall into
/// a few of L1's 64 sets (8 and 1 of them), which hold 64 and 8 lines on an 8-way L1, fewer
/// than a panel of 48–192 keys, so every row group read the panel from L2 again. (`perf` on a
/// Zen 3, n = 2048, d = 128: the output tile took 1.35× the score tile's time for the same
/// FMAs.) Values are only moved, so the sums are the same. Decode's single row group per
/// head reads each panel once, in place.
///
/// Its own entry point ([`OutputProduct`]), compiled once per backend and row type: inlined,
/// the tiles of f32 rows (every K/V source can reach them, with rows converted or set aside)
/// were compiled again into each K/V source's block loop.
#[inline(always)]
fn output_product<S: Simd, E: Lanes>(
    s: S,
    t: &Tiles,
    block: &Block,
    values: Rows<'_, E>,
    rows: Range<usize>,
    tile: &mut TileBuffers,
    next: Option<RowStream>,
) {
    s.run(OutputProduct {
        t,
        block,
        values,
        rows,
        tile,
        next,
    })
}

/// [`output_product`]'s operands.
struct OutputProduct<'a, 'v, E> {
    t: &'a Tiles,
    block: &'a Block,
    values: Rows<'v, E>,
    rows: Range<usize>,
    tile: &'a mut TileBuffers,
    next: Option<RowStream>,
}

impl<E: Lanes> Kernel for OutputProduct<'_, '_, E> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let OutputProduct {
            t,
            block,
            values,
            rows,
            tile,
            next,
        } = self;
        output_panels(s, t, block, values, rows, tile, next)
    }
}

/// The body of [`OutputProduct`].
#[inline(always)]
fn output_panels<S: Simd, E: Lanes>(
    s: S,
    t: &Tiles,
    block: &Block,
    values: Rows<'_, E>,
    rows: Range<usize>,
    tile: &mut TileBuffers,
    next: Option<RowStream>,
) {
    let vecs = panel_vecs::<S>(rows.len(), t.by_channels);
    let nr = vecs * S::LANES;
    // (Prefill's values are f32 rows, in place or packed; `E::of` gives the copy back as `E`
    // only then, so that the row groups are instantiated once, for `E`.)
    let copy = !t.by_channels
        && rows.len() > S::TILE
        && tile.v_panel.len() >= block.len() * nr
        && E::of::<f32>(&[]).is_some();
    for col in (0..t.d_vp).step_by(nr) {
        let width = (t.d_vp - col).min(nr) / S::LANES;
        let cols = (col, width);
        if copy {
            copy_panel(s, values, block.len(), cols, &mut tile.v_panel);
        }
        let TileBuffers {
            v_panel,
            st,
            o,
            alpha,
            lo,
            hi,
            ..
        } = &mut *tile;
        let copied = if copy { E::of(&v_panel[..]) } else { None };
        let panel = match copied {
            // (Rows as `copy_panel` wrote them: `width` vectors, fewer than `nr` columns in
            // the last panel when d_v is not a multiple of two vectors.)
            Some(data) => (Rows::strided(data, width * S::LANES), 0),
            None => (values, col),
        };
        let tb = (&st[..], &lo[..], &hi[..], &alpha[..]);
        row_groups(s, t, block, panel, cols, rows.clone(), tb, o, next);
    }
}

/// Columns `col .. col + width` vectors of the block's first `len` V rows, converted to f32,
/// to `panel` as adjacent rows of `width` vectors.
#[inline(always)]
fn copy_panel<S: Simd, E: Lanes>(
    s: S,
    values: Rows<'_, E>,
    len: usize,
    (col, width): (usize, usize),
    panel: &mut [f32],
) {
    let n = width * S::LANES;
    for (j, dst) in panel.chunks_exact_mut(n).take(len).enumerate() {
        let src = &values.row(j, col + n)[col..];
        for (d, x) in dst
            .chunks_exact_mut(S::LANES)
            .zip(src.chunks_exact(S::LANES))
        {
            s.store(d, E::load(s, x));
        }
    }
}

/// The row groups of [`output_product`] for one column panel: `panel` holds it from column
/// `col_in` of its rows; `(col, width)` are its columns in O (`width` vectors); `tb` is
/// (Pᵀ, rows' first and past-last visible keys, α).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn row_groups<S: Simd, E: Lanes>(
    s: S,
    t: &Tiles,
    block: &Block,
    (panel, col_in): (Rows<'_, E>, usize),
    (col, width): (usize, usize),
    rows: Range<usize>,
    (st, lo, hi, alpha_all): (&[f32], &[usize], &[usize], &[f32]),
    o_all: &mut [f32],
    next: Option<RowStream>,
) {
    let mr = S::TILE;
    for r0 in rows.clone().step_by(mr) {
        let r1 = (r0 + mr).min(rows.end);
        let Some((glo, ghi)) = block.seen_by(&lo[r0..r1], &hi[r0..r1]) else {
            continue;
        };
        // One call per run of adjacent V rows (the whole range, except for rows read in
        // place across pages); O is rescaled by α in the first only (×1 is exact), so the
        // sums are the same as in one call.
        let mut alpha = &alpha_all[r0..r1];
        let o = &mut o_all[r0 * t.d_vp + col..];
        let mut j = glo;
        while j < ghi {
            let (v, c) = panel.run(j, ghi - j);
            let pt = &st[j * t.ld_s + r0..];
            output_rows(
                s,
                r1 - r0,
                width,
                pt,
                t.ld_s,
                c,
                &v[col_in..],
                panel.ld,
                alpha,
                o,
                t.d_vp,
                next.map(|n| n.skip(j).columns(col, width * S::LANES, t.d_vp)),
            );
            alpha = &ONES[..r1 - r0];
            j += c;
        }
    }
}

/// [`output_product`] with bf16 dot products, the block's V rows and Pᵀ already paired by keys
/// (`⌈c / 2⌉` pairs, a zero key after an odd count: [`pair_values`] into `pairs.v`,
/// [`softmax_update`] into `pairs.p`): each row group takes the pairs that hold its visible keys.
/// A pair's other key is then one no row of the group sees: its weight is 0, and its value
/// finite (a block whose keys some row does not see has its non-finite value rows set aside by
/// [`load_values`], or is not read in place), so it adds exactly nothing.
fn pair_output_product(
    bf: Bf16Dot,
    t: &Tiles,
    block: &Block,
    rows: Range<usize>,
    tile: &mut TileBuffers,
    pairs: &PairBuffers,
) {
    let (ld_s, d_vp) = (t.ld_s, t.d_vp);
    let (nr, mr) = (PAIR_PANEL, PAIR_TILE);
    for col in (0..d_vp).step_by(nr) {
        let vecs = (d_vp - col).min(nr) / 16;
        for r0 in rows.clone().step_by(mr) {
            let r1 = (r0 + mr).min(rows.end);
            let Some((glo, ghi)) = block.seen_by(&tile.lo[r0..r1], &tile.hi[r0..r1]) else {
                continue;
            };
            bf.output_tile(
                &pairs.p[r0..],
                ld_s,
                (glo / 2, ghi.div_ceil(2)),
                &pairs.v[col..],
                d_vp,
                (r1 - r0, vecs),
                &tile.alpha[r0..r1],
                &mut tile.o[r0 * d_vp + col..],
                d_vp,
            );
        }
    }
}

/// Columns `col .. col + width` of bf16 rows, as [`Bf16Dot`]'s decode kernels read them.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Columns<'s> {
    rows: Rows<'s, bf16>,
    col: usize,
    width: usize,
}

impl KeyRows for Columns<'_> {
    #[inline(always)]
    fn row(&self, j: usize) -> &[bf16] {
        &self.rows.row(j, self.col + self.width)[self.col..]
    }
}

/// The V rows of a block's `c` keys by key pairs for [`pair_output_product`]: pair `jp` at
/// `pv[jp · d_vp ..]` holds rows `2jp` and `2jp + 1` interleaved channel by channel (zeros past
/// `c`), f32 rows rounded to bf16, bf16 rows as stored ([`Pairable`]). ([`softmax_update`]
/// pairs the weights the same way.)
fn pair_values<E: Pairable>(
    bf: Bf16Dot,
    c: usize,
    d_vp: usize,
    values: Rows<'_, E>,
    pv: &mut [f32],
) {
    for jp in 0..c.div_ceil(2) {
        let (a, b) = (2 * jp, 2 * jp + 1);
        let second = (b < c).then(|| values.row(b, d_vp));
        E::interleave(
            bf,
            values.row(a, d_vp),
            second,
            &mut pv[jp * d_vp..][..d_vp],
        );
    }
}

/// The block's K rows rounded to bf16, as rows of `⌈d_k / 2⌉` channel pairs (what the score
/// panels of [`scores`] read): bf16 rows in place read as stored where every pair is one
/// 32-bit word of a row (an even head size, an even row stride no shorter than a row, the
/// block's rows not split between pages), else copied into `pairs_k`; other storage rounded
/// from its f32 rows ([`KvSource::keys`], into `k_buf`) into `pairs_k`.
#[inline(always)]
fn pair_keys<'s, S: Simd, KV: KvSource>(
    s: S,
    bf: Bf16Dot,
    kv: &'s KV,
    at: KeyRange,
    d_k: usize,
    k_buf: &mut [f32],
    pairs_k: &'s mut [f32],
) -> PairKeys<'s> {
    fn pair_rows<E: Pairable>(
        bf: Bf16Dot,
        rows: Rows<'_, E>,
        len: usize,
        d_k: usize,
        dst: &mut [f32],
    ) {
        let d2 = d_k.div_ceil(2);
        for j in 0..len {
            E::pair_row(bf, rows.row(j, d_k), &mut dst[j * d2..][..d2]);
        }
    }
    let d2 = d_k.div_ceil(2);
    if KV::BF16 {
        if let Some(rows) = kv.keys_in::<bf16>(at) {
            let (data, adjacent) = rows.run(0, at.len);
            let words = d_k.is_multiple_of(2) && rows.ld.is_multiple_of(2) && rows.ld >= d_k;
            if adjacent == at.len && words {
                return PairKeys::Bf16(data, rows.ld);
            }
            pair_rows(bf, rows, at.len, d_k, pairs_k);
            return PairKeys::Words(pairs_k, d2);
        }
    }
    pair_rows(bf, kv.keys(s, at, k_buf), at.len, d_k, pairs_k);
    PairKeys::Words(pairs_k, d2)
}

/// The K rows of a block as [`scores`] takes them: f32 rows, or rows of bf16 channel pairs
/// ([`pair_keys`]) for the bf16 dot products.
#[derive(Clone, Copy)]
enum BlockKeys<'s> {
    F32(Rows<'s>),
    Paired(Bf16Dot, PairKeys<'s>),
}

/// [`output_product`] with bf16 dot products for decode's bf16 V rows read in place
/// ([`Bf16Dot::output_in_place`]), the weights already paired ([`softmax_update`] into
/// `p_pairs`): one row group (a kv head's rows are at most `LANES / 2`), panels as wide as
/// [`panel_vecs`] allows. The rows are found one by one ([`Rows::row`]), not by runs of
/// adjacent rows as in [`row_groups`]: a pair split between two pages is then still one pair,
/// so a paged cache gives the same sums as a dense one.
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
fn pair_values_in_place<S: Simd>(
    bf: Bf16Dot,
    t: &Tiles,
    block: &Block,
    values: Rows<'_, bf16>,
    rows: Range<usize>,
    tile: &mut TileBuffers,
    p_pairs: &[f32],
    next: Option<RowStream>,
) {
    let Some((glo, ghi)) = block.seen_by(&tile.lo[rows.clone()], &tile.hi[rows.clone()]) else {
        return;
    };
    let nr = panel_vecs::<S>(rows.len(), true) * S::LANES;
    for col in (0..t.d_vp).step_by(nr) {
        let width = (t.d_vp - col).min(nr);
        bf.output_in_place(
            &p_pairs[rows.start..],
            t.ld_s,
            (glo, ghi),
            Columns {
                rows: values,
                col,
                width,
            },
            (rows.len(), width / S::LANES),
            &tile.alpha[rows.clone()],
            &mut tile.o[rows.start * t.d_vp + col..],
            t.d_vp,
            next.map(|n| n.columns(col, width, t.d_vp)),
        );
    }
}

/// Adds `p_ij · v_j` for the value rows [`load_values`] set aside (NaN or ±∞ entries) to the
/// rows that see key `j` (its causal/window/length range and the boolean mask; a `−∞` bias
/// leaves the key seen with weight 0, so `0 · NaN` reaches the row, as in the reference).
#[allow(clippy::too_many_arguments)]
fn add_non_finite_values<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    t: &Tiles,
    at: KeyRange,
    rows: Range<usize>,
    non_finite: &[usize],
    v_row: &mut [f32],
    tile: &mut TileBuffers,
) {
    let p = cx.problem;
    for &jj in non_finite {
        let j = at.j0 + jj;
        let one = KeyRange {
            j0: j,
            len: 1,
            ..at
        };
        let v: &[f32] = match cx.kv.values_in_place(one, t.d_vp) {
            Some(rows) => rows.row(0, t.d_v),
            None => {
                cx.kv.pack_values(s, one, t.d_vp, v_row);
                &v_row[..t.d_v]
            }
        };
        for r in rows.clone() {
            let (h, i) = item.row_origin(cx.blocking.group, r);
            let in_range = tile.lo[r] <= j && j < tile.hi[r];
            if !in_range
                || p.mask
                    .as_ref()
                    .is_some_and(|m| !m.at([item.batch, i, h, j]))
            {
                continue;
            }
            let w = tile.st[jj * t.ld_s + r];
            for (o, &x) in tile.o[r * t.d_vp..][..t.d_v].iter_mut().zip(v) {
                *o += w * x;
            }
        }
    }
}

/// Soft-capping in the log2 domain: for a score `x = s·log₂e`, returns `cap·log₂e·tanh(s/cap)`,
/// with `tanh(y) = (e^{2y} − 1)/(e^{2y} + 1)` and `e^{2y} = 2^{x·2/cap}`. The clamped `2^x` keeps
/// it finite for any input (±∞ scores map to ±cap), NaN stays NaN; near 0 the subtraction
/// costs absolute (not relative) accuracy, ~1e-7 · cap, which the error bound accounts for.
/// (`2/cap` and `cap·log₂e` are finite: validation requires a normal cap with finite
/// `cap·log₂e`.)
#[inline(always)]
fn softcap<S: Simd>(s: S, x: S::V, cap: f32) -> S::V {
    let e = exp2(s, s.mul(x, s.splat(2.0 / cap)));
    let one = s.splat(1.0);
    let t = s.div(s.sub(e, one), s.add(e, one));
    s.mul(t, s.splat(cap * LOG2_E))
}

/// The union `[lo, hi)` of the rows' visible ranges intersected with `[j0, j1)`, relative to
/// `j0`; `None` if no row sees a key of the block.
#[inline(always)]
fn union_range(lo: &[usize], hi: &[usize], j0: usize, j1: usize) -> Option<(usize, usize)> {
    let mut u = (usize::MAX, 0);
    for (&l, &h) in lo.iter().zip(hi) {
        let (l, h) = (l.max(j0), h.min(j1));
        if l < h {
            u = (u.0.min(l), u.1.max(h));
        }
    }
    (u.0 < u.1).then(|| (u.0 - j0, u.1 - j0))
}

/// Scores of `n ≤ TILE` keys starting at block key `jj` against one panel of `width` (one or
/// two vectors) rows, into `out` at stride `ld`, times `factors`, the rows' maxima into `max`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn score_keys<S: Simd>(
    s: S,
    (n, width): (usize, usize),
    keys: Rows<'_>,
    jj: usize,
    qt: &[f32],
    d: usize,
    (out, ld): (&mut [f32], usize),
    factors: [f32; 2],
    max: &mut [f32],
) {
    macro_rules! tiles {
        ($($keys:literal)*) => {
            match n {
                // Heights above the backend's tile never occur. The guards are `const`
                // blocks, so their arms are not even instantiated (see [`height`]).
                $($keys if const { $keys <= S::TILE } => {
                    // A plain loop, not `array::from_fn` with a closure: the compiler left
                    // those as calls (3.5% of a d = 64 prefill, measured with perf).
                    let mut k: [&[f32]; $keys] = [&[]; $keys];
                    for (t, row) in k.iter_mut().enumerate() {
                        *row = keys.row(jj + t, d);
                    }
                    if width == 2 * S::LANES {
                        scores_tile::<S, $keys, 2>(s, k, qt, d, out, ld, factors, max)
                    } else {
                        scores_tile::<S, $keys, 1>(s, k, qt, d, out, ld, factors, max)
                    }
                })*
                _ => unreachable!("score tile of {n} keys"),
            }
        };
    }
    tiles!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// The dot products of the stacked `rows` (those of one kv head, at most `LANES / 2`; Q packed
/// as rows) with the block's `keys` in `of_block` (relative to the block), over those some of
/// the rows sees, with [`dot_tile`] into Sᵀ, or with [`Bf16Dot::dots`] for bf16 keys when
/// `paired` gives the instruction and Q's pair rows; `factors`: each key's score times its factor
/// (8-bit keys with per-key scales, indexed by key in the block). Returns the number of tiles
/// computed.
///
/// Its own entry point ([`ByChannels`]), compiled once per backend and row type, as
/// [`output_product`] is.
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
fn scores_by_channels<S: Simd, E: Lanes>(
    s: S,
    t: &Tiles,
    block: &Block,
    keys: Rows<'_, E>,
    range: (Range<usize>, Range<usize>),
    tile: &mut TileBuffers,
    next: Option<RowStream>,
    paired: Option<(Bf16Dot, &[f32])>,
    factors: Option<&[f32]>,
) -> u64 {
    s.run(ByChannels {
        t,
        block,
        keys,
        range,
        tile,
        next,
        paired,
        factors,
    })
}

/// [`scores_by_channels`]' operands.
struct ByChannels<'a, 'k, E> {
    t: &'a Tiles,
    block: &'a Block,
    keys: Rows<'k, E>,
    range: (Range<usize>, Range<usize>),
    tile: &'a mut TileBuffers,
    next: Option<RowStream>,
    paired: Option<(Bf16Dot, &'a [f32])>,
    factors: Option<&'a [f32]>,
}

impl<E: Lanes> Kernel for ByChannels<'_, '_, E> {
    type Output = u64;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> u64 {
        let ByChannels {
            t,
            block,
            keys,
            range,
            tile,
            next,
            paired,
            factors,
        } = self;
        dots_by_channels(s, t, block, keys, range, tile, next, paired, factors)
    }
}

/// The body of [`ByChannels`].
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
fn dots_by_channels<S: Simd, E: Lanes>(
    s: S,
    t: &Tiles,
    block: &Block,
    keys: Rows<'_, E>,
    (of_block, rows): (Range<usize>, Range<usize>),
    tile: &mut TileBuffers,
    next: Option<RowStream>,
    paired: Option<(Bf16Dot, &[f32])>,
    factors: Option<&[f32]>,
) -> u64 {
    let Some((lo, hi)) = union_range(
        &tile.lo[rows.clone()],
        &tile.hi[rows.clone()],
        block.j0 + of_block.start,
        block.j0 + of_block.end,
    ) else {
        return 0;
    };
    let range = (of_block.start + lo, of_block.start + hi);
    let st = &mut tile.st[rows.start..];
    if let Some((bf, qp)) = paired {
        if let Some(data) = E::as_bf16(keys.data()) {
            let d2 = t.d_k.div_ceil(2);
            let q = &qp[rows.start * d2..rows.end * d2];
            let keys = keys.retype(data);
            // (The same tiles as `dots`.)
            let shape = (t.d_k, rows.len(), dot_keys::<S>(rows.len()));
            let keys = Columns {
                rows: keys,
                col: 0,
                width: t.d_k,
            };
            return bf.dots(keys, range, q, shape, st, t.ld_s, next);
        }
    }
    let q = &tile.qt[rows.start * t.d_k..rows.end * t.d_k];
    macro_rules! rows {
        ($($rows:literal)*) => {
            match rows.len() {
                // (`const` guards: no tile for more rows, nor of other widths, is instantiated;
                // see [`height`].)
                $(
                    $rows if const { $rows <= S::LANES / 2 && dot_keys::<S>($rows) == 4 } => {
                        let out = (st, t.ld_s);
                        dots::<S, 4, $rows, E>(s, keys, range, q, t.d_k, out, next, factors)
                    }
                    $rows if const { $rows <= S::LANES / 2 } => {
                        let out = (st, t.ld_s);
                        dots::<S, 2, $rows, E>(s, keys, range, q, t.d_k, out, next, factors)
                    }
                )*
                n => unreachable!("{n} rows by channels"),
            }
        };
    }
    rows!(1 2 3 4 5 6 7 8)
}

/// Keys per [`dot_tile`] for `rows` rows on `S`: four, or two where four keys' accumulators
/// (`keys · rows`, at most the 16 of [`Simd::reduce_add16`]), key vectors and one query vector
/// would not fit the tile's register budget ([`fits_registers`]). AVX-512
/// takes four keys up to four rows, two beyond; AVX2 and the portable backend four up to two
/// rows, two for three or four. (Four keys for four rows on AVX2, 21 vectors for 16
/// registers, spilled five accumulators to the stack on every step: perf on a Zen 3,
/// 2026-12-04.)
const fn dot_keys<S: Simd>(rows: usize) -> usize {
    // Registers for four keys: their accumulators, the four key vectors and one query vector.
    let (accumulators, key_vecs, query_vecs) = (4 * rows, 4, 1);
    if accumulators <= 16 && fits_registers::<S>(accumulators + key_vecs + query_vecs) {
        4
    } else {
        2
    }
}

/// [`scores_by_channels`] for `ROWS` rows, `KEYS` keys per tile (then one at a time): row `r`
/// of key `jj` goes to `st[jj · ld_s + r]`, times `factors[jj]` if given.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn dots<S: Simd, const KEYS: usize, const ROWS: usize, E: Lanes>(
    s: S,
    keys: Rows<'_, E>,
    (plo, phi): (usize, usize),
    q: &[f32],
    d: usize,
    (st, ld_s): (&mut [f32], usize),
    next: Option<RowStream>,
    factors: Option<&[f32]>,
) -> u64 {
    // (Only 8-bit keys have factors: for the other types the tiles are compiled without.)
    let factors = factors.filter(|_| E::of_i8(&[]).is_some());
    let mut count = 0;
    let mut jj = plo;
    while jj + KEYS <= phi {
        if let Some(k) = &next {
            k.request(jj, KEYS);
        }
        let mut k: [&[E]; KEYS] = [&[]; KEYS];
        for (t, row) in k.iter_mut().enumerate() {
            *row = keys.row(jj + t, d);
        }
        let f = factors.map(|f| core::array::from_fn(|t| f[jj + t]));
        dot_tile::<S, KEYS, ROWS, E>(s, k, q, d, (&mut st[jj * ld_s..], ld_s), f);
        jj += KEYS;
        count += 1;
    }
    while jj < phi {
        if let Some(k) = &next {
            k.request(jj, 1);
        }
        let (k, f) = ([keys.row(jj, d)], factors.map(|f| [f[jj]]));
        dot_tile::<S, 1, ROWS, E>(s, k, q, d, (&mut st[jj * ld_s..], ld_s), f);
        jj += 1;
        count += 1;
    }
    count
}

/// Vectors per output column panel for a row group of `rows` rows: two (the tile of
/// [`crate::microkernel`]), or, for decode's few rows per head, four where the accumulators
/// still fit the tile's register budget (`rows · 4 + 4` vectors, [`fits_registers`]: up to 5 rows on
/// AVX-512, 2 on AVX2). Each V vector — loaded and, for half or 8-bit caches, converted once —
/// then feeds as many FMAs as before, but each broadcast of P and each loop step serves twice
/// the columns. (Measured with the prefetch streams of the same change, f16 decode at
/// n_kv = 16384, 1 thread: 0.49 → 0.55 of the read bandwidth, four alternated rounds; on its
/// own within this machine's noise.)
#[inline(always)]
fn panel_vecs<S: Simd>(rows: usize, by_channels: bool) -> usize {
    if by_channels && four_vecs_fit::<S>(rows) {
        4
    } else {
        2
    }
}

/// Whether `rows` rows' accumulators of four vectors each, and the four V vectors they share,
/// fit the tile's register budget ([`fits_registers`]).
const fn four_vecs_fit<S: Simd>(rows: usize) -> bool {
    fits_registers::<S>(rows * 4 + 4)
}

/// Whether a tile that keeps `vectors` vectors live at once fits `S`'s registers without
/// spilling: the budget of the prefill tile, `TILE × 2` accumulators, two loaded vectors and
/// the broadcast (AVX2: 6 · 2 + 2 + 1 = 15 of 16 registers, so 14 vectors here plus a
/// broadcast or a scratch one; AVX-512: 26 of 32). Decode's tiles ([`dot_keys`],
/// [`panel_vecs`]) are sized against it.
const fn fits_registers<S: Simd>(vectors: usize) -> bool {
    vectors <= 2 * S::TILE + 2
}

/// Whether [`output_rows`] instantiates the output tile `rows` high for rows of type `E` on
/// `S`: at most the backend's tile height and, for the types only decode reads
/// ([`Lanes::ANY_HEIGHT`]), at most its `LANES / 2` rows per kv head.
///
/// The match guards call it (and [`wide_height`]) in `const` blocks, which are evaluated per
/// backend and type before code generation, so the arms they rule out are neither instantiated
/// nor compiled. A guard of plain constants is folded only after every arm's tile has been
/// instantiated and handed to LLVM. (Measured 2026-12-03 with `--emit=llvm-ir
/// -C no-prepopulate-passes`, 16 codegen units: the output tile's copies 680 → 380, the
/// library's IR before optimization 2.29 → 1.87 M lines, a release build of the library
/// 219 → 206 s on a 2-core Zen 3.)
const fn height<S: Simd, E: Lanes>(rows: usize) -> bool {
    rows <= S::TILE && (E::ANY_HEIGHT || rows <= S::LANES / 2)
}

/// [`height`] for the tiles of three or four vectors of columns (decode: [`panel_vecs`]).
const fn wide_height<S: Simd, E: Lanes>(rows: usize) -> bool {
    four_vecs_fit::<S>(rows) && height::<S, E>(rows)
}

/// [`output_tile`] for `rows ≤ TILE` rows and `vecs` vectors of columns (one or two; three or
/// four where [`panel_vecs`] allows them).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn output_rows<S: Simd, E: Lanes>(
    s: S,
    rows: usize,
    vecs: usize,
    pt: &[f32],
    ld_p: usize,
    c: usize,
    v: &[E],
    ld_v: usize,
    alpha: &[f32],
    o: &mut [f32],
    ld_o: usize,
    next: Option<RowStream>,
) {
    macro_rules! tiles {
        ($($rows:literal)*) => {
            match (rows, vecs) {
                $(($rows, 2) if const { height::<S, E>($rows) } => {
                    output_tile::<S, $rows, 2, E>(s, pt, ld_p, c, v, ld_v, alpha, o, ld_o, next)
                })*
                $(($rows, 1) if const { height::<S, E>($rows) } => {
                    output_tile::<S, $rows, 1, E>(s, pt, ld_p, c, v, ld_v, alpha, o, ld_o, next)
                })*
                _ => wide!(1 2 3 4 5),
            }
        };
    }
    macro_rules! wide {
        ($($rows:literal)*) => {
            match (rows, vecs) {
                $(($rows, 4) if const { wide_height::<S, E>($rows) } => {
                    output_tile::<S, $rows, 4, E>(s, pt, ld_p, c, v, ld_v, alpha, o, ld_o, next)
                })*
                $(($rows, 3) if const { wide_height::<S, E>($rows) } => {
                    output_tile::<S, $rows, 3, E>(s, pt, ld_p, c, v, ld_v, alpha, o, ld_o, next)
                })*
                _ => unreachable!("output tile of {rows} rows × {vecs} vectors"),
            }
        };
    }
    tiles!(1 2 3 4 5 6 7 8 9 10 11 12)
}
