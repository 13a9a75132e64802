//! The lane traits: [`Simd`], the f32 vector operations the micro-kernels are written over
//! (implemented once per backend: `avx512.rs`, `avx2.rs`, `portable.rs`), [`Lanes`], which of
//! its loads a K/V element type uses, and [`Kernel`], a computation generic over the lanes that
//! a backend's entry point runs.

use super::tokens::Bf16Dot;
use crate::element::Element;
use half::{bf16, f16};

/// f32 lanes and the operations the micro-kernels need.
///
/// Every method is `#[inline(always)]` in the implementations so that a kernel body generic over
/// `S` compiles, inside a `#[target_feature]` entry point, to straight-line vector code.
pub(crate) trait Simd: Copy + Send + Sync + 'static {
    /// One vector of `LANES` f32 lanes.
    type V: Copy;
    /// Lanes per vector.
    const LANES: usize;
    /// Register-tile height: keys per score tile and rows per output tile (each tile is
    /// `TILE × 2` vectors of accumulators; see [`crate::microkernel`]).
    const TILE: usize;
    /// All lanes `x`.
    fn splat(self, x: f32) -> Self::V;
    /// The first `LANES` elements of `s` (panics if shorter: callers pass exact chunks, for
    /// which the check compiles away).
    fn load(self, s: &[f32]) -> Self::V;
    /// Writes the lanes to the first `LANES` elements of `s`.
    fn store(self, s: &mut [f32], v: Self::V);
    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `|a|`.
    fn abs(self, a: Self::V) -> Self::V;
    /// `a · b + c` (fused on backends with FMA).
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `if a > b { a } else { b }` per lane: `b` when either is NaN (x86 `maxps` semantics).
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `if a < b { a } else { b }` per lane: `b` when either is NaN (x86 `minps` semantics).
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// Rounds toward −∞.
    fn floor(self, a: Self::V) -> Self::V;
    /// `2^n` for lanes holding integers `n` in `[−127, 127]`, built from the exponent bits;
    /// `n = −127` gives exactly 0.
    fn pow2i(self, n: Self::V) -> Self::V;
    /// Runs `kernel` on these lanes through its own entry point (compiled once per kernel
    /// type and backend, not inlined into the caller).
    fn run<K: Kernel>(self, kernel: K) -> K::Output;
    /// The sum of the lanes (in a backend-fixed order).
    fn reduce_add(self, a: Self::V) -> f32;
    /// The lane sums of the first `live` of 16 vectors, `out[i] = Σ lanes of v[i]` for
    /// `i < live` (in a backend-fixed order); `out[live..]` is unspecified. Backends with
    /// shuffles transpose as they add (AVX-512: 45 shuffles and adds for all 16, against ~8
    /// per vector one by one; AVX2: 9 horizontal adds, permutes and adds per 8 vectors, against
    /// 6 operations per vector); the default reduces each vector on its own.
    #[inline(always)]
    fn reduce_add16(self, v: [Self::V; 16], live: usize) -> [f32; 16] {
        let mut out = [0.0; 16];
        for (o, x) in out.iter_mut().zip(v).take(live) {
            *o = self.reduce_add(x);
        }
        out
    }
    /// Transposes the `LANES × LANES` matrix held in `v` (`v.len() = LANES`, vector `i` its row
    /// `i`): afterwards vector `c` holds what was lane `c` of every row. Backends with shuffles
    /// do it in registers (AVX-512: 64 shuffles for 256 values); the default goes through
    /// memory.
    #[inline(always)]
    fn transpose(self, v: &mut [Self::V]) {
        let n = Self::LANES;
        assert!(v.len() == n && n <= 16);
        let mut m = [0.0f32; 256];
        for (r, &x) in v.iter().enumerate() {
            self.store(&mut m[r * n..], x);
        }
        let mut col = [0.0f32; 16];
        for (c, x) in v.iter_mut().enumerate() {
            for (r, y) in col[..n].iter_mut().enumerate() {
                *y = m[r * n + c];
            }
            *x = self.load(&col[..n]);
        }
    }
    /// `a` and `b` rounded to bf16 and paired lane by lane as 32-bit words, `dst[i] =
    /// bf16(a[i]) | bf16(b[i]) << 16` for `i < LANES` (what [`Bf16Dot::interleave`]
    /// writes for two slices). AVX-512 converts with `vcvtne2ps2bf16` (inlined under
    /// [`Bf16Dot::run`]); the default rounds lane by lane, to nearest, ties to even,
    /// and differs from the instruction only where `vdpbf16ps` cannot tell: it keeps bf16
    /// subnormals, which the instruction flushes and `vdpbf16ps` reads as zero, and NaN
    /// payloads.
    #[inline(always)]
    fn pair_bf16(self, _: Bf16Dot, a: Self::V, b: Self::V, dst: &mut [f32]) {
        let n = Self::LANES;
        let mut x = [0.0f32; 32];
        self.store(&mut x[..n], a);
        self.store(&mut x[16..16 + n], b);
        for (i, d) in dst[..n].iter_mut().enumerate() {
            let (lo, hi) = (bf16::from_f32(x[i]), bf16::from_f32(x[16 + i]));
            *d = f32::from_bits(u32::from(lo.to_bits()) | u32::from(hi.to_bits()) << 16);
        }
    }
    /// The first `LANES` elements of `s`, converted exactly to f32 (the CPU's conversion
    /// instructions where it has them).
    fn load_f16(self, s: &[f16]) -> Self::V;
    /// The first `LANES` elements of `s`, converted exactly to f32 (the bits shifted into the
    /// high half).
    fn load_bf16(self, s: &[bf16]) -> Self::V;
    /// The first `LANES` elements of `s`, converted exactly to f32 (sign-extended to 32-bit
    /// integers, then converted).
    fn load_i8(self, s: &[i8]) -> Self::V;
}

/// A type the kernels read K and V rows in, converted to f32 lanes as they are loaded: `f32`,
/// `f16`, `bf16`, and the integers of 8-bit caches (`i8`, whose scales the kernel applies
/// itself). (Per-ISA conversion stays in [`Simd`]; this only picks the method.)
pub(crate) trait Lanes: Copy + Send + Sync + 'static {
    /// Whether rows of this type reach the tiles at every height: f32 rows do (prefill's
    /// blocks, converted or read in place); half and 8-bit rows are read in place only by
    /// decode, at most `LANES / 2` query rows per kv head, so no taller tile is compiled for
    /// them.
    const ANY_HEIGHT: bool = false;
    /// `x` itself if `T` is this type.
    fn of<T: Element>(x: &[T]) -> Option<&[Self]>;
    /// `x` itself if this type is `i8`.
    fn of_i8(_: &[i8]) -> Option<&[Self]> {
        None
    }
    /// `x` itself if this type is `bf16` (the rows [`Bf16Dot`] reads as stored).
    fn as_bf16(_: &[Self]) -> Option<&[bf16]> {
        None
    }
    /// The first `S::LANES` elements of `x` as f32 lanes (exact).
    fn load<S: Simd>(s: S, x: &[Self]) -> S::V;
    /// The value as f32 (exact).
    fn scalar(self) -> f32;
}

impl Lanes for f32 {
    const ANY_HEIGHT: bool = true;
    #[inline(always)]
    fn of<T: Element>(x: &[T]) -> Option<&[f32]> {
        T::as_f32(x)
    }
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[f32]) -> S::V {
        s.load(x)
    }
    #[inline(always)]
    fn scalar(self) -> f32 {
        self
    }
}

impl Lanes for f16 {
    #[inline(always)]
    fn of<T: Element>(x: &[T]) -> Option<&[f16]> {
        T::as_f16(x)
    }
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[f16]) -> S::V {
        s.load_f16(x)
    }
    #[inline(always)]
    fn scalar(self) -> f32 {
        self.to_f32()
    }
}

impl Lanes for bf16 {
    #[inline(always)]
    fn of<T: Element>(x: &[T]) -> Option<&[bf16]> {
        T::as_bf16(x)
    }
    #[inline(always)]
    fn as_bf16(x: &[bf16]) -> Option<&[bf16]> {
        Some(x)
    }
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[bf16]) -> S::V {
        s.load_bf16(x)
    }
    #[inline(always)]
    fn scalar(self) -> f32 {
        self.to_f32()
    }
}

impl Lanes for i8 {
    #[inline(always)]
    fn of<T: Element>(_: &[T]) -> Option<&[i8]> {
        None // no `Element` is an integer
    }
    #[inline(always)]
    fn of_i8(x: &[i8]) -> Option<&[i8]> {
        Some(x)
    }
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[i8]) -> S::V {
        s.load_i8(x)
    }
    #[inline(always)]
    fn scalar(self) -> f32 {
        f32::from(self)
    }
}

/// A computation generic over the lanes, run by [`dispatch`](super::dispatch()) on the chosen
/// backend.
pub(crate) trait Kernel {
    /// What the computation returns.
    type Output;
    /// The body. Implementations mark it `#[inline(always)]` so that it is compiled inside the
    /// backend's `#[target_feature]` entry point.
    fn run<S: Simd>(self, simd: S) -> Self::Output;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Portable;
    #[cfg(target_arch = "x86_64")]
    use crate::simd::{avx2, avx512, Avx2Fma, Avx512};

    struct TransposeCheck;
    impl Kernel for TransposeCheck {
        type Output = ();
        #[inline(always)]
        fn run<S: Simd>(self, s: S) {
            let n = S::LANES;
            let m: Vec<f32> = (0..n * n).map(|x| x as f32).collect();
            let mut v: Vec<S::V> = (0..n).map(|r| s.load(&m[r * n..])).collect();
            s.transpose(&mut v);
            let mut got = vec![0.0; n];
            for (c, &x) in v.iter().enumerate() {
                s.store(&mut got, x);
                let want: Vec<f32> = (0..n).map(|r| m[r * n + c]).collect();
                assert_eq!(got, want, "column {c} of {n} lanes");
            }
        }
    }

    #[test]
    fn transpose_on_every_backend() {
        TransposeCheck.run(Portable);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(s) = Avx2Fma::detect() {
                avx2::run(s, TransposeCheck);
            }
            if let Some(s) = Avx512::detect() {
                avx512::run(s, TransposeCheck);
            }
        }
    }
}
