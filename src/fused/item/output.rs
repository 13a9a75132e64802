//! The output product `O = α ⊙ O + P·V` over a block's V rows of any row type, column
//! panels outside and row groups of the tile height inside, as its own entry point per
//! backend and row type.

use super::ranges::Block;
use super::shapes::{height, panel_vecs, wide_height};
use super::work::Tiles;
use crate::fused::kv::Rows;
use crate::fused::scratch::TileBuffers;
use crate::microkernel::output_tile;
use crate::simd::{Kernel, Lanes, RowStream, Simd};
use std::ops::Range;

/// The rescale factor of every accumulator after a block's first run of V rows.
pub(super) const ONES: [f32; 16] = [1.0; 16];

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
pub(super) fn output_product<S: Simd, E: Lanes>(
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
pub(super) struct OutputProduct<'a, 'v, E> {
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
pub(super) fn output_panels<S: Simd, E: Lanes>(
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
pub(super) fn copy_panel<S: Simd, E: Lanes>(
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
pub(super) fn row_groups<S: Simd, E: Lanes>(
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

/// [`output_tile`] for `rows ≤ TILE` rows and `vecs` vectors of columns (one or two; three or
/// four where [`panel_vecs`] allows them).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn output_rows<S: Simd, E: Lanes>(
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
