//! The fused kernel's extra memory does not grow with the sequence length.
//!
//! This binary installs a counting `#[global_allocator]` (the system allocator plus atomic
//! counters of live and peak bytes) and holds a single test, so that no other test allocates
//! while it measures. The peak heap *during a call* is the peak minus the bytes live before
//! it; inputs and outputs are allocated before. Run with `--nocapture` to see the numbers.

use sdpa::{Options, Tensor, TensorMut};

/// The parts of `tests/support/` this test uses, not the whole module: this binary is on its
/// own (see above), and compiling the rest of the harness once more would only cost build time.
#[allow(dead_code)]
mod support {
    pub mod bytes;
    #[path = "../../benches/support/counting_alloc.rs"]
    pub mod counting_alloc;
    pub mod values;
}
use support::counting_alloc::{with_peak_heap, CountingAlloc};
use support::values::SplitMix;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The peak heap `f` used above the level it started at.
fn peak_during(f: impl FnOnce()) -> usize {
    with_peak_heap(f).1
}

const KIB: usize = 1024;

struct Problem {
    dims_q: [usize; 4],
    dims_kv: [usize; 4],
    q: Vec<f32>,
    kv: Vec<f32>,
    out: Vec<f32>,
    lse: Vec<f32>,
}

fn problem(n: usize, heads: usize, d: usize) -> Problem {
    let len = n * heads * d;
    Problem {
        dims_q: [1, n, heads, d],
        dims_kv: [1, n, heads, d],
        q: SplitMix::unit_values(len, n as u64),
        kv: SplitMix::unit_values(len, !(n as u64)),
        out: vec![0.0; len],
        lse: vec![0.0; heads * n],
    }
}

fn call(p: &mut Problem) {
    let q = Tensor::bshd(&p.q, p.dims_q).unwrap();
    let kv = Tensor::bshd(&p.kv, p.dims_kv).unwrap();
    let mut out = TensorMut::bshd(&mut p.out, p.dims_q).unwrap();
    sdpa::attention_lse(&q, &kv, &kv, &mut out, &mut p.lse, &Options::new()).unwrap();
}

#[test]
fn peak_heap_of_a_call_does_not_grow_with_sequence_length() {
    const HEADS: usize = 2;
    const D: usize = 64;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut short = problem(1024, HEADS, D);
    let mut long = problem(16384, HEADS, D);
    // Warm-up: the pool's threads start, the backend is detected, lazy statics fill.
    pool.install(|| call(&mut short));

    // The peak depends on how many workers happen to hold scratch at once: take the largest
    // of three short calls as the baseline (the long call keeps both workers busy anyway).
    let mut peak_short = 0;
    for _ in 0..3 {
        peak_short = peak_short.max(peak_during(|| pool.install(|| call(&mut short))));
    }
    let started = std::time::Instant::now();
    let peak_long = peak_during(|| pool.install(|| call(&mut long)));
    let long_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "peak heap during a call (B=1, H={HEADS}, d={D}, 2 threads): n=1024: {} B ({:.1} KiB), \
         n=16384: {} B ({:.1} KiB); inputs at n=16384: {:.1} MiB; one n=16384 call {:.2} s",
        peak_short,
        peak_short as f64 / KIB as f64,
        peak_long,
        peak_long as f64 / KIB as f64,
        (long.q.len() + long.kv.len()) as f64 * 4.0 / (KIB * KIB) as f64,
        long_secs,
    );
    assert!(
        peak_short > 0,
        "the kernel's scratch should show up in the count"
    );
    assert!(
        peak_short < 4 * KIB * KIB,
        "peak heap at n=1024 is {peak_short} B, expected < 4 MiB"
    );
    assert!(
        peak_long <= peak_short + 8 * KIB,
        "peak heap grew with the sequence length: {peak_short} B at n=1024, {peak_long} B at \
         n=16384"
    );
    // The output is a real result, not skipped work.
    assert!(long.out.iter().all(|x| x.is_finite()) && long.lse.iter().all(|x| x.is_finite()));
}
