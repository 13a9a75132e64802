//! `sdpa_attention_paged` and `sdpa_attention_varlen` against `sdpa::attention_paged` and
//! `sdpa::attention_varlen` (bitwise: one kernel, deterministic) for f32 and half caches, with
//! and without options and LSE, both pool layouts, packed and paged varlen K/V; and their error
//! statuses, whose messages are the Rust `Display` texts (operands `block table`, `kv_lens`,
//! `cu_seqlens_q`, `cu_seqlens_k`).

use std::ffi::CStr;
use std::ptr;

use sdpa::half::{bf16, f16};
use sdpa::{Alignment, Element, Options, PackedKv, PagedKv, Tensor, TensorMut, VarlenKv};
use sdpa_capi::*;

const H: usize = 4;
const HKV: usize = 2;
const D: usize = 16;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 1.0) * 0.37 * seed as f32).sin())
        .collect()
}

fn typed<T: Element>(n: usize, seed: u32) -> Vec<T> {
    data(n, seed).into_iter().map(T::from_f32).collect()
}

fn dtype_of<T: Element>() -> u32 {
    match T::NAME {
        "f32" => SDPA_DTYPE_F32,
        "f16" => SDPA_DTYPE_F16,
        "bf16" => SDPA_DTYPE_BF16,
        other => panic!("unknown element type {other}"),
    }
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

fn tensor<T>(x: &[T], dims: [usize; 4], strides: [usize; 4]) -> SdpaTensor {
    SdpaTensor {
        data: x.as_ptr().cast(),
        dims,
        strides,
    }
}

fn tensor_mut<T>(x: &mut [T], dims: [usize; 4]) -> SdpaTensorMut {
    SdpaTensorMut {
        data: x.as_mut_ptr().cast(),
        dims,
        strides: contiguous(dims),
    }
}

fn no_options() -> SdpaOptions {
    // SAFETY: all-zero is a valid SdpaOptions (plain attention), as documented.
    let mut o: SdpaOptions = unsafe { std::mem::zeroed() };
    o.size = std::mem::size_of::<SdpaOptions>();
    o
}

fn bits<T: Element>(x: &[T]) -> Vec<u32> {
    x.iter().map(|e| e.to_f32().to_bits()).collect()
}

/// The option values of a call whose bias/mask dims are `[b, n_q, H, n_kv]`: a bias broadcast
/// over batch and heads, a byte mask per batch broadcast over heads, ALiBi, softcap, sinks.
struct Fixture {
    kv_lens: Option<Vec<usize>>,
    n_q: usize,
    n_kv: usize,
    b: usize,
    bias: Vec<f32>,
    mask_bytes: Vec<u8>,
    mask_bool: Vec<bool>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
}

impl Fixture {
    fn new(kv_lens: Option<Vec<usize>>, [b, n_q, _, n_kv]: [usize; 4]) -> Self {
        let mask_bytes: Vec<u8> = (0..b * n_q * n_kv).map(|i| [1u8, 2, 1, 0][i % 4]).collect();
        Fixture {
            kv_lens,
            n_q,
            n_kv,
            b,
            bias: (0..n_q * n_kv).map(|i| (i % 5) as f32 * 0.1).collect(),
            mask_bool: mask_bytes.iter().map(|&m| m != 0).collect(),
            mask_bytes,
            slopes: sdpa::alibi_slopes(H).unwrap(),
            sinks: vec![0.5, -1.0, f32::NEG_INFINITY, 2.0],
        }
    }

    fn bias_view(&self) -> ([usize; 4], [usize; 4]) {
        ([1, self.n_q, 1, self.n_kv], [0, self.n_kv, 0, 1])
    }

    fn mask_view(&self) -> ([usize; 4], [usize; 4]) {
        (
            [self.b, self.n_q, H, self.n_kv],
            [self.n_q * self.n_kv, self.n_kv, 0, 1],
        )
    }

    /// The C options: key lengths only (`full` false) or every option.
    fn c(&self, full: bool) -> SdpaOptions {
        let mut o = no_options();
        if let Some(lens) = &self.kv_lens {
            o.kv_lens = lens.as_ptr();
            o.kv_lens_len = lens.len();
        }
        if !full {
            return o;
        }
        o.has_scale = 1;
        o.scale = 0.3;
        o.causal = SDPA_ALIGN_BOTTOM_RIGHT;
        o.window = SDPA_ALIGN_BOTTOM_RIGHT;
        o.window_left = 9;
        o.window_right = 0;
        let (dims, strides) = self.bias_view();
        o.bias = tensor(&self.bias, dims, strides);
        let (dims, strides) = self.mask_view();
        o.mask = tensor(&self.mask_bytes, dims, strides);
        o.alibi = SDPA_ALIGN_BOTTOM_RIGHT;
        o.alibi_slopes = self.slopes.as_ptr();
        o.alibi_slopes_len = self.slopes.len();
        o.has_softcap = 1;
        o.softcap = 30.0;
        o.sinks = self.sinks.as_ptr();
        o.sinks_len = self.sinks.len();
        o
    }

    /// The same options through the Rust API.
    fn rust(&self, full: bool) -> Options<'_> {
        let mut opts = Options::new();
        if let Some(lens) = &self.kv_lens {
            opts = opts.kv_lens(lens);
        }
        if !full {
            return opts;
        }
        let br = Alignment::BottomRight;
        let (bd, bs) = self.bias_view();
        let (md, ms) = self.mask_view();
        opts.scale(0.3)
            .causal(br)
            .sliding_window(9, 0, br)
            .bias(Tensor::new(&self.bias, bd, bs).unwrap())
            .mask(Tensor::new(&self.mask_bool, md, ms).unwrap())
            .alibi(&self.slopes, br)
            .softcap(30.0)
            .sinks(&self.sinks)
    }
}

/// A paged cache of `b` sequences: `pps` pages of `page_size` per sequence in a shuffled pool
/// with two spare pages, sequence 1 sharing sequence 0's first page, table entries past each
/// length set to pages that do not exist (never read).
struct Cache<KV> {
    k_pool: Vec<KV>,
    v_pool: Vec<KV>,
    pool_dims: [usize; 4],
    pool_strides: [usize; 4],
    table: Vec<u32>,
    pps: usize,
}

impl<KV: Element> Cache<KV> {
    fn new(b: usize, page_size: usize, pps: usize, lens: &[usize], head_major: bool) -> Self {
        let pages = b * pps + 2;
        // A fixed shuffle of 0..pages.
        let mut order: Vec<u32> = (0..pages as u32).collect();
        for i in (1..pages).rev() {
            order.swap(i, (i * 7 + 3) % (i + 1));
        }
        let mut table = vec![0u32; b * pps];
        for s in 0..b {
            let used = lens[s].div_ceil(page_size);
            for p in 0..pps {
                table[s * pps + p] = if s == 1 && p == 0 {
                    order[0] // shared prefix page
                } else if p < used {
                    order[s * pps + p]
                } else {
                    u32::MAX - p as u32
                };
            }
        }
        let pool_dims = [pages, page_size, HKV, D];
        let pool_strides = if head_major {
            [HKV * page_size * D, D, page_size * D, 1]
        } else {
            contiguous(pool_dims)
        };
        let n = pages * page_size * HKV * D;
        Cache {
            k_pool: typed(n, 3),
            v_pool: typed(n, 5),
            pool_dims,
            pool_strides,
            table,
            pps,
        }
    }

    fn rust(&self) -> PagedKv<'_, KV> {
        PagedKv::new(
            Tensor::new(&self.k_pool, self.pool_dims, self.pool_strides).unwrap(),
            Tensor::new(&self.v_pool, self.pool_dims, self.pool_strides).unwrap(),
            &self.table,
            self.pps,
        )
        .unwrap()
    }
}

/// Paged arguments over `cache` with queries `q` `[b, n_q, H, D]`.
fn paged_args<Q: Element, KV: Element, O: Element>(
    q: &[Q],
    q_dims: [usize; 4],
    cache: &Cache<KV>,
    out: &mut [O],
    lse: Option<&mut [f32]>,
) -> SdpaPagedArgs {
    let (lse, lse_len) = match lse {
        Some(l) => (l.as_mut_ptr(), l.len()),
        None => (ptr::null_mut(), 0),
    };
    SdpaPagedArgs {
        size: std::mem::size_of::<SdpaPagedArgs>(),
        q_dtype: dtype_of::<Q>(),
        kv_dtype: dtype_of::<KV>(),
        out_dtype: dtype_of::<O>(),
        q: tensor(q, q_dims, contiguous(q_dims)),
        k: tensor(&cache.k_pool, cache.pool_dims, cache.pool_strides),
        v: tensor(&cache.v_pool, cache.pool_dims, cache.pool_strides),
        block_table: cache.table.as_ptr(),
        block_table_len: cache.table.len(),
        pages_per_seq: cache.pps,
        out: tensor_mut(out, [q_dims[0], q_dims[1], H, D]),
        lse,
        lse_len,
    }
}

fn paged_matches_rust<Q: Element, KV: Element, O: Element>(
    n_q: usize,
    page_size: usize,
    head_major: bool,
) {
    let b = 3;
    let pps = 20usize.div_ceil(page_size);
    let cap = pps * page_size;
    let lens = vec![cap, 7, 13];
    let cache = Cache::<KV>::new(b, page_size, pps, &lens, head_major);
    let q_dims = [b, n_q, H, D];
    let q: Vec<Q> = typed(b * n_q * H * D, 11);
    let fixture = Fixture::new(Some(lens), [b, n_q, H, cap]);
    let zero = O::from_f32(0.0);
    for full in [false, true] {
        for with_lse in [true, false] {
            let what = format!(
                "Q {}, KV {}, out {}, n_q {n_q}, page {page_size}, head-major {head_major}, \
                 options {full}, lse {with_lse}",
                Q::NAME,
                KV::NAME,
                O::NAME
            );
            let mut out_c = vec![zero; b * n_q * H * D];
            let mut lse_c = vec![0f32; b * H * n_q];
            let a = paged_args(
                &q,
                q_dims,
                &cache,
                &mut out_c,
                with_lse.then_some(&mut lse_c[..]),
            );
            let o = fixture.c(full);
            // SAFETY: every pointer is valid for the dims and element types given.
            let status = unsafe { sdpa_attention_paged(&a, &o) };
            assert_eq!(status, SdpaStatus::Ok, "{what}: {}", message());
            assert_eq!(message(), "");

            let mut out_r = vec![zero; b * n_q * H * D];
            let mut lse_r = vec![0f32; b * H * n_q];
            sdpa::attention_paged(
                &Tensor::bshd(&q, q_dims).unwrap(),
                &cache.rust(),
                &mut TensorMut::bshd(&mut out_r, q_dims).unwrap(),
                with_lse.then_some(&mut lse_r[..]),
                &fixture.rust(full),
            )
            .unwrap();
            assert_eq!(bits(&out_c), bits(&out_r), "{what}");
            assert_eq!(bits(&lse_c), bits(&lse_r), "{what}");
        }
    }
}

#[test]
fn paged_matches_the_rust_api_bitwise() {
    paged_matches_rust::<f32, f32, f32>(1, 4, false);
    paged_matches_rust::<f32, f32, f32>(3, 4, true);
    // llama.cpp's way: an f16 cache, f32 queries and output.
    paged_matches_rust::<f32, f16, f32>(1, 16, false);
    paged_matches_rust::<f32, f16, f32>(3, 3, true);
    paged_matches_rust::<bf16, bf16, f16>(2, 4, false);
}

/// A packed batch: `q_lens[b]` query rows and `k_lens[b]` keys per sequence, K/V packed
/// (with int32 offsets for C, usize for Rust) and the same keys paged.
struct Varlen<KV> {
    cu_q: Vec<usize>,
    cu_q32: Vec<i32>,
    cu_k: Vec<usize>,
    cu_k32: Vec<i32>,
    k_lens: Vec<usize>,
    k: Vec<KV>,
    v: Vec<KV>,
    cache: Cache<KV>,
}

fn offsets(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0];
    for l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    cu
}

impl<KV: Element> Varlen<KV> {
    fn new(q_lens: &[usize], k_lens: &[usize]) -> Self {
        let (cu_q, cu_k) = (offsets(q_lens), offsets(k_lens));
        let total_kv = *cu_k.last().unwrap();
        let b = q_lens.len();
        let page_size = 4;
        let pps = k_lens.iter().max().unwrap().div_ceil(page_size);
        Varlen {
            cu_q32: cu_q.iter().map(|&x| x as i32).collect(),
            cu_k32: cu_k.iter().map(|&x| x as i32).collect(),
            cu_q,
            cu_k,
            k_lens: k_lens.to_vec(),
            k: typed(total_kv * HKV * D, 21),
            v: typed(total_kv * HKV * D, 22),
            cache: Cache::new(b, page_size, pps, k_lens, true),
        }
    }

    fn total_q(&self) -> usize {
        *self.cu_q.last().unwrap()
    }

    fn kv_dims(&self) -> [usize; 4] {
        [1, *self.cu_k.last().unwrap(), HKV, D]
    }

    /// C arguments, K/V packed or paged.
    fn args<Q: Element, O: Element>(
        &self,
        paged: bool,
        q: &[Q],
        out: &mut [O],
        lse: Option<&mut [f32]>,
    ) -> SdpaVarlenArgs {
        let dims = [1, self.total_q(), H, D];
        let (lse, lse_len) = match lse {
            Some(l) => (l.as_mut_ptr(), l.len()),
            None => (ptr::null_mut(), 0),
        };
        let mut a = SdpaVarlenArgs {
            size: std::mem::size_of::<SdpaVarlenArgs>(),
            q_dtype: dtype_of::<Q>(),
            kv_dtype: dtype_of::<KV>(),
            out_dtype: dtype_of::<O>(),
            kv_layout: SDPA_KV_PACKED,
            q: tensor(q, dims, contiguous(dims)),
            cu_seqlens_q: self.cu_q32.as_ptr(),
            cu_seqlens_q_len: self.cu_q32.len(),
            k: tensor(&self.k, self.kv_dims(), contiguous(self.kv_dims())),
            v: tensor(&self.v, self.kv_dims(), contiguous(self.kv_dims())),
            cu_seqlens_k: self.cu_k32.as_ptr(),
            cu_seqlens_k_len: self.cu_k32.len(),
            block_table: ptr::null(),
            block_table_len: 0,
            pages_per_seq: 0,
            out: tensor_mut(out, dims),
            lse,
            lse_len,
        };
        if paged {
            let c = &self.cache;
            a.kv_layout = SDPA_KV_PAGED;
            a.k = tensor(&c.k_pool, c.pool_dims, c.pool_strides);
            a.v = tensor(&c.v_pool, c.pool_dims, c.pool_strides);
            a.cu_seqlens_k = ptr::null();
            a.cu_seqlens_k_len = 0;
            a.block_table = c.table.as_ptr();
            a.block_table_len = c.table.len();
            a.pages_per_seq = c.pps;
        }
        a
    }

    fn rust(&self, paged: bool) -> VarlenKv<'_, KV> {
        if paged {
            self.cache.rust().into()
        } else {
            PackedKv::new(
                Tensor::bshd(&self.k, self.kv_dims()).unwrap(),
                Tensor::bshd(&self.v, self.kv_dims()).unwrap(),
                &self.cu_k,
            )
            .into()
        }
    }
}

fn varlen_matches_rust<Q: Element, KV: Element, O: Element>() {
    // A decode row, an empty sequence, a prefill chunk, a sequence with more rows than keys.
    let q_lens = [1usize, 0, 5, 3];
    let k_lens = [9usize, 4, 12, 2];
    let batch = Varlen::<KV>::new(&q_lens, &k_lens);
    let total_q = batch.total_q();
    let q: Vec<Q> = typed(total_q * H * D, 31);
    let (max_q, max_k) = (5, 12);
    // Paged K/V need key lengths; packed ones get a shortened sequence 2 or none.
    let shortened = vec![9usize, 4, 10, 2];
    for paged in [false, true] {
        for (lens, full) in [
            (paged.then(|| k_lens.to_vec()), false),
            (
                Some(if paged {
                    k_lens.to_vec()
                } else {
                    shortened.clone()
                }),
                true,
            ),
        ] {
            let fixture = Fixture::new(lens, [q_lens.len(), max_q, H, max_k]);
            for with_lse in [true, false] {
                let what = format!(
                    "Q {}, KV {}, out {}, paged {paged}, options {full}, lse {with_lse}",
                    Q::NAME,
                    KV::NAME,
                    O::NAME
                );
                let mut out_c = vec![O::from_f32(7.0); total_q * H * D];
                let mut lse_c = vec![7f32; H * total_q];
                let a = batch.args(paged, &q, &mut out_c, with_lse.then_some(&mut lse_c[..]));
                let o = fixture.c(full);
                // SAFETY: every pointer is valid for the dims and element types given.
                let status = unsafe { sdpa_attention_varlen(&a, &o) };
                assert_eq!(status, SdpaStatus::Ok, "{what}: {}", message());

                let mut out_r = vec![O::from_f32(7.0); total_q * H * D];
                let mut lse_r = vec![7f32; H * total_q];
                sdpa::attention_varlen(
                    &Tensor::bshd(&q, [1, total_q, H, D]).unwrap(),
                    &batch.cu_q,
                    &batch.rust(paged),
                    &mut TensorMut::bshd(&mut out_r, [1, total_q, H, D]).unwrap(),
                    with_lse.then_some(&mut lse_r[..]),
                    &fixture.rust(full),
                )
                .unwrap();
                assert_eq!(bits(&out_c), bits(&out_r), "{what}");
                assert_eq!(bits(&lse_c), bits(&lse_r), "{what}");
            }
        }
    }
}

#[test]
fn varlen_matches_the_rust_api_bitwise() {
    varlen_matches_rust::<f32, f32, f32>();
    varlen_matches_rust::<f32, f16, f32>();
    varlen_matches_rust::<bf16, bf16, bf16>();
}

#[test]
fn paged_errors_give_statuses_and_the_rust_messages() {
    let (b, n_q, page_size, pps) = (3, 1, 4, 5);
    let lens = vec![20usize, 7, 13];
    let cache = Cache::<f32>::new(b, page_size, pps, &lens, false);
    let q_dims = [b, n_q, H, D];
    let q: Vec<f32> = typed(b * n_q * H * D, 41);
    let mut out = vec![0f32; b * n_q * H * D];
    let mut lse = vec![0f32; b * H * n_q];
    let good = paged_args(&q, q_dims, &cache, &mut out, Some(&mut lse));
    let mut o = no_options();
    o.kv_lens = lens.as_ptr();
    o.kv_lens_len = lens.len();
    let call = |a: &SdpaPagedArgs, o: &SdpaOptions| {
        // SAFETY: every pointer below stays within its buffer or is rejected before use.
        unsafe { sdpa_attention_paged(a, o) }
    };
    assert_eq!(call(&good, &o), SdpaStatus::Ok, "{}", message());
    let rust_error = |table: &[u32], opts: &Options<'_>| {
        let kv = PagedKv::new(
            Tensor::bshd(&cache.k_pool, cache.pool_dims).unwrap(),
            Tensor::bshd(&cache.v_pool, cache.pool_dims).unwrap(),
            table,
            pps,
        )
        .unwrap();
        let mut out = vec![0f32; b * n_q * H * D];
        sdpa::attention_paged(
            &Tensor::bshd(&q, q_dims).unwrap(),
            &kv,
            &mut TensorMut::bshd(&mut out, q_dims).unwrap(),
            None,
            opts,
        )
        .unwrap_err()
        .to_string()
    };

    // A table entry a sequence's length reaches that is not a page of the pool.
    let mut table = cache.table.clone();
    table[pps + 1] = cache.pool_dims[0] as u32;
    let mut a = good;
    a.block_table = table.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert_eq!(
        message(),
        rust_error(&table, &Options::new().kv_lens(&lens))
    );
    assert!(message().starts_with("block table[6]"), "{}", message());
    // Past the length it is never read.
    table[pps + 1] = cache.table[pps + 1];
    table[pps + 2] = u32::MAX;
    assert_eq!(call(&a, &o), SdpaStatus::Ok, "{}", message());

    // No key lengths.
    assert_eq!(call(&good, &no_options()), SdpaStatus::LengthMismatch);
    assert_eq!(message(), rust_error(&cache.table, &Options::new()));
    assert!(message().starts_with("kv_lens"), "{}", message());
    // SAFETY: as above; NULL options are plain attention, so no key lengths either.
    let status = unsafe { sdpa_attention_paged(&good, ptr::null()) };
    assert_eq!(status, SdpaStatus::LengthMismatch);

    // A table of the wrong length; one that is not whole rows.
    let mut a = good;
    a.block_table_len -= pps;
    assert_eq!(call(&a, &o), SdpaStatus::LengthMismatch);
    assert!(message().starts_with("block table"), "{}", message());
    a.block_table_len += 1;
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert!(message().contains("pages_per_seq"), "{}", message());

    // Pools that disagree.
    let mut a = good;
    a.v.dims[1] = page_size - 1;
    assert_eq!(call(&a, &o), SdpaStatus::ShapeMismatch);

    // Pointers: NULL table (with entries), misaligned, wrapping; NULL args.
    let mut a = good;
    a.block_table = ptr::null();
    assert_eq!(call(&a, &o), SdpaStatus::NullPointer);
    assert!(message().contains("block table"), "{}", message());
    a.block_table_len = 0;
    assert_eq!(call(&a, &o), SdpaStatus::LengthMismatch);
    let mut a = good;
    a.block_table = (cache.table.as_ptr() as *const u8).wrapping_add(1).cast();
    a.block_table_len -= 1;
    assert_eq!(call(&a, &o), SdpaStatus::Misaligned);
    let mut a = good;
    a.block_table = (usize::MAX - 7) as *const u32;
    assert_eq!(call(&a, &o), SdpaStatus::LayoutOverflow);
    assert!(message().contains("wrap"), "{}", message());
    // SAFETY: NULL is checked.
    let status = unsafe { sdpa_attention_paged(ptr::null(), &o) };
    assert_eq!(status, SdpaStatus::NullPointer);

    // Outputs over an input: the table, a pool; the LSE over the output.
    let mut shared = vec![0u32; b * n_q * H * D];
    shared[..cache.table.len()].copy_from_slice(&cache.table);
    let mut a = good;
    a.block_table = shared.as_ptr();
    a.out.data = shared.as_mut_ptr().cast();
    assert_eq!(call(&a, &o), SdpaStatus::AliasedBuffers);
    let mut a = good;
    a.out.data = cache.k_pool.as_ptr() as *mut _;
    assert_eq!(call(&a, &o), SdpaStatus::AliasedBuffers);
    let mut a = good;
    a.lse = a.out.data.cast();
    assert_eq!(call(&a, &o), SdpaStatus::AliasedBuffers);
    let mut a = good;
    a.lse_len -= 1;
    assert_eq!(call(&a, &o), SdpaStatus::LengthMismatch);

    // Struct size and types.
    let mut a = good;
    a.size -= 8;
    assert_eq!(call(&a, &o), SdpaStatus::InvalidStructSize);
    let mut a = good;
    a.kv_dtype = 9;
    assert_eq!(call(&a, &o), SdpaStatus::UnsupportedType);
    assert!(message().contains("kv_dtype"), "{}", message());
}

#[test]
fn varlen_errors_give_statuses_and_the_rust_messages() {
    let q_lens = [2usize, 3];
    let k_lens = [5usize, 6];
    let batch = Varlen::<f32>::new(&q_lens, &k_lens);
    let total_q = batch.total_q();
    let q: Vec<f32> = typed(total_q * H * D, 51);
    let mut out = vec![0f32; total_q * H * D];
    let mut lse = vec![0f32; H * total_q];
    let packed = batch.args(false, &q, &mut out, Some(&mut lse));
    let paged = batch.args(true, &q, &mut out, Some(&mut lse));
    let mut o = no_options();
    let call = |a: &SdpaVarlenArgs, o: &SdpaOptions| {
        // SAFETY: every pointer below stays within its buffer or is rejected before use.
        unsafe { sdpa_attention_varlen(a, o) }
    };
    assert_eq!(call(&packed, &o), SdpaStatus::Ok, "{}", message());
    let rust_error = |cu_q: &[usize], cu_k: &[usize]| {
        let mut out = vec![0f32; total_q * H * D];
        let kv = PackedKv::new(
            Tensor::bshd(&batch.k, batch.kv_dims()).unwrap(),
            Tensor::bshd(&batch.v, batch.kv_dims()).unwrap(),
            cu_k,
        );
        sdpa::attention_varlen(
            &Tensor::bshd(&q, [1, total_q, H, D]).unwrap(),
            cu_q,
            &kv.into(),
            &mut TensorMut::bshd(&mut out, [1, total_q, H, D]).unwrap(),
            None,
            &Options::new(),
        )
        .unwrap_err()
        .to_string()
    };

    // Decreasing offsets, for Q and for K: the Rust errors and messages.
    let cu_q = [0i32, 3, 2];
    let mut a = packed;
    a.cu_seqlens_q = cu_q.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert_eq!(message(), rust_error(&[0, 3, 2], &batch.cu_k));
    assert!(message().starts_with("cu_seqlens_q[2]"), "{}", message());
    let cu_k = [0i32, 6, 5];
    let mut a = packed;
    a.cu_seqlens_k = cu_k.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert_eq!(message(), rust_error(&batch.cu_q, &[0, 6, 5]));
    assert!(message().starts_with("cu_seqlens_k[2]"), "{}", message());
    // Past the packed rows; the wrong number of key offsets.
    let cu_k = [0i32, 5, 12];
    a.cu_seqlens_k = cu_k.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    a.cu_seqlens_k_len = 2;
    assert_eq!(call(&a, &o), SdpaStatus::LengthMismatch);
    assert!(message().starts_with("cu_seqlens_k"), "{}", message());

    // Negative offsets: converted with a check, a typed error naming the entry.
    let cu_q = [0i32, -2, 5];
    let mut a = packed;
    a.cu_seqlens_q = cu_q.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert_eq!(message(), "cu_seqlens_q[1]: offset is negative");
    let cu_k = [0i32, 5, i32::MIN];
    let mut a = packed;
    a.cu_seqlens_k = cu_k.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert_eq!(message(), "cu_seqlens_k[2]: offset is negative");

    // Empty / NULL offsets.
    let mut a = packed;
    a.cu_seqlens_q = ptr::null();
    assert_eq!(call(&a, &o), SdpaStatus::NullPointer);
    assert!(message().contains("cu_seqlens_q"), "{}", message());
    a.cu_seqlens_q_len = 0;
    assert_eq!(call(&a, &o), SdpaStatus::LengthMismatch);
    let mut a = packed;
    a.cu_seqlens_k = ptr::null();
    assert_eq!(call(&a, &o), SdpaStatus::NullPointer);

    // Layouts: unknown; fields of the other layout set.
    let mut a = packed;
    a.kv_layout = 2;
    assert_eq!(call(&a, &o), SdpaStatus::InvalidArgument);
    assert!(message().contains("kv_layout"), "{}", message());
    let mut a = packed;
    a.pages_per_seq = 1;
    assert_eq!(call(&a, &o), SdpaStatus::InvalidArgument);
    let mut a = paged;
    a.cu_seqlens_k = batch.cu_k32.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidArgument);

    // Paged K/V: key lengths required, table entries checked.
    assert_eq!(call(&paged, &o), SdpaStatus::LengthMismatch);
    assert!(message().starts_with("kv_lens"), "{}", message());
    o.kv_lens = batch.k_lens.as_ptr();
    o.kv_lens_len = batch.k_lens.len();
    assert_eq!(call(&paged, &o), SdpaStatus::Ok, "{}", message());
    let mut table = batch.cache.table.clone();
    table[0] = 1000;
    let mut a = paged;
    a.block_table = table.as_ptr();
    assert_eq!(call(&a, &o), SdpaStatus::InvalidValue);
    assert!(message().starts_with("block table[0]"), "{}", message());

    // Batch dim of Q not 1; the LSE of the wrong length; outputs over the offsets.
    let mut a = packed;
    a.q.dims[0] = 2;
    a.q.strides[0] = 0; // a broadcast batch: stays inside the buffer
    assert_eq!(call(&a, &no_options()), SdpaStatus::ShapeMismatch);
    let mut a = packed;
    a.lse_len = total_q;
    assert_eq!(call(&a, &no_options()), SdpaStatus::LengthMismatch);
    let mut a = packed;
    a.lse = batch.cu_q32.as_ptr() as *mut f32;
    a.lse_len = 2;
    assert_eq!(call(&a, &no_options()), SdpaStatus::AliasedBuffers);
    let mut a = packed;
    a.size = std::mem::size_of::<SdpaPagedArgs>();
    assert_eq!(call(&a, &no_options()), SdpaStatus::InvalidStructSize);
}

fn rope_of(positions: &[u32], style: u32, rotary_dim: usize) -> SdpaRope {
    SdpaRope {
        size: std::mem::size_of::<SdpaRope>(),
        style,
        rotary_dim,
        theta: 10_000.0,
        cos: ptr::null(),
        sin: ptr::null(),
        table_len: 0,
        positions: positions.as_ptr(),
        positions_len: positions.len(),
    }
}

/// `sdpa_append` and `sdpa_rope_apply` give the Rust `append` and `Rope::apply`'s bits: f32 rows
/// into f16 pages with RoPE (halves), into int8 pages with their scales (pairs, partial rotary
/// dimension), Q rotated in place; and their errors are statuses with nothing written.
#[test]
fn append_and_rope_match_the_rust_api() {
    use sdpa::{append, Rope, RopeStyle};
    let (pages, page, n) = (4, 4, 5);
    let pool = [pages, page, HKV, D];
    let k = data(n * HKV * D, 31);
    let v = data(n * HKV * D, 32);
    let slots = [13usize, 2, 7, 0, 15];
    let positions = [3u32, 9, 0, 4, 1];
    let rows = [1, n, HKV, D];
    // f32 rows into f16 pages, K rotated (halves).
    let mut kc = vec![f16::from_f32(9.0); pages * page * HKV * D];
    let mut vc = kc.clone();
    let (mut kr, mut vr) = (kc.clone(), kc.clone());
    let rope = rope_of(&positions, SDPA_ROPE_HALVES, D);
    let args = |kc: &mut [f16], vc: &mut [f16]| SdpaAppendArgs {
        size: std::mem::size_of::<SdpaAppendArgs>(),
        rows_dtype: SDPA_DTYPE_F32,
        k: tensor(&k, rows, contiguous(rows)),
        v: tensor(&v, rows, contiguous(rows)),
        cache_dtype: SDPA_DTYPE_F16,
        k_cache: tensor_mut(kc, pool),
        v_cache: tensor_mut(vc, pool),
        slots: slots.as_ptr(),
        slots_len: slots.len(),
        k_scales: tensor_mut::<f32>(&mut [], [0; 4]),
        v_scales: tensor_mut::<f32>(&mut [], [0; 4]),
        scales_given: 0,
    };
    let mut a = args(&mut kc, &mut vc);
    a.k_scales.data = ptr::null_mut();
    a.v_scales.data = ptr::null_mut();
    // SAFETY: every pointer is valid for its dims or length.
    assert_eq!(
        unsafe { sdpa_append(&a, &rope) },
        SdpaStatus::Ok,
        "{}",
        message()
    );
    let r = Rope::new(RopeStyle::Halves, D, 10_000.0);
    append(
        &Tensor::bshd(&k, rows).unwrap(),
        &Tensor::bshd(&v, rows).unwrap(),
        &mut TensorMut::bshd(&mut kr, pool).unwrap(),
        &mut TensorMut::bshd(&mut vr, pool).unwrap(),
        &slots,
        None,
        Some((&r, &positions)),
    )
    .unwrap();
    assert_eq!(bits(&kc), bits(&kr));
    assert_eq!(bits(&vc), bits(&vr));

    // int8 pages with scales, pairs over half the channels.
    let mut k8 = vec![0i8; pages * page * HKV * D];
    let mut v8 = k8.clone();
    let mut ks = vec![0f32; pages * page * HKV];
    let mut vs = ks.clone();
    let (mut k8r, mut v8r, mut ksr, mut vsr) = (k8.clone(), v8.clone(), ks.clone(), vs.clone());
    let scale_dims = [pages, page, HKV, 1];
    let rope = rope_of(&positions, SDPA_ROPE_INTERLEAVED, D / 2);
    let a = SdpaAppendArgs {
        size: std::mem::size_of::<SdpaAppendArgs>(),
        rows_dtype: SDPA_DTYPE_F32,
        k: tensor(&k, rows, contiguous(rows)),
        v: tensor(&v, rows, contiguous(rows)),
        cache_dtype: SDPA_DTYPE_I8,
        k_cache: tensor_mut(&mut k8, pool),
        v_cache: tensor_mut(&mut v8, pool),
        slots: slots.as_ptr(),
        slots_len: slots.len(),
        k_scales: tensor_mut(&mut ks, scale_dims),
        v_scales: tensor_mut(&mut vs, scale_dims),
        scales_given: 0,
    };
    // SAFETY: as above.
    assert_eq!(
        unsafe { sdpa_append(&a, &rope) },
        SdpaStatus::Ok,
        "{}",
        message()
    );
    let r = Rope::new(RopeStyle::Interleaved, D / 2, 10_000.0);
    append(
        &Tensor::bshd(&k, rows).unwrap(),
        &Tensor::bshd(&v, rows).unwrap(),
        &mut TensorMut::bshd(&mut k8r, pool).unwrap(),
        &mut TensorMut::bshd(&mut v8r, pool).unwrap(),
        &slots,
        Some((
            &mut TensorMut::bshd(&mut ksr, scale_dims).unwrap(),
            &mut TensorMut::bshd(&mut vsr, scale_dims).unwrap(),
        )),
        Some((&r, &positions)),
    )
    .unwrap();
    assert_eq!((&k8, &v8), (&k8r, &v8r));
    assert_eq!(bits(&ks), bits(&ksr));
    assert_eq!(bits(&vs), bits(&vsr));

    // Q rotated in place.
    let mut q = data(n * H * D, 33);
    let mut qr = q.clone();
    let x = tensor_mut(&mut q, [1, n, H, D]);
    let rope = rope_of(&positions, SDPA_ROPE_HALVES, D);
    // SAFETY: valid pointers.
    assert_eq!(
        unsafe { sdpa_rope_apply(SDPA_DTYPE_F32, &x, &rope) },
        SdpaStatus::Ok,
        "{}",
        message()
    );
    Rope::new(RopeStyle::Halves, D, 10_000.0)
        .apply(
            &mut TensorMut::bshd(&mut qr, [1, n, H, D]).unwrap(),
            &positions,
        )
        .unwrap();
    assert_eq!(bits(&q), bits(&qr));

    // Errors: statuses, nothing written.
    let before = q.clone();
    let x = tensor_mut(&mut q, [1, n, H, D]);
    let mut bad = rope_of(&positions, 7, D);
    // SAFETY: valid pointers (NULL arrays are checked).
    let status = unsafe { sdpa_rope_apply(SDPA_DTYPE_F32, &x, &bad) };
    assert_eq!(status, SdpaStatus::InvalidArgument);
    bad = rope_of(&positions, SDPA_ROPE_HALVES, D);
    bad.positions = ptr::null();
    // SAFETY: as above.
    let status = unsafe { sdpa_rope_apply(SDPA_DTYPE_F32, &x, &bad) };
    assert_eq!(status, SdpaStatus::NullPointer);
    bad = rope_of(&positions[..4], SDPA_ROPE_HALVES, D);
    // SAFETY: as above.
    let status = unsafe { sdpa_rope_apply(SDPA_DTYPE_F32, &x, &bad) };
    assert_ne!(status, SdpaStatus::Ok);
    assert!(message().contains("positions"), "{}", message());
    assert_eq!(bits(&q), bits(&before));
    let mut kc2 = vec![f16::from_f32(9.0); pages * page * HKV * D];
    let mut vc2 = kc2.clone();
    let twice = [1usize, 2, 1, 3, 4];
    let mut a = args(&mut kc2, &mut vc2);
    a.k_scales.data = ptr::null_mut();
    a.v_scales.data = ptr::null_mut();
    a.slots = twice.as_ptr();
    // SAFETY: as above.
    assert_ne!(unsafe { sdpa_append(&a, ptr::null()) }, SdpaStatus::Ok);
    assert!(kc2.iter().chain(&vc2).all(|x| x.to_f32() == 9.0));
    // The cache over the new rows: aliasing.
    let mut a = args(&mut kc2, &mut vc2);
    a.k_scales.data = ptr::null_mut();
    a.v_scales.data = ptr::null_mut();
    a.v_cache.data = k.as_ptr() as *mut _;
    // SAFETY: as above (the call rejects the aliasing before writing).
    assert_eq!(
        unsafe { sdpa_append(&a, ptr::null()) },
        SdpaStatus::AliasedBuffers
    );
}
