//! `sdpa_f32_to_f16`, `sdpa_f16_to_f32`, `sdpa_f32_to_bf16`, `sdpa_bf16_to_f32`: the `half`
//! crate's bits (the conversions sdpa uses) on edge values and every half bit pattern; NULL,
//! misaligned and overlapping buffers as statuses, nothing written on error.

use std::ffi::CStr;
use std::ptr;

use sdpa::half::{bf16, f16};
use sdpa_capi::*;

fn message() -> String {
    // SAFETY: the library returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(sdpa_last_error_message()) }
        .to_str()
        .expect("utf-8")
        .to_string()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.37 * seed as f32).sin())
        .collect()
}

/// Runs a conversion both ways over `xs` and checks it against `half`'s scalar conversions:
/// the same bits (NaN stays NaN).
fn check_conversions(
    name: &str,
    xs: &[f32],
    from: unsafe extern "C" fn(*const f32, *mut u16, usize) -> SdpaStatus,
    to: unsafe extern "C" fn(*const u16, *mut f32, usize) -> SdpaStatus,
    expected: impl Fn(f32) -> u16,
    widened: impl Fn(u16) -> f32,
) {
    let mut halves = vec![0u16; xs.len()];
    // SAFETY: both buffers hold `xs.len()` elements.
    let status = unsafe { from(xs.as_ptr(), halves.as_mut_ptr(), xs.len()) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    for (&x, &h) in xs.iter().zip(&halves) {
        assert_eq!(
            h,
            expected(x),
            "{x:e} ({:#010x}) to type {}",
            x.to_bits(),
            name
        );
        assert_eq!(x.is_nan(), widened(h).is_nan(), "{x:e}");
    }
    // Every bit pattern back to f32, exactly.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let mut back = vec![0f32; all.len()];
    // SAFETY: both buffers hold 65536 elements.
    let status = unsafe { to(all.as_ptr(), back.as_mut_ptr(), all.len()) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    for (&h, &y) in all.iter().zip(&back) {
        assert_eq!(
            y.to_bits(),
            widened(h).to_bits(),
            "{h:#06x} of type {}",
            name
        );
    }
    // NULL with n = 0 is fine, with n > 0 an error; misaligned and overlapping buffers.
    let mut one = [0u16; 2];
    let mut wide = [0f32; 2];
    // SAFETY (all calls): pointers are NULL, or valid for the counts given.
    unsafe {
        assert_eq!(from(ptr::null(), ptr::null_mut(), 0), SdpaStatus::Ok);
        assert_eq!(to(ptr::null(), ptr::null_mut(), 0), SdpaStatus::Ok);
        assert_eq!(
            from(ptr::null(), one.as_mut_ptr(), 1),
            SdpaStatus::NullPointer
        );
        assert!(message().contains("src"));
        assert_eq!(
            from(xs.as_ptr(), ptr::null_mut(), 1),
            SdpaStatus::NullPointer
        );
        assert!(message().contains("dst"));
        assert_eq!(
            to(one.as_ptr(), ptr::null_mut(), 1),
            SdpaStatus::NullPointer
        );
        assert_eq!(
            to(ptr::null(), wide.as_mut_ptr(), 1),
            SdpaStatus::NullPointer
        );
        let odd = one.as_mut_ptr().cast::<u8>().add(1).cast::<u16>();
        assert_eq!(from(xs.as_ptr(), odd, 1), SdpaStatus::Misaligned);
        assert_eq!(one, [0, 0], "written on error");
        let wide_ptr = wide.as_mut_ptr();
        assert_eq!(
            from(wide_ptr, wide_ptr.cast(), 2),
            SdpaStatus::AliasedBuffers
        );
        assert_eq!(to(wide_ptr.cast(), wide_ptr, 2), SdpaStatus::AliasedBuffers);
    }
}

/// Edge values: ±0, subnormals of f32 and of the half types and their halfway points, the
/// smallest normals, ties at 1, the largest finite values and past them, ±∞, NaNs, and a
/// sweep of ordinary values.
fn edge_values() -> Vec<f32> {
    let p = |e: i32| 2f32.powi(e);
    let mut xs = vec![
        0.0,
        -0.0,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        p(-24),
        p(-25),
        3.0 * p(-25),
        p(-26) * 3.0,
        p(-14) - p(-24),
        p(-14),
        -p(-24),
        1.0 + p(-11),
        1.0 + 3.0 * p(-11),
        1.0 + p(-8),
        1.0 + 3.0 * p(-8),
        -(1.0 + p(-8)),
        p(-133),
        p(-126) * 1.5,
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        f32::MAX,
        f32::MIN,
        f32::from_bits(0x7F7F_7FFF),
        f32::from_bits(0x7F7F_8000),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC0_1234),
        f32::from_bits(0x7FBF_FFFF),
    ];
    xs.extend(data(4099, 13).iter().map(|x| x * 70000.0));
    xs.extend(data(1000, 17).iter().map(|x| x * 1e-5));
    xs
}

#[test]
fn f16_conversions_give_the_half_crates_bits() {
    check_conversions(
        "f16",
        &edge_values(),
        sdpa_f32_to_f16,
        sdpa_f16_to_f32,
        |x| f16::from_f32(x).to_bits(),
        |h| f16::from_bits(h).to_f32(),
    );
    // Round to nearest even, ±∞ past the range, as IEEE says.
    let xs = [1.0 + 2f32.powi(-11), 65520.0, 2f32.powi(-25)];
    let mut h = [0u16; 3];
    // SAFETY: both buffers hold 3 elements.
    assert_eq!(
        unsafe { sdpa_f32_to_f16(xs.as_ptr(), h.as_mut_ptr(), 3) },
        SdpaStatus::Ok
    );
    assert_eq!(h, [0x3C00, 0x7C00, 0x0000]);
}

#[test]
fn bf16_conversions_give_the_half_crates_bits() {
    check_conversions(
        "bf16",
        &edge_values(),
        sdpa_f32_to_bf16,
        sdpa_bf16_to_f32,
        |x| bf16::from_f32(x).to_bits(),
        |h| bf16::from_bits(h).to_f32(),
    );
    let xs = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), f32::MAX];
    let mut h = [0u16; 3];
    // SAFETY: both buffers hold 3 elements.
    assert_eq!(
        unsafe { sdpa_f32_to_bf16(xs.as_ptr(), h.as_mut_ptr(), 3) },
        SdpaStatus::Ok
    );
    assert_eq!(h, [0x3F80, 0x3F82, 0x7F80]);
}
