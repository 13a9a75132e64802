//! Differential test: the fused kernel against the f64 reference (`sdpa::reference`) on the
//! same inputs, over a grid of shapes, layouts, masks and scales.
//!
//! **Tolerance.** Every output element and every LSE is compared against
//! `sdpa::reference::error_bounds`, one bound per query row. It is not a guessed epsilon but a
//! worst-case f32 rounding bound derived in that function's doc comment: with `u = 2⁻²⁴`,
//! `γ_n = nu/(1 − nu)`, `n` the row's visible keys, `Δ` the largest score error
//! (`γ_{d_k+2}·|scale|·Σ_p|q_p k_p| + 2u(|s| + |m|)`) and `θ = e^Δ − 1 + 2·10⁻⁷` (the kernel's
//! polynomial `2^x`):
//!
//! * `|out_fused − out_ref| ≤ max_j‖v_j‖∞ · (2θ/(1 − θ) + 2γ_n + 2u)`,
//! * `|lse_fused − lse_ref| ≤ Δ + θ + γ_n + u·|lse|`.
//!
//! Rows with no visible key must be exactly 0 with LSE exactly −∞ in both paths (see
//! `support::harness::assert_close_to_reference`).
//!
//! The reference costs `O(n_q·n_kv·d)` scalar f64 work, so the full product of the grid is
//! out of reach: each axis is covered completely by a sweep of its own (lengths, head sizes,
//! GQA ratios, layouts, scales), and the combinations are sampled with fixed seeds under a
//! fixed cost budget.

use crate::support;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use sdpa::{Alignment, Options, Tensor};
use support::harness::{
    assert_close_to_reference, assert_views_close_to_reference, assert_within_bounds, bounds,
    fused, reference, rng, Inputs, Layout, Shape, Views,
};

#[derive(Clone, Debug)]
struct Case {
    shape: Shape,
    /// Layouts of Q, K, V and the output.
    layouts: [Layout; 4],
    opts: Options<'static>,
    /// Q entries are uniform in `[-q_range, q_range)` (K and V in `[-1, 1)`): larger values
    /// make the softmax peakier.
    q_range: f32,
    seed: u64,
}

impl Case {
    fn new(shape: Shape, opts: Options<'static>, seed: u64) -> Self {
        Case {
            shape,
            layouts: [Layout::BSHD; 4],
            opts,
            q_range: 1.0,
            seed,
        }
    }

    /// Runs the differential check; returns the worst error-to-bound ratio.
    fn check(&self) -> f64 {
        let [lq, lk, lv, lo] = self.layouts;
        let inp = Inputs::random(self.shape, [lq, lk, lv], self.seed, self.q_range);
        let label = format!("{self:?}");
        assert_close_to_reference(&inp, lo, &self.opts, &label).worst_ratio
    }
}

fn mask(m: usize) -> Options<'static> {
    match m % 3 {
        0 => Options::new(),
        1 => Options::new().causal(Alignment::TopLeft),
        _ => Options::new().causal(Alignment::BottomRight),
    }
}

/// Input layouts the sweeps cycle through: contiguous, padded (row, head and batch strides
/// larger than needed), a non-unit head-size stride, and sequence-major storage.
fn input_layouts() -> [Layout; 7] {
    [
        Layout::BSHD,
        Layout::BHSD,
        Layout::padded_bshd(1, 5),
        Layout::padded_bhsd(1, 3),
        Layout::padded_bshd(2, 0),
        Layout::padded_bhsd(3, 1),
        Layout::strided(Layout::SBHD_ORDER, 1, 2, 1),
    ]
}

fn output_layouts() -> [Layout; 5] {
    [
        Layout::BSHD,
        Layout::BHSD,
        Layout::padded_bshd(2, 3),
        Layout::padded_bhsd(1, 4),
        Layout::strided(Layout::SBHD_ORDER, 1, 1, 2),
    ]
}

fn cycle_layouts(k: usize) -> [Layout; 4] {
    let inputs = input_layouts();
    let outputs = output_layouts();
    [
        inputs[k % inputs.len()],
        inputs[(k + 2) % inputs.len()],
        inputs[(k + 5) % inputs.len()],
        outputs[k % outputs.len()],
    ]
}

fn run_all(name: &str, cases: &[Case]) {
    let mut worst = 0.0f64;
    for case in cases {
        worst = worst.max(case.check());
    }
    eprintln!(
        "{name}: {} cases, worst error/bound {worst:.3e}",
        cases.len()
    );
}

/// The shapes of the first smoke test (folded in here).
#[test]
fn smoke_shapes() {
    let s = |batch, heads, kv_heads, n_q, n_kv, d_k, d_v| Shape {
        batch,
        heads,
        kv_heads,
        n_q,
        n_kv,
        d_k,
        d_v,
    };
    let cases = [
        (s(1, 1, 1, 3, 3, 2, 2), mask(0)),
        (s(1, 2, 1, 65, 63, 17, 9), mask(0)),
        (s(2, 4, 2, 130, 200, 64, 64), mask(1)),
        (s(1, 8, 1, 7, 300, 128, 80), mask(2)),
        (s(1, 3, 3, 300, 100, 3, 1), mask(1)),
        (s(1, 3, 3, 300, 100, 8, 256), mask(2)),
        (s(1, 1, 1, 5, 0, 8, 8), mask(0)),
    ]
    .map(|(shape, opts)| Case::new(shape, opts, 7));
    run_all("smoke shapes", &cases);
}

/// Every pair of lengths (n_q and n_kv independently: below, at and above the block sizes,
/// and several hundred), under each mask, cycling through the layouts.
#[test]
fn sequence_lengths() {
    let lens = [1, 2, 7, 63, 64, 65, 97, 300, 450];
    let mut cases = Vec::new();
    for (a, &n_q) in lens.iter().enumerate() {
        for (b, &n_kv) in lens.iter().enumerate() {
            let k = a * lens.len() + b;
            let shape = Shape {
                batch: 1,
                heads: 2,
                kv_heads: 1,
                n_q,
                n_kv,
                d_k: 8,
                d_v: 12,
            };
            for m in 0..3 {
                let mut case = Case::new(shape, mask(m), 1000 + k as u64);
                case.layouts = cycle_layouts(k + m);
                cases.push(case);
            }
        }
    }
    // Decode-like and prefill-like extremes: a few rows against thousands of keys and back.
    for (k, (n_q, n_kv)) in [(1, 4096), (3, 5000), (5000, 3), (2, 1500)]
        .into_iter()
        .enumerate()
    {
        let shape = Shape {
            batch: 1,
            heads: 4,
            kv_heads: 1,
            n_q,
            n_kv,
            d_k: 64,
            d_v: 32,
        };
        for m in 0..3 {
            let mut case = Case::new(shape, mask(m), 1500 + (3 * k + m) as u64);
            case.layouts = cycle_layouts(k + m);
            cases.push(case);
        }
    }
    run_all("sequence lengths", &cases);
}

/// Every head size, with `d_k = d_v` and with `d_k ≠ d_v` (both smaller and larger).
#[test]
fn head_sizes() {
    let ds = [1, 3, 8, 17, 64, 80, 96, 128, 256];
    let mut cases = Vec::new();
    for (a, &d_k) in ds.iter().enumerate() {
        for d_v in [d_k, ds[(a + 4) % ds.len()], ds[(a + 7) % ds.len()]] {
            let k = cases.len();
            let shape = Shape {
                batch: 1,
                heads: 2,
                kv_heads: 1,
                n_q: 70,
                n_kv: 130,
                d_k,
                d_v,
            };
            let mut case = Case::new(shape, mask(k), 2000 + k as u64);
            case.layouts = cycle_layouts(k);
            case.q_range = if k % 2 == 0 { 1.0 } else { 3.0 };
            cases.push(case);
        }
    }
    // Beyond the usual sizes.
    for (d_k, d_v) in [(512, 64), (40, 512), (300, 300)] {
        let shape = Shape {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            n_q: 20,
            n_kv: 100,
            d_k,
            d_v,
        };
        cases.push(Case::new(shape, mask(cases.len()), 2500 + d_k as u64));
    }
    run_all("head sizes", &cases);
}

/// Query heads per key/value head 1, 2, 3, 4, 8 and multi-query (`H_kv = 1`), with batches.
#[test]
fn grouped_and_multi_query_heads() {
    let groups = [
        (4, 4),
        (4, 2),
        (6, 2),
        (8, 2),
        (16, 2),
        (8, 1),
        (5, 1),
        (12, 3),
        (1, 1),
        (32, 1),
        (64, 2),
    ];
    let mut cases = Vec::new();
    for (k, &(heads, kv_heads)) in groups.iter().enumerate() {
        for m in 0..3 {
            let shape = Shape {
                batch: 1 + (k + m) % 3,
                heads,
                kv_heads,
                n_q: [50, 9, 120][m],
                n_kv: [110, 200, 65][m],
                d_k: 32,
                d_v: [32, 24, 40][m],
            };
            let mut case = Case::new(shape, mask(m), 3000 + (3 * k + m) as u64);
            case.layouts = cycle_layouts(3 * k + m);
            cases.push(case);
        }
    }
    run_all("grouped and multi-query heads", &cases);
}

/// Every input layout for each of Q, K and V, and every output layout.
#[test]
fn layouts() {
    let shape = Shape {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        n_q: 40,
        n_kv: 100,
        d_k: 17,
        d_v: 20,
    };
    let mut cases = Vec::new();
    let inputs = input_layouts();
    let outputs = output_layouts();
    for (a, &lq) in inputs.iter().enumerate() {
        for (b, &lkv) in inputs.iter().enumerate() {
            let k = a * inputs.len() + b;
            let mut case = Case::new(shape, mask(k), 4000 + k as u64);
            case.layouts = [
                lq,
                lkv,
                inputs[(a + b) % inputs.len()],
                outputs[k % outputs.len()],
            ];
            cases.push(case);
        }
    }
    run_all("layouts", &cases);
}

/// Custom scales, including a negative one and the default's neighbours, with peaky Q.
#[test]
fn custom_scales() {
    let mut cases = Vec::new();
    for (k, scale) in [0.01f32, 0.125, 0.3, 1.0, 2.5, -0.7]
        .into_iter()
        .enumerate()
    {
        for m in 0..3 {
            let shape = Shape {
                batch: 2,
                heads: 2,
                kv_heads: 1,
                n_q: 33,
                n_kv: 150,
                d_k: 64,
                d_v: 48,
            };
            let mut case = Case::new(shape, mask(m).scale(scale), 5000 + (3 * k + m) as u64);
            case.q_range = [1.0, 2.0, 0.5][m];
            case.layouts = cycle_layouts(k + m);
            cases.push(case);
        }
    }
    run_all("custom scales", &cases);
}

/// Stride-0 (broadcast) input views: one query block shared by every batch, one key/value
/// head shared by every head slot, and a key row repeated along the sequence.
#[test]
fn broadcast_input_views() {
    let (batch, n_q, heads, n_kv, kv_heads, d) = (3, 40, 4, 90, 2, 16);
    let mut r = rng(6200);
    let mut fill =
        |n: usize| -> Vec<f32> { (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect() };
    let q = fill(n_q * heads * d); // one batch's worth
    let k = fill(n_kv * d); // one head's worth
    let v = fill(n_kv * d);
    let k_row = fill(d); // a single key
    for (m, opts) in [mask(0), mask(1), mask(2)].iter().enumerate() {
        let views = Views {
            q: Tensor::new(&q, [batch, n_q, heads, d], [0, heads * d, d, 1]).unwrap(),
            k: Tensor::new(&k, [batch, n_kv, kv_heads, d], [0, d, 0, 1]).unwrap(),
            v: Tensor::new(&v, [batch, n_kv, kv_heads, d], [0, d, 0, 1]).unwrap(),
        };
        let c = assert_views_close_to_reference(&views, Layout::BSHD, opts, "broadcast");
        // Every batch and every head of a group computes the same thing.
        for b in 1..batch {
            assert_eq!(c.fused.row(b, 7, 1), c.fused.row(0, 7, 1), "mask {m}");
        }
        let same_key = Views {
            k: Tensor::new(&k_row, [batch, n_kv, kv_heads, d], [0, 0, 0, 1]).unwrap(),
            ..views
        };
        // Equal scores: every visible key weighs the same.
        let c = assert_views_close_to_reference(&same_key, Layout::BHSD, opts, "one key");
        assert_eq!(c.empty_rows, 0);
    }
}

/// K and V interleaved element by element in one buffer `[B][n_kv][H_kv][d][2]`: both views
/// have stride 2 on the head-size dim, V starts one element in.
#[test]
fn keys_and_values_interleaved_in_one_buffer() {
    for (k, (n_q, n_kv, d, m)) in [(70, 150, 64, 0), (100, 33, 17, 1), (45, 200, 128, 2)]
        .into_iter()
        .enumerate()
    {
        let (batch, heads, kv_heads) = (2, 4, 2);
        let mut r = rng(6000 + k as u64);
        let kv: Vec<f32> = (0..batch * n_kv * kv_heads * d * 2)
            .map(|_| r.random_range(-1.0f32..1.0))
            .collect();
        let q: Vec<f32> = (0..batch * n_q * heads * d)
            .map(|_| r.random_range(-2.0f32..2.0))
            .collect();
        let kv_dims = [batch, n_kv, kv_heads, d];
        let strides = [n_kv * kv_heads * d * 2, kv_heads * d * 2, d * 2, 2];
        let views = Views {
            q: Tensor::bshd(&q, [batch, n_q, heads, d]).unwrap(),
            k: Tensor::new(&kv, kv_dims, strides).unwrap(),
            v: Tensor::new(&kv[1..], kv_dims, strides).unwrap(),
        };
        let label = format!("interleaved K/V, n_q {n_q} n_kv {n_kv} d {d}");
        let c = assert_views_close_to_reference(&views, Layout::BSHD, &mask(m), &label);
        eprintln!("{label}: worst error/bound {:.3e}", c.worst_ratio);
    }
}

/// K and V side by side in one row `[B][n_kv][H_kv][d_k + d_v]` (row stride larger than each
/// needs), inside a KV cache with room for more positions than are filled.
#[test]
fn keys_and_values_side_by_side_in_a_kv_cache() {
    for (k, (n_q, n_kv, d_k, d_v, m)) in [
        (1, 300, 64, 64, 2),
        (20, 129, 96, 32, 2),
        (50, 50, 8, 80, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let (batch, heads, kv_heads, capacity) = (2, 8, 2, 512);
        let width = d_k + d_v;
        let mut r = rng(6100 + k as u64);
        let cache: Vec<f32> = (0..batch * capacity * kv_heads * width)
            .map(|_| r.random_range(-1.0f32..1.0))
            .collect();
        let q: Vec<f32> = (0..batch * heads * n_q * d_k)
            .map(|_| r.random_range(-2.0f32..2.0))
            .collect();
        let strides = [capacity * kv_heads * width, kv_heads * width, width, 1];
        let views = Views {
            q: Tensor::bhsd(&q, [batch, heads, n_q, d_k]).unwrap(),
            k: Tensor::new(&cache, [batch, n_kv, kv_heads, d_k], strides).unwrap(),
            v: Tensor::new(&cache[d_k..], [batch, n_kv, kv_heads, d_v], strides).unwrap(),
        };
        let label = format!("KV cache, n_q {n_q} n_kv {n_kv} d_k {d_k} d_v {d_v}");
        let c = assert_views_close_to_reference(&views, Layout::BHSD, &mask(m), &label);
        eprintln!("{label}: worst error/bound {:.3e}", c.worst_ratio);
    }
}

/// One random point of the full grid.
fn sample(r: &mut StdRng, seed: u64) -> Case {
    const LENS: [usize; 14] = [1, 2, 7, 63, 64, 65, 96, 97, 128, 200, 300, 450, 513, 700];
    const DS: [usize; 9] = [1, 3, 8, 17, 64, 80, 96, 128, 256];
    const GROUPS: [(usize, usize); 10] = [
        (1, 1),
        (2, 1),
        (1, 2),
        (2, 2),
        (1, 4),
        (2, 4),
        (1, 8),
        (3, 1),
        (1, 3),
        (4, 1),
    ];
    let (kv_heads, group) = *GROUPS.choose(r).unwrap();
    let d_k = *DS.choose(r).unwrap();
    let shape = Shape {
        batch: r.random_range(1..=3),
        heads: kv_heads * group,
        kv_heads,
        n_q: *LENS.choose(r).unwrap(),
        n_kv: *LENS.choose(r).unwrap(),
        d_k,
        d_v: if r.random_bool(0.4) {
            *DS.choose(r).unwrap()
        } else {
            d_k
        },
    };
    let mut opts = mask(r.random_range(0..3));
    if r.random_bool(0.3) {
        let sign = if r.random_bool(0.2) { -1.0 } else { 1.0 };
        opts = opts.scale(sign * r.random_range(0.02f32..1.5));
    }
    let inputs = input_layouts();
    let outputs = output_layouts();
    Case {
        shape,
        layouts: [
            *inputs.choose(r).unwrap(),
            *inputs.choose(r).unwrap(),
            *inputs.choose(r).unwrap(),
            *outputs.choose(r).unwrap(),
        ],
        opts,
        q_range: *[1.0, 1.0, 3.0].choose(r).unwrap(),
        seed,
    }
}

/// Random points of the grid drawn with `seed` until `budget` reference multiply-adds are
/// spent (points above `cap` are redrawn).
fn random_grid(name: &str, seed: u64, budget: usize, cap: usize) {
    let mut r = rng(seed);
    let mut spent = 0;
    let mut cases = Vec::new();
    while spent < budget {
        let case = sample(&mut r, seed * 1000 + cases.len() as u64);
        let cost = case.shape.reference_cost();
        if cost > cap {
            continue;
        }
        spent += cost;
        cases.push(case);
    }
    run_all(name, &cases);
}

const GRID_BUDGET: usize = 1_200_000_000;
const GRID_CAP: usize = 150_000_000;

#[test]
fn random_grid_1() {
    random_grid("random grid 1", 71, GRID_BUDGET, GRID_CAP);
}

#[test]
fn random_grid_2() {
    random_grid("random grid 2", 72, GRID_BUDGET, GRID_CAP);
}

#[test]
fn random_grid_3() {
    random_grid("random grid 3", 73, GRID_BUDGET, GRID_CAP);
}

#[test]
fn random_grid_4() {
    random_grid("random grid 4", 74, GRID_BUDGET, GRID_CAP);
}

/// The tolerance has teeth: results of a slightly different problem (one key dropped from
/// every row, a scale off by 10⁻⁴, one value element off by 10⁻²) fail the comparison.
#[test]
fn the_bound_rejects_results_of_a_slightly_different_problem() {
    let shape = Shape {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        n_q: 40,
        n_kv: 120,
        d_k: 32,
        d_v: 16,
    };
    let inp = Inputs::random(shape, [Layout::BSHD; 3], 7000, 1.0);
    let opts = Options::new().scale(0.2);
    let want = reference(&inp, &opts);
    let b = bounds(&inp, &opts);
    let fails = |got: &support::harness::Outputs| {
        std::panic::catch_unwind(|| assert_within_bounds(got, &want, &b, "perturbed")).is_err()
    };
    assert!(
        !fails(&fused(&inp, &opts)),
        "the unperturbed problem must pass"
    );

    let mut fewer_keys = inp.clone();
    fewer_keys.k.dims[1] -= 1;
    fewer_keys.v.dims[1] -= 1;
    assert!(fails(&fused(&fewer_keys, &opts)), "one key dropped");

    assert!(
        fails(&fused(&inp, &Options::new().scale(0.2 * (1.0 + 1e-4)))),
        "scale"
    );

    let mut nudged = inp.clone();
    let x = nudged.v.at([0, 17, 0, 3]);
    nudged.v.set([0, 17, 0, 3], x + 1e-2); // weight ≈ 1/120: outputs move by ≈ 10⁻⁴
    assert!(fails(&fused(&nudged, &opts)), "one value element");
}
