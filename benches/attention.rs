//! Timing of the fused kernel ([`sdpa::attention`]) against the f64 reference
//! ([`sdpa::reference::attention`]), with criterion.
//!
//! ```text
//! cargo bench --bench attention                          # everything, about 10 minutes on 2 idle cores
//! cargo bench --bench attention -- prefill_d64           # a subset: criterion's filter is a regex
//! cargo bench --bench attention -- 'prefill_d64_noncausal_1t/fused/(128|256)$'
//! cargo bench --bench attention -- decode
//! SDPA_BENCH_MAX_N=2048 cargo bench --bench attention    # skip the longest prefill sequences
//! cargo bench --bench attention -- --list                # the benchmark ids
//! ```
//! `cargo test --benches` runs every group once on its smallest shape only (criterion's test
//! mode, usually a debug build).
//! Report: `target/criterion/report/index.html`, one page per group.
//!
//! Groups (B = 1 everywhere):
//! * `prefill_d{64,128}_{noncausal,causal}_{1t,all_threads}`: H = H_kv = 8, n_q = n_kv = n over
//!   powers of two 128 ..= 8192 for `fused`; `reference` only in the `_1t` groups (it is
//!   single-threaded, so the pool does not change it) and only up to [`REFERENCE_MAX_N`], where
//!   one call already takes about a second. Causal is `Alignment::BottomRight` (the same as
//!   top-left here since n_q = n_kv); the reference computes every score either way.
//! * `decode_d128_h32_hkv8_{1t,all_threads}`: one query token against a KV cache, n_q = 1,
//!   n_kv in {1024, 4096, 16384, 32768}, H = 32, H_kv = 8 (grouped-query), d = 128, bottom-right
//!   causal (which hides nothing for a single query row: identical to no mask).
//!
//! Throughput is `Throughput::Elements(4·B·H·n_q·n_kv·d)`, the floating-point operations of
//! the two matrix products, so the "elem/s" criterion prints are FLOP/s. The count is the full,
//! unmasked work even for causal runs (as in `docs/bench-schema.md` and `examples/bench.rs`),
//! so skipping masked blocks shows up as a higher rate rather than a smaller count.
//!
//! `1t` runs inside a one-thread rayon pool, `all_threads` inside a pool of
//! `std::thread::available_parallelism()` threads; both pools are built once and entered with
//! `pool.install`. Sample sizes are criterion's minimum (10, flat sampling) with short warm-up
//! and measurement times: the longest shapes (a few seconds a call) run just the 10 samples.

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use rand::{Rng, SeedableRng};
use rayon::{ThreadPool, ThreadPoolBuilder};
use sdpa::{Alignment, Options, Tensor, TensorMut};
use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;

/// Batch size of every benchmark.
const B: usize = 1;
/// Query (and key/value) heads of the prefill groups.
const PREFILL_HEADS: usize = 8;
/// Sequence lengths of the prefill groups (`n_q = n_kv = n`).
const PREFILL_NS: [usize; 7] = [128, 256, 512, 1024, 2048, 4096, 8192];
/// The reference is timed for `n ≤` this: one call at n = 512, H = 8 takes about a second
/// (it is single-threaded f64 with bounds-checked strided access, and O(n²) per head).
const REFERENCE_MAX_N: usize = 512;
/// Decode: query heads, key/value heads, head size, KV cache lengths.
const DECODE_HEADS: usize = 32;
const DECODE_KV_HEADS: usize = 8;
const DECODE_D: usize = 128;
const DECODE_NKVS: [usize; 4] = [1024, 4096, 16384, 32768];
/// The reference is timed in the decode group for `n_kv ≤` this.
const DECODE_REFERENCE_MAX_NKV: usize = 4096;

/// The two rayon pools, built once for the whole run.
struct Pools {
    one: ThreadPool,
    all: ThreadPool,
}

fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(|| {
        let all = std::thread::available_parallelism().map_or(1, |n| n.get());
        let build = |threads| {
            ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("rayon thread pool")
        };
        Pools {
            one: build(1),
            all: build(all),
        }
    })
}

/// `(group-name suffix, pool)` for each thread setting.
fn thread_settings() -> [(&'static str, &'static ThreadPool); 2] {
    let p = pools();
    [("1t", &p.one), ("all_threads", &p.all)]
}

/// Whether criterion runs in test mode (`cargo test --benches`, or `-- --test`): every
/// benchmark once, often in a debug build, so only the smallest shapes are worth it.
fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test")
}

/// Longest prefill sequence: `SDPA_BENCH_MAX_N` if set (to shorten a run), else all of
/// [`PREFILL_NS`]; 128 in test mode.
fn max_n() -> usize {
    if test_mode() {
        return PREFILL_NS[0];
    }
    std::env::var("SDPA_BENCH_MAX_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX)
}

/// Floating-point operations of one call: `Q·Kᵀ` and `P·V`, 2 per multiply-add each, over the
/// full unmasked `n_q × n_kv` scores (see the module docs).
fn flops(b: usize, h: usize, n_q: usize, n_kv: usize, d: usize) -> u64 {
    4 * (b * h * n_q * n_kv * d) as u64
}

/// Contiguous BSHD operands of one shape, uniform in [-1, 1), fixed seed.
struct Operands {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
    q_dims: [usize; 4],
    kv_dims: [usize; 4],
}

impl Operands {
    fn new(h: usize, h_kv: usize, n_q: usize, n_kv: usize, d: usize) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5d9a);
        let mut gen =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
        let q_dims = [B, n_q, h, d];
        let kv_dims = [B, n_kv, h_kv, d];
        let q = gen(q_dims.iter().product());
        let k = gen(kv_dims.iter().product());
        let v = gen(kv_dims.iter().product());
        let out = vec![0.0; q.len()];
        Operands {
            q,
            k,
            v,
            out,
            q_dims,
            kv_dims,
        }
    }

    /// One call of `kernel` (the fused kernel or the reference) on these operands in `pool`.
    fn call(&mut self, pool: &ThreadPool, kernel: Kernel, opts: &Options) {
        let q = Tensor::bshd(&self.q, self.q_dims).expect("q view");
        let k = Tensor::bshd(&self.k, self.kv_dims).expect("k view");
        let v = Tensor::bshd(&self.v, self.kv_dims).expect("v view");
        let mut out = TensorMut::bshd(&mut self.out, self.q_dims).expect("out view");
        pool.install(|| match kernel {
            Kernel::Fused => sdpa::attention(&q, &k, &v, &mut out, opts),
            Kernel::Reference => sdpa::reference::attention(&q, &k, &v, &mut out, opts),
        })
        .expect("attention call");
        black_box(&mut self.out);
    }
}

#[derive(Debug, Clone, Copy)]
enum Kernel {
    Fused,
    Reference,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Fused => "fused",
            Kernel::Reference => "reference",
        }
    }
}

fn options(causal: bool) -> Options<'static> {
    if causal {
        Options::new().causal(Alignment::BottomRight)
    } else {
        Options::new()
    }
}

fn prefill(c: &mut Criterion) {
    eprintln!(
        "sdpa backend: {:?} (SDPA_BACKEND=avx2|avx512|portable forces one)",
        sdpa::backend()
    );
    for d in [64, 128] {
        for causal in [false, true] {
            for (threads, pool) in thread_settings() {
                let mask = if causal { "causal" } else { "noncausal" };
                let mut group = c.benchmark_group(format!("prefill_d{d}_{mask}_{threads}"));
                group
                    .sample_size(10)
                    .sampling_mode(SamplingMode::Flat)
                    .warm_up_time(Duration::from_millis(300))
                    .measurement_time(Duration::from_secs(2));
                let opts = options(causal);
                for n in PREFILL_NS.into_iter().filter(|&n| n <= max_n()) {
                    // Made on first use, so a filtered run skips the shapes it does not time.
                    let mut ops = None;
                    group.throughput(Throughput::Elements(flops(B, PREFILL_HEADS, n, n, d)));
                    let mut kernels = vec![Kernel::Fused];
                    if threads == "1t" && n <= REFERENCE_MAX_N {
                        kernels.push(Kernel::Reference);
                    }
                    for kernel in kernels {
                        group.bench_function(BenchmarkId::new(kernel.name(), n), |bench| {
                            let ops = ops.get_or_insert_with(|| {
                                Operands::new(PREFILL_HEADS, PREFILL_HEADS, n, n, d)
                            });
                            bench.iter(|| ops.call(pool, kernel, &opts))
                        });
                    }
                }
                group.finish();
            }
        }
    }
}

fn decode(c: &mut Criterion) {
    for (threads, pool) in thread_settings() {
        let name = format!("decode_d{DECODE_D}_h{DECODE_HEADS}_hkv{DECODE_KV_HEADS}_{threads}");
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        let opts = options(true);
        let max_nkv = if test_mode() {
            DECODE_NKVS[0]
        } else {
            usize::MAX
        };
        for n_kv in DECODE_NKVS.into_iter().filter(|&n| n <= max_nkv) {
            let mut ops = None;
            group.throughput(Throughput::Elements(flops(
                B,
                DECODE_HEADS,
                1,
                n_kv,
                DECODE_D,
            )));
            let mut kernels = vec![Kernel::Fused];
            if threads == "1t" && n_kv <= DECODE_REFERENCE_MAX_NKV {
                kernels.push(Kernel::Reference);
            }
            for kernel in kernels {
                group.bench_function(BenchmarkId::new(kernel.name(), n_kv), |bench| {
                    let ops = ops.get_or_insert_with(|| {
                        Operands::new(DECODE_HEADS, DECODE_KV_HEADS, 1, n_kv, DECODE_D)
                    });
                    bench.iter(|| ops.call(pool, kernel, &opts))
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, prefill, decode);
criterion_main!(benches);
