//! Where the kernel loop reads keys and values from.
//!
//! The loop of [`super::item`] never indexes K or V itself: for each key block it asks a
//! [`KvSource`] for the block's K rows and V rows as f32 [`Rows`], either in place (the
//! caller's memory, when it already is f32 rows with unit stride) or converted/packed into the
//! worker's buffers; the decode path may also take half-precision or 8-bit rows in place
//! ([`KvSource::keys_in`]) and convert them as it loads them (applying 8-bit rows' per-key
//! scales itself, [`KvSource::key_scales`]), and asks the source where the
//! next block's rows lie ([`KvSource::prefetch_streams`]) to prefetch them. Storage formats —
//! strided tensors of every element type, dense, packed or paged ([`RowMap`]); 8-bit quantized
//! caches ([`super::quant`]) — are implementations of this one trait, not copies of the loop.

use crate::element::{dtype, Dtype, Element, KvElement};
use crate::kv_cache::{RowMap, TensorKv};
use crate::problem::Broadcast;
use crate::simd::{Lanes, RowStream, Simd};
use crate::tensor::Tensor;

/// A block of rows (f32, or, read in place, the storage's type `E`), `width` values each: row
/// `j` starts at `data[j · ld]` (`ld` may be 0: one row repeated), or, for rows read in place
/// from a paged cache, at its page's offset.
pub(crate) struct Rows<'s, E = f32> {
    data: &'s [E],
    /// Elements between adjacent rows.
    pub ld: usize,
    pages: Option<Pages<'s>>,
}

/// Where the rows of a block read in place from a paged cache lie: row `j` is key
/// `first + j` of a sequence whose pages are `table`.
#[derive(Clone, Copy)]
struct Pages<'s> {
    table: &'s [u32],
    first: usize,
    page_size: usize,
    /// `log2(page_size)` when it is a power of two (a shift and a mask instead of a division).
    shift: Option<u32>,
    /// Elements between pages, and the head's offset inside a slot.
    page_stride: usize,
    head: usize,
}

impl<E> Clone for Rows<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Rows<'_, E> {}

impl<'s, E> Rows<'s, E> {
    /// Rows `ld` apart from the start of `data`.
    pub fn strided(data: &'s [E], ld: usize) -> Self {
        Rows {
            data,
            ld,
            pages: None,
        }
    }

    /// The offset of row `j` in `data`.
    #[inline(always)]
    fn start(&self, j: usize) -> usize {
        match self.pages {
            None => j * self.ld,
            Some(p) => {
                let key = p.first + j;
                let (page, slot) = match p.shift {
                    Some(shift) => (key >> shift, key & (p.page_size - 1)),
                    None => (key / p.page_size, key % p.page_size),
                };
                p.table[page] as usize * p.page_stride + slot * self.ld + p.head
            }
        }
    }

    /// Row `j`, `width` values.
    #[inline(always)]
    pub fn row(&self, j: usize, width: usize) -> &'s [E] {
        &self.data[self.start(j)..][..width]
    }

    /// The rows from `j` on that are adjacent in memory (`ld` apart), at most `limit`: the
    /// data from row `j` and their count (≥ 1 when `limit ≥ 1`).
    #[inline(always)]
    pub fn run(&self, j: usize, limit: usize) -> (&'s [E], usize) {
        let n = match self.pages {
            None => limit,
            Some(p) => limit.min(p.page_size - (p.first + j) % p.page_size),
        };
        (&self.data[self.start(j)..], n)
    }
}

impl<'s, E> Rows<'s, E> {
    /// All the memory the rows lie in.
    pub(super) fn data(&self) -> &'s [E] {
        self.data
    }

    /// The same rows over `data`, which is the same memory as `self.data` seen as another
    /// element type (what [`Element::as_f16`] and friends return).
    pub(super) fn retype<F>(self, data: &'s [F]) -> Rows<'s, F> {
        Rows {
            data,
            ld: self.ld,
            pages: self.pages,
        }
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
    fn keys<'s, S: Simd>(&'s self, s: S, at: KeyRange, buf: &'s mut [f32]) -> Rows<'s>;

    /// The V rows of `at` in place, if the storage already holds them as f32 rows of
    /// `d_v_pad` values (so `d_v = d_v_pad`, no padding columns); `None` otherwise.
    fn values_in_place(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_>>;

    /// Writes the V rows of `at` to `buf` as rows of `d_v_pad` values (`buf` holds at least
    /// `at.len × d_v_pad`); only the first `d_v` columns of each row are written, so padding
    /// columns keep their zeros.
    fn pack_values<S: Simd>(&self, s: S, at: KeyRange, d_v_pad: usize, buf: &mut [f32]);

    /// Whether the storage holds f16, bf16 or 8-bit integers (constants, so that a kernel
    /// branching on them compiles only its own element type's code).
    const F16: bool;
    const BF16: bool;
    const I8: bool;
    /// Bytes per stored K/V element, for the cache model ([`super::blocking::Blocking`]): the
    /// size of the stored type, as [`crate::scratch_bytes_per_thread`] takes it from the
    /// caller's element type.
    const ELEMENT_BYTES: usize;

    /// The K rows of `at` in place as `E`, if the storage holds `E` with unit channel stride
    /// (8-bit rows: and one scale per row, [`KvSource::key_scales`]).
    fn keys_in<E: Lanes>(&self, at: KeyRange) -> Option<Rows<'_, E>>;

    /// The V rows of `at` in place as `E`, if the storage holds `E` with unit channel stride
    /// and `d_v = d_v_pad` (8-bit rows: and one scale per row, [`KvSource::value_scales`]).
    fn values_in<E: Lanes>(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_, E>>;

    /// For 8-bit storage whose K (`values = false`) or V (`true`) scales are the same for
    /// every key of a (batch, kv head) (per tensor, per (kv head, channel)): the scales of
    /// `(batch, kv_head)`'s channels, channel `c`'s at `[0, 0, 0, c]`. The rows
    /// [`KvSource::keys_in`]/[`KvSource::values_in`] give are then the integers alone, and
    /// [`KvSource::key_scales`] does not apply: the kernel folds these into Q (keys) or into
    /// the output (values). `None` otherwise.
    fn channel_scales(
        &self,
        _values: bool,
        _batch: usize,
        _kv_head: usize,
    ) -> Option<Broadcast<'_, f32>> {
        None
    }

    /// The scale of each K row of `at` that [`KvSource::keys_in`] gives (a key is its row times
    /// its scale), to `out[..at.len]`: 1 for storage that is not quantized.
    fn key_scales(&self, at: KeyRange, out: &mut [f32]) {
        out[..at.len].fill(1.0);
    }

    /// [`KvSource::key_scales`] for the V rows that [`KvSource::values_in`] gives.
    fn value_scales(&self, at: KeyRange, out: &mut [f32]) {
        out[..at.len].fill(1.0);
    }

    /// Where the K and V rows of the keys from `at.j0` on lie, for prefetching them: plain
    /// strided rows only (paged caches and strided channels give `None`). Computed once per
    /// block and head, so that each request is address arithmetic.
    fn prefetch_streams(&self, at: KeyRange) -> [Option<RowStream>; 2];
}

/// Converts `src` into `dst` (same length) with the lanes' conversions, whole vectors first.
#[inline(always)]
pub(super) fn convert<S: Simd, T: Element>(s: S, src: &[T], dst: &mut [f32]) {
    let lanes = S::LANES;
    let whole = dst.len() / lanes * lanes;
    let (head, tail) = dst.split_at_mut(whole);
    if let Some(x) = T::as_f32(src) {
        head.copy_from_slice(&x[..whole]);
    } else if let Some(x) = T::as_f16(src) {
        // (Indices, not zipped `chunks_exact`: the zip did not inline, and dividing both
        // lengths by the lanes in it was 4% of a bf16 prefill.)
        for i in (0..whole).step_by(lanes) {
            s.store(&mut head[i..i + lanes], s.load_f16(&x[i..i + lanes]));
        }
    } else if let Some(x) = T::as_bf16(src) {
        for i in (0..whole).step_by(lanes) {
            s.store(&mut head[i..i + lanes], s.load_bf16(&x[i..i + lanes]));
        }
    } else {
        T::convert_to_f32(&src[..whole], head);
    }
    for (d, x) in tail.iter_mut().zip(&src[whole..]) {
        *d = x.to_f32();
    }
}

impl<'a> RowMap<'a> {
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

    /// The offset of key `at.j0 + j` of (batch, kv head) in memory laid out with `strides`
    /// along K/V's dims (a tensor's, or a broadcast's against it).
    #[inline(always)]
    pub(super) fn offset(&self, strides: [usize; 4], at: KeyRange, j: usize) -> usize {
        let (b, s) = self.locate(at.batch, at.j0 + j);
        b * strides[0] + s * strides[1] + at.kv_head * strides[2]
    }

    /// The rows of the keys of `at` in `data`, laid out with `strides` along K/V's dims (a
    /// tensor's or a broadcast against it: row `j` starts at key `at.j0 + j`'s offset, the
    /// channels from there on). `at` is non-empty and inside the validated view.
    #[inline(always)]
    pub(super) fn rows<'s, E>(
        &self,
        data: &'s [E],
        strides: [usize; 4],
        at: KeyRange,
    ) -> Rows<'s, E>
    where
        'a: 's,
    {
        let [s0, s1, s2, _] = strides;
        match *self {
            RowMap::Dense | RowMap::Packed(_) => {
                Rows::strided(&data[self.offset(strides, at, 0)..], s1)
            }
            RowMap::Paged { .. } => Rows {
                data,
                ld: s1,
                pages: self.pages(at, s0, s2),
            },
        }
    }

    /// Where the keys of `at` lie in a paged cache whose pages are `page_stride` elements
    /// apart and whose kv heads `head_stride` apart (`None` unless paged).
    #[inline(always)]
    fn pages(&self, at: KeyRange, page_stride: usize, head_stride: usize) -> Option<Pages<'a>> {
        match *self {
            RowMap::Paged {
                table,
                pages_per_seq,
                page_size,
            } => Some(Pages {
                table: &table[at.batch * pages_per_seq..][..pages_per_seq],
                first: at.j0,
                page_size,
                shift: page_size
                    .is_power_of_two()
                    .then(|| page_size.trailing_zeros()),
                page_stride,
                head: at.kv_head * head_stride,
            }),
            _ => None,
        }
    }
}

impl<T: KvElement> TensorKv<'_, T> {
    /// Element offset of key `at.j0 + j` of (batch, kv head) in `t`: inside the view's
    /// validated span because every index is inside its dims (callers pass keys below the
    /// sequence's length, whose pages the call validated, of a non-empty view).
    #[inline(always)]
    pub(super) fn row_offset(&self, t: &Tensor<'_, T>, at: KeyRange, j: usize) -> usize {
        self.map.offset(t.strides(), at, j)
    }
}

impl<T: Element> TensorKv<'_, T> {
    /// Converts row `base` of `t` (`dst.len()` values, channel stride `sd`) into `dst`.
    #[inline(always)]
    fn convert_row<S: Simd>(s: S, data: &[T], base: usize, sd: usize, dst: &mut [f32]) {
        if sd == 1 {
            convert(s, &data[base..base + dst.len()], dst);
        } else {
            for (x, d) in dst.iter_mut().enumerate() {
                *d = data[base + x * sd].to_f32();
            }
        }
    }
}

impl<T: KvElement> TensorKv<'_, T> {
    /// The rows of `t` from key `at.j0` of (batch, kv head) on, as a [`RowStream`], if they
    /// are plain strided rows (not paged, unit channel stride, a non-empty view).
    #[inline(always)]
    pub(super) fn stream(&self, t: &Tensor<'_, T>, at: KeyRange) -> Option<RowStream> {
        let [d0, d1, _, width] = t.dims();
        let [sb, ss, sh, sd] = t.strides();
        let (b, row) = match self.map {
            RowMap::Dense => (at.batch, at.j0),
            RowMap::Packed(cu) => (0, cu.get(at.batch)?.wrapping_add(at.j0)),
            RowMap::Paged { .. } => return None,
        };
        if b >= d0 || d1 == 0 || width == 0 || sd != 1 {
            return None;
        }
        let size = std::mem::size_of::<T>();
        let offset = b
            .wrapping_mul(sb)
            .wrapping_add(row.wrapping_mul(ss))
            .wrapping_add(at.kv_head.wrapping_mul(sh));
        Some(RowStream::new(
            t.data()
                .as_ptr()
                .cast::<u8>()
                .wrapping_add(offset.wrapping_mul(size)),
            ss.wrapping_mul(size),
            width * size,
        ))
    }

    /// The rows of `at` in place in `t`, in its element type, if its channel stride is 1.
    /// ([`RowMap::rows`] computes the same; called from here it made f32 decode 10–17% slower
    /// on Zen 4, the kernel's code around it compiled differently: see docs/performance.md.)
    #[inline(always)]
    pub(super) fn rows_of<'s>(&'s self, t: &Tensor<'s, T>, at: KeyRange) -> Option<Rows<'s, T>> {
        let [s0, s1, s2, s3] = t.strides();
        let data = t.data();
        if s3 != 1 {
            return None;
        }
        Some(match self.map {
            RowMap::Dense | RowMap::Packed(_) => {
                Rows::strided(&data[self.row_offset(t, at, 0)..], s1)
            }
            RowMap::Paged { .. } => Rows {
                data,
                ld: s1,
                pages: self.map.pages(at, s0, s2),
            },
        })
    }
}

impl<T: Element> TensorKv<'_, T> {
    /// The rows of `at` read in place from `t`, if it holds f32 with unit channel stride.
    #[inline(always)]
    fn in_place<'s>(&'s self, t: &Tensor<'s, T>, at: KeyRange) -> Option<Rows<'s>> {
        let rows = self.rows_of(t, at)?;
        Some(rows.retype(T::as_f32(rows.data)?))
    }
}

impl<T: Element> KvSource for TensorKv<'_, T> {
    fn packs_keys(&self) -> bool {
        // Only unit-stride f32 rows are read in place.
        self.k.strides()[3] != 1 || T::as_f32(self.k.data()).is_none()
    }

    #[inline(always)]
    fn keys<'s, S: Simd>(&'s self, s: S, at: KeyRange, buf: &'s mut [f32]) -> Rows<'s> {
        if let Some(rows) = self.in_place(&self.k, at) {
            return rows;
        }
        let d_k = self.k.dims()[3];
        let ks_d = self.k.strides()[3];
        for j in 0..at.len {
            let base = self.row_offset(&self.k, at, j);
            Self::convert_row(
                s,
                self.k.data(),
                base,
                ks_d,
                &mut buf[j * d_k..(j + 1) * d_k],
            );
        }
        Rows::strided(buf, d_k)
    }

    #[inline(always)]
    fn values_in_place(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_>> {
        let d_v = self.v.dims()[3];
        if d_v != d_v_pad || d_v == 0 {
            return None;
        }
        self.in_place(&self.v, at)
    }

    #[inline(always)]
    fn pack_values<S: Simd>(&self, s: S, at: KeyRange, d_v_pad: usize, buf: &mut [f32]) {
        let d_v = self.v.dims()[3];
        if d_v == 0 {
            return; // the view may be empty, with any strides: nothing to read
        }
        let vs_d = self.v.strides()[3];
        for j in 0..at.len {
            let base = self.row_offset(&self.v, at, j);
            let row = &mut buf[j * d_v_pad..j * d_v_pad + d_v];
            Self::convert_row(s, self.v.data(), base, vs_d, row);
        }
    }

    const F16: bool = matches!(dtype::<T>(), Dtype::F16);
    const BF16: bool = matches!(dtype::<T>(), Dtype::Bf16);
    const I8: bool = false;
    const ELEMENT_BYTES: usize = size_of::<T>();

    #[inline(always)]
    fn keys_in<E: Lanes>(&self, at: KeyRange) -> Option<Rows<'_, E>> {
        let rows = self.rows_of(&self.k, at)?;
        Some(rows.retype(E::of(rows.data)?))
    }

    #[inline(always)]
    fn values_in<E: Lanes>(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_, E>> {
        let d_v = self.v.dims()[3];
        if d_v != d_v_pad || d_v == 0 {
            return None;
        }
        let rows = self.rows_of(&self.v, at)?;
        Some(rows.retype(E::of(rows.data)?))
    }

    #[inline(always)]
    fn prefetch_streams(&self, at: KeyRange) -> [Option<RowStream>; 2] {
        [self.stream(&self.k, at), self.stream(&self.v, at)]
    }
}
