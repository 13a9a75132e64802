//! AVX2 + FMA lanes from `core::arch`, usable only through a token that proves the CPU has them
//! ([`Avx2Fma`], from `tokens.rs`).

use super::lanes::{Kernel, Simd};
use super::tokens::Avx2Fma;
use core::arch::x86_64::*;
use half::{bf16, f16};

/// The entry point that gives the kernel body AVX2 + FMA code generation. `Kernel::run` and
/// everything it calls are `#[inline(always)]`, so they are compiled here with the features on.
// Never inlined: each kernel is its own function, so that the compiler cannot hoist one
// stage's loop-invariant vectors (constants, splats) into another stage's register tile.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
fn run_with_features<K: Kernel>(simd: Avx2Fma, kernel: K) -> K::Output {
    kernel.run(simd)
}

/// Runs `kernel` with AVX2 + FMA code generation.
#[inline]
pub(crate) fn run<K: Kernel>(simd: Avx2Fma, kernel: K) -> K::Output {
    // SAFETY: an `Avx2Fma` value exists only if `detect` found the features on this CPU.
    unsafe { run_with_features(simd, kernel) }
}

// SAFETY (for every `unsafe` block below): the intrinsics need AVX2/FMA/F16C, which the existence of
// `self: Avx2Fma` proves; loads and stores go through slices whose length is checked first.
impl Simd for Avx2Fma {
    type V = __m256;
    const LANES: usize = 8;
    const TILE: usize = 6;

    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> __m256 {
        let s = &s[..8];
        // SAFETY: 8 readable f32s (checked above); unaligned load.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: __m256) {
        let s = &mut s[..8];
        // SAFETY: 8 writable f32s (checked above); unaligned store.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn abs(self, a: __m256) -> __m256 {
        // Clear the sign bit.
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        // vmaxps returns its second source operand when either is NaN.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    fn floor(self, a: __m256) -> __m256 {
        unsafe { _mm256_floor_ps(a) }
    }
    #[inline(always)]
    fn pow2i(self, n: __m256) -> __m256 {
        // (n + 127) << 23 is the IEEE-754 bit pattern of 2^n; n = −127 gives +0.0.
        unsafe {
            let biased = _mm256_cvtps_epi32(_mm256_add_ps(n, _mm256_set1_ps(127.0)));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
        }
    }
    #[inline(always)]
    fn run<K: Kernel>(self, kernel: K) -> K::Output {
        run(self, kernel)
    }
    #[inline(always)]
    fn reduce_add(self, a: __m256) -> f32 {
        unsafe {
            let x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            let x = _mm_add_ss(x, _mm_movehdup_ps(x));
            _mm_cvtss_f32(x)
        }
    }
    #[inline(always)]
    fn reduce_add16(self, v: [__m256; 16], live: usize) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        for (g, o) in out.chunks_exact_mut(8).enumerate().take(live.div_ceil(8)) {
            let a = &v[8 * g..8 * g + 8];
            unsafe {
                // `hadd(a, b)` = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7], so
                // two rounds leave in `q0` the sums of a[0..4]'s low halves, then of their high
                // halves: [Σlo a0, Σlo a1, Σlo a2, Σlo a3 | Σhi a0, …, Σhi a3] (`q1` a[4..8]).
                let h01 = _mm256_hadd_ps(a[0], a[1]);
                let h23 = _mm256_hadd_ps(a[2], a[3]);
                let h45 = _mm256_hadd_ps(a[4], a[5]);
                let h67 = _mm256_hadd_ps(a[6], a[7]);
                let q0 = _mm256_hadd_ps(h01, h23);
                let q1 = _mm256_hadd_ps(h45, h67);
                // Low halves of q0, q1 plus their high halves: the eight sums in order.
                let sums = _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(q0, q1),
                    _mm256_permute2f128_ps::<0x31>(q0, q1),
                );
                // SAFETY: `o` is a chunk of exactly 8 f32s.
                _mm256_storeu_ps(o.as_mut_ptr(), sums);
            }
        }
        out
    }
    #[inline(always)]
    fn transpose(self, v: &mut [__m256]) {
        let v: &mut [__m256; 8] = v.try_into().expect("8 rows");
        unsafe {
            // As on AVX-512 (see there), with two 128-bit blocks: pairs, then quads (block L
            // of u[4i + k] holds column 4L + k of rows 4i .. 4i + 4), then the blocks swapped.
            let mut t = [_mm256_setzero_ps(); 8];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for i in 0..2 {
                let (lo, hi) = (4 * i, 4 * i + 2);
                u[4 * i] = _mm256_shuffle_ps::<0x44>(t[lo], t[hi]);
                u[4 * i + 1] = _mm256_shuffle_ps::<0xEE>(t[lo], t[hi]);
                u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(t[lo + 1], t[hi + 1]);
                u[4 * i + 3] = _mm256_shuffle_ps::<0xEE>(t[lo + 1], t[hi + 1]);
            }
            for k in 0..4 {
                v[k] = _mm256_permute2f128_ps::<0x20>(u[k], u[4 + k]);
                v[4 + k] = _mm256_permute2f128_ps::<0x31>(u[k], u[4 + k]);
            }
        }
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> __m256 {
        let s = &s[..8];
        // SAFETY: 8 readable f16s = 16 bytes (checked above); unaligned load.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast())) }
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> __m256 {
        let s = &s[..8];
        // SAFETY: 8 readable bf16s = 16 bytes (checked above); unaligned load.
        unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr().cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
        }
    }
    #[inline(always)]
    fn load_i8(self, s: &[i8]) -> __m256 {
        let s = &s[..8];
        // SAFETY: 8 readable i8s = 8 bytes (checked above), what `vmovq` reads; unaligned load.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(s.as_ptr().cast()))) }
    }
}
