//! Element types of Q, K/V and the output: `f32`, `half::f16`, `half::bf16`.
//!
//! Arithmetic is always f32 (scores, softmax, the output accumulator). Half-precision operands
//! are converted where the kernel loads them — Q when it is packed once per work item, K and V
//! rows block by block by the [`KvSource`](crate::fused) — never as a copy of the whole
//! operand; the output is rounded once, at the end, to its type (round to nearest even;
//! values beyond the type's range become ±∞, as IEEE rounding says: f16's largest finite value
//! is 65504).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

mod sealed {
    use super::{Dtype, KvPair, Slice, SliceMut};

    /// Names the concrete type behind a generic K/V type: the public generic functions hand
    /// their operands to one non-generic kernel entry point, so the kernel is compiled once,
    /// in this crate, not again in every crate that calls it.
    pub trait SealedKv: Sized {
        /// Which type this is.
        const DTYPE: Dtype;
        /// K's and V's elements, named by their type.
        fn pair<'a>(k: &'a [Self], v: &'a [Self]) -> KvPair<'a>;
        /// `x` stored as this type ([`super::store_kv`]).
        fn store(x: f32) -> Self;
    }

    /// The same for the types of Q and the output.
    pub trait Sealed: Sized {
        /// The elements, named by their type.
        fn slice(x: &[Self]) -> Slice<'_>;
        /// The elements, named by their type, writable.
        fn slice_mut(x: &mut [Self]) -> SliceMut<'_>;
    }

    impl SealedKv for i8 {
        const DTYPE: Dtype = Dtype::I8;
        fn pair<'a>(k: &'a [Self], v: &'a [Self]) -> KvPair<'a> {
            KvPair::I8(k, v)
        }
        fn store(x: f32) -> Self {
            // (Saturating, and NaN to 0: callers pass finite values already scaled.) Rounded
            // by adding and subtracting 1.5·2²³, which rounds a value of magnitude ≤ 127 to
            // the nearest integer, ties to even, as `round_ties_even` does; that is a library
            // call where the target lacks SSE4.1's `roundss` (x86-64's baseline), this is two
            // additions.
            const ROUND: f32 = 12_582_912.0;
            ((x.clamp(-127.0, 127.0) + ROUND) - ROUND) as i8
        }
    }

    macro_rules! sealed {
        ($($t:ty => $variant:ident),*) => {$(
            impl Sealed for $t {
                fn slice(x: &[Self]) -> Slice<'_> {
                    Slice::$variant(x)
                }
                fn slice_mut(x: &mut [Self]) -> SliceMut<'_> {
                    SliceMut::$variant(x)
                }
            }
            impl SealedKv for $t {
                const DTYPE: Dtype = Dtype::$variant;
                fn pair<'a>(k: &'a [Self], v: &'a [Self]) -> KvPair<'a> {
                    KvPair::$variant(k, v)
                }
                fn store(x: f32) -> Self {
                    <$t as super::Element>::from_f32(x)
                }
            }
        )*};
    }
    sealed!(f32 => F32, half::f16 => F16, half::bf16 => Bf16);
}

/// The element types, for the questions the kernel asks of a generic one in constant
/// expressions (`KV::DTYPE == Dtype::F16` picks the f16 kernels at compile time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    I8,
}

/// `x` stored as `T`: rounded to nearest (ties to even) for the float types; for `i8`, where
/// `x` is a value already divided by its scale, rounded to nearest (ties to even) and
/// saturated to ±127 (NaN to 0).
pub(crate) fn store_kv<T: KvElement>(x: f32) -> T {
    T::store(x)
}

/// The element type of `T`.
pub(crate) const fn dtype<T: KvElement>() -> Dtype {
    T::DTYPE
}

/// Elements of a generic [`Element`] type, named by their concrete type.
pub enum Slice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

/// [`Slice`], writable.
pub enum SliceMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
}

/// K's and V's elements of a generic [`KvElement`] type (the same for both), named by their
/// concrete type.
pub enum KvPair<'a> {
    F32(&'a [f32], &'a [f32]),
    F16(&'a [f16], &'a [f16]),
    Bf16(&'a [bf16], &'a [bf16]),
    I8(&'a [i8], &'a [i8]),
}

/// A type K and V may hold: the three [`Element`] types, and `i8`, 8-bit quantized values
/// that the kernel dequantizes as `value = i8 · scale` with the scales of
/// [`Options::kv_scales`](crate::Options::kv_scales). Sealed.
///
/// `i8` is a K/V type only: queries or an output of `i8` do not compile.
///
/// ```compile_fail
/// # use sdpa::{Options, Tensor, TensorMut};
/// let (q, k) = ([0i8; 4], [0i8; 4]);
/// let mut out = [0i8; 4];
/// let q = Tensor::bshd(&q, [1, 1, 1, 4]).unwrap();
/// let k = Tensor::bshd(&k, [1, 1, 1, 4]).unwrap();
/// let mut out = TensorMut::bshd(&mut out, [1, 1, 1, 4]).unwrap();
/// sdpa::attention(&q, &k, &k, &mut out, &Options::new()).unwrap();
/// ```
pub trait KvElement: sealed::SealedKv + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The type's name, for messages.
    const NAME: &'static str;
    /// Whether values are quantized: they then need [`Options::kv_scales`](crate::Options::kv_scales).
    const QUANTIZED: bool;
    /// The stored value as f64 (exact), before any scale.
    fn to_f64(self) -> f64;
}

impl KvElement for i8 {
    const NAME: &'static str = "i8";
    const QUANTIZED: bool = true;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

macro_rules! float_kv {
    ($($t:ty),*) => {$(
        impl KvElement for $t {
            const NAME: &'static str = stringify!($t);
            const QUANTIZED: bool = false;
            fn to_f64(self) -> f64 {
                f64::from(Element::to_f32(self))
            }
        }
    )*};
}
float_kv!(f32, f16, bf16);

/// A type Q, K, V or the output may hold: `f32`, [`half::f16`] or [`half::bf16`]. Sealed: the
/// kernels know each of them.
pub trait Element: KvElement + sealed::Sealed {
    /// Unit roundoff `u` (half an ulp at 1): `2⁻²⁴` for f32, `2⁻¹¹` for f16, `2⁻⁸` for bf16.
    const UNIT_ROUNDOFF: f64;
    /// The value as f32 (exact for all three types).
    fn to_f32(self) -> f32;
    /// The nearest value of this type (ties to even; ±∞ beyond its range; NaN stays NaN).
    fn from_f32(x: f32) -> Self;
    /// The slice itself if this type is f32, so the kernels can read it in place.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// The slice itself if this type is f16 (the kernels convert it with vector instructions).
    fn as_f16(_: &[Self]) -> Option<&[f16]> {
        None
    }
    /// The slice itself if this type is bf16 (the kernels convert it with vector instructions).
    fn as_bf16(_: &[Self]) -> Option<&[bf16]> {
        None
    }
    /// Converts `src` into `dst` (same length): `half`'s slice conversions, which use the CPU's
    /// conversion instructions (F16C) where it has them.
    fn convert_to_f32(src: &[Self], dst: &mut [f32]);
}

impl Element for f32 {
    const UNIT_ROUNDOFF: f64 = 1.0 / (1u64 << 24) as f64;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    #[inline(always)]
    fn convert_to_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Element for f16 {
    const UNIT_ROUNDOFF: f64 = 1.0 / (1u64 << 11) as f64;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn as_f16(s: &[Self]) -> Option<&[f16]> {
        Some(s)
    }
    #[inline(always)]
    fn convert_to_f32(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl Element for bf16 {
    const UNIT_ROUNDOFF: f64 = 1.0 / (1u64 << 8) as f64;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn as_bf16(s: &[Self]) -> Option<&[bf16]> {
        Some(s)
    }
    #[inline(always)]
    fn convert_to_f32(src: &[Self], dst: &mut [f32]) {
        // bf16 → f32 is exact: the bits shifted into the high half.
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_are_exact_and_round_to_nearest() {
        let xs = [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            1e-3,
            3.140625,
            f32::INFINITY,
        ];
        let mut out = [0.0f32; 8];
        let h: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        f16::convert_to_f32(&h, &mut out);
        for (o, x) in out.iter().zip(&h) {
            assert_eq!(o.to_bits(), x.to_f32().to_bits());
        }
        let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        bf16::convert_to_f32(&b, &mut out);
        for (o, x) in out.iter().zip(&b) {
            assert_eq!(o.to_bits(), x.to_f32().to_bits());
        }
        // Beyond f16's range: ±∞ (IEEE rounding), not a saturated value.
        assert_eq!(<f16 as Element>::from_f32(70000.0).to_f32(), f32::INFINITY);
        assert_eq!(<f16 as Element>::from_f32(-1e6).to_f32(), f32::NEG_INFINITY);
        assert!(<bf16 as Element>::from_f32(f32::NAN).to_f32().is_nan());
        // Ties to even: 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰ in f16.
        assert_eq!(<f16 as Element>::from_f32(1.0 + 1.0 / 2048.0).to_f32(), 1.0);
    }
}
