//! 8-bit K/V: the [`KvSource`] of `i8` caches with f32 scales
//! ([`Options::kv_scales`](crate::Options::kv_scales)).
//!
//! Rows are dequantized block by block into the worker's buffers, `x = x_i8 · scale` in f32
//! (one rounding per value, which [`crate::reference::error_bounds`] counts), so every later
//! stage — scores, masks, softmax, output — is the f32 kernel's and every option works
//! unchanged. The scales were validated finite with `|scale| · 128` finite, so dequantized
//! values are finite: the set-aside path for NaN/±∞ values finds nothing.

use super::kv::{KeyRange, KvSource, Rows, TensorKv};
use crate::problem::{Broadcast, KvScales};
use crate::simd::{Lanes, RowStream, Simd};
use crate::tensor::Tensor;

/// `i8` K/V (dense, packed or paged, any strides) and their validated scales.
pub(crate) struct QuantKv<'a> {
    pub kv: TensorKv<'a, i8>,
    pub scales: KvScales<'a>,
}

impl QuantKv<'_> {
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
        let [s0, s1, s2, s3] = scales.strides;
        for j in 0..at.len {
            // Both offsets are inside their views: the key's storage position and the kv head
            // are inside K/V's dims, and the scales broadcast against those dims (validated).
            let base = self.kv.row_offset(t, at, j);
            let (b, s) = self.kv.position(at, j);
            let scale_base = b * s0 + s * s1 + at.kv_head * s2;
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

    fn keys_in<E: Lanes>(&self, _: KeyRange) -> Option<Rows<'_, E>> {
        None
    }

    fn values_in<E: Lanes>(&self, _: KeyRange, _: usize) -> Option<Rows<'_, E>> {
        None
    }

    #[inline(always)]
    fn prefetch_streams(&self, at: KeyRange) -> [Option<RowStream>; 2] {
        [
            self.kv.stream(&self.kv.k, at),
            self.kv.stream(&self.kv.v, at),
        ]
    }
}
