//! K/V storage as serving engines lay it out: caches in fixed-size pages with a block table
//! (vLLM, FlashAttention-2's `block_table`), and packed variable-length batches without
//! padding (FlashAttention-2's `cu_seqlens`).
//!
//! Both are *views*: the kernel reads each key and value row where it lies (gathering one key
//! block at a time into its scratch when the rows are not adjacent), so nothing is copied per
//! call and nothing grows with the sequence lengths.
//!
//! ```text
//! paged pool  [num_pages, page_size, H_kv, d]        block_table [B][pages_per_seq]
//!   page 0  ┌──────────┐                               seq 0: [2, 0, …]  keys 0..7 in page 2,
//!   page 1  │ tokens … │                                                8..15 in page 0, …
//!   page 2  └──────────┘                               seq 1: [2, 1, …]  shares page 2 (prefix)
//!
//! packed      Q [1, total_q, H, d]    cu_seqlens_q = [0, 3, 3, 8]: seq 0 = rows 0..3,
//!                                                     seq 1 empty, seq 2 = rows 3..8
//!             K [1, total_kv, H_kv, d] cu_seqlens_k alike (or K/V paged)
//! ```
//!
//! Sequence `b` then behaves exactly as a dense call with its own `n_q` rows and key buffer:
//! its keys are the first `kv_lens[b]` of its buffer ([`Options::kv_lens`], required for paged
//! K/V; packed K/V default to their whole segment), bottom-right alignment puts its `n_q` rows at the end of its own keys
//! (`off_b = len_b − n_q,b`), and bias/mask are indexed `[b, i, h, j]` within the sequence
//! (broadcasting against `[B, max n_q, H, max keys]`).
//!
//! [`Options::kv_lens`]: crate::Options::kv_lens

use crate::element::{KvElement, KvPair};
use crate::error::{Error, Operand};
use crate::tensor::Tensor;

/// Where key `j` of sequence `b` lies in the K and V tensors: its `(index along dim 0, index
/// along dim 1)`, the head and channel indices being the call's own.
#[derive(Clone, Copy)]
pub(crate) enum RowMap<'a> {
    /// Dense `[B, n_kv, H_kv, d]`: `(b, j)`.
    Dense,
    /// Packed `[1, total_kv, H_kv, d]`: `(0, cu_seqlens_k[b] + j)`.
    Packed(&'a [usize]),
    /// Paged `[num_pages, page_size, H_kv, d]`: `(table[b][j / page_size], j % page_size)`.
    Paged {
        table: &'a [u32],
        pages_per_seq: usize,
        page_size: usize,
    },
}

/// K and V as tensors of one element type (BSHD, BHSD, padded, broadcast: any strides), dense,
/// packed or paged ([`RowMap`]). f32 rows with unit channel stride are read in place (paged
/// ones through the block table, row by row); other rows (f16/bf16, strided channels) are
/// converted block by block into the worker's buffers.
pub(crate) struct TensorKv<'a, T> {
    pub k: Tensor<'a, T>,
    pub v: Tensor<'a, T>,
    pub map: RowMap<'a>,
}

/// K and V of a generic [`KvElement`] type, named by their concrete type: the kernel's entry
/// point takes K/V this way.
pub(crate) enum AnyKv<'a> {
    F32(TensorKv<'a, f32>),
    F16(TensorKv<'a, half::f16>),
    Bf16(TensorKv<'a, half::bf16>),
    I8(TensorKv<'a, i8>),
}

impl<'a, T: KvElement> TensorKv<'a, T> {
    /// The same K/V, their element type named.
    pub(crate) fn erase(self) -> AnyKv<'a> {
        let TensorKv { k, v, map } = self;
        // (Views rebuilt over the same memory, dims and strides: valid as before.)
        macro_rules! retyped {
            ($variant:ident, $kd:expr, $vd:expr) => {
                AnyKv::$variant(TensorKv {
                    k: k.with_data($kd),
                    v: v.with_data($vd),
                    map,
                })
            };
        }
        match T::pair(k.data(), v.data()) {
            KvPair::F32(kd, vd) => retyped!(F32, kd, vd),
            KvPair::F16(kd, vd) => retyped!(F16, kd, vd),
            KvPair::Bf16(kd, vd) => retyped!(Bf16, kd, vd),
            KvPair::I8(kd, vd) => retyped!(I8, kd, vd),
        }
    }
}

/// A paged K/V cache: a pool of pages for K and one for V, each a [`Tensor`] whose logical
/// dims are `[num_pages, page_size, H_kv, d]` (any strides: vLLM v1's
/// `[num_pages, page_size, H_kv, d]` is [`Tensor::bshd`], a `[num_pages, H_kv, page_size, d]`
/// pool is [`Tensor::bhsd`]), and a block table: row `b` of `block_table` (`pages_per_seq`
/// entries, row-major `[B][pages_per_seq]`) lists the pages of sequence `b` in key order, so
/// its key `j` is slot `j % page_size` of page `block_table[b · pages_per_seq + j / page_size]`.
///
/// Pages may appear in any order and in several rows (shared prefixes: the kernel only reads).
/// The calls require [`Options::kv_lens`](crate::Options::kv_lens): only the entries a
/// sequence's length reaches are read and checked (each must be below `num_pages`, a typed
/// error otherwise), so the rest of a row may hold anything (padding, stale pages). A
/// `PagedKv` borrows the pools, so an engine builds it per step, after writing the step's new
/// K/V rows into their pages (it is a few words).
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a, T> {
    pub(crate) k: Tensor<'a, T>,
    pub(crate) v: Tensor<'a, T>,
    pub(crate) block_table: &'a [u32],
    pub(crate) pages_per_seq: usize,
}

impl<'a, T> PagedKv<'a, T> {
    /// A paged cache over the page pools `k` and `v` (dims `[num_pages, page_size, H_kv,
    /// d_k]` and `[num_pages, page_size, H_kv, d_v]`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] (operand [`Operand::Value`]) when the pools disagree in pages,
    /// page size or heads; [`Error::InvalidValue`] (operand [`Operand::BlockTable`]) for a page
    /// size of 0 or a table whose length is not a multiple of `pages_per_seq`. The table's
    /// length against the batch and its entries are checked by the call.
    pub fn new(
        k: Tensor<'a, T>,
        v: Tensor<'a, T>,
        block_table: &'a [u32],
        pages_per_seq: usize,
    ) -> Result<Self, Error> {
        let [pages, page_size, kv_heads, _] = k.dims();
        let vd = v.dims();
        for (dim, (&got, want)) in crate::error::Dim::ALL
            .into_iter()
            .zip(vd.iter().zip([pages, page_size, kv_heads]))
        {
            if got != want {
                return Err(Error::ShapeMismatch {
                    operand: Operand::Value,
                    dim,
                    expected: want,
                    got,
                });
            }
        }
        if page_size == 0 {
            return Err(Error::InvalidValue {
                operand: Operand::BlockTable,
                index: 0,
                reason: "page size (dim 1 of the page pools) is 0",
            });
        }
        let whole_rows = match pages_per_seq {
            0 => block_table.is_empty(),
            n => block_table.len().is_multiple_of(n),
        };
        if !whole_rows {
            return Err(Error::InvalidValue {
                operand: Operand::BlockTable,
                index: block_table.len(),
                reason: "table length is not a multiple of pages_per_seq",
            });
        }
        Ok(PagedKv {
            k,
            v,
            block_table,
            pages_per_seq,
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.k.dims()[1]
    }

    /// Keys one sequence can hold: `pages_per_seq · page_size` (its logical buffer, the
    /// `n_kv` of a dense call).
    pub(crate) fn capacity(&self) -> Result<usize, Error> {
        self.pages_per_seq
            .checked_mul(self.page_size())
            .ok_or(Error::InvalidValue {
                operand: Operand::BlockTable,
                index: 0,
                reason: "pages_per_seq · page_size overflows usize",
            })
    }
}

/// Packed keys and values: `k` `[1, total_kv, H_kv, d_k]` and `v` `[1, total_kv, H_kv, d_v]`,
/// sequence `b`'s keys in rows `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]` (B + 1 non-decreasing
/// offsets, checked by the call).
#[derive(Debug, Clone, Copy)]
pub struct PackedKv<'a, T> {
    pub(crate) k: Tensor<'a, T>,
    pub(crate) v: Tensor<'a, T>,
    pub(crate) cu_seqlens_k: &'a [usize],
}

impl<'a, T> PackedKv<'a, T> {
    /// Packed K/V with their sequence offsets.
    pub fn new(k: Tensor<'a, T>, v: Tensor<'a, T>, cu_seqlens_k: &'a [usize]) -> Self {
        PackedKv { k, v, cu_seqlens_k }
    }
}

/// The keys and values of a packed variable-length call
/// ([`attention_varlen`](crate::attention_varlen)): packed like the queries, or paged.
#[derive(Debug, Clone, Copy)]
pub enum VarlenKv<'a, T> {
    /// Packed rows with offsets.
    Packed(PackedKv<'a, T>),
    /// Pages with a block table (chunked prefill against a paged cache).
    Paged(PagedKv<'a, T>),
}

impl<'a, T> From<PackedKv<'a, T>> for VarlenKv<'a, T> {
    fn from(kv: PackedKv<'a, T>) -> Self {
        VarlenKv::Packed(kv)
    }
}

impl<'a, T> From<PagedKv<'a, T>> for VarlenKv<'a, T> {
    fn from(kv: PagedKv<'a, T>) -> Self {
        VarlenKv::Paged(kv)
    }
}
