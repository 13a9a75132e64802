//! Writing a step's new K/V rows into a cache ([`append`]): each token's rows into its slot
//! (vLLM's `reshape_and_cache` slot mapping), converted to the cache's type on the way, `i8`
//! with a scale per (token, kv head) computed from the row and written beside it, K rotated
//! by a [`Rope`] first if given.
//!
//! A cache is two writable views, K `[dim 0, dim 1, H_kv, d_k]` and V `[dim 0, dim 1, H_kv,
//! d_v]`: a paged pool `[num_pages, page_size, H_kv, d]` (the pool [`PagedKv`] reads) or a
//! dense cache `[B, n_kv, H_kv, d]`. Slot `s` is row `s % dim 1` of entry `s / dim 1` of dim 0:
//! `page · page_size + offset`, or `b · n_kv + position`.
//!
//! `i8` rows: `scale = max |x| / 127` over the row (after RoPE), `x_i8 = round(x / scale)`
//! (ties to even; a row of zeros gets scale 0 and zeros), so each stored value dequantizes to
//! within `scale / 2` of the f32 row, which is what [`Options::kv_scales`] with per-(token, kv
//! head) scales `[dim 0, dim 1, H_kv, 1]` reads. Rows with NaN, ±∞ or values above 2¹²⁰ in
//! magnitude cannot be stored as `i8`: an error. [`append_scaled`] writes `i8` rows with
//! scales the caller gives instead (per tensor, per (kv head, channel), any broadcast:
//! vLLM's static `k_scale`/`v_scale`), saturating values beyond `127 · |scale|`.
//!
//! [`PagedKv`]: crate::PagedKv
//! [`Options::kv_scales`]: crate::Options::kv_scales

use crate::element::{store_kv, Element, KvElement};
use crate::error::{Dim, Error, Operand};
use crate::problem::{broadcast, Broadcast, MAX_SCALE};
use crate::rope::{Rope, Rotation};
use crate::tensor::{offset, Tensor, TensorMut};

use rayon::prelude::*;

/// The per-(token, kv head) scales an `i8` cache's rows are written with: `[dim 0, dim 1,
/// H_kv, 1]` views for K and V (the caches' first three dims).
pub type AppendScales<'s, 'a> = (&'s mut TensorMut<'a, f32>, &'s mut TensorMut<'a, f32>);

/// Writes the rows of `k` and `v` (`[B, S, H_kv, d_k]`, `[B, S, H_kv, d_v]`; token `(b, s)`)
/// into the caches `k_cache` and `v_cache` at slot `slots[b · S + s]` (module docs), converted
/// to the caches' type; K rotated first by `rope` at the tokens' positions (`positions[b · S +
/// s]`) if given. `scales` are required for `i8` caches (and refused for others).
///
/// Everything is checked before anything is written: on error the caches are unchanged.
///
/// # Errors
/// - [`Error::ShapeMismatch`]: `v` against `k` (batch, tokens, heads), a cache against its rows
///   (heads, head size), `v_cache` against `k_cache` (dims 0 and 1), scales against the cache
///   (dims 0–2, and 1 channel).
/// - [`Error::LengthMismatch`] ([`Operand::Slots`]): `slots.len() ≠ B · S`.
/// - [`Error::InvalidValue`]: a slot past the cache, or one written twice in this call
///   ([`Operand::Slots`]); NaN or ±∞ in a row for an `i8` cache ([`Operand::Key`],
///   [`Operand::Value`], the token's index); the rope's errors ([`Rope::apply`]).
/// - [`Error::KvScales`]: an `i8` cache without scales, or scales for another type.
#[allow(clippy::too_many_arguments)] // the rows, the cache, where, and the two options
pub fn append<S: Element, T: KvElement>(
    k: &Tensor<'_, S>,
    v: &Tensor<'_, S>,
    k_cache: &mut TensorMut<'_, T>,
    v_cache: &mut TensorMut<'_, T>,
    slots: &[usize],
    mut scales: Option<AppendScales<'_, '_>>,
    rope: Option<(&Rope<'_>, &[u32])>,
) -> Result<(), Error> {
    check(
        k,
        v,
        k_cache,
        v_cache,
        slots,
        scales.as_ref().map(|(a, b)| (a.dims(), b.dims())),
    )?;
    let (k_scaling, v_scaling) = match scales.as_mut() {
        Some((ks, vs)) => (Scaling::Row(Shared::new(ks)), Scaling::Row(Shared::new(vs))),
        None => (Scaling::Plain, Scaling::Plain),
    };
    write(k, v, k_cache, v_cache, slots, [k_scaling, v_scaling], rope)
}

/// [`append`] into an `i8` cache with scales the caller gives: `k_scales` and `v_scales` are
/// views that broadcast against the caches' dims (K's `[dim 0, dim 1, H_kv, d_k]`, V's with
/// `d_v`), as [`Options::kv_scales`](crate::Options::kv_scales) reads them — per tensor `[1, 1, 1, 1]`, per (kv head,
/// channel) `[1, 1, H_kv, d]`, … — and pass the same views to the attention call. Each value is
/// stored as `round(x / scale)` (ties to even) saturated to ±127, so values within `127 ·
/// |scale|` dequantize to within `|scale| / 2` and larger ones clip (a scale of 0 stores 0).
/// The scales are not written.
///
/// # Errors
/// Those of [`append`] (without its scale errors), and [`Error::NotBroadcastable`] for scales
/// that do not broadcast against the cache, [`Error::InvalidValue`] ([`Operand::KeyScales`],
/// [`Operand::ValueScales`], the scale's storage index) for a scale this call reads that is not
/// finite or beyond `f32::MAX / 128` in magnitude (what [`Options::kv_scales`](crate::Options::kv_scales) accepts).
#[allow(clippy::too_many_arguments)] // the rows, the cache, where, its scales and the rope
pub fn append_scaled<S: Element>(
    k: &Tensor<'_, S>,
    v: &Tensor<'_, S>,
    k_cache: &mut TensorMut<'_, i8>,
    v_cache: &mut TensorMut<'_, i8>,
    slots: &[usize],
    k_scales: &Tensor<'_, f32>,
    v_scales: &Tensor<'_, f32>,
    rope: Option<(&Rope<'_>, &[u32])>,
) -> Result<(), Error> {
    // The shapes and slots as `append` with per-token scales would check them.
    let [kc, vc] = [k_cache.dims(), v_cache.dims()];
    let per_token = [kc[0], kc[1], kc[2], 1];
    check(k, v, k_cache, v_cache, slots, Some((per_token, per_token)))?;
    let k_view = given_scales(k_scales, kc, Operand::KeyScales, slots)?;
    let v_view = given_scales(v_scales, vc, Operand::ValueScales, slots)?;
    let scaling = [Scaling::Given(k_view), Scaling::Given(v_view)];
    write(k, v, k_cache, v_cache, slots, scaling, rope)
}

/// `t` as scales of a cache with dims `dims`: broadcastable, and every scale the rows at
/// `slots` read valid (as [`Options::kv_scales`](crate::Options::kv_scales) requires).
fn given_scales<'a>(
    t: &Tensor<'a, f32>,
    dims: [usize; 4],
    operand: Operand,
    slots: &[usize],
) -> Result<Broadcast<'a, f32>, Error> {
    let view = broadcast(t, dims, operand)?;
    // Scales that broadcast over dims 0 and 1 are the same for every slot: checked once.
    let per_slot = view.strides[0] != 0 || view.strides[1] != 0;
    let slots = if per_slot {
        slots
    } else {
        &slots[..slots.len().min(1)]
    };
    for &slot in slots {
        let (e0, e1) = (slot / dims[1], slot % dims[1]);
        for h in 0..dims[2] {
            for c in 0..dims[3] {
                let at = offset([e0, e1, h, c], view.strides);
                // A NaN is not valid either.
                let valid = view.data[at].abs() <= MAX_SCALE;
                if !valid {
                    return Err(Error::InvalidValue {
                        operand,
                        index: at,
                        reason: "scale is not finite, or |scale|·128 overflows f32",
                    });
                }
            }
        }
    }
    Ok(view)
}

/// How rows become `T`: as they are, or `i8` with a scale per row (computed and written) or
/// per element (given).
enum Scaling<'s, 'a> {
    Plain,
    Row(Shared<'s, f32>),
    Given(Broadcast<'a, f32>),
}

/// Values (`tokens · H_kv · (d_k + d_v)`) below which an append runs on the calling thread:
/// a decode step's few rows cost less than waking the pool (~2–10 µs per rayon job); a
/// prompt's thousands of rows are split over it. (Under Miri, 64: its tiny test reaches the
/// parallel writes.)
const PARALLEL_MIN_VALUES: usize = if cfg!(miri) { 64 } else { 1 << 16 };

/// A cache or scale view written by several threads at once, element by element.
///
/// Raw because the tokens of one call go to different rayon workers and their slots are
/// scattered over the view: no safe borrow splits a strided view by slots. It borrows the view
/// for its whole life.
struct Shared<'s, T> {
    data: *mut T,
    rows: usize,
    strides: [usize; 4],
    _view: std::marker::PhantomData<&'s mut [T]>,
}

// SAFETY: built from a `&mut` borrow that it keeps (`_view`); every element is written by one
// thread only (the contract of `put`), so sharing it across threads creates no data race.
unsafe impl<T: Send> Send for Shared<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Shared<'_, T> {}

impl<'s, T> Shared<'s, T> {
    fn new(view: &'s mut TensorMut<'_, T>) -> Self {
        let (data, dims, strides) = view.raw_parts();
        Shared {
            data: data.as_mut_ptr(),
            rows: dims[1],
            strides,
            _view: std::marker::PhantomData,
        }
    }

    /// Writes `value(c)` at `[slot / dim 1, slot % dim 1, h, c]` for every `c < n`.
    ///
    /// # Safety
    /// `slot` below the view's `dim 0 · dim 1`, `h` below its dim 2 and `n` at most its dim 3
    /// (then every offset is inside the slice: `TensorMut` checked it for every index inside
    /// its dims), and no other thread writing the same indices meanwhile (the view is
    /// injective, so distinct indices are distinct elements).
    unsafe fn put_row(&self, slot: usize, h: usize, n: usize, value: impl Fn(usize) -> T) {
        let base = offset([slot / self.rows, slot % self.rows, h, 0], self.strides);
        let step = self.strides[3];
        for c in 0..n {
            // SAFETY: in bounds and written by this thread alone, as the caller guarantees.
            unsafe { self.data.add(base + c * step).write(value(c)) };
        }
    }
}

/// The checks on values and the writes of [`append`] and [`append_scaled`], after their
/// other checks (shapes, slots in range and distinct, scales). Tokens are split over the
/// rayon pool when there are enough values; each element is computed the same way on any
/// thread, so the cache's bits do not depend on the thread count.
fn write<S: Element, T: KvElement>(
    k: &Tensor<'_, S>,
    v: &Tensor<'_, S>,
    k_cache: &mut TensorMut<'_, T>,
    v_cache: &mut TensorMut<'_, T>,
    slots: &[usize],
    [k_scaling, v_scaling]: [Scaling<'_, '_>; 2],
    rope: Option<(&Rope<'_>, &[u32])>,
) -> Result<(), Error> {
    let [batch, seq, heads, d_k] = k.dims();
    let d_v = v.dims()[3];
    if let Some((rope, positions)) = rope {
        rope.check(d_k, batch * seq, positions)?;
    }
    if T::QUANTIZED {
        for (operand, x) in [(Operand::Key, k), (Operand::Value, v)] {
            if let Some(token) = first_unstorable(x) {
                return Err(Error::InvalidValue {
                    operand,
                    index: token,
                    reason: "NaN, ±∞ or a magnitude above 2^120 cannot be stored in an i8 cache",
                });
            }
        }
    }
    let (k_out, v_out) = (Shared::new(k_cache), Shared::new(v_cache));
    let tokens = batch * seq;
    let write_tokens = |range: std::ops::Range<usize>| {
        let mut rotation = rope.map(|(r, _)| Rotation::new(r.rotary_dim()));
        let mut row = vec![0.0f32; d_k.max(d_v)];
        for token in range {
            let (b, s) = (token / seq, token % seq);
            if let (Some((rope, positions)), Some(rot)) = (rope, rotation.as_mut()) {
                rope.rotation(positions[token], rot);
            }
            for h in 0..heads {
                let k_row = &mut row[..d_k];
                read_row(k, [b, s, h], k_row);
                if let (Some((rope, _)), Some(rot)) = (rope, rotation.as_ref()) {
                    rope.rotate_row(rot, k_row);
                }
                // SAFETY: `check` proved each slot below the caches' (and scales') dim 0 · dim
                // 1 and no slot twice, and `h < H_kv`, the channels `< d`, their dims 2 and 3;
                // each token is written by one range, so no element by two threads.
                unsafe { write_row(&k_out, slots[token], h, k_row, &k_scaling) };
                let v_row = &mut row[..d_v];
                read_row(v, [b, s, h], v_row);
                // SAFETY: as above.
                unsafe { write_row(&v_out, slots[token], h, v_row, &v_scaling) };
            }
        }
    };
    let threads = rayon::current_num_threads();
    if threads == 1 || tokens * heads * (d_k + d_v) < PARALLEL_MIN_VALUES {
        write_tokens(0..tokens);
    } else {
        // A few ranges per thread, so that one slow thread does not hold the call.
        let parts = (4 * threads).min(tokens);
        (0..parts)
            .into_par_iter()
            .for_each(|p| write_tokens(p * tokens / parts..(p + 1) * tokens / parts));
    }
    Ok(())
}

/// The checks of [`append`] that do not read the rows' values.
pub(crate) fn check<S, T: KvElement>(
    k: &Tensor<'_, S>,
    v: &Tensor<'_, S>,
    k_cache: &TensorMut<'_, T>,
    v_cache: &TensorMut<'_, T>,
    slots: &[usize],
    scale_dims: Option<([usize; 4], [usize; 4])>,
) -> Result<(), Error> {
    let mismatch = |operand, dim, expected, got| {
        (expected != got).then_some(Error::ShapeMismatch {
            operand,
            dim,
            expected,
            got,
        })
    };
    let [batch, seq, heads, d_k] = k.dims();
    let vd = v.dims();
    let (kc, vc) = (k_cache.dims(), v_cache.dims());
    let dims = [Dim::Batch, Dim::Seq, Dim::Heads, Dim::HeadSize];
    let mut errors = vec![
        mismatch(Operand::Value, Dim::Batch, batch, vd[0]),
        mismatch(Operand::Value, Dim::Seq, seq, vd[1]),
        mismatch(Operand::Value, Dim::Heads, heads, vd[2]),
        mismatch(Operand::Key, Dim::Heads, heads, kc[2]),
        mismatch(Operand::Key, Dim::HeadSize, d_k, kc[3]),
        mismatch(Operand::Value, Dim::Batch, kc[0], vc[0]),
        mismatch(Operand::Value, Dim::Seq, kc[1], vc[1]),
        mismatch(Operand::Value, Dim::Heads, heads, vc[2]),
        mismatch(Operand::Value, Dim::HeadSize, vd[3], vc[3]),
    ];
    match (T::QUANTIZED, scale_dims) {
        (true, None) | (false, Some(_)) => return Err(Error::KvScales { kv_type: T::NAME }),
        (true, Some((ks, vs))) => {
            for (operand, got) in [(Operand::KeyScales, ks), (Operand::ValueScales, vs)] {
                let want = [kc[0], kc[1], heads, 1];
                for ((&dim, &w), &g) in dims.iter().zip(&want).zip(&got) {
                    errors.push(mismatch(operand, dim, w, g));
                }
            }
        }
        (false, None) => {}
    }
    if let Some(e) = errors.into_iter().flatten().next() {
        return Err(e);
    }
    if slots.len() != batch * seq {
        return Err(Error::LengthMismatch {
            operand: Operand::Slots,
            expected: batch * seq,
            got: slots.len(),
        });
    }
    let capacity = kc[0].saturating_mul(kc[1]);
    if let Some(i) = slots.iter().position(|&s| s >= capacity) {
        return Err(Error::InvalidValue {
            operand: Operand::Slots,
            index: i,
            reason: "a slot past the cache",
        });
    }
    let mut order: Vec<(usize, usize)> = slots.iter().copied().zip(0..).collect();
    order.sort_unstable();
    if let Some(w) = order.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::InvalidValue {
            operand: Operand::Slots,
            index: w[0].1.max(w[1].1),
            reason: "a slot written twice in one call",
        });
    }
    Ok(())
}

/// The first token (`b · S + s`) of `x` with a value an `i8` cache cannot hold: NaN, ±∞, or a
/// magnitude above `2¹²⁰` (rotated by RoPE, at most `√2 · 2¹²⁰`, its scale stays below
/// `2¹¹⁴`, inside what [`Options::kv_scales`](crate::Options::kv_scales) accepts, `f32::MAX /
/// 128`).
pub(crate) fn first_unstorable<S: Element>(x: &Tensor<'_, S>) -> Option<usize> {
    let [batch, seq, heads, d] = x.dims();
    let limit = 2f32.powi(120);
    let mut row = vec![0.0f32; d];
    (0..batch * seq).find(|&token| {
        let (b, s) = (token / seq, token % seq);
        (0..heads).any(|h| {
            read_row(x, [b, s, h], &mut row);
            // A NaN fails `≤`; no early exit inside a row, so that the test vectorizes.
            !row.iter().fold(true, |ok, v| ok & (v.abs() <= limit))
        })
    })
}

/// Row `[b, s, h]` of `x` as f32.
fn read_row<S: Element>(x: &Tensor<'_, S>, [b, s, h]: [usize; 3], out: &mut [f32]) {
    let (data, strides) = (x.data(), x.strides());
    let (base, n) = (offset([b, s, h, 0], strides), out.len());
    match strides[3] {
        1 => {
            for (o, v) in out.iter_mut().zip(&data[base..base + n]) {
                *o = v.to_f32();
            }
        }
        step => {
            for (c, o) in out.iter_mut().enumerate() {
                *o = data[base + c * step].to_f32();
            }
        }
    }
}

/// `row` into head `h` of slot `slot` of `cache`, as `T` (`i8`: divided by its scale, the
/// row's own written into its scales, or the given ones).
///
/// # Safety
/// As [`Shared::put_row`] for `(slot, h)` and `row.len()` channels (and for one channel of
/// the scales of [`Scaling::Row`]).
unsafe fn write_row<T: KvElement>(
    cache: &Shared<'_, T>,
    slot: usize,
    h: usize,
    row: &[f32],
    scaling: &Scaling<'_, '_>,
) {
    let n = row.len();
    match scaling {
        Scaling::Row(scales) => {
            let amax = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let scale = amax / 127.0;
            // SAFETY (both blocks): the caller's contract.
            if scale > 0.0 {
                unsafe { cache.put_row(slot, h, n, |c| store_kv::<T>(row[c] / scale)) };
            } else {
                unsafe { cache.put_row(slot, h, n, |_| store_kv::<T>(0.0)) };
            }
            unsafe { scales.put_row(slot, h, 1, |_| scale) };
        }
        Scaling::Given(scales) => {
            let (e0, e1) = (slot / cache.rows, slot % cache.rows);
            let scaled = |c: usize| {
                let scale = scales.at([e0, e1, h, c]);
                // x / ±0 would be ±∞ or NaN: a scale of 0 holds only 0.
                store_kv::<T>(if scale == 0.0 { 0.0 } else { row[c] / scale })
            };
            // SAFETY: the caller's contract.
            unsafe { cache.put_row(slot, h, n, scaled) };
        }
        // SAFETY: the caller's contract.
        Scaling::Plain => unsafe { cache.put_row(slot, h, n, |c| store_kv::<T>(row[c])) },
    }
}
