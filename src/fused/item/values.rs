//! V rows holding NaN or ±∞: found when a block is loaded, zeroed in a packed copy, and added
//! back only to the rows that see their key, so that a non-finite value reaches exactly those.

use super::work::{Ctx, Item, Tiles};
use crate::fused::kv::{KeyRange, KvSource, Rows};
use crate::fused::scratch::TileBuffers;
use crate::simd::{Lanes, Simd};
use std::ops::Range;

/// The V rows of the block as `d_vp`-wide rows. A row holding NaN or ±∞ must reach only the
/// query rows that see its key, but the output tile multiplies every row of a tile with every
/// key of its range (`0 · NaN = NaN`): such rows are listed in `non_finite`, zeroed in a packed
/// copy, and added back by [`add_non_finite_values`]. The check is one vector pass over the
/// block (a sum of `v − v`, NaN iff some value is not finite), per-row only when it fires.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_values<'s, S: Simd>(
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

/// Lists the rows among the first `len` with a NaN or ±∞ in their first `width` values.
pub(super) fn find_non_finite(rows: Rows<'_>, len: usize, width: usize, out: &mut Vec<usize>) {
    for j in 0..len {
        if rows.row(j, width).iter().any(|x| !x.is_finite()) {
            out.push(j);
        }
    }
}

/// Whether the first `len` rows (`width` values each, a multiple of the lanes) are all finite.
#[inline(always)]
pub(super) fn all_finite<S: Simd, E: Lanes>(
    s: S,
    rows: Rows<'_, E>,
    len: usize,
    width: usize,
) -> bool {
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

/// Adds `p_ij · v_j` for the value rows [`load_values`] set aside (NaN or ±∞ entries) to the
/// rows that see key `j` (its causal/window/length range and the boolean mask; a `−∞` bias
/// leaves the key seen with weight 0, so `0 · NaN` reaches the row, as in the reference).
#[allow(clippy::too_many_arguments)]
pub(super) fn add_non_finite_values<S: Simd>(
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
