//! # sdpa: scaled dot-product attention on CPUs
//!
//! `out = softmax(Q·Kᵀ·scale) · V`, computed by a fused, FlashAttention-2-style kernel that never
//! materializes the `n_q × n_kv` score matrix, on hand-written SIMD micro-kernels chosen at run
//! time (AVX-512 or AVX2 + FMA where the CPU has them, portable `wide` lanes elsewhere; see
//! [`backend`]), parallel over the caller's rayon pool, and verified against a plain f64
//! [`mod@reference`].
//!
//! ```
//! use sdpa::{attention, Alignment, Options, Tensor, TensorMut};
//!
//! // One sequence, 3 tokens, 1 head, head size 2 (contiguous [batch, seq, heads, dim]).
//! let q = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0];
//! let v = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let mut out = [0.0f32; 6];
//! let q_view = Tensor::bshd(&q, [1, 3, 1, 2])?;
//! let v_view = Tensor::bshd(&v, [1, 3, 1, 2])?;
//! let mut out_view = TensorMut::bshd(&mut out, [1, 3, 1, 2])?;
//! attention(&q_view, &q_view, &v_view, &mut out_view, &Options::new())?;
//! assert!((out_view.as_tensor().get([0, 0, 0, 0]).unwrap() - 0.599).abs() < 1e-3);
//!
//! // Causal, with the diagonal aligned to the last key (what a KV-cache decode step needs).
//! let causal = Options::new().causal(Alignment::BottomRight);
//! attention(&q_view, &q_view, &v_view, &mut out_view, &causal)?;
//! assert_eq!(&out[..2], &[1.0, 0.0]); // row 0 sees key 0 only: v₀
//! # Ok::<(), sdpa::Error>(())
//! ```
//!
//! ## Element types
//! Q, K/V and the output each take `f32`, [`half::f16`] or [`half::bf16`] ([`Element`]); K and
//! V share one type, which may also be `i8` ([`KvElement`]) with f32 scales given by
//! [`Options::kv_scales`] (per tensor, per (token, kv head), per (kv head, channel), or any
//! other broadcast). Arithmetic is f32; half-precision and 8-bit inputs are converted where
//! blocks are loaded, and the output is rounded once, at the end, to its type.
//!
//! ## Paged caches and packed batches
//! [`attention_paged`] reads K/V from a paged cache ([`PagedKv`]: page pools and a block table,
//! as vLLM and FlashAttention-2 keep them); [`attention_varlen`] takes a packed batch of
//! variable-length sequences (`cu_seqlens`, as FlashAttention-2's varlen API) with K/V packed
//! or paged ([`VarlenKv`]). Both read rows where they lie; each sequence behaves as a dense
//! call of its own.
//!
//! ## Semantics
//! Shapes: Q `[B, n_q, H, d_k]`, K `[B, n_kv, H_kv, d_k]`, V `[B, n_kv, H_kv, d_v]`, out
//! `[B, n_q, H, d_v]`, any element strides. `H` must be a multiple of `H_kv`; query head `h`
//! reads key/value head `h / (H / H_kv)` (grouped-query and multi-query attention, no copy).
//!
//! For query row `i` and key `j`: `s_ij = scale · q_i·k_j`, then the [`Options`] in the order
//! their doc gives (softcap, ALiBi and bias, masks: hidden keys get `−∞`);
//! `p_ij = exp(s_ij − m_i) / Σ_j exp(s_ij − m_i)` (plus a sink term with [`Options::sinks`]);
//! `out_i = Σ_j p_ij v_j`; `lse_i = m_i + ln Σ_j exp(s_ij − m_i)`.
//!
//! ## Numerics
//! * A row with no visible key (`n_kv = 0`, a causal diagonal that starts past the keys, a key
//!   length of 0, a fully masked row): output 0 and `lse = −∞` — never NaN, never the mean of V.
//!   (With an attention sink: output 0 and `lse = σ_h`.)
//! * NaN in Q, K, V or a bias propagates to the outputs it touches, and only to those. A NaN
//!   (or ±∞) in `v_j` makes the output of every row that sees key `j` NaN or ±∞ (even where
//!   its weight rounds to 0: `0 · NaN = NaN`) and leaves every other row untouched — a row
//!   "sees" `j` when `j` passes its causal, window and key-length ranges and the boolean mask
//!   (a `−∞` bias gives weight 0 but still counts as seen, as in the reference, as long as
//!   some key of the row has a score above `−∞`; a row whose every score is `−∞` is a row
//!   with no visible key, sink or not). So an uninitialised KV-cache slot behind a mask or
//!   past `kv_lens` never leaks into results.
//! * ±∞ in Q or K follows IEEE arithmetic: an infinite score makes its row NaN (`∞ − ∞`).
//! * Huge finite logits (±1e4 and beyond) do not overflow: the running max is subtracted
//!   before exponentiating. The fused kernel scales the f32 dot products (by `scale`, then by
//!   `log₂e`), so each dot product and each scaled score must be representable in f32
//!   (`|q·k|, |s| < 3.4e38`; `|s| < 2.3e38` in log2 units), as in any f32 softmax.
//! * Values: like every FlashAttention-style kernel, the fused one accumulates the unnormalized
//!   `Σ_j p_ij v_j` (weights up to 1 each) and divides once at the end, so values must satisfy
//!   `|v| · n_visible < 3.4e38` (always true for `|v| < 3.4e38 / n_kv`); beyond that the
//!   accumulator can overflow to ±∞. The reference has no such limit.
//! * Accuracy: the fused result is within [`reference::error_bounds`] of the f64 reference, a
//!   worst-case bound derived from the f32 rounding of each step (its doc has the formula).
//! * Determinism: block sizes and key splits depend on the shape only, and every query row is
//!   reduced in one fixed order, so results are bitwise identical for any number of threads.
//!   The two backends may differ from each other in the last bits (FMA vs separate rounding).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod append;
mod element;
mod error;
mod fused;
mod kv_cache;
mod math;
mod merge;
mod microkernel;
mod options;
mod plan;
mod pool;
mod problem;
pub mod reference;
mod rope;
mod simd;
mod tensor;
mod workspace;

#[cfg(doctest)]
#[doc(hidden)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use append::{append, append_scaled, AppendScales};
pub use element::{Element, KvElement};
pub use error::{Dim, Error, Operand};
/// The `half` crate, whose `f16` and `bf16` are element types of this one.
pub use half;
pub use kv_cache::{PackedKv, PagedKv, VarlenKv};
pub use merge::{merge_partials, Partial};
pub use microkernel::amx::amx_available;
pub use microkernel::dpbf16::bf16_products_available;
pub use options::{alibi_slopes, Alignment, Options};
pub use plan::{Heads, Layer, Plan, StepKv};
pub use pool::KvPool;
pub use rope::{Rope, RopeStyle};
pub use simd::{backend, Backend};
pub use tensor::{Tensor, TensorMut};
pub use workspace::Workspace;

use problem::Problem;

/// Scaled dot-product attention, `out = softmax(Q·Kᵀ·scale) · V`, on the fused kernel.
///
/// Runs on the current rayon pool (`pool.install(|| sdpa::attention(…))` to choose one).
/// Extra memory is a few hundred KiB per worker, independent of the sequence lengths.
///
/// # Errors
/// [`Error::ShapeMismatch`] when the dims of K, V or `out` do not match Q's (and each other);
/// [`Error::HeadsNotDivisible`] when `H` is not a positive multiple of `H_kv`;
/// [`Error::ZeroHeadDim`] when `d_k = 0`; [`Error::InvalidScale`] for a NaN or infinite scale;
/// the option errors listed on [`Options`]; for `i8` K/V, [`Error::KvScales`] and the scale
/// errors listed on [`Options::kv_scales`]; [`Error::ScratchTooLarge`] when the per-worker
/// buffers cannot be allocated (only possible with broadcast views declaring a huge head size).
pub fn attention<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut TensorMut<'_, O>,
    opts: &Options<'_>,
) -> Result<(), Error> {
    Workspace::new().attention(q, k, v, out, opts)
}

/// [`attention`] that also writes the log-sum-exp of every row's scores: `lse[(b·H + h)·n_q + i]
/// = ln Σ_j exp(s_ij)` (natural log, over visible keys; `−∞` for a row with no visible key).
///
/// # Errors
/// As [`attention`], plus [`Error::LengthMismatch`] when `lse.len() ≠ B · H · n_q`.
pub fn attention_lse<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: &mut [f32],
    opts: &Options<'_>,
) -> Result<(), Error> {
    Workspace::new().attention_lse(q, k, v, out, lse, opts)
}

/// Attention over a paged K/V cache ([`PagedKv`]: page pools and a block table), as vLLM and
/// FlashAttention-2's `flash_attn_with_kvcache(…, block_table=…)` keep it. Q, `out` and `lse`
/// are as in [`attention_lse`] (`[B, n_q, H, d]`, LSE `[B, H, n_q]`, `None` to skip it); the
/// key buffer of sequence `b` is its `pages_per_seq · page_size` slots, of which
/// [`Options::kv_lens`] (required: a padded table row says nothing about the length) gives the
/// live keys (bottom-right alignment per sequence, as in a dense call). Results are bitwise
/// identical to [`attention_lse`] on the same keys stored densely.
///
/// # Errors
/// As [`attention_lse`] (K/V dims checked against Q's on `H_kv` and `d_k`), plus
/// [`Error::LengthMismatch`] (operand [`Operand::BlockTable`]) when the table does not have
/// `B · pages_per_seq` entries, the same error with operand [`Operand::KvLens`] and `got: 0`
/// without key lengths, and [`Error::InvalidValue`] (same operand) for an entry that a
/// sequence's length reaches and that is not a page of the pool; `kv_lens[b]` may not exceed
/// `pages_per_seq · page_size`.
pub fn attention_paged<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    kv: &PagedKv<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), Error> {
    Workspace::new().attention_paged(q, kv, out, lse, opts)
}

/// Attention over a packed batch of variable-length sequences, as FlashAttention-2's
/// `flash_attn_varlen_func`: Q is `[1, total_q, H, d_k]` with sequence `b` in rows
/// `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` (B + 1 non-decreasing offsets), `out` is
/// `[1, total_q, H, d_v]` alike, and `lse` (if given) is `[H, total_q]`: `lse[h · total_q + t]`
/// for packed row `t`. K/V are packed with their own offsets or paged ([`VarlenKv`]); each
/// sequence has its own `n_q` and keys, and bottom-right alignment is per sequence (its rows
/// are the last of its keys: chunked prefill and decode rows mix in one call). Packed rows
/// outside every sequence are not written. Bias and mask are indexed `[b, i, h, j]` within
/// each sequence and broadcast against `[B, max n_q, H, max keys]`.
///
/// # Errors
/// As [`attention_lse`], with [`Error::LengthMismatch`] / [`Error::InvalidValue`] for offsets
/// that are empty, decreasing or past the packed rows (operands [`Operand::CuSeqlensQ`],
/// [`Operand::CuSeqlensK`]; `cu_seqlens_k` needs B + 1 entries), for a block table as in
/// [`attention_paged`], and [`Error::ShapeMismatch`] when the batch dim of Q, K or `out` is not 1.
pub fn attention_varlen<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    cu_seqlens_q: &[usize],
    kv: &VarlenKv<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), Error> {
    Workspace::new().attention_varlen(q, cu_seqlens_q, kv, out, lse, opts)
}

/// The bytes of scratch memory the fused kernel allocates per worker thread for a call with
/// these operands and options (`k` and `v` as they would be passed to [`attention`]; the
/// output's dims follow from them). A call allocates this once per thread of the pool that runs
/// it (at most once per work unit), plus, for decode shapes split over keys, the partial
/// results of at most 32 work units. It depends on the head sizes, the GQA group and the
/// backend, never on the sequence lengths.
///
/// # Errors
/// As [`attention`] for the shapes and options.
pub fn scratch_bytes_per_thread<Q: Element, KV: KvElement>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    opts: &Options<'_>,
) -> Result<usize, Error> {
    let [batch, n_q, heads, _] = q.dims();
    let out_dims = [batch, n_q, heads, v.dims()[3]];
    let problem = Problem::new(q, k, v, out_dims, None, opts)?;
    fused::scratch_bytes(&problem, k, v)
}
