//! Times the fused kernel on one shape and prints one JSON line in the schema of
//! `docs/bench-schema.md`, so it lines up with the peers' lines of `scripts/peer_time.py`
//! (`scripts/peers.sh` runs both over a grid of shapes).
//!
//! ```text
//! cargo run --release --example bench -- --b 1 --h 8 --nq 2048 --nkv 2048 --d 64 --threads 1
//! ```
//! Flags: `--b --h --hkv --nq --nkv --d --causal --threads --reps --peak --kv --q
//! --bf16-products` (`--hkv` defaults
//! to `--h`, `--threads` to all cores, `--reps` to 5). Q, K, V are BHSD (PyTorch's layout) with
//! values uniform in [-1, 1). Prints the median of `reps` timed calls after [`WARM_UP_S`] of
//! untimed calls (at least one).
//! `--kv f16` or `--kv bf16` stores K and V in that type (the same values, rounded; Q and the
//! output stay f32, as llama.cpp runs an f16 cache), and the line then carries `kv_dtype`;
//! `--q bf16` stores Q and the output in bf16 too (`q_dtype`). `--bf16-products` sets
//! `Options::bf16_products` (the line carries `"bf16_products": true`): with `--q bf16 --kv bf16`
//! on a CPU with AVX512_BF16, prefill's products then run as bf16 dot products.
//!
//! `--peak` (x86-64) also measures the machine's f32 FMA peak for the vector width of the
//! backend sdpa runs (512-bit FMAs for AVX-512, 256-bit for AVX2): a loop of independent FMAs
//! on registers only, run on every thread of the pool at once for ~20 ms right before each
//! timed call. The line then carries `peak_gflops` (median of those bursts) and `pct_peak`
//! (median over the calls of each call's GFLOP/s over the burst just before it): on a shared
//! VM, where a busy neighbour on the same physical core slows both alike, that ratio moves far
//! less than either figure. Where the CPU has AVX512_BF16 it also carries `peak_bf16_gflops`:
//! the same kind of burst of 512-bit `vdpbf16ps` (bf16 pairs multiplied and summed into f32),
//! measured once, for comparison with the f32 FMA peak. Where sdpa runs AMX tiles
//! (`sdpa::amx_available()`, the hardware) it carries `peak_amx_gflops`, a burst of `tdpbf16ps`
//! on tile registers (four independent accumulators), and, with `--bf16-products`,
//! `pct_amx_peak`: the call's GFLOP/s over it (the tile kernel's share of the tile peak).

use sdpa::half::{bf16, f16};
use sdpa::{Alignment, Element, KvElement, Options, Tensor, TensorMut};
use std::time::Instant;

const USAGE: &str = "usage: bench [--b N] [--h N] [--hkv N] [--nq N] [--nkv N] [--d N] \
[--causal] [--threads N] [--reps N] [--peak] [--kv f32|f16|bf16] [--q f32|bf16] [--bf16-products]";

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
    peak: bool,
    kv: KvType,
    /// `--q bf16`: Q and the output in bf16 too.
    q_bf16: bool,
    /// `--bf16-products`: `Options::bf16_products`.
    bf16_products: bool,
}

/// The element type K and V are stored in (`--kv`).
#[derive(Clone, Copy, PartialEq)]
enum KvType {
    F32,
    F16,
    Bf16,
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
        peak: false,
        kv: KvType::F32,
        q_bf16: false,
        bf16_products: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--causal" || flag == "--peak" || flag == "--bf16-products" {
            a.causal |= flag == "--causal";
            a.peak |= flag == "--peak";
            a.bf16_products |= flag == "--bf16-products";
            continue;
        }
        if flag == "--q" {
            a.q_bf16 = match it.next().as_deref() {
                Some("f32") => false,
                Some("bf16") => true,
                other => return Err(format!("--q {other:?}: expected f32 or bf16")),
            };
            continue;
        }
        if flag == "--kv" {
            a.kv = match it.next().as_deref() {
                Some("f32") => KvType::F32,
                Some("f16") => KvType::F16,
                Some("bf16") => KvType::Bf16,
                other => {
                    return Err(match other {
                        Some(x) => format!("--kv {x}: expected f32, f16 or bf16"),
                        None => "--kv needs a value: f32, f16 or bf16".to_string(),
                    })
                }
            };
            continue;
        }
        const NUMBERS: [&str; 8] = [
            "--b",
            "--h",
            "--hkv",
            "--nq",
            "--nkv",
            "--d",
            "--threads",
            "--reps",
        ];
        if !NUMBERS.contains(&flag.as_str()) {
            return Err(format!("unknown flag {flag}"));
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
            eprintln!("bench: {e}\n{USAGE}");
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
    if a.bf16_products {
        opts = opts.bf16_products();
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()
        .expect("thread pool");
    // K and V rounded to the `--kv` type once, before any timing (empty when not used).
    fn rounded<T>(x: &[f32], used: bool, f: fn(f32) -> T) -> Vec<T> {
        match used {
            true => x.iter().map(|&x| f(x)).collect(),
            false => Vec::new(),
        }
    }
    let half = a.kv == KvType::F16;
    let (k16, v16) = (
        rounded(&k, half, f16::from_f32),
        rounded(&v, half, f16::from_f32),
    );
    let brain = a.kv == KvType::Bf16;
    let (kb16, vb16) = (
        rounded(&k, brain, bf16::from_f32),
        rounded(&v, brain, bf16::from_f32),
    );
    let (qb16, mut outb16) = (
        rounded(&q, a.q_bf16, bf16::from_f32),
        rounded(&out, a.q_bf16, bf16::from_f32),
    );
    /// One timed call with Q and the output of type `Q`, K/V of type `T`.
    fn call<Q: Element, T: KvElement>(
        a: &Args,
        q: &[Q],
        (k, v): (&[T], &[T]),
        out: &mut [Q],
        opts: &Options,
        pool: &rayon::ThreadPool,
    ) -> f64 {
        let qt = Tensor::bhsd(q, [a.b, a.h, a.nq, a.d]).expect("q");
        let kt = Tensor::bhsd(k, [a.b, a.hkv, a.nkv, a.d]).expect("k");
        let vt = Tensor::bhsd(v, [a.b, a.hkv, a.nkv, a.d]).expect("v");
        let mut ot = TensorMut::bhsd(out, [a.b, a.h, a.nq, a.d]).expect("out");
        let t = Instant::now();
        pool.install(|| sdpa::attention(&qt, &kt, &vt, &mut ot, opts))
            .expect("attention");
        t.elapsed().as_secs_f64()
    }
    let mut run = |out: &mut [f32]| -> f64 {
        match (a.kv, a.q_bf16) {
            (KvType::Bf16, true) => call(&a, &qb16, (&kb16, &vb16), &mut outb16, &opts, &pool),
            (KvType::F16, true) => call(&a, &qb16, (&k16, &v16), &mut outb16, &opts, &pool),
            (KvType::F32, true) => call(&a, &qb16, (&k, &v), &mut outb16, &opts, &pool),
            (KvType::F16, false) => call(&a, &q, (&k16, &v16), out, &opts, &pool),
            (KvType::Bf16, false) => call(&a, &q, (&kb16, &vb16), out, &opts, &pool),
            (KvType::F32, false) => call(&a, &q, (&k, &v), out, &opts, &pool),
        }
    };
    let warm = Instant::now();
    loop {
        run(&mut out);
        if warm.elapsed().as_secs_f64() >= WARM_UP_S {
            break;
        }
    }
    let flops = 4.0 * (a.b * a.h * a.nq * a.nkv * a.d) as f64;
    let mut times = Vec::with_capacity(a.reps);
    let mut peaks = Vec::with_capacity(a.reps);
    let mut fractions = Vec::with_capacity(a.reps);
    for _ in 0..a.reps {
        let peak = if a.peak {
            peak::gflops(&pool, 0.02)
        } else {
            None
        };
        let t = run(&mut out);
        times.push(t);
        if let Some(p) = peak {
            peaks.push(p);
            fractions.push(flops / t / 1e9 / p);
        }
    }
    let s = median(&mut times);
    let kv_field = match a.kv {
        KvType::F32 => String::new(),
        KvType::F16 => ", \"kv_dtype\": \"f16\"".to_string(),
        KvType::Bf16 => ", \"kv_dtype\": \"bf16\"".to_string(),
    } + if a.q_bf16 {
        ", \"q_dtype\": \"bf16\""
    } else {
        ""
    } + if a.bf16_products {
        ", \"bf16_products\": true"
    } else {
        ""
    };
    let peak_fields = if peaks.is_empty() {
        String::new()
    } else {
        // The bf16 dot-product rate, where the CPU has it, for comparison with the f32 peak.
        let mut bf16 = peak::bf16_gflops(&pool, 0.02)
            .map_or(String::new(), |g| format!(", \"peak_bf16_gflops\": {g:.1}"));
        if let Some(g) = peak::amx_gflops(&pool, 0.02) {
            bf16 += &format!(", \"peak_amx_gflops\": {g:.1}");
            if a.bf16_products {
                bf16 += &format!(", \"pct_amx_peak\": {:.1}", 100.0 * flops / s / 1e9 / g);
            }
        }
        format!(
            ", \"peak_gflops\": {:.1}, \"pct_peak\": {:.1}{bf16}",
            median(&mut peaks),
            100.0 * median(&mut fractions)
        )
    };
    println!(
        "{{\"kernel\": \"sdpa\", \"s\": {s:.6e}, \"gflops\": {:.3}, \"b\": {}, \"h\": {}, \"hkv\": {}, \"nq\": {}, \"nkv\": {}, \"d\": {}, \"causal\": {}, \"threads\": {}{kv_field}{peak_fields}}}",
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

/// Seconds of untimed calls before the timed ones. One call is not enough for short calls on
/// more than one thread: a core that was idle before the run starts slowly (measured on a
/// 2-core VM, 2026-12-02: B = 1, H = 8, causal n = 512, d = 64, two threads, 20 calls after one
/// warm-up call: 196–222 GFLOP/s, no faster than one thread; the same calls after 20 ms of
/// integer work on both threads: 317–354), and a 2.5 ms call never gets there. The peers'
/// script (`scripts/peer_time.py`) warms up for the same time, so neither side gains.
const WARM_UP_S: f64 = 0.2;

fn median(x: &mut [f64]) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

/// The f32 FMA peak of the pool's threads, for the vector width of sdpa's backend.
mod peak {
    /// GFLOP/s of all the pool's threads running independent FMAs for about `seconds`, or
    /// `None` where there is no x86-64 vector backend to compare with.
    pub fn gflops(pool: &rayon::ThreadPool, seconds: f64) -> Option<f64> {
        let per_thread = pool.broadcast(|_| burst(seconds));
        per_thread.into_iter().sum()
    }

    /// One thread's FMA rate in GFLOP/s over about `seconds`.
    #[cfg(target_arch = "x86_64")]
    fn burst(seconds: f64) -> Option<f64> {
        let (lanes, run): (usize, fn(u64) -> f32) = match sdpa::backend() {
            sdpa::Backend::Avx512 => (16, fma_512),
            sdpa::Backend::Avx2Fma => (8, fma_256),
            _ => return None,
        };
        Some(rate(run, seconds, ACCUMULATORS as u64 * lanes as u64 * 2))
    }

    /// GFLOP/s of `run(steps)` (`flops_per_step` each) over about `seconds`: the step count is
    /// calibrated from 4096 (~25 µs of FMAs) up to the wanted time.
    #[cfg(target_arch = "x86_64")]
    fn rate(run: impl Fn(u64) -> f32, seconds: f64, flops_per_step: u64) -> f64 {
        let mut steps = 4096u64;
        loop {
            let t = std::time::Instant::now();
            std::hint::black_box(run(std::hint::black_box(steps)));
            let s = t.elapsed().as_secs_f64();
            if s >= seconds || steps >= 1 << 40 {
                return (steps * flops_per_step) as f64 / s / 1e9;
            }
            steps = (steps as f64 * (1.2 * seconds / s.max(1e-6)).min(64.0)) as u64;
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn burst(_seconds: f64) -> Option<f64> {
        None
    }

    /// GFLOP/s (two per multiply-add) of all the pool's threads running independent 512-bit
    /// `vdpbf16ps` (AVX512_BF16: 32 bf16 products summed pairwise into 16 f32 lanes) for about
    /// `seconds`, or `None` where the CPU lacks that instruction.
    pub fn bf16_gflops(pool: &rayon::ThreadPool, seconds: f64) -> Option<f64> {
        let per_thread = pool.broadcast(|_| bf16_burst(seconds));
        per_thread.into_iter().sum()
    }

    #[cfg(target_arch = "x86_64")]
    fn bf16_burst(seconds: f64) -> Option<f64> {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")) {
            return None;
        }
        // SAFETY: both features were detected just above.
        let run = |steps| unsafe { dpbf16_512_body(steps) };
        Some(rate(run, seconds, ACCUMULATORS as u64 * 64))
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn bf16_burst(_seconds: f64) -> Option<f64> {
        None
    }

    /// GFLOP/s (two per multiply-add) of all the pool's threads running `tdpbf16ps` on tile
    /// registers for about `seconds`, where sdpa runs AMX tiles on the hardware (not its
    /// software model, `SDPA_AMX=model`), else `None`.
    pub fn amx_gflops(pool: &rayon::ThreadPool, seconds: f64) -> Option<f64> {
        let model = std::env::var("SDPA_AMX").is_ok_and(|v| v == "model");
        if model || !sdpa::amx_available() {
            return None;
        }
        let per_thread = pool.broadcast(|_| amx_burst(seconds));
        per_thread.into_iter().sum()
    }

    /// One thread's `tdpbf16ps` rate: 4 per step, each 16 × 16 × 32 multiply-adds.
    #[cfg(target_arch = "x86_64")]
    fn amx_burst(seconds: f64) -> Option<f64> {
        // SAFETY: `amx_available()` held (the caller), with the hardware: the CPU has AMX-TILE
        // and AMX-BF16 and sdpa obtained Linux's permission for the tile state for this process.
        let run = |steps| unsafe { tile_body(steps) };
        Some(rate(run, seconds, 4 * 16 * 16 * 32 * 2))
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn amx_burst(_seconds: f64) -> Option<f64> {
        None
    }

    /// `steps` × four `tdpbf16ps` into four independent accumulators (tiles 0–3) from zeroed
    /// A (4, 5) and B (6, 7) tiles, all 16 rows × 64 bytes. Safety: AMX-TILE and AMX-BF16, with
    /// the process's permission for the tile state.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_body(steps: u64) -> f32 {
        // ldtilecfg's operand: palette 1, then 16 two-byte row sizes and 16 row counts.
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = 16;
        }
        let steps = steps.max(1);
        // SAFETY: the caller's contract; the configuration is valid (8 tiles of 16 × 64
        // bytes), the tiles are registers only, and the tile state is released before
        // returning.
        unsafe {
            std::arch::asm!(
                "ldtilecfg [{cfg}]",
                "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                "tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7",
                "2:",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "dec {n}",
                "jnz 2b",
                "tilerelease",
                cfg = in(reg) &cfg,
                n = inout(reg) steps => _,
                options(nostack, readonly)
            );
        }
        0.0
    }

    /// Independent FMA chains per loop step: enough to cover the FMA latency (4 cycles) on two
    /// ports with room to spare, few enough to stay in registers on both widths.
    #[cfg(target_arch = "x86_64")]
    const ACCUMULATORS: usize = 12;

    #[cfg(target_arch = "x86_64")]
    fn hint(x: f32) -> f32 {
        std::hint::black_box(x)
    }

    #[cfg(target_arch = "x86_64")]
    fn fma_512(steps: u64) -> f32 {
        // SAFETY: called only when sdpa chose its AVX-512 backend, which requires AVX-512F.
        unsafe { fma_512_body(steps) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn fma_512_body(steps: u64) -> f32 {
        use std::arch::x86_64::*;
        // Values the compiler cannot see, so that it cannot fold the chains.
        let (a, b) = (_mm512_set1_ps(hint(0.999_9)), _mm512_set1_ps(hint(1e-4)));
        let mut acc = [_mm512_set1_ps(hint(0.5)); ACCUMULATORS];
        for _ in 0..steps {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dpbf16_512_body(steps: u64) -> f32 {
        use std::arch::x86_64::*;
        // bf16 pairs (1.0, 1.0) and (≈ 1e-4, ≈ 1e-4): the sums grow by ~2e-4 per step.
        let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(hint_i32(0x3f80_3f80)));
        let b: __m512bh = std::mem::transmute(_mm512_set1_epi32(hint_i32(0x38d2_38d2)));
        let mut acc = [_mm512_set1_ps(hint(0.5)); ACCUMULATORS];
        for _ in 0..steps {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, a, b);
            }
        }
        acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
    }

    #[cfg(target_arch = "x86_64")]
    fn hint_i32(x: i32) -> i32 {
        std::hint::black_box(x)
    }

    #[cfg(target_arch = "x86_64")]
    fn fma_256(steps: u64) -> f32 {
        // SAFETY: called only when sdpa chose its AVX2 backend, which requires AVX2 and FMA.
        unsafe { fma_256_body(steps) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_256_body(steps: u64) -> f32 {
        use std::arch::x86_64::*;
        let (a, b) = (_mm256_set1_ps(hint(0.999_9)), _mm256_set1_ps(hint(1e-4)));
        let mut acc = [_mm256_set1_ps(hint(0.5)); ACCUMULATORS];
        for _ in 0..steps {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut lanes = [0.0f32; 8];
        let mut sum = 0.0;
        for x in acc {
            _mm256_storeu_ps(lanes.as_mut_ptr(), x);
            sum += lanes.iter().sum::<f32>();
        }
        sum
    }
}
