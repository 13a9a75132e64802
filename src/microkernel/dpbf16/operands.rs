//! The operands of the bf16 tiles: their sizes ([`PANEL`], [`TILE`]) and the rows they read
//! ([`KeyRows`], [`PairKeys`], [`Pairable`]).

use crate::simd::Bf16Dot;

/// Where the bf16 K or V rows that decode's kernels read as stored lie: `row(j)` is key `j`'s
/// row (at least as long as the kernel reads). Its implementations are `#[inline(always)]`, so
/// that finding a row compiles into the kernel's loop: a call there would make the compiler
/// spill the register tile around it. (Off x86-64 nothing reads rows through it.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) trait KeyRows {
    /// Key `j`'s row.
    fn row(&self, j: usize) -> &[half::bf16];
}

/// K rows of channel pairs as [`Bf16Dot::scores_panel`] reads them, a 32-bit pair at a time
/// (off x86-64 nothing reads them).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum PairKeys<'a> {
    /// Rows of pair words ([`Bf16Dot::pair_row`]), row `j` at `[j · ld ..]`.
    Words(&'a [f32], usize),
    /// bf16 rows as stored, row `j` at `[j · ld ..]`, with `ld` and the head size even: then
    /// pair `p` of a row is its values `2p` and `2p + 1`, one 32-bit word (read unaligned).
    Bf16(&'a [half::bf16], usize),
}

/// Rows that the pairing kernels take: f32 values, rounded to bf16 ([`Bf16Dot::pair_row`],
/// [`Bf16Dot::interleave`]), or values that are bf16 already, copied as stored
/// ([`Bf16Dot::pair_bf16_row`], [`Bf16Dot::interleave_bf16`]).
pub(crate) trait Pairable: Sized {
    /// `x` as a row of channel pairs into `dst[.. ⌈x.len() / 2⌉]`.
    fn pair_row(bf: Bf16Dot, x: &[Self], dst: &mut [f32]);
    /// Rows `a` and `b` (zeros if `None`) interleaved channel by channel into `dst`.
    fn interleave(bf: Bf16Dot, a: &[Self], b: Option<&[Self]>, dst: &mut [f32]);
}

impl Pairable for f32 {
    #[inline(always)]
    fn pair_row(bf: Bf16Dot, x: &[f32], dst: &mut [f32]) {
        bf.pair_row(x, dst);
    }
    #[inline(always)]
    fn interleave(bf: Bf16Dot, a: &[f32], b: Option<&[f32]>, dst: &mut [f32]) {
        bf.interleave(a, b, dst);
    }
}

impl Pairable for half::bf16 {
    #[inline(always)]
    fn pair_row(bf: Bf16Dot, x: &[Self], dst: &mut [f32]) {
        bf.pair_bf16_row(x, dst);
    }
    #[inline(always)]
    fn interleave(bf: Bf16Dot, a: &[Self], b: Option<&[Self]>, dst: &mut [f32]) {
        bf.interleave_bf16(a, b, dst);
    }
}

/// Rows per score panel and per output row group: two vectors of 16 lanes, and the tile
/// height (the AVX-512 backend's geometry, which this path runs under).
pub(crate) const PANEL: usize = 32;
/// Keys per score tile and rows per output tile.
pub(crate) const TILE: usize = 12;
