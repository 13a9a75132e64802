//! bf16 dot products (AVX512_BF16): the two tile products of the fused kernel on bf16 operands
//! with f32 accumulation, for [`Options::bf16_products`](crate::Options::bf16_products) (bf16 Q
//! and K/V, whose values convert exactly; the softmax weights are rounded).
//!
//! `vdpbf16ps` multiplies two pairs of bf16 values and adds both products to one f32 lane,
//! `acc += a.lo · b.lo + a.hi · b.hi`: twice the multiply-adds of an f32 FMA per instruction
//! (`bench --peak` measures both rates). The tiles keep the f32 kernel's shape (12 keys or rows
//! × 2 vectors of 16 lanes, see [`crate::microkernel`]) and take the reduction dimension two at
//! a time, so each operand holds a *pair* per 32-bit lane:
//! * scores, `Sᵀ = K · Qᵀ`: Qᵀ panels hold, per pair of channels `(2p, 2p + 1)`, each query
//!   row's two channels in its lane ([`Bf16Dot::interleave`] of the f32 panel's steps `2p` and
//!   `2p + 1`); a K row rounded to bf16 *is* a row of channel pairs ([`Bf16Dot::pair_row`]),
//!   broadcast one 32-bit pair at a time, and a bf16 row is read where it is stored
//!   ([`PairKeys`]).
//! * output, `O = α ⊙ O + P · V`: Pᵀ with the weights of keys `(2j, 2j + 1)` of a row in its
//!   lane (rounded and paired as the softmax writes them, [`Bf16Dot::pair_vectors`]),
//!   broadcast; V with rows `2j` and `2j + 1` interleaved channel by channel (bf16 rows from
//!   their words as stored, [`Pairable`]).
//!
//! Decode (few query rows per kv head, channels along the lanes) has its own two kernels, which
//! read the cache's bf16 rows as stored ([`KeyRows`]):
//! * [`Bf16Dot::dots`]: the f32 dot tile's shape (up to four keys × the rows, one accumulator
//!   each, summed across lanes at the end) with a K row's 32 channels loaded as the 16 pairs
//!   they already are, against Q rows by channel pairs ([`Bf16Dot::pair_row`]).
//! * [`Bf16Dot::output_in_place`]: V rows `2j` and `2j + 1` loaded as stored and interleaved by
//!   `vpunpck{l,h}wd`, which pairs words only inside 128-bit blocks (one cheap instruction each,
//!   against a cross-lane permute). The accumulators then hold the channels in that order; O is
//!   permuted into it when a panel starts and back when it ends.
//!
//! Per key and kv head of four rows at d = 128 that is 16 `vdpbf16ps` for the scores and 16
//! for the output, against 32 FMAs each on f32 lanes plus every K and V vector's conversion.
//!
//! Every rounding to bf16 is the instruction's: to nearest, ties to even, NaN kept, and bf16
//! subnormals flushed to zero (on input and output, whatever MXCSR says); the products of two
//! bf16 values are exact in f32 unless they underflow (flushed too). The error bound
//! (`reference::error_bounds`) counts all of it.
//!
//! [`Bf16Dot`] proves that the CPU has AVX-512F, BW, VL and BF16. Each public method is one
//! `#[target_feature]` function that does a whole panel's (or a block's) work, so the call
//! costs nothing against the tiles it runs, with one exception: [`Bf16Dot::pair_vectors`]
//! rounds and pairs two vectors of weights inside the softmax loop, which runs through
//! [`Bf16Dot::run`]'s entry point so that the conversion compiles into the loop.
//!
//! The token itself, its entry point [`Bf16Dot::run`] and [`Bf16Dot::pair_vectors`] belong
//! to the lanes (`src/simd/tokens.rs`, `src/simd/bf16.rs`:
//! [`Simd::pair_bf16`](crate::simd::Simd::pair_bf16) takes the token); its tile methods are
//! here, by concern: `operands.rs` (the tile sizes and the rows the tiles read), `pair.rs`
//! (pair conversions), `prefill.rs` (score panels and output tiles), `decode.rs` (dot tiles and
//! the output on V rows as stored), and off x86-64 `stub.rs`.

#[cfg(target_arch = "x86_64")]
mod decode;
mod operands;
#[cfg(target_arch = "x86_64")]
mod pair;
#[cfg(target_arch = "x86_64")]
mod prefill;
#[cfg(not(target_arch = "x86_64"))]
mod stub;

pub(crate) use crate::simd::Bf16Dot;
pub(crate) use operands::{KeyRows, PairKeys, Pairable, PANEL, TILE};

use crate::simd::{backend, geometry, Backend};
use std::sync::OnceLock;

/// The bf16 dot-product kernels, where [`Options::bf16_products`](crate::Options::bf16_products)
/// can use them: the CPU has AVX512_BF16 and the process runs the AVX-512 backend (whose tile
/// geometry they share). Decided once and cached, like the backend.
pub(crate) fn bf16_dot() -> Option<Bf16Dot> {
    static CHOICE: OnceLock<Option<Bf16Dot>> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let geometry = geometry();
        let fits = geometry.lanes == 16 && geometry.tile == TILE;
        if fits && backend() == Backend::Avx512 {
            Bf16Dot::detect()
        } else {
            None
        }
    })
}

/// Whether [`Options::bf16_products`](crate::Options::bf16_products) takes effect in this
/// process (for bf16 Q and K/V): the CPU has bf16 dot products (AVX512_BF16, with
/// AVX-512F/BW/VL) and the AVX-512 backend runs (not forced to another with `SDPA_BACKEND`).
pub fn bf16_products_available() -> bool {
    bf16_dot().is_some()
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
