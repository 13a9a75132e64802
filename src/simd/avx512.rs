//! AVX-512F lanes from `core::arch`, usable only through a token that proves the CPU has them
//! ([`Avx512`], from `tokens.rs`).
//!
//! The entry point enables AVX-512VL too (every AVX-512 server and desktop CPU since Skylake-X
//! has it; only the Xeon Phi lacked it, and gets the AVX2 backend): the kernels use no VL
//! intrinsic, but without VL the 256-bit loads feeding the f16/bf16 conversions can only use
//! registers 0–15, and the compiler then kept a 4 × 4 dot tile's accumulators in registers
//! 0–16 as well, spilling five of them to the stack on every step of its loop (zmm17–31 unused).

use super::lanes::{Kernel, Simd};
use super::tokens::{Avx512, Bf16Dot};
use core::arch::x86_64::*;
use half::{bf16, f16};

/// The entry point that gives the kernel body AVX-512 code generation. `Kernel::run` and
/// everything it calls are `#[inline(always)]`, so they are compiled here with the feature on.
// Never inlined: each kernel is its own function, so that the compiler cannot hoist one
// stage's loop-invariant vectors (constants, splats) into another stage's register tile.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512vl")]
fn run_with_features<K: Kernel>(simd: Avx512, kernel: K) -> K::Output {
    kernel.run(simd)
}

/// Runs `kernel` with AVX-512F (+ VL) code generation.
#[inline]
pub(crate) fn run<K: Kernel>(simd: Avx512, kernel: K) -> K::Output {
    // SAFETY: an `Avx512` value exists only if `detect` found both features on this CPU.
    unsafe { run_with_features(simd, kernel) }
}

// SAFETY (for every `unsafe` block below): the intrinsics need AVX-512F, which the existence of
// `self: Avx512` proves; loads and stores go through slices whose length is checked first.
impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    const TILE: usize = 12;

    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> __m512 {
        let s = &s[..16];
        // SAFETY: 16 readable f32s (checked above); unaligned load.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: __m512) {
        let s = &mut s[..16];
        // SAFETY: 16 writable f32s (checked above); unaligned store.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn abs(self, a: __m512) -> __m512 {
        unsafe { _mm512_abs_ps(a) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // vmaxps returns its second source operand when either is NaN.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    fn floor(self, a: __m512) -> __m512 {
        // Round toward −∞ (1), exceptions suppressed (8).
        unsafe { _mm512_roundscale_ps::<0x09>(a) }
    }
    #[inline(always)]
    fn pow2i(self, n: __m512) -> __m512 {
        // (n + 127) << 23 is the IEEE-754 bit pattern of 2^n; n = −127 gives +0.0.
        unsafe {
            let biased = _mm512_cvtps_epi32(_mm512_add_ps(n, _mm512_set1_ps(127.0)));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(biased))
        }
    }
    #[inline(always)]
    fn run<K: Kernel>(self, kernel: K) -> K::Output {
        run(self, kernel)
    }
    #[inline(always)]
    fn reduce_add(self, a: __m512) -> f32 {
        unsafe { _mm512_reduce_add_ps(a) }
    }
    #[inline(always)]
    fn reduce_add16(self, v: [__m512; 16], _live: usize) -> [f32; 16] {
        // (All 16 at once: the halving steps cost the same for fewer live vectors.)
        // Four halving steps, each adding two vectors' halves into one vector: 256-bit halves,
        // 128-bit blocks, then pairs and single lanes inside the blocks. Fed `w[4j + k] =
        // v[4k + j]`, lane `4k + j` of the result holds the sum of `w[4j + k]`, that is of
        // `v[4k + j]`: the sums come out in order, with no permutation after the adds.
        let mut w = v;
        for (i, wi) in w.iter_mut().enumerate() {
            *wi = v[4 * (i % 4) + i / 4];
        }
        let mut out = [0.0f32; 16];
        unsafe {
            let mut c = [_mm512_setzero_ps(); 8];
            for (i, ci) in c.iter_mut().enumerate() {
                let (a, b) = (w[2 * i], w[2 * i + 1]);
                // [a.0, a.1, b.0, b.1] + [a.2, a.3, b.2, b.3] (128-bit blocks).
                *ci = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x44>(a, b),
                    _mm512_shuffle_f32x4::<0xEE>(a, b),
                );
            }
            let mut e = [_mm512_setzero_ps(); 4];
            for (i, ei) in e.iter_mut().enumerate() {
                let (a, b) = (c[2 * i], c[2 * i + 1]);
                // [a.0, a.2, b.0, b.2] + [a.1, a.3, b.1, b.3]: block k now sums w[4i + k].
                *ei = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x88>(a, b),
                    _mm512_shuffle_f32x4::<0xDD>(a, b),
                );
            }
            let mut g = [_mm512_setzero_ps(); 2];
            for (i, gi) in g.iter_mut().enumerate() {
                let (a, b) = (e[2 * i], e[2 * i + 1]);
                // Per block [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
                *gi = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
            }
            // Per block [g0.0 + g0.2, g0.1 + g0.3, g1.0 + g1.2, g1.1 + g1.3].
            let z = _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(g[0], g[1]),
                _mm512_shuffle_ps::<0xEE>(g[0], g[1]),
            );
            _mm512_storeu_ps(out.as_mut_ptr(), z);
        }
        out
    }
    #[inline(always)]
    fn transpose(self, v: &mut [__m512]) {
        let v: &mut [__m512; 16] = v.try_into().expect("16 rows");
        unsafe {
            // Pairs of rows interleaved: t[2i] = [a0 b0 a1 b1 | a4 b4 a5 b5 | …] of rows
            // a = 2i, b = 2i + 1, t[2i + 1] the same from lanes 2, 3 of each 128-bit block.
            let mut t = [_mm512_setzero_ps(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
            }
            // Quads: 128-bit block L of u[4i + k] holds column 4L + k of rows 4i .. 4i + 4.
            let mut u = [_mm512_setzero_ps(); 16];
            for i in 0..4 {
                let (lo, hi) = (4 * i, 4 * i + 2);
                u[4 * i] = _mm512_shuffle_ps::<0x44>(t[lo], t[hi]);
                u[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(t[lo], t[hi]);
                u[4 * i + 2] = _mm512_shuffle_ps::<0x44>(t[lo + 1], t[hi + 1]);
                u[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(t[lo + 1], t[hi + 1]);
            }
            // Column 4L + k gathers block L of u[k], u[4 + k], u[8 + k], u[12 + k]: a 4 × 4
            // transpose of 128-bit blocks.
            for k in 0..4 {
                let (a, b, c, d) = (u[k], u[4 + k], u[8 + k], u[12 + k]);
                let ab_lo = _mm512_shuffle_f32x4::<0x44>(a, b);
                let ab_hi = _mm512_shuffle_f32x4::<0xEE>(a, b);
                let cd_lo = _mm512_shuffle_f32x4::<0x44>(c, d);
                let cd_hi = _mm512_shuffle_f32x4::<0xEE>(c, d);
                v[k] = _mm512_shuffle_f32x4::<0x88>(ab_lo, cd_lo);
                v[4 + k] = _mm512_shuffle_f32x4::<0xDD>(ab_lo, cd_lo);
                v[8 + k] = _mm512_shuffle_f32x4::<0x88>(ab_hi, cd_hi);
                v[12 + k] = _mm512_shuffle_f32x4::<0xDD>(ab_hi, cd_hi);
            }
        }
    }
    #[inline(always)]
    fn pair_bf16(self, bf: Bf16Dot, a: __m512, b: __m512, dst: &mut [f32]) {
        bf.pair_vectors(a, b, dst);
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> __m512 {
        let s = &s[..16];
        // SAFETY: 16 readable f16s = 32 bytes (checked above); unaligned load; vcvtph2ps on
        // zmm registers is AVX-512F.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast())) }
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> __m512 {
        let s = &s[..16];
        // SAFETY: 16 readable bf16s = 32 bytes (checked above); unaligned load.
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(s.as_ptr().cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
    }
    #[inline(always)]
    fn load_i8(self, s: &[i8]) -> __m512 {
        let s = &s[..16];
        // SAFETY: 16 readable i8s = 16 bytes (checked above); unaligned load; vpmovsxbd and
        // vcvtdq2ps on zmm registers are AVX-512F.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(s.as_ptr().cast()))) }
    }
}
