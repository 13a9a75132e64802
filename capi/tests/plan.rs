//! `sdpa_plan_new` / `sdpa_plan_run` / `sdpa_plan_free`: one plan run for two layers with
//! different pools gives `sdpa_attention_varlen`'s bits (paged and packed K/V; f32, f16, bf16
//! and int8 with per-layer scales; every option; per-layer sinks; LSE), and a decode step
//! `sdpa_attention_paged`'s; the plan keeps copies of the caller's arrays (overwritten after
//! `sdpa_plan_new`); `kv_lens_before` is `kv_lens` minus each sequence's query rows; errors are
//! typed statuses with messages and write nothing.

use std::ffi::CStr;
use std::ptr;

use sdpa::half::{bf16, f16};
use sdpa_capi::*;

const H: usize = 4;
const HKV: usize = 2;
const D: usize = 16;
const PAGE: usize = 4;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.37 * seed as f32).sin())
        .collect()
}

/// An element type of the tests: its `SDPA_DTYPE_*`, conversion and bits.
trait Ty: Copy {
    const DTYPE: u32;
    fn of(x: f32) -> Self;
    fn bits(self) -> u32;
}

impl Ty for f32 {
    const DTYPE: u32 = SDPA_DTYPE_F32;
    fn of(x: f32) -> Self {
        x
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

impl Ty for f16 {
    const DTYPE: u32 = SDPA_DTYPE_F16;
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
}

impl Ty for bf16 {
    const DTYPE: u32 = SDPA_DTYPE_BF16;
    fn of(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
}

impl Ty for i8 {
    const DTYPE: u32 = SDPA_DTYPE_I8;
    fn of(x: f32) -> Self {
        (x * 127.0).round() as i8
    }
    fn bits(self) -> u32 {
        self as u8 as u32
    }
}

fn typed<T: Ty>(n: usize, seed: u32) -> Vec<T> {
    data(n, seed).into_iter().map(T::of).collect()
}

fn bits<T: Ty>(x: &[T]) -> Vec<u32> {
    x.iter().map(|e| e.bits()).collect()
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

fn absent() -> SdpaTensor {
    SdpaTensor {
        data: ptr::null(),
        dims: [0; 4],
        strides: [0; 4],
    }
}

/// The step: (query rows, keys cached before them) per sequence — prefill chunks, decode
/// rows, a sequence without rows or keys — its offsets, lengths and a scattered block table.
struct Step {
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    before: Vec<usize>,
    after: Vec<usize>,
    table: Vec<u32>,
    pps: usize,
    /// Pool pages: every table entry exists.
    pages: usize,
    /// One past the largest entry the lengths reach.
    reached: usize,
    max_q: usize,
    max_k: usize,
}

impl Step {
    fn new(seqs: &[(usize, usize)]) -> Self {
        let prefix = |x: &[usize]| -> Vec<i32> {
            let mut v = vec![0i32];
            for &n in x {
                v.push(v.last().unwrap() + n as i32);
            }
            v
        };
        let n_q: Vec<usize> = seqs.iter().map(|s| s.0).collect();
        let before: Vec<usize> = seqs.iter().map(|s| s.1).collect();
        let after: Vec<usize> = seqs.iter().map(|s| s.0 + s.1).collect();
        let max_k = *after.iter().max().unwrap();
        let pps = max_k.div_ceil(PAGE) + 1;
        let pages = seqs.len() * pps;
        assert_ne!(pages % 7, 0);
        // Entry i is page (7i + 3) mod pages: a permutation scattering each sequence's pages.
        let table: Vec<u32> = (0..pages).map(|i| ((7 * i + 3) % pages) as u32).collect();
        let reached = (0..seqs.len())
            .flat_map(|b| table[b * pps..][..after[b].div_ceil(PAGE)].iter())
            .map(|&p| p as usize + 1)
            .max()
            .unwrap();
        assert!(reached > 1);
        Step {
            cu_q: prefix(&n_q),
            cu_k: prefix(&after),
            before,
            after,
            table,
            pps,
            pages,
            reached,
            max_q: *n_q.iter().max().unwrap(),
            max_k,
        }
    }

    fn total_q(&self) -> usize {
        *self.cu_q.last().unwrap() as usize
    }

    fn kv_dims(&self, paged: bool) -> [usize; 4] {
        match paged {
            true => [self.pages, PAGE, HKV, D],
            false => [1, *self.cu_k.last().unwrap() as usize, HKV, D],
        }
    }
}

/// The option values: every option (`full`) or key lengths only, bias and mask broadcast
/// against `[B, max n_q, H, max keys]` (paged: the table's capacity).
struct Opts {
    lens: Vec<usize>,
    before: bool,
    full: bool,
    bias: Vec<f32>,
    mask: Vec<u8>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    dims: (usize, usize, usize),
}

impl Opts {
    fn new(step: &Step, paged: bool, full: bool, before: bool) -> Self {
        // A paged call's keys per sequence: the table's capacity.
        let mk = if paged { step.pps * PAGE } else { step.max_k };
        let (b, mq) = (step.after.len(), step.max_q);
        Opts {
            lens: if before { &step.before } else { &step.after }.clone(),
            before,
            full,
            bias: (0..mq * mk).map(|i| (i % 5) as f32 * 0.1).collect(),
            mask: (0..b * mq * mk).map(|i| [1u8, 2, 1, 0][i % 4]).collect(),
            slopes: sdpa::alibi_slopes(H).unwrap(),
            sinks: vec![0.5, -1.0, f32::NEG_INFINITY, 2.0],
            dims: (b, mq, mk),
        }
    }

    fn c(&self) -> SdpaOptions {
        // SAFETY: all-zero is a valid SdpaOptions (plain attention), as documented.
        let mut o: SdpaOptions = unsafe { std::mem::zeroed() };
        o.size = std::mem::size_of::<SdpaOptions>();
        o.kv_lens = self.lens.as_ptr();
        o.kv_lens_len = self.lens.len();
        o.kv_lens_before = u32::from(self.before);
        o.causal = SDPA_ALIGN_BOTTOM_RIGHT;
        if !self.full {
            return o;
        }
        let (b, mq, mk) = self.dims;
        o.has_scale = 1;
        o.scale = 0.3;
        o.window = SDPA_ALIGN_BOTTOM_RIGHT;
        o.window_left = 9;
        o.window_right = 0;
        o.bias = SdpaTensor {
            data: self.bias.as_ptr().cast(),
            dims: [1, mq, 1, mk],
            strides: [0, mk, 0, 1],
        };
        o.mask = SdpaTensor {
            data: self.mask.as_ptr().cast(),
            dims: [b, mq, H, mk],
            strides: [mq * mk, mk, 0, 1],
        };
        o.alibi = SDPA_ALIGN_BOTTOM_RIGHT;
        o.alibi_slopes = self.slopes.as_ptr();
        o.alibi_slopes_len = H;
        o.has_softcap = 1;
        o.softcap = 30.0;
        o.sinks = self.sinks.as_ptr();
        o.sinks_len = H;
        o
    }
}

fn plan_args(step: &Step, paged: bool) -> SdpaPlanArgs {
    // SAFETY: all-zero is a valid SdpaPlanArgs (NULL arrays, packed).
    let mut a: SdpaPlanArgs = unsafe { std::mem::zeroed() };
    a.size = std::mem::size_of::<SdpaPlanArgs>();
    a.heads = H;
    a.kv_heads = HKV;
    a.d_k = D;
    a.d_v = D;
    a.cu_seqlens_q = step.cu_q.as_ptr();
    a.cu_seqlens_q_len = step.cu_q.len();
    if paged {
        a.kv_layout = SDPA_KV_PAGED;
        a.block_table = step.table.as_ptr();
        a.block_table_len = step.table.len();
        a.pages_per_seq = step.pps;
        a.page_size = PAGE;
    } else {
        a.kv_layout = SDPA_KV_PACKED;
        a.cu_seqlens_k = step.cu_k.as_ptr();
        a.cu_seqlens_k_len = step.cu_k.len();
    }
    a
}

/// One layer's tensors: Q, K/V (pools or packed rows), int8 scales per (token, kv head).
struct LayerData<Q, KV> {
    q: Vec<Q>,
    k: Vec<KV>,
    v: Vec<KV>,
    kv_dims: [usize; 4],
    k_scales: Vec<f32>,
    v_scales: Vec<f32>,
}

impl<Q: Ty, KV: Ty> LayerData<Q, KV> {
    fn new(step: &Step, paged: bool, seed: u32) -> Self {
        let kv_dims = step.kv_dims(paged);
        let n = kv_dims.iter().product();
        let tokens = kv_dims[0] * kv_dims[1] * HKV;
        let scales = |s: usize| (0..tokens).map(move |i| 0.01 + 0.002 * ((i + s) % 7) as f32);
        LayerData {
            q: typed(step.total_q() * H * D, seed),
            k: typed(n, seed + 1),
            v: typed(n, seed + 2),
            kv_dims,
            k_scales: scales(seed as usize).collect(),
            v_scales: scales(seed as usize + 3).collect(),
        }
    }

    /// The scales' view (int8 K/V only).
    fn scales(&self) -> Option<(SdpaTensor, SdpaTensor)> {
        let dims = [self.kv_dims[0], self.kv_dims[1], HKV, 1];
        (KV::DTYPE == SDPA_DTYPE_I8)
            .then(|| (tensor(&self.k_scales, dims), tensor(&self.v_scales, dims)))
    }
}

/// `sdpa_attention_varlen` on the layer with the same arrays and options (`sinks` replacing
/// the options' sinks), and the layer's int8 scales in the options.
fn varlen<Q: Ty, KV: Ty, O: Ty>(
    step: &Step,
    paged: bool,
    l: &LayerData<Q, KV>,
    opts: &SdpaOptions,
    sinks: Option<&[f32]>,
    out: &mut [O],
    lse: &mut [f32],
) {
    // SAFETY: all-zero is a valid SdpaVarlenArgs (NULL arrays, packed, f32).
    let mut a: SdpaVarlenArgs = unsafe { std::mem::zeroed() };
    a.size = std::mem::size_of::<SdpaVarlenArgs>();
    (a.q_dtype, a.kv_dtype, a.out_dtype) = (Q::DTYPE, KV::DTYPE, O::DTYPE);
    let total_q = step.total_q();
    a.q = tensor(&l.q, [1, total_q, H, D]);
    a.cu_seqlens_q = step.cu_q.as_ptr();
    a.cu_seqlens_q_len = step.cu_q.len();
    a.k = tensor(&l.k, l.kv_dims);
    a.v = tensor(&l.v, l.kv_dims);
    if paged {
        a.kv_layout = SDPA_KV_PAGED;
        a.block_table = step.table.as_ptr();
        a.block_table_len = step.table.len();
        a.pages_per_seq = step.pps;
    } else {
        a.cu_seqlens_k = step.cu_k.as_ptr();
        a.cu_seqlens_k_len = step.cu_k.len();
    }
    a.out = tensor_mut(out, [1, total_q, H, D]);
    a.lse = lse.as_mut_ptr();
    a.lse_len = lse.len();
    let mut o = *opts;
    if let Some((k, v)) = l.scales() {
        (o.k_scales, o.v_scales) = (k, v);
    }
    if let Some(s) = sinks {
        (o.sinks, o.sinks_len) = (s.as_ptr(), s.len());
    }
    // SAFETY: every pointer is valid for the dims and element types given.
    let status = unsafe { sdpa_attention_varlen(&a, &o) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
}

fn run_args<Q: Ty, KV: Ty, O: Ty>(
    l: &LayerData<Q, KV>,
    total_q: usize,
    out: &mut [O],
    lse: &mut [f32],
    sinks: Option<&[f32]>,
) -> SdpaPlanRunArgs {
    // SAFETY: all-zero is a valid SdpaPlanRunArgs (NULL pointers, f32).
    let mut a: SdpaPlanRunArgs = unsafe { std::mem::zeroed() };
    a.size = std::mem::size_of::<SdpaPlanRunArgs>();
    (a.q_dtype, a.kv_dtype, a.out_dtype) = (Q::DTYPE, KV::DTYPE, O::DTYPE);
    a.q = tensor(&l.q, [1, total_q, H, D]);
    a.k = tensor(&l.k, l.kv_dims);
    a.v = tensor(&l.v, l.kv_dims);
    a.out = tensor_mut(out, [1, total_q, H, D]);
    (a.lse, a.lse_len) = (lse.as_mut_ptr(), lse.len());
    (a.k_scales, a.v_scales) = l.scales().unwrap_or((absent(), absent()));
    if let Some(s) = sinks {
        (a.sinks, a.sinks_len) = (s.as_ptr(), s.len());
    }
    a
}

/// A plan made from copies of the step's arrays and options, which are then overwritten and
/// freed before it runs.
fn plan_from_copies(step: &Step, paged: bool, opts: &Opts) -> *mut SdpaPlan {
    let mut cu_q = step.cu_q.clone();
    let mut cu_k = step.cu_k.clone();
    let mut table = step.table.clone();
    let mut o = Opts::new(step, paged, opts.full, opts.before);
    let mut args = plan_args(step, paged);
    args.cu_seqlens_q = cu_q.as_ptr();
    if paged {
        args.block_table = table.as_ptr();
    } else {
        args.cu_seqlens_k = cu_k.as_ptr();
    }
    let mut plan = ptr::null_mut();
    // SAFETY: every pointer is valid for its length or dims.
    let status = unsafe { sdpa_plan_new(&args, &o.c(), &mut plan) };
    assert_eq!(status, SdpaStatus::Ok, "{}", message());
    assert!(!plan.is_null());
    for x in cu_q.iter_mut().chain(&mut cu_k) {
        *x = -1;
    }
    table.fill(u32::MAX);
    o.lens.fill(usize::MAX);
    o.bias.fill(f32::NAN);
    o.mask.fill(0);
    o.slopes.fill(f32::NAN);
    o.sinks.fill(f32::NAN);
    drop((cu_q, cu_k, table, o));
    plan
}

/// Two layers through one plan against `sdpa_attention_varlen`, bitwise, out and LSE: the
/// first layer with the options' sinks, the second with its own.
fn plan_matches_varlen<Q: Ty, KV: Ty, O: Ty>(paged: bool, full: bool, before: bool) {
    let what = format!(
        "paged {paged}, options {full}, before {before}, kv {}",
        KV::DTYPE
    );
    let step = Step::new(&[(3, 5), (0, 0), (1, 8), (6, 0), (1, 13)]);
    let opts = Opts::new(&step, paged, full, before);
    let plan = plan_from_copies(&step, paged, &opts);
    // The reference gets the lengths after the step's rows.
    let reference = Opts::new(&step, paged, full, false);
    let total_q = step.total_q();
    let layer_sinks = [1.5f32, 0.0, -2.0, f32::NEG_INFINITY];
    for layer in 0..2u32 {
        let l = LayerData::<Q, KV>::new(&step, paged, 10 * layer + 3);
        let sinks = (layer == 1).then_some(&layer_sinks[..]);
        let mut out_p = vec![O::of(7.0); total_q * H * D];
        let mut lse_p = vec![7.0f32; H * total_q];
        let a = run_args(&l, total_q, &mut out_p, &mut lse_p, sinks);
        // SAFETY: the plan is live; every pointer is valid for its dims or length.
        let status = unsafe { sdpa_plan_run(plan, &a) };
        assert_eq!(status, SdpaStatus::Ok, "{what}: {}", message());
        assert_eq!(message(), "");
        let mut out_r = vec![O::of(7.0); total_q * H * D];
        let mut lse_r = vec![7.0f32; H * total_q];
        varlen(
            &step,
            paged,
            &l,
            &reference.c(),
            sinks,
            &mut out_r,
            &mut lse_r,
        );
        assert_eq!(bits(&out_p), bits(&out_r), "{what}, layer {layer}");
        assert_eq!(bits(&lse_p), bits(&lse_r), "{what}, layer {layer}");
        assert!(out_p.iter().any(|x| x.bits() != O::of(7.0).bits()));
    }
    // SAFETY: made by sdpa_plan_new, freed once.
    unsafe { sdpa_plan_free(plan) };
}

#[test]
fn plans_match_varlen_bitwise() {
    for paged in [true, false] {
        for full in [false, true] {
            plan_matches_varlen::<f32, f32, f32>(paged, full, false);
            plan_matches_varlen::<f32, f16, f32>(paged, full, false);
            plan_matches_varlen::<f32, i8, f32>(paged, full, false);
        }
        plan_matches_varlen::<bf16, bf16, f16>(paged, true, false);
        plan_matches_varlen::<f32, f16, f32>(paged, true, true);
    }
}

/// `kv_lens_before` in the other calls: a varlen call with the lengths before the rows gives
/// the bits of one with the lengths after them.
#[test]
fn kv_lens_before_is_kv_lens_minus_the_query_rows() {
    let step = Step::new(&[(3, 5), (0, 0), (1, 8), (6, 0), (1, 13)]);
    let l = LayerData::<f32, f16>::new(&step, true, 5);
    let n = step.total_q() * H * D;
    let (mut out_a, mut lse_a) = (vec![0f32; n], vec![0f32; H * step.total_q()]);
    let (mut out_b, mut lse_b) = (out_a.clone(), lse_a.clone());
    let after = Opts::new(&step, true, true, false);
    let before = Opts::new(&step, true, true, true);
    varlen(&step, true, &l, &after.c(), None, &mut out_a, &mut lse_a);
    varlen(&step, true, &l, &before.c(), None, &mut out_b, &mut lse_b);
    assert_eq!(bits(&out_a), bits(&out_b));
    assert_eq!(bits(&lse_a), bits(&lse_b));
    // A caller of the third version of sdpa_options (no kv_lens_before) gets 0.
    let mut o = before.c();
    o.size = std::mem::offset_of!(SdpaOptions, kv_lens_before);
    varlen(&step, true, &l, &o, None, &mut out_b, &mut lse_b);
    assert_ne!(bits(&out_a), bits(&out_b));
}

/// A decode step (one row per sequence) through a paged plan gives `sdpa_attention_paged`'s
/// bits with Q `[B, 1, H, d]` (the same memory), its LSE transposed.
#[test]
fn decode_plan_matches_paged_bitwise() {
    let step = Step::new(&[(1, 5), (1, 8), (1, 0), (1, 13), (1, 2)]);
    let opts = Opts::new(&step, true, true, false);
    let plan = plan_from_copies(&step, true, &opts);
    let b = step.after.len();
    for layer in 0..2u32 {
        let l = LayerData::<f32, i8>::new(&step, true, 7 * layer + 1);
        let mut out_p = vec![0f32; b * H * D];
        let mut lse_p = vec![0f32; H * b];
        let a = run_args(&l, b, &mut out_p, &mut lse_p, None);
        // SAFETY: the plan is live; every pointer is valid for its dims or length.
        assert_eq!(
            unsafe { sdpa_plan_run(plan, &a) },
            SdpaStatus::Ok,
            "{}",
            message()
        );

        let mut out_r = vec![0f32; b * H * D];
        let mut lse_r = vec![0f32; b * H];
        // SAFETY: all-zero is a valid SdpaPagedArgs.
        let mut pa: SdpaPagedArgs = unsafe { std::mem::zeroed() };
        pa.size = std::mem::size_of::<SdpaPagedArgs>();
        pa.kv_dtype = SDPA_DTYPE_I8;
        pa.q = tensor(&l.q, [b, 1, H, D]);
        pa.k = tensor(&l.k, l.kv_dims);
        pa.v = tensor(&l.v, l.kv_dims);
        pa.block_table = step.table.as_ptr();
        pa.block_table_len = step.table.len();
        pa.pages_per_seq = step.pps;
        pa.out = tensor_mut(&mut out_r, [b, 1, H, D]);
        (pa.lse, pa.lse_len) = (lse_r.as_mut_ptr(), lse_r.len());
        let mut o = opts.c();
        (o.k_scales, o.v_scales) = l.scales().unwrap();
        // SAFETY: every pointer is valid for the dims and element types given.
        let status = unsafe { sdpa_attention_paged(&pa, &o) };
        assert_eq!(status, SdpaStatus::Ok, "{}", message());
        assert_eq!(bits(&out_p), bits(&out_r), "layer {layer}");
        // Paged: lse[(b·H + h)·1]; varlen: lse[h·B + b].
        let transposed: Vec<f32> = (0..H * b).map(|i| lse_r[(i % b) * H + i / b]).collect();
        assert_eq!(bits(&lse_p), bits(&transposed), "layer {layer}");
    }
    // SAFETY: made by sdpa_plan_new, freed once.
    unsafe { sdpa_plan_free(plan) };
}

/// `sdpa_plan_new` with `args` changed by `edit` and options `opts`: the status, `out` left
/// as it was.
fn new_status(edit: impl FnOnce(&mut SdpaPlanArgs), opts: &SdpaOptions) -> (SdpaStatus, String) {
    let step = Step::new(&[(3, 5), (1, 8)]);
    let mut args = plan_args(&step, true);
    edit(&mut args);
    let sentinel = ptr::NonNull::<SdpaPlan>::dangling().as_ptr();
    let mut plan = sentinel;
    // SAFETY: every pointer is valid for its length (or NULL where the test says).
    let status = unsafe { sdpa_plan_new(&args, opts, &mut plan) };
    if status == SdpaStatus::Ok {
        // SAFETY: made by sdpa_plan_new, freed once.
        unsafe { sdpa_plan_free(plan) };
    } else {
        assert_eq!(plan, sentinel, "out written on error");
    }
    (status, message())
}

#[test]
fn plan_new_errors_are_typed() {
    let step = Step::new(&[(3, 5), (1, 8)]);
    let good = Opts::new(&step, true, false, false);
    let o = good.c();
    assert_eq!(new_status(|_| {}, &o).0, SdpaStatus::Ok);
    let (s, m) = new_status(|a| a.size -= 8, &o);
    assert_eq!(s, SdpaStatus::InvalidStructSize, "{m}");
    let (s, m) = new_status(|a| a.page_size = 0, &o);
    assert_eq!(s, SdpaStatus::InvalidValue, "{m}");
    let (s, m) = new_status(|a| a.kv_layout = 7, &o);
    assert_eq!(s, SdpaStatus::InvalidArgument, "{m}");
    assert!(m.contains("kv_layout"), "{m}");
    let (s, m) = new_status(|a| a.cu_seqlens_k_len = 1, &o);
    assert_eq!(s, SdpaStatus::InvalidArgument, "{m}");
    let (s, m) = new_status(|a| a.block_table = ptr::null(), &o);
    assert_eq!(s, SdpaStatus::NullPointer, "{m}");
    let (s, m) = new_status(|a| a.block_table_len -= a.pages_per_seq, &o);
    assert_eq!(s, SdpaStatus::LengthMismatch, "{m}");
    let (s, m) = new_status(|a| a.kv_heads = 3, &o);
    assert_eq!(s, SdpaStatus::HeadsNotDivisible, "{m}");
    let bad_q = [0i32, -3, 4];
    let (s, m) = new_status(|a| a.cu_seqlens_q = bad_q.as_ptr(), &o);
    assert_eq!(s, SdpaStatus::InvalidValue, "{m}");
    assert!(m.contains("cu_seqlens_q"), "{m}");
    // Packed with a paged field set.
    let (s, m) = new_status(
        |a| {
            a.kv_layout = SDPA_KV_PACKED;
            (a.block_table, a.block_table_len, a.pages_per_seq) = (ptr::null(), 0, 0);
        },
        &o,
    );
    assert_eq!(s, SdpaStatus::InvalidArgument, "{m}");
    assert!(m.contains("page_size"), "{m}");
    // Paged without key lengths.
    let mut no_lens = o;
    (no_lens.kv_lens, no_lens.kv_lens_len) = (ptr::null(), 0);
    assert_eq!(new_status(|_| {}, &no_lens).0, SdpaStatus::LengthMismatch);
    // A length past the table's capacity.
    let long = [3usize, 1000];
    let mut too_long = o;
    too_long.kv_lens = long.as_ptr();
    assert_eq!(new_status(|_| {}, &too_long).0, SdpaStatus::InvalidValue);
    // kv_lens NULL with a length.
    let mut null_lens = o;
    null_lens.kv_lens = ptr::null();
    assert_eq!(new_status(|_| {}, &null_lens).0, SdpaStatus::NullPointer);
    // Scales belong to the layers.
    let scales = [1.0f32];
    let mut with_scales = o;
    with_scales.k_scales = tensor(&scales, [1, 1, 1, 1]);
    with_scales.v_scales = tensor(&scales, [1, 1, 1, 1]);
    let (s, m) = new_status(|_| {}, &with_scales);
    assert_eq!(s, SdpaStatus::InvalidValue, "{m}");
    assert!(m.contains("per layer"), "{m}");
    // NULL args and NULL out.
    let mut plan = ptr::null_mut();
    // SAFETY: NULL args are rejected before anything is read.
    let status = unsafe { sdpa_plan_new(ptr::null(), &o, &mut plan) };
    assert_eq!(status, SdpaStatus::NullPointer);
    let args = plan_args(&step, true);
    // SAFETY: NULL out is rejected before anything is written.
    let status = unsafe { sdpa_plan_new(&args, &o, ptr::null_mut()) };
    assert_eq!(status, SdpaStatus::NullPointer);
    assert!(message().contains("out"));
    // NULL plan: nothing to free.
    // SAFETY: NULL is allowed.
    unsafe { sdpa_plan_free(ptr::null_mut()) };
}

/// Each bad run gives its status and message, and writes neither out nor the LSE.
#[test]
fn plan_run_errors_are_typed_and_write_nothing() {
    let step = Step::new(&[(3, 5), (0, 0), (1, 8), (6, 0), (1, 13)]);
    let opts = Opts::new(&step, true, false, false);
    let plan = plan_from_copies(&step, true, &opts);
    let total_q = step.total_q();
    let l8 = LayerData::<f32, i8>::new(&step, true, 3);
    let lf = LayerData::<f32, f32>::new(&step, true, 3);
    let mut out = vec![7.0f32; total_q * H * D];
    let mut lse = vec![7.0f32; H * total_q];
    let base8 = run_args(&l8, total_q, &mut out, &mut lse, None);
    let basef = run_args(&lf, total_q, &mut out, &mut lse, None);
    let sinks = [0.0f32; H + 1];
    let (o_ptr, o_len) = (out.as_ptr(), out.len());
    let check = |a: SdpaPlanRunArgs, expected: SdpaStatus, needle: &str| {
        // SAFETY: the plan is live; the pointers are valid as the test's dims say (or
        // deliberately wrong where the call rejects them before reading).
        let status = unsafe { sdpa_plan_run(plan, &a) };
        let m = message();
        assert_eq!(status, expected, "{m}");
        assert!(m.contains(needle), "{m} (expected {needle})");
        // SAFETY: `out` and `lse` outlive the closure's calls; nothing else writes them.
        let written = unsafe { std::slice::from_raw_parts(o_ptr, o_len) };
        assert!(written.iter().all(|&x| x == 7.0), "out written on error");
        // SAFETY: as above.
        let lse = unsafe { std::slice::from_raw_parts(a.lse, a.lse_len) };
        assert!(lse.iter().all(|&x| x == 7.0), "lse written on error");
    };
    // A pool with fewer pages than the table reaches.
    let mut a = basef;
    a.k.dims[0] = step.reached - 1;
    a.v.dims[0] = step.reached - 1;
    check(a, SdpaStatus::ShapeMismatch, "key");
    // Q of the wrong rows.
    let mut a = basef;
    a.q.dims[1] -= 1;
    check(a, SdpaStatus::ShapeMismatch, "query");
    // int8 without scales, f32 with them.
    let mut a = base8;
    (a.k_scales, a.v_scales) = (absent(), absent());
    check(a, SdpaStatus::KvScales, "");
    let mut a = basef;
    (a.k_scales, a.v_scales) = (base8.k_scales, base8.v_scales);
    check(a, SdpaStatus::KvScales, "");
    let mut a = base8;
    a.v_scales = absent();
    check(a, SdpaStatus::NullPointer, "v_scales");
    // LSE and sinks lengths, NULL arrays with lengths.
    let mut a = basef;
    a.lse_len -= 1;
    check(a, SdpaStatus::LengthMismatch, "");
    let mut a = basef;
    (a.sinks, a.sinks_len) = (sinks.as_ptr(), H + 1);
    check(a, SdpaStatus::LengthMismatch, "sinks");
    let mut a = basef;
    (a.sinks, a.sinks_len) = (ptr::null(), H);
    check(a, SdpaStatus::NullPointer, "sinks");
    // Types, sizes, aliasing.
    let mut a = basef;
    a.out_dtype = SDPA_DTYPE_I8;
    check(a, SdpaStatus::UnsupportedType, "");
    let mut a = basef;
    a.q_dtype = 9;
    check(a, SdpaStatus::UnsupportedType, "q_dtype");
    let mut a = basef;
    a.size += 8;
    check(a, SdpaStatus::InvalidStructSize, "");
    let mut a = basef;
    a.q.data = a.out.data;
    check(a, SdpaStatus::AliasedBuffers, "");
    // NULL plan or args.
    // SAFETY: NULL is rejected before anything is read.
    assert_eq!(
        unsafe { sdpa_plan_run(ptr::null_mut(), &basef) },
        SdpaStatus::NullPointer
    );
    // SAFETY: as above.
    assert_eq!(
        unsafe { sdpa_plan_run(plan, ptr::null()) },
        SdpaStatus::NullPointer
    );
    // The plan still runs after the errors.
    // SAFETY: the plan is live; every pointer is valid.
    assert_eq!(
        unsafe { sdpa_plan_run(plan, &base8) },
        SdpaStatus::Ok,
        "{}",
        message()
    );
    assert!(out.iter().any(|&x| x != 7.0));
    // SAFETY: made by sdpa_plan_new, freed once.
    unsafe { sdpa_plan_free(plan) };
}
