//! `Options::bf16_products`: the two products on bf16 operands (AVX512_BF16, where the CPU has
//! it; bf16 Q and K/V), in prefill and in decode, against the f64 reference within
//! `error_bounds` *with the same options* (which adds the weights' rounding), over output
//! types, options (masks, bias, windows, ALiBi, softcap, sinks, kv_lens), odd head sizes and
//! key counts, GQA and both layouts; the path must actually run where it is available, stay
//! identical for any thread count, count the same score tiles, keep NaN/±∞ semantics, give the
//! same bits whether bf16 K/V rows are read as stored or converted, and leave other types
//! alone. (Paged caches: `kv_cache.rs`.)

use sdpa::half::{bf16, f16};
use sdpa::{Alignment, Element, Options, Tensor, TensorMut};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::support;
use support::contract::RowFacts;
use support::harness::{assert_tensors_against_reference, Layout};
use support::values::SplitMix;

fn values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
        .into_iter()
        .map(|x| x * scale)
        .collect()
}

fn to<T: Element>(xs: &[f32]) -> Vec<T> {
    xs.iter().map(|&x| T::from_f32(x)).collect()
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    b: usize,
    h: usize,
    h_kv: usize,
    n_q: usize,
    n_kv: usize,
    d_k: usize,
    d_v: usize,
    bhsd: bool,
}

fn view<T>(data: &[T], bhsd: bool, [b, n, h, d]: [usize; 4]) -> Tensor<'_, T> {
    if bhsd {
        Tensor::bhsd(data, [b, h, n, d]).unwrap()
    } else {
        Tensor::bshd(data, [b, n, h, d]).unwrap()
    }
}

/// The fused kernel with `opts` against the reference within `error_bounds(.., opts)`: the
/// worst error / bound.
fn check<Q: Element, KV: Element, O: Element>(s: Shape, opts: &Options<'_>, seed: u64) -> f64 {
    let q = to::<Q>(&values(s.b * s.n_q * s.h * s.d_k, seed, 1.0));
    let k = to::<KV>(&values(s.b * s.n_kv * s.h_kv * s.d_k, seed + 1, 1.0));
    let v = to::<KV>(&values(s.b * s.n_kv * s.h_kv * s.d_v, seed + 2, 1.0));
    let qv = view(&q, s.bhsd, [s.b, s.n_q, s.h, s.d_k]);
    let kv = view(&k, s.bhsd, [s.b, s.n_kv, s.h_kv, s.d_k]);
    let vv = view(&v, s.bhsd, [s.b, s.n_kv, s.h_kv, s.d_v]);
    let label = format!(
        "bf16 products {}/{}/{} {s:?} seed {seed}",
        Q::NAME,
        KV::NAME,
        O::NAME
    );
    let finite = |_| RowFacts::FINITE;
    assert_tensors_against_reference::<Q, KV, O>(&qv, &kv, &vv, Layout::BSHD, opts, finite, &label)
        .worst_ratio
}

const SHAPES: [Shape; 3] = [
    // GQA 2, head sizes odd and not multiples of the lanes, a key count that leaves an odd
    // tail in the last block
    Shape {
        b: 2,
        h: 4,
        h_kv: 2,
        n_q: 70,
        n_kv: 333,
        d_k: 37,
        d_v: 24,
        bhsd: false,
    },
    // PyTorch layout, MQA, d = 64, more than one key block
    Shape {
        b: 1,
        h: 3,
        h_kv: 1,
        n_q: 65,
        n_kv: 450,
        d_k: 64,
        d_v: 64,
        bhsd: true,
    },
    // d = 128, two query panels and a partial row group
    Shape {
        b: 1,
        h: 2,
        h_kv: 2,
        n_q: 100,
        n_kv: 301,
        d_k: 128,
        d_v: 128,
        bhsd: false,
    },
];

/// Decode: few query rows per kv head (`n_q · h / h_kv ≤ 8`), the rows by channels.
const DECODE_SHAPES: [Shape; 4] = [
    // GQA 4, d = 128: four rows per kv head (four keys per dot tile, 64-channel panels), an
    // odd key count
    Shape {
        b: 2,
        h: 8,
        h_kv: 2,
        n_q: 1,
        n_kv: 333,
        d_k: 128,
        d_v: 128,
        bhsd: false,
    },
    // MQA 8 over keys split across work units, head sizes not multiples of 32 (a masked
    // remainder of channels, a 16-channel last panel)
    Shape {
        b: 1,
        h: 8,
        h_kv: 1,
        n_q: 1,
        n_kv: 1000,
        d_k: 37,
        d_v: 80,
        bhsd: false,
    },
    // Two query positions of GQA 3 (six rows), PyTorch layout
    Shape {
        b: 1,
        h: 6,
        h_kv: 2,
        n_q: 2,
        n_kv: 77,
        d_k: 64,
        d_v: 64,
        bhsd: true,
    },
    // One row per kv head, many keys
    Shape {
        b: 1,
        h: 4,
        h_kv: 4,
        n_q: 1,
        n_kv: 5000,
        d_k: 96,
        d_v: 96,
        bhsd: false,
    },
];

fn grid<Q: Element, KV: Element, O: Element>(shapes: &[Shape]) -> f64 {
    let br = Alignment::BottomRight;
    let mut worst = 0.0f64;
    for (n, &s) in shapes.iter().enumerate() {
        let lens: Vec<usize> = (0..s.b).map(|bb| s.n_kv - 17 * bb).collect();
        let window = (s.n_kv / 3).max(40);
        let slopes = sdpa::alibi_slopes(s.h).unwrap();
        let sinks: Vec<f32> = (0..s.h).map(|hh| hh as f32 * 0.5 - 1.0).collect();
        // A bias and a mask over [b, n_q, h, n_kv], every third key hidden from odd rows.
        let bias = values(s.b * s.n_q * s.h * s.n_kv, 77, 2.0);
        let mask: Vec<bool> = (0..s.b * s.n_q * s.h * s.n_kv)
            .map(|x| (x % s.n_kv) % 3 != 0 || (x / (s.h * s.n_kv)) % 2 == 0)
            .collect();
        let dims = [s.b, s.n_q, s.h, s.n_kv];
        let sets = [
            Options::new(),
            Options::new().causal(br),
            Options::new().causal(Alignment::TopLeft).softcap(5.0),
            Options::new()
                .sliding_window(window, 3, br)
                .alibi(&slopes, br),
            Options::new().kv_lens(&lens).causal(br).sinks(&sinks),
            Options::new()
                .bias(Tensor::bshd(&bias, dims).unwrap())
                .mask(Tensor::bshd(&mask, dims).unwrap()),
        ];
        for (o, opts) in sets.into_iter().enumerate() {
            let opts = opts.bf16_products();
            worst = worst.max(check::<Q, KV, O>(s, &opts, (n * 10 + o) as u64));
        }
    }
    worst
}

#[test]
fn every_type_and_option_within_the_bound() {
    for w in [
        grid::<bf16, bf16, bf16>(&SHAPES),
        grid::<bf16, bf16, f32>(&SHAPES),
        grid::<bf16, bf16, f16>(&SHAPES),
        // (other types: the option is ignored, the f32 bound holds)
        grid::<f32, bf16, f32>(&SHAPES),
        grid::<f16, f16, f16>(&SHAPES),
    ] {
        assert!(w < 1.0, "{w}");
    }
}

#[test]
fn decode_within_the_bound() {
    for w in [
        grid::<bf16, bf16, bf16>(&DECODE_SHAPES),
        grid::<bf16, bf16, f32>(&DECODE_SHAPES),
    ] {
        assert!(w < 1.0, "{w}");
    }
}

/// One call's output (and the score tiles it counted) in a pool of `threads`, all bf16.
fn run(threads: usize, q: &[bf16], k: &[bf16], v: &[bf16], s: Shape, on: bool) -> (Vec<f32>, u64) {
    let counter = AtomicU64::new(0);
    let mut opts = Options::new()
        .causal(Alignment::BottomRight)
        .count_score_tiles(&counter);
    if on {
        opts = opts.bf16_products();
    }
    let mut out = vec![0.0f32; s.b * s.n_q * s.h * s.d_v];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut o = TensorMut::bshd(&mut out, [s.b, s.n_q, s.h, s.d_v]).unwrap();
        sdpa::attention(
            &view(q, false, [s.b, s.n_q, s.h, s.d_k]),
            &view(k, false, [s.b, s.n_kv, s.h_kv, s.d_k]),
            &view(v, false, [s.b, s.n_kv, s.h_kv, s.d_v]),
            &mut o,
            &opts,
        )
        .unwrap()
    });
    (out, counter.load(Ordering::Relaxed))
}

#[test]
fn the_path_runs_where_available_and_is_deterministic() {
    for s in [SHAPES[2], DECODE_SHAPES[0], DECODE_SHAPES[1]] {
        // Rows by channels (decode: at most half a vector of rows per kv head) take the bf16
        // dot products; more rows, AMX tiles where `amx_available` (also the software model,
        // `SDPA_AMX=model`), else the dot products too.
        let lanes = if sdpa::backend() == sdpa::Backend::Avx512 {
            16
        } else {
            8
        };
        let by_channels = s.n_q * s.h / s.h_kv <= lanes / 2;
        let available = sdpa::bf16_products_available() || (!by_channels && sdpa::amx_available());
        runs_where_available_and_is_deterministic(s, available);
    }
}

fn runs_where_available_and_is_deterministic(s: Shape, available: bool) {
    let q = to::<bf16>(&values(s.b * s.n_q * s.h * s.d_k, 11, 1.0));
    let k = to::<bf16>(&values(s.b * s.n_kv * s.h_kv * s.d_k, 12, 1.0));
    let v = to::<bf16>(&values(s.b * s.n_kv * s.h_kv * s.d_v, 13, 1.0));
    let (f32_out, f32_tiles) = run(1, &q, &k, &v, s, false);
    let (one, tiles) = run(1, &q, &k, &v, s, true);
    let (two, _) = run(2, &q, &k, &v, s, true);
    let (three, _) = run(3, &q, &k, &v, s, true);
    assert_eq!(
        tiles, f32_tiles,
        "the same score tiles, masked ones skipped alike"
    );
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&one), bits(&two), "1 vs 2 threads");
    assert_eq!(bits(&one), bits(&three), "1 vs 3 threads");
    // The weights rounded to bf16 change the results (by far less than the bound, checked
    // above), unless the CPU has no bf16 dot products (or tiles).
    let differ = one.iter().zip(&f32_out).filter(|(a, b)| a != b).count();
    if available {
        assert!(
            differ > one.len() / 2,
            "only {differ} of {} differ",
            one.len()
        );
    } else {
        assert_eq!(
            differ, 0,
            "the option must change nothing without the instruction"
        );
    }
}

#[test]
fn other_types_are_left_alone() {
    // f32 (or f16) inputs would have to be rounded to bf16 — a value beyond bf16's range to
    // ±∞ — so the option applies to bf16 Q and K/V only: bit for bit the f32 products here.
    let (n, d) = (70, 64);
    let q = values(n * d, 31, 1.0);
    let mut k = values(n * d, 32, 1.0);
    k[5] = f32::MAX; // would be +∞ in bf16
    let v = values(n * d, 33, 1.0);
    let shape = [1, n, 1, d];
    let call = |opts: Options<'_>| {
        let mut out = vec![0.0f32; n * d];
        let mut o = TensorMut::bshd(&mut out, shape).unwrap();
        let (qv, kv, vv) = (
            Tensor::bshd(&q, shape).unwrap(),
            Tensor::bshd(&k, shape).unwrap(),
            Tensor::bshd(&v, shape).unwrap(),
        );
        sdpa::attention(&qv, &kv, &vv, &mut o, &opts).unwrap();
        out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(call(Options::new()), call(Options::new().bf16_products()));
}

#[test]
fn non_finite_values_reach_the_rows_that_see_them() {
    // Causal (top-left): key 5's value holds +∞ and key 9's a NaN; rows before them see
    // neither, rows from 5 on see the ∞, from 9 on the NaN too — as with f32 products. At
    // d = 20 the V rows are packed (padded to whole vectors), at d = 32 read in place.
    for d in [20, 32] {
        non_finite_values_at(d);
    }
}

fn non_finite_values_at(d: usize) {
    let n = 40;
    let q = to::<bf16>(&values(n * d, 21, 1.0));
    let k = to::<bf16>(&values(n * d, 22, 1.0));
    let mut v = to::<bf16>(&values(n * d, 23, 1.0));
    v[5 * d + 3] = bf16::INFINITY;
    v[9 * d + 7] = bf16::NAN;
    let shape = [1, n, 1, d];
    let call = |opts: Options<'_>| {
        let mut out = vec![0.0f32; n * d];
        let mut o = TensorMut::bshd(&mut out, shape).unwrap();
        let (qv, kv, vv) = (
            Tensor::bshd(&q, shape).unwrap(),
            Tensor::bshd(&k, shape).unwrap(),
            Tensor::bshd(&v, shape).unwrap(),
        );
        sdpa::attention(&qv, &kv, &vv, &mut o, &opts).unwrap();
        out
    };
    let plain = call(Options::new().causal(Alignment::TopLeft));
    let paired = call(Options::new().causal(Alignment::TopLeft).bf16_products());
    for i in 0..n {
        for c in 0..d {
            let (a, b) = (plain[i * d + c], paired[i * d + c]);
            let what = format!("row {i} channel {c}: {a} vs {b}");
            assert_eq!(a.is_nan(), b.is_nan(), "{what}");
            assert_eq!(a.is_infinite(), b.is_infinite(), "{what}");
            if a.is_finite() {
                assert!((a - b).abs() < 0.05, "{what}");
            } else if a.is_infinite() {
                assert_eq!(a, b, "{what}");
            }
            if i < 5 {
                assert!(b.is_finite(), "{what}");
            }
        }
    }
}

#[test]
fn rows_in_place_and_packed_give_the_same_bits() {
    // bf16 K/V with unit channel stride are paired as stored; with channel stride 2 they are
    // converted to f32 and rounded back. Both must give the same products, subnormals included
    // (`vdpbf16ps` reads them as zero; the rounding flushes them), in every block shape: odd
    // key counts, causal rows that see part of a block, GQA; an odd head size, whose K rows are
    // copied into pair rows rather than read in place.
    for d in [64, 37] {
        in_place_and_packed_at(d);
    }
}

fn in_place_and_packed_at(d: usize) {
    let (b, h, h_kv, n_q, n_kv) = (1, 4, 2, 70, 101);
    let q = to::<bf16>(&values(b * n_q * h * d, 31, 1.0));
    let mut k = to::<bf16>(&values(b * n_kv * h_kv * d, 32, 1.0));
    let mut v = to::<bf16>(&values(b * n_kv * h_kv * d, 33, 1.0));
    for (i, x) in k.iter_mut().enumerate().step_by(7) {
        *x = bf16::from_bits(1 + (i % 0x7f) as u16);
    }
    for (i, x) in v.iter_mut().enumerate().step_by(5) {
        *x = bf16::from_bits(0x8000 | (1 + (i % 0x7f) as u16));
    }
    let spread =
        |x: &[bf16]| -> Vec<bf16> { x.iter().flat_map(|&y| [y, bf16::from_f32(7.0)]).collect() };
    let (k2, v2) = (spread(&k), spread(&v));
    let kv_dims = [b, n_kv, h_kv, d];
    let kv_strides = [2 * n_kv * h_kv * d, 2 * h_kv * d, 2 * d, 2];
    for opts in [
        Options::new().bf16_products(),
        Options::new()
            .bf16_products()
            .causal(Alignment::BottomRight),
    ] {
        let call = |k: Tensor<'_, bf16>, v: Tensor<'_, bf16>| {
            let mut out = vec![0.0f32; b * n_q * h * d];
            let mut o = TensorMut::bshd(&mut out, [b, n_q, h, d]).unwrap();
            let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
            sdpa::attention(&qv, &k, &v, &mut o, &opts).unwrap();
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let in_place = call(
            Tensor::bshd(&k, kv_dims).unwrap(),
            Tensor::bshd(&v, kv_dims).unwrap(),
        );
        let packed = call(
            Tensor::new(&k2, kv_dims, kv_strides).unwrap(),
            Tensor::new(&v2, kv_dims, kv_strides).unwrap(),
        );
        assert_eq!(in_place, packed);
    }
}
