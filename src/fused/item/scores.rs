//! Scores, `Sᵀ = K·Qᵀ` scaled into the log2 domain: prefill's transposed panels
//! ([`PanelScores`]) and decode's dot products with channels along the lanes
//! ([`ByChannels`]), each its own entry point per backend.

use super::modifiers::{alibi_distances, modify_scores};
use super::paired::Columns;
use super::ranges::{panel_keys, union_range, Block};
use super::shapes::dot_keys;
use super::work::{next_block, Ctx, IntRows, Item, Tiles};
use crate::fused::kv::{KeyRange, KvSource, Rows};
use crate::fused::scratch::TileBuffers;
use crate::microkernel::dpbf16::{Bf16Dot, PairKeys};
use crate::microkernel::{dot_tile, scores_tile};
use crate::simd::{Kernel, Lanes, RowStream, Simd};
use std::f32::consts::LOG2_E;
use std::ops::Range;

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
pub(super) fn head_scores<S: Simd, E: Lanes, KV: KvSource>(
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

/// `Sᵀ = K · Qᵀ` panel by panel, only over the keys some row of the panel sees, scaled into the
/// log2 domain and each row's block maximum taken by the tiles, then while the panel is in L1
/// its other element-wise modifiers ([`modify_scores`]), if any. Returns the number of score
/// tiles computed.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn scores<S: Simd>(
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
pub(super) struct PanelScores<'a> {
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

/// Keys per pass over all the heads of a decode item (16 keys × 8 heads × 512 B: 64 KiB of a
/// token-major f32 cache, read in address order).
pub(super) const KEY_TILE: usize = 16;

/// The K rows of a block as [`scores`] takes them: f32 rows, or rows of bf16 channel pairs
/// ([`pair_keys`]) for the bf16 dot products.
#[derive(Clone, Copy)]
pub(super) enum BlockKeys<'s> {
    F32(Rows<'s>),
    Paired(Bf16Dot, PairKeys<'s>),
}

/// Scores of `n ≤ TILE` keys starting at block key `jj` against one panel of `width` (one or
/// two vectors) rows, into `out` at stride `ld`, times `factors`, the rows' maxima into `max`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn score_keys<S: Simd>(
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
pub(super) fn scores_by_channels<S: Simd, E: Lanes>(
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
pub(super) struct ByChannels<'a, 'k, E> {
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
pub(super) fn dots_by_channels<S: Simd, E: Lanes>(
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

/// [`scores_by_channels`] for `ROWS` rows, `KEYS` keys per tile (then one at a time): row `r`
/// of key `jj` goes to `st[jj · ld_s + r]`, times `factors[jj]` if given.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dots<S: Simd, const KEYS: usize, const ROWS: usize, E: Lanes>(
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
