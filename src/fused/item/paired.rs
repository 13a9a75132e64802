//! bf16 products' glue: V rows and K rows paired by keys for `vdpbf16ps`, and the output
//! product on pairs (prefill's packed pairs, decode's rows in place).

use super::ranges::Block;
use super::shapes::panel_vecs;
use super::work::Tiles;
use crate::fused::kv::{KeyRange, KvSource, Rows};
use crate::fused::scratch::{PairBuffers, TileBuffers};
use crate::microkernel::dpbf16::{
    Bf16Dot, KeyRows, PairKeys, Pairable, PANEL as PAIR_PANEL, TILE as PAIR_TILE,
};
use crate::simd::{RowStream, Simd};
use half::bf16;
use std::ops::Range;

/// [`output_product`] with bf16 dot products, the block's V rows and Pᵀ already paired by keys
/// (`⌈c / 2⌉` pairs, a zero key after an odd count: [`pair_values`] into `pairs.v`,
/// [`softmax_update`] into `pairs.p`): each row group takes the pairs that hold its visible keys.
/// A pair's other key is then one no row of the group sees: its weight is 0, and its value
/// finite (a block whose keys some row does not see has its non-finite value rows set aside by
/// [`load_values`], or is not read in place), so it adds exactly nothing.
pub(super) fn pair_output_product(
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
pub(super) struct Columns<'s> {
    pub(super) rows: Rows<'s, bf16>,
    pub(super) col: usize,
    pub(super) width: usize,
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
pub(super) fn pair_values<E: Pairable>(
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
pub(super) fn pair_keys<'s, S: Simd, KV: KvSource>(
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

/// [`output_product`] with bf16 dot products for decode's bf16 V rows read in place
/// ([`Bf16Dot::output_in_place`]), the weights already paired ([`softmax_update`] into
/// `p_pairs`): one row group (a kv head's rows are at most `LANES / 2`), panels as wide as
/// [`panel_vecs`] allows. The rows are found one by one ([`Rows::row`]), not by runs of
/// adjacent rows as in [`row_groups`]: a pair split between two pages is then still one pair,
/// so a paged cache gives the same sums as a dense one.
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
pub(super) fn pair_values_in_place<S: Simd>(
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
