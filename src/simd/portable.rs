//! Portable lanes: `wide::f32x8`, compiled for whatever the build targets.

use super::lanes::{Kernel, Simd};
use half::{bf16, f16};
use wide::{f32x8, i32x8};

/// The always-available backend. Fast only where the build itself enables wide vectors (for
/// instance `-C target-cpu=native`, or NEON on aarch64); on x86-64 the kernels use
/// [`super::Avx512`] or [`super::tokens::Avx2Fma`] at run time instead where the CPU has them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

impl Simd for Portable {
    type V = f32x8;
    const LANES: usize = 8;
    const TILE: usize = 6;

    #[inline(always)]
    fn splat(self, x: f32) -> f32x8 {
        f32x8::splat(x)
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> f32x8 {
        let lanes: [f32; 8] = s[..8].try_into().expect("8 elements");
        f32x8::new(lanes)
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: f32x8) {
        s[..8].copy_from_slice(&v.to_array());
    }
    #[inline(always)]
    fn add(self, a: f32x8, b: f32x8) -> f32x8 {
        a + b
    }
    #[inline(always)]
    fn sub(self, a: f32x8, b: f32x8) -> f32x8 {
        a - b
    }
    #[inline(always)]
    fn mul(self, a: f32x8, b: f32x8) -> f32x8 {
        a * b
    }
    #[inline(always)]
    fn div(self, a: f32x8, b: f32x8) -> f32x8 {
        a / b
    }
    #[inline(always)]
    fn abs(self, a: f32x8) -> f32x8 {
        a.abs()
    }
    #[inline(always)]
    fn mul_add(self, a: f32x8, b: f32x8, c: f32x8) -> f32x8 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn max(self, a: f32x8, b: f32x8) -> f32x8 {
        // Spelled out to pin the NaN behaviour the trait documents (`b` when unordered);
        // `f32x8::max` returns the non-NaN operand instead.
        a.simd_gt(b).select(a, b)
    }
    #[inline(always)]
    fn min(self, a: f32x8, b: f32x8) -> f32x8 {
        a.simd_lt(b).select(a, b)
    }
    #[inline(always)]
    fn floor(self, a: f32x8) -> f32x8 {
        a.floor()
    }
    #[inline(always)]
    fn pow2i(self, n: f32x8) -> f32x8 {
        let biased: i32x8 = (n + f32x8::splat(127.0)).round_int();
        let bits: i32x8 = biased << 23;
        wide::bytemuck::cast(bits)
    }
    #[inline(always)]
    fn run<K: Kernel>(self, kernel: K) -> K::Output {
        run(kernel)
    }
    #[inline(always)]
    fn reduce_add(self, a: f32x8) -> f32 {
        a.reduce_add()
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> f32x8 {
        let mut lanes = [0.0f32; 8];
        for (l, x) in lanes.iter_mut().zip(&s[..8]) {
            *l = x.to_f32();
        }
        f32x8::new(lanes)
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> f32x8 {
        let mut lanes = [0.0f32; 8];
        for (l, x) in lanes.iter_mut().zip(&s[..8]) {
            *l = x.to_f32();
        }
        f32x8::new(lanes)
    }
    #[inline(always)]
    fn load_i8(self, s: &[i8]) -> f32x8 {
        let mut lanes = [0.0f32; 8];
        for (l, &x) in lanes.iter_mut().zip(&s[..8]) {
            *l = f32::from(x);
        }
        f32x8::new(lanes)
    }
}

/// Runs `kernel` on this backend. Out of line, like the other backends' entry points, so that a
/// kernel body is compiled once per kernel type rather than again inside every caller.
#[inline(never)]
pub(crate) fn run<K: Kernel>(kernel: K) -> K::Output {
    kernel.run(Portable)
}
