//! `sdpa_options`: reading and validating it ([`read_options`], its arrays and tensors
//! borrowed from the caller), the Rust options built from it, and the copies a plan keeps of
//! everything the options borrow ([`OwnedOptions`]).

use std::ptr;

use sdpa::{Operand, Options, Tensor};

use crate::abi::{
    SdpaOptions, SdpaStatus, SdpaTensor, OPTIONS_V1_SIZE, OPTIONS_V2_SIZE, OPTIONS_V3_SIZE,
};
use crate::status::Failure;
use crate::validate::{
    alignment, compact, copy_mask, input, input_array, read_versioned, Copied, MaskCopy, Span,
};

/// The options of a call, validated, their arrays and tensors borrowed from the caller.
pub(crate) struct OptionInputs<'a> {
    /// The struct (its pointer fields are read into the fields below).
    raw: SdpaOptions,
    kv_lens: Option<&'a [usize]>,
    bias: Option<Tensor<'a, f32>>,
    mask: Option<MaskCopy>,
    slopes: Option<&'a [f32]>,
    sinks: Option<&'a [f32]>,
    pub(crate) kv_scales: Option<Scales<'a>>,
}

/// The scales of `i8` K and V.
pub(crate) type Scales<'a> = (Tensor<'a, f32>, Tensor<'a, f32>);

/// Reads `opts` (NULL: plain attention); the spans of its buffers join `spans`.
///
/// # Safety
/// `opts`, if not NULL, points to a struct whose `size` is set and whose pointers are valid as
/// the header documents, for `'a`.
pub(crate) unsafe fn read_options<'a>(
    opts: *const SdpaOptions,
    spans: &mut Vec<Span>,
) -> Result<OptionInputs<'a>, Failure> {
    let opts = if opts.is_null() {
        // SAFETY: all-zero bytes are a valid `SdpaOptions` (plain attention).
        unsafe { std::mem::zeroed() }
    } else {
        let versions = [OPTIONS_V1_SIZE, OPTIONS_V2_SIZE, OPTIONS_V3_SIZE];
        // SAFETY: the caller's contract.
        unsafe { read_versioned(opts, &versions, "options") }?.0
    };
    // SAFETY (all blocks below): the caller's contract, forwarded.
    let kv_lens = unsafe { input_array(opts.kv_lens, opts.kv_lens_len, "kv_lens", spans) }?;
    let bias = if opts.bias.data.is_null() {
        None
    } else {
        let (b, s) = unsafe { input(&opts.bias, Operand::Bias) }?;
        spans.push(s);
        Some(b)
    };
    let mask = if opts.mask.data.is_null() {
        None
    } else {
        Some(unsafe { copy_mask(&opts.mask, spans) }?)
    };
    let slopes = unsafe {
        input_array(
            opts.alibi_slopes,
            opts.alibi_slopes_len,
            "alibi slopes",
            spans,
        )
    }?;
    let sinks = unsafe { input_array(opts.sinks, opts.sinks_len, "sinks", spans) }?;
    let kv_scales = unsafe { kv_scales(&opts.k_scales, &opts.v_scales, "options", spans) }?;
    Ok(OptionInputs {
        raw: opts,
        kv_lens,
        bias,
        mask,
        slopes,
        sinks,
        kv_scales,
    })
}

/// The scales of `i8` K/V: both tensors or neither (`data` NULL), `owner` naming the struct in
/// messages; their spans join `spans`.
///
/// # Safety
/// Each tensor's `data`, unless NULL, is valid for the elements its view reaches, for `'a`.
pub(crate) unsafe fn kv_scales<'a>(
    k: &SdpaTensor,
    v: &SdpaTensor,
    owner: &str,
    spans: &mut Vec<Span>,
) -> Result<Option<Scales<'a>>, Failure> {
    match (k.data.is_null(), v.data.is_null()) {
        (true, true) => Ok(None),
        (false, false) => {
            // SAFETY (both): forwarded.
            let (k, ks) = unsafe { input(k, Operand::KeyScales) }?;
            let (v, vs) = unsafe { input(v, Operand::ValueScales) }?;
            spans.extend([ks, vs]);
            Ok(Some((k, v)))
        }
        (k_null, _) => {
            let missing = if k_null { "k_scales" } else { "v_scales" };
            Err(Failure::new(
                SdpaStatus::NullPointer,
                format!("{owner}.{missing}: pointer is NULL (the other scales are given)"),
            ))
        }
    }
}

impl OptionInputs<'_> {
    /// The Rust options.
    pub(crate) fn options(&self) -> Result<Options<'_>, Failure> {
        let mask = self.mask.as_ref().map(Copied::tensor).transpose()?;
        let parts = Parts {
            kv_lens: self.kv_lens,
            bias: self.bias,
            mask,
            slopes: self.slopes,
            sinks: self.sinks,
            kv_scales: self.kv_scales,
        };
        build(&self.raw, parts)
    }

    /// Copies of everything the options borrow (a plan's; `kv_scales` are not copied: a plan
    /// refuses them).
    pub(crate) fn into_owned(self) -> Result<OwnedOptions, Failure> {
        // The caller's pointers, which the copies replace, are not kept.
        let mut raw = self.raw;
        (raw.kv_lens, raw.alibi_slopes, raw.sinks) = (ptr::null(), ptr::null(), ptr::null());
        for t in [
            &mut raw.bias,
            &mut raw.mask,
            &mut raw.k_scales,
            &mut raw.v_scales,
        ] {
            t.data = ptr::null();
        }
        Ok(OwnedOptions {
            raw,
            kv_lens: self.kv_lens.map(copy_array).transpose()?,
            bias: self.bias.map(|b| compact(b, |x| x)).transpose()?,
            mask: self.mask,
            slopes: self.slopes.map(copy_array).transpose()?,
            sinks: self.sinks.map(copy_array).transpose()?,
        })
    }
}

/// A copy of an array (an allocation failure is `OutOfMemory`, not an abort).
pub(crate) fn copy_array<T: Copy>(x: &[T]) -> Result<Vec<T>, Failure> {
    let mut v = Vec::new();
    v.try_reserve_exact(x.len()).map_err(|_| {
        Failure::from(sdpa::Error::OutOfMemory {
            bytes: std::mem::size_of_val(x),
        })
    })?;
    v.extend_from_slice(x);
    Ok(v)
}

/// Options whose arrays and tensors are the library's own copies (a plan's).
pub(crate) struct OwnedOptions {
    /// The caller's struct for its scalar fields, its pointers NULL.
    raw: SdpaOptions,
    kv_lens: Option<Vec<usize>>,
    bias: Option<Copied<f32>>,
    mask: Option<MaskCopy>,
    slopes: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
}

impl OwnedOptions {
    /// The Rust options, borrowing the copies.
    pub(crate) fn options(&self) -> Result<Options<'_>, Failure> {
        let parts = Parts {
            kv_lens: self.kv_lens.as_deref(),
            bias: self.bias.as_ref().map(Copied::tensor).transpose()?,
            mask: self.mask.as_ref().map(Copied::tensor).transpose()?,
            slopes: self.slopes.as_deref(),
            sinks: self.sinks.as_deref(),
            kv_scales: None,
        };
        build(&self.raw, parts)
    }
}

/// What the Rust options borrow.
struct Parts<'a> {
    kv_lens: Option<&'a [usize]>,
    bias: Option<Tensor<'a, f32>>,
    mask: Option<Tensor<'a, bool>>,
    slopes: Option<&'a [f32]>,
    sinks: Option<&'a [f32]>,
    kv_scales: Option<Scales<'a>>,
}

/// The Rust options of the scalar fields of `o` and the borrowed `parts`.
fn build<'a>(o: &SdpaOptions, parts: Parts<'a>) -> Result<Options<'a>, Failure> {
    let mut opts = Options::new();
    if o.has_scale != 0 {
        opts = opts.scale(o.scale);
    }
    if let Some(a) = alignment(o.causal, "options.causal")? {
        opts = opts.causal(a);
    }
    if let Some(a) = alignment(o.window, "options.window")? {
        opts = opts.sliding_window(o.window_left, o.window_right, a);
    }
    if let Some(lens) = parts.kv_lens {
        opts = match o.kv_lens_before {
            0 => opts.kv_lens(lens),
            _ => opts.cache_seqlens(lens),
        };
    }
    if let Some(bias) = parts.bias {
        opts = opts.bias(bias);
    }
    if let Some(mask) = parts.mask {
        opts = opts.mask(mask);
    }
    match (alignment(o.alibi, "options.alibi")?, parts.slopes) {
        (Some(a), Some(slopes)) => opts = opts.alibi(slopes, a),
        (Some(_), None) => {
            return Err(Failure::new(
                SdpaStatus::NullPointer,
                "alibi slopes: pointer is NULL",
            ))
        }
        (None, _) => {}
    }
    if o.has_softcap != 0 {
        opts = opts.softcap(o.softcap);
    }
    if let Some(sinks) = parts.sinks {
        opts = opts.sinks(sinks);
    }
    if o.bf16_products != 0 {
        opts = opts.bf16_products();
    }
    if let Some((k, v)) = parts.kv_scales {
        opts = opts.kv_scales(k, v);
    }
    Ok(opts)
}
