//! `sdpa::Workspace`: repeated calls of one shape allocate nothing on the heap, give the same
//! bits as the plain functions, and survive a change of shape.

#[path = "../benches/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{with_peak_heap, CountingAlloc};

use sdpa::half::f16;
use sdpa::{Alignment, Options, Tensor, TensorMut, Workspace};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

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
