//! The serving step's other half: RoPE applied in place ([`rope_entry`]) and a step's new K/V
//! rows written into a cache ([`append_entry`]), through the Rust `Rope` and `append`.

use sdpa::half::{bf16, f16};
use sdpa::{append, append_scaled, Element, KvElement, Operand, Rope, RopeStyle, Tensor};

use crate::abi::{
    SdpaAppendArgs, SdpaRope, SdpaStatus, SdpaTensor, SdpaTensorMut, APPEND_V1_SIZE,
    SDPA_ROPE_HALVES, SDPA_ROPE_INTERLEAVED,
};
use crate::status::Failure;
use crate::validate::{dtype, input, input_array, output, read_versioned, required_array};
use crate::validate::{Dtype, Span};

/// A validated rotary embedding and its positions.
struct RopeAt<'a> {
    rope: Rope<'a>,
    positions: &'a [u32],
}

/// Reads `rope` (its tables and positions join `spans`).
///
/// # Safety
/// `rope` points to a struct whose `size` is set, with arrays valid for their lengths.
unsafe fn read_rope<'a>(
    rope: *const SdpaRope,
    spans: &mut Vec<Span>,
) -> Result<RopeAt<'a>, Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let r = unsafe { read_versioned(rope, &[], "rope") }?.0;
    let style = match r.style {
        SDPA_ROPE_HALVES => RopeStyle::Halves,
        SDPA_ROPE_INTERLEAVED => RopeStyle::Interleaved,
        other => {
            return Err(Failure::new(
                SdpaStatus::InvalidArgument,
                format!("rope.style: {other} is not an SDPA_ROPE_* value"),
            ))
        }
    };
    let positions =
        unsafe { required_array(r.positions, r.positions_len, "rope.positions", spans) }?;
    let cos = unsafe { input_array(r.cos, r.table_len, "rope.cos", spans) }?;
    let sin = unsafe { input_array(r.sin, r.table_len, "rope.sin", spans) }?;
    let rope = match (cos, sin) {
        (None, None) => Rope::new(style, r.rotary_dim, r.theta),
        (Some(cos), Some(sin)) => Rope::with_tables(style, r.rotary_dim, cos, sin),
        _ => {
            return Err(Failure::new(
                SdpaStatus::NullPointer,
                "rope.cos and rope.sin: give both tables or neither",
            ))
        }
    };
    Ok(RopeAt { rope, positions })
}

/// `sdpa_rope_apply`: `x` (`dtype`) rotated in place.
///
/// # Safety
/// `x` and `rope` point to valid structs; `x.data` is valid for the elements its view
/// reaches, exclusively.
pub(crate) unsafe fn rope_entry(
    dtype_value: u32,
    x: *const SdpaTensorMut,
    rope: *const SdpaRope,
) -> Result<(), Failure> {
    if x.is_null() {
        return Err(Failure::new(SdpaStatus::NullPointer, "x: pointer is NULL"));
    }
    // SAFETY (all blocks): the caller's contract, forwarded.
    let x = unsafe { *x };
    let mut spans = Vec::new();
    let r = unsafe { read_rope(rope, &mut spans) }?;
    /// # Safety
    /// As [`rope_entry`], with `T` the declared type.
    unsafe fn typed<T: Element>(
        x: &SdpaTensorMut,
        r: &RopeAt<'_>,
        reads: &[Span],
    ) -> Result<(), Failure> {
        // SAFETY: forwarded.
        let (mut t, _) = unsafe { output::<T>(x, reads) }?;
        Ok(r.rope.apply(&mut t, r.positions)?)
    }
    match dtype(dtype_value, "dtype")? {
        Dtype::F32 => unsafe { typed::<f32>(&x, &r, &spans) },
        Dtype::F16 => unsafe { typed::<f16>(&x, &r, &spans) },
        Dtype::Bf16 => unsafe { typed::<bf16>(&x, &r, &spans) },
        Dtype::I8 => Err(Failure::new(
            SdpaStatus::UnsupportedType,
            "dtype: RoPE rotates f32, f16 or bf16 rows (SDPA_DTYPE_I8 is a cache type only)",
        )),
    }
}

/// `sdpa_append`.
///
/// # Safety
/// `args` (and `rope` unless NULL) point to structs whose `size` is set; every pointer is
/// valid as its dims or length say; the caches and scales are not accessed by anyone else.
pub(crate) unsafe fn append_entry(
    args: *const SdpaAppendArgs,
    rope: *const SdpaRope,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let a = unsafe { read_versioned(args, &[APPEND_V1_SIZE], "append args") }?.0;
    let mut spans = Vec::new();
    let rope = match rope.is_null() {
        true => None,
        false => Some(unsafe { read_rope(rope, &mut spans) }?),
    };
    let slots = unsafe { required_array(a.slots, a.slots_len, "slots", &mut spans) }?;
    let cache = dtype(a.cache_dtype, "cache_dtype")?;
    let operands = (&a, slots, rope.as_ref());
    match dtype(a.rows_dtype, "rows_dtype")? {
        Dtype::F32 => unsafe { with_rows::<f32>(operands, cache, spans) },
        Dtype::F16 => unsafe { with_rows::<f16>(operands, cache, spans) },
        Dtype::Bf16 => unsafe { with_rows::<bf16>(operands, cache, spans) },
        Dtype::I8 => Err(Failure::new(
            SdpaStatus::UnsupportedType,
            "rows_dtype: new rows are f32, f16 or bf16 (SDPA_DTYPE_I8 is a cache type only)",
        )),
    }
}

/// The arguments, slots and RoPE of an append.
type Operands<'a, 'r> = (&'a SdpaAppendArgs, &'a [usize], Option<&'a RopeAt<'r>>);

/// [`append_entry`] with rows of `S`.
///
/// # Safety
/// As [`append_entry`], with `S` the declared row type.
unsafe fn with_rows<S: Element>(
    (a, slots, rope): Operands<'_, '_>,
    cache: Dtype,
    mut spans: Vec<Span>,
) -> Result<(), Failure> {
    // SAFETY (all blocks): forwarded.
    let (k, ks) = unsafe { input::<S>(&a.k, Operand::Key) }?;
    let (v, vs) = unsafe { input::<S>(&a.v, Operand::Value) }?;
    spans.extend([ks, vs]);
    let rows = (k, v);
    match cache {
        Dtype::F32 => unsafe { into_cache::<S, f32>(a, rows, slots, rope, spans) },
        Dtype::F16 => unsafe { into_cache::<S, f16>(a, rows, slots, rope, spans) },
        Dtype::Bf16 => unsafe { into_cache::<S, bf16>(a, rows, slots, rope, spans) },
        Dtype::I8 if a.scales_given != 0 => unsafe { into_scaled(a, rows, slots, rope, spans) },
        Dtype::I8 => unsafe { into_cache::<S, i8>(a, rows, slots, rope, spans) },
    }
}

/// [`append_entry`] with rows of `S` into `i8` caches with the caller's scales (read).
///
/// # Safety
/// As [`append_entry`], with the declared types.
unsafe fn into_scaled<S: Element>(
    a: &SdpaAppendArgs,
    (k, v): (Tensor<'_, S>, Tensor<'_, S>),
    slots: &[usize],
    rope: Option<&RopeAt<'_>>,
    mut spans: Vec<Span>,
) -> Result<(), Failure> {
    let read_only = |t: &SdpaTensorMut| SdpaTensor {
        data: t.data.cast_const(),
        dims: t.dims,
        strides: t.strides,
    };
    // SAFETY (all blocks): forwarded; the scales are only read.
    let (ks, span) = unsafe { input::<f32>(&read_only(&a.k_scales), Operand::KeyScales) }?;
    spans.push(span);
    let (vs, span) = unsafe { input::<f32>(&read_only(&a.v_scales), Operand::ValueScales) }?;
    spans.push(span);
    let (mut k_cache, span) = unsafe { output::<i8>(&a.k_cache, &spans) }?;
    spans.push(span);
    let (mut v_cache, _) = unsafe { output::<i8>(&a.v_cache, &spans) }?;
    let rope = rope.map(|r| (&r.rope, r.positions));
    append_scaled(&k, &v, &mut k_cache, &mut v_cache, slots, &ks, &vs, rope)?;
    Ok(())
}

/// [`append_entry`] with rows of `S` into caches of `T`: the caches and scales are checked
/// against every span read or written before them.
///
/// # Safety
/// As [`append_entry`], with the declared types.
unsafe fn into_cache<S: Element, T: KvElement>(
    a: &SdpaAppendArgs,
    (k, v): (Tensor<'_, S>, Tensor<'_, S>),
    slots: &[usize],
    rope: Option<&RopeAt<'_>>,
    mut spans: Vec<Span>,
) -> Result<(), Failure> {
    // SAFETY (all blocks): forwarded.
    let (mut k_cache, span) = unsafe { output::<T>(&a.k_cache, &spans) }?;
    spans.push(span);
    let (mut v_cache, span) = unsafe { output::<T>(&a.v_cache, &spans) }?;
    spans.push(span);
    if a.scales_given != 0 {
        // Given scales are for `i8` caches only (handled before).
        return Err(sdpa::Error::KvScales { kv_type: T::NAME }.into());
    }
    let mut scales = if a.k_scales.data.is_null() && a.v_scales.data.is_null() {
        None
    } else {
        let (ks, span) = unsafe { output::<f32>(&a.k_scales, &spans) }?;
        spans.push(span);
        let (vs, _) = unsafe { output::<f32>(&a.v_scales, &spans) }?;
        Some((ks, vs))
    };
    let scales = scales.as_mut().map(|(k, v)| (k, v));
    let rope = rope.map(|r| (&r.rope, r.positions));
    append(&k, &v, &mut k_cache, &mut v_cache, slots, scales, rope)?;
    Ok(())
}
