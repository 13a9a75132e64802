//! Decode at memory speed: effective K/V read bandwidth of single-token decode over many
//! layers' KV caches (together beyond the last-level cache), next to the machine's read
//! bandwidth measured in the same run.
//!
//! ```text
//! cargo run --release --example decode_bench -- --threads 1
//! ```
//! One decode step: for each of `L` layers, one query token (B = 1, H = 32, H_kv = 8,
//! d = 128, f32 Q and output) against that layer's own K/V cache of `n_kv` keys (BSHD, K/V of
//! the given type), through one reused [`Workspace`]. `L` is chosen so that the layers hold at
//! least `--gib` GiB (default 1) of K/V: with the 260 MB L3 of the development machine, every
//! step reads its caches from memory, as an engine's decode does. Effective bandwidth = K/V
//! bytes of all layers / step time.
//!
//! The machine's read bandwidth is a plain sum over a 1 GiB buffer (16 independent f32
//! accumulators per thread, split over the same pool). The two are alternated `--rounds`
//! times and their medians compared: `sdpa/read` is the fraction of the measured bandwidth
//! sdpa reaches.
//!
//! i8 caches come with per-(token, kv head) scales (`Options::kv_scales`), whose bytes are
//! counted as K/V bytes; `i8c` is the same cache with per-(kv head, channel) scales and `i8t`
//! with one scale per tensor (both broadcast views, their few bytes counted too).
//!
//! `bf16p` is a bf16 cache read by bf16 dot products (`Options::bf16_products`; AVX512_BF16),
//! which take bf16 Q too: Q is then bf16 (the output stays f32).
//!
//! `--batched` adds B = 8 sequences of 1k…32k live keys in `[8, 32768, H_kv, d]` buffers
//! (`kv_lens`), counting only the live keys' bytes.
//!
//! Flags: `--threads N` (default: all cores), `--rounds N` (default 5), `--gib X`,
//! `--n-kv a,b,c` (default 4096,16384,65536), `--types f32,f16,bf16,i8` (and `bf16p`, `i8c`,
//! `i8t`),
//! `--batched`, `--bhsd`
//! (caches laid out `[B, H_kv, n_kv, d]` instead of `[B, n_kv, H_kv, d]`).

use sdpa::half::{bf16, f16};
use sdpa::{Alignment, Element, KvElement, Options, Tensor, TensorMut, Workspace};
use std::hint::black_box;
use std::time::Instant;

const H: usize = 32;
const H_KV: usize = 8;
const D: usize = 128;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

/// Seconds per call of `f`, repeated until at least 0.2 s have passed.
fn time(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    let mut n = 0;
    while n == 0 || t.elapsed().as_secs_f64() < 0.2 {
        f();
        n += 1;
    }
    t.elapsed().as_secs_f64() / n as f64
}

/// Sum of a buffer, 64 independent accumulators per chunk (four AVX-512 or eight AVX2
/// registers where the CPU has them), 4 MiB chunks over the current pool.
fn read_all(buf: &[f32]) -> f32 {
    use rayon::prelude::*;
    buf.par_chunks(1 << 20).map(sum_chunk).sum()
}

#[inline(always)]
fn sum_plain(c: &[f32]) -> f32 {
    let mut acc = [0.0f32; 64];
    for x in c.chunks_exact(64) {
        for (a, v) in acc.iter_mut().zip(x) {
            *a += v;
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_avx512(c: &[f32]) -> f32 {
    sum_plain(c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_avx2(c: &[f32]) -> f32 {
    sum_plain(c)
}

/// [`sum_plain`] compiled for the widest vectors the CPU has, as the kernels are.
fn sum_chunk(c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            return unsafe { sum_avx512(c) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            return unsafe { sum_avx2(c) };
        }
    }
    sum_plain(c)
}

/// Alternates sdpa's decode step and the plain read, `rounds` times; returns the medians of
/// (sdpa GB/s, read GB/s).
fn compare(rounds: usize, bytes: f64, mut step: impl FnMut(), buf: &[f32]) -> (f64, f64) {
    let read_bytes = std::mem::size_of_val(buf) as f64;
    step();
    black_box(read_all(buf));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(bytes / time(&mut step) / 1e9);
        b.push(
            read_bytes
                / time(|| {
                    black_box(read_all(buf));
                })
                / 1e9,
        );
    }
    (median(a), median(b))
}

/// A K/V type the bench fills: the float types by rounding, `i8` as `round(127·x)` for
/// values in [−1, 1] with per-(token, kv head) scales of 1/127.
trait Cache: KvElement {
    fn from_unit(x: f32) -> Self;
}

macro_rules! float_cache {
    ($($t:ty),*) => {$(
        impl Cache for $t {
            fn from_unit(x: f32) -> Self {
                <$t as Element>::from_f32(x)
            }
        }
    )*};
}
float_cache!(f32, f16, bf16);

impl Cache for i8 {
    fn from_unit(x: f32) -> Self {
        (x * 127.0).round().clamp(-127.0, 127.0) as i8
    }
}

fn convert<T: Cache>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_unit(v)).collect()
}

/// How an i8 cache's scales vary: the granularities of `Options::kv_scales`.
#[derive(Clone, Copy, PartialEq)]
enum Granularity {
    /// One scale per (token, kv head): `i8`.
    Token,
    /// One per (kv head, channel), the same for every token: `i8c`.
    Channel,
    /// One for the whole tensor: `i8t`.
    Tensor,
}

impl Granularity {
    /// The scales a cache of `keys` tokens reads.
    fn len(self, keys: usize) -> usize {
        match self {
            Granularity::Token => keys * H_KV,
            Granularity::Channel => H_KV * D,
            Granularity::Tensor => 1,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Granularity::Token => "",
            Granularity::Channel => "c",
            Granularity::Tensor => "t",
        }
    }
}

/// The scales of `keys` tokens at granularity `g`, as K/V views of `layout`, for i8 caches.
fn scale_views(
    scales: &[f32],
    g: Granularity,
    batch: usize,
    keys: usize,
    bhsd: bool,
) -> Tensor<'_, f32> {
    match g {
        Granularity::Token if bhsd => Tensor::bhsd(scales, [batch, H_KV, keys, 1]).unwrap(),
        Granularity::Token => Tensor::bshd(scales, [batch, keys, H_KV, 1]).unwrap(),
        Granularity::Channel => Tensor::bshd(scales, [1, 1, H_KV, D]).unwrap(),
        Granularity::Tensor => Tensor::bshd(scales, [1, 1, 1, 1]).unwrap(),
    }
}

/// Q of type `Q` and the options: bf16 dot products where `Q` is bf16 (`bf16p`).
fn query<Q: Element>(n: usize) -> (Vec<Q>, Options<'static>) {
    let q = values(n, 3).iter().map(|&x| Q::from_f32(x)).collect();
    let opts = if Q::NAME == "bf16" {
        Options::new().bf16_products()
    } else {
        Options::new()
    };
    (q, opts)
}

/// The name a line is printed under: the cache type, `bf16p` with bf16 products, `i8c`/`i8t`
/// with per-channel/per-tensor scales.
fn label<Q: Element, T: Cache>(g: Granularity) -> String {
    let p = if Q::NAME == "bf16" { "p" } else { "" };
    let g = if T::QUANTIZED { g.suffix() } else { "" };
    format!("{}{p}{g}", T::NAME)
}

/// Layers of `n_kv`-key caches of type `T` (i8: scales of granularity `g`) filling `gib`, Q of
/// type `Q`: prints one line.
fn layers<Q: Element, T: Cache>(
    rounds: usize,
    gib: f64,
    n_kv: usize,
    (bhsd, g): (bool, Granularity),
    buf: &[f32],
) {
    let per_layer = n_kv * H_KV * D;
    // i8: the scales (4 bytes each, of K and of V) are read too.
    let scale_bytes = if T::QUANTIZED { 2 * g.len(n_kv) * 4 } else { 0 };
    let layer_bytes = 2 * per_layer * std::mem::size_of::<T>() + scale_bytes;
    let n_layers = ((gib * (1u64 << 30) as f64) / layer_bytes as f64).ceil() as usize;
    let src = values(per_layer, 7);
    // Each layer's caches are their own allocations (as an engine's are), with distinct
    // values where it costs nothing: the layer index is added to one value per row.
    let caches: Vec<(Vec<T>, Vec<T>)> = (0..n_layers)
        .map(|l| {
            let mut k = convert::<T>(&src);
            let mut v = convert::<T>(&src);
            for r in (0..per_layer).step_by(D) {
                k[r] = T::from_unit(l as f32 * 1e-2);
                v[r + 1] = T::from_unit(-(l as f32) * 1e-2);
            }
            (k, v)
        })
        .collect();
    let scales: Vec<Vec<f32>> = (0..n_layers * usize::from(T::QUANTIZED))
        .map(|_| vec![1.0 / 127.0; g.len(n_kv)])
        .collect();
    let (q, plain) = query::<Q>(H * D);
    let mut out = vec![0.0f32; H * D];
    let mut ws = Workspace::new();
    let qv = Tensor::bshd(&q, [1, 1, H, D]).unwrap();
    let bytes = (n_layers * layer_bytes) as f64;
    let (sdpa, read) = compare(
        rounds,
        bytes,
        || {
            for (l, (k, v)) in caches.iter().enumerate() {
                let (kt, vt) = if bhsd {
                    let shape = [1, H_KV, n_kv, D];
                    (Tensor::bhsd(k, shape), Tensor::bhsd(v, shape))
                } else {
                    let shape = [1, n_kv, H_KV, D];
                    (Tensor::bshd(k, shape), Tensor::bshd(v, shape))
                };
                let (kt, vt) = (kt.unwrap(), vt.unwrap());
                let mut o = TensorMut::bshd(&mut out, [1, 1, H, D]).unwrap();
                let opts = match scales.get(l) {
                    Some(s) => {
                        let sv = scale_views(s, g, 1, n_kv, bhsd);
                        plain.clone().kv_scales(sv, sv)
                    }
                    None => plain.clone(),
                };
                ws.attention(&qv, &kt, &vt, &mut o, &opts).unwrap();
            }
        },
        buf,
    );
    println!(
        "{:>5} n_kv {n_kv:>6} × {n_layers:>3} layers ({:.2} GB): sdpa {sdpa:5.2} GB/s ({:.2} ms/step), read {read:5.2} GB/s, sdpa/read {:.2}",
        label::<Q, T>(g),
        bytes / 1e9,
        bytes / sdpa / 1e6,
        sdpa / read
    );
}

/// B = 8 sequences of different live lengths in one call.
fn batched<Q: Element, T: Cache>(rounds: usize, buf: &[f32]) {
    let lens = [1024usize, 32768, 2048, 16384, 4096, 24576, 8192, 12288];
    let (b, max_len) = (lens.len(), 32768);
    let row = H_KV * D;
    let src = values(max_len * row, 5);
    let fill = || -> Vec<T> {
        let one = convert::<T>(&src);
        let mut all = Vec::with_capacity(b * one.len());
        for _ in 0..b {
            all.extend_from_slice(&one);
        }
        all
    };
    let (k, v) = (fill(), fill());
    let (q, opts) = query::<Q>(b * H * D);
    let mut out = vec![0.0f32; b * H * D];
    let mut ws = Workspace::new();
    let qv = Tensor::bshd(&q, [b, 1, H, D]).unwrap();
    let kt = Tensor::bshd(&k, [b, max_len, H_KV, D]).unwrap();
    let vt = Tensor::bshd(&v, [b, max_len, H_KV, D]).unwrap();
    let scales = vec![1.0f32 / 127.0; b * max_len * H_KV];
    let mut opts = opts.causal(Alignment::BottomRight).kv_lens(&lens);
    if T::QUANTIZED {
        let sv = scale_views(&scales, Granularity::Token, b, max_len, false);
        opts = opts.kv_scales(sv, sv);
    }
    let live: usize = lens.iter().sum();
    let scale_bytes = if T::QUANTIZED { 2 * live * H_KV * 4 } else { 0 };
    let bytes = (2 * live * row * std::mem::size_of::<T>() + scale_bytes) as f64;
    let (sdpa, read) = compare(
        rounds,
        bytes,
        || {
            let mut o = TensorMut::bshd(&mut out, [b, 1, H, D]).unwrap();
            ws.attention(&qv, &kt, &vt, &mut o, &opts).unwrap();
        },
        buf,
    );
    println!(
        "{:>5} batched B = 8, 1k-32k keys ({:.2} GB live): sdpa {sdpa:5.2} GB/s, read {read:5.2} GB/s, sdpa/read {:.2}",
        label::<Q, T>(Granularity::Token),
        bytes / 1e9,
        sdpa / read
    );
}

const USAGE: &str = "usage: decode_bench [--threads N] [--rounds N] [--gib X] [--n-kv a,b,c] \
[--types f32,f16,bf16,bf16p,i8,i8c,i8t] [--batched] [--bhsd]";

/// A bad command line: the message and the usage on stderr, exit status 2.
fn usage_error(message: &str) -> ! {
    eprintln!("decode_bench: {message}\n{USAGE}");
    std::process::exit(2)
}

/// `s` parsed, or the usage error naming `flag`.
fn number<T: std::str::FromStr>(flag: &str, s: &str) -> T {
    s.parse()
        .unwrap_or_else(|_| usage_error(&format!("{flag} {s}: not a number")))
}

fn main() {
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut rounds, mut gib) = (5usize, 1.0f64);
    let mut n_kvs = vec![4096usize, 16384, 65536];
    let mut types = vec!["f32".to_string(), "f16".into(), "bf16".into(), "i8".into()];
    let (mut with_batched, mut bhsd) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                return;
            }
            "--batched" => with_batched = true,
            "--bhsd" => bhsd = true,
            "--threads" | "--rounds" | "--gib" | "--n-kv" | "--types" => {
                let value = args
                    .next()
                    .unwrap_or_else(|| usage_error(&format!("{flag} needs a value")));
                match flag.as_str() {
                    "--threads" => threads = number(&flag, &value),
                    "--rounds" => rounds = number::<usize>(&flag, &value).max(1),
                    "--gib" => gib = number(&flag, &value),
                    "--n-kv" => n_kvs = value.split(',').map(|x| number(&flag, x)).collect(),
                    _ => types = value.split(',').map(str::to_string).collect(),
                }
            }
            _ => usage_error(&format!("unknown flag {flag}")),
        }
    }
    if let Some(t) = types
        .iter()
        .find(|t| !["f32", "f16", "bf16", "bf16p", "i8", "i8c", "i8t"].contains(&t.as_str()))
    {
        usage_error(&format!("unknown type {t}"));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    println!(
        "{threads} thread(s), {rounds} rounds, backend {:?}, H = {H}, H_kv = {H_KV}, d = {D}",
        sdpa::backend()
    );
    // The read-bandwidth buffer: 1 GiB of f32, touched once so its pages exist.
    let buf = values(1 << 28, 11);
    pool.install(|| {
        for ty in &types {
            for &n_kv in &n_kvs {
                let (r, token) = (rounds, (bhsd, Granularity::Token));
                match ty.as_str() {
                    "f32" => layers::<f32, f32>(r, gib, n_kv, token, &buf),
                    "f16" => layers::<f32, f16>(r, gib, n_kv, token, &buf),
                    "bf16" => layers::<f32, bf16>(r, gib, n_kv, token, &buf),
                    "bf16p" => layers::<bf16, bf16>(r, gib, n_kv, token, &buf),
                    "i8" => layers::<f32, i8>(r, gib, n_kv, token, &buf),
                    "i8c" => layers::<f32, i8>(r, gib, n_kv, (bhsd, Granularity::Channel), &buf),
                    "i8t" => layers::<f32, i8>(r, gib, n_kv, (bhsd, Granularity::Tensor), &buf),
                    other => panic!("unknown type {other}"),
                }
            }
            if with_batched {
                match ty.as_str() {
                    "f32" => batched::<f32, f32>(rounds, &buf),
                    "f16" => batched::<f32, f16>(rounds, &buf),
                    "i8" | "i8c" | "i8t" => batched::<f32, i8>(rounds, &buf),
                    "bf16p" => batched::<bf16, bf16>(rounds, &buf),
                    _ => batched::<f32, bf16>(rounds, &buf),
                }
            }
        }
    });
}
