//! # sdpa-capi: the C ABI of sdpa
//!
//! `sdpa_attention`, `sdpa_reference_attention`, `sdpa_attention_paged` (paged K/V caches),
//! `sdpa_attention_varlen` (packed variable-length batches), `sdpa_merge_partials` and helpers
//! for C and C++ callers, built as a `cdylib` and a `staticlib`; the header `include/sdpa.h`
//! is generated from this file by cbindgen (a test fails when the committed header is stale).
//!
//! ## Contract
//! * Tensors are described by [`SdpaTensor`] / [`SdpaTensorMut`]: a data pointer, logical dims
//!   `[batch, seq, heads, dim]` and **element** strides (not bytes: divide ggml's `nb[i]` by the
//!   element size). Any strides work, including 0 (broadcast, read-only tensors only),
//!   padded and permuted layouts.
//! * Element types: Q, K/V and out each have one ([`SdpaAttentionArgs::q_dtype`],
//!   [`SdpaAttentionArgs::kv_dtype`], [`SdpaAttentionArgs::out_dtype`]): `float`, IEEE binary16
//!   or bfloat16, the two half types as `uint16_t` bit patterns; K/V also `int8_t` with `float`
//!   scales ([`SDPA_DTYPE_I8`], [`SdpaOptions::k_scales`]). Every combination runs natively
//!   (half and 8-bit operands are converted block by block inside the kernel, the output rounded
//!   once); arithmetic is f32, the LSE is always `float`.
//! * Every call validates everything it can before touching memory: null pointers, struct sizes,
//!   element types, alignment, and the number of elements each tensor reaches, computed from its
//!   dims and strides with checked arithmetic. The caller guarantees that each pointer is
//!   valid for that many elements and that the outputs do not overlap the inputs (overlaps the
//!   library can see are rejected with `SDPA_STATUS_ALIASED_BUFFERS`).
//! * Errors: every call returns an [`SdpaStatus`]; on failure `sdpa_last_error_message()` gives
//!   the text of the Rust error's `Display` (thread local). Panics never cross the boundary.
//! * Threads: see [`sdpa_set_num_threads`].

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use sdpa::half::{bf16, f16};
use sdpa::{
    Alignment, Element, KvElement, Operand, Options, PackedKv, PagedKv, Partial, Tensor, TensorMut,
    VarlenKv,
};

/// Version of this ABI. It changes only when an existing struct or function changes
/// incompatibly; new fields are appended to structs, whose `size` field tells which fields the
/// caller knows. (Appending `kv_dtype` and `out_dtype` to `sdpa_attention_args`, and
/// `bf16_products`, then `k_scales` and `v_scales`, to `sdpa_options`, kept it at 1: a caller
/// built against the first version still works unchanged.)
pub const SDPA_ABI_VERSION: u32 = 1;

/// Element type `float` (IEEE binary32). 0, so a zeroed struct means f32 everywhere.
pub const SDPA_DTYPE_F32: u32 = 0;
/// Element type IEEE binary16 (`_Float16`, ggml's `GGML_TYPE_F16`), passed as `uint16_t` bit
/// patterns; strides count 2-byte elements and pointers need 2-byte alignment.
pub const SDPA_DTYPE_F16: u32 = 1;
/// Element type bfloat16 (the upper half of a `float`), passed as `uint16_t` bit patterns;
/// strides count 2-byte elements and pointers need 2-byte alignment.
pub const SDPA_DTYPE_BF16: u32 = 2;
/// Element type `int8_t`, for K and V only (`kv_dtype`): 8-bit quantized values that the
/// kernel dequantizes as `value = int8 · scale` with the `float` scales of
/// `sdpa_options.k_scales` / `v_scales` (required with it). Q and out of this type are
/// `SDPA_STATUS_UNSUPPORTED_TYPE`.
pub const SDPA_DTYPE_I8: u32 = 3;

/// Alignment field value: the option is off (no causal mask, no window, no ALiBi).
pub const SDPA_ALIGN_NONE: u32 = 0;
/// Query row `i` is aligned with key `i` (PyTorch's `is_causal`).
pub const SDPA_ALIGN_TOP_LEFT: u32 = 1;
/// Query row `i` is aligned with key `i + n_kv − n_q` (FlashAttention-2; what a KV-cache
/// decode step needs: the last query row sees every key).
pub const SDPA_ALIGN_BOTTOM_RIGHT: u32 = 2;

/// The result of every call. `SDPA_STATUS_OK` is 0; the others name what was wrong, and
/// `sdpa_last_error_message()` says it in words.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdpaStatus {
    /// Success.
    Ok = 0,
    /// A required pointer (a struct, a tensor's data, an option's array) is NULL.
    NullPointer = 1,
    /// A struct's `size` field is not the size of one of its versions: `sizeof` in this ABI,
    /// or that of an earlier version of `sdpa_attention_args` or `sdpa_options`.
    InvalidStructSize = 2,
    /// An element type is not one of the `SDPA_DTYPE_*` values, or not one this function
    /// takes (`sdpa_merge_partials` takes f32 only).
    UnsupportedType = 3,
    /// A data pointer is not aligned to its element type.
    Misaligned = 4,
    /// An output overlaps an input or another output.
    AliasedBuffers = 5,
    /// An enum-like field (alignment, `kv_layout`) has a value outside its constants, or a
    /// field the chosen `kv_layout` does not use is set.
    InvalidArgument = 6,
    /// Dims and strides reach past the address space (`LayoutOverflow` in Rust).
    LayoutOverflow = 7,
    /// A buffer is shorter than its view needs (`SliceTooShort`).
    SliceTooShort = 8,
    /// Two logical indices of an output share one element (`OverlappingOutput`).
    OverlappingOutput = 9,
    /// A dimension of one tensor does not match the others (`ShapeMismatch`).
    ShapeMismatch = 10,
    /// Query heads are not a positive multiple of key/value heads (`HeadsNotDivisible`).
    HeadsNotDivisible = 11,
    /// Head size 0 for queries and keys (`ZeroHeadDim`).
    ZeroHeadDim = 12,
    /// An array has the wrong number of elements (`LengthMismatch`).
    LengthMismatch = 13,
    /// The scale is NaN or infinite (`InvalidScale`).
    InvalidScale = 14,
    /// The softcap is not finite and positive (`InvalidSoftcap`).
    InvalidSoftcap = 15,
    /// A value in kv_lens, slopes, sinks, a block table or sequence offsets is out of range
    /// (`InvalidValue`).
    InvalidValue = 16,
    /// A bias or mask does not broadcast to the scores (`NotBroadcastable`).
    NotBroadcastable = 17,
    /// Merge was given no partial results (`NoPartials`).
    NoPartials = 18,
    /// Causal, window and ALiBi use different alignments (`ConflictingAlignment`).
    ConflictingAlignment = 19,
    /// The reference's score matrix cannot be allocated (`ScoreMatrixTooLarge`).
    ScoreMatrixTooLarge = 20,
    /// The fused kernel's per-worker buffers cannot be allocated (`ScratchTooLarge`).
    ScratchTooLarge = 21,
    /// Too many rows to allocate per-row data (`TooManyRows`).
    TooManyRows = 22,
    /// The thread pool asked for with `sdpa_set_num_threads` could not be created.
    ThreadPool = 23,
    /// A Rust error this version of the C API does not know yet (the message says which).
    Other = 24,
    /// An internal panic was caught (a bug in sdpa: please report the message).
    Panic = 25,
    /// A buffer sized from the arguments cannot be allocated (`OutOfMemory`; also the mask
    /// copy and the LSE scratch of a merge).
    OutOfMemory = 26,
    /// `SDPA_DTYPE_I8` K/V without `k_scales` and `v_scales`, or scales with float K/V
    /// (`KvScales`).
    KvScales = 27,
}

/// A read-only strided tensor: `data` points to element `[0, 0, 0, 0]`; element
/// `[b, s, h, d]` is at `data[b·strides[0] + s·strides[1] + h·strides[2] + d·strides[3]]`.
///
/// Strides are in elements of the tensor's type (4 bytes for f32, 2 for f16/bf16), not bytes.
/// This descriptor is embedded by value in the versioned structs and never grows (a new tensor
/// kind would get a new struct).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaTensor {
    /// First element; NULL only where the field's documentation allows it (meaning "absent").
    pub data: *const c_void,
    /// Logical dims `[batch, seq, heads, dim]`.
    pub dims: [usize; 4],
    /// Element strides, one per logical dim.
    pub strides: [usize; 4],
}

/// A writable strided tensor, as `sdpa_tensor`. Its strides must not map two logical indices
/// to one element.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaTensorMut {
    /// First element.
    pub data: *mut c_void,
    /// Logical dims `[batch, seq, heads, dim]`.
    pub dims: [usize; 4],
    /// Element strides, one per logical dim.
    pub strides: [usize; 4],
}

/// The operands of `sdpa_attention` / `sdpa_reference_attention`.
///
/// Shapes: Q `[B, n_q, H, d_k]`, K `[B, n_kv, H_kv, d_k]`, V `[B, n_kv, H_kv, d_v]`, out
/// `[B, n_q, H, d_v]`; `H` a multiple of `H_kv` (GQA/MQA without copies).
///
/// Element types: `q_dtype` for Q, `kv_dtype` for K and V, `out_dtype` for out, each
/// `SDPA_DTYPE_F32`, `SDPA_DTYPE_F16` or `SDPA_DTYPE_BF16`, in any combination (an f16 KV
/// cache with f32 Q and out as llama.cpp keeps it; all bf16; …), and `kv_dtype` also
/// `SDPA_DTYPE_I8` (8-bit K/V with `sdpa_options.k_scales` / `v_scales`). A zeroed struct is
/// all f32.
/// A caller built against the first version of this struct (`size` ending at `lse_len`, where
/// `q_dtype` was named `dtype`) gets `kv_dtype = out_dtype = q_dtype`: `dtype` then keeps its
/// meaning of "the type of every operand".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaAttentionArgs {
    /// `sizeof(sdpa_attention_args)` as the caller compiled it.
    pub size: usize,
    /// Element type of Q (`SDPA_DTYPE_*`). In the first version of the struct, whose `size`
    /// ends at `lse_len`, this field was `dtype` and gives the type of every operand.
    pub q_dtype: u32,
    /// Queries.
    pub q: SdpaTensor,
    /// Keys.
    pub k: SdpaTensor,
    /// Values.
    pub v: SdpaTensor,
    /// Output.
    pub out: SdpaTensorMut,
    /// Optional log-sum-exp output (`float`, natural log), `lse[(b·H + h)·n_q + i]`; NULL for
    /// none.
    pub lse: *mut f32,
    /// Number of floats at `lse`: must be `B·H·n_q` when `lse` is not NULL.
    pub lse_len: usize,
    /// Element type of K and V (`SDPA_DTYPE_*`). Added after the first version: absent
    /// (a smaller `size`) means `q_dtype`.
    pub kv_dtype: u32,
    /// Element type of out (`SDPA_DTYPE_*`). Added after the first version: absent (a smaller
    /// `size`) means `q_dtype`.
    pub out_dtype: u32,
}

/// `sizeof(sdpa_attention_args)` of the first version of the struct (no `kv_dtype`,
/// `out_dtype`).
const ATTENTION_ARGS_V1_SIZE: usize = std::mem::offset_of!(SdpaAttentionArgs, kv_dtype);

/// Options of an attention call. All-zero bytes (after setting `size`) mean plain attention
/// with scale `1/√d_k`; a NULL options pointer means the same.
///
/// The formulas of each option are those of the Rust `sdpa::Options`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaOptions {
    /// `sizeof(sdpa_options)` as the caller compiled it.
    pub size: usize,
    /// Nonzero: use `scale` instead of `1/√d_k`.
    pub has_scale: u32,
    /// The softmax scale (must be finite).
    pub scale: f32,
    /// Causal mask: `SDPA_ALIGN_NONE` (off), `SDPA_ALIGN_TOP_LEFT` or `SDPA_ALIGN_BOTTOM_RIGHT`.
    pub causal: u32,
    /// Sliding window: `SDPA_ALIGN_NONE` (off) or the alignment of its diagonal.
    pub window: u32,
    /// Keys visible to the left of the diagonal (`SIZE_MAX`: unbounded).
    pub window_left: usize,
    /// Keys visible to the right of the diagonal (`SIZE_MAX`: unbounded; 0 with causal).
    pub window_right: usize,
    /// Per-sequence key lengths (`size_t`, one per batch), or NULL.
    pub kv_lens: *const usize,
    /// Entries at `kv_lens`.
    pub kv_lens_len: usize,
    /// Additive `float` bias, logical dims `[B, n_q, H, n_kv]` (each dim may be 1 or have
    /// stride 0 to broadcast); `bias.data` NULL for none.
    pub bias: SdpaTensor,
    /// Boolean mask of bytes (`uint8_t`, nonzero = visible), dims and broadcasting as `bias`;
    /// `mask.data` NULL for none.
    pub mask: SdpaTensor,
    /// ALiBi: `SDPA_ALIGN_NONE` (off) or the alignment of its diagonal.
    pub alibi: u32,
    /// One slope per query head (see `sdpa_alibi_slopes`).
    pub alibi_slopes: *const f32,
    /// Entries at `alibi_slopes`.
    pub alibi_slopes_len: usize,
    /// Nonzero: apply `cap·tanh(s/cap)` with `cap = softcap`.
    pub has_softcap: u32,
    /// The softcap (finite, positive).
    pub softcap: f32,
    /// Attention-sink logits, one per query head, or NULL.
    pub sinks: *const f32,
    /// Entries at `sinks`.
    pub sinks_len: usize,
    /// Nonzero: the two products may run as bf16 dot products with f32 accumulation
    /// when Q and K/V are bf16 and the CPU has them (`sdpa_bf16_products_available`); the
    /// softmax weights are then rounded to bf16 before `P·V`, as FlashAttention does on GPUs.
    /// See the Rust `sdpa::Options::bf16_products` for what changes and the error bound.
    /// Added in the struct's second version: a caller whose `size` ends at `sinks_len` gets
    /// it off.
    pub bf16_products: u32,
    /// The `float` scales of `SDPA_DTYPE_I8` keys (`key = int8 · scale`): a view that
    /// broadcasts against K's dims (a dim of size 1 or stride 0 repeats): per tensor
    /// `[1, 1, 1, 1]`, per (token, kv head) `[B, n_kv, H_kv, 1]` (page pools: `[num_pages,
    /// page_size, H_kv, 1]`), per (kv head, channel) `[1, 1, H_kv, d_k]`. Every scale the call
    /// reads must be finite with `|scale|·128` finite. `k_scales.data` NULL for none; required
    /// with 8-bit K/V, and a typed error (`SDPA_STATUS_KV_SCALES`) with float K/V. Added in the
    /// struct's third version: a caller whose `size` ends at `bf16_products` has none.
    pub k_scales: SdpaTensor,
    /// The scales of `SDPA_DTYPE_I8` values, as `k_scales` against V's dims.
    pub v_scales: SdpaTensor,
}

/// `sizeof(sdpa_options)` of the first version of the struct (no `bf16_products`).
const OPTIONS_V1_SIZE: usize = std::mem::offset_of!(SdpaOptions, bf16_products);
/// `sizeof(sdpa_options)` of the second version (no `k_scales`, `v_scales`).
const OPTIONS_V2_SIZE: usize = std::mem::offset_of!(SdpaOptions, k_scales);

/// One partial result for `sdpa_merge_partials`: an output over a subset of the keys and its
/// LSE, as written by `sdpa_attention` with an LSE pointer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaPartial {
    /// The partial output, `[B, n_q, H, d_v]` floats.
    pub out: SdpaTensor,
    /// Its LSE, `B·H·n_q` floats.
    pub lse: *const f32,
    /// Entries at `lse`.
    pub lse_len: usize,
}

/// The operands of `sdpa_merge_partials`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaMergeArgs {
    /// `sizeof(sdpa_merge_args)` as the caller compiled it.
    pub size: usize,
    /// Element type of the partial and merged outputs: `SDPA_DTYPE_F32` only (write partials
    /// with `out_dtype = SDPA_DTYPE_F32`; others give `SDPA_STATUS_UNSUPPORTED_TYPE`).
    pub dtype: u32,
    /// The partial results.
    pub parts: *const SdpaPartial,
    /// Entries at `parts` (at least 1).
    pub n_parts: usize,
    /// The merged output.
    pub out: SdpaTensorMut,
    /// The merged LSE (`B·H·n_q` floats), or NULL if not wanted.
    pub lse: *mut f32,
    /// Entries at `lse`.
    pub lse_len: usize,
}

/// `kv_layout` of `sdpa_varlen_args`: K and V packed like the queries, `[1, total_kv, H_kv, d]`,
/// sequence `b`'s keys in rows `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]`. 0, so a zeroed struct
/// is packed.
pub const SDPA_KV_PACKED: u32 = 0;
/// `kv_layout` of `sdpa_varlen_args`: K and V in page pools `[num_pages, page_size, H_kv, d]`
/// with a block table, as in `sdpa_paged_args`.
pub const SDPA_KV_PAGED: u32 = 1;

/// The operands of `sdpa_attention_paged`: attention over a paged K/V cache (vLLM's
/// `block_tables`, FlashAttention-2's `block_table`).
///
/// Shapes: Q `[B, n_q, H, d_k]`, out `[B, n_q, H, d_v]` and the LSE (`B·H·n_q` floats,
/// `lse[(b·H + h)·n_q + i]`) as in `sdpa_attention_args`. K and V are page pools with logical
/// dims `[num_pages, page_size, H_kv, d_k]` and `[num_pages, page_size, H_kv, d_v]` and any
/// element strides (vLLM v1's `[num_pages, page_size, H_kv, d]` is contiguous; a
/// `[num_pages, H_kv, page_size, d]` pool is a permuted view). Row `b` of the block table
/// (`pages_per_seq` entries, row-major `[B][pages_per_seq]`) lists the pages of sequence `b`
/// in key order: its key `j` is slot `j % page_size` of page
/// `block_table[b·pages_per_seq + j / page_size]`. Pages may repeat across rows (shared
/// prefixes; the call only reads them).
///
/// Key lengths are required: `kv_lens` of `sdpa_options` (`B` entries, each at most
/// `pages_per_seq·page_size`); without them the call fails with
/// `SDPA_STATUS_LENGTH_MISMATCH` (a padded table row says nothing about the length). Only the
/// table entries a sequence's length reaches are read, and each must be below `num_pages`
/// (`SDPA_STATUS_INVALID_VALUE` otherwise), so the rest of a row may hold anything. Element
/// types as in `sdpa_attention_args`, any combination; a zeroed struct is all f32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaPagedArgs {
    /// `sizeof(sdpa_paged_args)` as the caller compiled it.
    pub size: usize,
    /// Element type of Q (`SDPA_DTYPE_*`).
    pub q_dtype: u32,
    /// Element type of both page pools (`SDPA_DTYPE_*`).
    pub kv_dtype: u32,
    /// Element type of out (`SDPA_DTYPE_*`).
    pub out_dtype: u32,
    /// Queries, `[B, n_q, H, d_k]`.
    pub q: SdpaTensor,
    /// The key page pool, `[num_pages, page_size, H_kv, d_k]`.
    pub k: SdpaTensor,
    /// The value page pool, `[num_pages, page_size, H_kv, d_v]` (pages, page size and heads
    /// as `k`).
    pub v: SdpaTensor,
    /// Page indices, `[B][pages_per_seq]` row-major (a non-negative `int32_t` table, as vLLM
    /// keeps it, has the same bits). NULL only when `block_table_len` is 0.
    pub block_table: *const u32,
    /// Entries at `block_table`: must be `B·pages_per_seq`.
    pub block_table_len: usize,
    /// Entries per row of the table (pages a sequence can hold).
    pub pages_per_seq: usize,
    /// Output, `[B, n_q, H, d_v]`.
    pub out: SdpaTensorMut,
    /// Optional log-sum-exp output (`float`), `lse[(b·H + h)·n_q + i]`; NULL for none.
    pub lse: *mut f32,
    /// Number of floats at `lse`: must be `B·H·n_q` when `lse` is not NULL.
    pub lse_len: usize,
}

/// The operands of `sdpa_attention_varlen`: a packed batch of variable-length sequences
/// (FlashAttention-2's `flash_attn_varlen_func`; chunked prefill and decode rows in one call).
///
/// Q is `[1, total_q, H, d_k]` with sequence `b` in rows `cu_seqlens_q[b] .. cu_seqlens_q[b+1]`
/// (`B + 1` non-decreasing offsets, the last at most `total_q`); out is `[1, total_q, H, d_v]`
/// alike (rows outside every sequence are not written); the LSE is `[H, total_q]`:
/// `lse[h·total_q + t]` for packed row `t`. K and V are packed (`kv_layout = SDPA_KV_PACKED`:
/// `[1, total_kv, H_kv, d]` with `cu_seqlens_k`, `B + 1` offsets; `kv_lens` may shorten a
/// sequence's keys) or paged (`SDPA_KV_PAGED`: page pools and block table as in
/// `sdpa_paged_args`, `kv_lens` required). Each sequence is a dense call of its own:
/// bottom-right alignment puts its rows at the end of its own keys, bias and mask are indexed
/// `[b, i, h, j]` within it and broadcast against `[B, max n_q, H, max keys]`.
///
/// Offsets are `int32_t`, as FlashAttention and vLLM keep them (`torch.int32`), so an engine
/// passes its buffers as they are; the call converts them to the Rust API's `size_t` offsets
/// (a negative entry is `SDPA_STATUS_INVALID_VALUE`). The fields of the layout not in use
/// must be zero/NULL (`SDPA_STATUS_INVALID_ARGUMENT` otherwise). Element types as in
/// `sdpa_attention_args`, any combination; a zeroed struct is all f32, packed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaVarlenArgs {
    /// `sizeof(sdpa_varlen_args)` as the caller compiled it.
    pub size: usize,
    /// Element type of Q (`SDPA_DTYPE_*`).
    pub q_dtype: u32,
    /// Element type of K and V (`SDPA_DTYPE_*`).
    pub kv_dtype: u32,
    /// Element type of out (`SDPA_DTYPE_*`).
    pub out_dtype: u32,
    /// `SDPA_KV_PACKED` (K/V packed with `cu_seqlens_k`) or `SDPA_KV_PAGED` (page pools with
    /// `block_table`).
    pub kv_layout: u32,
    /// Packed queries, `[1, total_q, H, d_k]`.
    pub q: SdpaTensor,
    /// Query offsets (`int32_t`, `B + 1` non-decreasing, non-negative). NULL only when
    /// `cu_seqlens_q_len` is 0.
    pub cu_seqlens_q: *const i32,
    /// Entries at `cu_seqlens_q` (`B + 1`).
    pub cu_seqlens_q_len: usize,
    /// Keys: packed `[1, total_kv, H_kv, d_k]`, or the key page pool
    /// `[num_pages, page_size, H_kv, d_k]`.
    pub k: SdpaTensor,
    /// Values: packed `[1, total_kv, H_kv, d_v]`, or the value page pool
    /// `[num_pages, page_size, H_kv, d_v]`.
    pub v: SdpaTensor,
    /// Packed layout: key offsets (`int32_t`, `B + 1` non-decreasing, non-negative, the last at
    /// most `total_kv`). Paged layout: NULL.
    pub cu_seqlens_k: *const i32,
    /// Entries at `cu_seqlens_k` (packed: `B + 1`; paged: 0).
    pub cu_seqlens_k_len: usize,
    /// Paged layout: page indices `[B][pages_per_seq]` as in `sdpa_paged_args`. Packed
    /// layout: NULL.
    pub block_table: *const u32,
    /// Entries at `block_table` (paged: `B·pages_per_seq`; packed: 0).
    pub block_table_len: usize,
    /// Paged layout: entries per row of the table. Packed layout: 0.
    pub pages_per_seq: usize,
    /// Output, `[1, total_q, H, d_v]`.
    pub out: SdpaTensorMut,
    /// Optional log-sum-exp output (`float`), `lse[h·total_q + t]`; NULL for none.
    pub lse: *mut f32,
    /// Number of floats at `lse`: must be `H·total_q` when `lse` is not NULL.
    pub lse_len: usize,
}

// ---------------------------------------------------------------------------------------------
// Errors

/// A failed call: the status and its message.
struct Failure {
    status: SdpaStatus,
    message: String,
}

impl Failure {
    fn new(status: SdpaStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<sdpa::Error> for Failure {
    fn from(e: sdpa::Error) -> Self {
        use sdpa::Error as E;
        let status = match &e {
            E::LayoutOverflow { .. } => SdpaStatus::LayoutOverflow,
            E::SliceTooShort { .. } => SdpaStatus::SliceTooShort,
            E::OverlappingOutput { .. } => SdpaStatus::OverlappingOutput,
            E::ShapeMismatch { .. } => SdpaStatus::ShapeMismatch,
            E::HeadsNotDivisible { .. } => SdpaStatus::HeadsNotDivisible,
            E::ZeroHeadDim => SdpaStatus::ZeroHeadDim,
            E::LengthMismatch { .. } => SdpaStatus::LengthMismatch,
            E::InvalidScale(_) => SdpaStatus::InvalidScale,
            E::InvalidSoftcap(_) => SdpaStatus::InvalidSoftcap,
            E::InvalidValue { .. } => SdpaStatus::InvalidValue,
            E::NotBroadcastable { .. } => SdpaStatus::NotBroadcastable,
            E::NoPartials => SdpaStatus::NoPartials,
            E::ConflictingAlignment => SdpaStatus::ConflictingAlignment,
            E::ScoreMatrixTooLarge { .. } => SdpaStatus::ScoreMatrixTooLarge,
            E::ScratchTooLarge { .. } => SdpaStatus::ScratchTooLarge,
            E::TooManyRows { .. } => SdpaStatus::TooManyRows,
            E::OutOfMemory { .. } => SdpaStatus::OutOfMemory,
            E::KvScales { .. } => SdpaStatus::KvScales,
            _ => SdpaStatus::Other,
        };
        Failure::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // `try_with`: a call from a thread-local destructor must not panic here.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

/// Runs one entry point: clears the thread's message, catches panics, records failures.
fn guard(f: impl FnOnce() -> Result<(), Failure>) -> SdpaStatus {
    let result = catch_unwind(AssertUnwindSafe(f));
    let failure = match result {
        Ok(Ok(())) => {
            set_last_error("");
            return SdpaStatus::Ok;
        }
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_string());
            Failure::new(SdpaStatus::Panic, format!("internal panic in sdpa: {what}"))
        }
    };
    // Formatting the message cannot panic in practice; stay abort-free regardless.
    let _ = catch_unwind(AssertUnwindSafe(|| set_last_error(&failure.message)));
    failure.status
}

// ---------------------------------------------------------------------------------------------
// Threads

/// 0: rayon's global pool; n ≥ 1: a private pool of n threads per calling thread.
static NUM_THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static POOL: RefCell<Option<(usize, rayon::ThreadPool)>> = const { RefCell::new(None) };
}

/// Runs `f` on the pool `sdpa_set_num_threads` selected.
fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R, Failure> {
    let n = NUM_THREADS.load(Ordering::Relaxed);
    if n == 0 {
        return Ok(f());
    }
    POOL.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(threads, _)| *threads != n) {
            *slot = None; // free the old pool's threads before spawning new ones
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("sdpa-{i}"))
                .build()
                .map_err(|e| {
                    Failure::new(
                        SdpaStatus::ThreadPool,
                        format!("cannot create a pool of {n} threads: {e}"),
                    )
                })?;
            *slot = Some((n, pool));
        }
        let (_, pool) = slot.as_ref().expect("pool just set");
        Ok(pool.install(f))
    })
}

// ---------------------------------------------------------------------------------------------
// Validation of raw inputs

fn operand_name(operand: Operand) -> String {
    operand.to_string()
}

/// Elements a view reaches (largest index + 1, 0 if empty), as `sdpa::Tensor::new` computes it.
fn reach(dims: [usize; 4], strides: [usize; 4]) -> Result<usize, Failure> {
    if dims.contains(&0) {
        return Ok(0);
    }
    let overflow = || Failure::from(sdpa::Error::LayoutOverflow { dims, strides });
    let mut last = 0usize;
    for (&n, &s) in dims.iter().zip(&strides) {
        let span = (n - 1).checked_mul(s).ok_or_else(overflow)?;
        last = last.checked_add(span).ok_or_else(overflow)?;
    }
    last.checked_add(1).ok_or_else(overflow)
}

/// A byte range `[start, end)` some call reads or writes, for the overlap check.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

impl Span {
    fn overlaps(self, other: Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Checks a raw array of `len` elements of `T` and returns its byte span. `what` names it in
/// messages.
fn check_array<T>(ptr: *const T, len: usize, what: &str) -> Result<Span, Failure> {
    if ptr.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL"),
        ));
    }
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Failure::new(
            SdpaStatus::Misaligned,
            format!(
                "{what}: pointer {ptr:p} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Failure::new(
                SdpaStatus::LayoutOverflow,
                format!("{what}: {len} elements do not fit in the address space"),
            )
        })?;
    let start = ptr as usize;
    let end = start.checked_add(bytes).ok_or_else(|| {
        Failure::new(
            SdpaStatus::LayoutOverflow,
            format!("{what}: {len} elements from {ptr:p} wrap around the address space"),
        )
    })?;
    Ok(Span { start, end })
}

/// A validated tensor: its elements as a slice, and the span for overlap checks.
struct Raw<'a, T> {
    slice: &'a [T],
    dims: [usize; 4],
    strides: [usize; 4],
    span: Span,
}

/// # Safety
/// `t.data`, when it passes the checks, must be valid for reads of the elements the view
/// reaches, for `'a`.
unsafe fn raw_tensor<'a, T>(t: &SdpaTensor, what: &str) -> Result<Raw<'a, T>, Failure> {
    let len = reach(t.dims, t.strides)?;
    let ptr = t.data as *const T;
    let span = check_array(ptr, len, what)?;
    // SAFETY: non-null, aligned, `len · size_of::<T>() ≤ isize::MAX` without wrapping (checked
    // above); validity for reads is the caller's contract.
    let slice = unsafe { std::slice::from_raw_parts(ptr, len) };
    Ok(Raw {
        slice,
        dims: t.dims,
        strides: t.strides,
        span,
    })
}

/// An input tensor of elements `T` (alignment and byte span from `T`'s size).
///
/// # Safety
/// As [`raw_tensor`].
unsafe fn input<'a, T>(t: &SdpaTensor, operand: Operand) -> Result<(Tensor<'a, T>, Span), Failure> {
    // SAFETY: forwarded.
    let raw = unsafe { raw_tensor::<T>(t, &format!("{} tensor", operand_name(operand))) }?;
    Ok((Tensor::new(raw.slice, raw.dims, raw.strides)?, raw.span))
}

/// An output tensor of elements `T`, checked against the read spans.
///
/// # Safety
/// `t.data` must be valid for reads and writes of the elements the view reaches, for `'a`, and
/// nothing else may access them meanwhile.
unsafe fn output<'a, T>(
    t: &SdpaTensorMut,
    reads: &[Span],
) -> Result<(TensorMut<'a, T>, Span), Failure> {
    let len = reach(t.dims, t.strides)?;
    let ptr = t.data as *mut T;
    let span = check_array(ptr.cast_const(), len, "output tensor")?;
    check_disjoint(span, reads, "output tensor")?;
    // SAFETY: as in `raw_tensor`; exclusive access is the caller's contract, and the output is
    // disjoint from every input the call reads (checked above).
    let slice = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    Ok((TensorMut::new(slice, t.dims, t.strides)?, span))
}

/// An optional `f32` output array of `len` elements (NULL: none).
///
/// # Safety
/// `ptr`, if not NULL, must be valid for reads and writes of `len` floats, exclusively.
unsafe fn output_array<'a>(
    ptr: *mut f32,
    len: usize,
    reads: &[Span],
    what: &str,
) -> Result<Option<&'a mut [f32]>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    let span = check_array(ptr.cast_const(), len, what)?;
    check_disjoint(span, reads, what)?;
    // SAFETY: checked above; validity and exclusivity are the caller's contract.
    Ok(Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) }))
}

/// An optional input array of `len` elements (NULL: none).
///
/// # Safety
/// `ptr`, if not NULL, must be valid for reads of `len` elements.
unsafe fn input_array<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
    spans: &mut Vec<Span>,
) -> Result<Option<&'a [T]>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    spans.push(check_array(ptr, len, what)?);
    // SAFETY: checked above; validity is the caller's contract.
    Ok(Some(unsafe { std::slice::from_raw_parts(ptr, len) }))
}

fn check_disjoint(span: Span, others: &[Span], what: &str) -> Result<(), Failure> {
    if span.start == span.end {
        return Ok(());
    }
    if others.iter().any(|&o| o.start != o.end && span.overlaps(o)) {
        return Err(Failure::new(
            SdpaStatus::AliasedBuffers,
            format!("{what} overlaps an input or another output of the call"),
        ));
    }
    Ok(())
}

/// Reads a versioned struct of which the caller knows `size` bytes (fields past them stay zero,
/// which every struct here reads as "absent / off"). `size` must be one of `versions`, the
/// sizes of the struct's earlier versions (a size between two versions is not a struct); the
/// current one, `sizeof(T)`, is always accepted.
///
/// Returns the struct and the caller's `size`.
///
/// # Safety
/// `ptr`, if not NULL, must be valid for reads of `*ptr.size` bytes.
unsafe fn read_versioned<T: Copy>(
    ptr: *const T,
    versions: &[usize],
    what: &str,
) -> Result<(T, usize), Failure> {
    if ptr.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL"),
        ));
    }
    // Every versioned struct starts with `size_t size`; read it alone first.
    // SAFETY: the caller's struct has at least that field.
    let size = unsafe { (ptr as *const usize).read_unaligned() };
    let full = std::mem::size_of::<T>();
    if size != full && !versions.contains(&size) {
        let earlier: String = versions.iter().map(|v| format!(" or {v}")).collect();
        return Err(Failure::new(
            SdpaStatus::InvalidStructSize,
            format!(
                "{what}: size is {size}, expected {full} (sizeof the struct in this ABI){earlier}"
            ),
        ));
    }
    // SAFETY: all-zero bytes are a valid `T` (integers, floats, raw pointers), and the caller's
    // struct holds `size` readable bytes.
    unsafe {
        let mut value = std::mem::MaybeUninit::<T>::zeroed();
        std::ptr::copy_nonoverlapping(ptr as *const u8, value.as_mut_ptr() as *mut u8, size);
        Ok((value.assume_init(), size))
    }
}

/// An element type the attention calls take (`I8` for K/V only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    F32,
    F16,
    Bf16,
    I8,
}

/// The failure for an `int8_t` Q or output.
fn kv_only(operand: &str) -> Failure {
    Failure::new(
        SdpaStatus::UnsupportedType,
        format!("{operand}: SDPA_DTYPE_I8 is a K/V type only"),
    )
}

fn dtype(value: u32, what: &str) -> Result<Dtype, Failure> {
    match value {
        SDPA_DTYPE_F32 => Ok(Dtype::F32),
        SDPA_DTYPE_F16 => Ok(Dtype::F16),
        SDPA_DTYPE_BF16 => Ok(Dtype::Bf16),
        SDPA_DTYPE_I8 => Ok(Dtype::I8),
        other => Err(Failure::new(
            SdpaStatus::UnsupportedType,
            format!("{what}: unknown element type {other} (not an SDPA_DTYPE_* value)"),
        )),
    }
}

fn alignment(value: u32, what: &str) -> Result<Option<Alignment>, Failure> {
    match value {
        SDPA_ALIGN_NONE => Ok(None),
        SDPA_ALIGN_TOP_LEFT => Ok(Some(Alignment::TopLeft)),
        SDPA_ALIGN_BOTTOM_RIGHT => Ok(Some(Alignment::BottomRight)),
        other => Err(Failure::new(
            SdpaStatus::InvalidArgument,
            format!("{what}: {other} is not an SDPA_ALIGN_* value"),
        )),
    }
}

/// Owned pieces the options borrow: the mask converted to `bool`.
struct MaskCopy {
    data: Vec<bool>,
    dims: [usize; 4],
    strides: [usize; 4],
}

/// Copies a byte mask into `bool`s (nonzero = visible), keeping broadcast dims (size 1 or
/// stride 0) broadcast, so the copy is no larger than the distinct elements the view holds.
///
/// # Safety
/// As [`raw_tensor`].
unsafe fn copy_mask(t: &SdpaTensor, spans: &mut Vec<Span>) -> Result<MaskCopy, Failure> {
    // SAFETY: forwarded.
    let raw = unsafe { raw_tensor::<u8>(t, "mask tensor") }?;
    spans.push(raw.span);
    // Validate the view as sdpa would (same errors), then copy it.
    Tensor::new(raw.slice, raw.dims, raw.strides)?;
    let kept: [usize; 4] =
        std::array::from_fn(|i| if raw.strides[i] == 0 { 1 } else { raw.dims[i] });
    let count = kept.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
    let count = count.ok_or_else(|| {
        Failure::from(sdpa::Error::LayoutOverflow {
            dims: raw.dims,
            strides: raw.strides,
        })
    })?;
    let mut data = Vec::new();
    data.try_reserve_exact(count)
        .map_err(|_| Failure::from(sdpa::Error::OutOfMemory { bytes: count }))?;
    for b in 0..kept[0] {
        for s in 0..kept[1] {
            for h in 0..kept[2] {
                for d in 0..kept[3] {
                    let at = b * raw.strides[0]
                        + s * raw.strides[1]
                        + h * raw.strides[2]
                        + d * raw.strides[3];
                    data.push(raw.slice[at] != 0);
                }
            }
        }
    }
    // Contiguous strides over the kept dims; broadcast dims get stride 0.
    let mut strides = [0usize; 4];
    let mut step = 1usize;
    for i in (0..4).rev() {
        strides[i] = if kept[i] == 1 { 0 } else { step };
        step *= kept[i];
    }
    Ok(MaskCopy {
        data,
        dims: raw.dims,
        strides,
    })
}

/// A validated tensor of one of the element types.
enum AnyTensor<'a> {
    F32(Tensor<'a, f32>),
    F16(Tensor<'a, f16>),
    Bf16(Tensor<'a, bf16>),
}

/// K and V, which share one element type.
enum AnyKv<'a> {
    F32(Tensor<'a, f32>, Tensor<'a, f32>),
    F16(Tensor<'a, f16>, Tensor<'a, f16>),
    Bf16(Tensor<'a, bf16>, Tensor<'a, bf16>),
    I8(Tensor<'a, i8>, Tensor<'a, i8>),
}

/// A validated output tensor of one of the element types.
enum AnyTensorMut<'a> {
    F32(TensorMut<'a, f32>),
    F16(TensorMut<'a, f16>),
    Bf16(TensorMut<'a, bf16>),
}

/// An input tensor of type `dtype`.
///
/// # Safety
/// As [`raw_tensor`] for elements of `dtype`.
unsafe fn any_input<'a>(
    t: &SdpaTensor,
    operand: Operand,
    dtype: Dtype,
    spans: &mut Vec<Span>,
) -> Result<AnyTensor<'a>, Failure> {
    // SAFETY (all arms): forwarded, with the element type the caller declared.
    let (tensor, span) = match dtype {
        Dtype::F32 => unsafe { input(t, operand) }.map(|(x, s)| (AnyTensor::F32(x), s)),
        Dtype::F16 => unsafe { input(t, operand) }.map(|(x, s)| (AnyTensor::F16(x), s)),
        Dtype::Bf16 => unsafe { input(t, operand) }.map(|(x, s)| (AnyTensor::Bf16(x), s)),
        Dtype::I8 => Err(kv_only(&format!("{} tensor", operand_name(operand)))),
    }?;
    spans.push(span);
    Ok(tensor)
}

/// K and V of type `dtype`.
///
/// # Safety
/// As [`raw_tensor`] for elements of `dtype`, for both tensors.
unsafe fn any_kv<'a>(
    k: &SdpaTensor,
    v: &SdpaTensor,
    dtype: Dtype,
    spans: &mut Vec<Span>,
) -> Result<AnyKv<'a>, Failure> {
    /// # Safety
    /// As [`any_kv`], with `T` the declared type.
    unsafe fn pair<'a, T>(
        k: &SdpaTensor,
        v: &SdpaTensor,
        spans: &mut Vec<Span>,
    ) -> Result<(Tensor<'a, T>, Tensor<'a, T>), Failure> {
        // SAFETY (both): forwarded.
        let (k, ks) = unsafe { input(k, Operand::Key) }?;
        let (v, vs) = unsafe { input(v, Operand::Value) }?;
        spans.extend([ks, vs]);
        Ok((k, v))
    }
    // SAFETY (all arms): forwarded, with the element type the caller declared.
    Ok(match dtype {
        Dtype::F32 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::F32(k, v))?,
        Dtype::F16 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::F16(k, v))?,
        Dtype::Bf16 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::Bf16(k, v))?,
        Dtype::I8 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::I8(k, v))?,
    })
}

/// An output tensor of type `dtype`, checked against the read spans.
///
/// # Safety
/// As [`output`] for elements of `dtype`.
unsafe fn any_output<'a>(
    t: &SdpaTensorMut,
    dtype: Dtype,
    reads: &[Span],
) -> Result<(AnyTensorMut<'a>, Span), Failure> {
    // SAFETY (all arms): forwarded, with the element type the caller declared.
    match dtype {
        Dtype::F32 => unsafe { output(t, reads) }.map(|(x, s)| (AnyTensorMut::F32(x), s)),
        Dtype::F16 => unsafe { output(t, reads) }.map(|(x, s)| (AnyTensorMut::F16(x), s)),
        Dtype::Bf16 => unsafe { output(t, reads) }.map(|(x, s)| (AnyTensorMut::Bf16(x), s)),
        Dtype::I8 => Err(kv_only("output tensor")),
    }
}

/// Everything an attention call reads, validated and borrowed from the caller.
struct Inputs<'a> {
    q: AnyTensor<'a>,
    kv: AnyKv<'a>,
    spans: Vec<Span>,
    opts: SdpaOptions,
    kv_lens: Option<&'a [usize]>,
    bias: Option<Tensor<'a, f32>>,
    mask: Option<MaskCopy>,
    slopes: Option<&'a [f32]>,
    sinks: Option<&'a [f32]>,
    kv_scales: Option<(Tensor<'a, f32>, Tensor<'a, f32>)>,
}

/// Q, K, V (K and V as dense tensors, page pools or packed rows: read alike) and the options.
///
/// # Safety
/// The pointers in the tensors and `opts` must be valid as the header documents.
unsafe fn read_inputs<'a>(
    [q, k, v]: [&SdpaTensor; 3],
    types: &Types,
    opts: *const SdpaOptions,
) -> Result<Inputs<'a>, Failure> {
    let opts = if opts.is_null() {
        // SAFETY: all-zero bytes are a valid `SdpaOptions` (plain attention).
        unsafe { std::mem::zeroed() }
    } else {
        // SAFETY: the caller's contract.
        unsafe { read_versioned(opts, &[OPTIONS_V1_SIZE, OPTIONS_V2_SIZE], "options") }?.0
    };
    let mut spans = Vec::new();
    // SAFETY (all blocks below): the caller's contract, forwarded.
    let q = unsafe { any_input(q, Operand::Query, types.q, &mut spans) }?;
    let kv = unsafe { any_kv(k, v, types.kv, &mut spans) }?;
    let kv_lens = unsafe { input_array(opts.kv_lens, opts.kv_lens_len, "kv_lens", &mut spans) }?;
    let bias = if opts.bias.data.is_null() {
        None
    } else {
        let (b, s) = unsafe { input(&opts.bias, Operand::Bias) }?;
        spans.push(s);
        Some(b)
    };
    let mask = if opts.mask.data.is_null() {
        None
    } else {
        Some(unsafe { copy_mask(&opts.mask, &mut spans) }?)
    };
    let slopes = unsafe {
        input_array(
            opts.alibi_slopes,
            opts.alibi_slopes_len,
            "alibi slopes",
            &mut spans,
        )
    }?;
    let sinks = unsafe { input_array(opts.sinks, opts.sinks_len, "sinks", &mut spans) }?;
    let kv_scales = match (opts.k_scales.data.is_null(), opts.v_scales.data.is_null()) {
        (true, true) => None,
        (false, false) => {
            let (k, ks) = unsafe { input(&opts.k_scales, Operand::KeyScales) }?;
            let (v, vs) = unsafe { input(&opts.v_scales, Operand::ValueScales) }?;
            spans.extend([ks, vs]);
            Some((k, v))
        }
        (k_null, _) => {
            let missing = if k_null { "k_scales" } else { "v_scales" };
            return Err(Failure::new(
                SdpaStatus::NullPointer,
                format!("options.{missing}: pointer is NULL (the other scales are given)"),
            ));
        }
    };
    Ok(Inputs {
        q,
        kv,
        spans,
        opts,
        kv_lens,
        bias,
        mask,
        slopes,
        sinks,
        kv_scales,
    })
}

/// Builds the Rust options from the C struct and the borrowed inputs.
fn options<'a>(inputs: &'a Inputs<'_>) -> Result<Options<'a>, Failure> {
    let o = &inputs.opts;
    let mut opts = Options::new();
    if o.has_scale != 0 {
        opts = opts.scale(o.scale);
    }
    if let Some(a) = alignment(o.causal, "options.causal")? {
        opts = opts.causal(a);
    }
    if let Some(a) = alignment(o.window, "options.window")? {
        opts = opts.sliding_window(o.window_left, o.window_right, a);
    }
    if let Some(lens) = inputs.kv_lens {
        opts = opts.kv_lens(lens);
    }
    if let Some(bias) = inputs.bias {
        opts = opts.bias(bias);
    }
    if let Some(mask) = &inputs.mask {
        opts = opts.mask(Tensor::new(&mask.data, mask.dims, mask.strides)?);
    }
    match (alignment(o.alibi, "options.alibi")?, inputs.slopes) {
        (Some(a), Some(slopes)) => opts = opts.alibi(slopes, a),
        (Some(_), None) => {
            return Err(Failure::new(
                SdpaStatus::NullPointer,
                "alibi slopes: pointer is NULL",
            ))
        }
        (None, _) => {}
    }
    if o.has_softcap != 0 {
        opts = opts.softcap(o.softcap);
    }
    if let Some(sinks) = inputs.sinks {
        opts = opts.sinks(sinks);
    }
    if o.bf16_products != 0 {
        opts = opts.bf16_products();
    }
    if let Some((k, v)) = inputs.kv_scales {
        opts = opts.kv_scales(k, v);
    }
    Ok(opts)
}

/// The element types of an attention call.
struct Types {
    q: Dtype,
    kv: Dtype,
    out: Dtype,
}

impl Types {
    /// The types `args` declares; `caller_size` tells whether it has the fields added after
    /// the first version (absent: every operand has `q_dtype`, the first version's `dtype`).
    fn of(args: &SdpaAttentionArgs, caller_size: usize) -> Result<Self, Failure> {
        let q = dtype(args.q_dtype, "q_dtype")?;
        if caller_size <= ATTENTION_ARGS_V1_SIZE {
            return Ok(Self { q, kv: q, out: q });
        }
        Ok(Self {
            q,
            kv: dtype(args.kv_dtype, "kv_dtype")?,
            out: dtype(args.out_dtype, "out_dtype")?,
        })
    }
}

/// Which Rust function an entry point runs, with the arrays (validated and converted) that
/// say where the rows of K and V lie; K and V themselves are typed by the dispatch below.
#[derive(Clone, Copy)]
enum Call<'a> {
    /// `sdpa::attention` / `attention_lse` on dense K and V.
    Fused,
    /// `sdpa::reference::attention` / `attention_lse`.
    Reference,
    /// `sdpa::attention_paged`: K and V are page pools.
    Paged(Pages<'a>),
    /// `sdpa::attention_varlen`: packed Q, K/V packed (`cu_seqlens_k`) or paged.
    Varlen {
        cu_seqlens_q: &'a [usize],
        kv: VarlenLayout<'a>,
    },
}

/// A block table and its row length.
#[derive(Clone, Copy)]
struct Pages<'a> {
    table: &'a [u32],
    pages_per_seq: usize,
}

/// Where the keys of a varlen call lie.
#[derive(Clone, Copy)]
enum VarlenLayout<'a> {
    Packed { cu_seqlens_k: &'a [usize] },
    Paged(Pages<'a>),
}

/// One typed call: the generic Rust function for these element types.
fn run<Q: Element, KV: KvElement, O: Element>(
    call: Call<'_>,
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut TensorMut<'_, O>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), sdpa::Error> {
    fn paged<'a, T: KvElement>(
        k: &Tensor<'a, T>,
        v: &Tensor<'a, T>,
        p: Pages<'a>,
    ) -> Result<PagedKv<'a, T>, sdpa::Error> {
        PagedKv::new(*k, *v, p.table, p.pages_per_seq)
    }
    match (call, lse) {
        (Call::Fused, Some(lse)) => sdpa::attention_lse(q, k, v, out, lse, opts),
        (Call::Fused, None) => sdpa::attention(q, k, v, out, opts),
        (Call::Reference, Some(lse)) => sdpa::reference::attention_lse(q, k, v, out, lse, opts),
        (Call::Reference, None) => sdpa::reference::attention(q, k, v, out, opts),
        (Call::Paged(p), lse) => sdpa::attention_paged(q, &paged(k, v, p)?, out, lse, opts),
        (Call::Varlen { cu_seqlens_q, kv }, lse) => {
            let kv = match kv {
                VarlenLayout::Packed { cu_seqlens_k } => {
                    VarlenKv::Packed(PackedKv::new(*k, *v, cu_seqlens_k))
                }
                VarlenLayout::Paged(p) => VarlenKv::Paged(paged(k, v, p)?),
            };
            sdpa::attention_varlen(q, cu_seqlens_q, &kv, out, lse, opts)
        }
    }
}

/// Dispatches on the output's type (Q and K/V already typed).
fn run_out<Q: Element, KV: KvElement>(
    call: Call<'_>,
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut AnyTensorMut<'_>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), sdpa::Error> {
    match out {
        AnyTensorMut::F32(out) => run(call, q, k, v, out, lse, opts),
        AnyTensorMut::F16(out) => run(call, q, k, v, out, lse, opts),
        AnyTensorMut::Bf16(out) => run(call, q, k, v, out, lse, opts),
    }
}

/// Dispatches on the K/V type (Q already typed).
fn run_kv<Q: Element>(
    call: Call<'_>,
    q: &Tensor<'_, Q>,
    kv: &AnyKv<'_>,
    out: &mut AnyTensorMut<'_>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), sdpa::Error> {
    match kv {
        AnyKv::F32(k, v) => run_out(call, q, k, v, out, lse, opts),
        AnyKv::F16(k, v) => run_out(call, q, k, v, out, lse, opts),
        AnyKv::Bf16(k, v) => run_out(call, q, k, v, out, lse, opts),
        AnyKv::I8(k, v) => run_out(call, q, k, v, out, lse, opts),
    }
}

/// Dispatches on all three types: 36 monomorphizations of [`run`].
fn run_any(
    call: Call<'_>,
    q: &AnyTensor<'_>,
    kv: &AnyKv<'_>,
    out: &mut AnyTensorMut<'_>,
    lse: Option<&mut [f32]>,
    opts: &Options<'_>,
) -> Result<(), sdpa::Error> {
    match q {
        AnyTensor::F32(q) => run_kv(call, q, kv, out, lse, opts),
        AnyTensor::F16(q) => run_kv(call, q, kv, out, lse, opts),
        AnyTensor::Bf16(q) => run_kv(call, q, kv, out, lse, opts),
    }
}

/// # Safety
/// As `sdpa_attention`.
unsafe fn attention_entry(
    args: *const SdpaAttentionArgs,
    opts: *const SdpaOptions,
    call: Call<'_>,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let (args, caller_size) =
        unsafe { read_versioned(args, &[ATTENTION_ARGS_V1_SIZE], "attention args") }?;
    let types = Types::of(&args, caller_size)?;
    let outputs = (&args.out, args.lse, args.lse_len);
    unsafe {
        attend(
            [&args.q, &args.k, &args.v],
            &types,
            opts,
            outputs,
            Vec::new(),
            call,
        )
    }
}

/// What every attention entry point does once its struct is read: validates Q, K, V and the
/// options, then the outputs against every span the call reads (`layout`: the spans of the
/// arrays that place the rows, already read into `call`), and runs the typed call on the pool.
///
/// # Safety
/// The pointers in the tensors, `opts` and the outputs must be valid as the header documents.
unsafe fn attend(
    tensors: [&SdpaTensor; 3],
    types: &Types,
    opts: *const SdpaOptions,
    (out, lse, lse_len): (&SdpaTensorMut, *mut f32, usize),
    layout: Vec<Span>,
    call: Call<'_>,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let inputs = unsafe { read_inputs(tensors, types, opts) }?;
    let rust_opts = options(&inputs)?;
    let mut reads = layout;
    reads.extend_from_slice(&inputs.spans);
    let (mut out, out_span) = unsafe { any_output(out, types.out, &reads) }?;
    reads.push(out_span);
    let lse = unsafe { output_array(lse, lse_len, &reads, "lse") }?;
    let (q, kv) = (&inputs.q, &inputs.kv);
    in_pool(move || run_any(call, q, kv, &mut out, lse, &rust_opts))??;
    Ok(())
}

/// A required input array: NULL is accepted only for an empty one (the call then reports a
/// wrong length as the Rust API does).
///
/// # Safety
/// As [`input_array`].
unsafe fn required_array<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
    spans: &mut Vec<Span>,
) -> Result<&'a [T], Failure> {
    if ptr.is_null() && len == 0 {
        return Ok(&[]);
    }
    // SAFETY: forwarded.
    unsafe { input_array(ptr, len, what, spans) }?.ok_or_else(|| {
        Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL (with {len} entries)"),
        )
    })
}

/// `int32_t` sequence offsets converted to the Rust API's `usize` ones; a negative entry is
/// `InvalidValue` for `operand`, as the Rust API reports offsets it rejects.
///
/// # Safety
/// As [`input_array`].
unsafe fn offsets(
    ptr: *const i32,
    len: usize,
    operand: Operand,
    spans: &mut Vec<Span>,
) -> Result<Vec<usize>, Failure> {
    // SAFETY: forwarded.
    let raw = unsafe { required_array(ptr, len, &operand_name(operand), spans) }?;
    let mut converted = Vec::new();
    converted.try_reserve_exact(raw.len()).map_err(|_| {
        Failure::from(sdpa::Error::OutOfMemory {
            bytes: raw.len().saturating_mul(std::mem::size_of::<usize>()),
        })
    })?;
    for (index, &x) in raw.iter().enumerate() {
        let x = usize::try_from(x).map_err(|_| sdpa::Error::InvalidValue {
            operand,
            index,
            reason: "offset is negative",
        })?;
        converted.push(x);
    }
    Ok(converted)
}

/// The element types of a paged or varlen call (structs without a first version).
fn types(q: u32, kv: u32, out: u32) -> Result<Types, Failure> {
    Ok(Types {
        q: dtype(q, "q_dtype")?,
        kv: dtype(kv, "kv_dtype")?,
        out: dtype(out, "out_dtype")?,
    })
}

/// # Safety
/// As `sdpa_attention_paged`.
unsafe fn paged_entry(args: *const SdpaPagedArgs, opts: *const SdpaOptions) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let args = unsafe { read_versioned(args, &[], "paged args") }?.0;
    let types = types(args.q_dtype, args.kv_dtype, args.out_dtype)?;
    let mut layout = Vec::new();
    let table = unsafe {
        required_array(
            args.block_table,
            args.block_table_len,
            "block table",
            &mut layout,
        )
    }?;
    let call = Call::Paged(Pages {
        table,
        pages_per_seq: args.pages_per_seq,
    });
    let outputs = (&args.out, args.lse, args.lse_len);
    unsafe {
        attend(
            [&args.q, &args.k, &args.v],
            &types,
            opts,
            outputs,
            layout,
            call,
        )
    }
}

/// # Safety
/// As `sdpa_attention_varlen`.
unsafe fn varlen_entry(
    args: *const SdpaVarlenArgs,
    opts: *const SdpaOptions,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let args = unsafe { read_versioned(args, &[], "varlen args") }?.0;
    let types = types(args.q_dtype, args.kv_dtype, args.out_dtype)?;
    let unused = |what: &str, set: bool| {
        if set {
            Err(Failure::new(
                SdpaStatus::InvalidArgument,
                format!("{what} must be NULL/0 with kv_layout {}", args.kv_layout),
            ))
        } else {
            Ok(())
        }
    };
    let mut layout = Vec::new();
    let cu_q = unsafe {
        offsets(
            args.cu_seqlens_q,
            args.cu_seqlens_q_len,
            Operand::CuSeqlensQ,
            &mut layout,
        )
    }?;
    let cu_k;
    let kv = match args.kv_layout {
        SDPA_KV_PACKED => {
            unused(
                "block_table, block_table_len and pages_per_seq",
                !args.block_table.is_null() || args.block_table_len != 0 || args.pages_per_seq != 0,
            )?;
            cu_k = unsafe {
                offsets(
                    args.cu_seqlens_k,
                    args.cu_seqlens_k_len,
                    Operand::CuSeqlensK,
                    &mut layout,
                )
            }?;
            VarlenLayout::Packed {
                cu_seqlens_k: &cu_k,
            }
        }
        SDPA_KV_PAGED => {
            unused(
                "cu_seqlens_k and cu_seqlens_k_len",
                !args.cu_seqlens_k.is_null() || args.cu_seqlens_k_len != 0,
            )?;
            let table = unsafe {
                required_array(
                    args.block_table,
                    args.block_table_len,
                    "block table",
                    &mut layout,
                )
            }?;
            VarlenLayout::Paged(Pages {
                table,
                pages_per_seq: args.pages_per_seq,
            })
        }
        other => {
            return Err(Failure::new(
                SdpaStatus::InvalidArgument,
                format!("kv_layout: {other} is not an SDPA_KV_* value"),
            ))
        }
    };
    let call = Call::Varlen {
        cu_seqlens_q: &cu_q,
        kv,
    };
    let outputs = (&args.out, args.lse, args.lse_len);
    unsafe {
        attend(
            [&args.q, &args.k, &args.v],
            &types,
            opts,
            outputs,
            layout,
            call,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points

/// Scaled dot-product attention on sdpa's fused kernel: `out = softmax(Q·Kᵀ·scale) · V` with
/// the options in `opts` (NULL: plain attention), and the LSE when `args->lse` is not NULL.
/// Q, K/V and out have the element types `args` declares (any combination of f32, f16, bf16):
/// half-precision operands are converted inside the kernel block by block, arithmetic is f32,
/// and the output is rounded once to `out_dtype`.
///
/// # Safety
/// `args` (and `opts` unless NULL) point to structs whose `size` field is set; every non-NULL
/// data pointer is valid for the elements its dims and strides reach; the outputs are not
/// accessed by anyone else during the call.
#[no_mangle]
pub unsafe extern "C" fn sdpa_attention(
    args: *const SdpaAttentionArgs,
    opts: *const SdpaOptions,
) -> SdpaStatus {
    // SAFETY: the caller's contract.
    guard(|| unsafe { attention_entry(args, opts, Call::Fused) })
}

/// The f64 reference of `sdpa_attention`, same arguments, element types and semantics: the
/// plain definition, step by step, with the whole score matrix in memory (slow; for tests). Its
/// output is rounded once to `out_dtype`, so the two agree within the f32 bound plus
/// `2·u·max|v|` for a half output (`u` = 2⁻¹¹ for f16, 2⁻⁸ for bf16).
///
/// # Safety
/// As `sdpa_attention`.
#[no_mangle]
pub unsafe extern "C" fn sdpa_reference_attention(
    args: *const SdpaAttentionArgs,
    opts: *const SdpaOptions,
) -> SdpaStatus {
    // SAFETY: the caller's contract.
    guard(|| unsafe { attention_entry(args, opts, Call::Reference) })
}

/// Attention over a paged K/V cache (`sdpa::attention_paged`): Q, out and the LSE as in
/// `sdpa_attention`, K and V read from page pools through a block table (see
/// `sdpa_paged_args`). `opts->kv_lens` is required (one length per sequence). Every element
/// type combination runs natively, as in `sdpa_attention`. Results are bitwise identical to
/// `sdpa_attention` on the same keys stored densely.
///
/// Errors as `sdpa_attention`, plus: `SDPA_STATUS_LENGTH_MISMATCH` when the table does not
/// have `B·pages_per_seq` entries or `kv_lens` is missing; `SDPA_STATUS_INVALID_VALUE` for a
/// table entry a sequence's length reaches that is not below `num_pages`, a page size of 0,
/// or a table length that is not a multiple of `pages_per_seq`; `SDPA_STATUS_SHAPE_MISMATCH`
/// when the pools differ in pages, page size or heads. Messages name the operand
/// (`block table`, `kv_lens`).
///
/// # Safety
/// As `sdpa_attention`; `block_table` (unless NULL with length 0) is valid for
/// `block_table_len` entries.
#[no_mangle]
pub unsafe extern "C" fn sdpa_attention_paged(
    args: *const SdpaPagedArgs,
    opts: *const SdpaOptions,
) -> SdpaStatus {
    // SAFETY: the caller's contract.
    guard(|| unsafe { paged_entry(args, opts) })
}

/// Attention over a packed batch of variable-length sequences (`sdpa::attention_varlen`),
/// K/V packed or paged (see `sdpa_varlen_args`). Every element type combination runs
/// natively, as in `sdpa_attention`.
///
/// Errors as `sdpa_attention`, plus: `SDPA_STATUS_LENGTH_MISMATCH` / `SDPA_STATUS_INVALID_VALUE`
/// for offsets that are empty, negative, decreasing or past the packed rows (messages name
/// `cu_seqlens_q` / `cu_seqlens_k`), the block-table errors of `sdpa_attention_paged`,
/// `SDPA_STATUS_SHAPE_MISMATCH` when the batch dim of Q, K or out is not 1, and
/// `SDPA_STATUS_INVALID_ARGUMENT` for an unknown `kv_layout` or a field of the other layout
/// set.
///
/// # Safety
/// As `sdpa_attention`; each array (unless NULL with length 0) is valid for its length.
#[no_mangle]
pub unsafe extern "C" fn sdpa_attention_varlen(
    args: *const SdpaVarlenArgs,
    opts: *const SdpaOptions,
) -> SdpaStatus {
    // SAFETY: the caller's contract.
    guard(|| unsafe { varlen_entry(args, opts) })
}

/// Merges partial results over disjoint key sets (split-KV decode, sequence parallelism) into
/// the result over their union, using each partial's LSE.
///
/// # Safety
/// `args` points to a struct whose `size` is set; `parts` holds `n_parts` entries whose pointers
/// are valid as their dims say; the outputs are not accessed by anyone else during the call.
#[no_mangle]
pub unsafe extern "C" fn sdpa_merge_partials(args: *const SdpaMergeArgs) -> SdpaStatus {
    guard(|| {
        // SAFETY (all blocks): the caller's contract, forwarded.
        let args = unsafe { read_versioned(args, &[], "merge args") }?.0;
        if dtype(args.dtype, "dtype")? != Dtype::F32 {
            return Err(Failure::new(
                SdpaStatus::UnsupportedType,
                "merge: partial results and the merged output are f32 only \
                 (write the partials with out_dtype SDPA_DTYPE_F32)",
            ));
        }
        let mut spans = Vec::new();
        let parts_raw =
            unsafe { input_array(args.parts, args.n_parts, "parts", &mut spans) }?.unwrap_or(&[]);
        let mut parts = Vec::with_capacity(parts_raw.len());
        for (i, p) in parts_raw.iter().enumerate() {
            let (out, s) = unsafe { input(&p.out, Operand::Partial) }?;
            spans.push(s);
            let lse =
                unsafe { input_array(p.lse, p.lse_len, &format!("parts[{i}].lse"), &mut spans) }?
                    .ok_or_else(|| {
                    Failure::new(
                        SdpaStatus::NullPointer,
                        format!("parts[{i}].lse: pointer is NULL"),
                    )
                })?;
            parts.push(Partial { out, lse });
        }
        let (mut out, out_span) = unsafe { output(&args.out, &spans) }?;
        spans.push(out_span);
        let lse = unsafe { output_array(args.lse, args.lse_len, &spans, "lse") }?;
        let mut scratch = Vec::new();
        let lse = match lse {
            Some(lse) => lse,
            None => {
                let [b, n_q, h, _] = args.out.dims;
                let rows = b
                    .checked_mul(h)
                    .and_then(|x| x.checked_mul(n_q))
                    .ok_or_else(|| Failure::from(sdpa::Error::TooManyRows { rows: usize::MAX }))?;
                scratch.try_reserve_exact(rows).map_err(|_| {
                    Failure::from(sdpa::Error::OutOfMemory {
                        bytes: rows.saturating_mul(4),
                    })
                })?;
                scratch.resize(rows, 0.0f32);
                &mut scratch[..]
            }
        };
        sdpa::merge_partials(&parts, &mut out, lse)?;
        Ok(())
    })
}

/// The standard ALiBi slopes for `heads` heads (Press et al.), written to `out`, which holds
/// `out_len ≥ heads` floats.
///
/// # Safety
/// `out` is valid for writes of `out_len` floats.
#[no_mangle]
pub unsafe extern "C" fn sdpa_alibi_slopes(
    heads: usize,
    out: *mut f32,
    out_len: usize,
) -> SdpaStatus {
    guard(|| {
        if out_len < heads {
            return Err(Failure::from(sdpa::Error::LengthMismatch {
                operand: Operand::AlibiSlopes,
                expected: heads,
                got: out_len,
            }));
        }
        // SAFETY: the caller's contract.
        let out = unsafe { output_array(out, heads, &[], "alibi slopes") }?.ok_or_else(|| {
            Failure::new(SdpaStatus::NullPointer, "alibi slopes: pointer is NULL")
        })?;
        out.copy_from_slice(&sdpa::alibi_slopes(heads)?);
        Ok(())
    })
}

/// Threads for the calls that follow, process wide.
///
/// * `0` (the default): calls run on rayon's global pool (sized by `RAYON_NUM_THREADS` or the
///   number of CPUs), shared with the rest of the process.
/// * `n ≥ 1`: each calling thread runs its calls on a private pool of `n` threads, created on
///   its first call after the setting changes and freed when the calling thread exits. An
///   engine that runs its own thread pool sets 1: each of its threads then gets one sdpa
///   worker of its own, and concurrent calls never wait for each other.
///
/// Results are bitwise identical for every setting. Never fails (returns `SDPA_STATUS_OK`);
/// a pool that cannot be created makes the next call return `SDPA_STATUS_THREAD_POOL`.
#[no_mangle]
pub extern "C" fn sdpa_set_num_threads(n: usize) -> SdpaStatus {
    NUM_THREADS.store(n, Ordering::Relaxed);
    guard(|| Ok(()))
}

/// The current `sdpa_set_num_threads` setting (0: the global pool).
#[no_mangle]
pub extern "C" fn sdpa_get_num_threads() -> usize {
    NUM_THREADS.load(Ordering::Relaxed)
}

/// The message of the last call made on this thread: "" if it succeeded, else the text of the
/// error (the Rust `Display` of `sdpa::Error` for the errors the Rust API has). Never NULL; valid
/// until the next sdpa call on this thread.
#[no_mangle]
pub extern "C" fn sdpa_last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// 1 where `sdpa_options.bf16_products` takes effect on this machine (a CPU with AVX512_BF16
/// and the AVX-512 backend), else 0 (the option is then accepted and changes nothing).
#[no_mangle]
pub extern "C" fn sdpa_bf16_products_available() -> u32 {
    u32::from(sdpa::bf16_products_available())
}

/// `SDPA_ABI_VERSION` of the library actually linked (compare with the header's).
#[no_mangle]
pub extern "C" fn sdpa_abi_version() -> u32 {
    SDPA_ABI_VERSION
}

/// The name of a status as a static string (`"SDPA_STATUS_OK"`, …); "SDPA_STATUS_UNKNOWN" for
/// values outside the enum.
#[no_mangle]
pub extern "C" fn sdpa_status_name(status: i32) -> *const c_char {
    let name: &'static CStr = match status {
        0 => c"SDPA_STATUS_OK",
        1 => c"SDPA_STATUS_NULL_POINTER",
        2 => c"SDPA_STATUS_INVALID_STRUCT_SIZE",
        3 => c"SDPA_STATUS_UNSUPPORTED_TYPE",
        4 => c"SDPA_STATUS_MISALIGNED",
        5 => c"SDPA_STATUS_ALIASED_BUFFERS",
        6 => c"SDPA_STATUS_INVALID_ARGUMENT",
        7 => c"SDPA_STATUS_LAYOUT_OVERFLOW",
        8 => c"SDPA_STATUS_SLICE_TOO_SHORT",
        9 => c"SDPA_STATUS_OVERLAPPING_OUTPUT",
        10 => c"SDPA_STATUS_SHAPE_MISMATCH",
        11 => c"SDPA_STATUS_HEADS_NOT_DIVISIBLE",
        12 => c"SDPA_STATUS_ZERO_HEAD_DIM",
        13 => c"SDPA_STATUS_LENGTH_MISMATCH",
        14 => c"SDPA_STATUS_INVALID_SCALE",
        15 => c"SDPA_STATUS_INVALID_SOFTCAP",
        16 => c"SDPA_STATUS_INVALID_VALUE",
        17 => c"SDPA_STATUS_NOT_BROADCASTABLE",
        18 => c"SDPA_STATUS_NO_PARTIALS",
        19 => c"SDPA_STATUS_CONFLICTING_ALIGNMENT",
        20 => c"SDPA_STATUS_SCORE_MATRIX_TOO_LARGE",
        21 => c"SDPA_STATUS_SCRATCH_TOO_LARGE",
        22 => c"SDPA_STATUS_TOO_MANY_ROWS",
        23 => c"SDPA_STATUS_THREAD_POOL",
        24 => c"SDPA_STATUS_OTHER",
        25 => c"SDPA_STATUS_PANIC",
        26 => c"SDPA_STATUS_OUT_OF_MEMORY",
        27 => c"SDPA_STATUS_KV_SCALES",
        _ => c"SDPA_STATUS_UNKNOWN",
    };
    name.as_ptr()
}
