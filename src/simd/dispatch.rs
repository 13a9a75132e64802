//! The backend of the process: detection (and `SDPA_BACKEND`), its register geometry, and
//! [`dispatch`], which runs a [`Kernel`] on its lanes through the backend's entry point.

use super::lanes::{Kernel, Simd};
use super::portable::{self, Portable};
#[cfg(target_arch = "x86_64")]
use super::tokens::{Avx2Fma, Avx512};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use std::sync::OnceLock;

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
