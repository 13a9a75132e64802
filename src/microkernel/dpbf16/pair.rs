//! Pair conversions: f32 rows rounded to bf16 and bf16 rows as stored, into the rows of
//! channel pairs and the key-interleaved rows the tiles read (two bf16 values per 32-bit word,
//! stored in f32 slots).

use crate::simd::bf16::{bits, pair_words, INTERLEAVE};
use crate::simd::Bf16Dot;
use core::arch::x86_64::*;
use half::bf16;

impl Bf16Dot {
    /// `dst[i] = bf16(a[i]) | bf16(b[i]) << 16` for `i < dst.len()` (a multiple of 16),
    /// the pairs as 32-bit words in f32 slots; `b = None` pairs with zeros.
    pub fn interleave(self, a: &[f32], b: Option<&[f32]>, dst: &mut [f32]) {
        let n = dst.len();
        assert!(n.is_multiple_of(16) && a.len() >= n && b.is_none_or(|b| b.len() >= n));
        // SAFETY: the token proves the features; the lengths are checked above.
        unsafe { interleave(a.as_ptr(), b.map(<[f32]>::as_ptr), dst.as_mut_ptr(), n) }
    }

    /// `x` rounded to bf16, two values per 32-bit word (`x[2w]` low, `x[2w + 1]` high, a zero
    /// after an odd count) into `dst[.. ⌈x.len() / 2⌉]`.
    pub fn pair_row(self, x: &[f32], dst: &mut [f32]) {
        assert!(dst.len() >= x.len().div_ceil(2));
        // SAFETY: the token proves the features; the lengths are checked above.
        unsafe { pair_row(x.as_ptr(), x.len(), dst.as_mut_ptr()) }
    }

    /// [`Bf16Dot::pair_row`] of values that are bf16 already: `x`'s words copied as they are,
    /// two per 32-bit word, a zero after an odd count, into `dst[.. ⌈x.len() / 2⌉]`. The same
    /// words as `pair_row` of their f32 values but for subnormals and signalling NaNs, which
    /// stay as stored: `vdpbf16ps` reads a subnormal as zero and a NaN as NaN, so every
    /// product is the same.
    pub fn pair_bf16_row(self, x: &[bf16], dst: &mut [f32]) {
        assert!(dst.len() >= x.len().div_ceil(2));
        // SAFETY: the token proves the features; the lengths are checked above; `bf16` is
        // a 16-bit word.
        unsafe { pair_bf16_row(x.as_ptr().cast(), x.len(), dst.as_mut_ptr()) }
    }

    /// [`Bf16Dot::interleave`] of values that are bf16 already, `dst[i] = a[i] | b[i] << 16`
    /// (their words as stored, as in [`Bf16Dot::pair_bf16_row`]).
    pub fn interleave_bf16(self, a: &[bf16], b: Option<&[bf16]>, dst: &mut [f32]) {
        let n = dst.len();
        assert!(n.is_multiple_of(16) && a.len() >= n && b.is_none_or(|b| b.len() >= n));
        // SAFETY: as in `pair_bf16_row`.
        unsafe {
            interleave_bf16(
                a.as_ptr().cast(),
                b.map(|b| b.as_ptr().cast()),
                dst.as_mut_ptr(),
                n,
            )
        }
    }
}

/// See [`Bf16Dot::interleave`]. Safety: the features; `a`, `b` (if any) and `dst` valid for
/// `n` f32s, `n` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn interleave(a: *const f32, b: Option<*const f32>, dst: *mut f32, n: usize) {
    // SAFETY (whole body): the caller's contract.
    unsafe {
        for i in (0..n).step_by(16) {
            let x = _mm512_loadu_ps(a.add(i));
            let y = match b {
                Some(b) => _mm512_loadu_ps(b.add(i)),
                None => _mm512_setzero_ps(),
            };
            _mm512_storeu_si512(dst.add(i).cast(), pair_words(x, y));
        }
    }
}

/// See [`Bf16Dot::pair_row`]. Safety: the features; `x` valid for `n` f32s, `dst` for
/// `⌈n / 2⌉`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pair_row(x: *const f32, n: usize, dst: *mut f32) {
    let mask = |from: usize, count: usize| -> __mmask16 {
        let live = n.saturating_sub(from).min(count);
        ((1u32 << live) - 1) as __mmask16
    };
    // SAFETY (whole body): the caller's contract; masked-off lanes are neither read nor
    // written (AVX-512 masked loads and stores suppress faults).
    unsafe {
        for i in (0..n).step_by(32) {
            // (`wrapping_add`: past the row's end the address is formed, never read.)
            let lo = _mm512_maskz_loadu_ps(mask(i, 16), x.add(i));
            let hi = _mm512_maskz_loadu_ps(mask(i + 16, 16), x.wrapping_add(i + 16));
            // Words in order: x[i], x[i + 1], …, i.e. pairs (x[2w], x[2w + 1]).
            let words = bits(_mm512_cvtne2ps_pbh(hi, lo));
            let pairs = (n - i).min(32).div_ceil(2);
            let keep = ((1u32 << pairs) - 1) as __mmask16;
            _mm512_mask_storeu_epi32(dst.add(i / 2).cast(), keep, words);
        }
    }
}

/// See [`Bf16Dot::pair_bf16_row`]. Safety: the features; `x` valid for `n` words, `dst`
/// for `⌈n / 2⌉` f32s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pair_bf16_row(x: *const u16, n: usize, dst: *mut f32) {
    // SAFETY (whole body): the caller's contract; masked-off lanes are neither read nor
    // written (AVX-512 masked loads and stores suppress faults).
    unsafe {
        for i in (0..n).step_by(32) {
            let live = (n - i).min(32);
            let words =
                _mm512_maskz_loadu_epi16(((1u64 << live) - 1) as __mmask32, x.add(i).cast());
            let keep = ((1u32 << live.div_ceil(2)) - 1) as __mmask16;
            _mm512_mask_storeu_epi32(dst.add(i / 2).cast(), keep, words);
        }
    }
}

/// See [`Bf16Dot::interleave_bf16`]. Safety: the features; `a`, `b` (if any) valid for `n`
/// words, `dst` for `n` f32s, `n` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn interleave_bf16(a: *const u16, b: Option<*const u16>, dst: *mut f32, n: usize) {
    // SAFETY (whole body): the caller's contract; `INTERLEAVE` is 64 bytes.
    unsafe {
        let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
        for i in (0..n).step_by(16) {
            let x = _mm256_loadu_si256(a.add(i).cast());
            let y = match b {
                Some(b) => _mm256_loadu_si256(b.add(i).cast()),
                None => _mm256_setzero_si256(),
            };
            // a's 16 words low, b's high, as `interleave` has them after rounding.
            let words = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), y);
            _mm512_storeu_si512(dst.add(i).cast(), _mm512_permutexvar_epi16(idx, words));
        }
    }
}
