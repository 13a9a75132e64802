//! The definitions of what goes into a cache: [`rope`] ([`Rope::apply`] in f64) and [`append`]
//! ([`crate::append`]: the rotated rows rounded to the cache's type, `i8` rows quantized).

use crate::append::{check, first_unstorable, AppendScales};
use crate::element::{store_kv, Element, KvElement};
use crate::error::{Error, Operand};
use crate::rope::{rotate, Rope};
use crate::tensor::{Tensor, TensorMut};

/// [`Rope::apply`]'s definition in f64: `x` rotated (angles, cosines, sines and the rotation in
/// f64; a table's values read as they are), as a dense `[batch, seq, heads, head_dim]` array.
/// The same checks and errors as [`Rope::apply`].
///
/// # Errors
/// As [`Rope::apply`].
pub fn rope<T: Element>(
    rope: &Rope<'_>,
    x: &Tensor<'_, T>,
    positions: &[u32],
) -> Result<Vec<f64>, Error> {
    let [batch, seq, heads, d] = x.dims();
    rope.check(d, batch * seq, positions)?;
    let mut out = Vec::with_capacity(batch * seq * heads * d);
    for b in 0..batch {
        for s in 0..seq {
            let p = positions[b * seq + s];
            for h in 0..heads {
                let mut row: Vec<f64> = (0..d)
                    .map(|c| {
                        x.get([b, s, h, c])
                            .map_or(f64::NAN, |v| f64::from(v.to_f32()))
                    })
                    .collect();
                for i in 0..rope.rotary_dim() / 2 {
                    let (ja, jb) = rope.pair(i);
                    let (c, sn) = rope.angle(p, i);
                    (row[ja], row[jb]) = rotate(row[ja], row[jb], c, sn);
                }
                out.extend(row);
            }
        }
    }
    Ok(out)
}

/// [`crate::append`]'s definition, with its arguments, checks and errors (everything checked
/// before anything is written). For token `(b, s)` and kv head `h`, the row `y` that goes into
/// slot `slots[b · S + s]` is, as f32 values:
/// * K: [`rope`] of the row (f64) at the token's position, rounded to f32 (without a rope, the
///   row itself); V: the row itself (every element type converts to f32 exactly);
///
/// and it is stored as:
/// * f32, f16, bf16 caches: each `y_c` rounded to the cache's type (ties to even). With a
///   rope, a value is thus rounded twice, f64 → f32 → type, as [`Rope::apply`] documents (the
///   rows a kernel takes are f32); the fast call stores the same bits.
/// * `i8` caches: `scale = max_c |y_c| / 127` rounded to f32 (0 for a row of zeros, or one
///   whose quotient underflows), written to the scales; `x_c = round(y_c / scale)` with the
///   quotient exact (ties to even; 0 where the scale is 0). The fast call rounds the
///   quotient to f32 first, so its `x_c` may differ by 1 where `y_c / scale` is within
///   `127 · 2⁻²⁴` of a half-integer: both dequantize to within `scale · (1/2 + 127 · 2⁻²⁴)`
///   of `y_c`, the oracle's to within `scale / 2`. Scales are the same bits.
///
/// # Errors
/// As [`crate::append`].
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
    let [_, _, heads, d_k] = k.dims();
    let d_v = v.dims()[3];
    let scale_dims = scales.as_ref().map(|(a, b)| (a.dims(), b.dims()));
    check(k, v, k_cache, v_cache, slots, scale_dims)?;
    let k_rows = match rope {
        Some((r, positions)) => self::rope(r, k, positions)?,
        None => rows(k),
    };
    let v_rows = rows(v);
    if T::QUANTIZED {
        // The rows as given (before RoPE), checked as the fast call checks them.
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
    for (token, &slot) in slots.iter().enumerate() {
        for h in 0..heads {
            let at = |d: usize| (token * heads + h) * d;
            // f64 → f32: the rotated values rounded once, the given ones exact.
            let k_row: Vec<f32> = k_rows[at(d_k)..][..d_k].iter().map(|&x| x as f32).collect();
            let v_row: Vec<f32> = v_rows[at(d_v)..][..d_v].iter().map(|&x| x as f32).collect();
            store(
                k_cache,
                slot,
                h,
                &k_row,
                scales.as_mut().map(|(ks, _)| &mut **ks),
            );
            store(
                v_cache,
                slot,
                h,
                &v_row,
                scales.as_mut().map(|(_, vs)| &mut **vs),
            );
        }
    }
    Ok(())
}

/// The rows of `x` (`[B, S, H, d]`) as f64, densely `[b][s][h][c]`.
fn rows<S: Element>(x: &Tensor<'_, S>) -> Vec<f64> {
    let [batch, seq, heads, d] = x.dims();
    let mut out = Vec::with_capacity(batch * seq * heads * d);
    for b in 0..batch {
        for s in 0..seq {
            for h in 0..heads {
                out.extend((0..d).map(|c| {
                    x.get([b, s, h, c])
                        .map_or(f64::NAN, |v| f64::from(v.to_f32()))
                }));
            }
        }
    }
    out
}

/// Row `y` into head `h` of slot `slot` of `cache` as [`append`] defines it (with `scales`:
/// quantized, its scale written there).
fn store<T: KvElement>(
    cache: &mut TensorMut<'_, T>,
    slot: usize,
    h: usize,
    y: &[f32],
    scales: Option<&mut TensorMut<'_, f32>>,
) {
    let rows = cache.dims()[1];
    let (e0, e1) = (slot / rows, slot % rows);
    let mut put = |c: usize, x: f32| {
        *cache.get_mut([e0, e1, h, c]).expect("a checked slot") = store_kv::<T>(x);
    };
    match scales {
        None => y.iter().enumerate().for_each(|(c, &x)| put(c, x)),
        Some(scales) => {
            let amax = y.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let scale = amax / 127.0;
            for (c, &x) in y.iter().enumerate() {
                let q = match scale > 0.0 {
                    // An integer in −127..=127 (|y| ≤ amax ≲ 127.00001 · scale): stored as is.
                    true => (f64::from(x) / f64::from(scale))
                        .round_ties_even()
                        .clamp(-127.0, 127.0),
                    false => 0.0,
                };
                put(c, q as f32);
            }
            *scales.get_mut([e0, e1, h, 0]).expect("checked scales") = scale;
        }
    }
}
