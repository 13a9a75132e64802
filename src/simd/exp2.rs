//! `2^x` on the lanes: the softmax's exponent, a polynomial over [`Simd`] operations.

use super::lanes::Simd;

/// Minimax fit of `2^f` on `f ∈ [0, 1)`, degree 6, coefficients of `f^0 … f^6`.
/// Evaluated in f32 by Horner's rule its relative error is below 1e-7 (measured 8.4e-8 over a
/// dense grid, about 0.7 ulp), well under the other rounding in a softmax.
#[allow(clippy::approx_constant)] // fitted coefficients, not ln 2
const EXP2_POLY: [f32; 7] = [
    1.0,
    0.693_147,
    0.240_229_8,
    0.055_483_524,
    0.009_678_473,
    0.001_244_308_2,
    0.000_216_906_1,
];

/// Smallest argument kept: below it `2^x` is flushed to exactly 0 (that is what makes masked
/// `−∞` scores weigh exactly nothing, and 2^-127 relative to the row max is far below f32
/// resolution anyway).
const EXP2_MIN: f32 = -127.0;

/// `2^x` per lane with relative error < 2e-7 for `x ∈ [−126, 127]`, exactly 0 for `x ≤ −127`
/// (including `−∞`), NaN for NaN. Only ever called with `x ≤ 0` (scores minus their running max).
#[inline(always)]
pub(crate) fn exp2<S: Simd>(s: S, x: S::V) -> S::V {
    // max(lo, x) keeps a NaN x (second operand), so NaN reaches the polynomial and propagates.
    let x = s.max(s.splat(EXP2_MIN), x);
    let x = s.min(s.splat(127.0), x);
    let n = s.floor(x);
    let f = s.sub(x, n);
    let mut p = s.splat(EXP2_POLY[6]);
    for &c in EXP2_POLY[..6].iter().rev() {
        p = s.mul_add(p, f, s.splat(c));
    }
    s.mul(p, s.pow2i(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::simd::{avx2, avx512, Avx2Fma, Avx512};
    use crate::simd::{dispatch, Kernel, Portable};

    fn exp2_lanes<S: Simd>(s: S, xs: &[f32; 8]) -> [f32; 8] {
        // Lanes beyond 8 (AVX-512) repeat the inputs.
        let wide: Vec<f32> = xs.iter().copied().cycle().take(S::LANES).collect();
        let mut out = vec![0.0; S::LANES];
        s.store(&mut out, exp2(s, s.load(&wide)));
        out[..8].try_into().unwrap()
    }

    struct Exp2Check;
    impl Kernel for Exp2Check {
        type Output = ();
        #[inline(always)]
        fn run<S: Simd>(self, s: S) {
            check_exp2(s)
        }
    }

    fn check_exp2<S: Simd>(s: S) {
        let mut worst = 0.0f64;
        for step in 0..=126 * 64 {
            let x0 = -(step as f32) / 64.0;
            let xs = [
                x0,
                x0 - 0.003,
                x0 - 0.25,
                x0 - 0.5,
                x0 - 0.77,
                x0 - 0.9,
                x0,
                x0,
            ];
            let got = exp2_lanes(s, &xs);
            for (x, g) in xs.iter().zip(got) {
                if *x < -126.0 {
                    continue;
                }
                let want = f64::from(*x).exp2();
                worst = worst.max((f64::from(g) / want - 1.0).abs());
            }
        }
        assert!(worst < 2e-7, "exp2 relative error {worst}");
        let special = exp2_lanes(
            s,
            &[
                f32::NEG_INFINITY,
                -127.0,
                -1e30,
                f32::NAN,
                0.0,
                -1.0,
                -126.5,
                0.5,
            ],
        );
        assert_eq!(&special[..3], &[0.0, 0.0, 0.0]);
        assert!(special[3].is_nan());
        assert_eq!(special[4], 1.0);
        assert_eq!(special[5], 0.5);
    }

    #[test]
    fn exp2_is_accurate_on_every_backend() {
        check_exp2(Portable);
        dispatch(Exp2Check);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(s) = Avx2Fma::detect() {
                avx2::run(s, Exp2Check);
            }
            if let Some(s) = Avx512::detect() {
                avx512::run(s, Exp2Check);
            }
        }
    }
}
