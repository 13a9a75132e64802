//! AMX tiles (AMX-TILE, AMX-BF16): prefill's two products for
//! [`Options::bf16_products`](crate::Options::bf16_products) as `tdpbf16ps` on tile registers,
//! where the CPU and the OS allow them.
//!
//! A tile register holds up to 16 rows of 64 bytes; `tdpbf16ps C, A, B` adds to each f32
//! `C[m][n]` the products of row `m` of A's bf16 pairs with column `n` of B's pairs,
//! `Σ_k A[m].pair[k] · B[k].pair[n]`: one instruction does 16 × 16 × 32 multiply-adds, 16 times
//! the work of one `vdpbf16ps`. The fused kernel's layouts fit it without a transposed operand
//! for the scores:
//! * scores, `Sᵀ = K · Qᵀ` (C = 16 keys × 16 query rows, stored straight into Sᵀ): A = 16 K
//!   rows of channel pairs, read where bf16 keys are stored (a bf16 row *is* a row of pairs);
//!   B = the Qᵀ panels by channel pairs, packed once per item.
//! * output, `O += P · V` (C = 16 rows × 16 channels of O): A = the weights by key pairs, row by
//!   row (the softmax's Pᵀ transposed as it is paired); B = the V block by key pairs, each word
//!   channel `x` of keys `2jp` and `2jp + 1` (the layout the bf16 dot products use already).
//!
//! Products of two tiles per operand (2 × 2 C tiles: 32 keys × 32 rows, or 32 rows × 32
//! channels) load four operand tiles per four `tdpbf16ps`. The softmax between the two products
//! is the vector kernel's, on the same Sᵀ.
//!
//! The kernels are written over a small interface ([`unit`]: the five instructions as
//! [`unit::TileOps`], every operand checked by [`unit::Unit`]) with two implementations: the
//! CPU's instructions through `asm!` ([`hardware`], x86-64) and a software model of them
//! ([`model`]: Intel's pseudocode of `tdpbf16ps`, denormals flushed), so that every machine
//! tests the packing, tails and options through the model (`SDPA_AMX=model`), and a machine
//! with AMX compares the two.
//!
//! Which one runs is decided once per process ([`tile_engine`]): the hardware where the CPU has
//! AMX-TILE and AMX-BF16, the OS saves the tile state, Linux grants it to the process, and the
//! AVX-512 backend with AVX512_BF16 runs (the softmax and the pairing use its vectors);
//! `SDPA_AMX=off`, or any `SDPA_BACKEND`, turns the tiles off.

#[cfg(target_arch = "x86_64")]
pub(crate) mod hardware;
pub(crate) mod kernels;
pub(crate) mod model;
pub(crate) mod unit;

use std::sync::OnceLock;
use unit::{TileConfig, TileOps, Unit};

/// Where the tile products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileEngine {
    /// The CPU's AMX tiles.
    #[cfg(target_arch = "x86_64")]
    Hardware(hardware::Amx),
    /// The software model of the instructions (`SDPA_AMX=model`: tests on any CPU).
    Model,
}

impl TileEngine {
    /// A tile unit on this engine (nothing configured yet; it releases the tiles when dropped).
    pub(crate) fn unit(self) -> Unit<Dispatch> {
        Unit::new(match self {
            #[cfg(target_arch = "x86_64")]
            TileEngine::Hardware(amx) => Dispatch::Hardware(hardware::Hardware(amx)),
            TileEngine::Model => Dispatch::Model(Box::default()),
        })
    }
}

/// The instructions of either engine, chosen per instruction by a match (a branch against an
/// instruction of 16 cycles or more), so that the kernels compile once, not once per engine.
pub(crate) enum Dispatch {
    #[cfg(target_arch = "x86_64")]
    Hardware(hardware::Hardware),
    Model(Box<model::Model>),
}

/// Forwards each instruction to the engine (the same safety contract).
macro_rules! forward {
    ($self:ident, $ops:ident => $call:expr) => {
        match $self {
            #[cfg(target_arch = "x86_64")]
            Dispatch::Hardware($ops) => $call,
            Dispatch::Model($ops) => $call,
        }
    };
}

impl TileOps for Dispatch {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        // SAFETY: the caller's contract, passed on.
        forward!(self, ops => unsafe { ops.configure(cfg) })
    }
    fn release(&mut self) {
        forward!(self, ops => ops.release())
    }
    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: the caller's contract, passed on.
        forward!(self, ops => unsafe { ops.zero::<T>() })
    }
    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        // SAFETY: the caller's contract, passed on.
        forward!(self, ops => unsafe { ops.load::<T>(src, stride) })
    }
    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        // SAFETY: the caller's contract, passed on.
        forward!(self, ops => unsafe { ops.store::<T>(dst, stride) })
    }
    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: the caller's contract, passed on.
        forward!(self, ops => unsafe { ops.dpbf16ps::<C, A, B>() })
    }
}

/// The tile engine of this process, if bf16 products use tiles: decided once and cached.
/// `SDPA_AMX=model` selects the software model on any CPU (but one whose AVX-512 backend lacks
/// AVX512_BF16, where the tiled loop is not compiled), `SDPA_AMX=off` (or any
/// `SDPA_BACKEND`, which asks for the vector kernels of a backend) none; otherwise the
/// hardware where [`hardware::Amx::detect`] allows it and the AVX-512 backend runs with
/// AVX512_BF16.
pub(crate) fn tile_engine() -> Option<TileEngine> {
    static CHOICE: OnceLock<Option<TileEngine>> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let env = |name| std::env::var(name).ok();
        match env("SDPA_AMX").as_deref() {
            Some("off") => return None,
            Some("model") => {
                // (The tiled loop runs on 8 lanes or on AVX-512 with BF16: see `Blocking`.)
                let lanes = crate::simd::geometry().lanes;
                let fits = lanes == 8 || super::dpbf16::bf16_dot().is_some();
                return fits.then_some(TileEngine::Model);
            }
            _ => {}
        }
        if env("SDPA_BACKEND").is_some() || cfg!(miri) {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if super::dpbf16::bf16_dot().is_some() {
            return hardware::Amx::detect().map(TileEngine::Hardware);
        }
        None
    })
}

/// Whether [`Options::bf16_products`](crate::Options::bf16_products) runs prefill's products
/// (score and output tiles of query rows stacked by kv head, more than half a vector of them)
/// on AMX tiles in this process: the CPU has AMX-TILE and AMX-BF16 and Linux lets the process
/// use them, the AVX-512 backend runs with AVX512_BF16, and neither `SDPA_AMX=off` nor any
/// `SDPA_BACKEND` is set. Also `true` under `SDPA_AMX=model`, which runs the same kernels on a
/// software model of the instructions (slow; for tests on CPUs without AMX: those with AVX2
/// or AVX512_BF16). Decode's few
/// rows per kv head take the bf16 dot products ([`bf16_products_available`]) either way.
///
/// [`bf16_products_available`]: crate::bf16_products_available
pub fn amx_available() -> bool {
    tile_engine().is_some()
}

#[cfg(test)]
mod tests;
