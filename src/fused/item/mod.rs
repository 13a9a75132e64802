//! One work item of the fused kernel: a block of stacked query rows streamed against its key
//! blocks with the online softmax (FlashAttention-2's forward loop; the algorithm is in the
//! crate docs), as a sequence of named stages.
//!
//! ```text
//! stage                        what                                            module
//! pack_queries                 Qᵀ panels, once per item                        queries
//! visible_ranges               each row's visible keys [lo, hi);               ranges
//!                              m = −MAX, l = 0, O = 0
//! plan_int_rows                8-bit K/V: in place, scales folded or per key   int_rows
//! for each key block:                                                          (block_loop, here)
//!     kv.keys                  K rows, in place or converted                   fused::kv
//!     scores / head_scores     Sᵀ = K·Qᵀ · scale·log₂e, softcap, ALiBi —       scores, modifiers
//!                              panel by panel (prefill), by channels (decode)
//!     bias_and_masks           + bias; −∞ for keys a row does not see          modifiers
//!     softmax_update           m' = max(m, rowmax S); P = 2^(S − m');          softmax
//!                              l = α·l + ΣP (bf16 products: P also rounded
//!                              and paired by keys)
//!     load_values              V rows, in place or converted; rows holding     values
//!                              NaN/±∞ set aside
//!     output_product           O = α ⊙ O + P·V                                 output, paired
//!     add_non_finite_values    P·v for the set-aside rows, only to the rows    values
//!                              that see them
//! ```
//!
//! With bf16 products on AMX tiles (prefill, [`Blocking::tiles`](crate::fused::blocking::Blocking::tiles))
//! the block loop is [`tiled`]'s: the same stages, both products on tiles.
//!
//! [`work`] holds what the stages share (the item, its tile geometry), [`shapes`] the tile
//! shapes each backend's registers allow. Every stage is generic over the backend's lanes;
//! only [`queries`] knows Q's type, and the block loop is compiled once per backend and K/V
//! source.
//!
//! Scores live in the log2 domain: right after the dot products they are multiplied by `scale`
//! and `log₂e`, so `exp(s − m)` becomes `2^(s' − m')` and every later step (softcap, ALiBi,
//! bias, max, exponent) works on `s' = s·log₂e`. The running max `m` starts at `−f32::MAX`
//! instead of `−∞` and never goes below it, so `s − m` is `−∞` (weight exactly 0) for masked
//! scores and never `−∞ − (−∞) = NaN`, with no branch.

mod int_rows;
mod modifiers;
mod output;
mod paired;
mod queries;
mod ranges;
mod scores;
mod shapes;
mod softmax;
mod tiled;
mod values;
mod work;

use crate::fused::blocking::TILE_COLUMNS;
use crate::fused::kv::{KeyRange, KvSource};
use crate::fused::scratch::{KvBuffers, Scratch};
use crate::simd::{Kernel, Simd};
use crate::tensor::AnyTensor;
use half::{bf16, f16};
use int_rows::{plan_int_rows, scale_rows_by_channels, spread_factors};
use modifiers::{alibi_distances, bias_and_masks, modify_scores};
use output::output_product;
use paired::{pair_keys, pair_output_product, pair_values, pair_values_in_place};
use queries::{pack_queries, pair_queries};
use ranges::{all_rows_see, panel_keys, visible_ranges, Block};
use scores::{head_scores, scores, BlockKeys};
use softmax::{softmax_update, PairedSoftmax};
use tiled::TiledLoop;
use values::{add_non_finite_values, all_finite, load_values};
use work::{next_block, IntRows, Tiles};
pub(crate) use work::{Ctx, Item};

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
    // On AMX tiles Sᵀ's rows are whole tiles of 16 columns (a whole number of vectors).
    let columns = if bl.tiles.is_some() {
        TILE_COLUMNS
    } else {
        S::LANES
    };
    let mut t = Tiles {
        rows,
        ld_s: rows.div_ceil(columns) * columns,
        d_k: cx.problem.d_k,
        d_v: cx.problem.d_v,
        d_vp: bl.d_v_pad,
        by_channels: bl.by_channels(),
        int_keys: IntRows::Dequantized,
        int_values: IntRows::Dequantized,
    };
    pack_queries(s, cx, q, item, &t, &mut sc.tile.qt);
    if let (Some(bf), None) = (bl.pairs, bl.tiles) {
        pair_queries(bf, &t, &sc.tile.qt, &mut sc.pairs.qt);
    }
    let Some((first, last)) = visible_ranges(cx, item, &t, &mut sc.tile) else {
        return;
    };
    // bf16 products on AMX tiles (prefill; bf16 K/V, which the constant keeps the other
    // sources' kernels free of). The unit releases the tiles when the item ends.
    if let (Some(engine), true) = (bl.tiles, KV::BF16) {
        let keys = (first, last);
        let unit = &mut engine.unit();
        TiledLoop {
            cx,
            item,
            t,
            keys,
            sc,
            unit,
        }
        .start(s);
        return;
    }
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
