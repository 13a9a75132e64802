//! Thread-count determinism and pool behaviour: the fused kernel gives bitwise identical results
//! on pools of 1, 2, 3 and 4 threads, when called from inside a pool's worker (nested
//! `install`, a `rayon::scope` task, a parallel iterator), and from several std threads at once
//! on the global pool and on their own pools.

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use sdpa::{Alignment, Options, Tensor, TensorMut};
use std::sync::OnceLock;

/// One attention problem with its inputs (contiguous BSHD).
struct Problem {
    name: &'static str,
    dims: [usize; 7], // batch, heads, kv_heads, n_q, n_kv, d_k, d_v
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    kv_lens: Vec<usize>,
}

/// The output bits and LSE bits of one run.
type Bits = (Vec<u32>, Vec<u32>);

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

impl Problem {
    fn new(name: &'static str, dims: [usize; 7], seed: u64) -> Problem {
        let [b, h, hk, n_q, n_kv, d_k, d_v] = dims;
        Problem {
            name,
            dims,
            q: values(b * n_q * h * d_k, seed),
            k: values(b * n_kv * hk * d_k, seed + 1),
            v: values(b * n_kv * hk * d_v, seed + 2),
            slopes: sdpa::alibi_slopes(h),
            sinks: values(h, seed + 3),
            kv_lens: (0..b).map(|i| n_kv - i % (n_kv + 1)).collect(),
        }
    }

    /// The options of this problem: plain, causal, or everything at once.
    fn options(&self) -> Options<'_> {
        match self.name {
            "prefill-causal-gqa" => Options::new().causal(Alignment::TopLeft),
            "options" => Options::new()
                .causal(Alignment::BottomRight)
                .sliding_window(64, 0, Alignment::BottomRight)
                .alibi(&self.slopes, Alignment::BottomRight)
                .softcap(30.0)
                .sinks(&self.sinks)
                .kv_lens(&self.kv_lens),
            _ => Options::new(),
        }
    }

    /// Runs `attention_lse` on whatever pool the caller is in.
    fn run(&self) -> Bits {
        let [b, h, hk, n_q, n_kv, d_k, d_v] = self.dims;
        let q = Tensor::bshd(&self.q, [b, n_q, h, d_k]).unwrap();
        let k = Tensor::bshd(&self.k, [b, n_kv, hk, d_k]).unwrap();
        let v = Tensor::bshd(&self.v, [b, n_kv, hk, d_v]).unwrap();
        let mut out = vec![f32::NAN; b * n_q * h * d_v];
        let mut lse = vec![f32::NAN; b * h * n_q];
        let mut view = TensorMut::bshd(&mut out, [b, n_q, h, d_v]).unwrap();
        sdpa::attention_lse(&q, &k, &v, &mut view, &mut lse, &self.options()).unwrap();
        (
            out.iter().map(|x| x.to_bits()).collect(),
            lse.iter().map(|x| x.to_bits()).collect(),
        )
    }
}

/// Prefill with GQA and causal masking, a decode step (one query row, long KV: the kernel may
/// split the keys across workers), and every option at once.
fn problems() -> &'static [Problem] {
    static P: OnceLock<Vec<Problem>> = OnceLock::new();
    P.get_or_init(|| {
        vec![
            Problem::new("prefill-causal-gqa", [2, 8, 2, 130, 130, 64, 64], 1),
            Problem::new("decode", [1, 8, 1, 1, 3000, 128, 128], 2),
            Problem::new("options", [3, 4, 2, 70, 200, 32, 48], 3),
        ]
    })
}

fn pool(threads: usize) -> ThreadPool {
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// The single-threaded result of every problem, computed once.
fn expected() -> &'static [Bits] {
    static E: OnceLock<Vec<Bits>> = OnceLock::new();
    E.get_or_init(|| pool(1).install(|| problems().iter().map(Problem::run).collect()))
}

fn assert_same(p: &Problem, got: &Bits, want: &Bits, context: &str) {
    assert!(
        got == want,
        "{}: result differs from the 1-thread run ({context})",
        p.name
    );
}

#[test]
fn identical_bits_on_1_2_3_4_threads() {
    for threads in [1, 2, 3, 4] {
        let pool = pool(threads);
        for (p, want) in problems().iter().zip(expected()) {
            // Twice per pool: a warm pool must not change anything either.
            for round in 0..2 {
                let got = pool.install(|| p.run());
                assert_same(p, &got, want, &format!("{threads} threads, round {round}"));
            }
        }
    }
}

#[test]
fn nested_install_in_a_worker() {
    let outer = pool(2);
    let inner = pool(3);
    for (p, want) in problems().iter().zip(expected()) {
        // The same pool, re-entered from its own worker.
        let got = outer.install(|| outer.install(|| p.run()));
        assert_same(p, &got, want, "install inside install of the same pool");
        // Another pool, from a worker of the first: the worker blocks until the inner pool is
        // done.
        let got = outer.install(|| inner.install(|| p.run()));
        assert_same(p, &got, want, "install of another pool inside a worker");
    }
}

#[test]
fn inside_scope_tasks_and_parallel_iterators() {
    let pool = pool(3);
    for (p, want) in problems().iter().zip(expected()) {
        let results = pool.install(|| {
            let mut results = vec![None, None, None];
            rayon::scope(|s| {
                for slot in results.iter_mut() {
                    s.spawn(move |_| *slot = Some(p.run()));
                }
            });
            results
        });
        for got in results {
            assert_same(p, &got.unwrap(), want, "inside rayon::scope tasks");
        }
        let results: Vec<Bits> = pool.install(|| (0..4).into_par_iter().map(|_| p.run()).collect());
        for got in &results {
            assert_same(p, got, want, "inside a parallel iterator");
        }
    }
}

#[test]
fn concurrent_std_threads_on_global_and_own_pools() {
    let want = expected();
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let own = pool(1 + t % 3);
                for round in 0..2 {
                    for (p, want) in problems().iter().zip(want) {
                        let context = format!("std thread {t}, round {round}");
                        assert_same(p, &p.run(), want, &format!("{context}, global pool"));
                        let got = own.install(|| p.run());
                        assert_same(p, &got, want, &format!("{context}, own pool"));
                    }
                }
            });
        }
    });
}
