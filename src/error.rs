//! The one error type of the crate: every invalid input is answered with a variant that says
//! which argument is wrong, in which dimension, and what was expected.

use std::fmt;

/// Which argument of an attention call an [`Error`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operand {
    /// The queries `Q`.
    Query,
    /// The keys `K`.
    Key,
    /// The values `V`.
    Value,
    /// The output `O`.
    Output,
    /// The log-sum-exp output slice.
    Lse,
    /// The additive bias tensor of [`Options::bias`](crate::Options::bias).
    Bias,
    /// The boolean mask tensor of [`Options::mask`](crate::Options::mask).
    Mask,
    /// The per-sequence key lengths of [`Options::kv_lens`](crate::Options::kv_lens).
    KvLens,
    /// The ALiBi slopes of [`Options::alibi`](crate::Options::alibi).
    AlibiSlopes,
    /// The attention-sink logits of [`Options::sinks`](crate::Options::sinks).
    Sinks,
    /// One of the partial results given to [`merge_partials`](crate::merge_partials).
    Partial,
    /// The query offsets `cu_seqlens_q` of a packed batch
    /// ([`attention_varlen`](crate::attention_varlen)).
    CuSeqlensQ,
    /// The key offsets of packed K/V ([`PackedKv`](crate::PackedKv)).
    CuSeqlensK,
    /// The block table (or page size) of a paged cache ([`PagedKv`](crate::PagedKv)).
    BlockTable,
    /// The scales of 8-bit keys ([`Options::kv_scales`](crate::Options::kv_scales)).
    KeyScales,
    /// The scales of 8-bit values ([`Options::kv_scales`](crate::Options::kv_scales)).
    ValueScales,
    /// A rotary embedding's parameters ([`Rope`](crate::Rope): rotary dimension, base).
    Rope,
    /// The positions of the tokens a rotary embedding rotates.
    Positions,
    /// A rotary embedding's `cos`/`sin` tables.
    RopeTables,
    /// The cache slots of [`append`](crate::append).
    Slots,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operand::Query => "query",
            Operand::Key => "key",
            Operand::Value => "value",
            Operand::Output => "output",
            Operand::Lse => "lse",
            Operand::Bias => "bias",
            Operand::Mask => "mask",
            Operand::KvLens => "kv_lens",
            Operand::AlibiSlopes => "alibi slopes",
            Operand::Sinks => "sinks",
            Operand::Partial => "partial",
            Operand::CuSeqlensQ => "cu_seqlens_q",
            Operand::CuSeqlensK => "cu_seqlens_k",
            Operand::BlockTable => "block table",
            Operand::KeyScales => "key scales",
            Operand::ValueScales => "value scales",
            Operand::Rope => "rope",
            Operand::Positions => "positions",
            Operand::RopeTables => "rope tables",
            Operand::Slots => "slots",
        })
    }
}

/// A logical dimension of a `[batch, seq, heads, dim]` tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Dimension 0: the batch.
    Batch,
    /// Dimension 1: the sequence (query rows or key/value positions).
    Seq,
    /// Dimension 2: the heads.
    Heads,
    /// Dimension 3: the head size (`d_k` or `d_v`).
    HeadSize,
}

impl Dim {
    /// The four dimensions in storage order of the logical shape.
    pub const ALL: [Dim; 4] = [Dim::Batch, Dim::Seq, Dim::Heads, Dim::HeadSize];
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dim::Batch => "batch",
            Dim::Seq => "seq",
            Dim::Heads => "heads",
            Dim::HeadSize => "head size",
        })
    }
}

/// Everything that can be wrong with the arguments of a call. No public function of this crate
/// panics on bad input; it returns one of these instead.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// `i8` keys and values without [`Options::kv_scales`](crate::Options::kv_scales), or
    /// scales with keys and values of another type (`kv_type`), which take none.
    KvScales {
        /// The K/V element type of the call.
        kv_type: &'static str,
    },
    /// `dims[i] * strides[i]` (or the sum of those spans) does not fit in `usize`.
    LayoutOverflow {
        /// The requested logical shape.
        dims: [usize; 4],
        /// The requested element strides.
        strides: [usize; 4],
    },
    /// The slice is shorter than the largest element index the view can reach, plus one.
    SliceTooShort {
        /// Elements the view needs (largest reachable index + 1).
        needed: usize,
        /// Elements the slice has.
        got: usize,
    },
    /// A writable view whose strides make two logical indices share one element: parallel
    /// writes to it would race, and results would depend on the order of writes.
    OverlappingOutput {
        /// The requested logical shape.
        dims: [usize; 4],
        /// The requested element strides.
        strides: [usize; 4],
    },
    /// One dimension of one operand does not match what the others imply.
    ShapeMismatch {
        /// Which argument.
        operand: Operand,
        /// Which dimension of it.
        dim: Dim,
        /// The size the other arguments imply.
        expected: usize,
        /// The size it has.
        got: usize,
    },
    /// The number of query heads is not a positive multiple of the number of key/value heads.
    HeadsNotDivisible {
        /// Query heads `H`.
        heads: usize,
        /// Key/value heads `H_kv`.
        kv_heads: usize,
    },
    /// A head size of zero for queries and keys: there is no dot product to take.
    ZeroHeadDim,
    /// A slice argument has the wrong number of elements.
    LengthMismatch {
        /// Which argument.
        operand: Operand,
        /// The length the shapes imply.
        expected: usize,
        /// The length it has.
        got: usize,
    },
    /// The softmax scale is NaN or infinite.
    InvalidScale(f32),
    /// The softcap is NaN, infinite, zero, negative, subnormal, or so large that `cap·log₂e`
    /// overflows.
    InvalidSoftcap(f32),
    /// A value in a per-head or per-sequence option is out of range (NaN slope, key length
    /// past `n_kv`, …).
    InvalidValue {
        /// Which argument.
        operand: Operand,
        /// The index of the offending element.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A bias or mask tensor whose shape neither matches nor broadcasts (size 1 or stride 0)
    /// to `[batch, n_q, heads, n_kv]`.
    NotBroadcastable {
        /// Which argument.
        operand: Operand,
        /// Which dimension.
        dim: Dim,
        /// The size needed (or 1).
        expected: usize,
        /// The size it has.
        got: usize,
    },
    /// [`merge_partials`](crate::merge_partials) was given no partial results.
    NoPartials,
    /// Two options place the diagonal differently (e.g. `causal(TopLeft)` with
    /// `sliding_window(.., BottomRight)`): one call has one diagonal.
    ConflictingAlignment,
    /// The reference's `n_q × n_kv` f64 score matrix does not fit in memory (possible with
    /// broadcast views of huge sequence lengths). The fused kernel never needs it.
    ScoreMatrixTooLarge {
        /// Query rows.
        n_q: usize,
        /// Keys.
        n_kv: usize,
    },
    /// The fused kernel's per-worker buffers (which grow with the head sizes, never with the
    /// sequence lengths) cannot be allocated: possible only when broadcast (stride-0) views
    /// declare an enormous head size over a small slice.
    ScratchTooLarge {
        /// Bytes one worker's buffers need (saturated at `usize::MAX`).
        bytes: usize,
    },
    /// [`reference::error_bounds`](crate::reference::error_bounds) cannot allocate one bound
    /// per row (broadcast views of enormous shapes).
    TooManyRows {
        /// `batch · heads · n_q` (saturated at `usize::MAX`).
        rows: usize,
    },
    /// A buffer whose size follows from the arguments ([`alibi_slopes`](crate::alibi_slopes)
    /// for an enormous head count, [`merge_partials`](crate::merge_partials)' row accumulator
    /// for an enormous head size) cannot be allocated.
    OutOfMemory {
        /// Bytes requested (saturated at `usize::MAX`).
        bytes: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LayoutOverflow { dims, strides } => write!(
                f,
                "view with dims {dims:?} and strides {strides:?} overflows usize"
            ),
            Error::SliceTooShort { needed, got } => write!(
                f,
                "slice too short for the view: needs {needed} elements, has {got}"
            ),
            Error::OverlappingOutput { dims, strides } => write!(
                f,
                "writable view with dims {dims:?} and strides {strides:?} maps two indices to one element"
            ),
            Error::ShapeMismatch {
                operand,
                dim,
                expected,
                got,
            } => write!(
                f,
                "{operand} tensor: {dim} dimension is {got}, expected {expected}"
            ),
            Error::HeadsNotDivisible { heads, kv_heads } => write!(
                f,
                "query heads ({heads}) must be a positive multiple of key/value heads ({kv_heads})"
            ),
            Error::KvScales { kv_type: "i8" } => {
                f.write_str("i8 keys and values need scales (Options::kv_scales)")
            }
            Error::KvScales { kv_type } => write!(
                f,
                "Options::kv_scales is for i8 keys and values, not {kv_type}"
            ),
            Error::ZeroHeadDim => f.write_str("query/key head size is 0"),
            Error::LengthMismatch {
                operand,
                expected,
                got,
            } => write!(f, "{operand}: length is {got}, expected {expected}"),
            Error::InvalidScale(s) => write!(f, "scale must be finite, got {s}"),
            Error::InvalidSoftcap(c) => {
                write!(
                    f,
                    "softcap must be a positive normal f32 with finite cap·log2(e), got {c}"
                )
            }
            Error::InvalidValue {
                operand,
                index,
                reason,
            } => write!(f, "{operand}[{index}]: {reason}"),
            Error::NotBroadcastable {
                operand,
                dim,
                expected,
                got,
            } => write!(
                f,
                "{operand} tensor: {dim} dimension is {got}, expected {expected} or 1 (broadcast)"
            ),
            Error::NoPartials => f.write_str("merge needs at least one partial result"),
            Error::ScoreMatrixTooLarge { n_q, n_kv } => write!(
                f,
                "the reference's {n_q} × {n_kv} score matrix does not fit in memory"
            ),
            Error::ScratchTooLarge { bytes } => write!(
                f,
                "the fused kernel's per-worker buffers ({bytes} bytes) cannot be allocated"
            ),
            Error::OutOfMemory { bytes } => {
                write!(f, "a buffer of {bytes} bytes sized from the arguments cannot be allocated")
            }
            Error::TooManyRows { rows } => {
                write!(f, "{rows} per-row error bounds cannot be allocated")
            }
            Error::ConflictingAlignment => f.write_str(
                "causal, sliding window and ALiBi must use the same alignment in one call",
            ),
        }
    }
}

impl std::error::Error for Error {}
