//! Scalar `2^x` and `log₂ x` built from IEEE-754 basic operations only (`+ − × ÷`, which
//! every platform and Miri round exactly as the standard says).
//!
//! The fused kernel uses them wherever it turns per-row sums into weights or log-sum-exps
//! (sinks, the split-KV combine, LSE), so that bitwise determinism rests on Rust's rules alone:
//! std's `exp2`/`log2` call the platform's libm, whose last bits Rust leaves unspecified (and
//! Miri deliberately varies). Both evaluate a short series in f64 and round once to f32, so
//! they are correctly rounded except in rare near-halfway cases.

use std::f64::consts::{LN_2, LOG2_E, SQRT_2};

/// `2^x`, within 1e-10 relative error before the final rounding to f32: NaN for NaN, exactly
/// 0 for `x ≤ −160` (including `−∞`; results below f32's smallest subnormal round to 0 anyway),
/// `+∞` above 128.
pub(crate) fn exp2(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = f64::from(x).clamp(-160.0, 130.0);
    let n = x.floor();
    // e^{f·ln 2} for f ∈ [0, 1): the Taylor series to degree 12 leaves < ln2¹³/13! ≈ 1.4e-12.
    let f = (x - n) * LN_2;
    let mut term = 1.0f64;
    let mut sum = 1.0f64;
    for k in 1..=12 {
        term *= f / f64::from(k);
        sum += term;
    }
    // n ∈ [−160, 130]: 2^n is a normal f64, built from its exponent bits.
    let pow2n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (sum * pow2n) as f32
}

/// `log₂ x`, within 1e-14 absolute error before the final rounding to f32: `−∞` for ±0, NaN for
/// negative x and NaN, `+∞` for `+∞`.
pub(crate) fn log2(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    // Every positive finite f32 (subnormals included) is a normal f64: x = 2^e · m, m ∈ [1, 2).
    let bits = f64::from(x).to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    if m > SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    // ln m = 2·atanh(t), t = (m − 1)/(m + 1) ∈ [−0.172, 0.172]: odd powers to t¹⁹ leave
    // < 2·0.172²¹/21 ≈ 8e-18.
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let mut power = t;
    let mut sum = 0.0f64;
    for k in (1..=19).step_by(2) {
        sum += power / f64::from(k);
        power *= t2;
    }
    (e as f64 + 2.0 * sum * LOG2_E) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp2_matches_the_exact_value() {
        let mut x = -150.0f32;
        while x < 127.9 {
            let want = f64::from(x).exp2();
            let got = f64::from(exp2(x));
            if want > f64::from(f32::MIN_POSITIVE) {
                assert!((got / want - 1.0).abs() <= 6.0e-8, "2^{x}: {got} vs {want}");
            } else {
                // Subnormal results: half a subnormal step.
                assert!((got - want).abs() <= 0.71e-45, "2^{x}: {got} vs {want}");
            }
            x += 0.0371;
        }
        assert_eq!(exp2(0.0), 1.0);
        assert_eq!(exp2(-1.0), 0.5);
        assert_eq!(exp2(10.0), 1024.0);
        assert_eq!(exp2(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp2(-1e30), 0.0);
        assert_eq!(exp2(200.0), f32::INFINITY);
        assert!(exp2(f32::NAN).is_nan());
    }

    #[test]
    fn log2_matches_the_exact_value() {
        let mut x = 1.0e-44f32;
        while x < 3.0e38 {
            let want = f64::from(x).log2();
            let got = f64::from(log2(x));
            // Correct rounding of the result: half an ulp of it, plus the series' 1e-14.
            let ulp = f64::from(f32::EPSILON) * want.abs().max(f64::from(f32::MIN_POSITIVE));
            assert!(
                (got - want).abs() <= 0.5 * ulp + 1e-14,
                "log2 {x}: {got} vs {want}"
            );
            x *= 1.137;
        }
        for k in -149i32..128 {
            let bits = if k >= -126 {
                ((k + 127) as u32) << 23
            } else {
                1u32 << (k + 149)
            };
            assert_eq!(log2(f32::from_bits(bits)), k as f32);
        }
        assert_eq!(log2(0.0), f32::NEG_INFINITY);
        assert_eq!(log2(f32::INFINITY), f32::INFINITY);
        assert!(log2(-1.0).is_nan() && log2(f32::NAN).is_nan());
    }
}
