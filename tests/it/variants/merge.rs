//! `merge_partials` over keys split at random points: each piece is computed with
//! `attention_lse` on K/V sub-views, the pieces merged, and the result compared with the f64
//! reference of the unsplit problem.
//!
//! Options whose meaning depends on where a key sits (causal, window, ALiBi, and the key
//! lengths) cannot be passed to a piece as they are: a piece's key 0 is key `a` of the whole
//! problem, and bottom-right alignment would move with the piece's length. So the unsplit
//! problem uses the real options, and every piece gets the equivalent explicit form, built once
//! for the whole problem and sliced by key range: a boolean mask for causal/window (and the
//! caller's mask), a bias for ALiBi (and the caller's bias), and key lengths shifted by `a`.
//! That also checks the documented formulas of those options against their literal meaning.

use super::grid::{Case, Mix};
use super::{rng, run, Buffer, Layout, Path, Run, U};
use crate::support::differential::Shape;
use rand::Rng;
use sdpa::reference::{self, ErrorBound};
use sdpa::{merge_partials, Options, Partial, Tensor};

/// The explicit per-piece form of a case's options, for the whole `[B, n_q, H, n_kv]` problem
/// (keys innermost and contiguous, so a key range is a sub-view).
struct Explicit {
    /// ALiBi + bias, or `None` if the case has neither.
    bias: Option<Buffer<f32>>,
    /// causal ∧ window ∧ mask, or `None` if the case has none of them.
    mask: Option<Buffer<bool>>,
    /// Largest |bias| entry (its f32 rounding perturbs the scores by `u` of it).
    bias_max: f64,
}

impl Explicit {
    fn new(c: &Case) -> Self {
        let s = c.shape;
        let o = &c.opts;
        let dims = [s.batch, s.n_q, s.heads, s.n_kv];
        // ALiBi subtracts `slope_h · |i + off_b − j|` (bottom-right aligns each sequence at its
        // own key length); the bias adds its (broadcast) entry.
        let bias = (o.slopes.is_some() || o.bias.is_some()).then(|| {
            Buffer::from_fn(dims, Layout::BSHD, 0.0, |[bb, i, hh, j]| {
                let mut x = 0.0f64;
                if let Some(slopes) = &o.slopes {
                    let d = (i as i128 + o.offset(bb) - j as i128).abs() as f64;
                    x -= f64::from(slopes[hh]) * d;
                }
                x += f64::from(o.bias(bb, i, hh, j));
                x as f32
            })
        });
        // causal ∧ window ∧ mask (∧ key lengths, which each piece also gets).
        let masked = o.spec.causal.alignment().is_some() || o.spec.window.is_some();
        let mask = (masked || o.mask.is_some()).then(|| {
            Buffer::from_fn(dims, Layout::BSHD, false, |[bb, i, hh, j]| {
                o.visible(bb, i, hh, j)
            })
        });
        let bias_max = bias.as_ref().map_or(0.0, |b| {
            b.logical()
                .iter()
                .filter(|x| x.is_finite())
                .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()))
        });
        Explicit {
            bias,
            mask,
            bias_max,
        }
    }
}

/// A key range `[a, e)` of a `[B, n_kv, H, d]` tensor or a `[B, n_q, H, n_kv]` bias/mask.
fn keys<'a, T>(buf: &'a Buffer<T>, axis: usize, a: usize, e: usize) -> Tensor<'a, T> {
    let mut dims = buf.dims;
    dims[axis] = e - a;
    // An empty range at the end may start past the slice (no trailing padding there).
    let start = (buf.start + a * buf.strides[axis]).min(buf.data.len());
    Tensor::new(&buf.data[start..], dims, buf.strides).expect("a key sub-view")
}

/// Merges `runs` (each `(out, lse)` in logical BSHD order) with `merge_partials` into an output
/// in `layout`.
fn merge(runs: &[Run], layout: Layout) -> Run {
    let dims = runs[0].dims;
    let outs: Vec<Buffer<f32>> = runs.iter().map(|r| Buffer::bshd(dims, &r.out)).collect();
    let parts: Vec<Partial> = outs
        .iter()
        .zip(runs)
        .map(|(o, r)| Partial {
            out: o.view(),
            lse: &r.lse,
        })
        .collect();
    let mut out = Buffer::from_fn(dims, layout, f32::NAN, |_| f32::NAN);
    let mut lse = vec![f32::NAN; runs[0].lse.len()];
    merge_partials(&parts, &mut out.view_mut(), &mut lse).expect("a valid merge");
    Run {
        dims,
        out: out.logical(),
        lse,
    }
}

#[test]
fn merged_pieces_match_the_unsplit_problem() {
    let mut rng = rng(0x3e59f);
    let mut with_empty_piece = 0;
    let mut with_blind_row = 0;
    for case in 0..60 {
        let b = rng.random_range(1..=2);
        let hkv = rng.random_range(1..=2);
        let h = hkv * [1, 2, 4][rng.random_range(0..3)];
        let nq = rng.random_range(1..=40);
        let nkv = rng.random_range(0..=260);
        let dk = [4, 16, 64][rng.random_range(0..3)];
        let dv = [3, 16, 64][rng.random_range(0..3)];
        let shape = Shape::new(b, h, hkv, nq, nkv, dk, dv);
        let mix = if case % 4 == 0 { Mix::ALL } else { Mix::SOME };
        let c = Case::random(&mut rng, shape, mix, format!("merge case {case}"));
        let label = c.describe();
        let ex = Explicit::new(&c);

        // 1–5 pieces at random cut points (repeats make empty pieces).
        let pieces = rng.random_range(1..=5);
        let mut cuts: Vec<usize> = (1..pieces).map(|_| rng.random_range(0..=nkv)).collect();
        cuts.push(0);
        cuts.push(nkv);
        cuts.sort_unstable();

        let mut fused_parts = Vec::new();
        let mut ref_parts = Vec::new();
        let mut bounds: Vec<Vec<ErrorBound>> = Vec::new();
        for (p, w) in cuts.windows(2).enumerate() {
            let (a, e) = (w[0], w[1]);
            with_empty_piece += usize::from(a == e);
            let k = keys(&c.k, 1, a, e);
            let v = keys(&c.v, 1, a, e);
            let lens: Option<Vec<usize>> = c
                .opts
                .kv_lens
                .as_ref()
                .map(|l| l.iter().map(|&l| l.clamp(a, e) - a).collect());
            let mut o = Options::new();
            if let Some(s) = c.opts.spec.scale_value() {
                o = o.scale(s);
            }
            if let Some(cap) = c.opts.softcap {
                o = o.softcap(cap);
            }
            if let Some(bias) = &ex.bias {
                o = o.bias(keys(bias, 3, a, e));
            }
            if let Some(mask) = &ex.mask {
                o = o.mask(keys(mask, 3, a, e));
            }
            if let Some(lens) = &lens {
                o = o.kv_lens(lens);
            }
            // The sink counts once: with the first piece only.
            if let (0, Some(sinks)) = (p, &c.opts.sinks) {
                o = o.sinks(sinks);
            }
            let q = c.q.view();
            let fused = run(Path::Fused, &q, &k, &v, &o, Layout::BSHD).unwrap();
            let refr = run(Path::Reference, &q, &k, &v, &o, Layout::BSHD).unwrap();
            with_blind_row += usize::from(refr.lse.contains(&f32::NEG_INFINITY));
            bounds.push(reference::error_bounds(&q, &k, &v, &o).unwrap());
            fused_parts.push(fused);
            ref_parts.push(refr);
        }
        let out_layout = Layout::random(&mut rng);
        let merged = merge(&fused_parts, out_layout);
        let merged_ref = merge(&ref_parts, Layout::BSHD);
        let opts = c.opts();
        let (q, k, v) = (c.q.view(), c.k.view(), c.v.view());
        let whole = run(Path::Reference, &q, &k, &v, &opts, Layout::BSHD).unwrap();

        // Tolerance, per row. Piece k's fused result is within its bound (δ_k on the output,
        // ε_k on the LSE) of the piece's reference, which is within u of the exact piece
        // (rounded to f32 once). The explicit bias is rounded to f32: each score moves by at most
        // u·max|bias|, so each exact piece differs from the corresponding part of the unsplit
        // problem by a factor e^{±u·max|bias|} in every weight. Merging: o = Σ w_k o_k with
        // w_k = e^{lse_k − lse}; LSE errors ≤ ε move each w_k by a factor within e^{±2ε}, so
        // Σ|w̃_k − w_k| ≤ e^{2ε} − 1 and the output moves by ≤ max δ_k + (e^{2ε} − 1)·max|v|.
        // Finally the merge's own f64 sums are rounded to f32 once (u), as is the unsplit
        // reference (u). Rows whose unsplit reference sees no key must be exactly 0 / −∞.
        let v_max = c.v.max_abs();
        let [_, _, _, dv] = whole.dims;
        for bb in 0..b {
            for hh in 0..h {
                for i in 0..nq {
                    let row = (bb * h + hh) * nq + i;
                    let at = format!("{label}: cuts {cuts:?} b={bb} h={hh} i={i}");
                    let want_lse = whole.lse_at(bb, i, hh);
                    if want_lse == f32::NEG_INFINITY {
                        for m in [&merged, &merged_ref] {
                            assert_eq!(m.lse_at(bb, i, hh), f32::NEG_INFINITY, "{at}");
                            assert!(m.row(bb, i, hh).iter().all(|&x| x == 0.0), "{at}");
                        }
                        continue;
                    }
                    let lse_k_max = ref_parts
                        .iter()
                        .map(|r| f64::from(r.lse[row]))
                        .filter(|x| x.is_finite())
                        .fold(0.0f64, |m, x| m.max(x.abs()));
                    let bias_eps = U * ex.bias_max;
                    for (m, eps, delta, name) in [
                        (
                            &merged,
                            bounds.iter().map(|b| b[row].lse).fold(0.0, f64::max),
                            bounds.iter().map(|b| b[row].out).fold(0.0, f64::max),
                            "fused pieces",
                        ),
                        (&merged_ref, 0.0, 0.0, "reference pieces"),
                    ] {
                        let eps = eps + U * lse_k_max + bias_eps;
                        let lse_tol = eps + 2.0 * U * f64::from(want_lse).abs();
                        let out_tol = delta + ((2.0 * eps).exp_m1() + 4.0 * U) * v_max;
                        let got = m.lse_at(bb, i, hh);
                        let e = (f64::from(got) - f64::from(want_lse)).abs();
                        assert!(
                            e <= lse_tol,
                            "{at}: {name}: merged lse {got} vs {want_lse}: {e:e} > {lse_tol:e}"
                        );
                        let (got, want) = (m.row(bb, i, hh), whole.row(bb, i, hh));
                        for cc in 0..dv {
                            let e = (f64::from(got[cc]) - f64::from(want[cc])).abs();
                            assert!(
                                e <= out_tol,
                                "{at} c={cc}: {name}: merged {} vs {}: {e:e} > {out_tol:e}",
                                got[cc],
                                want[cc]
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(with_empty_piece > 5, "empty pieces: {with_empty_piece}");
    assert!(
        with_blind_row > 20,
        "pieces with a blind row: {with_blind_row}"
    );
}

/// Merging a single partial gives it back bit for bit (weight e⁰ = 1, sum 1); splitting off an
/// empty piece (n_kv = 0: output 0, LSE −∞) changes nothing either.
#[test]
fn merging_one_partial_or_an_empty_one_changes_nothing() {
    let mut rng = rng(0x0e1);
    let shape = Shape::new(2, 4, 2, 5, 70, 16, 8);
    let c = Case::random(&mut rng, shape, Mix::ALL, "one partial".into());
    let (q, k, v) = (c.q.view(), c.k.view(), c.v.view());
    let opts = c.opts();
    let whole = run(Path::Fused, &q, &k, &v, &opts, Layout::BSHD).unwrap();
    let bits = |r: &Run| -> Vec<u32> { r.out.iter().chain(&r.lse).map(|x| x.to_bits()).collect() };
    assert_eq!(
        bits(&merge(std::slice::from_ref(&whole), Layout::BHSD)),
        bits(&whole)
    );

    let empty_k = keys(&c.k, 1, 0, 0);
    let empty_v = keys(&c.v, 1, 0, 0);
    let none = run(
        Path::Fused,
        &q,
        &empty_k,
        &empty_v,
        &Options::new(),
        Layout::BSHD,
    )
    .unwrap();
    assert!(none.lse.iter().all(|&x| x == f32::NEG_INFINITY));
    assert!(none.out.iter().all(|&x| x == 0.0));
    let merged = merge(&[none.clone(), whole.clone(), none], Layout::BSHD);
    assert_eq!(bits(&merged), bits(&whole));
}
