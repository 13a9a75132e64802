//! The C entry points called from Rust: every option of `sdpa_options` against the same call
//! through the Rust API (bitwise: one kernel, deterministic), versioned struct sizes, and
//! error statuses whose messages are the Rust `Display` texts.

use std::ffi::CStr;
use std::ptr;

use sdpa::{Alignment, Element, KvElement, Options, Tensor, TensorMut};
use sdpa_capi::*;

const B: usize = 2;
const NQ: usize = 6;
const NKV: usize = 11;
const H: usize = 4;
const HKV: usize = 2;
const D: usize = 16;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.37 * seed as f32).sin())
        .collect()
}

fn message() -> String {
    // SAFETY: the library returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(sdpa_last_error_message()) }
        .to_str()
        .expect("utf-8")
        .to_string()
}

fn contiguous(dims: [usize; 4]) -> [usize; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

fn tensor<T>(data: &[T], dims: [usize; 4]) -> SdpaTensor {
    SdpaTensor {
        data: data.as_ptr().cast(),
        dims,
        strides: contiguous(dims),
    }
}

fn args(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], lse: &mut [f32]) -> SdpaAttentionArgs {
    typed_args(q, k, v, out, lse)
}

/// The arguments of one call on contiguous `[B, NQ, H, D]` / `[B, NKV, HKV, D]` buffers of any
/// element types, each operand group's `dtype` set from its type.
fn typed_args<Q: Element, KV: KvElement, O: Element>(
    q: &[Q],
    k: &[KV],
    v: &[KV],
    out: &mut [O],
    lse: &mut [f32],
) -> SdpaAttentionArgs {
    SdpaAttentionArgs {
        size: std::mem::size_of::<SdpaAttentionArgs>(),
        q_dtype: dtype_of::<Q>(),
        q: tensor(q, [B, NQ, H, D]),
        k: tensor(k, [B, NKV, HKV, D]),
        v: tensor(v, [B, NKV, HKV, D]),
        out: SdpaTensorMut {
            data: out.as_mut_ptr().cast(),
            dims: [B, NQ, H, D],
            strides: contiguous([B, NQ, H, D]),
        },
        lse: lse.as_mut_ptr(),
        lse_len: lse.len(),
        kv_dtype: dtype_of::<KV>(),
        out_dtype: dtype_of::<O>(),
    }
}

/// The same call through the Rust API on the buffers of [`typed_args`]: output and LSE.
fn rust_call<Q: Element, KV: KvElement, O: Element>(
    q: &[Q],
    k: &[KV],
    v: &[KV],
    opts: &Options,
) -> (Vec<O>, Vec<f32>) {
    let mut out = vec![O::from_f32(0.0); B * NQ * H * D];
    let mut lse = vec![0f32; B * H * NQ];
    sdpa::attention_lse(
        &Tensor::bshd(q, [B, NQ, H, D]).unwrap(),
        &Tensor::bshd(k, [B, NKV, HKV, D]).unwrap(),
        &Tensor::bshd(v, [B, NKV, HKV, D]).unwrap(),
        &mut TensorMut::bshd(&mut out, [B, NQ, H, D]).unwrap(),
        &mut lse,
        opts,
    )
    .unwrap();
    (out, lse)
}

fn no_options() -> SdpaOptions {
    // SAFETY: all-zero is a valid SdpaOptions (plain attention), as documented.
    let mut o: SdpaOptions = unsafe { std::mem::zeroed() };
    o.size = std::mem::size_of::<SdpaOptions>();
    o
}

#[test]
fn every_option_matches_the_rust_api_bitwise() {
    let (q, k, v) = (
        data(B * NQ * H * D, 1),
        data(B * NKV * HKV * D, 2),
        data(B * NKV * HKV * D, 3),
    );
    let kv_lens = [NKV, 7usize];
    // Bias broadcast over batch and heads: [1, n_q, 1, n_kv].
    let bias: Vec<f32> = (0..NQ * NKV).map(|i| (i % 5) as f32 * 0.1).collect();
    // Byte mask per batch, broadcast over heads (stride 0); 2 counts as visible.
    let mask_bytes: Vec<u8> = (0..B * NQ * NKV).map(|i| [1u8, 2, 1, 0][i % 4]).collect();
    let mask_bool: Vec<bool> = mask_bytes.iter().map(|&m| m != 0).collect();
    let slopes = sdpa::alibi_slopes(H).unwrap();
    let sinks = [0.5f32, -1.0, f32::NEG_INFINITY, 2.0];

    let mut o = no_options();
    o.has_scale = 1;
    o.scale = 0.3;
    o.causal = SDPA_ALIGN_BOTTOM_RIGHT;
    o.window = SDPA_ALIGN_BOTTOM_RIGHT;
    o.window_left = 5;
    o.window_right = 0;
    o.kv_lens = kv_lens.as_ptr();
    o.kv_lens_len = kv_lens.len();
    o.bias = SdpaTensor {
        data: bias.as_ptr().cast(),
        dims: [1, NQ, 1, NKV],
        strides: [0, NKV, 0, 1],
    };
    o.mask = SdpaTensor {
        data: mask_bytes.as_ptr().cast(),
        dims: [B, NQ, H, NKV],
        strides: [NQ * NKV, NKV, 0, 1],
    };
    o.alibi = SDPA_ALIGN_BOTTOM_RIGHT;
    o.alibi_slopes = slopes.as_ptr();
    o.alibi_slopes_len = slopes.len();
    o.has_softcap = 1;
    o.softcap = 30.0;
    o.sinks = sinks.as_ptr();
    o.sinks_len = sinks.len();

    let mut out_c = vec![0f32; B * NQ * H * D];
    let mut lse_c = vec![0f32; B * H * NQ];
    let a = args(&q, &k, &v, &mut out_c, &mut lse_c);
    // SAFETY: every pointer is valid for the dims given.
    let status = unsafe { sdpa_attention(&a, &o) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    assert_eq!(message(), "");

    let opts = Options::new()
        .scale(0.3)
        .causal(Alignment::BottomRight)
        .sliding_window(5, 0, Alignment::BottomRight)
        .kv_lens(&kv_lens)
        .bias(Tensor::new(&bias, [1, NQ, 1, NKV], [0, NKV, 0, 1]).unwrap())
        .mask(Tensor::new(&mask_bool, [B, NQ, H, NKV], [NQ * NKV, NKV, 0, 1]).unwrap())
        .alibi(&slopes, Alignment::BottomRight)
        .softcap(30.0)
        .sinks(&sinks);
    let (out_r, lse_r): (Vec<f32>, _) = rust_call(&q, &k, &v, &opts);
    assert_eq!(out_c, out_r);
    assert_eq!(lse_c, lse_r);

    // The reference through the C API agrees within a loose bound.
    let mut out_ref = vec![0f32; B * NQ * H * D];
    let mut lse_ref = vec![0f32; B * H * NQ];
    let a = args(&q, &k, &v, &mut out_ref, &mut lse_ref);
    // SAFETY: as above.
    assert_eq!(unsafe { sdpa_reference_attention(&a, &o) }, SdpaStatus::Ok);
    for (x, y) in out_c.iter().zip(&out_ref) {
        assert!((x - y).abs() < 1e-4, "{x} vs {y}");
    }
}

#[test]
fn null_options_and_no_lse_are_plain_attention() {
    let (q, k, v) = (
        data(B * NQ * H * D, 4),
        data(B * NKV * HKV * D, 5),
        data(B * NKV * HKV * D, 6),
    );
    let mut out_c = vec![0f32; B * NQ * H * D];
    let mut lse = vec![0f32; B * H * NQ];
    let mut a = args(&q, &k, &v, &mut out_c, &mut lse);
    a.lse = ptr::null_mut();
    a.lse_len = 0;
    // SAFETY: valid pointers; NULL options are allowed.
    assert_eq!(unsafe { sdpa_attention(&a, ptr::null()) }, SdpaStatus::Ok);
    let mut out_r = vec![0f32; B * NQ * H * D];
    sdpa::attention(
        &Tensor::bshd(&q, [B, NQ, H, D]).unwrap(),
        &Tensor::bshd(&k, [B, NKV, HKV, D]).unwrap(),
        &Tensor::bshd(&v, [B, NKV, HKV, D]).unwrap(),
        &mut TensorMut::bshd(&mut out_r, [B, NQ, H, D]).unwrap(),
        &Options::new(),
    )
    .unwrap();
    assert_eq!(out_c, out_r);
}

#[test]
fn bad_inputs_give_statuses_and_the_rust_messages() {
    let (q, k, v) = (
        data(B * NQ * H * D, 7),
        data(B * NKV * HKV * D, 8),
        data(B * NKV * HKV * D, 9),
    );
    let mut out = vec![0f32; B * NQ * H * D];
    let mut lse = vec![0f32; B * H * NQ];
    let good = args(&q, &k, &v, &mut out, &mut lse);
    let o = no_options();
    let call = |a: &SdpaAttentionArgs, o: &SdpaOptions| {
        // SAFETY: every pointer below stays within its buffer or is rejected before use.
        unsafe { sdpa_attention(a, o) }
    };

    // A shape mismatch: same text as the Rust API's error.
    let mut a = good;
    a.v.dims[1] = NKV - 1;
    assert_eq!(call(&a, &o), SdpaStatus::ShapeMismatch);
    let rust = sdpa::attention(
        &Tensor::bshd(&q, [B, NQ, H, D]).unwrap(),
        &Tensor::bshd(&k, [B, NKV, HKV, D]).unwrap(),
        &Tensor::new(&v, [B, NKV - 1, HKV, D], contiguous([B, NKV, HKV, D])).unwrap(),
        &mut TensorMut::bshd(&mut vec![0f32; B * NQ * H * D], [B, NQ, H, D]).unwrap(),
        &Options::new(),
    )
    .unwrap_err();
    assert_eq!(message(), rust.to_string());

    // A view that reaches past... nothing: the C API cannot know buffer lengths, but it checks
    // the arithmetic: dims·strides overflowing usize is an error, not a wild read.
    let mut a = good;
    a.k.strides = [usize::MAX, 1, 1, 1];
    assert_eq!(call(&a, &o), SdpaStatus::LayoutOverflow);
    assert!(message().contains("overflows usize"), "{}", message());

    // Struct sizes.
    let mut a = good;
    a.size -= 1;
    assert_eq!(call(&a, &o), SdpaStatus::InvalidStructSize);
    let mut small = o;
    small.size = 4;
    assert_eq!(call(&good, &small), SdpaStatus::InvalidStructSize);
    // SAFETY: NULL is checked.
    assert_eq!(
        unsafe { sdpa_attention(ptr::null(), &o) },
        SdpaStatus::NullPointer
    );

    // Misaligned data.
    let mut a = good;
    a.q.data = (q.as_ptr() as *const u8).wrapping_add(1).cast();
    a.q.dims[0] = 1; // keep the misaligned view inside the buffer
    assert_eq!(call(&a, &o), SdpaStatus::Misaligned);

    // Enum-like fields out of range; a flag without its array.
    let mut bad = o;
    bad.causal = 7;
    assert_eq!(call(&good, &bad), SdpaStatus::InvalidArgument);
    let mut bad = o;
    bad.alibi = SDPA_ALIGN_TOP_LEFT;
    assert_eq!(call(&good, &bad), SdpaStatus::NullPointer);
    let mut bad = o;
    bad.has_softcap = 1;
    bad.softcap = -1.0;
    assert_eq!(call(&good, &bad), SdpaStatus::InvalidSoftcap);
    assert_eq!(message(), sdpa::Error::InvalidSoftcap(-1.0).to_string());

    // Types: values outside SDPA_DTYPE_*, for each group.
    let mut a = good;
    a.q_dtype = 99;
    assert_eq!(call(&a, &o), SdpaStatus::UnsupportedType);
    assert!(message().contains("q_dtype"), "{}", message());
    let mut a = good;
    a.kv_dtype = 4;
    assert_eq!(call(&a, &o), SdpaStatus::UnsupportedType);
    assert!(message().contains("kv_dtype"), "{}", message());
    let mut a = good;
    a.out_dtype = u32::MAX;
    assert_eq!(call(&a, &o), SdpaStatus::UnsupportedType);
    assert!(message().contains("out_dtype"), "{}", message());

    // The LSE overlapping the output.
    let mut a = good;
    a.lse = a.out.data.cast();
    assert_eq!(call(&a, &o), SdpaStatus::AliasedBuffers);

    // A wrong LSE length is sdpa's LengthMismatch.
    let mut a = good;
    a.lse_len -= 1;
    assert_eq!(call(&a, &o), SdpaStatus::LengthMismatch);

    // Status names.
    // SAFETY: static strings.
    let name = unsafe { CStr::from_ptr(sdpa_status_name(SdpaStatus::AliasedBuffers as i32)) };
    assert_eq!(name.to_str().unwrap(), "SDPA_STATUS_ALIASED_BUFFERS");
    let name = unsafe { CStr::from_ptr(sdpa_status_name(-3)) };
    assert_eq!(name.to_str().unwrap(), "SDPA_STATUS_UNKNOWN");
}

#[test]
fn private_pools_per_calling_thread_give_the_same_bits() {
    let (q, k, v) = (
        data(B * NQ * H * D, 10),
        data(B * NKV * HKV * D, 11),
        data(B * NKV * HKV * D, 12),
    );
    let run = || {
        let mut out = vec![0f32; B * NQ * H * D];
        let mut lse = vec![0f32; B * H * NQ];
        let a = args(&q, &k, &v, &mut out, &mut lse);
        let mut o = no_options();
        o.causal = SDPA_ALIGN_TOP_LEFT;
        // SAFETY: valid pointers.
        assert_eq!(unsafe { sdpa_attention(&a, &o) }, SdpaStatus::Ok);
        (out, lse)
    };
    let want = run();
    for n in [1usize, 3] {
        assert_eq!(sdpa_set_num_threads(n), SdpaStatus::Ok);
        assert_eq!(sdpa_get_num_threads(), n);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|_| s.spawn(run)).collect();
            for h in handles {
                assert_eq!(h.join().unwrap(), want);
            }
        });
    }
    assert_eq!(sdpa_set_num_threads(0), SdpaStatus::Ok);
    assert_eq!(run(), want);
}

/// Values of type `T` (exactly representable in it, so the f32 and typed runs see one input).
fn typed<T: Element>(n: usize, seed: u32) -> Vec<T> {
    data(n, seed).into_iter().map(T::from_f32).collect()
}

fn dtype_of<T: KvElement>() -> u32 {
    match T::NAME {
        "f32" => SDPA_DTYPE_F32,
        "f16" => SDPA_DTYPE_F16,
        "bf16" => SDPA_DTYPE_BF16,
        "i8" => SDPA_DTYPE_I8,
        other => panic!("unknown element type {other}"),
    }
}

/// One typed call through the C API against the same call through the Rust API (bitwise), and
/// the C API's reference within the documented bound (plus the output's rounding).
fn typed_call_matches_rust<Q: Element, KV: Element, O: Element>(seed: u32) {
    let q: Vec<Q> = typed(B * NQ * H * D, seed);
    let k: Vec<KV> = typed(B * NKV * HKV * D, seed + 1);
    let v: Vec<KV> = typed(B * NKV * HKV * D, seed + 2);
    let zero = O::from_f32(0.0);
    let kv_lens = [NKV, 8usize];
    let mut o = no_options();
    o.causal = SDPA_ALIGN_BOTTOM_RIGHT;
    o.kv_lens = kv_lens.as_ptr();
    o.kv_lens_len = kv_lens.len();
    let opts = Options::new()
        .causal(Alignment::BottomRight)
        .kv_lens(&kv_lens);

    let c_call = |reference: bool| {
        let mut out = vec![zero; B * NQ * H * D];
        let mut lse = vec![0f32; B * H * NQ];
        let a = typed_args(&q, &k, &v, &mut out, &mut lse);
        // SAFETY: every pointer is valid for the dims and element types given.
        let status = unsafe {
            if reference {
                sdpa_reference_attention(&a, &o)
            } else {
                sdpa_attention(&a, &o)
            }
        };
        assert_eq!(status, SdpaStatus::Ok, "{}", message());
        (out, lse)
    };
    let (out_c, lse_c) = c_call(false);

    let qt = Tensor::bshd(&q, [B, NQ, H, D]).unwrap();
    let kt = Tensor::bshd(&k, [B, NKV, HKV, D]).unwrap();
    let vt = Tensor::bshd(&v, [B, NKV, HKV, D]).unwrap();
    let mut out_r = vec![zero; B * NQ * H * D];
    let mut lse_r = vec![0f32; B * H * NQ];
    sdpa::attention_lse(
        &qt,
        &kt,
        &vt,
        &mut TensorMut::bshd(&mut out_r, [B, NQ, H, D]).unwrap(),
        &mut lse_r,
        &opts,
    )
    .unwrap();
    let bits = |x: &[O]| x.iter().map(|e| e.to_f32().to_bits()).collect::<Vec<_>>();
    let what = format!("Q {}, KV {}, out {}", Q::NAME, KV::NAME, O::NAME);
    assert_eq!(bits(&out_c), bits(&out_r), "{what}");
    assert_eq!(lse_c, lse_r, "{what}");

    // The reference through the C API, typed the same way, within the bound.
    let (out_ref, lse_ref) = c_call(true);
    let bounds = sdpa::reference::error_bounds(&qt, &kt, &vt, &opts).unwrap();
    for b in 0..B {
        for i in 0..NQ {
            for h in 0..H {
                let row = (b * H + h) * NQ + i;
                let bound = bounds[row].for_output::<O>();
                for d in 0..D {
                    let at = ((b * NQ + i) * H + h) * D + d;
                    let (x, y) = (out_c[at].to_f64(), out_ref[at].to_f64());
                    assert!(
                        (x - y).abs() <= bound.out,
                        "{what}: {x} vs {y} (bound {})",
                        bound.out
                    );
                }
                let (x, y) = (f64::from(lse_c[row]), f64::from(lse_ref[row]));
                assert!((x - y).abs() <= bound.lse, "{what}: lse {x} vs {y}");
            }
        }
    }
}

#[test]
fn typed_calls_match_the_rust_api_bitwise() {
    use sdpa::half::{bf16, f16};
    // llama.cpp's way: an f16 KV cache, f32 queries and output.
    typed_call_matches_rust::<f32, f16, f32>(20);
    typed_call_matches_rust::<bf16, bf16, bf16>(23);
    typed_call_matches_rust::<f16, f16, f16>(26);
    typed_call_matches_rust::<f32, bf16, f16>(29);
    typed_call_matches_rust::<bf16, f32, f32>(32);
}

#[test]
fn first_version_args_give_every_operand_the_one_dtype() {
    use sdpa::half::f16;
    let q: Vec<f16> = typed(B * NQ * H * D, 40);
    let k: Vec<f16> = typed(B * NKV * HKV * D, 41);
    let v: Vec<f16> = typed(B * NKV * HKV * D, 42);
    let mut out_c = vec![f16::ZERO; B * NQ * H * D];
    let mut lse = vec![0f32; B * H * NQ];
    let mut a = typed_args(&q, &k, &v, &mut out_c, &mut lse);
    // A caller compiled against the first struct: `dtype` (now q_dtype) is everyone's type, and
    // the bytes past its size (kv_dtype, out_dtype: garbage here) are not read.
    a.size = std::mem::offset_of!(SdpaAttentionArgs, kv_dtype);
    a.q_dtype = SDPA_DTYPE_F16;
    a.kv_dtype = 77;
    a.out_dtype = 77;
    // SAFETY: valid pointers for f16 elements.
    assert_eq!(
        unsafe { sdpa_attention(&a, ptr::null()) },
        SdpaStatus::Ok,
        "{}",
        message()
    );
    let mut out_r = vec![f16::ZERO; B * NQ * H * D];
    sdpa::attention(
        &Tensor::bshd(&q, [B, NQ, H, D]).unwrap(),
        &Tensor::bshd(&k, [B, NKV, HKV, D]).unwrap(),
        &Tensor::bshd(&v, [B, NKV, HKV, D]).unwrap(),
        &mut TensorMut::bshd(&mut out_r, [B, NQ, H, D]).unwrap(),
        &Options::new(),
    )
    .unwrap();
    assert!(out_c
        .iter()
        .zip(&out_r)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    // Smaller than the first version: rejected.
    a.size -= 8;
    // SAFETY: as above.
    assert_eq!(
        unsafe { sdpa_attention(&a, ptr::null()) },
        SdpaStatus::InvalidStructSize
    );
}

#[test]
fn alignment_follows_each_operands_element_size() {
    use sdpa::half::f16;
    let (q, v) = (data(B * NQ * H * D, 50), data(B * NKV * HKV * D, 52));
    // K in f16 starting 2 bytes into its buffer: aligned for f16 (and it would not be for f32).
    let k_buf: Vec<f16> = typed(B * NKV * HKV * D + 1, 51);
    let k16: Vec<f16> = k_buf[1..].to_vec();
    let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    let mut out = vec![0f32; B * NQ * H * D];
    let mut lse = vec![0f32; B * H * NQ];
    let mut a = args(&q, &[], &[], &mut out, &mut lse);
    a.kv_dtype = SDPA_DTYPE_F16;
    a.k.data = k_buf[1..].as_ptr().cast();
    a.v.data = v16.as_ptr().cast();
    let o = no_options();
    // SAFETY: valid pointers for the declared types.
    assert_eq!(
        unsafe { sdpa_attention(&a, &o) },
        SdpaStatus::Ok,
        "{}",
        message()
    );
    let mut out_r = vec![0f32; B * NQ * H * D];
    sdpa::attention(
        &Tensor::bshd(&q, [B, NQ, H, D]).unwrap(),
        &Tensor::bshd(&k16, [B, NKV, HKV, D]).unwrap(),
        &Tensor::bshd(&v16, [B, NKV, HKV, D]).unwrap(),
        &mut TensorMut::bshd(&mut out_r, [B, NQ, H, D]).unwrap(),
        &Options::new(),
    )
    .unwrap();
    assert_eq!(out, out_r);
    // The same address declared f32 is misaligned; an odd address is misaligned for f16.
    let mut b = a;
    b.kv_dtype = SDPA_DTYPE_F32;
    b.k.dims[0] = 1; // keep the f32 view inside the buffer
    b.v.dims[0] = 1;
    // SAFETY: rejected before use.
    let status = unsafe { sdpa_attention(&b, &o) };
    assert_eq!(status, SdpaStatus::Misaligned, "{}", message());
    let mut b = a;
    b.k.data = (k_buf.as_ptr() as *const u8).wrapping_add(1).cast();
    // SAFETY: rejected before use.
    assert_eq!(unsafe { sdpa_attention(&b, &o) }, SdpaStatus::Misaligned);
    assert!(message().contains("2 bytes"), "{}", message());
    // A half-typed output overlapping an input is still seen.
    let mut b = a;
    b.out_dtype = SDPA_DTYPE_F16;
    b.out.data = v16.as_ptr() as *mut _;
    // SAFETY: rejected before use.
    assert_eq!(
        unsafe { sdpa_attention(&b, &o) },
        SdpaStatus::AliasedBuffers
    );
}

#[test]
fn merge_takes_f32_only() {
    // SAFETY: all-zero is a valid SdpaMergeArgs; rejected before any pointer is read.
    let mut m: SdpaMergeArgs = unsafe { std::mem::zeroed() };
    m.size = std::mem::size_of::<SdpaMergeArgs>();
    m.dtype = SDPA_DTYPE_F16;
    // SAFETY: as above.
    assert_eq!(
        unsafe { sdpa_merge_partials(&m) },
        SdpaStatus::UnsupportedType
    );
    assert!(message().contains("f32 only"), "{}", message());
}

#[test]
fn bf16_products_follow_the_rust_option_and_the_struct_version() {
    use sdpa::half::bf16;
    let q: Vec<bf16> = typed(B * NQ * H * D, 60);
    let k: Vec<bf16> = typed(B * NKV * HKV * D, 61);
    let v: Vec<bf16> = typed(B * NKV * HKV * D, 62);
    let c_call = |o: &SdpaOptions| {
        let mut out = vec![bf16::ZERO; B * NQ * H * D];
        let mut lse = vec![0f32; B * H * NQ];
        let a = typed_args(&q, &k, &v, &mut out, &mut lse);
        // SAFETY: valid pointers for bf16 elements and the dims of `args`.
        let status = unsafe { sdpa_attention(&a, o) };
        assert_eq!(status, SdpaStatus::Ok, "{}", message());
        (out, lse)
    };
    let bits = |(out, lse): (Vec<bf16>, Vec<f32>)| {
        let mut b: Vec<u32> = out.iter().map(|x| u32::from(x.to_bits())).collect();
        b.extend(lse.iter().map(|x| x.to_bits()));
        b
    };
    let mut on = no_options();
    on.bf16_products = 1;
    let with = bits(c_call(&on));
    assert_eq!(
        with,
        bits(rust_call(&q, &k, &v, &Options::new().bf16_products()))
    );
    let without = bits(rust_call(&q, &k, &v, &Options::new()));
    assert_eq!(bits(c_call(&no_options())), without);
    // Where the CPU has the instruction the option changes the results (P rounded to bf16).
    let available = sdpa_bf16_products_available();
    assert_eq!(available, u32::from(sdpa::bf16_products_available()));
    assert_eq!(sdpa_amx_available(), u32::from(sdpa::amx_available()));
    assert_eq!(with != without, available == 1);
    // A caller built against the first version of `sdpa_options` (its size ends at
    // `sinks_len`): the bytes past it — `bf16_products`, nonzero here — are not read.
    let mut v1 = on;
    v1.size = std::mem::offset_of!(SdpaOptions, bf16_products);
    assert_eq!(bits(c_call(&v1)), without);
    // Smaller than the first version, or between the two versions: rejected.
    let mut lse = vec![0f32; B * H * NQ];
    let a = args(&[], &[], &[], &mut [], &mut lse);
    for size in [v1.size - 8, v1.size + 2] {
        let bad = SdpaOptions { size, ..on };
        // SAFETY: the options' size is checked before any tensor is read.
        assert_eq!(
            unsafe { sdpa_attention(&a, &bad) },
            SdpaStatus::InvalidStructSize
        );
        assert!(
            message().contains(&format!("or {}", v1.size)),
            "{}",
            message()
        );
    }
}

#[test]
fn i8_kv_with_scales_matches_the_rust_api_and_errors_are_typed() {
    let q: Vec<f32> = data(B * NQ * H * D, 70);
    let ints = |n: usize, m: usize| -> Vec<i8> {
        (0..n)
            .map(|i| ((i * m) % 255) as i8)
            .map(|x| x.max(-127))
            .collect()
    };
    let (k, v) = (ints(B * NKV * HKV * D, 37), ints(B * NKV * HKV * D, 53));
    // K per (kv head, channel), V per (token, kv head), some negative and one 0.
    let (ks_dims, vs_dims) = ([1, 1, HKV, D], [B, NKV, HKV, 1]);
    let ks: Vec<f32> = (0..HKV * D)
        .map(|i| (i % 7) as f32 / 500.0 - 0.002)
        .collect();
    let vs: Vec<f32> = (0..B * NKV * HKV)
        .map(|i| (1 + i % 5) as f32 / 300.0)
        .collect();
    let scales = || {
        let t = |x, dims| Tensor::bshd(x, dims).unwrap();
        Options::new().kv_scales(t(&ks, ks_dims), t(&vs, vs_dims))
    };
    let (want, want_lse) = rust_call::<f32, i8, f32>(&q, &k, &v, &scales());
    let mut o = no_options();
    o.k_scales = tensor(&ks, ks_dims);
    o.v_scales = tensor(&vs, vs_dims);
    let call = |o: &SdpaOptions, q_dtype: u32, out_dtype: u32| {
        let mut out = vec![0f32; B * NQ * H * D];
        let mut lse = vec![0f32; B * H * NQ];
        let mut a = typed_args(&q, &k, &v, &mut out, &mut lse);
        (a.q_dtype, a.out_dtype) = (q_dtype, out_dtype);
        // SAFETY: valid pointers for the declared element types and the dims of `a` (an
        // `int8_t` Q or output is rejected before any tensor is read).
        let status = unsafe { sdpa_attention(&a, o) };
        (status, out, lse)
    };
    let (status, out, lse) = call(&o, SDPA_DTYPE_F32, SDPA_DTYPE_F32);
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!((bits(&out), bits(&lse)), (bits(&want), bits(&want_lse)));
    // Without scales, or with the second version of the struct (which has none): the Rust
    // API's error; one of the two: a NULL pointer; Q or out of `int8_t`: not a type they take.
    let without = no_options();
    let mut v2 = o;
    v2.size = std::mem::offset_of!(SdpaOptions, k_scales);
    let mut half = o;
    half.v_scales.data = ptr::null();
    for (opts, want) in [
        (&without, SdpaStatus::KvScales),
        (&v2, SdpaStatus::KvScales),
        (&half, SdpaStatus::NullPointer),
    ] {
        assert_eq!(call(opts, SDPA_DTYPE_F32, SDPA_DTYPE_F32).0, want);
    }
    assert!(message().contains("v_scales"), "{}", message());
    for (q_dtype, out_dtype) in [
        (SDPA_DTYPE_I8, SDPA_DTYPE_F32),
        (SDPA_DTYPE_F32, SDPA_DTYPE_I8),
    ] {
        let (status, out, _) = call(&o, q_dtype, out_dtype);
        assert_eq!(status, SdpaStatus::UnsupportedType);
        assert!(message().contains("K/V type only"), "{}", message());
        assert!(out.iter().all(|&x| x == 0.0), "wrote on error");
    }
    // Scales with float K/V.
    let k32: Vec<f32> = data(B * NKV * HKV * D, 71);
    let mut out = vec![0f32; B * NQ * H * D];
    let mut lse = vec![0f32; B * H * NQ];
    let a = typed_args(&q, &k32, &k32, &mut out, &mut lse);
    // SAFETY: valid f32 buffers for the dims of `a`.
    assert_eq!(unsafe { sdpa_attention(&a, &o) }, SdpaStatus::KvScales);
}

#[test]
fn null_arrays_with_a_nonzero_length_are_null_pointer_errors() {
    let (q, k, v) = (
        data(B * NQ * H * D, 7),
        data(B * NKV * HKV * D, 8),
        data(B * NKV * HKV * D, 9),
    );
    let mut out = vec![5f32; B * NQ * H * D];
    let mut lse = vec![5f32; B * H * NQ];
    let good = args(&q, &k, &v, &mut out, &mut lse);
    // SAFETY: valid pointers (or NULL, which is checked) and the dims of `good`.
    let call = |a: &SdpaAttentionArgs, o: &SdpaOptions| unsafe { sdpa_attention(a, o) };
    let mut o = no_options();
    o.kv_lens = ptr::null();
    o.kv_lens_len = B;
    assert_eq!(call(&good, &o), SdpaStatus::NullPointer);
    assert!(message().contains("kv_lens"), "{}", message());
    let mut o = no_options();
    o.sinks = ptr::null();
    o.sinks_len = H;
    assert_eq!(call(&good, &o), SdpaStatus::NullPointer);
    let mut a = good;
    a.lse = ptr::null_mut();
    assert_eq!(call(&a, &no_options()), SdpaStatus::NullPointer);
    // With length 0, NULL is "none".
    let mut o = no_options();
    o.kv_lens = ptr::null();
    o.kv_lens_len = 0;
    assert_eq!(call(&good, &o), SdpaStatus::Ok, "{}", message());
    // Merging: NULL parts with a count are an error, not "no partials".
    // SAFETY: all-zero is a valid SdpaMergeArgs.
    let mut m: SdpaMergeArgs = unsafe { std::mem::zeroed() };
    m.size = std::mem::size_of::<SdpaMergeArgs>();
    m.n_parts = 2;
    // SAFETY: NULL is checked before anything is read.
    assert_eq!(unsafe { sdpa_merge_partials(&m) }, SdpaStatus::NullPointer);
    assert!(message().contains("parts"), "{}", message());
}
