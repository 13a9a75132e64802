//! Where the kernel loop reads keys and values from.
//!
//! The loop of [`super::item`] never indexes K or V itself: for each key block it asks a
//! [`KvSource`] for the block's K rows and V rows as f32 [`Rows`], either in place (the
//! caller's memory, when it already is f32 rows with unit stride) or converted/packed into the
//! worker's buffers. Storage formats — strided f32 tensors today; element types, quantized
//! caches and paged caches next — are implementations of this one trait, not copies of the
//! loop.

use crate::element::Element;
use crate::tensor::Tensor;

/// A block of f32 rows: row `j` is `data[j · ld ..][..width]` (`ld` may be 0: one row
/// repeated).
#[derive(Clone, Copy)]
pub(crate) struct Rows<'s> {
    pub data: &'s [f32],
    pub ld: usize,
}

impl<'s> Rows<'s> {
    /// Row `j`, `width` values.
    #[inline(always)]
    pub fn row(&self, j: usize, width: usize) -> &'s [f32] {
        &self.data[j * self.ld..][..width]
    }
}

/// The keys `j0 .. j0 + len` of one (batch, key/value head).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRange {
    pub batch: usize,
    pub kv_head: usize,
    pub j0: usize,
    pub len: usize,
}

/// A source of key and value rows for the kernel loop.
pub(crate) trait KvSource: Sync {
    /// Whether [`KvSource::keys`] writes into its buffer (which must then hold
    /// `kv_block × d_k` values).
    fn packs_keys(&self) -> bool;

    /// The K rows (`d_k` values each) of `at`: in place, or written to `buf`.
    fn keys<'s>(&'s self, at: KeyRange, buf: &'s mut [f32]) -> Rows<'s>;

    /// The V rows of `at` in place, if the storage already holds them as f32 rows of
    /// `d_v_pad` values (so `d_v = d_v_pad`, no padding columns); `None` otherwise.
    fn values_in_place(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_>>;

    /// Writes the V rows of `at` to `buf` as rows of `d_v_pad` values (`buf` holds at least
    /// `at.len × d_v_pad`); only the first `d_v` columns of each row are written, so padding
    /// columns keep their zeros.
    fn pack_values(&self, at: KeyRange, d_v_pad: usize, buf: &mut [f32]);
}

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

impl RowMap<'_> {
    /// The storage position of key `j` of sequence `b` (validated: inside the tensors).
    #[inline(always)]
    fn locate(&self, b: usize, j: usize) -> (usize, usize) {
        match *self {
            RowMap::Dense => (b, j),
            RowMap::Packed(cu) => (0, cu[b] + j),
            RowMap::Paged {
                table,
                pages_per_seq,
                page_size,
            } => (
                table[b * pages_per_seq + j / page_size] as usize,
                j % page_size,
            ),
        }
    }

    /// Whether keys `at.j0 .. at.j0 + at.len` are consecutive along dim 1 (one stride apart).
    #[inline(always)]
    fn adjacent(&self, at: KeyRange) -> bool {
        match *self {
            RowMap::Dense | RowMap::Packed(_) => true,
            RowMap::Paged { page_size, .. } => at.j0 % page_size + at.len <= page_size,
        }
    }
}

/// K and V as tensors of one element type (BSHD, BHSD, padded, broadcast: any strides), dense,
/// packed or paged ([`RowMap`]). f32 rows with unit stride are read in place where a block's
/// rows are adjacent; otherwise (f16/bf16, strided channels, a block across pages) rows are
/// converted or gathered block by block into the worker's buffers.
pub(crate) struct TensorKv<'a, T> {
    pub k: Tensor<'a, T>,
    pub v: Tensor<'a, T>,
    pub map: RowMap<'a>,
}

impl<T: Element> TensorKv<'_, T> {
    /// Element offset of key `at.j0 + j` of (batch, kv head) in `t`: inside the view's
    /// validated span because every index is inside its dims (callers pass keys below the
    /// sequence's length, whose pages the call validated, of a non-empty view).
    #[inline(always)]
    fn row_offset(&self, t: &Tensor<'_, T>, at: KeyRange, j: usize) -> usize {
        let [sb, ss, sh, _] = t.strides();
        let (b, s) = self.map.locate(at.batch, at.j0 + j);
        b * sb + s * ss + at.kv_head * sh
    }

    /// Converts row `base` of `t` (`dst.len()` values, channel stride `sd`) into `dst`.
    #[inline(always)]
    fn convert_row(data: &[T], base: usize, sd: usize, dst: &mut [f32]) {
        if sd == 1 {
            T::convert_to_f32(&data[base..base + dst.len()], dst);
        } else {
            for (x, d) in dst.iter_mut().enumerate() {
                *d = data[base + x * sd].to_f32();
            }
        }
    }
}

impl<T: Element> KvSource for TensorKv<'_, T> {
    fn packs_keys(&self) -> bool {
        // Only unit-stride f32 rows, never split across pages, are read in place.
        self.k.strides()[3] != 1
            || T::as_f32(self.k.data()).is_none()
            || matches!(self.map, RowMap::Paged { .. })
    }

    #[inline(always)]
    fn keys<'s>(&'s self, at: KeyRange, buf: &'s mut [f32]) -> Rows<'s> {
        let d_k = self.k.dims()[3];
        let data = self.k.data();
        let [_, ks_s, _, ks_d] = self.k.strides();
        if ks_d == 1 && self.map.adjacent(at) {
            if let Some(f) = T::as_f32(data) {
                return Rows {
                    data: &f[self.row_offset(&self.k, at, 0)..],
                    ld: ks_s,
                };
            }
        }
        for j in 0..at.len {
            let base = self.row_offset(&self.k, at, j);
            Self::convert_row(data, base, ks_d, &mut buf[j * d_k..(j + 1) * d_k]);
        }
        Rows { data: buf, ld: d_k }
    }

    #[inline(always)]
    fn values_in_place(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_>> {
        let d_v = self.v.dims()[3];
        let [_, vs_s, _, vs_d] = self.v.strides();
        let data = T::as_f32(self.v.data())?;
        (vs_d == 1 && d_v == d_v_pad && d_v > 0 && self.map.adjacent(at)).then(|| Rows {
            data: &data[self.row_offset(&self.v, at, 0)..],
            ld: vs_s,
        })
    }

    #[inline(always)]
    fn pack_values(&self, at: KeyRange, d_v_pad: usize, buf: &mut [f32]) {
        let d_v = self.v.dims()[3];
        if d_v == 0 {
            return; // the view may be empty, with any strides: nothing to read
        }
        let vs_d = self.v.strides()[3];
        for j in 0..at.len {
            let base = self.row_offset(&self.v, at, j);
            let row = &mut buf[j * d_v_pad..j * d_v_pad + d_v];
            Self::convert_row(self.v.data(), base, vs_d, row);
        }
    }
}
