//! `sdpa_plan_new_rows` against the Rust `Plan::new_rows` (paged and packed, both length
//! conventions) and its errors; `sdpa_append` with `scales_given` against the Rust
//! `append_scaled` (bitwise), its errors, and a first-version `sdpa_append_args` (no
//! `scales_given`) still read as per-token scales.

use std::ffi::CStr;
use std::ptr;

use sdpa::{append_scaled, Heads, Options, Plan, StepKv, Tensor, TensorMut};
use sdpa_capi::*;

const H: usize = 4;
const HKV: usize = 2;
const D: usize = 8;
const PAGE: usize = 4;

fn message() -> String {
    // SAFETY: the library returns a valid, NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(sdpa_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 1000)
        .map(|x| x as f32 / 250.0 - 2.0)
        .collect()
}

fn contiguous([_, s, h, d]: [usize; 4]) -> [usize; 4] {
    [s * h * d, h * d, d, 1]
}

fn tensor<T>(x: &[T], dims: [usize; 4]) -> SdpaTensor {
    SdpaTensor {
        data: x.as_ptr().cast(),
        dims,
        strides: contiguous(dims),
    }
}

fn tensor_mut<T>(x: &mut [T], dims: [usize; 4]) -> SdpaTensorMut {
    SdpaTensorMut {
        data: x.as_mut_ptr().cast(),
        dims,
        strides: contiguous(dims),
    }
}

/// A C plan of 3 sequences (2 new rows after 5 cached keys, none after 3, 3 after 0), paged
/// or packed, lengths before or after the rows.
fn c_plan(paged: bool, before: bool, lens: &[usize], table: &[u32], cu: &[i32]) -> *mut SdpaPlan {
    let cu_q = [0i32, 2, 2, 5];
    // SAFETY: all-zero is a valid SdpaPlanArgs and SdpaOptions.
    let (mut a, mut o): (SdpaPlanArgs, SdpaOptions) = unsafe { std::mem::zeroed() };
    a.size = std::mem::size_of::<SdpaPlanArgs>();
    (a.heads, a.kv_heads, a.d_k, a.d_v) = (H, HKV, D, D);
    a.cu_seqlens_q = cu_q.as_ptr();
    a.cu_seqlens_q_len = cu_q.len();
    if paged {
        a.kv_layout = SDPA_KV_PAGED;
        a.block_table = table.as_ptr();
        a.block_table_len = table.len();
        a.pages_per_seq = table.len() / 3;
        a.page_size = PAGE;
    } else {
        a.kv_layout = SDPA_KV_PACKED;
        a.cu_seqlens_k = cu.as_ptr();
        a.cu_seqlens_k_len = cu.len();
    }
    o.size = std::mem::size_of::<SdpaOptions>();
    if !lens.is_empty() {
        o.kv_lens = lens.as_ptr();
        o.kv_lens_len = lens.len();
        o.kv_lens_before = u32::from(before);
    }
    let mut plan = ptr::null_mut();
    // SAFETY: every pointer is valid for its length.
    let status = unsafe { sdpa_plan_new(&a, &o, &mut plan) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    plan
}

/// (paged, lengths before the rows, the lengths, the Rust plan's slots and positions).
type Case<'a> = (bool, bool, &'a [usize], (Vec<usize>, Vec<u32>));

#[test]
fn plan_new_rows_match_the_rust_plan() {
    let table = [6u32, 1, 4, 0, 2, 3, 7, 5, 8];
    let cu_k = [0i32, 9, 13, 16];
    let heads = Heads {
        heads: H,
        kv_heads: HKV,
        d_k: D,
        d_v: D,
    };
    let cu_q = [0usize, 2, 2, 5];
    let (before, after) = ([5usize, 3, 0], [7usize, 3, 3]);
    let rust = |step: StepKv<'_>, opts: &Options<'_>| {
        let plan = Plan::new(&cu_q, step, heads, opts).unwrap();
        let (mut s, mut p) = (vec![0; 5], vec![0; 5]);
        plan.new_rows(&mut s, &mut p).unwrap();
        (s, p)
    };
    let paged = StepKv::Paged {
        block_table: &table,
        pages_per_seq: 3,
        page_size: PAGE,
    };
    let cu_k_usize: Vec<usize> = cu_k.iter().map(|&x| x as usize).collect();
    let packed = StepKv::Packed {
        cu_seqlens_k: &cu_k_usize,
    };
    let cases: [Case<'_>; 4] = [
        (
            true,
            true,
            &before,
            rust(paged, &Options::new().cache_seqlens(&before)),
        ),
        (
            true,
            false,
            &after,
            rust(paged, &Options::new().kv_lens(&after)),
        ),
        (false, false, &[], rust(packed, &Options::new())),
        (
            false,
            true,
            &before,
            rust(packed, &Options::new().cache_seqlens(&before)),
        ),
    ];
    for (is_paged, is_before, lens, (want_slots, want_positions)) in cases {
        let plan = c_plan(is_paged, is_before, lens, &table, &cu_k);
        let (mut slots, mut positions) = (vec![0usize; 5], vec![0u32; 5]);
        // SAFETY: a live plan; both arrays hold 5 elements.
        let status =
            unsafe { sdpa_plan_new_rows(plan, slots.as_mut_ptr(), positions.as_mut_ptr(), 5) };
        assert_eq!(status, SdpaStatus::Ok, "{}", message());
        assert_eq!((&slots, &positions), (&want_slots, &want_positions));
        // SAFETY: the plan came from sdpa_plan_new and is freed once.
        unsafe { sdpa_plan_free(plan) };
    }
    // The paged slots by hand: sequence 0's keys 5, 6 in its second page (entry 1), sequence
    // 2's keys 0..3 in its first (entry 6).
    assert_eq!(
        rust(paged, &Options::new().cache_seqlens(&before)).0,
        [PAGE + 1, PAGE + 2, 7 * PAGE, 7 * PAGE + 1, 7 * PAGE + 2]
    );
}

#[test]
fn plan_new_rows_errors_write_nothing() {
    let table = [6u32, 1, 4, 0, 2, 3, 7, 5, 8];
    let short = [7usize, 3, 2]; // sequence 2's length leaves out one of its 3 rows
    let plan = c_plan(true, false, &short, &table, &[]);
    let (mut slots, mut positions) = (vec![9usize; 5], vec![9u32; 5]);
    // SAFETY: a live plan; valid arrays (or NULL, checked).
    unsafe {
        let s = sdpa_plan_new_rows(plan, slots.as_mut_ptr(), positions.as_mut_ptr(), 5);
        assert_eq!(s, SdpaStatus::InvalidValue, "{}", message());
        assert!(message().contains("kv_lens"), "{}", message());
        let s = sdpa_plan_new_rows(plan, ptr::null_mut(), positions.as_mut_ptr(), 5);
        assert_eq!(s, SdpaStatus::NullPointer);
        let s = sdpa_plan_new_rows(ptr::null(), slots.as_mut_ptr(), positions.as_mut_ptr(), 5);
        assert_eq!(s, SdpaStatus::NullPointer);
        let s = sdpa_plan_new_rows(plan, slots.as_mut_ptr(), positions.as_mut_ptr(), 4);
        assert_eq!(s, SdpaStatus::LengthMismatch, "{}", message());
        // Positions over the slots.
        let s = sdpa_plan_new_rows(plan, slots.as_mut_ptr(), slots.as_mut_ptr().cast(), 5);
        assert_eq!(s, SdpaStatus::AliasedBuffers, "{}", message());
        sdpa_plan_free(plan);
    }
    assert!(slots.iter().all(|&x| x == 9) && positions.iter().all(|&x| x == 9));
}

#[test]
fn append_with_given_scales_matches_append_scaled() {
    let (pages, n) = (4, 5);
    let pool = [pages, PAGE, HKV, D];
    let rows = [1, n, HKV, D];
    let (k, v) = (data(n * HKV * D, 1), data(n * HKV * D, 2));
    let slots = [13usize, 2, 7, 0, 15];
    let k_scales: Vec<f32> = (0..HKV * D).map(|i| 0.005 + 0.002 * i as f32).collect();
    let v_scales = [0.01f32];
    let (ks_dims, vs_dims) = ([1, 1, HKV, D], [1, 1, 1, 1]);
    let mut k8 = vec![55i8; pages * PAGE * HKV * D];
    let mut v8 = k8.clone();
    let (mut k8r, mut v8r) = (k8.clone(), v8.clone());
    let (mut ksc, mut vsc) = (k_scales.clone(), v_scales.to_vec());
    let args = |k8: &mut [i8], v8: &mut [i8], ks: &mut [f32], vs: &mut [f32]| SdpaAppendArgs {
        size: std::mem::size_of::<SdpaAppendArgs>(),
        rows_dtype: SDPA_DTYPE_F32,
        k: tensor(&k, rows),
        v: tensor(&v, rows),
        cache_dtype: SDPA_DTYPE_I8,
        k_cache: tensor_mut(k8, pool),
        v_cache: tensor_mut(v8, pool),
        slots: slots.as_ptr(),
        slots_len: slots.len(),
        k_scales: tensor_mut(ks, ks_dims),
        v_scales: tensor_mut(vs, vs_dims),
        scales_given: 1,
    };
    let a = args(&mut k8, &mut v8, &mut ksc, &mut vsc);
    // SAFETY: every pointer is valid for its dims or length.
    let status = unsafe { sdpa_append(&a, ptr::null()) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    append_scaled(
        &Tensor::bshd(&k, rows).unwrap(),
        &Tensor::bshd(&v, rows).unwrap(),
        &mut TensorMut::bshd(&mut k8r, pool).unwrap(),
        &mut TensorMut::bshd(&mut v8r, pool).unwrap(),
        &slots,
        &Tensor::bshd(&k_scales, ks_dims).unwrap(),
        &Tensor::bshd(&v_scales, vs_dims).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!((&k8, &v8), (&k8r, &v8r));
    assert!(
        k8.iter().any(|&x| x.unsigned_abs() == 127),
        "some values saturate"
    );
    assert_eq!(
        (&ksc, &vsc[..]),
        (&k_scales, &v_scales[..]),
        "scales only read"
    );

    // A NaN scale, a float cache, scales over the cache: statuses, nothing written.
    let before = (k8.clone(), v8.clone());
    ksc[3] = f32::NAN;
    let a = args(&mut k8, &mut v8, &mut ksc, &mut vsc);
    // SAFETY: as above.
    let status = unsafe { sdpa_append(&a, ptr::null()) };
    assert_eq!(status, SdpaStatus::InvalidValue, "{}", message());
    let mut a = args(&mut k8, &mut v8, &mut ksc, &mut vsc);
    a.k_scales.data = a.k_cache.data;
    // SAFETY: as above (the overlap is rejected before anything is written).
    let status = unsafe { sdpa_append(&a, ptr::null()) };
    assert_eq!(status, SdpaStatus::AliasedBuffers, "{}", message());
    assert_eq!((&k8, &v8), (&before.0, &before.1));
    let mut f = vec![0.0f32; pages * PAGE * HKV * D];
    let mut g = f.clone();
    ksc[3] = 0.01;
    let mut a = args(&mut k8, &mut v8, &mut ksc, &mut vsc);
    (a.cache_dtype, a.k_cache, a.v_cache) = (
        SDPA_DTYPE_F32,
        tensor_mut(&mut f, pool),
        tensor_mut(&mut g, pool),
    );
    // SAFETY: as above.
    let status = unsafe { sdpa_append(&a, ptr::null()) };
    assert_eq!(status, SdpaStatus::KvScales, "{}", message());
    assert!(f.iter().chain(&g).all(|&x| x == 0.0));

    // A first-version struct (its size ends before `scales_given`): per-token scales, written.
    let mut kst = vec![0.0f32; pages * PAGE * HKV];
    let mut vst = kst.clone();
    let mut a = args(&mut k8, &mut v8, &mut ksc, &mut vsc);
    a.size = std::mem::offset_of!(SdpaAppendArgs, scales_given);
    a.k_scales = tensor_mut(&mut kst, [pages, PAGE, HKV, 1]);
    a.v_scales = tensor_mut(&mut vst, [pages, PAGE, HKV, 1]);
    // SAFETY: as above; the library reads `size` bytes.
    let status = unsafe { sdpa_append(&a, ptr::null()) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    assert!(kst[slots[0] * HKV] > 0.0, "per-token scales written");
}
