//! Conversions between `float` and the half types for C callers: `half`'s slice conversions,
//! the crate's own (round to nearest, ties to even; ±∞ beyond the range; NaN stays NaN), with
//! the CPU's conversion instructions (F16C) where it has them.

use sdpa::half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use sdpa::half::{bf16, f16};

use crate::status::Failure;
use crate::validate::{output_array, required_array};

/// A half type's conversions.
pub(crate) trait Half: Copy {
    /// `src` rounded into `dst` (same length).
    fn from_f32s(src: &[f32], dst: &mut [u16]);
    /// `src` widened into `dst` (same length, exact).
    fn to_f32s(src: &[u16], dst: &mut [f32]);
}

impl Half for f16 {
    fn from_f32s(src: &[f32], dst: &mut [u16]) {
        dst.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(src);
    }
    fn to_f32s(src: &[u16], dst: &mut [f32]) {
        src.reinterpret_cast::<f16>().convert_to_f32_slice(dst);
    }
}

impl Half for bf16 {
    fn from_f32s(src: &[f32], dst: &mut [u16]) {
        dst.reinterpret_cast_mut::<bf16>()
            .convert_from_f32_slice(src);
    }
    fn to_f32s(src: &[u16], dst: &mut [f32]) {
        src.reinterpret_cast::<bf16>().convert_to_f32_slice(dst);
    }
}

/// `n` floats at `src` rounded to `H` at `dst`.
///
/// # Safety
/// As `sdpa_f32_to_f16`.
pub(crate) unsafe fn from_f32<H: Half>(
    src: *const f32,
    dst: *mut u16,
    n: usize,
) -> Result<(), Failure> {
    let mut spans = Vec::new();
    // SAFETY (both): the caller's contract, forwarded.
    let src = unsafe { required_array(src, n, "src", &mut spans) }?;
    if let Some(dst) = unsafe { output_array(dst, n, &spans, "dst") }? {
        H::from_f32s(src, dst);
    }
    Ok(())
}

/// `n` values of `H` at `src` widened to floats at `dst`.
///
/// # Safety
/// As `sdpa_f16_to_f32`.
pub(crate) unsafe fn to_f32<H: Half>(
    src: *const u16,
    dst: *mut f32,
    n: usize,
) -> Result<(), Failure> {
    let mut spans = Vec::new();
    // SAFETY (both): the caller's contract, forwarded.
    let src = unsafe { required_array(src, n, "src", &mut spans) }?;
    if let Some(dst) = unsafe { output_array(dst, n, &spans, "dst") }? {
        H::to_f32s(src, dst);
    }
    Ok(())
}
