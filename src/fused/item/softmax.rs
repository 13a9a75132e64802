//! The online softmax over one key block: running max, rescale factor, weights in place of
//! the scores, row sums; for bf16 products the weights also rounded and paired by keys.

use super::ranges::Block;
use super::work::Tiles;
use crate::fused::scratch::TileBuffers;
use crate::microkernel::dpbf16::Bf16Dot;
use crate::simd::{exp2, Kernel, Simd};

/// The online softmax over one block, one query row per lane: new running max, rescale factor
/// `α = 2^(m − m')`, weights `P = 2^(S − m')` in place of the scores, `l ← α·l + ΣP`. The
/// block's maximum per row is the score tiles' (`known_max`) or found by a pass over Sᵀ.
///
/// With `pairs` (bf16 products) the weights are also rounded to bf16 and paired by keys as
/// they are computed, Pᵀ's layout for the output tiles: pair `jp` at `p[jp · ld_s ..]` holds
/// each row's weights of keys `2jp` and `2jp + 1` (0 past the block's end), the words
/// [`Bf16Dot::interleave`] would write from Sᵀ's rows, with no second pass over Sᵀ. (The f32
/// weights stay in Sᵀ for the value rows set aside as non-finite.) The sums run in key order
/// either way.
///
/// With `factors` (laid out like Sᵀ: [`spread_factors`]) each weight is stored times its
/// factor, while `l` sums the weights themselves: 8-bit values in place with a scale per key,
/// `Σ_j (p_j·s_j)·v_j`, in the same pass.
#[inline(always)]
pub(super) fn softmax_update<S: Simd>(
    s: S,
    t: &Tiles,
    block: &Block,
    known_max: bool,
    tile: &mut TileBuffers,
    mut pairs: Option<(Bf16Dot, &mut [f32])>,
    factors: Option<&[f32]>,
) {
    let c = block.len();
    for r0 in (0..t.ld_s).step_by(S::LANES) {
        let mut mx = s.splat(f32::NEG_INFINITY);
        if known_max {
            mx = s.load(&tile.block_max[r0..]);
        } else {
            for jj in 0..c {
                mx = s.max(mx, s.load(&tile.st[jj * t.ld_s + r0..]));
            }
        }
        let m_old = s.load(&tile.m[r0..]);
        let m_new = s.max(s.splat(-f32::MAX), s.max(m_old, mx));
        let alpha = exp2(s, s.sub(m_old, m_new));
        let mut sum = s.splat(0.0);
        let st = &mut tile.st[r0..];
        match (&mut pairs, factors) {
            (None, None) => {
                for jj in 0..c {
                    sum = s.add(sum, weights(s, &mut st[jj * t.ld_s..], m_new, None));
                }
            }
            (None, Some(f)) => {
                let f = &f[r0..];
                for jj in 0..c {
                    let (x, fj) = (&mut st[jj * t.ld_s..], &f[jj * t.ld_s..]);
                    sum = s.add(sum, weights(s, x, m_new, Some(fj)));
                }
            }
            (Some((bf, p)), _) => {
                debug_assert!(factors.is_none(), "bf16 products of 8-bit values");
                for jp in 0..c.div_ceil(2) {
                    let a = weights(s, &mut st[2 * jp * t.ld_s..], m_new, None);
                    sum = s.add(sum, a);
                    let mut b = s.splat(0.0);
                    if 2 * jp + 1 < c {
                        b = weights(s, &mut st[(2 * jp + 1) * t.ld_s..], m_new, None);
                        sum = s.add(sum, b);
                    }
                    s.pair_bf16(*bf, a, b, &mut p[jp * t.ld_s + r0..]);
                }
            }
        }
        let l = s.mul_add(s.load(&tile.l[r0..]), alpha, sum);
        s.store(&mut tile.l[r0..], l);
        s.store(&mut tile.m[r0..], m_new);
        s.store(&mut tile.alpha[r0..], alpha);
    }
}

/// One key's weights `p = 2^(x − m')` of a lane group of rows, written over its scores `x`
/// (the first `LANES` values of `st`), times `factor` (its first `LANES`) if given; returns
/// `p` unscaled, the term of the row sums. (A function, not a closure: a closure is compiled
/// without the entry point's target features, and its vector operations become calls. The
/// factor is loaded after the exponential: loaded before it, i8 decode ran 3% slower.)
#[inline(always)]
pub(super) fn weights<S: Simd>(s: S, st: &mut [f32], m_new: S::V, factor: Option<&[f32]>) -> S::V {
    let x = &mut st[..S::LANES];
    let p = exp2(s, s.sub(s.load(x), m_new));
    match factor {
        Some(f) => s.store(x, s.mul(p, s.load(f))),
        None => s.store(x, p),
    }
    p
}

/// [`softmax_update`] with the weights paired for bf16 products, run through
/// [`Bf16Dot::run`]'s entry point (the conversion needs its features).
pub(super) struct PairedSoftmax<'a> {
    pub(super) t: &'a Tiles,
    pub(super) block: &'a Block,
    pub(super) known_max: bool,
    pub(super) tile: &'a mut TileBuffers,
    pub(super) bf: Bf16Dot,
    pub(super) p: &'a mut [f32],
}

impl Kernel for PairedSoftmax<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let pairs = Some((self.bf, self.p));
        softmax_update(
            s,
            self.t,
            self.block,
            self.known_max,
            self.tile,
            pairs,
            None,
        );
    }
}
