//! The score modifiers in their documented order: scale, softcap, ALiBi (element-wise, while
//! a panel is in L1), then the caller's bias and the masks (`−∞` for keys a row does not see).
//! The one place a new score option goes.

use super::ranges::Block;
use super::work::{Ctx, Item, Tiles};
use crate::fused::kv::KvSource;
use crate::fused::scratch::TileBuffers;
use crate::simd::{exp2, Simd};
use std::f32::consts::LOG2_E;

/// With ALiBi: the distance of each row's diagonal to the block's first key, computed exactly
/// in integers and rounded once (exact below 2²⁴), so positions past 2²⁴ lose nothing.
pub(super) fn alibi_distances(
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
pub(super) fn modify_scores<S: Simd>(
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
pub(super) fn bias_and_masks(
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

/// Soft-capping in the log2 domain: for a score `x = s·log₂e`, returns `cap·log₂e·tanh(s/cap)`,
/// with `tanh(y) = (e^{2y} − 1)/(e^{2y} + 1)` and `e^{2y} = 2^{x·2/cap}`. The clamped `2^x` keeps
/// it finite for any input (±∞ scores map to ±cap), NaN stays NaN; near 0 the subtraction
/// costs absolute (not relative) accuracy, ~1e-7 · cap, which the error bound accounts for.
/// (`2/cap` and `cap·log₂e` are finite: validation requires a normal cap with finite
/// `cap·log₂e`.)
#[inline(always)]
pub(super) fn softcap<S: Simd>(s: S, x: S::V, cap: f32) -> S::V {
    let e = exp2(s, s.mul(x, s.splat(2.0 / cap)));
    let one = s.splat(1.0);
    let t = s.div(s.sub(e, one), s.add(e, one));
    s.mul(t, s.splat(cap * LOG2_E))
}
