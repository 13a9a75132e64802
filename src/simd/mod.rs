//! Lanes: the per-ISA f32 code of the crate.
//!
//! The micro-kernels ([`crate::microkernel`]) are written once over the [`Simd`] trait, a handful
//! of f32 vector operations plus the register-tile geometry. Each backend implements it:
//! * [`Avx512`]: `core::arch` AVX-512F intrinsics (compiled with VL too), 16 lanes, 32 registers
//!   (12 × 32 tiles).
//! * [`Avx2Fma`](tokens::Avx2Fma): `core::arch` AVX2 + FMA intrinsics, 8 lanes, 16 registers
//!   (6 × 16 tiles).
//! * [`Portable`](portable::Portable): `wide::f32x8`, whatever the build enables (two SSE halves
//!   on a default x86-64 build, NEON on aarch64). Always available; the only one Miri runs.
//!
//! The `core::arch` kernels are instantiated inside `#[target_feature]` entry points and chosen at
//! run time, so a default build (no `-C target-cpu`) is fast on any x86-64 CPU.
//! [`backend`] picks one once per process; `SDPA_BACKEND=portable|avx2|avx512` forces a choice
//! (honoured where the CPU supports it) so that tests reach every backend on one machine.
//!
//! The only other per-ISA code is above the lanes: the bf16 dot-product tiles of
//! [`crate::microkernel::dpbf16`] (AVX512_BF16 intrinsics), on the token [`Bf16Dot`] and its
//! entry point from here.
//!
//! The files, each importing only the ones listed before it (this one only declares them and
//! re-exports what the rest of the crate uses):
//! * `tokens.rs`: the proofs of CPU features, [`Avx2Fma`](tokens::Avx2Fma), [`Avx512`] and
//!   [`Bf16Dot`], and their detection.
//! * `lanes.rs`: the traits [`Simd`], [`Lanes`] and [`Kernel`].
//! * `exp2.rs`: the polynomial [`exp2`](exp2()) on the lanes.
//! * `prefetch.rs`: [`RowStream`], the rows to prefetch, and the prefetch hint.
//! * `avx512.rs`, `avx2.rs`, `portable.rs`: each backend's lanes and `#[target_feature]` entry
//!   point.
//! * `bf16.rs`: [`Bf16Dot::run`], the entry point with AVX512_BF16 too, and the pairing of two
//!   vectors to bf16 that the AVX-512 lanes' [`Simd::pair_bf16`] uses.
//! * `dispatch.rs`: [`Backend`], [`backend`], [`Geometry`], [`geometry`] and
//!   [`dispatch`](dispatch()).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod bf16;
mod dispatch;
mod exp2;
mod lanes;
mod portable;
mod prefetch;
mod tokens;

pub use dispatch::{backend, Backend};
pub(crate) use dispatch::{dispatch, geometry, Geometry};
pub(crate) use exp2::exp2;
pub(crate) use lanes::{Kernel, Lanes, Simd};
pub(crate) use prefetch::RowStream;
#[cfg(target_arch = "x86_64")]
pub(crate) use tokens::Avx512;
pub(crate) use tokens::Bf16Dot;

// Used by the tests only (after the rest, where `scripts/layering.py` stops reading).
#[cfg(test)]
pub(crate) use portable::Portable;
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use tokens::Avx2Fma;
