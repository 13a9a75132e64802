//! Thread-count determinism and pool behaviour: the fused kernel gives bitwise identical results
//! on pools of 1, 2, 3 and 4 threads (block sizes depend on the shape only and each query row
//! is reduced in one fixed order), when called from inside a pool's worker (nested `install`, a
//! `rayon::scope` task, a parallel iterator), and from several std threads at once on the
//! global pool and on their own pools.

use crate::support;

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use sdpa::{Alignment, Options};
use std::sync::OnceLock;
use support::differential::Shape;
use support::layout::{Buffer, Layout, POISON, SENTINEL};
use support::values::SplitMix;

/// Which options a problem uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opts {
    Plain,
    Causal(Alignment),
    /// Causal, window, ALiBi, softcap, sinks and key lengths at once.
    All,
}

/// One attention problem with its inputs (K in `k_layout`, Q and V contiguous BSHD).
struct Problem {
    name: &'static str,
    shape: Shape,
    opts: Opts,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    kv_lens: Vec<usize>,
}

/// The output bits and LSE bits of one run.
type Bits = (Vec<u32>, Vec<u32>);

fn buffer(dims: [usize; 4], layout: Layout, seed: u64, range: f32) -> Buffer {
    let mut b = Buffer::new(dims, &layout, false, POISON);
    let n = dims.iter().product();
    let values = SplitMix::unit_values(n, seed);
    for (idx, x) in support::layout::indices(dims).zip(values) {
        b.set(idx, range * x);
    }
    b
}

impl Problem {
    fn new(name: &'static str, shape: Shape, opts: Opts, k_layout: Layout, seed: u64) -> Problem {
        let (b, h, n_kv) = (shape.batch, shape.heads, shape.n_kv);
        Problem {
            name,
            shape,
            opts,
            q: buffer(shape.q_dims(), Layout::BSHD, seed, 2.0),
            k: buffer(shape.k_dims(), k_layout, seed + 1, 1.0),
            v: buffer(shape.v_dims(), Layout::BSHD, seed + 2, 1.0),
            slopes: support::alibi_slopes(h).unwrap(),
            sinks: SplitMix::unit_values(h, seed + 3),
            kv_lens: (0..b).map(|i| n_kv - i % (n_kv + 1)).collect(),
        }
    }

    fn options(&self) -> Options<'_> {
        match self.opts {
            Opts::Plain => Options::new(),
            Opts::Causal(a) => Options::new().causal(a),
            Opts::All => Options::new()
                .causal(Alignment::BottomRight)
                .sliding_window(64, 0, Alignment::BottomRight)
                .alibi(&self.slopes, Alignment::BottomRight)
                .softcap(30.0)
                .sinks(&self.sinks)
                .kv_lens(&self.kv_lens),
        }
    }

    /// Runs `attention_lse` on whatever pool the caller is in.
    fn run(&self) -> Bits {
        let s = self.shape;
        let mut out = Buffer::new(s.out_dims(), &Layout::BSHD, true, SENTINEL);
        let mut lse = vec![f32::from_bits(SENTINEL); s.batch * s.heads * s.n_q];
        let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
        sdpa::attention_lse(&q, &k, &v, &mut out.view_mut(), &mut lse, &self.options()).unwrap();
        (
            out.data.iter().map(|x| x.to_bits()).collect(),
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
            Problem::new(
                "prefill-causal-gqa",
                Shape::new(2, 8, 2, 130, 130, 64, 64),
                Opts::Causal(Alignment::TopLeft),
                Layout::BSHD,
                1,
            ),
            Problem::new(
                "decode",
                Shape::new(1, 8, 1, 1, 3000, 128, 128),
                Opts::Plain,
                Layout::BSHD,
                2,
            ),
            Problem::new(
                "options",
                Shape::new(3, 4, 2, 70, 200, 32, 48),
                Opts::All,
                Layout::BSHD,
                3,
            ),
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

// Many work items (B · H_kv · query blocks) so that every pool splits the work differently;
// K in BHSD. (Formerly tests/determinism.rs.)

/// Pools of 1, 2 and 3 threads, twice each, give the bits of the 1-thread pool, and those are
/// finite.
fn identical_for_any_thread_count(p: &Problem) {
    let pools = [pool(1), pool(2), pool(3)];
    let want = pools[0].install(|| p.run());
    assert!(
        want.0
            .iter()
            .chain(&want.1)
            .all(|&b| f32::from_bits(b).is_finite()),
        "{}: the 1-thread run must be finite",
        p.name
    );
    for (pool, threads) in pools.iter().zip([1, 2, 3]) {
        for repeat in 0..2 {
            let got = pool.install(|| p.run());
            assert_same(
                p,
                &got,
                &want,
                &format!("{threads} threads, repeat {repeat}"),
            );
        }
    }
}

const SHAPE: Shape = Shape::new(2, 8, 2, 500, 500, 64, 64);

#[test]
fn unmasked_results_are_identical_for_any_thread_count() {
    let p = Problem::new("unmasked", SHAPE, Opts::Plain, Layout::BHSD, 11);
    identical_for_any_thread_count(&p);
}

#[test]
fn causal_results_are_identical_for_any_thread_count() {
    let opts = Opts::Causal(Alignment::TopLeft);
    let p = Problem::new("causal", SHAPE, opts, Layout::BHSD, 12);
    identical_for_any_thread_count(&p);
}

#[test]
fn bottom_right_causal_with_unequal_lengths_is_identical_for_any_thread_count() {
    let shape = Shape::new(2, 6, 6, 300, 700, 64, 40);
    let opts = Opts::Causal(Alignment::BottomRight);
    let p = Problem::new("bottom-right", shape, opts, Layout::BHSD, 13);
    identical_for_any_thread_count(&p);
}

#[test]
fn decode_shape_is_identical_for_any_thread_count() {
    // One query row per sequence, many heads sharing few key/value heads.
    let shape = Shape::new(3, 32, 4, 1, 2000, 128, 128);
    let p = Problem::new("decode-2000", shape, Opts::Plain, Layout::BHSD, 14);
    identical_for_any_thread_count(&p);
}
