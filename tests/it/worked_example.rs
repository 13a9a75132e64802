//! The seed article's worked example, by hand: Q = K = [[1,0],[1,1],[0,1]],
//! V = [[1,0],[0,1],[1,1]], d_k = 2, default scale 1/√2.
//!
//! The attention weights are read back by running with V = the 3×3 identity (d_v = 3): then
//! output row i is exactly weight row i. Both the fused kernel and the reference must give the
//! article's 3-decimal numbers, and agree with the weights and outputs computed here in f64
//! straight from the formula `softmax(q_i·K / √2) · V`.

use crate::support;

use sdpa::{Alignment, Options};
use support::harness::{
    assert_close_to_reference, bounds, run, Buffer, Inputs, Layout, Outputs, Path,
};

const QK: [[f32; 2]; 3] = [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]];
const V: [[f32; 2]; 3] = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
const IDENTITY: [[f32; 3]; 3] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

/// The article's weights and outputs, to 3 decimals.
const WEIGHTS_3DP: [[f64; 3]; 3] = [
    [0.401, 0.401, 0.198],
    [0.248, 0.503, 0.248],
    [0.198, 0.401, 0.401],
];
const OUTPUTS_3DP: [[f64; 2]; 3] = [[0.599, 0.599], [0.497, 0.752], [0.599, 0.802]];

fn inputs<const D: usize>(values: &[[f32; D]; 3], layout: Layout) -> Inputs {
    let flat = |m: &[[f32; 2]; 3]| m.concat();
    Inputs {
        q: Buffer::from_logical([1, 3, 1, 2], layout, &flat(&QK)),
        k: Buffer::from_logical([1, 3, 1, 2], layout, &flat(&QK)),
        v: Buffer::from_logical([1, 3, 1, D], layout, &values.concat()),
    }
}

/// `softmax_j(q_i·k_j / √2)` and `ln Σ_j exp(q_i·k_j / √2)` in f64, from the definition.
fn exact_weights() -> ([[f64; 3]; 3], [f64; 3]) {
    let mut w = [[0.0; 3]; 3];
    let mut lse = [0.0; 3];
    for i in 0..3 {
        let s: Vec<f64> = (0..3)
            .map(|j| {
                let dot: f64 = (0..2)
                    .map(|c| f64::from(QK[i][c]) * f64::from(QK[j][c]))
                    .sum();
                dot / 2f64.sqrt()
            })
            .collect();
        let z: f64 = s.iter().map(|x| x.exp()).sum();
        for j in 0..3 {
            w[i][j] = s[j].exp() / z;
        }
        lse[i] = z.ln();
    }
    (w, lse)
}

fn exact_outputs() -> [[f64; 2]; 3] {
    let (w, _) = exact_weights();
    let mut o = [[0.0; 2]; 3];
    for i in 0..3 {
        for c in 0..2 {
            o[i][c] = (0..3).map(|j| w[i][j] * f64::from(V[j][c])).sum();
        }
    }
    o
}

/// `x` rounded to 3 decimals is `want`.
fn assert_3dp(x: f32, want: f64, what: &str) {
    assert_eq!(
        (f64::from(x) * 1000.0).round(),
        (want * 1000.0).round(),
        "{what}: {x} does not round to {want:.3}"
    );
}

#[test]
fn the_exact_formula_gives_the_articles_numbers() {
    // Sanity of the test's own arithmetic: row 0 is softmax([1, 1, 0] / √2).
    let (w, _) = exact_weights();
    let e = std::f64::consts::FRAC_1_SQRT_2.exp();
    assert!((w[0][0] - e / (2.0 * e + 1.0)).abs() < 1e-15);
    assert!((w[0][2] - 1.0 / (2.0 * e + 1.0)).abs() < 1e-15);
    for i in 0..3 {
        for j in 0..3 {
            assert_eq!(
                (w[i][j] * 1000.0).round(),
                (WEIGHTS_3DP[i][j] * 1000.0).round()
            );
        }
    }
    let o = exact_outputs();
    for i in 0..3 {
        for c in 0..2 {
            assert_eq!(
                (o[i][c] * 1000.0).round(),
                (OUTPUTS_3DP[i][c] * 1000.0).round()
            );
        }
    }
}

/// Each path's value `got` is within `tol` of the exact `want`, where `tol` is the fused
/// kernel's error bound plus one f32 ulp of 1 (the reference itself is exact up to its final
/// rounding to f32 and the rounding of 1/√2 to f32, each below half an ulp here).
fn assert_exact(path: Path, got: impl Into<f64>, want: f64, bound: f64, what: &str) {
    let got: f64 = got.into();
    let err = (got - want).abs();
    let tol = match path {
        Path::Fused => bound + f64::from(f32::EPSILON),
        Path::Reference => f64::from(f32::EPSILON),
    };
    assert!(
        err <= tol,
        "{path:?} {what}: {got} vs exact {want}: {err:e} > {tol:e}"
    );
}

#[test]
fn weights_by_both_paths() {
    let inp = inputs(&IDENTITY, Layout::BSHD);
    let opts = Options::new();
    let (w, lse) = exact_weights();
    let b = bounds(&inp, &opts);
    for path in Path::BOTH {
        let o = run(path, &inp, &opts);
        for i in 0..3 {
            let row = o.row(0, i, 0);
            for j in 0..3 {
                let what = format!("weight [{i}][{j}]");
                assert_3dp(row[j], WEIGHTS_3DP[i][j], &what);
                assert_exact(path, row[j], w[i][j], b[i].out, &what);
            }
            // Three weights, each within its tolerance of exact ones that sum to 1 (the
            // reference's three roundings to f32 add at most 3 · 2⁻²⁵ < one ulp of 1).
            let sum: f64 = row.iter().map(|&x| f64::from(x)).sum();
            assert_exact(path, sum, 1.0, 3.0 * b[i].out, "weight row sum");
            assert_exact(
                path,
                o.lse_at(0, i, 0),
                lse[i],
                b[i].lse,
                &format!("lse[{i}]"),
            );
        }
    }
    assert_close_to_reference(&inp, Layout::BSHD, &opts, "worked example, V = I");
}

#[test]
fn outputs_by_both_paths() {
    let inp = inputs(&V, Layout::BSHD);
    let opts = Options::new();
    let o_exact = exact_outputs();
    let b = bounds(&inp, &opts);
    for path in Path::BOTH {
        let o = run(path, &inp, &opts);
        for i in 0..3 {
            for c in 0..2 {
                let what = format!("out [{i}][{c}]");
                assert_3dp(o.row(0, i, 0)[c], OUTPUTS_3DP[i][c], &what);
                assert_exact(path, o.row(0, i, 0)[c], o_exact[i][c], b[i].out, &what);
            }
        }
    }
    assert_close_to_reference(&inp, Layout::BSHD, &opts, "worked example");
}

#[test]
fn explicit_scale_one_over_sqrt2_is_the_default() {
    let inp = inputs(&V, Layout::BSHD);
    for path in Path::BOTH {
        let default = run(path, &inp, &Options::new());
        let explicit = run(path, &inp, &Options::new().scale(1.0 / 2f32.sqrt()));
        assert_eq!(bits(&default), bits(&explicit), "{path:?}");
    }
}

#[test]
fn the_example_in_other_layouts_gives_the_same_bits() {
    let opts = Options::new();
    for path in Path::BOTH {
        let want = run(path, &inputs(&V, Layout::BSHD), &opts);
        for layout in [
            Layout::BHSD,
            Layout::padded_bshd(1, 3),
            Layout::padded_bhsd(2, 1),
        ] {
            let got = run(path, &inputs(&V, layout), &opts);
            assert_eq!(bits(&got), bits(&want), "{path:?} {layout:?}");
        }
    }
}

#[test]
fn causal_example() {
    // Row 0 sees key 0 only: exactly v₀. Row 1 sees keys 0 and 1 with scores 1/√2 and 2/√2.
    // Row 2 sees everything: the unmasked result. (n_q = n_kv: both alignments agree.)
    let inp = inputs(&V, Layout::BSHD);
    let e = (1.0 / 2f64.sqrt()).exp();
    let w1 = [e / (e + e * e), e * e / (e + e * e)];
    // v₀ = [1, 0] and v₁ = [0, 1]: row 1's output is its two weights.
    let row1 = [w1[0], w1[1]];
    let full = exact_outputs();
    for alignment in [Alignment::TopLeft, Alignment::BottomRight] {
        let opts = Options::new().causal(alignment);
        let b = bounds(&inp, &opts);
        for path in Path::BOTH {
            let o = run(path, &inp, &opts);
            assert_eq!(o.row(0, 0, 0), &V[0], "{path:?} {alignment:?}");
            // One key with score 1/√2: lse = 1/√2.
            let lse0 = std::f64::consts::FRAC_1_SQRT_2;
            assert_exact(path, o.lse_at(0, 0, 0), lse0, b[0].lse, "lse of row 0");
            for c in 0..2 {
                assert_exact(path, o.row(0, 1, 0)[c], row1[c], b[1].out, "causal row 1");
                assert_exact(
                    path,
                    o.row(0, 2, 0)[c],
                    full[2][c],
                    b[2].out,
                    "causal row 2",
                );
            }
        }
        assert_close_to_reference(&inp, Layout::BSHD, &opts, "causal worked example");
    }
}

fn bits(o: &Outputs) -> Vec<u32> {
    o.out.iter().chain(&o.lse).map(|x| x.to_bits()).collect()
}
