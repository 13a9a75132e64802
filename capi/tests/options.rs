//! The C entry points called from Rust: every option of `sdpa_options` against the same call
//! through the Rust API (bitwise: one kernel, deterministic), versioned struct sizes, and
//! error statuses whose messages are the Rust `Display` texts.

use std::ffi::CStr;
use std::ptr;

use sdpa::{Alignment, Options, Tensor, TensorMut};
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

fn tensor(data: &[f32], dims: [usize; 4]) -> SdpaTensor {
    SdpaTensor {
        data: data.as_ptr().cast(),
        dims,
        strides: contiguous(dims),
    }
}

fn args(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], lse: &mut [f32]) -> SdpaAttentionArgs {
    SdpaAttentionArgs {
        size: std::mem::size_of::<SdpaAttentionArgs>(),
        dtype: SDPA_DTYPE_F32,
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
    }
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
    let mut out_r = vec![0f32; B * NQ * H * D];
    let mut lse_r = vec![0f32; B * H * NQ];
    sdpa::attention_lse(
        &Tensor::bshd(&q, [B, NQ, H, D]).unwrap(),
        &Tensor::bshd(&k, [B, NKV, HKV, D]).unwrap(),
        &Tensor::bshd(&v, [B, NKV, HKV, D]).unwrap(),
        &mut TensorMut::bshd(&mut out_r, [B, NQ, H, D]).unwrap(),
        &mut lse_r,
        &opts,
    )
    .unwrap();
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

    // Types.
    let mut a = good;
    a.dtype = SDPA_DTYPE_BF16;
    assert_eq!(call(&a, &o), SdpaStatus::UnsupportedType);
    a.dtype = 99;
    assert_eq!(call(&a, &o), SdpaStatus::UnsupportedType);

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
