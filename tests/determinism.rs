//! The fused kernel's results do not depend on the thread count: block sizes depend on the
//! shape only and each query row is reduced in one fixed order, so pools of 1, 2 and 3 threads
//! (and repeated calls) must give identical bits of output and LSE.

mod common;

use common::{fused, Inputs, Layout, Outputs, Shape};
use sdpa::{Alignment, Options};

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

fn bits(o: &Outputs) -> Vec<u32> {
    o.out.iter().chain(&o.lse).map(|x| x.to_bits()).collect()
}

/// Many work items (B · H_kv · query blocks) so that every pool splits the work differently.
fn check(shape: Shape, opts: &Options, seed: u64) {
    let inp = Inputs::random(shape, [Layout::Bshd, Layout::Bhsd, Layout::Bshd], seed, 2.0);
    let pools = [pool(1), pool(2), pool(3)];
    let want = bits(&pools[0].install(|| fused(&inp, opts)));
    assert!(
        want.iter().all(|&b| f32::from_bits(b).is_finite()),
        "the reference run must be finite"
    );
    for (p, threads) in pools.iter().zip([1, 2, 3]) {
        for repeat in 0..2 {
            let got = bits(&p.install(|| fused(&inp, opts)));
            let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(
                first_diff, None,
                "{threads} threads, repeat {repeat}: results differ from 1 thread ({shape:?})"
            );
        }
    }
}

const SHAPE: Shape = Shape {
    batch: 2,
    heads: 8,
    kv_heads: 2,
    n_q: 500,
    n_kv: 500,
    d_k: 64,
    d_v: 64,
};

#[test]
fn unmasked_results_are_identical_for_any_thread_count() {
    check(SHAPE, &Options::new(), 1);
}

#[test]
fn causal_results_are_identical_for_any_thread_count() {
    check(SHAPE, &Options::new().causal(Alignment::TopLeft), 2);
}

#[test]
fn bottom_right_causal_with_unequal_lengths_is_identical_for_any_thread_count() {
    let shape = Shape {
        n_q: 300,
        n_kv: 700,
        heads: 6,
        kv_heads: 6,
        d_v: 40,
        ..SHAPE
    };
    check(shape, &Options::new().causal(Alignment::BottomRight), 3);
}

#[test]
fn decode_shape_is_identical_for_any_thread_count() {
    // One query row per sequence, many heads sharing few key/value heads.
    let shape = Shape {
        batch: 3,
        heads: 32,
        kv_heads: 4,
        n_q: 1,
        n_kv: 2000,
        d_k: 128,
        d_v: 128,
    };
    check(shape, &Options::new(), 4);
}
