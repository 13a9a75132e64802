//! Sliding-window attention against full attention: the window's cost grows as `n · w`, full
//! attention's as `n²`.
//!
//! ```text
//! cargo bench --bench window                        # everything (the full n = 16384 call alone
//!                                                   # takes ~10 s: a few minutes in all)
//! cargo bench --bench window -- 'window/(1024|2048)$'   # a subset: criterion's filter is a regex
//! SDPA_BENCH_MAX_N=4096 cargo bench --bench window  # skip the longest sequences
//! ```
//! `cargo test --benches` (criterion's test mode) runs each function once, at n = 1024 only.
//!
//! One group, `window_d64_h8_1t`: B = 1, H = H_kv = 8, d = 64, `n_q = n_kv = n` for
//! n = 1024 … 16384, in a one-thread rayon pool:
//! * `full/n`: unmasked attention over all `n` keys;
//! * `window256/n`: causal sliding window of w = 256 keys (the diagonal and the 255 before it,
//!   Mistral style: `causal` + `sliding_window(255, 0)`, bottom-right aligned).
//!
//! Throughput is `Throughput::Elements(4·B·H·n·n·d)` for both: the FLOPs of *full* attention.
//! So `full` reports its real FLOP rate, and `window256`'s "rate" is how much faster than full
//! attention it is in the same units: it should grow about linearly with `n / w`.

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use rand::{Rng, SeedableRng};
use rayon::ThreadPoolBuilder;
use sdpa::{Alignment, Options, Tensor, TensorMut};
use std::hint::black_box;
use std::time::Duration;

const B: usize = 1;
const H: usize = 8;
const D: usize = 64;
const W: usize = 256;
const NS: [usize; 5] = [1024, 2048, 4096, 8192, 16384];

/// Whether criterion runs in test mode (`cargo test --benches`, or `-- --test`).
fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

/// Longest sequence: `SDPA_BENCH_MAX_N` if set, else all of [`NS`]; the shortest in test mode.
fn max_n() -> usize {
    if test_mode() {
        return NS[0];
    }
    std::env::var("SDPA_BENCH_MAX_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX)
}

fn window(c: &mut Criterion) {
    let pool = ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("rayon pool");
    let mut group = c.benchmark_group(format!("window_d{D}_h{H}_1t"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let full = Options::new();
    let windowed = Options::new()
        .causal(Alignment::BottomRight)
        .sliding_window(W - 1, 0, Alignment::BottomRight);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x3d0);
    for n in NS.into_iter().filter(|&n| n <= max_n()) {
        let dims = [B, n, H, D];
        let len = B * n * H * D;
        let mut gen = || -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
        let (q, k, v) = (gen(), gen(), gen());
        let mut out = vec![0.0f32; len];
        let q = Tensor::bshd(&q, dims).expect("q view");
        let k = Tensor::bshd(&k, dims).expect("k view");
        let v = Tensor::bshd(&v, dims).expect("v view");
        group.throughput(Throughput::Elements(4 * (B * H * n * n * D) as u64));
        for (name, opts) in [("full", &full), (&format!("window{W}")[..], &windowed)] {
            group.bench_function(BenchmarkId::new(name, n), |bench| {
                bench.iter(|| {
                    let mut o = TensorMut::bshd(&mut out, dims).expect("out view");
                    pool.install(|| sdpa::attention(&q, &k, &v, &mut o, opts))
                        .expect("attention call");
                    black_box(&mut out);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, window);
criterion_main!(benches);
