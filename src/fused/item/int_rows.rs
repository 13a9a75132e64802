//! 8-bit K/V read in place: how an item reads its integer rows (`plan_int_rows`), channel
//! scales folded into Q or the output, per-key scales spread over the rows as factors.

use super::queries::pack_queries;
use super::work::{Ctx, IntRows, Item, Tiles};
use crate::fused::kv::{KeyRange, KvSource};
use crate::simd::Simd;
use crate::tensor::AnyTensor;
use std::ops::Range;

/// How the item reads its 8-bit keys and values (`Tiles::int_keys`, `int_values`), decided
/// once for all its blocks: whether the source gives rows in place depends on the call's
/// shapes and strides only, so the first visible key's rows stand for every block's. Folded
/// scales must never meet dequantized rows (they would apply twice).
///
/// Keys in place need every row's dot product with integers of magnitude ≤ 128 to stay finite
/// in f32 before any scale multiplies it ([`int_dots_finite`], on Q as folded). Scales that
/// vary along channels only ([`KvSource::channel_scales`]) are folded: K's into each head's
/// Q rows (`q·(k ⊙ s) = (q ⊙ s)·k`, one rounding per product as dequantizing has), V's into
/// the output after the last block.
#[inline(always)]
pub(super) fn plan_int_rows<S: Simd, KV: KvSource>(
    s: S,
    cx: &Ctx<'_, KV>,
    q: &AnyTensor<'_>,
    item: &Item,
    t: &mut Tiles,
    first: usize,
    qt: &mut [f32],
) {
    let at = |g: usize| KeyRange {
        batch: item.batch,
        kv_head: item.kv_head + g,
        j0: first,
        len: 1,
    };
    // The scales' shape is the call's: one head's answer is every head's.
    let folds = |values: bool| {
        cx.kv
            .channel_scales(values, item.batch, item.kv_head)
            .is_some()
    };
    let (per_key, folded) = (IntRows::PerKey, IntRows::Folded);
    if (0..item.heads).all(|g| cx.kv.keys_in::<i8>(at(g)).is_some()) {
        let rows = t.rows * t.d_k;
        let fold = folds(false);
        if fold {
            scale_rows_by_channels(s, cx, item, false, &mut qt[..rows], (t.d_k, t.d_k));
        }
        if int_dots_finite(s, &qt[..rows]) {
            t.int_keys = if fold { folded } else { per_key };
        } else if fold {
            // The keys are dequantized after all: Q as given.
            pack_queries(s, cx, q, item, t, qt);
        }
    }
    if (0..item.heads).all(|g| cx.kv.values_in::<i8>(at(g), t.d_vp).is_some()) {
        // (`(Σ_j p_j·v_j)·s` is the sum the dequantized rows accumulate, so it overflows only
        // where theirs does: values with `|v|·n_visible` near `f32::MAX`, README's documented
        // limit.)
        t.int_values = if folds(true) { folded } else { per_key };
    }
}

/// Each head's rows of `rows` (stacked rows of the item, `ld` apart) times the channel scales
/// of its kv head's keys (`values` false) or values, over their first `width` entries, for
/// scales that vary along channels only ([`KvSource::channel_scales`]; else nothing changes).
/// Contiguous scales (per (kv head, channel)) by whole vectors, one scale (per tensor) as a
/// splat: element by element through the broadcast's indexing, these multiplies were 10% of an
/// i8 decode step with folded scales (an item folds all its heads' rows, once per key split).
#[inline(always)]
pub(super) fn scale_rows_by_channels<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    values: bool,
    rows: &mut [f32],
    (ld, width): (usize, usize),
) {
    let head_len = rows.len() / item.heads;
    for (g, head) in rows.chunks_exact_mut(head_len).enumerate() {
        let Some(scales) = cx.kv.channel_scales(values, item.batch, item.kv_head + g) else {
            continue;
        };
        let whole = width / S::LANES * S::LANES;
        for row in head.chunks_exact_mut(ld) {
            let row = &mut row[..width];
            match scales.strides[3] {
                0 => {
                    let x = scales.at([0; 4]);
                    let one = s.splat(x);
                    let (body, tail) = row.split_at_mut(whole);
                    for v in body.chunks_exact_mut(S::LANES) {
                        s.store(v, s.mul(s.load(v), one));
                    }
                    tail.iter_mut().for_each(|v| *v *= x);
                }
                1 => {
                    let by = &scales.data[..width];
                    let (body, tail) = row.split_at_mut(whole);
                    for (v, c) in body
                        .chunks_exact_mut(S::LANES)
                        .zip(by.chunks_exact(S::LANES))
                    {
                        s.store(v, s.mul(s.load(v), s.load(c)));
                    }
                    for (v, c) in tail.iter_mut().zip(&by[whole..]) {
                        *v *= c;
                    }
                }
                _ => {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v *= scales.at([0, 0, 0, c]);
                    }
                }
            }
        }
    }
}

/// Writes `scales[j]` to the entries of `rows` of key `j` in `factors` (laid out like Sᵀ,
/// leading dimension `ld_s`), for every `j`: the per-key scales of one head's 8-bit rows read
/// in place, spread so that [`softmax_update`] multiplies whole vectors of rows (padding rows
/// take whatever `factors` holds there: they are never written out). Written four
/// entries at a time: a head's rows are few (decode: `n_q · group`, often exactly four), and
/// `fill` on a slice of unknown length compiled to a loop of scalar stores, 8% of an i8 decode
/// step in `perf` (Zen 4, 2026-12-04); in fours it is one 16-byte store per key.
#[inline(always)]
pub(super) fn spread_factors(scales: &[f32], rows: Range<usize>, ld_s: usize, factors: &mut [f32]) {
    for (j, &x) in scales.iter().enumerate() {
        let row = &mut factors[j * ld_s..][rows.clone()];
        let mut quads = row.chunks_exact_mut(4);
        for quad in &mut quads {
            quad.copy_from_slice(&[x; 4]);
        }
        quads.into_remainder().fill(x);
    }
}

/// Whether every query row of `q` (rows of `d_k`, all the rows of a by-channels item) has dot
/// products with integer rows of magnitude ≤ 128 that stay finite in f32: `128 · Σ|q|` over
/// all the rows (which bounds each row's) below half the largest f32 (a margin for the sums'
/// rounding; NaN or ∞ fails). Otherwise 8-bit keys are dequantized first, as the scale may
/// bring the scores back into range. (Whole vectors first: a scalar sum's chain of dependent
/// adds was 7% of an i8 decode step.)
#[inline(always)]
pub(super) fn int_dots_finite<S: Simd>(s: S, q: &[f32]) -> bool {
    let whole = q.len() / S::LANES * S::LANES;
    let mut acc = s.splat(0.0);
    for c in q[..whole].chunks_exact(S::LANES) {
        acc = s.add(acc, s.abs(s.load(c)));
    }
    let tail: f32 = q[whole..].iter().map(|x| x.abs()).sum();
    (s.reduce_add(acc) + tail) * 128.0 < f32::MAX / 2.0
}
