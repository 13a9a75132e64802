//! sdpa-candle's fused attention against candle's unfused attention (repeat_kv, `Q·Kᵀ`, causal
//! mask, `softmax_last_dim`, `·V`, as candle-transformers' Llama without flash-attn), causal
//! GQA prefill at n = 512 … 4096 (1 sequence, 8 query heads over 2 key/value heads, d = 64).
//!
//! `cargo bench -p sdpa-candle --bench candle` (`-- --test` runs each case once).

use candle_core::{Device, Result, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const D: usize = 64;

fn inputs(n: usize) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1., (1, HEADS, n, D), &dev)?;
    let k = Tensor::randn(0f32, 1., (1, KV_HEADS, n, D), &dev)?;
    let v = Tensor::randn(0f32, 1., (1, KV_HEADS, n, D), &dev)?;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| (0..n).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (n, n), &dev)?;
    Ok((q, k, v, mask))
}

fn unfused(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let rep = HEADS / KV_HEADS;
    let (b, h_kv, n, d) = k.dims4()?;
    let k = Tensor::cat(&vec![k; rep], 2)?.reshape((b, h_kv * rep, n, d))?;
    let v = Tensor::cat(&vec![v; rep], 2)?.reshape((b, h_kv * rep, n, d))?;
    let att = (q.matmul(&k.t()?)? / (D as f64).sqrt())?.broadcast_add(mask)?;
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&v)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("candle_causal_gqa");
    group.sample_size(10);
    for n in [512usize, 1024, 2048, 4096] {
        let (q, k, v, mask) = inputs(n).expect("inputs");
        group.throughput(Throughput::Elements((HEADS * n * n / 2) as u64));
        group.bench_with_input(BenchmarkId::new("sdpa_candle", n), &n, |b, _| {
            b.iter(|| {
                sdpa_candle::sdpa(&q, &k, &v, None, true, 1.0 / (D as f32).sqrt(), 1.0)
                    .expect("sdpa")
            })
        });
        group.bench_with_input(BenchmarkId::new("candle_unfused", n), &n, |b, _| {
            b.iter(|| unfused(&q, &k, &v, &mask).expect("unfused"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
