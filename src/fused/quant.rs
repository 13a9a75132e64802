//! 8-bit K/V: the [`KvSource`] of `i8` caches with f32 scales
//! ([`Options::kv_scales`](crate::Options::kv_scales)).
//!
//! Rows are dequantized block by block into the worker's buffers, `x = x_i8 · scale` in f32
//! (one rounding per value, which [`crate::reference::error_bounds`] counts), so every later
//! stage — scores, masks, softmax, output — is the f32 kernel's and every option works
//! unchanged. The scales were validated finite with `|scale| · 128` finite, so dequantized
//! values are finite: the set-aside path for NaN/±∞ values finds nothing.
//!
//! Decode reads the integers in place instead ([`KvSource::keys_in`]), converted exactly as
//! they are loaded, whenever the scales vary along one of the two axes only ([`Scaling`]):
//!
//! * along the channels only — per tensor, per (kv head, channel), anything constant over
//!   the keys of a (batch, kv head) — the kernel folds K's channel scales into Q
//!   (`q·(k ⊙ s) = (q ⊙ s)·k`) and V's into the output (`Σ_j p_j·(v_j ⊙ s) = (Σ_j p_j·v_j) ⊙
//!   s`), [`KvSource::channel_scales`];
//! * along the keys only — per (token, kv head) — it multiplies each score by its key's scale
//!   and each weight by its value's scale before the output product (`Σ_j (p_j·s_j)·v_j`),
//!   [`KvSource::key_scales`].
//!
//! Either is one rounding per product (or weight, or output) in place of one per value, the
//! same count in every term of the bound. Scales varying along both are dequantized, and so
//! are rows where the kernel's guards say no (head sizes below the stacked rows, queries —
//! folded with K's scales, if they are — large enough to overflow the integer dot products:
//! `Tiles` in [`super::item`]).

use super::kv::{KeyRange, KvSource, Rows};
use crate::kv_cache::{RowMap, TensorKv};
use crate::problem::{Broadcast, KvScales};
use crate::simd::{Lanes, RowStream, Simd};
use crate::tensor::Tensor;

/// How the scales of K or of V vary, which decides how decode reads their rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scaling {
    /// The same for every key of a (batch, kv head) (per tensor, per (kv head, channel)):
    /// rows in place, the channel scales folded into Q or into the output.
    Channels,
    /// One per row (per (token, kv head)): rows in place, each key's scale applied to its
    /// score or weight.
    Rows,
    /// Varying along keys and channels: rows dequantized.
    Elements,
}

impl Scaling {
    /// The scaling of `scales` for K/V stored with `map`: dim 1 of the storage is always a
    /// position along the keys, dim 0 too for a paged cache (a page), while dense dim 0 is the
    /// batch, constant within a work item (packed dim 0 has size 1).
    fn of(scales: &Broadcast<'_, f32>, map: &RowMap<'_>) -> Self {
        let [s0, s1, _, s3] = scales.strides;
        let along_keys = s1 != 0 || (matches!(map, RowMap::Paged { .. }) && s0 != 0);
        match (along_keys, s3 != 0) {
            (false, _) => Scaling::Channels,
            (true, false) => Scaling::Rows,
            (true, true) => Scaling::Elements,
        }
    }
}

/// `i8` K/V (dense, packed or paged, any strides) and their validated scales.
pub(crate) struct QuantKv<'a> {
    kv: TensorKv<'a, i8>,
    scales: KvScales<'a>,
    /// How K's and V's scales vary.
    scaling: [Scaling; 2],
}

impl<'a> QuantKv<'a> {
    pub fn new(kv: TensorKv<'a, i8>, scales: KvScales<'a>) -> Self {
        let scaling = [
            Scaling::of(&scales.k, &kv.map),
            Scaling::of(&scales.v, &kv.map),
        ];
        QuantKv {
            kv,
            scales,
            scaling,
        }
    }
}

impl QuantKv<'_> {
    /// The rows of `at` of `t` in place, as `E` = `i8`, if its scales vary along one axis only
    /// (`scaling`), the channel stride is 1 and rows are not empty.
    #[inline(always)]
    fn in_place<'s, E: Lanes>(
        &'s self,
        t: &Tensor<'s, i8>,
        scaling: Scaling,
        at: KeyRange,
    ) -> Option<Rows<'s, E>> {
        if scaling == Scaling::Elements || t.dims()[3] == 0 {
            return None;
        }
        let rows = self.kv.rows_of(t, at)?;
        Some(rows.retype(E::of_i8(rows.data())?))
    }

    /// The scale of each row of `at` (channel 0's), to `out[..at.len]` (`Scaling::Rows`).
    #[inline(always)]
    fn row_scales(&self, scales: &Broadcast<'_, f32>, at: KeyRange, out: &mut [f32]) {
        if at.len == 0 {
            return;
        }
        // Read along the runs of adjacent keys (one for dense and packed caches, one per page
        // for paged ones), the scales `ld` apart. (Key by key through the position map, a match
        // and an index computation per key, kv head and block, for K and for V, these reads
        // were most of what per-token scales cost over folded ones in decode: Zen 4,
        // 2026-12-06.)
        let rows = self.kv.map.rows(scales.data, scales.strides, at);
        let mut j = 0;
        while j < at.len {
            let (run, n) = rows.run(j, at.len - j);
            for (i, x) in out[j..j + n].iter_mut().enumerate() {
                *x = run[i * rows.ld];
            }
            j += n;
        }
    }

    /// Writes the rows of `at` of `t` (`width` values each), dequantized with `scales`, to
    /// `buf` as rows `ld` apart.
    #[inline(always)]
    fn dequantize(
        &self,
        t: &Tensor<'_, i8>,
        scales: &Broadcast<'_, f32>,
        at: KeyRange,
        width: usize,
        ld: usize,
        buf: &mut [f32],
    ) {
        if width == 0 {
            return; // the view may be empty, with any strides: nothing to read
        }
        let (data, sd) = (t.data(), t.strides()[3]);
        let s3 = scales.strides[3];
        for j in 0..at.len {
            // Both offsets are inside their views: the key's storage position and the kv head
            // are inside K/V's dims, and the scales broadcast against those dims (validated).
            let base = self.kv.row_offset(t, at, j);
            let scale_base = self.kv.map.offset(scales.strides, at, j);
            let row = &mut buf[j * ld..j * ld + width];
            match (sd, s3) {
                (1, 0) => {
                    let x = scales.data[scale_base];
                    for (d, &q) in row.iter_mut().zip(&data[base..base + width]) {
                        *d = f32::from(q) * x;
                    }
                }
                (1, 1) => {
                    let src = &data[base..base + width];
                    let sc = &scales.data[scale_base..scale_base + width];
                    for ((d, &q), &x) in row.iter_mut().zip(src).zip(sc) {
                        *d = f32::from(q) * x;
                    }
                }
                _ => {
                    for (c, d) in row.iter_mut().enumerate() {
                        *d = f32::from(data[base + c * sd]) * scales.data[scale_base + c * s3];
                    }
                }
            }
        }
    }
}

impl KvSource for QuantKv<'_> {
    fn packs_keys(&self) -> bool {
        true
    }

    #[inline(always)]
    fn keys<'s, S: Simd>(&'s self, _: S, at: KeyRange, buf: &'s mut [f32]) -> Rows<'s> {
        let d_k = self.kv.k.dims()[3];
        self.dequantize(&self.kv.k, &self.scales.k, at, d_k, d_k, buf);
        Rows::strided(buf, d_k)
    }

    fn values_in_place(&self, _: KeyRange, _: usize) -> Option<Rows<'_>> {
        None
    }

    #[inline(always)]
    fn pack_values<S: Simd>(&self, _: S, at: KeyRange, d_v_pad: usize, buf: &mut [f32]) {
        let d_v = self.kv.v.dims()[3];
        self.dequantize(&self.kv.v, &self.scales.v, at, d_v, d_v_pad, buf);
    }

    const F16: bool = false;
    const BF16: bool = false;
    const I8: bool = true;
    const ELEMENT_BYTES: usize = size_of::<i8>();

    #[inline(always)]
    fn keys_in<E: Lanes>(&self, at: KeyRange) -> Option<Rows<'_, E>> {
        self.in_place(&self.kv.k, self.scaling[0], at)
    }

    #[inline(always)]
    fn values_in<E: Lanes>(&self, at: KeyRange, d_v_pad: usize) -> Option<Rows<'_, E>> {
        if self.kv.v.dims()[3] != d_v_pad {
            return None;
        }
        self.in_place(&self.kv.v, self.scaling[1], at)
    }

    fn channel_scales(
        &self,
        values: bool,
        batch: usize,
        kv_head: usize,
    ) -> Option<Broadcast<'_, f32>> {
        let (scales, scaling) = match values {
            false => (&self.scales.k, self.scaling[0]),
            true => (&self.scales.v, self.scaling[1]),
        };
        if scaling != Scaling::Channels {
            return None;
        }
        // Inside the scales: they broadcast against K/V's dims (validated), `batch` is inside
        // dense dim 0 (packed and paged scales have stride 0 there: `Scaling::of`), and
        // `kv_head` inside dim 2.
        let [s0, _, s2, s3] = scales.strides;
        Some(Broadcast {
            data: &scales.data[batch * s0 + kv_head * s2..],
            strides: [0, 0, 0, s3],
        })
    }

    #[inline(always)]
    fn key_scales(&self, at: KeyRange, out: &mut [f32]) {
        self.row_scales(&self.scales.k, at, out);
    }

    #[inline(always)]
    fn value_scales(&self, at: KeyRange, out: &mut [f32]) {
        self.row_scales(&self.scales.v, at, out);
    }

    #[inline(always)]
    fn prefetch_streams(&self, at: KeyRange) -> [Option<RowStream>; 2] {
        [
            self.kv.stream(&self.kv.k, at),
            self.kv.stream(&self.kv.v, at),
        ]
    }
}
