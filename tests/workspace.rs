//! `sdpa::Workspace`: repeated calls of one shape allocate nothing on the heap, give the same
//! bits as the plain functions, and survive a change of shape.

#[path = "../benches/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{with_peak_heap, CountingAlloc};

use sdpa::half::f16;
use sdpa::{Alignment, Options, Tensor, TensorMut, Workspace};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The tests of this binary measure the process's heap: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|x| ((x as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32)
        .map(|x| x / (1u32 << 24) as f32 * 2.0 - 1.0)
        .collect()
}

/// Decode over a KV cache (split-KV: few items, many keys) and a small prefill, both with
/// GQA and per-sequence lengths.
#[test]
fn steady_state_calls_allocate_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (b, h, h_kv, d, n_kv) = (2, 8, 2, 64, 4096);
    let k = values(b * n_kv * h_kv * d, 1);
    let v = values(b * n_kv * h_kv * d, 2);
    let lens = [3000usize, 4096];
    let kv_half: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for n_q in [1usize, 100] {
            let q = values(b * n_q * h * d, 3);
            let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
            let kv = Tensor::bshd(&k, [b, n_kv, h_kv, d]).unwrap();
            let vv = Tensor::bshd(&v, [b, n_kv, h_kv, d]).unwrap();
            let kh = Tensor::bshd(&kv_half, [b, n_kv, h_kv, d]).unwrap();
            let opts = Options::new().kv_lens(&lens).causal(Alignment::BottomRight);
            let mut out = vec![0.0f32; b * n_q * h * d];
            let mut plain = vec![0.0f32; out.len()];
            let mut lse = vec![0.0f32; b * h * n_q];
            let mut ws = Workspace::new();
            pool.broadcast(|_| drop(crossbeam_epoch::pin()));
            pool.install(|| {
                let mut o = TensorMut::bshd(&mut out, [b, n_q, h, d]).unwrap();
                // rayon's threads register with crossbeam's epoch collector the first time they
                // steal work (a few KiB, once per thread, not the kernel's): do it now. Then
                // warm up until a call allocates nothing.
                let mut call = || {
                    ws.attention_lse(&qv, &kv, &vv, &mut o, &mut lse, &opts)
                        .unwrap()
                };
                let warm = (0..10).any(|_| with_peak_heap(&mut call).1 == 0);
                assert!(warm, "{threads} threads, n_q = {n_q}: every call allocates");
                for _ in 0..3 {
                    let (_, peak) = with_peak_heap(&mut call);
                    assert_eq!(peak, 0, "{threads} threads, n_q = {n_q}: {peak} bytes");
                }
                // Half-precision keys need a key-conversion buffer: the first call with them
                // reallocates the scratches, the next ones do not.
                let mut call = || ws.attention(&qv, &kh, &kh, &mut o, &opts).unwrap();
                let warm = (0..10).any(|_| with_peak_heap(&mut call).1 == 0);
                assert!(
                    warm,
                    "f16 keys, {threads} threads, n_q = {n_q}: every call allocates"
                );
                for _ in 0..3 {
                    let (_, peak) = with_peak_heap(&mut call);
                    assert_eq!(
                        peak, 0,
                        "f16 keys, {threads} threads, n_q = {n_q}: {peak} bytes"
                    );
                }
                // Same bits as the plain function.
                ws.attention(&qv, &kv, &vv, &mut o, &opts).unwrap();
                let mut p = TensorMut::bshd(&mut plain, [b, n_q, h, d]).unwrap();
                sdpa::attention(&qv, &kv, &vv, &mut p, &opts).unwrap();
            });
            assert_eq!(out, plain);
            assert!(ws.bytes() > 0);
        }
    }
}

/// A serving loop: one `Plan` per step in one workspace, steps alternating between decode
/// rows only and decode rows beside a prefill chunk (two blockings, f16 pools), two layers
/// each. Once each kind of step has run, a whole step (plan and layers) allocates nothing,
/// with one thread and with two.
#[test]
fn a_serving_loop_of_plans_allocates_nothing_once_warm() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use sdpa::{Heads, Layer, Plan, StepKv};
    let (h, h_kv, d, page) = (8, 2, 64, 16);
    let pages = 64;
    let pool: Vec<f16> = values(pages * page * h_kv * d, 5)
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let table: Vec<u32> = (0..pages as u32).rev().collect();
    let pages_per_seq = 16;
    // (query rows per sequence, cached keys per sequence)
    let decode = (vec![1usize, 1, 1, 1], vec![100usize, 37, 200, 5]);
    let prefill = (vec![1usize, 40, 1, 1], vec![100usize, 0, 200, 5]);
    let q = values(43 * h * d, 6);
    let mut out = vec![0.0f32; 43 * h * d];
    let heads = Heads {
        heads: h,
        kv_heads: h_kv,
        d_k: d,
        d_v: d,
    };
    for threads in [1, 2] {
        let pool_threads = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool_threads.broadcast(|_| drop(crossbeam_epoch::pin()));
        let mut ws = Workspace::new();
        pool_threads.install(|| {
            let mut step = |kind: &(Vec<usize>, Vec<usize>)| {
                let mut cu = [0usize; 5];
                for (b, n) in kind.0.iter().enumerate() {
                    cu[b + 1] = cu[b] + n;
                }
                let total = cu[4];
                let kv = StepKv::Paged {
                    block_table: &table,
                    pages_per_seq,
                    page_size: page,
                };
                let opts = Options::new()
                    .causal(Alignment::BottomRight)
                    .cache_seqlens(&kind.1);
                let mut plan = Plan::in_workspace(&mut ws, &cu, kv, heads, &opts).unwrap();
                let kp = Tensor::bshd(&pool, [pages, page, h_kv, d]).unwrap();
                let qv = Tensor::bshd(&q[..total * h * d], [1, total, h, d]).unwrap();
                let o = &mut out[..total * h * d];
                let mut o = TensorMut::bshd(o, [1, total, h, d]).unwrap();
                for _layer in 0..2 {
                    plan.run(&qv, &kp, &kp, &mut o, None, &Layer::new())
                        .unwrap();
                }
            };
            for _ in 0..3 {
                step(&decode);
                step(&prefill);
            }
            for round in 0..3 {
                for (name, kind) in [("decode", &decode), ("prefill", &prefill)] {
                    let (_, peak) = with_peak_heap(|| step(kind));
                    assert_eq!(
                        peak, 0,
                        "{threads} threads, {name} step {round}: {peak} bytes"
                    );
                }
            }
        });
    }
}
