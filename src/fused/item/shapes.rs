//! Tile shapes the register budget allows on each backend, and which heights of the output
//! tile are compiled for each row type (`const` guards, so other arms are never instantiated).

use crate::simd::{Lanes, Simd};

/// Keys per [`dot_tile`] for `rows` rows on `S`: four, or two where four keys' accumulators
/// (`keys · rows`, at most the 16 of [`Simd::reduce_add16`]), key vectors and one query vector
/// would not fit the tile's register budget ([`fits_registers`]). AVX-512
/// takes four keys up to four rows, two beyond; AVX2 and the portable backend four up to two
/// rows, two for three or four. (Four keys for four rows on AVX2, 21 vectors for 16
/// registers, spilled five accumulators to the stack on every step: perf on a Zen 3,
/// 2026-12-04.)
pub(super) const fn dot_keys<S: Simd>(rows: usize) -> usize {
    // Registers for four keys: their accumulators, the four key vectors and one query vector.
    let (accumulators, key_vecs, query_vecs) = (4 * rows, 4, 1);
    if accumulators <= 16 && fits_registers::<S>(accumulators + key_vecs + query_vecs) {
        4
    } else {
        2
    }
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
pub(super) fn panel_vecs<S: Simd>(rows: usize, by_channels: bool) -> usize {
    if by_channels && four_vecs_fit::<S>(rows) {
        4
    } else {
        2
    }
}

/// Whether `rows` rows' accumulators of four vectors each, and the four V vectors they share,
/// fit the tile's register budget ([`fits_registers`]).
pub(super) const fn four_vecs_fit<S: Simd>(rows: usize) -> bool {
    fits_registers::<S>(rows * 4 + 4)
}

/// Whether a tile that keeps `vectors` vectors live at once fits `S`'s registers without
/// spilling: the budget of the prefill tile, `TILE × 2` accumulators, two loaded vectors and
/// the broadcast (AVX2: 6 · 2 + 2 + 1 = 15 of 16 registers, so 14 vectors here plus a
/// broadcast or a scratch one; AVX-512: 26 of 32). Decode's tiles ([`dot_keys`],
/// [`panel_vecs`]) are sized against it.
pub(super) const fn fits_registers<S: Simd>(vectors: usize) -> bool {
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
pub(super) const fn height<S: Simd, E: Lanes>(rows: usize) -> bool {
    rows <= S::TILE && (E::ANY_HEIGHT || rows <= S::LANES / 2)
}

/// [`height`] for the tiles of three or four vectors of columns (decode: [`panel_vecs`]).
pub(super) const fn wide_height<S: Simd, E: Lanes>(rows: usize) -> bool {
    four_vecs_fit::<S>(rows) && height::<S, E>(rows)
}
