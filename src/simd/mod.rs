//! Lanes: the only per-ISA code in the crate.
//!
//! The micro-kernels ([`crate::microkernel`]) are written once over the [`Simd`] trait, a handful
//! of f32 vector operations plus the register-tile geometry. Each backend implements it:
//! * [`Avx512`]: `core::arch` AVX-512F intrinsics (compiled with VL too), 16 lanes, 32 registers
//!   (12 × 32 tiles).
//! * [`Avx2Fma`]: `core::arch` AVX2 + FMA intrinsics, 8 lanes, 16 registers (6 × 16 tiles).
//! * [`Portable`]: `wide::f32x8`, whatever the build enables (two SSE halves on a default x86-64
//!   build, NEON on aarch64). Always available; the only one Miri runs.
//!
//! The `core::arch` kernels are instantiated inside `#[target_feature]` entry points and chosen at
//! run time, so a default build (no `-C target-cpu`) is fast on any x86-64 CPU.
//! [`backend`] picks one once per process; `SDPA_BACKEND=portable|avx2|avx512` forces a choice
//! (honoured where the CPU supports it) so that tests reach every backend on one machine.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod dpbf16;
mod portable;

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2Fma;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;
pub(crate) use portable::Portable;

use crate::element::Element;
use half::{bf16, f16};
use std::sync::OnceLock;

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
    /// bf16(a[i]) | bf16(b[i]) << 16` for `i < LANES` (what [`dpbf16::Bf16Dot::interleave`]
    /// writes for two slices). AVX-512 converts with `vcvtne2ps2bf16` (inlined under
    /// [`dpbf16::Bf16Dot::run`]); the default rounds lane by lane, to nearest, ties to even,
    /// and differs from the instruction only where `vdpbf16ps` cannot tell: it keeps bf16
    /// subnormals, which the instruction flushes and `vdpbf16ps` reads as zero, and NaN
    /// payloads.
    #[inline(always)]
    fn pair_bf16(self, _: dpbf16::Bf16Dot, a: Self::V, b: Self::V, dst: &mut [f32]) {
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
    /// `x` itself if this type is `bf16` (the rows [`dpbf16::Bf16Dot`] reads as stored).
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

/// Rows to prefetch: row `j` starts `j · stride` bytes after `first` and is `bytes` long; rows
/// from `rows` on are never requested. Only ever used as a hint ([`prefetch`] reads nothing),
/// so the addresses are computed with wrapping arithmetic and may lie anywhere.
#[derive(Clone, Copy)]
pub(crate) struct RowStream {
    first: *const u8,
    stride: usize,
    bytes: usize,
    rows: usize,
}

impl RowStream {
    /// Rows `stride` bytes apart from `first`, `bytes` each, no limit on their count.
    pub fn new(first: *const u8, stride: usize, bytes: usize) -> Self {
        RowStream {
            first,
            stride,
            bytes,
            rows: usize::MAX,
        }
    }

    /// The first `rows` rows only.
    #[inline(always)]
    pub fn limit(self, rows: usize) -> Self {
        RowStream {
            rows: self.rows.min(rows),
            ..self
        }
    }

    /// The same rows from row `j` on.
    #[inline(always)]
    pub fn skip(self, j: usize) -> Self {
        RowStream {
            first: self.first.wrapping_add(j.wrapping_mul(self.stride)),
            rows: self.rows.saturating_sub(j),
            ..self
        }
    }

    /// The part of each row that holds columns `col .. col + n` of rows of `width` columns
    /// (in proportion to the row's bytes, whatever its element type).
    #[inline(always)]
    pub fn columns(self, col: usize, n: usize, width: usize) -> Self {
        let width = width.max(1);
        let start = self.bytes * col / width;
        RowStream {
            first: self.first.wrapping_add(start),
            bytes: (self.bytes * (col + n))
                .div_ceil(width)
                .saturating_sub(start),
            ..self
        }
    }

    /// Asks the CPU to start loading rows `j .. j + n` (those below the limit).
    #[inline(always)]
    pub fn request(&self, j: usize, n: usize) {
        let n = n.min(self.rows.saturating_sub(j));
        let mut row = self.first.wrapping_add(j.wrapping_mul(self.stride));
        for _ in 0..n {
            let mut line = 0;
            while line < self.bytes {
                prefetch(row.wrapping_add(line));
                line += 64;
            }
            row = row.wrapping_add(self.stride);
        }
    }
}

/// Asks the CPU to load the cache line holding `p` into its L2 (and L3; AMD cores before Zen 4
/// fill their L1 too): a hint that reads nothing, so any address is fine.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch never faults and has no effect visible to the program, whatever the
    // address (SSE is part of the x86-64 baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// The instruction sets the kernels can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// AVX-512F intrinsics (x86-64; the CPU must have AVX-512VL too), detected at run time.
    Avx512,
    /// AVX2 + FMA intrinsics (x86-64), detected at run time.
    Avx2Fma,
    /// `wide::f32x8`, compiled for whatever the build targets.
    Portable,
}

/// The register geometry the blocking of a call is derived from: it must be the geometry of
/// the backend that [`dispatch`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// f32 lanes per vector.
    pub lanes: usize,
    /// Register-tile height ([`Simd::TILE`]).
    pub tile: usize,
}

impl Geometry {
    fn of<S: Simd>() -> Self {
        Geometry {
            lanes: S::LANES,
            tile: S::TILE,
        }
    }

    /// The smallest number of keys that is both whole score tiles and whole vectors of lanes
    /// (24 on AVX2 and the portable backend, 48 on AVX-512): the step of key block sizes.
    pub fn key_step(self) -> usize {
        const fn gcd(a: usize, b: usize) -> usize {
            if b == 0 {
                a
            } else {
                gcd(b, a % b)
            }
        }
        self.tile * self.lanes / gcd(self.tile, self.lanes)
    }
}

/// The backend this process uses: the widest one the CPU supports, unless the environment
/// variable `SDPA_BACKEND` names another (`portable`, `avx2` or `avx512`; a backend the CPU
/// lacks, or any other value, leaves the automatic choice). Decided once and cached.
pub fn backend() -> Backend {
    static CHOICE: OnceLock<Backend> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let forced = std::env::var("SDPA_BACKEND").ok();
        if cfg!(miri) || forced.as_deref() == Some("portable") {
            return Backend::Portable;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = Avx512::detect().is_some();
            let avx2 = Avx2Fma::detect().is_some();
            match forced.as_deref() {
                Some("avx2") if avx2 => return Backend::Avx2Fma,
                _ if avx512 => return Backend::Avx512,
                _ if avx2 => return Backend::Avx2Fma,
                _ => {}
            }
        }
        Backend::Portable
    })
}

/// The bf16 dot-product kernels, where [`Options::bf16_products`](crate::Options::bf16_products)
/// can use them: the CPU has AVX512_BF16 and the process runs the AVX-512 backend (whose tile
/// geometry they share). Decided once and cached, like the backend.
pub(crate) fn bf16_dot() -> Option<dpbf16::Bf16Dot> {
    static CHOICE: OnceLock<Option<dpbf16::Bf16Dot>> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let geometry = geometry();
        let fits = geometry.lanes == 16 && geometry.tile == dpbf16::TILE;
        if fits && backend() == Backend::Avx512 {
            dpbf16::Bf16Dot::detect()
        } else {
            None
        }
    })
}

/// Whether [`Options::bf16_products`](crate::Options::bf16_products) takes effect in this
/// process (for bf16 Q and K/V): the CPU has bf16 dot products (AVX512_BF16, with
/// AVX-512F/BW/VL) and the AVX-512 backend runs (not forced to another with `SDPA_BACKEND`).
pub fn bf16_products_available() -> bool {
    bf16_dot().is_some()
}

/// The register geometry of [`backend`].
pub(crate) fn geometry() -> Geometry {
    match backend() {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => Geometry::of::<Avx512>(),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2Fma => Geometry::of::<Avx2Fma>(),
        _ => Geometry::of::<Portable>(),
    }
}

/// A computation generic over the lanes, run by [`dispatch`] on the chosen backend.
pub(crate) trait Kernel {
    /// What the computation returns.
    type Output;
    /// The body. Implementations mark it `#[inline(always)]` so that it is compiled inside the
    /// backend's `#[target_feature]` entry point.
    fn run<S: Simd>(self, simd: S) -> Self::Output;
}

/// Runs `kernel` on [`backend`]'s lanes (whose register geometry is [`geometry`]).
#[inline]
pub(crate) fn dispatch<K: Kernel>(kernel: K) -> K::Output {
    match backend() {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => match Avx512::detect() {
            Some(simd) => avx512::run(simd, kernel),
            None => unreachable!("backend() chose AVX-512 only after detecting it"),
        },
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2Fma => match Avx2Fma::detect() {
            Some(simd) => avx2::run(simd, kernel),
            None => unreachable!("backend() chose AVX2 only after detecting it"),
        },
        _ => portable::run(kernel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
