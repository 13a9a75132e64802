//! Which keys each row sees: the rows' visible ranges (causal, window, key length) set up
//! once per item, and per key block ([`Block`]) the keys some row of a group sees.

use super::work::{Ctx, Item, Tiles};
use crate::fused::kv::KvSource;
use crate::fused::scratch::TileBuffers;
use crate::simd::Simd;
use std::f32::consts::LOG2_E;

/// One key block `j0 .. j1` (absolute key indices).
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    pub(super) j0: usize,
    pub(super) j1: usize,
    /// Every row of the item sees every key of the block (by its causal/window/length range).
    pub(super) seen_by_all: bool,
}

impl Block {
    pub(super) fn len(&self) -> usize {
        self.j1 - self.j0
    }

    /// The keys of the block (relative to `j0`) that some of the rows with visible ranges
    /// `lo[r] .. hi[r]` sees ([`union_range`]), or `None` if none sees any. (Most blocks are
    /// seen whole by every row: then there is no range to find.)
    #[inline(always)]
    pub(super) fn seen_by(&self, lo: &[usize], hi: &[usize]) -> Option<(usize, usize)> {
        if self.seen_by_all {
            Some((0, self.len()))
        } else {
            union_range(lo, hi, self.j0, self.j1)
        }
    }
}

/// Each row's visible keys (causal, window, key length) inside the item's key range, the ALiBi
/// slopes, and the initial softmax state. Returns the union of the ranges, or `None` when no
/// row sees any key (the item's rows then stay at `l = 0`).
pub(super) fn visible_ranges(
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

/// Whether each of the item's `rows` sees every key of `block` by its causal/window/length
/// range.
pub(super) fn all_rows_see(tile: &TileBuffers, rows: usize, j0: usize, j1: usize) -> bool {
    let lo = tile.lo[..rows].iter().max().copied().unwrap_or(0);
    let hi = tile.hi[..rows].iter().min().copied().unwrap_or(0);
    lo <= j0 && j1 <= hi
}

/// The block keys `[plo, phi)` some row of the score panel starting at row `r0` sees
/// ([`Block::seen_by`] of its real rows; a panel starts below `t.rows`).
#[inline(always)]
pub(super) fn panel_keys<S: Simd>(
    t: &Tiles,
    block: &Block,
    r0: usize,
    tile: &TileBuffers,
) -> Option<(usize, usize)> {
    let real = r0.min(t.rows)..(r0 + 2 * S::LANES).min(t.rows);
    block.seen_by(&tile.lo[real.clone()], &tile.hi[real])
}

/// The union `[lo, hi)` of the rows' visible ranges intersected with `[j0, j1)`, relative to
/// `j0`; `None` if no row sees a key of the block.
#[inline(always)]
pub(super) fn union_range(
    lo: &[usize],
    hi: &[usize],
    j0: usize,
    j1: usize,
) -> Option<(usize, usize)> {
    let mut u = (usize::MAX, 0);
    for (&l, &h) in lo.iter().zip(hi) {
        let (l, h) = (l.max(j0), h.min(j1));
        if l < h {
            u = (u.0.min(l), u.1.max(h));
        }
    }
    (u.0 < u.1).then(|| (u.0 - j0, u.1 - j0))
}
