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

/// K and V as strided tensors of one element type (BSHD, BHSD, padded, broadcast: any
/// strides). f32 rows with unit stride are read in place; f16/bf16 rows are converted block by
/// block into the worker's buffers.
pub(crate) struct StridedKv<'a, T> {
    pub k: Tensor<'a, T>,
    pub v: Tensor<'a, T>,
}

impl<T: Element> StridedKv<'_, T> {
    /// Element offset of row `j` of (batch, kv head) in `t`: inside the view's validated span
    /// because every index is inside its dims (callers pass keys `< n_kv` of a non-empty view).
    #[inline(always)]
    fn row_offset(t: &Tensor<'_, T>, at: KeyRange, j: usize) -> usize {
        let [sb, ss, sh, _] = t.strides();
        at.batch * sb + (at.j0 + j) * ss + at.kv_head * sh
    }
}

impl<T: Element> KvSource for StridedKv<'_, T> {
    fn packs_keys(&self) -> bool {
        // Only unit-stride f32 rows are read in place.
        self.k.strides()[3] != 1 || T::as_f32(self.k.data()).is_none()
    }

    #[inline(always)]
    fn keys<'s>(&'s self, at: KeyRange, buf: &'s mut [f32]) -> Rows<'s> {
        let d_k = self.k.dims()[3];
        let data = self.k.data();
        let [_, ks_s, _, ks_d] = self.k.strides();
        if ks_d == 1 {
            if let Some(f) = T::as_f32(data) {
                return Rows {
                    data: &f[Self::row_offset(&self.k, at, 0)..],
                    ld: ks_s,
                };
            }
        }
        for j in 0..at.len {
            let base = Self::row_offset(&self.k, at, j);
            let dst = &mut buf[j * d_k..(j + 1) * d_k];
            if ks_d == 1 {
                T::convert_to_f32(&data[base..base + d_k], dst);
            } else {
                for (x, d) in dst.iter_mut().enumerate() {
                    *d = data[base + x * ks_d].to_f32();
                }
            }
        }
        Rows { data: buf, ld: d_k }
    }

    #[inline(always)]
    fn values_in_place(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_>> {
        let d_v = self.v.dims()[3];
        let [_, vs_s, _, vs_d] = self.v.strides();
        let data = T::as_f32(self.v.data())?;
        (vs_d == 1 && d_v == d_v_pad && d_v > 0).then(|| Rows {
            data: &data[Self::row_offset(&self.v, at, 0)..],
            ld: vs_s,
        })
    }

    #[inline(always)]
    fn pack_values(&self, at: KeyRange, d_v_pad: usize, buf: &mut [f32]) {
        let d_v = self.v.dims()[3];
        if d_v == 0 {
            return; // the view may be empty, with any strides: nothing to read
        }
        let data = self.v.data();
        let vs_d = self.v.strides()[3];
        for j in 0..at.len {
            let base = Self::row_offset(&self.v, at, j);
            let row = &mut buf[j * d_v_pad..j * d_v_pad + d_v];
            if vs_d == 1 {
                T::convert_to_f32(&data[base..base + d_v], row);
            } else {
                for (x, out) in row.iter_mut().enumerate() {
                    *out = data[base + x * vs_d].to_f32();
                }
            }
        }
    }
}
