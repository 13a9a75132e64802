//! Paged K/V caches and packed variable-length batches.
//!
//! * Paged: `attention_paged` equals `attention_lse` on the same keys stored densely, bitwise
//!   (same blocking: the logical buffer of a sequence is its pages), for every option, page
//!   sizes 1, 3, 16 and 128, shuffled pages, a prefix page shared by two sequences, both pool
//!   layouts, f32 and f16 caches, and any thread count.
//! * Varlen: each sequence of `attention_varlen` (K/V packed or paged) is within the derived
//!   error bound of the f64 reference run on that sequence alone, and bitwise the same on one
//!   thread as on the global pool, for every option, with
//!   sequences of length 0, rows that see no key, decode rows next to prefill chunks; a batch
//!   of one sequence equals the dense call bitwise.
//! * Errors: invalid tables and offsets are typed errors and nothing is written.

use sdpa::half::{bf16, f16};
use sdpa::{
    Alignment, Element, Error, Operand, Options, PackedKv, PagedKv, Tensor, TensorMut, VarlenKv,
};

use crate::support;
use support::harness::Views;
use support::harness::{assert_within_bounds, bounds_views, run_views, Layout, Outputs, Path};
use support::values::SplitMix;

fn values(len: usize, seed: u64) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
}

/// A deterministic permutation of `0..n`.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let r = values(n, seed);
    for i in (1..n).rev() {
        let j = ((r[i] + 1.0) * 0.5 * (i + 1) as f32) as usize;
        p.swap(i, j.min(i));
    }
    p
}

/// The options every composition test runs, over `[b, n_q, h, n_kv]` bias/mask dims.
struct OptionData {
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    bias: Vec<f32>,
    mask: Vec<bool>,
    dims: [usize; 4],
}

impl OptionData {
    fn new(dims: [usize; 4]) -> Self {
        let n = dims.iter().product();
        OptionData {
            slopes: sdpa::alibi_slopes(dims[2]).unwrap(),
            sinks: values(dims[2], 91),
            bias: values(n, 92).iter().map(|x| 2.0 * x).collect(),
            mask: values(n, 93).iter().map(|x| *x > -0.6).collect(),
            dims,
        }
    }

    /// The option sets, with key lengths `kv_lens`; bias and mask are `views` if given, else
    /// the whole tensors.
    fn list<'a>(
        &'a self,
        kv_lens: Option<&'a [usize]>,
        views: Option<(Tensor<'a, f32>, Tensor<'a, bool>)>,
    ) -> Vec<(&'static str, Options<'a>)> {
        let br = Alignment::BottomRight;
        let base = || match kv_lens {
            Some(l) => Options::new().kv_lens(l),
            None => Options::new(),
        };
        let (bias, mask) = views.unwrap_or_else(|| {
            (
                Tensor::bshd(&self.bias, self.dims).unwrap(),
                Tensor::bshd(&self.mask, self.dims).unwrap(),
            )
        });
        vec![
            ("plain", base()),
            ("causal", base().causal(br)),
            ("causal top-left", base().causal(Alignment::TopLeft)),
            ("window", base().sliding_window(40, 3, br)),
            ("alibi", base().alibi(&self.slopes, br)),
            ("softcap", base().softcap(1.5).scale(2.0)),
            ("sinks", base().sinks(&self.sinks).causal(br)),
            ("bias", base().bias(bias)),
            ("mask", base().mask(mask).causal(br)),
        ]
    }

    /// The bias and mask of sequence `s` alone: views of its `[n_q, H, n_kv]` corner.
    fn sequence_views(
        &self,
        s: usize,
        n_q: usize,
        n_kv: usize,
    ) -> (Tensor<'_, f32>, Tensor<'_, bool>) {
        let [_, nq, h, nk] = self.dims;
        let strides = [nq * h * nk, h * nk, nk, 1];
        let dims = [1, n_q, h, n_kv];
        let at = s * strides[0];
        (
            Tensor::new(&self.bias[at..], dims, strides).unwrap(),
            Tensor::new(&self.mask[at..], dims, strides).unwrap(),
        )
    }
}

/// A paged copy of dense `[b, cap, h_kv, d]` keys/values: `pps` pages per sequence in a
/// shuffled pool with two spare pages, sequence 1 sharing sequence 0's first page (its dense
/// keys are made equal there), table entries past each length set to garbage.
struct Paged {
    k_pool: Vec<f32>,
    v_pool: Vec<f32>,
    table: Vec<u32>,
    pages: usize,
}

fn page_out(
    k: &mut [f32],
    v: &mut [f32],
    dims: [usize; 4],
    page_size: usize,
    lens: &[usize],
    head_major: bool,
) -> Paged {
    let [b, cap, h_kv, d] = dims;
    let pps = cap / page_size;
    let row = h_kv * d;
    if b > 1 && pps > 0 {
        // Shared prefix: sequence 1's first page is sequence 0's.
        let (k0, k1) = k.split_at_mut(cap * row);
        k1[..page_size * row].copy_from_slice(&k0[..page_size * row]);
        let (v0, v1) = v.split_at_mut(cap * row);
        v1[..page_size * row].copy_from_slice(&v0[..page_size * row]);
    }
    let pages = b * pps + 2;
    let order = shuffled(pages, 7 + page_size as u64);
    let mut table = vec![0u32; b * pps];
    let mut k_pool = vec![f32::NAN; pages * page_size * row];
    let mut v_pool = vec![f32::NAN; pages * page_size * row];
    for s in 0..b {
        for p in 0..pps {
            let page = if s == 1 && p == 0 {
                table[0] as usize
            } else {
                order[s * pps + p]
            };
            let used = lens[s].div_ceil(page_size);
            table[s * pps + p] = if p < used || (s == 1 && p == 0) {
                page as u32
            } else {
                u32::MAX - p as u32 // never read: past the sequence's length
            };
            for t in 0..page_size {
                for hh in 0..h_kv {
                    let src = ((s * cap + p * page_size + t) * h_kv + hh) * d;
                    let dst = if head_major {
                        ((page * h_kv + hh) * page_size + t) * d
                    } else {
                        ((page * page_size + t) * h_kv + hh) * d
                    };
                    k_pool[dst..dst + d].copy_from_slice(&k[src..src + d]);
                    v_pool[dst..dst + d].copy_from_slice(&v[src..src + d]);
                }
            }
        }
    }
    Paged {
        k_pool,
        v_pool,
        table,
        pages,
    }
}

fn to<T: Element>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f32(v)).collect()
}

fn paged_matches_dense<KV: Element>(page_size: usize, n_q: usize, head_major: bool) {
    paged_matches_dense_at::<f32, KV>(3, 260, page_size, n_q, head_major, false)
}

/// [`paged_matches_dense`] with `b` sequences of about `keys` keys, Q of type `Q`, every option
/// set with [`Options::bf16_products`] too if `bf16_products`.
fn paged_matches_dense_at<Q: Element, KV: Element>(
    b: usize,
    keys: usize,
    page_size: usize,
    n_q: usize,
    head_major: bool,
    bf16_products: bool,
) {
    let (h, h_kv, d) = (4, 2, 32);
    let pps = keys.div_ceil(page_size);
    let cap = pps * page_size;
    let lens = [cap.min(37), cap.min(250), cap - 1][..b].to_vec();
    let q = to::<Q>(&values(b * n_q * h * d, 1));
    let mut k = values(b * cap * h_kv * d, 2);
    let mut v = values(b * cap * h_kv * d, 3);
    let paged = page_out(
        &mut k,
        &mut v,
        [b, cap, h_kv, d],
        page_size,
        &lens,
        head_major,
    );
    let (k, v) = (to::<KV>(&k), to::<KV>(&v));
    let (k_pool, v_pool) = (to::<KV>(&paged.k_pool), to::<KV>(&paged.v_pool));
    let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
    let kd = Tensor::bshd(&k, [b, cap, h_kv, d]).unwrap();
    let vd = Tensor::bshd(&v, [b, cap, h_kv, d]).unwrap();
    let pool = |x| {
        if head_major {
            Tensor::bhsd(x, [paged.pages, h_kv, page_size, d]).unwrap()
        } else {
            Tensor::bshd(x, [paged.pages, page_size, h_kv, d]).unwrap()
        }
    };
    let kv = PagedKv::new(pool(&k_pool), pool(&v_pool), &paged.table, pps).unwrap();
    let data = OptionData::new([b, n_q, h, cap]);
    for (name, opts) in data.list(Some(&lens), None) {
        let opts = if bf16_products {
            opts.bf16_products()
        } else {
            opts
        };
        let n_out = b * n_q * h * d;
        let (mut want, mut want_lse) = (vec![0.0f32; n_out], vec![0.0f32; b * h * n_q]);
        let mut ov = TensorMut::bshd(&mut want, [b, n_q, h, d]).unwrap();
        sdpa::attention_lse(&qv, &kd, &vd, &mut ov, &mut want_lse, &opts).unwrap();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (mut got, mut got_lse) = (vec![9.0f32; n_out], vec![9.0f32; b * h * n_q]);
            let mut ov = TensorMut::bshd(&mut got, [b, n_q, h, d]).unwrap();
            pool.install(|| sdpa::attention_paged(&qv, &kv, &mut ov, Some(&mut got_lse), &opts))
                .unwrap();
            let what = format!(
                "page {page_size}, n_q {n_q}, head-major {head_major}, {name}, {threads} threads, \
                 bf16 products {bf16_products}"
            );
            assert_eq!(bits(&got), bits(&want), "out: {what}");
            assert_eq!(bits(&got_lse), bits(&want_lse), "lse: {what}");
        }
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn paged_equals_dense_bitwise() {
    for page_size in [1, 3, 16, 128] {
        for n_q in [1, 6] {
            paged_matches_dense::<f32>(page_size, n_q, false);
        }
    }
    paged_matches_dense::<f32>(16, 6, true);
    paged_matches_dense::<f16>(16, 1, false);
    paged_matches_dense::<f16>(128, 6, true);
    // Decode split over keys (few work items, long sequences).
    paged_matches_dense_at::<f32, f32>(2, 6000, 16, 1, false, false);
    // bf16 dot products in decode pair the keys two by two, across page boundaries too (odd
    // page sizes split pairs): the sums must still be the dense cache's.
    for (page_size, head_major) in [(3, false), (16, true), (1, false)] {
        paged_matches_dense_at::<bf16, bf16>(3, 260, page_size, 1, head_major, true);
    }
    paged_matches_dense_at::<bf16, bf16>(2, 6000, 16, 1, false, true);
}

/// A packed batch: query and key lengths per sequence.
struct Batch {
    q_lens: Vec<usize>,
    kv_lens: Vec<usize>,
}

impl Batch {
    fn offsets(lens: &[usize]) -> Vec<usize> {
        let mut cu = vec![0];
        for l in lens {
            cu.push(cu.last().unwrap() + l);
        }
        cu
    }
}

/// Runs the batch packed (K/V packed, and paged with page size 16) and checks every sequence
/// against the reference on that sequence alone, within its bound.
fn varlen_matches_reference(batch: &Batch, h: usize, h_kv: usize, d: usize) {
    let nb = batch.q_lens.len();
    let (cu_q, cu_k) = (
        Batch::offsets(&batch.q_lens),
        Batch::offsets(&batch.kv_lens),
    );
    let (total_q, total_kv) = (cu_q[nb], cu_k[nb]);
    let max_q = *batch.q_lens.iter().max().unwrap();
    let max_kv = *batch.kv_lens.iter().max().unwrap();
    let q = values(total_q * h * d, 11);
    let k = values(total_kv * h_kv * d, 12);
    let v = values(total_kv * h_kv * d, 13);
    let qv = Tensor::bshd(&q, [1, total_q, h, d]).unwrap();
    let packed = PackedKv::new(
        Tensor::bshd(&k, [1, total_kv, h_kv, d]).unwrap(),
        Tensor::bshd(&v, [1, total_kv, h_kv, d]).unwrap(),
        &cu_k,
    );
    // The same keys in pages of 16 (sequence b's pages in order b·pps ..).
    let page_size = 16;
    let pps = max_kv.div_ceil(page_size);
    let row = h_kv * d;
    let mut k_pool = vec![0.0f32; nb * pps * page_size * row];
    let mut v_pool = k_pool.clone();
    for (s, (&start, &len)) in cu_k.iter().zip(&batch.kv_lens).enumerate() {
        let (src, dst) = (start * row, s * pps * page_size * row);
        let n = len * row;
        k_pool[dst..dst + n].copy_from_slice(&k[src..src + n]);
        v_pool[dst..dst + n].copy_from_slice(&v[src..src + n]);
    }
    let table: Vec<u32> = (0..(nb * pps) as u32).collect();
    let pool_dims = [nb * pps, page_size, h_kv, d];
    let paged = PagedKv::new(
        Tensor::bshd(&k_pool, pool_dims).unwrap(),
        Tensor::bshd(&v_pool, pool_dims).unwrap(),
        &table,
        pps,
    )
    .unwrap();
    let data = OptionData::new([nb, max_q, h, max_kv]);
    for (index, (name, opts)) in data.list(None, None).into_iter().enumerate() {
        for (kind, kv) in [("packed", VarlenKv::from(packed)), ("paged", paged.into())] {
            // Paged keys need their lengths; packed ones have them in the offsets.
            let opts = match kind {
                "paged" => opts.clone().kv_lens(&batch.kv_lens),
                _ => opts.clone(),
            };
            let (mut out, mut lse) = (vec![9.0f32; total_q * h * d], vec![9.0f32; h * total_q]);
            let mut ov = TensorMut::bshd(&mut out, [1, total_q, h, d]).unwrap();
            sdpa::attention_varlen(&qv, &cu_q, &kv, &mut ov, Some(&mut lse), &opts).unwrap();
            // Any thread count: the same bits.
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let (mut out1, mut lse1) = (vec![9.0f32; out.len()], vec![9.0f32; lse.len()]);
            let mut ov = TensorMut::bshd(&mut out1, [1, total_q, h, d]).unwrap();
            one.install(|| {
                sdpa::attention_varlen(&qv, &cu_q, &kv, &mut ov, Some(&mut lse1), &opts)
            })
            .unwrap();
            assert_eq!(
                bits(&out1),
                bits(&out),
                "{kind} {name}: 1 thread vs the global pool"
            );
            assert_eq!(
                bits(&lse1),
                bits(&lse),
                "{kind} {name}: 1 thread vs the global pool"
            );
            for s in 0..nb {
                let (n_q, n_kv) = (batch.q_lens[s], batch.kv_lens[s]);
                let views = data.sequence_views(s, n_q, n_kv);
                let alone = data.list(None, Some(views)).swap_remove(index).1;
                let seq = Seq {
                    q: &q[cu_q[s] * h * d..],
                    k: &k[cu_k[s] * row..],
                    v: &v[cu_k[s] * row..],
                    n_q,
                    n_kv,
                    h,
                    h_kv,
                    d,
                    out: &out[cu_q[s] * h * d..],
                    lse: (&lse, total_q, cu_q[s]),
                };
                check_sequence(&alone, &format!("{kind} {name}, sequence {s}"), seq);
            }
        }
    }
}

/// One sequence's data and its packed results.
struct Seq<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    n_q: usize,
    n_kv: usize,
    h: usize,
    h_kv: usize,
    d: usize,
    out: &'a [f32],
    /// The packed LSE `[H, total_q]`, `total_q`, and the sequence's first packed row.
    lse: (&'a [f32], usize, usize),
}

/// The sequence's packed rows and LSE against the reference run on the sequence alone, every
/// row through the one checker (inputs finite: within the bound; a row with no visible key
/// exactly 0 with lse −∞ on both paths, or σ within the bound where there is a sink).
fn check_sequence(opts: &Options<'_>, what: &str, x: Seq<'_>) {
    let Seq {
        n_q,
        n_kv,
        h,
        h_kv,
        d,
        ..
    } = x;
    let views = Views {
        q: Tensor::bshd(&x.q[..n_q * h * d], [1, n_q, h, d]).unwrap(),
        k: Tensor::bshd(&x.k[..n_kv * h_kv * d], [1, n_kv, h_kv, d]).unwrap(),
        v: Tensor::bshd(&x.v[..n_kv * h_kv * d], [1, n_kv, h_kv, d]).unwrap(),
    };
    let reference = run_views(Path::Reference, &views, Layout::BSHD, opts);
    let bounds = bounds_views(&views, opts);
    let (lse, total_q, first) = x.lse;
    let fused = Outputs {
        dims: reference.dims,
        out: x.out[..n_q * h * d].to_vec(),
        lse: (0..h)
            .flat_map(|hh| (0..n_q).map(move |i| lse[hh * total_q + first + i]))
            .collect(),
    };
    assert_within_bounds(&fused, &reference, &bounds, what);
}

#[test]
fn varlen_matches_each_sequence_alone() {
    // Prefill chunks, an empty sequence, decode rows against long caches, and a sequence with
    // more query rows than keys (its first rows see nothing bottom-right).
    let batch = Batch {
        q_lens: vec![17, 0, 1, 40, 1, 9, 7],
        kv_lens: vec![17, 5, 320, 140, 1, 0, 3], // longest: whole pages of 16, so bias dims fit both kinds
    };
    varlen_matches_reference(&batch, 4, 2, 32);
    varlen_matches_reference(&batch, 2, 2, 8);
    // Decode rows only: few work items, split over keys.
    let decode = Batch {
        q_lens: vec![1, 2],
        kv_lens: vec![4000, 2496],
    };
    varlen_matches_reference(&decode, 4, 1, 32);
}

#[test]
fn varlen_of_one_sequence_equals_dense_bitwise() {
    let (n_q, n_kv, h, h_kv, d) = (37, 90, 4, 1, 16);
    let q = values(n_q * h * d, 21);
    let k = values(n_kv * h_kv * d, 22);
    let v = values(n_kv * h_kv * d, 23);
    let qv = Tensor::bshd(&q, [1, n_q, h, d]).unwrap();
    let kd = Tensor::bshd(&k, [1, n_kv, h_kv, d]).unwrap();
    let vd = Tensor::bshd(&v, [1, n_kv, h_kv, d]).unwrap();
    let data = OptionData::new([1, n_q, h, n_kv]);
    for (name, opts) in data.list(None, None) {
        let (mut want, mut want_lse) = (vec![0.0f32; n_q * h * d], vec![0.0f32; h * n_q]);
        let mut ov = TensorMut::bshd(&mut want, [1, n_q, h, d]).unwrap();
        sdpa::attention_lse(&qv, &kd, &vd, &mut ov, &mut want_lse, &opts).unwrap();
        let (mut got, mut got_lse) = (vec![0.0f32; n_q * h * d], vec![0.0f32; h * n_q]);
        let mut ov = TensorMut::bshd(&mut got, [1, n_q, h, d]).unwrap();
        let cu_k = [0, n_kv];
        let kv = VarlenKv::from(PackedKv::new(kd, vd, &cu_k));
        sdpa::attention_varlen(&qv, &[0, n_q], &kv, &mut ov, Some(&mut got_lse), &opts).unwrap();
        assert_eq!(bits(&got), bits(&want), "{name}");
        assert_eq!(bits(&got_lse), bits(&want_lse), "{name}");
    }
}

#[test]
fn empty_batches_and_sequences() {
    let (h, d) = (2, 8);
    let k = values(4 * h * d, 31);
    let kd = Tensor::bshd(&k, [1, 4, h, d]).unwrap();
    // total_q = 0: nothing to do.
    let q: Vec<f32> = Vec::new();
    let qv = Tensor::bshd(&q, [1, 0, h, d]).unwrap();
    let mut out: Vec<f32> = Vec::new();
    let mut ov = TensorMut::bshd(&mut out, [1, 0, h, d]).unwrap();
    let kv = VarlenKv::from(PackedKv::new(kd, kd, &[0, 2, 4]));
    sdpa::attention_varlen(&qv, &[0, 0, 0], &kv, &mut ov, None, &Options::new()).unwrap();
    // A batch of no sequences.
    let kv0 = VarlenKv::from(PackedKv::new(kd, kd, &[0]));
    sdpa::attention_varlen(&qv, &[0], &kv0, &mut ov, Some(&mut []), &Options::new()).unwrap();
    // Rows past the last sequence and keys of length 0: untouched / zero with lse −∞.
    let q = values(3 * h * d, 32);
    let qv = Tensor::bshd(&q, [1, 3, h, d]).unwrap();
    let mut out = vec![7.0f32; 3 * h * d];
    let mut lse = vec![7.0f32; h * 3];
    let mut ov = TensorMut::bshd(&mut out, [1, 3, h, d]).unwrap();
    let kv = VarlenKv::from(PackedKv::new(kd, kd, &[0, 0, 4]));
    let opts = Options::new().causal(Alignment::BottomRight);
    sdpa::attention_varlen(&qv, &[0, 1, 2], &kv, &mut ov, Some(&mut lse), &opts).unwrap();
    assert!(
        out[..h * d].iter().all(|&x| x == 0.0),
        "sequence 0 has no keys"
    );
    assert_eq!(lse[0], f32::NEG_INFINITY);
    assert_eq!(lse[3], f32::NEG_INFINITY);
    assert!(out[h * d..2 * h * d]
        .iter()
        .all(|x| x.is_finite() && *x != 7.0));
    assert!(
        out[2 * h * d..].iter().all(|&x| x == 7.0),
        "row 2 is in no sequence"
    );
    assert_eq!((lse[2], lse[5]), (7.0, 7.0));
}

#[test]
fn invalid_tables_and_offsets_are_errors() {
    let (b, h, d, page) = (2, 2, 8, 4);
    let pool = values(3 * page * h * d, 41);
    let pv = Tensor::bshd(&pool, [3, page, h, d]).unwrap();
    let q = values(b * h * d, 42);
    let qv = Tensor::bshd(&q, [b, 1, h, d]).unwrap();
    let mut out = vec![5.0f32; b * h * d];
    let lens = [8usize, 5];
    let opts = Options::new().kv_lens(&lens);
    let run = |table: &[u32], pps: usize, opts: &Options<'_>, out: &mut [f32]| {
        let kv = PagedKv::new(pv, pv, table, pps)?;
        let mut ov = TensorMut::bshd(out, [b, 1, h, d]).unwrap();
        sdpa::attention_paged(&qv, &kv, &mut ov, None, opts)
    };
    let invalid = |index, reason: &str| {
        let _ = reason;
        move |e: Error| matches!(e, Error::InvalidValue { operand: Operand::BlockTable, index: i, .. } if i == index)
    };
    // Sequence 1 needs 2 pages (5 keys): its second entry is past the pool.
    let e = run(&[0, 1, 2, 3], 2, &opts, &mut out).unwrap_err();
    assert!(invalid(3, "")(e.clone()), "{e:?}");
    // Entries past a sequence's length are not read.
    run(&[0, 1, 2, 1, 2, 99], 3, &opts, &mut out).unwrap();
    out.fill(5.0);
    // Table length, page size 0, key length past the capacity.
    let e = run(&[0, 1, 2], 3, &opts, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                operand: Operand::BlockTable,
                expected: 6,
                got: 3
            }
        ),
        "{e:?}"
    );
    let e = run(&[0, 1, 2], 2, &opts, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidValue {
                operand: Operand::BlockTable,
                ..
            }
        ),
        "{e:?}"
    );
    let e = run(&[0, 1], 1, &opts, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidValue {
                operand: Operand::KvLens,
                index: 0,
                ..
            }
        ),
        "{e:?}"
    );
    // Paged calls need key lengths (a padded table row is no length).
    let e = run(&[0, 1, 2, 1, 2, 0], 3, &Options::new(), &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                operand: Operand::KvLens,
                expected: 2,
                got: 0
            }
        ),
        "{e:?}"
    );
    let empty: Vec<f32> = Vec::new();
    let zero = Tensor::bshd(&empty, [3, 0, h, d]).unwrap();
    let e = PagedKv::new(zero, zero, &[], 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidValue {
                operand: Operand::BlockTable,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(out.iter().all(|&x| x == 5.0), "nothing written on error");

    // Offsets.
    let k = values(6 * h * d, 43);
    let kd = Tensor::bshd(&k, [1, 6, h, d]).unwrap();
    let qp = values(4 * h * d, 44);
    let qv = Tensor::bshd(&qp, [1, 4, h, d]).unwrap();
    let mut out = vec![5.0f32; 4 * h * d];
    let cases: [(&[usize], &[usize], Operand); 5] = [
        (&[0, 3, 2], &[0, 3, 6], Operand::CuSeqlensQ),
        (&[0, 2, 5], &[0, 3, 6], Operand::CuSeqlensQ),
        (&[0, 2, 4], &[0, 4, 3], Operand::CuSeqlensK),
        (&[0, 2, 4], &[0, 3, 7], Operand::CuSeqlensK),
        (&[0, 2, 4], &[0, 6], Operand::CuSeqlensK),
    ];
    for (cu_q, cu_k, operand) in cases {
        let kv = VarlenKv::from(PackedKv::new(kd, kd, cu_k));
        let mut ov = TensorMut::bshd(&mut out, [1, 4, h, d]).unwrap();
        let e = sdpa::attention_varlen(&qv, cu_q, &kv, &mut ov, None, &Options::new()).unwrap_err();
        let op = match e {
            Error::InvalidValue { operand, .. } | Error::LengthMismatch { operand, .. } => operand,
            ref other => panic!("{other:?}"),
        };
        assert_eq!(op, operand, "{cu_q:?} {cu_k:?}: {e}");
    }
    let e = sdpa::attention_varlen(
        &qv,
        &[],
        &VarlenKv::from(PackedKv::new(kd, kd, &[0])),
        &mut TensorMut::bshd(&mut out, [1, 4, h, d]).unwrap(),
        None,
        &Options::new(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                operand: Operand::CuSeqlensQ,
                ..
            }
        ),
        "{e:?}"
    );
    // A batch dim other than 1.
    let q2 = Tensor::bshd(&qp, [2, 2, h, d]).unwrap();
    let kv = VarlenKv::from(PackedKv::new(kd, kd, &[0, 3, 6]));
    let mut ov = TensorMut::bshd(&mut out, [1, 4, h, d]).unwrap();
    let e =
        sdpa::attention_varlen(&q2, &[0, 1, 2], &kv, &mut ov, None, &Options::new()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                operand: Operand::Query,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(out.iter().all(|&x| x == 5.0), "nothing written on error");
}
