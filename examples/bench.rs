//! Times the fused kernel on one shape and prints one JSON line in the schema of
//! `docs/bench-schema.md`, so it lines up with the peers' lines of `scripts/peer_time.py`
//! (`scripts/peers.sh` runs both over a grid of shapes).
//!
//! ```text
//! cargo run --release --example bench -- --b 1 --h 8 --nq 2048 --nkv 2048 --d 64 --threads 1
//! ```
//! Flags: `--b --h --hkv --nq --nkv --d --causal --threads --reps` (`--hkv` defaults to `--h`,
//! `--threads` to all cores, `--reps` to 5). Q, K, V are BHSD (PyTorch's layout) with values
//! uniform in [-1, 1). Prints the median of `reps` timed calls after one warm-up call.

use sdpa::{Alignment, Options, Tensor, TensorMut};
use std::time::Instant;

struct Args {
    b: usize,
    h: usize,
    hkv: usize,
    nq: usize,
    nkv: usize,
    d: usize,
    causal: bool,
    threads: usize,
    reps: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        b: 1,
        h: 8,
        hkv: 0,
        nq: 2048,
        nkv: 0,
        d: 64,
        causal: false,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        reps: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--causal" {
            a.causal = true;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse::<usize>()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--b" => a.b = value,
            "--h" => a.h = value,
            "--hkv" => a.hkv = value,
            "--nq" => a.nq = value,
            "--nkv" => a.nkv = value,
            "--d" => a.d = value,
            "--threads" => a.threads = value,
            "--reps" => a.reps = value.max(1),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.hkv == 0 {
        a.hkv = a.h;
    }
    if a.nkv == 0 {
        a.nkv = a.nq;
    }
    Ok(a)
}

/// Deterministic uniform values in [-1, 1) (a 64-bit LCG: no dependency, same data every run).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(2);
        }
    };
    let q = values(a.b * a.h * a.nq * a.d, 1);
    let k = values(a.b * a.hkv * a.nkv * a.d, 2);
    let v = values(a.b * a.hkv * a.nkv * a.d, 3);
    let mut out = vec![0.0f32; a.b * a.h * a.nq * a.d];
    let mut opts = Options::new();
    if a.causal {
        opts = opts.causal(Alignment::BottomRight);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()
        .expect("thread pool");
    let run = |out: &mut [f32]| -> f64 {
        let qt = Tensor::bhsd(&q, [a.b, a.h, a.nq, a.d]).expect("q");
        let kt = Tensor::bhsd(&k, [a.b, a.hkv, a.nkv, a.d]).expect("k");
        let vt = Tensor::bhsd(&v, [a.b, a.hkv, a.nkv, a.d]).expect("v");
        let mut ot = TensorMut::bhsd(out, [a.b, a.h, a.nq, a.d]).expect("out");
        let t = Instant::now();
        pool.install(|| sdpa::attention(&qt, &kt, &vt, &mut ot, &opts))
            .expect("attention");
        t.elapsed().as_secs_f64()
    };
    run(&mut out);
    let mut times: Vec<f64> = (0..a.reps).map(|_| run(&mut out)).collect();
    times.sort_by(f64::total_cmp);
    let s = times[times.len() / 2];
    let flops = 4.0 * (a.b * a.h * a.nq * a.nkv * a.d) as f64;
    println!(
        "{{\"kernel\": \"sdpa\", \"s\": {s:.6e}, \"gflops\": {:.3}, \"b\": {}, \"h\": {}, \"hkv\": {}, \"nq\": {}, \"nkv\": {}, \"d\": {}, \"causal\": {}, \"threads\": {}}}",
        flops / s / 1e9,
        a.b,
        a.h,
        a.hkv,
        a.nq,
        a.nkv,
        a.d,
        a.causal,
        a.threads
    );
}
