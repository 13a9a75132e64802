//! bf16 pairs on the lanes: [`Bf16Dot::run`], the entry point that runs a [`Kernel`] on the
//! AVX-512 lanes with AVX512_BF16 enabled too, and [`Bf16Dot::pair_vectors`], the rounding and
//! pairing of two f32 vectors that the AVX-512 lanes'
//! [`Simd::pair_bf16`](super::lanes::Simd::pair_bf16) is (always inlined: under
//! [`Bf16Dot::run`] it compiles into the kernel's loop). The bf16 tiles
//! (`crate::microkernel::dpbf16`) share its intrinsics helpers. Off x86-64 the token is
//! uninhabited and only [`Bf16Dot::run`] is here.

#[cfg(target_arch = "x86_64")]
use super::tokens::Avx512;
use super::{lanes::Kernel, tokens::Bf16Dot};
#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
impl Bf16Dot {
    /// Runs `kernel` on the AVX-512 lanes through an entry point that enables BF16 too,
    /// so that [`Bf16Dot::pair_vectors`] (which
    /// [`Simd::pair_bf16`](super::lanes::Simd::pair_bf16) calls) compiles into the kernel's
    /// loop. (Compiled once per kernel type.)
    pub fn run<K: Kernel>(self, kernel: K) -> K::Output {
        // SAFETY: the token proves the features.
        unsafe { run_with_bf16(self.lanes(), kernel) }
    }

    /// [`Bf16Dot::interleave`] of two vectors: `dst[i] = bf16(a[i]) | bf16(b[i]) << 16`
    /// for `i < 16`. Always inlined, for kernels under [`Bf16Dot::run`] (elsewhere the
    /// conversion would be a call).
    #[inline(always)]
    pub fn pair_vectors(self, a: __m512, b: __m512, dst: &mut [f32]) {
        let dst = &mut dst[..16];
        // SAFETY: the token proves the features; `dst` holds 16 f32s (checked above).
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), pair_words(a, b)) }
    }
}

/// See [`Bf16Dot::run`]. Safety: the features.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn run_with_bf16<K: Kernel>(lanes: Avx512, kernel: K) -> K::Output {
    kernel.run(lanes)
}

/// Lane `i` of the result: 16-bit word `i / 2` of `a`'s half if `i` is even, of `b`'s if odd
/// (for `vpermw` over `[a's 16 words | b's 16 words]`).
#[cfg(target_arch = "x86_64")]
pub(crate) const INTERLEAVE: [i16; 32] = {
    let mut idx = [0i16; 32];
    let mut i = 0;
    while i < 16 {
        idx[2 * i] = i as i16;
        idx[2 * i + 1] = 16 + i as i16;
        i += 1;
    }
    idx
};

/// `x`'s bits as 32 bf16 values (the operand type of `vdpbf16ps`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn bh(x: __m512) -> __m512bh {
    // SAFETY: both are 512-bit vectors with no invalid bit patterns.
    unsafe { core::mem::transmute::<__m512, __m512bh>(x) }
}

/// `x`'s bits as integer lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn bits(x: __m512bh) -> __m512i {
    // SAFETY: as in `bh`.
    unsafe { core::mem::transmute::<__m512bh, __m512i>(x) }
}

/// Lane `i`: `bf16(x[i]) | bf16(y[i]) << 16` (the pairs of [`Bf16Dot::interleave`] and
/// [`Bf16Dot::pair_vectors`]). Safety: the features (AVX-512BW and BF16).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn pair_words(x: __m512, y: __m512) -> __m512i {
    // SAFETY: the caller's features; `INTERLEAVE` is 64 bytes.
    unsafe {
        let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
        // x's 16 values in the low 16 words, y's in the high; then word i of each half
        // side by side.
        let words = bits(_mm512_cvtne2ps_pbh(y, x));
        _mm512_permutexvar_epi16(idx, words)
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Bf16Dot {
    pub fn run<K: Kernel>(self, _: K) -> K::Output {
        match self {}
    }
}
