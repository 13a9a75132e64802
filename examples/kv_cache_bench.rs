//! Paged and packed-batch throughput against their dense counterparts, measured as ratios in
//! one run (the two sides alternate `--rounds` times; medians compared).
//!
//! ```text
//! cargo run --release --example kv_cache_bench -- --threads 1
//! ```
//! 1. Paged decode: B = 8 sequences of mixed lengths (1k…16k keys, 52k in all), H = 32,
//!    H_kv = 8, d = 128, f32 K/V (430 MB, beyond the L3), one query row each, causal
//!    bottom-right. Dense: a preallocated `[B, 16384, H_kv, d]` cache with `kv_lens`. Paged:
//!    the same keys in shuffled pages of 16 and of 128 tokens. Reports paged time / dense time.
//! 2. A packed batch: prefill chunks of 17, 300, 2048 and 5000 tokens (causal, keys = the
//!    chunk) plus 8 decode rows against 4096-key caches, H = 32, H_kv = 8, d = 128, in one
//!    `attention_varlen` call (K/V packed), against one dense call per sequence. Reports the
//!    summed per-sequence time / the packed call's time (above 1: the packed call is faster).
//! 3. The same for one step of a continuous-batching server: 16 prompt chunks of 17–300 rows
//!    against caches of up to ~1000 keys, and 48 decode rows against 512–4096 keys.
//!
//! 4. A step's plan against today's calls: 64 decode rows against 64–512 keys in 16-token
//!    pages (f16 pools), and against 1–16 keys (where the call's own costs show), one
//!    [`Plan`] per step run for each of 8 layers, against one `attention_varlen` call per
//!    layer (both with a workspace). Reports per-layer times, and per-layer overheads: what a
//!    call repeats (validation and schedule: a plan's construction) and what a run still does
//!    (its checks: runs of a plan of the same sequences without query rows), for f16 pools,
//!    i8 pools with `Layer::kv_scales` and an i8 [`KvPool`] (`Plan::run_pool`).
//! 5. Cost follows the work: a packed batch of one 1024-row causal prefill sequence among
//!    20,000 sequences without rows, against the sequence alone.
//! 6. [`append`] of a 4096-token prompt (f32 rows, H_kv = 8, d = 128, K rotated) into
//!    shuffled 16-token pages of f16 and of i8 (per-token scales), on the pool against on one
//!    thread. Reports both times.
//!
//! Flags: `--threads N` (default: all cores), `--rounds N` (default 5), `--only N` (case `N`
//! alone).

use sdpa::half::f16;
use sdpa::{
    append, Alignment, Heads, KvPool, Layer, Options, PackedKv, PagedKv, Plan, Rope, RopeStyle,
    StepKv, Tensor, TensorMut, VarlenKv, Workspace,
};
use std::time::Instant;

const H: usize = 32;
const H_KV: usize = 8;
const D: usize = 128;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Seconds one call of `f` takes.
fn time(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

/// Alternates `a` and `b` `rounds` times (after one warm-up each); medians in seconds.
fn alternate(rounds: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    a();
    b();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        ta.push(time(&mut a));
        tb.push(time(&mut b));
    }
    (median(ta), median(tb))
}

fn paged_decode(rounds: usize) {
    let lens = [1024usize, 16384, 2048, 8192, 4096, 12288, 3000, 5000];
    let (b, max_len) = (lens.len(), 16384);
    let row = H_KV * D;
    let k = values(b * max_len * row, 1);
    let v = values(b * max_len * row, 2);
    let q = values(b * H * D, 3);
    let qv = Tensor::bshd(&q, [b, 1, H, D]).unwrap();
    let kd = Tensor::bshd(&k, [b, max_len, H_KV, D]).unwrap();
    let vd = Tensor::bshd(&v, [b, max_len, H_KV, D]).unwrap();
    let opts = Options::new().causal(Alignment::BottomRight).kv_lens(&lens);
    let mut out = vec![0.0f32; b * H * D];
    let live: usize = lens.iter().sum();
    let bytes = (live * row * 2 * 4) as f64;
    for page in [16usize, 128] {
        let pps = max_len / page;
        // Only the live pages exist, in a shuffled order.
        let used: Vec<usize> = lens.iter().map(|l| l.div_ceil(page)).collect();
        let pages: usize = used.iter().sum();
        let mut order: Vec<usize> = (0..pages).collect();
        let r = values(pages, 9);
        for i in (1..pages).rev() {
            let j = (((r[i] + 1.0) * 0.5 * (i + 1) as f32) as usize).min(i);
            order.swap(i, j);
        }
        let mut table = vec![0u32; b * pps];
        let (mut kp, mut vp) = (
            vec![0.0f32; pages * page * row],
            vec![0.0f32; pages * page * row],
        );
        let mut next = 0;
        for s in 0..b {
            for p in 0..used[s] {
                let dst = order[next];
                next += 1;
                table[s * pps + p] = dst as u32;
                let src = (s * max_len + p * page) * row;
                let n = page * row;
                kp[dst * n..(dst + 1) * n].copy_from_slice(&k[src..src + n]);
                vp[dst * n..(dst + 1) * n].copy_from_slice(&v[src..src + n]);
            }
        }
        let pool = |x| Tensor::bshd(x, [pages, page, H_KV, D]).unwrap();
        let kv = PagedKv::new(pool(&kp), pool(&vp), &table, pps).unwrap();
        let (mut ws_a, mut ws_b) = (Workspace::new(), Workspace::new());
        let mut out_b = out.clone();
        let (dense, paged) = alternate(
            rounds,
            || {
                let mut o = TensorMut::bshd(&mut out, [b, 1, H, D]).unwrap();
                ws_a.attention(&qv, &kd, &vd, &mut o, &opts).unwrap();
            },
            || {
                let mut o = TensorMut::bshd(&mut out_b, [b, 1, H, D]).unwrap();
                ws_b.attention_paged(&qv, &kv, &mut o, None, &opts).unwrap();
            },
        );
        assert_eq!(out, out_b, "paged and dense results differ");
        println!(
            "paged decode, page {page:>3}: dense {:.2} ms ({:.1} GB/s), paged {:.2} ms ({:.1} GB/s), paged/dense time {:.3}",
            dense * 1e3,
            bytes / dense / 1e9,
            paged * 1e3,
            bytes / paged / 1e9,
            paged / dense
        );
    }
}

/// Rows `at .. at + n` of a packed `[1, total, h, D]` tensor as a `[1, n, h, D]` view.
fn view(x: &[f32], at: usize, n: usize, h: usize) -> Tensor<'_, f32> {
    Tensor::bshd(&x[at * h * D..(at + n) * h * D], [1, n, h, D]).unwrap()
}

/// The issue's mix: (query rows, keys): prefill chunks see themselves, decode rows a
/// 4096-key cache.
fn long_mix() -> Vec<(usize, usize)> {
    let mut seqs = vec![(17usize, 17usize), (300, 300), (2048, 2048), (5000, 5000)];
    seqs.extend([(1, 4096); 8]);
    seqs
}

/// A continuous-batching step: 16 prompt chunks of 17–300 new tokens against caches of up to
/// 1024 keys (chunked prefill), and 48 decode rows against 512–4096 keys.
fn serving_step() -> Vec<(usize, usize)> {
    let mut seqs: Vec<(usize, usize)> = (0..16)
        .map(|i| {
            let n = 17 + (i * 97) % 284;
            (n, n + (i * 61) % 724)
        })
        .collect();
    seqs.extend((0..48).map(|i| (1, 512 + (i * 331) % 3585)));
    seqs
}

fn packed_batch(rounds: usize, name: &str, seqs: Vec<(usize, usize)>) {
    let mut cu_q = vec![0];
    let mut cu_k = vec![0];
    for &(nq, nk) in &seqs {
        cu_q.push(cu_q.last().unwrap() + nq);
        cu_k.push(cu_k.last().unwrap() + nk);
    }
    let (tq, tk) = (*cu_q.last().unwrap(), *cu_k.last().unwrap());
    let q = values(tq * H * D, 4);
    let k = values(tk * H_KV * D, 5);
    let v = values(tk * H_KV * D, 6);
    let qv = Tensor::bshd(&q, [1, tq, H, D]).unwrap();
    let kv = VarlenKv::from(PackedKv::new(
        Tensor::bshd(&k, [1, tk, H_KV, D]).unwrap(),
        Tensor::bshd(&v, [1, tk, H_KV, D]).unwrap(),
        &cu_k,
    ));
    let opts = Options::new().causal(Alignment::BottomRight);
    let mut out = vec![0.0f32; tq * H * D];
    let mut out_b = out.clone();
    let (mut ws_a, mut ws_b) = (Workspace::new(), Workspace::new());
    let flops: f64 = seqs
        .iter()
        .map(|&(nq, nk)| {
            let visible = (nq * nk - nq * (nq.saturating_sub(1)) / 2) as f64;
            4.0 * visible * (H * D) as f64
        })
        .sum();
    let (each, packed) = alternate(
        rounds,
        || {
            for (s, &(nq, nk)) in seqs.iter().enumerate() {
                let qs = view(&q, cu_q[s], nq, H);
                let ks = view(&k, cu_k[s], nk, H_KV);
                let vs = view(&v, cu_k[s], nk, H_KV);
                let o = &mut out[cu_q[s] * H * D..(cu_q[s] + nq) * H * D];
                let mut o = TensorMut::bshd(o, [1, nq, H, D]).unwrap();
                ws_a.attention(&qs, &ks, &vs, &mut o, &opts).unwrap();
            }
        },
        || {
            let mut o = TensorMut::bshd(&mut out_b, [1, tq, H, D]).unwrap();
            ws_b.attention_varlen(&qv, &cu_q, &kv, &mut o, None, &opts)
                .unwrap();
        },
    );
    let diff = out
        .iter()
        .zip(&out_b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        diff < 1e-4,
        "packed and per-sequence results differ by {diff}"
    );
    println!(
        "packed batch ({name}): one call per sequence {:.1} ms ({:.1} GFLOP/s), packed {:.1} ms ({:.1} GFLOP/s), per-sequence/packed time {:.3}",
        each * 1e3,
        flops / each / 1e9,
        packed * 1e3,
        flops / packed / 1e9,
        each / packed
    );
}

/// Case 4: per-layer time of a plan's runs against plain calls, a decode step of many short
/// sequences.
fn planned_step(rounds: usize, (min_keys, max_keys): (usize, usize)) {
    const LAYERS: usize = 8;
    const PAGE: usize = 16;
    let b = 64;
    let lens: Vec<usize> = (0..b)
        .map(|i| min_keys + (i * 149) % (max_keys - min_keys + 1))
        .collect();
    let pages_per_seq = max_keys.div_ceil(PAGE);
    let pages = b * pages_per_seq;
    let table: Vec<u32> = (0..pages as u32)
        .map(|p| (p * 7919) % pages as u32)
        .collect();
    let row = H_KV * D;
    let pools: Vec<(Vec<f16>, Vec<f16>)> = (0..LAYERS)
        .map(|l| {
            let half = |x: Vec<f32>| x.into_iter().map(f16::from_f32).collect::<Vec<_>>();
            let seed = 10 + 2 * l as u64;
            (
                half(values(pages * PAGE * row, seed)),
                half(values(pages * PAGE * row, seed + 1)),
            )
        })
        .collect();
    let q = values(b * H * D, 3);
    let cu_q: Vec<usize> = (0..=b).collect();
    let qv = Tensor::bshd(&q, [1, b, H, D]).unwrap();
    let opts = Options::new().causal(Alignment::BottomRight).kv_lens(&lens);
    let pool = |x| Tensor::bshd(x, [pages, PAGE, H_KV, D]).unwrap();
    let (mut out_a, mut out_b) = (vec![0.0f32; b * H * D], vec![0.0f32; b * H * D]);
    let (mut ws_a, mut ws_b) = (Workspace::new(), Workspace::new());
    let heads = Heads {
        heads: H,
        kv_heads: H_KV,
        d_k: D,
        d_v: D,
    };
    let (plain, planned) = alternate(
        rounds,
        || {
            for (k, v) in &pools {
                let kv =
                    VarlenKv::Paged(PagedKv::new(pool(k), pool(v), &table, pages_per_seq).unwrap());
                let mut o = TensorMut::bshd(&mut out_a, [1, b, H, D]).unwrap();
                ws_a.attention_varlen(&qv, &cu_q, &kv, &mut o, None, &opts)
                    .unwrap();
            }
        },
        || {
            let step = StepKv::Paged {
                block_table: &table,
                pages_per_seq,
                page_size: PAGE,
            };
            let mut plan = Plan::in_workspace(&mut ws_b, &cu_q, step, heads, &opts).unwrap();
            for (k, v) in &pools {
                let mut o = TensorMut::bshd(&mut out_b, [1, b, H, D]).unwrap();
                plan.run(&qv, &pool(k), &pool(v), &mut o, None, &Layer::new())
                    .unwrap();
            }
        },
    );
    assert_eq!(out_a, out_b, "plan and calls differ");
    println!(
        "planned step ({b} decode rows, {min_keys}-{max_keys} keys, pages of {PAGE}, f16): per layer, calls {:.1} µs, plan {:.1} µs, plan/calls time {:.3}",
        plain / LAYERS as f64 * 1e6,
        planned / LAYERS as f64 * 1e6,
        planned / plain
    );

    // The overheads beside the kernel's work: what a call repeats every layer (validation and
    // scheduling, which is what building a plan does) and what a plan's run still does (its
    // per-layer checks and the kernel's entry: runs of a plan of the same sequences and
    // lengths without query rows, which schedule no work).
    const REPS: usize = 200;
    let step = StepKv::Paged {
        block_table: &table,
        pages_per_seq,
        page_size: PAGE,
    };
    let per_call = |f: &mut dyn FnMut()| {
        let t: Vec<f64> = (0..rounds.max(3)).map(|_| time(&mut *f)).collect();
        median(t) / REPS as f64
    };
    let building = per_call(&mut || {
        for _ in 0..REPS {
            let plan = Plan::in_workspace(&mut ws_b, &cu_q, step, heads, &opts).unwrap();
            std::hint::black_box(&plan);
        }
    });
    let cu_none = vec![0usize; b + 1];
    let no_rows: Vec<f32> = Vec::new();
    let q_none = Tensor::bshd(&no_rows, [1, 0, H, D]).unwrap();
    let mut out_none: Vec<f32> = Vec::new();
    let mut empty = Plan::in_workspace(&mut ws_b, &cu_none, step, heads, &opts).unwrap();
    let (k, v) = &pools[0];
    let checks = per_call(&mut || {
        for _ in 0..REPS {
            let mut o = TensorMut::bshd(&mut out_none, [1, 0, H, D]).unwrap();
            empty
                .run(&q_none, &pool(k), &pool(v), &mut o, None, &Layer::new())
                .unwrap();
        }
    });
    // i8 pools: both paths check the layer's scales where the lengths reach.
    let i8_pool = vec![1i8; pages * PAGE * row];
    let scales = vec![0.01f32; pages * PAGE * H_KV];
    let scale_pool = Tensor::bshd(&scales, [pages, PAGE, H_KV, 1]).unwrap();
    let i8_layer = Layer::new().kv_scales(scale_pool, scale_pool);
    let i8_view = Tensor::bshd(&i8_pool, [pages, PAGE, H_KV, D]).unwrap();
    let i8_checks = per_call(&mut || {
        for _ in 0..REPS {
            let mut o = TensorMut::bshd(&mut out_none, [1, 0, H, D]).unwrap();
            empty
                .run(&q_none, &i8_view, &i8_view, &mut o, None, &i8_layer)
                .unwrap();
        }
    });
    // The same i8 pool as a `KvPool`: its scales are valid by construction, not read to be
    // checked.
    let kv_pool = KvPool::<i8>::new(pages, PAGE, H_KV, D, D).unwrap();
    let pool_checks = per_call(&mut || {
        for _ in 0..REPS {
            let mut o = TensorMut::bshd(&mut out_none, [1, 0, H, D]).unwrap();
            empty
                .run_pool(&q_none, &kv_pool, &mut o, None, &Layer::new())
                .unwrap();
        }
    });
    let i8_call = building + i8_checks; // a call on i8 pools checks their scales
    for (what, call, plan) in [
        ("f16", building + checks, checks),
        ("i8, scales by Layer::kv_scales", i8_call, i8_checks),
        ("i8, a KvPool by Plan::run_pool", i8_call, pool_checks),
    ] {
        println!(
            "  per-layer overhead, {what}: call {:.2} µs (validation and schedule {:.2}), plan {:.2} µs (its run's checks), plan/call overhead {:.3}",
            call * 1e6,
            building * 1e6,
            plan * 1e6,
            plan / call
        );
    }
}

/// Case 5: a long sequence among many without rows, against it alone.
fn empty_sequences(rounds: usize) {
    let n = 1024;
    let q = values(n * H * D, 4);
    let k = values(n * H_KV * D, 5);
    let v = values(n * H_KV * D, 6);
    let qv = Tensor::bshd(&q, [1, n, H, D]).unwrap();
    let kv_dims = [1, n, H_KV, D];
    let (kt, vt) = (
        Tensor::bshd(&k, kv_dims).unwrap(),
        Tensor::bshd(&v, kv_dims).unwrap(),
    );
    let opts = Options::new().causal(Alignment::BottomRight);
    let alone = [0, n];
    let mut many = vec![0usize; 10_001];
    many.extend(std::iter::repeat_n(n, 10_001));
    let (mut out_a, mut out_b) = (vec![0.0f32; n * H * D], vec![0.0f32; n * H * D]);
    let (mut ws_a, mut ws_b) = (Workspace::new(), Workspace::new());
    let call = |cu: &[usize], out: &mut [f32], ws: &mut Workspace| {
        let kv = VarlenKv::Packed(PackedKv::new(kt, vt, cu));
        let mut o = TensorMut::bshd(out, [1, n, H, D]).unwrap();
        ws.attention_varlen(&qv, cu, &kv, &mut o, None, &opts)
            .unwrap();
    };
    let (one, with_empty) = alternate(
        rounds,
        || call(&alone, &mut out_a, &mut ws_a),
        || call(&many, &mut out_b, &mut ws_b),
    );
    assert_eq!(out_a, out_b, "the empty sequences changed the result");
    println!(
        "cost follows the work ({n}-row prefill among 20,000 empty sequences): alone {:.1} ms, with them {:.1} ms, ratio {:.3}",
        one * 1e3,
        with_empty * 1e3,
        with_empty / one
    );
}

/// Case 6: a prompt's append on the pool against on one thread.
fn prompt_append(rounds: usize) {
    let (n, page) = (4096, 16);
    let pages = n / page;
    let pool = [pages, page, H_KV, D];
    let (k, v) = (values(n * H_KV * D, 61), values(n * H_KV * D, 62));
    // Page p of the prompt is pool page (97·p + 13) mod pages (97 is prime to 256).
    let slots: Vec<usize> = (0..n)
        .map(|t| (97 * (t / page) + 13) % pages * page + t % page)
        .collect();
    let positions: Vec<u32> = (0..n as u32).collect();
    let rope = Rope::new(RopeStyle::Halves, D, 10_000.0);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (kt, vt) = (
        Tensor::bshd(&k, [1, n, H_KV, D]).unwrap(),
        Tensor::bshd(&v, [1, n, H_KV, D]).unwrap(),
    );
    // Each side writes its own caches.
    let (rope, slots, positions, kt, vt) = (&rope, &slots[..], &positions[..], &kt, &vt);
    let into_f16 = || {
        let (mut kf, mut vf) = (vec![f16::ZERO; n * H_KV * D], vec![f16::ZERO; n * H_KV * D]);
        move || {
            let (mut kc, mut vc) = (
                TensorMut::bshd(&mut kf, pool).unwrap(),
                TensorMut::bshd(&mut vf, pool).unwrap(),
            );
            let rope = Some((rope, positions));
            append(kt, vt, &mut kc, &mut vc, slots, None, rope).unwrap();
        }
    };
    let (mut a, mut b) = (into_f16(), into_f16());
    let (pooled, single) = alternate(rounds, &mut a, || one.install(&mut b));
    println!(
        "6. append 4096 tokens into f16 pages: {:.2} ms on the pool, {:.2} ms on 1 thread ({:.2}x)",
        pooled * 1e3,
        single * 1e3,
        single / pooled
    );
    let into_i8 = || {
        let (mut k8, mut v8) = (vec![0i8; n * H_KV * D], vec![0i8; n * H_KV * D]);
        let (mut ks, mut vs) = (vec![0.0f32; n * H_KV], vec![0.0f32; n * H_KV]);
        move || {
            let sd = [pages, page, H_KV, 1];
            let (mut kc, mut vc) = (
                TensorMut::bshd(&mut k8, pool).unwrap(),
                TensorMut::bshd(&mut v8, pool).unwrap(),
            );
            let (mut kst, mut vst) = (
                TensorMut::bshd(&mut ks, sd).unwrap(),
                TensorMut::bshd(&mut vs, sd).unwrap(),
            );
            let scales = Some((&mut kst, &mut vst));
            let rope = Some((rope, positions));
            append(kt, vt, &mut kc, &mut vc, slots, scales, rope).unwrap();
        }
    };
    let (mut a, mut b) = (into_i8(), into_i8());
    let (pooled, single) = alternate(rounds, &mut a, || one.install(&mut b));
    println!(
        "   append 4096 tokens into i8 pages: {:.2} ms on the pool, {:.2} ms on 1 thread ({:.2}x)",
        pooled * 1e3,
        single * 1e3,
        single / pooled
    );
}

fn main() {
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rounds = 5;
    let mut only = None;
    let mut it = std::env::args().skip(1);
    const USAGE: &str = "usage: kv_cache_bench [--threads N] [--rounds N] [--only N]";
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            return;
        }
        let value: Option<usize> = it.next().and_then(|v| v.parse().ok());
        match (flag.as_str(), value) {
            ("--threads", Some(n)) => threads = n,
            ("--rounds", Some(n)) => rounds = n.max(1),
            ("--only", Some(n)) => only = Some(n),
            ("--threads" | "--rounds" | "--only", None) => {
                eprintln!("kv_cache_bench: {flag} needs a number\n{USAGE}");
                std::process::exit(2);
            }
            _ => {
                eprintln!("kv_cache_bench: unknown flag {flag}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    println!(
        "{threads} thread(s), {rounds} rounds, backend {:?}",
        sdpa::backend()
    );
    let run = |case: usize| only.is_none_or(|n| n == case);
    pool.install(|| {
        if run(1) {
            paged_decode(rounds);
        }
        if run(2) {
            packed_batch(
                rounds,
                "17, 300, 2048, 5000 prefill + 8 decode rows × 4096 keys",
                long_mix(),
            );
        }
        if run(3) {
            packed_batch(
                rounds,
                "16 prefill chunks of 17-300 rows + 48 decode rows, 512-4096 keys",
                serving_step(),
            );
        }
        if run(4) {
            planned_step(rounds, (64, 512));
            planned_step(rounds, (1, 16));
        }
        if run(5) {
            empty_sequences(rounds);
        }
        if run(6) {
            prompt_append(rounds);
        }
    });
}
