//! Properties attention has whatever its inputs, checked on random inputs of several shapes
//! (grouped- and multi-query included), for the fused kernel and the reference alike:
//!
//! * each weight row is a probability distribution (read with V = identity);
//! * each output component lies in the range of that component over the visible values;
//! * query rows are independent (permuting them permutes the output rows, bit for bit);
//! * keys are a set (permuting keys together with values changes nothing beyond rounding);
//! * causal row 0 (top-left) is exactly v₀;
//! * only `scale · Q` matters: `(c·Q, scale / c)` is the same problem;
//! * the storage layout does not matter (bit for bit).

use crate::support;

use rand::seq::SliceRandom;
use sdpa::{Alignment, Options};
use support::harness::{
    bounds, fused, gamma, rng, run, run_with, visible, Buffer, Inputs, Layout, Outputs, Path, Shape,
};

/// Shapes with `n_kv` small enough that V = identity fits (`d_v = n_kv`).
fn shapes() -> Vec<Shape> {
    let s = |batch, heads, kv_heads, n_q, n_kv, d_k| Shape {
        batch,
        heads,
        kv_heads,
        n_q,
        n_kv,
        d_k,
        d_v: n_kv,
    };
    vec![
        s(1, 1, 1, 37, 50, 16),
        s(2, 4, 2, 70, 100, 32),  // GQA 2
        s(1, 8, 1, 100, 130, 64), // MQA
        s(1, 6, 3, 5, 200, 8),    // few queries, many keys
        s(2, 4, 4, 150, 40, 3),   // more queries than keys
        s(1, 8, 2, 97, 97, 17),   // GQA 4
    ]
}

fn masks() -> [Options<'static>; 3] {
    [
        Options::new(),
        Options::new().causal(Alignment::TopLeft),
        Options::new().causal(Alignment::BottomRight),
    ]
}

/// Random Q and K (Q in `[-q_range, q_range)`), V = identity: `v[b, j, h, c] = [j == c]`.
fn identity_v_inputs(shape: Shape, seed: u64, q_range: f32) -> Inputs {
    let mut inp = Inputs::random(shape, [Layout::BSHD; 3], seed, q_range);
    inp.v = Buffer::from_fn(shape.v_dims(), Layout::BSHD, f32::NAN, |[_, j, _, c]| {
        if j == c {
            1.0
        } else {
            0.0
        }
    });
    inp
}

#[test]
fn weight_rows_are_probability_distributions() {
    for (n, shape) in shapes().into_iter().enumerate() {
        for (m, opts) in masks().iter().enumerate() {
            for q_range in [1.0, 6.0] {
                let inp = identity_v_inputs(shape, 100 + n as u64, q_range);
                for path in Path::BOTH {
                    let o = run(path, &inp, opts);
                    check_weight_rows(&o, shape, opts, path, &format!("shape {n} mask {m}"));
                }
            }
        }
    }
}

/// Every weight is in [0, 1], invisible keys weigh exactly 0, rows with a visible key sum to 1:
/// for the reference within its `n` roundings to f32 (each ≤ 2⁻²⁵ for weights ≤ 1); for the
/// fused kernel within `γ_{3n+4}`, the bound of an n-term f32 normalization (n − 1 additions
/// for the denominator, at most n rescalings of each running sum, a reciprocal, a product).
fn check_weight_rows(o: &Outputs, shape: Shape, opts: &Options, path: Path, label: &str) {
    for b in 0..shape.batch {
        for h in 0..shape.heads {
            for i in 0..shape.n_q {
                let w = o.row(b, i, h);
                let (lo, hi) = visible(opts, shape.n_q, shape.n_kv, i);
                for (j, &x) in w.iter().enumerate() {
                    if (lo..hi).contains(&j) {
                        assert!((0.0..=1.0).contains(&x), "{path:?} {label}: weight {x}");
                    } else {
                        assert_eq!(x, 0.0, "{path:?} {label}: invisible key {j} of row {i}");
                    }
                }
                if lo == hi {
                    continue;
                }
                let n = hi - lo;
                let sum: f64 = w.iter().map(|&x| f64::from(x)).sum();
                let tol = match path {
                    Path::Fused => gamma(3 * n + 4),
                    Path::Reference => n as f64 * 2f64.powi(-25) + 1e-12,
                };
                assert!(
                    (sum - 1.0).abs() <= tol,
                    "{path:?} {label}: row b={b} h={h} i={i} sums to {sum} (tol {tol:e})"
                );
            }
        }
    }
}

/// Spacing of f32 at `x`'s magnitude.
fn ulp(x: f32) -> f32 {
    let a = x.abs();
    a.next_up() - a
}

#[test]
fn outputs_lie_between_the_visible_values() {
    // Slack: 4 ulps of the range's largest magnitude. Large Q (peaked softmax) and short causal
    // rows push outputs against the ends of the range, where the check has teeth.
    let mut checked = 0usize;
    let mut tight = 0usize;
    let mut worst = 0.0f32; // largest excursion outside the range, in ulps
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = [5, 16, 33][n % 3];
        for (m, opts) in masks().iter().enumerate() {
            for q_range in [1.0, 8.0, 30.0] {
                let inp = Inputs::random(shape, [Layout::BSHD; 3], 200 + n as u64, q_range);
                for path in Path::BOTH {
                    let o = run(path, &inp, opts);
                    for b in 0..shape.batch {
                        for h in 0..shape.heads {
                            let hk = h / (shape.heads / shape.kv_heads);
                            for i in 0..shape.n_q {
                                let (lo, hi) = visible(opts, shape.n_q, shape.n_kv, i);
                                if lo == hi {
                                    continue;
                                }
                                for c in 0..shape.d_v {
                                    let vals = (lo..hi).map(|j| inp.v.at([b, j, hk, c]));
                                    let min = vals.clone().fold(f32::INFINITY, f32::min);
                                    let max = vals.fold(f32::NEG_INFINITY, f32::max);
                                    let slack = 4.0 * ulp(min.abs().max(max.abs()));
                                    let x = o.row(b, i, h)[c];
                                    assert!(
                                        min - slack <= x && x <= max + slack,
                                        "{path:?} shape {n} mask {m} q_range {q_range}: \
                                         out[b={b}, i={i}, h={h}, c={c}] = {x} outside \
                                         [{min}, {max}]"
                                    );
                                    checked += 1;
                                    let outside = (min - x).max(x - max).max(0.0);
                                    worst = worst.max(outside / ulp(min.abs().max(max.abs())));
                                    if (x - min).min(max - x) <= 16.0 * ulp(max - min) {
                                        tight += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{checked} components checked, {tight} within 16 ulps of an end of the range, \
         largest excursion outside it {worst} ulps"
    );
    assert!(
        tight > 1000,
        "the check never came close to the ends of the range"
    );
}

#[test]
fn permuting_query_rows_permutes_output_rows() {
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = 24;
        let inp = Inputs::random(shape, [Layout::BSHD; 3], 300 + n as u64, 2.0);
        let mut perm: Vec<usize> = (0..shape.n_q).collect();
        perm.shuffle(&mut rng(301 + n as u64));
        let mut permuted = inp.clone();
        permuted.q = Buffer::from_fn(shape.q_dims(), Layout::BSHD, f32::NAN, |[b, i, h, c]| {
            inp.q.at([b, perm[i], h, c])
        });
        let opts = Options::new();
        for path in Path::BOTH {
            let want = run(path, &inp, &opts);
            let got = run(path, &permuted, &opts);
            for b in 0..shape.batch {
                for h in 0..shape.heads {
                    for (i, &p) in perm.iter().enumerate() {
                        assert_eq!(
                            bits(got.row(b, i, h)),
                            bits(want.row(b, p, h)),
                            "{path:?} shape {n}: output row {i} ≠ row {p} of the original"
                        );
                        assert_eq!(
                            got.lse_at(b, i, h).to_bits(),
                            want.lse_at(b, p, h).to_bits(),
                            "{path:?} shape {n}: lse of row {i}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn permuting_keys_with_values_changes_nothing_beyond_rounding() {
    // Both results are within the bound of the exact result (the bound is the same for both:
    // it does not depend on the key order), so they are within twice the bound of each other.
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = 19;
        let inp = Inputs::random(shape, [Layout::BSHD; 3], 400 + n as u64, 3.0);
        let mut perm: Vec<usize> = (0..shape.n_kv).collect();
        perm.shuffle(&mut rng(401 + n as u64));
        let mut permuted = inp.clone();
        permuted.k = Buffer::from_fn(shape.k_dims(), Layout::BSHD, f32::NAN, |[b, j, h, c]| {
            inp.k.at([b, perm[j], h, c])
        });
        permuted.v = Buffer::from_fn(shape.v_dims(), Layout::BSHD, f32::NAN, |[b, j, h, c]| {
            inp.v.at([b, perm[j], h, c])
        });
        let opts = Options::new();
        let bound = bounds(&inp, &opts);
        for path in Path::BOTH {
            let want = run(path, &inp, &opts);
            let got = run(path, &permuted, &opts);
            for b in 0..shape.batch {
                for h in 0..shape.heads {
                    for i in 0..shape.n_q {
                        let e = bound[(b * shape.heads + h) * shape.n_q + i];
                        let (x, y) = (got.lse_at(b, i, h), want.lse_at(b, i, h));
                        let err = f64::from((x - y).abs());
                        assert!(err <= 2.0 * e.lse, "{path:?} shape {n}: lse {x} vs {y}");
                        for (c, (&x, &y)) in
                            got.row(b, i, h).iter().zip(want.row(b, i, h)).enumerate()
                        {
                            let err = f64::from((x - y).abs());
                            assert!(
                                err <= 2.0 * e.out,
                                "{path:?} shape {n}: out[b={b}, i={i}, h={h}, c={c}] {x} vs {y}: \
                                 {err:e} > 2 × {:e}",
                                e.out
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn causal_row_that_sees_one_key_is_exactly_that_value() {
    // Top-left: row 0 sees key 0 only. Bottom-right with n_q > n_kv: row n_q − n_kv does.
    // One key: its weight is exp(0) / exp(0) = 1 exactly, so the output is v₀ bit for bit.
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = 21;
        let inp = Inputs::random(shape, [Layout::BSHD; 3], 500 + n as u64, 4.0);
        let mut cases = vec![(Options::new().causal(Alignment::TopLeft), 0)];
        if shape.n_q >= shape.n_kv {
            let row = shape.n_q - shape.n_kv;
            cases.push((Options::new().causal(Alignment::BottomRight), row));
        }
        for (opts, row) in cases {
            for path in Path::BOTH {
                let o = run(path, &inp, &opts);
                for b in 0..shape.batch {
                    for h in 0..shape.heads {
                        let hk = h / (shape.heads / shape.kv_heads);
                        let v0: Vec<f32> =
                            (0..shape.d_v).map(|c| inp.v.at([b, 0, hk, c])).collect();
                        assert_eq!(
                            bits(o.row(b, row, h)),
                            bits(&v0),
                            "{path:?} shape {n} {:?}: row {row} is not v₀",
                            opts.causal_alignment()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn scaling_q_by_a_power_of_two_and_scale_by_its_inverse_changes_no_bit() {
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = 16;
        let inp = Inputs::random(shape, [Layout::BSHD; 3], 600 + n as u64, 2.0);
        let default_scale = 1.0 / (shape.d_k as f32).sqrt();
        for opts in masks() {
            for c in [4.0f32, 0.5, 1024.0] {
                let mut scaled = inp.clone();
                scaled.q = Buffer::from_fn(shape.q_dims(), Layout::BSHD, f32::NAN, |idx| {
                    inp.q.at(idx) * c
                });
                let scaled_opts = opts.clone().scale(default_scale / c);
                for path in Path::BOTH {
                    let want = run(path, &inp, &opts);
                    let got = run(path, &scaled, &scaled_opts);
                    assert_eq!(all_bits(&got), all_bits(&want), "{path:?} shape {n} c={c}");
                }
            }
        }
    }
}

#[test]
fn scaling_q_by_three_and_scale_by_a_third_stays_within_the_bound() {
    // (3Q, s/3) is a slightly different f32 problem (3q and s/3 are rounded); each result is
    // within its own bound of its exact value, and the two exact values differ by less than
    // either bound (score perturbations of 2u·|s| are inside each bound's Δ), so the results
    // are within the sum of the two bounds.
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = 16;
        let inp = Inputs::random(shape, [Layout::BSHD; 3], 700 + n as u64, 2.0);
        let s = 0.3f32;
        for opts in masks() {
            for c in [3.0f32, 0.7] {
                let mut scaled = inp.clone();
                scaled.q = Buffer::from_fn(shape.q_dims(), Layout::BSHD, f32::NAN, |idx| {
                    inp.q.at(idx) * c
                });
                let base_opts = opts.clone().scale(s);
                let scaled_opts = opts.clone().scale(s / c);
                let b1 = bounds(&inp, &base_opts);
                let b2 = bounds(&scaled, &scaled_opts);
                let want = run(Path::Reference, &inp, &base_opts);
                let got = fused(&scaled, &scaled_opts);
                let [batch, n_q, heads, d_v] = got.dims;
                for b in 0..batch {
                    for h in 0..heads {
                        for i in 0..n_q {
                            let r = (b * heads + h) * n_q + i;
                            let (x, y) = (got.lse_at(b, i, h), want.lse_at(b, i, h));
                            if y == f32::NEG_INFINITY {
                                assert_eq!(x, y);
                                continue;
                            }
                            let tol = b1[r].lse + b2[r].lse;
                            assert!(f64::from((x - y).abs()) <= tol, "shape {n} c={c}: lse");
                            for k in 0..d_v {
                                let (x, y) = (got.row(b, i, h)[k], want.row(b, i, h)[k]);
                                let tol = b1[r].out + b2[r].out;
                                assert!(
                                    f64::from((x - y).abs()) <= tol,
                                    "shape {n} c={c}: out {x} vs {y} (tol {tol:e})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_storage_layout_does_not_change_a_bit() {
    let layouts = [
        [Layout::BHSD, Layout::BHSD, Layout::BHSD, Layout::BHSD],
        [
            Layout::padded_bshd(1, 7),
            Layout::padded_bhsd(3, 2),
            Layout::padded_bshd(2, 0),
            Layout::padded_bhsd(2, 5),
        ],
        [
            Layout::strided(Layout::SBHD_ORDER, 1, 4, 1),
            Layout::BHSD,
            Layout::strided(Layout::SBHD_ORDER, 3, 0, 2),
            Layout::padded_bshd(1, 9),
        ],
    ];
    for (n, mut shape) in shapes().into_iter().enumerate() {
        shape.d_v = 20;
        let base = Inputs::random(shape, [Layout::BSHD; 3], 800 + n as u64, 2.0);
        for opts in masks() {
            for path in Path::BOTH {
                let want = run(path, &base, &opts);
                for (l, lay) in layouts.iter().enumerate() {
                    let relaid = Inputs {
                        q: relayout(&base.q, lay[0]),
                        k: relayout(&base.k, lay[1]),
                        v: relayout(&base.v, lay[2]),
                    };
                    let got = run_with(path, &relaid, lay[3], &opts);
                    assert_eq!(
                        all_bits(&got),
                        all_bits(&want),
                        "{path:?} shape {n} layouts {l}"
                    );
                }
            }
        }
    }
}

#[test]
fn grouped_query_heads_equal_repeated_key_value_heads() {
    // GQA reads kv head h / group; materializing that repetition (H_kv = H) is the same
    // problem, so each result is within its bound of the same exact value.
    for (n, mut shape) in shapes().into_iter().enumerate() {
        if shape.kv_heads == shape.heads {
            continue;
        }
        shape.d_v = 16;
        let group = shape.heads / shape.kv_heads;
        let inp = Inputs::random(shape, [Layout::BSHD; 3], 900 + n as u64, 2.0);
        let wide = Shape {
            kv_heads: shape.heads,
            ..shape
        };
        let repeated = Inputs {
            q: inp.q.clone(),
            k: Buffer::from_fn(wide.k_dims(), Layout::BSHD, f32::NAN, |[b, j, h, c]| {
                inp.k.at([b, j, h / group, c])
            }),
            v: Buffer::from_fn(wide.v_dims(), Layout::BSHD, f32::NAN, |[b, j, h, c]| {
                inp.v.at([b, j, h / group, c])
            }),
        };
        for opts in masks() {
            let bound = bounds(&inp, &opts);
            for path in Path::BOTH {
                let a = run(path, &inp, &opts);
                let b = run(path, &repeated, &opts);
                for (r, e) in bound.iter().enumerate() {
                    let (x, y) = (a.lse[r], b.lse[r]);
                    assert!(
                        x == y || f64::from((x - y).abs()) <= 2.0 * e.lse,
                        "lse {x} vs {y}"
                    );
                }
                let d_v = shape.d_v;
                for (idx, (&x, &y)) in a.out.iter().zip(&b.out).enumerate() {
                    let row = idx / d_v; // ((b·n_q + i)·H + h)
                    let (h, bi) = (row % shape.heads, row / shape.heads);
                    let (bb, i) = (bi / shape.n_q, bi % shape.n_q);
                    let e = bound[(bb * shape.heads + h) * shape.n_q + i];
                    assert!(
                        f64::from((x - y).abs()) <= 2.0 * e.out,
                        "{path:?} shape {n}: GQA {x} vs repeated heads {y}"
                    );
                }
            }
        }
    }
}

fn relayout(buf: &Buffer, layout: Layout) -> Buffer {
    Buffer::from_fn(buf.dims, layout, f32::NAN, |idx| buf.at(idx))
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

fn all_bits(o: &Outputs) -> Vec<u32> {
    o.out.iter().chain(&o.lse).map(|x| x.to_bits()).collect()
}

#[test]
fn lse_is_the_log_of_the_softmax_denominator_at_b_h_i() {
    // Computed here from the definition, at the documented index (b·H + h)·n_q + i, for a
    // sample of rows of a batched GQA problem: checks the LSE layout independently of the
    // reference. The fused value is within its bound (plus the reference's own rounding,
    // half an ulp); the reference within one ulp.
    let shape = Shape {
        batch: 2,
        heads: 6,
        kv_heads: 2,
        n_q: 30,
        n_kv: 45,
        d_k: 12,
        d_v: 5,
    };
    let inp = Inputs::random(shape, [Layout::BHSD, Layout::BSHD, Layout::BSHD], 1000, 3.0);
    let group = shape.heads / shape.kv_heads;
    for opts in masks() {
        // The default scale, 1/√d_k, as the f32 the call uses.
        let scale = f64::from(1.0 / (shape.d_k as f32).sqrt());
        let bound = bounds(&inp, &opts);
        let f = run(Path::Fused, &inp, &opts);
        let r = run(Path::Reference, &inp, &opts);
        for (b, h, i) in [
            (0, 0, 0),
            (0, 5, 29),
            (1, 2, 13),
            (1, 3, 0),
            (1, 5, 17),
            (0, 1, 22),
        ] {
            let (lo, hi) = visible(&opts, shape.n_q, shape.n_kv, i);
            let scores: Vec<f64> = (lo..hi)
                .map(|j| {
                    let dot: f64 = (0..shape.d_k)
                        .map(|c| {
                            f64::from(inp.q.at([b, i, h, c]))
                                * f64::from(inp.k.at([b, j, h / group, c]))
                        })
                        .sum();
                    scale * dot
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let want = m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln();
            let idx = (b * shape.heads + h) * shape.n_q + i;
            assert_eq!(f.lse[idx].to_bits(), f.lse_at(b, i, h).to_bits());
            let (lf, lr) = (f64::from(f.lse[idx]), f64::from(r.lse[idx]));
            let half_ulp = f64::from(ulp(want as f32)) / 2.0;
            assert!(
                (lr - want).abs() <= 2.0 * half_ulp,
                "reference lse[{idx}] = {lr}, want {want}"
            );
            assert!(
                (lf - want).abs() <= bound[idx].lse + half_ulp,
                "fused lse[{idx}] = {lf}, want {want}"
            );
        }
    }
}
