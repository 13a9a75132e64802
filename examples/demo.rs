//! The sdpa demo: `cargo run --release --example demo`.
//!
//! Part 1 walks through a 3-token, head-size-2 example by hand (scores, scaling, softmax, the
//! weighted sum of V) and checks each step against the library. Part 2 times the fused kernel
//! against the f64 reference for growing sequence lengths and reports the peak extra heap of
//! each call, measured by the counting allocator below.
//!
//! Runs on rayon's global pool: `RAYON_NUM_THREADS=1` for one thread, `SDPA_BACKEND=portable` to
//! force the portable SIMD backend.

use sdpa::{Options, Tensor, TensorMut};
use std::time::Instant;

// ---------------------------------------------------------------------------------------------
// Heap accounting: the system allocator, plus the bytes currently allocated and their peak.

#[path = "../benches/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{with_peak_heap, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------------------------
// Part 1: the worked example.

type Matrix = Vec<Vec<f64>>;

fn print_matrix(title: &str, m: &[Vec<f64>]) {
    println!("  {title}");
    for row in m {
        let cells: Vec<String> = row.iter().map(|x| format!("{x:7.4}")).collect();
        println!("    [{} ]", cells.join(""));
    }
}

fn to_f32(m: &[Vec<f64>]) -> Vec<f32> {
    m.iter().flatten().map(|&x| x as f32).collect()
}

fn from_f32(data: &[f32], cols: usize) -> Matrix {
    data.chunks(cols)
        .map(|r| r.iter().map(|&x| f64::from(x)).collect())
        .collect()
}

fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// `out = softmax(Q·Kᵀ·scale)·V` for one sequence and one head (contiguous `[n, d]` rows), on
/// the fused kernel (`reference = false`) or the f64 reference.
fn one_head(q: &[Vec<f64>], k: &[Vec<f64>], v: &[Vec<f64>], reference: bool) -> Matrix {
    let (n_q, n_kv, d_k, d_v) = (q.len(), k.len(), q[0].len(), v[0].len());
    let (qf, kf, vf) = (to_f32(q), to_f32(k), to_f32(v));
    let mut out = vec![0.0f32; n_q * d_v];
    let qt = Tensor::bshd(&qf, [1, n_q, 1, d_k]).expect("q view");
    let kt = Tensor::bshd(&kf, [1, n_kv, 1, d_k]).expect("k view");
    let vt = Tensor::bshd(&vf, [1, n_kv, 1, d_v]).expect("v view");
    let mut ot = TensorMut::bshd(&mut out, [1, n_q, 1, d_v]).expect("out view");
    let opts = Options::new(); // scale = 1/√d_k
    if reference {
        sdpa::reference::attention(&qt, &kt, &vt, &mut ot, &opts).expect("reference");
    } else {
        sdpa::attention(&qt, &kt, &vt, &mut ot, &opts).expect("attention");
    }
    from_f32(&out, d_v)
}

fn worked_example() {
    println!("Part 1: the worked example (3 tokens, d_k = 2, scale = 1/√2)\n");
    let q: Matrix = vec![vec![1.0, 0.0], vec![1.0, 1.0], vec![0.0, 1.0]];
    let k = q.clone();
    let v: Matrix = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]];
    print_matrix("Q = K", &q);
    print_matrix("V", &v);

    // The formula, step by step, in f64.
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let scores: Matrix = q
        .iter()
        .map(|qi| k.iter().map(|kj| dot(qi, kj)).collect())
        .collect();
    let scale = 1.0 / 2f64.sqrt();
    let scaled: Matrix = scores
        .iter()
        .map(|r| r.iter().map(|s| s * scale).collect())
        .collect();
    let weights: Matrix = scaled
        .iter()
        .map(|r| {
            let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = r.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.iter().map(|x| x / sum).collect()
        })
        .collect();
    let by_hand: Matrix = weights
        .iter()
        .map(|p| {
            (0..v[0].len())
                .map(|c| p.iter().zip(&v).map(|(pj, vj)| pj * vj[c]).sum())
                .collect()
        })
        .collect();
    println!();
    print_matrix("raw scores Q·Kᵀ", &scores);
    print_matrix("scaled scores Q·Kᵀ/√2", &scaled);
    print_matrix("softmax weights, from the formula (f64)", &weights);

    // With V = identity, the output rows are the weights themselves.
    let identity: Matrix = (0..3)
        .map(|i| (0..3).map(|j| f64::from(u8::from(i == j))).collect())
        .collect();
    let sdpa_weights = one_head(&q, &k, &identity, false);
    print_matrix(
        "softmax weights, from sdpa::attention with V = I",
        &sdpa_weights,
    );
    println!(
        "    max |sdpa − formula| = {:.1e}",
        max_abs_diff(&sdpa_weights, &weights)
    );

    let fused = one_head(&q, &k, &v, false);
    let reference = one_head(&q, &k, &v, true);
    println!();
    print_matrix("output, weights · V by hand (f64)", &by_hand);
    print_matrix("output, sdpa::attention (fused kernel)", &fused);
    print_matrix(
        "output, sdpa::reference::attention (f64 oracle)",
        &reference,
    );
    println!("    expected ≈ [0.599 0.599], [0.497 0.752], [0.599 0.802]");
    println!(
        "    max |fused − reference| = {:.1e}, max |reference − by hand| = {:.1e}\n",
        max_abs_diff(&fused, &reference),
        max_abs_diff(&reference, &by_hand)
    );
}

// ---------------------------------------------------------------------------------------------
// Part 2: speed and memory for growing n.

/// Deterministic values uniform in [-1, 1): a 64-bit LCG, the same data every run.
fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn fmt_time(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn fmt_bytes(b: usize) -> String {
    let b = b as f64;
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.0} KiB", b / 1024.0)
    } else {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    }
}

/// Seconds one reference call may take; the table stops running the reference beyond it.
const REFERENCE_LIMIT_S: f64 = 2.0;
/// Timed fused calls per size stop once they have taken this long (at least 3 are made).
const FUSED_BUDGET_S: f64 = 1.0;

fn scaling_table() {
    let (b, h, d) = (1usize, 8usize, 64usize);
    println!(
        "Part 2: fused kernel vs f64 reference, B = {b}, H = {h}, d = {d}, non-causal, BSHD f32"
    );
    println!("  fused: median of ≥ 3 calls after a warm-up; reference: one call, run while it");
    println!("  stays under {REFERENCE_LIMIT_S} s; GFLOP/s = 4·B·H·n²·d / fused time;");
    println!("  heap = peak bytes allocated during the call (inputs and outputs excluded)\n");
    println!(
        "  {:>5} | {:>9} | {:>9} | {:>8} | {:>7} | {:>10} | {:>10} | {:>13}",
        "n", "fused", "reference", "speed-up", "GFLOP/s", "fused heap", "ref heap", "max |f − ref|"
    );
    println!("  {}", "-".repeat(96));

    let mut reference_next = true;
    for n in [256usize, 512, 1024, 2048, 4096] {
        let len = b * n * h * d;
        let (q, k, v) = (uniform(len, 1), uniform(len, 2), uniform(len, 3));
        let dims = [b, n, h, d];
        let qt = Tensor::bshd(&q, dims).expect("q view");
        let kt = Tensor::bshd(&k, dims).expect("k view");
        let vt = Tensor::bshd(&v, dims).expect("v view");
        let opts = Options::new();
        let mut out = vec![0.0f32; len];
        let call = |out: &mut [f32]| -> f64 {
            let mut ot = TensorMut::bshd(out, dims).expect("out view");
            let t = Instant::now();
            sdpa::attention(&qt, &kt, &vt, &mut ot, &opts).expect("attention");
            t.elapsed().as_secs_f64()
        };

        // Warm-up call, which also measures the heap.
        let (_, fused_heap) = with_peak_heap(|| call(&mut out));
        let mut times = Vec::new();
        let mut spent = 0.0;
        while times.len() < 3 || (spent < FUSED_BUDGET_S && times.len() < 15) {
            let t = call(&mut out);
            spent += t;
            times.push(t);
        }
        times.sort_by(f64::total_cmp);
        let fused_s = times[times.len() / 2];
        let gflops = 4.0 * (b * h * n * n * d) as f64 / fused_s / 1e9;

        let (ref_s, ref_heap, diff) = if reference_next {
            let mut ref_out = vec![0.0f32; len];
            let (ref_s, ref_heap) = with_peak_heap(|| {
                let mut ot = TensorMut::bshd(&mut ref_out, dims).expect("out view");
                let t = Instant::now();
                sdpa::reference::attention(&qt, &kt, &vt, &mut ot, &opts).expect("reference");
                t.elapsed().as_secs_f64()
            });
            let diff = out
                .iter()
                .zip(&ref_out)
                .map(|(a, r)| (a - r).abs())
                .fold(0.0f32, f32::max);
            // Quadratic cost: the next size (twice n) takes about 4× as long.
            reference_next = ref_s * 4.0 < REFERENCE_LIMIT_S;
            (Some(ref_s), Some(ref_heap), Some(diff))
        } else {
            (None, None, None)
        };

        let dash = || "—".to_string();
        println!(
            "  {:>5} | {:>9} | {:>9} | {:>8} | {:>7.1} | {:>10} | {:>10} | {:>13}",
            n,
            fmt_time(fused_s),
            ref_s.map_or_else(dash, fmt_time),
            ref_s.map_or_else(dash, |r| format!("{:.0}×", r / fused_s)),
            gflops,
            fmt_bytes(fused_heap),
            ref_heap.map_or_else(dash, fmt_bytes),
            diff.map_or_else(dash, |x| format!("{x:.1e}")),
        );
    }
}

fn main() {
    let threads = rayon::current_num_threads();
    println!(
        "sdpa demo: backend {:?}, {threads} rayon thread(s)\n",
        sdpa::backend()
    );
    worked_example();
    scaling_table();
}
