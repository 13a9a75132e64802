//! The `#[repr(C)]` types and constants of the ABI, as the header declares them: the
//! `SDPA_*` constants, [`SdpaStatus`], the tensor descriptors, the argument and option
//! structs, and the sizes of the earlier versions of the versioned structs.

use std::ffi::c_void;

/// Version of this ABI. It changes only when an existing struct or function changes
/// incompatibly; new fields are appended to structs, whose `size` field tells which fields the
/// caller knows. (Appending `kv_dtype` and `out_dtype` to `sdpa_attention_args`, and
/// `bf16_products`, then `k_scales` and `v_scales`, then `kv_lens_before`, to `sdpa_options`,
/// and adding functions and structs (`sdpa_plan_*`, the conversions), kept it at 1: a caller
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
    /// A required pointer (a struct, a tensor's data, an option's array) is NULL, or an
    /// array is NULL with a nonzero length (everywhere, NULL means "none" only with length 0).
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
pub(crate) const ATTENTION_ARGS_V1_SIZE: usize = std::mem::offset_of!(SdpaAttentionArgs, kv_dtype);

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
    /// Per-sequence key lengths (`size_t`, one per batch), or NULL (with length 0).
    pub kv_lens: *const usize,
    /// Entries at `kv_lens`.
    pub kv_lens_len: usize,
    /// Additive `float` bias, logical dims `[B, n_q, H, n_kv]` (each dim may be 1 or have
    /// stride 0 to broadcast); `bias.data` NULL for none.
    pub bias: SdpaTensor,
    /// Boolean mask of bytes (`uint8_t`, nonzero = visible, as the Rust API's `true`; the
    /// candle adapter's `u8` mask is the opposite, nonzero = hidden), dims and broadcasting as `bias`;
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
    /// Attention-sink logits, one per query head, or NULL (with length 0).
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
    /// Nonzero: `kv_lens` counts each sequence's keys *before* this call's query rows
    /// (FlashAttention-2's `cache_seqlens`, the Rust `sdpa::Options::cache_seqlens`), which
    /// the caller has appended right after them (`sdpa_append`): sequence `b` has
    /// `kv_lens[b] + n_q(b)` keys (`n_q(b)`: its query rows; `n_q` in a dense or paged call),
    /// and everything said of `kv_lens` holds for those sums. 0: `kv_lens` counts every key the
    /// call reads. Added in the struct's fourth version: a caller whose `size` ends at
    /// `v_scales` gets 0.
    pub kv_lens_before: u32,
}

/// `sizeof(sdpa_options)` of the first version of the struct (no `bf16_products`).
pub(crate) const OPTIONS_V1_SIZE: usize = std::mem::offset_of!(SdpaOptions, bf16_products);
/// `sizeof(sdpa_options)` of the second version (no `k_scales`, `v_scales`).
pub(crate) const OPTIONS_V2_SIZE: usize = std::mem::offset_of!(SdpaOptions, k_scales);
/// `sizeof(sdpa_options)` of the third version (no `kv_lens_before`).
pub(crate) const OPTIONS_V3_SIZE: usize = std::mem::offset_of!(SdpaOptions, kv_lens_before);

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

/// `style` of `sdpa_rope`: GPT-NeoX / Hugging Face Llama, channel `i` paired with `i + r/2`.
pub const SDPA_ROPE_HALVES: u32 = 1;
/// `style` of `sdpa_rope`: GPT-J, channels `2i` and `2i + 1` paired.
pub const SDPA_ROPE_INTERLEAVED: u32 = 2;

/// A rotary embedding and the positions it rotates at (the Rust `sdpa::Rope`): the first
/// `rotary_dim` channels of every head of token `t` rotated by the angles of `positions[t]`,
/// from the base `theta` (`p · θ^(−2i/r)`, computed in f64) or, when `cos` and `sin` are both
/// given, from the caller's tables (row `p` holds the `rotary_dim / 2` cosines, and sines, of
/// position `p`: scaled variants such as YaRN or Llama 3's).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaRope {
    /// `sizeof(sdpa_rope)` as the caller compiled it.
    pub size: usize,
    /// `SDPA_ROPE_HALVES` or `SDPA_ROPE_INTERLEAVED`.
    pub style: u32,
    /// Rotated channels per head: even, nonzero, at most the head size.
    pub rotary_dim: usize,
    /// The base θ (finite, positive; 10000 in most models), used without tables.
    pub theta: f32,
    /// Cosine table (`float`), or NULL (with `table_len` 0) for angles from `theta`.
    pub cos: *const f32,
    /// Sine table, as `cos`.
    pub sin: *const f32,
    /// Entries in each table: a whole number of rows of `rotary_dim / 2`.
    pub table_len: usize,
    /// One position per token (`uint32_t`), tokens in the order of the rows rotated.
    pub positions: *const u32,
    /// Entries at `positions`.
    pub positions_len: usize,
}

/// The operands of `sdpa_append`: a step's new K and V rows (`[B, S, H_kv, d_k]` and
/// `[B, S, H_kv, d_v]`, element type `rows_dtype`: f32, f16 or bf16) written into the caches
/// `k_cache` / `v_cache` (`cache_dtype`, any `SDPA_DTYPE_*`) at slot `slots[b·S + s]` of token
/// `(b, s)`: row `slot % dim 1` of entry `slot / dim 1` of dim 0 (a paged pool
/// `[num_pages, page_size, H_kv, d]`: `page · page_size + offset`, vLLM's slot mapping; or a dense
/// cache `[B, n_kv, H_kv, d]`). `SDPA_DTYPE_I8` caches need `k_scales` / `v_scales`
/// (`[dim 0, dim 1, H_kv, 1]` floats, written with `max|x| / 127` per token and kv head,
/// what `sdpa_options.k_scales` / `v_scales` then read); other caches take none (`data` NULL).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaAppendArgs {
    /// `sizeof(sdpa_append_args)` as the caller compiled it.
    pub size: usize,
    /// Element type of `k` and `v` (`SDPA_DTYPE_F32`, `_F16` or `_BF16`).
    pub rows_dtype: u32,
    /// New key rows.
    pub k: SdpaTensor,
    /// New value rows.
    pub v: SdpaTensor,
    /// Element type of the caches (`SDPA_DTYPE_*`).
    pub cache_dtype: u32,
    /// The key cache (pool).
    pub k_cache: SdpaTensorMut,
    /// The value cache (pool).
    pub v_cache: SdpaTensorMut,
    /// One slot per token (`size_t`, `B·S`), no slot twice.
    pub slots: *const usize,
    /// Entries at `slots`.
    pub slots_len: usize,
    /// Per-(token, kv head) key scales of an `SDPA_DTYPE_I8` cache; `data` NULL otherwise.
    pub k_scales: SdpaTensorMut,
    /// Per-(token, kv head) value scales, as `k_scales`.
    pub v_scales: SdpaTensorMut,
    /// Nonzero: `k_scales` and `v_scales` are the caller's, read and not written (the Rust
    /// `sdpa::append_scaled`): views that broadcast against the caches' dims, as
    /// `sdpa_options.k_scales` reads them (per tensor `[1, 1, 1, 1]`, per (kv head, channel)
    /// `[1, 1, kv_heads, d]`, …), finite with `|scale| ≤ FLT_MAX / 128` where the rows read
    /// them; each value is stored as `round(x / scale)` (ties to even) saturated to ±127 (a
    /// scale of 0 stores 0). Only with an `SDPA_DTYPE_I8` cache (`SDPA_STATUS_KV_SCALES`
    /// otherwise). A struct of the first version (its `size` ends before this field) has 0.
    pub scales_given: u32,
}

/// `sizeof(sdpa_append_args)` of the first version (no `scales_given`).
pub(crate) const APPEND_V1_SIZE: usize = std::mem::offset_of!(SdpaAppendArgs, scales_given);

/// What every layer of a serving step shares, for `sdpa_plan_new`: the packed query rows, the
/// K/V layout (`kv_layout`, as in `sdpa_varlen_args`), the heads and head sizes. With the
/// options (key lengths by `kv_lens`, required for paged K/V, and `kv_lens_before`;
/// everything else as in `sdpa_attention_varlen`), the Rust `sdpa::Plan::new`'s operands.
///
/// Every layer's Q is `[1, total_q, heads, d_k]` with sequence `b` in rows
/// `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` (`total_q` the last offset), its output
/// `[1, total_q, heads, d_v]`, its LSE `[heads, total_q]`. K and V are packed
/// (`SDPA_KV_PACKED`: `[1, total_kv, kv_heads, d]`, `cu_seqlens_k`, `total_kv` its last
/// offset) or page pools (`SDPA_KV_PAGED`: `[num_pages, page_size, kv_heads, d]` read
/// through `block_table`, `pages_per_seq` entries per sequence). The fields of the layout not
/// in use must be zero/NULL (`SDPA_STATUS_INVALID_ARGUMENT` otherwise).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaPlanArgs {
    /// `sizeof(sdpa_plan_args)` as the caller compiled it.
    pub size: usize,
    /// `SDPA_KV_PACKED` or `SDPA_KV_PAGED`.
    pub kv_layout: u32,
    /// Query heads (a positive multiple of `kv_heads`).
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head size of Q and K.
    pub d_k: usize,
    /// Head size of V and the output.
    pub d_v: usize,
    /// Query offsets (`int32_t`, `B + 1` non-decreasing, non-negative). NULL only when
    /// `cu_seqlens_q_len` is 0.
    pub cu_seqlens_q: *const i32,
    /// Entries at `cu_seqlens_q` (`B + 1`).
    pub cu_seqlens_q_len: usize,
    /// Packed layout: key offsets (`int32_t`, `B + 1`). Paged layout: NULL.
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
    /// Paged layout: tokens per page (dim 1 of the pools, nonzero). Packed layout: 0.
    pub page_size: usize,
}

/// One layer of a step, for `sdpa_plan_run`: its Q, K/V and output (element types as in
/// `sdpa_varlen_args`, any combination, `kv_dtype` also `SDPA_DTYPE_I8`), its LSE if wanted,
/// the scales of `SDPA_DTYPE_I8` K/V and its attention sinks. A zeroed struct is all f32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SdpaPlanRunArgs {
    /// `sizeof(sdpa_plan_run_args)` as the caller compiled it.
    pub size: usize,
    /// Element type of Q (`SDPA_DTYPE_*`).
    pub q_dtype: u32,
    /// Element type of K and V (`SDPA_DTYPE_*`).
    pub kv_dtype: u32,
    /// Element type of out (`SDPA_DTYPE_*`).
    pub out_dtype: u32,
    /// Packed queries, `[1, total_q, heads, d_k]`.
    pub q: SdpaTensor,
    /// Keys: packed `[1, total_kv, kv_heads, d_k]`, or the layer's key page pool
    /// `[num_pages, page_size, kv_heads, d_k]` with at least the pages the step's table
    /// reaches (one past its largest entry within the key lengths).
    pub k: SdpaTensor,
    /// Values: packed `[1, total_kv, kv_heads, d_v]`, or the value page pool
    /// `[num_pages, page_size, kv_heads, d_v]` (the pages of `k`).
    pub v: SdpaTensor,
    /// Output, `[1, total_q, heads, d_v]` (rows outside every sequence are not written).
    pub out: SdpaTensorMut,
    /// Optional log-sum-exp output (`float`), `lse[h·total_q + t]`; NULL for none.
    pub lse: *mut f32,
    /// Number of floats at `lse`: must be `heads·total_q` when `lse` is not NULL.
    pub lse_len: usize,
    /// The `float` scales of `SDPA_DTYPE_I8` keys, as `sdpa_options.k_scales` (against the
    /// pool's dims); `data` NULL for none. Required with 8-bit K/V, refused with float K/V
    /// (`SDPA_STATUS_KV_SCALES`).
    pub k_scales: SdpaTensor,
    /// The scales of `SDPA_DTYPE_I8` values, as `k_scales` against V's dims.
    pub v_scales: SdpaTensor,
    /// This layer's attention-sink logits, one per query head, or NULL (with length 0): the
    /// plan's own sinks (`sdpa_options.sinks`) apply then.
    pub sinks: *const f32,
    /// Entries at `sinks`.
    pub sinks_len: usize,
}
