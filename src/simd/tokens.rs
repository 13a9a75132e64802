//! Proofs that the running CPU has an instruction set: zero-sized tokens whose only
//! constructors detect the features, so that holding one is the proof.
//!
//! They sit below everything else of the lanes, with no code but their detection: the
//! [`Simd`](super::lanes::Simd) trait names [`Bf16Dot`] (the proof that
//! [`Simd::pair_bf16`](super::lanes::Simd::pair_bf16) may use AVX512_BF16), and [`Bf16Dot`]
//! holds the AVX-512 lanes' token. The lanes of each backend (`avx2.rs`, `avx512.rs`) and their
//! `#[target_feature]` entry points take them; the entry point of [`Bf16Dot`] is in `bf16.rs`.

/// Proof that the running CPU supports AVX2, FMA and F16C (every AVX2 CPU has F16C): the only
/// constructor is [`Avx2Fma::detect`].
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2Fma {
    _proof: (),
}

#[cfg(target_arch = "x86_64")]
impl Avx2Fma {
    /// The token, if the CPU supports AVX2, FMA and F16C (`std` caches the CPUID query).
    pub fn detect() -> Option<Self> {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            Some(Self { _proof: () })
        } else {
            None
        }
    }
}

/// Proof that the running CPU supports AVX-512F and AVX-512VL (and FMA, which AVX-512F implies
/// for 512-bit vectors): the only constructor is [`Avx512::detect`].
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Avx512 {
    _proof: (),
}

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    /// The token, if the CPU supports AVX-512F and AVX-512VL (`std` caches the CPUID queries).
    pub fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl"))
            .then_some(Self { _proof: () })
    }
}

/// Proof that the running CPU has AVX-512F, BW, VL and BF16: the only constructor is
/// [`Bf16Dot::detect`]. (It holds the AVX-512 lanes' own token, whose lane sums the decode
/// dot tile uses.)
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bf16Dot {
    lanes: Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Bf16Dot {
    /// The token, if the CPU has the features (`std` caches the CPUID queries).
    pub fn detect() -> Option<Self> {
        let lanes = Avx512::detect()?;
        (is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512bf16"))
            .then_some(Self { lanes })
    }

    /// The AVX-512 lanes' token that this one holds (its features are a subset of these).
    #[inline(always)]
    pub fn lanes(self) -> Avx512 {
        self.lanes
    }
}

/// No AVX512_BF16 off x86-64: the token cannot exist.
///
/// Uninhabited: [`Bf16Dot::detect`] always answers `None`.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bf16Dot {}

#[cfg(not(target_arch = "x86_64"))]
impl Bf16Dot {
    pub fn detect() -> Option<Self> {
        None
    }
}
