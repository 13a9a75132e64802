//! Edge cases of the semantics contract (the crate docs, "Semantics", and the README),
//! for the fused kernel and the reference alike:
//!
//! * huge logits (±1e4 and beyond) stay finite and accurate: the running max is subtracted;
//! * a row with no visible key has output exactly 0 and LSE exactly −∞;
//! * NaN propagates to exactly the outputs it touches (Q: its row; K, V: every row that sees
//!   the key);
//! * empty problems (`n_q = 0`, `batch = 0`, `d_v = 0`) are valid calls.

use crate::support;

use rand::Rng;
use sdpa::{Alignment, Options, Tensor, TensorMut};
use support::harness::{
    assert_close_to_reference, bounds, rng, run, Buffer, Inputs, Layout, Outputs, Path, Shape,
    OUTPUT_PAD_BITS,
};

fn masks() -> [Options<'static>; 3] {
    [
        Options::new(),
        Options::new().causal(Alignment::TopLeft),
        Options::new().causal(Alignment::BottomRight),
    ]
}

/// Inputs with Q and K entries `±100` (random signs) or uniform in `[-100, 100)`: with scale 1
/// the scores reach ±1e4 · d.
fn huge_logit_inputs(shape: Shape, seed: u64, signs_only: bool) -> Inputs {
    let mut r = rng(seed);
    let mut big = |_: [usize; 4]| {
        if signs_only {
            if r.random_bool(0.5) {
                100.0
            } else {
                -100.0
            }
        } else {
            r.random_range(-100.0f32..100.0)
        }
    };
    let q = Buffer::from_fn(shape.q_dims(), Layout::BSHD, f32::NAN, &mut big);
    let k = Buffer::from_fn(shape.k_dims(), Layout::BSHD, f32::NAN, &mut big);
    let v = Buffer::random(&mut r, shape.v_dims(), Layout::BSHD, 1.0);
    Inputs { q, k, v }
}

#[test]
fn logits_around_1e4_stay_finite_and_within_the_bound() {
    for d in 1..=4 {
        for (m, opts) in masks().into_iter().enumerate() {
            for signs_only in [true, false] {
                let shape = Shape {
                    batch: 2,
                    heads: 2,
                    kv_heads: 1,
                    n_q: 40,
                    n_kv: 130,
                    d_k: d,
                    d_v: 8,
                };
                let inp = huge_logit_inputs(shape, 10 * d as u64 + m as u64, signs_only);
                let opts = opts.clone().scale(1.0);
                let label = format!("d {d} mask {m} signs_only {signs_only}");
                let c = assert_close_to_reference(&inp, Layout::BSHD, &opts, &label);
                assert_eq!(c.empty_rows, 0);
                for o in [&c.fused, &c.reference] {
                    assert!(
                        o.out.iter().all(|x| x.is_finite()),
                        "{label}: non-finite output"
                    );
                    assert!(
                        o.lse.iter().all(|x| x.is_finite()),
                        "{label}: non-finite lse"
                    );
                    // Unmasked, some key matches the signs of the query row (2^d patterns,
                    // 130 keys): the largest score is d · 1e4.
                    if signs_only && m == 0 {
                        assert!(o.lse.iter().all(|x| x.abs() >= 9_000.0), "{label}: lse");
                    }
                }
            }
        }
    }
}

#[test]
fn a_key_ahead_by_2e4_takes_all_the_weight_exactly() {
    // Row scores are +1e4 for one key and −1e4 for all others: exp(−2e4) is 0 even in f64, so
    // the output is that key's value bit for bit and the LSE is the score.
    let (n_kv, d_v) = (200, 7);
    for winner in [0, 1, 95, 96, 97, 199] {
        let q = Buffer::from_logical([1, 3, 1, 1], Layout::BSHD, &[100.0, 100.0, 100.0]);
        let k = Buffer::from_fn([1, n_kv, 1, 1], Layout::BSHD, f32::NAN, |[_, j, _, _]| {
            if j == winner {
                100.0
            } else {
                -100.0
            }
        });
        let v = Buffer::random(
            &mut rng(winner as u64),
            [1, n_kv, 1, d_v],
            Layout::BSHD,
            1.0,
        );
        let inp = Inputs { q, k, v };
        let want: Vec<u32> = (0..d_v)
            .map(|c| inp.v.at([0, winner, 0, c]).to_bits())
            .collect();
        for path in Path::BOTH {
            let o = run(path, &inp, &Options::new().scale(1.0));
            for i in 0..3 {
                let got: Vec<u32> = o.row(0, i, 0).iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{path:?} winner {winner} row {i}");
                let lse = o.lse_at(0, i, 0);
                assert!(
                    (lse - 1e4).abs() <= 1e4 * f32::EPSILON,
                    "{path:?} lse {lse}"
                );
            }
        }
    }
}

#[test]
fn all_logits_equal_and_negative_1e4_give_the_mean_of_v() {
    let n_kv = 150;
    let q = Buffer::from_logical([1, 2, 1, 1], Layout::BSHD, &[100.0, -100.0]);
    let k = Buffer::from_fn([1, n_kv, 1, 1], Layout::BSHD, f32::NAN, |_| -100.0);
    let inp = Inputs {
        q,
        k,
        v: Buffer::random(&mut rng(5), [1, n_kv, 1, 4], Layout::BSHD, 1.0),
    };
    let opts = Options::new().scale(1.0);
    let c = assert_close_to_reference(&inp, Layout::BSHD, &opts, "equal logits");
    for c_ in 0..4 {
        let mean: f64 = (0..n_kv)
            .map(|j| f64::from(inp.v.at([0, j, 0, c_])))
            .sum::<f64>()
            / n_kv as f64;
        for i in 0..2 {
            let got = f64::from(c.fused.row(0, i, 0)[c_]);
            assert!(
                (got - mean).abs() <= c.bounds[i].out + 1e-7,
                "row {i}: {got} vs mean {mean}"
            );
        }
    }
    // Scores −1e4 (row 0) and +1e4 (row 1), each for all keys: lse = s + ln n_kv.
    let ln_n = (n_kv as f64).ln();
    for (i, s) in [(0, -1e4), (1, 1e4)] {
        let lse = f64::from(c.fused.lse_at(0, i, 0));
        assert!(
            (lse - (s + ln_n)).abs() <= c.bounds[i].lse,
            "row {i}: lse {lse}"
        );
    }
}

/// Asserts rows `rows` of every (batch, head) are exactly 0 with LSE −∞, and all others have
/// a finite LSE.
fn assert_empty_rows(o: &Outputs, empty: impl Fn(usize) -> bool, label: &str) {
    let [batch, n_q, heads, _] = o.dims;
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let (row, lse) = (o.row(b, i, h), o.lse_at(b, i, h));
                if empty(i) {
                    assert!(
                        row.iter().all(|&x| x == 0.0),
                        "{label}: row {i} has no key but output {row:?}"
                    );
                    assert_eq!(lse, f32::NEG_INFINITY, "{label}: lse of empty row {i}");
                } else {
                    assert!(lse.is_finite(), "{label}: row {i} lse {lse}");
                    assert!(row.iter().all(|x| x.is_finite()), "{label}: row {i}");
                }
            }
        }
    }
}

#[test]
fn top_left_causal_with_more_queries_than_keys_leaves_no_row_empty() {
    // Top-left: row i sees keys 0..=i, so every row sees key 0; rows i ≥ n_kv − 1 see all.
    let shape = Shape {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        n_q: 150,
        n_kv: 40,
        d_k: 16,
        d_v: 8,
    };
    let inp = Inputs::random_bshd(shape, 20);
    let opts = Options::new().causal(Alignment::TopLeft);
    let c = assert_close_to_reference(&inp, Layout::BSHD, &opts, "top-left n_q > n_kv");
    assert_eq!(c.empty_rows, 0);
    for path in Path::BOTH {
        let o = run(path, &inp, &opts);
        assert_empty_rows(&o, |_| false, &format!("{path:?} top-left"));
        // Rows that see every key equal the unmasked result.
        let full = run(path, &inp, &Options::new());
        let b = bounds(&inp, &Options::new());
        for i in shape.n_kv - 1..shape.n_q {
            for h in 0..shape.heads {
                for (x, y) in o.row(1, i, h).iter().zip(full.row(1, i, h)) {
                    let e = b[(shape.heads + h) * shape.n_q + i].out;
                    assert!(f64::from((x - y).abs()) <= 2.0 * e, "{path:?} row {i}");
                }
            }
        }
    }
}

#[test]
fn bottom_right_causal_with_more_queries_than_keys_empties_the_first_rows() {
    // Bottom-right: row i sees keys j ≤ i − (n_q − n_kv): rows i < n_q − n_kv see none.
    for (n_q, n_kv) in [(150, 40), (10, 1), (97, 96), (200, 3)] {
        let shape = Shape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            n_q,
            n_kv,
            d_k: 16,
            d_v: 8,
        };
        let inp = Inputs::random_bshd(shape, 30 + n_q as u64);
        let opts = Options::new().causal(Alignment::BottomRight);
        let label = format!("bottom-right n_q {n_q} n_kv {n_kv}");
        let c = assert_close_to_reference(&inp, Layout::padded_bhsd(2, 1), &opts, &label);
        assert_eq!(
            c.empty_rows,
            shape.batch * shape.heads * (n_q - n_kv),
            "{label}"
        );
        for path in Path::BOTH {
            let o = run(path, &inp, &opts);
            assert_empty_rows(&o, |i| i < n_q - n_kv, &format!("{path:?} {label}"));
        }
    }
}

#[test]
fn no_keys_at_all_gives_zero_rows_and_minus_infinity() {
    for (m, opts) in masks().into_iter().enumerate() {
        let shape = Shape {
            batch: 2,
            heads: 6,
            kv_heads: 3,
            n_q: 70,
            n_kv: 0,
            d_k: 16,
            d_v: 24,
        };
        // K and V over empty slices.
        let mut inp = Inputs {
            q: Buffer::random(&mut rng(40), shape.q_dims(), Layout::BSHD, 1.0),
            k: Buffer::from_logical(shape.k_dims(), Layout::BSHD, &[]),
            v: Buffer::from_logical(shape.v_dims(), Layout::BHSD, &[]),
        };
        inp.k.data.clear();
        inp.v.data.clear();
        for path in Path::BOTH {
            let o = run(path, &inp, &opts);
            assert_empty_rows(&o, |_| true, &format!("{path:?} n_kv = 0, mask {m}"));
        }
        let c = assert_close_to_reference(&inp, Layout::BHSD, &opts, "n_kv = 0");
        assert_eq!(c.empty_rows, shape.batch * shape.heads * shape.n_q);
        assert!(c.bounds.iter().all(|b| b.out == 0.0 && b.lse == 0.0));
    }
}

fn finite(xs: &[f32]) -> bool {
    xs.iter().all(|x| x.is_finite())
}

fn all_nan(xs: &[f32]) -> bool {
    xs.iter().all(|x| x.is_nan())
}

const GQA: Shape = Shape {
    batch: 2,
    heads: 4,
    kv_heads: 2,
    n_q: 50,
    n_kv: 120,
    d_k: 8,
    d_v: 8,
};

#[test]
fn nan_in_one_query_row_reaches_only_that_row() {
    for (m, opts) in masks().into_iter().enumerate() {
        for (b0, i0, h0, c0) in [(1, 17, 2, 3), (0, 0, 0, 0), (1, 49, 3, 7)] {
            let mut inp = Inputs::random_bshd(GQA, 50);
            inp.q.set([b0, i0, h0, c0], f32::NAN);
            let b = bounds(&inp, &opts);
            let label = format!("mask {m}, NaN at q[{b0}, {i0}, {h0}, {c0}]");
            let f = run(Path::Fused, &inp, &opts);
            let r = run(Path::Reference, &inp, &opts);
            for o in [&f, &r] {
                for bb in 0..GQA.batch {
                    for h in 0..GQA.heads {
                        for i in 0..GQA.n_q {
                            let (row, lse) = (o.row(bb, i, h), o.lse_at(bb, i, h));
                            if (bb, i, h) == (b0, i0, h0) {
                                assert!(all_nan(row), "{label}: the NaN row is {row:?}");
                                assert!(lse.is_nan(), "{label}: lse of the NaN row {lse}");
                            } else {
                                assert!(finite(row) && lse.is_finite(), "{label}: row {i}");
                            }
                        }
                    }
                }
            }
            // Every other row is still accurate.
            for bb in 0..GQA.batch {
                for h in 0..GQA.heads {
                    for i in (0..GQA.n_q).filter(|&i| (bb, i, h) != (b0, i0, h0)) {
                        let e = b[(bb * GQA.heads + h) * GQA.n_q + i];
                        for (x, y) in f.row(bb, i, h).iter().zip(r.row(bb, i, h)) {
                            assert!(f64::from((x - y).abs()) <= e.out, "{label}: row {i}");
                        }
                    }
                }
            }
        }
    }
}

/// Whether query row `(b, i, h)` reads key `j0` of kv head `hk0` in batch `b0` under `opts`.
fn sees(
    opts: &Options,
    b: usize,
    i: usize,
    h: usize,
    (b0, j0, hk0): (usize, usize, usize),
) -> bool {
    let group = GQA.heads / GQA.kv_heads;
    let (lo, hi) = support::harness::visible(opts, GQA.n_q, GQA.n_kv, i);
    b == b0 && h / group == hk0 && (lo..hi).contains(&j0)
}

#[test]
fn nan_in_one_key_row_reaches_every_row_that_sees_it() {
    // Unmasked, every row of the heads that read that key/value head is NaN; causal, exactly
    // the rows that see the key (masked scores are replaced by −∞, whatever they were).
    for (m, opts) in masks().into_iter().enumerate() {
        for (b0, j0, hk0, c0) in [(0, 0, 0, 0), (1, 60, 1, 5), (1, 119, 0, 7), (0, 96, 1, 2)] {
            let mut inp = Inputs::random_bshd(GQA, 60);
            inp.k.set([b0, j0, hk0, c0], f32::NAN);
            let label = format!("mask {m}, NaN at k[{b0}, {j0}, {hk0}, {c0}]");
            for path in Path::BOTH {
                let o = run(path, &inp, &opts);
                let mut nan_rows = 0;
                for b in 0..GQA.batch {
                    for h in 0..GQA.heads {
                        for i in 0..GQA.n_q {
                            let (row, lse) = (o.row(b, i, h), o.lse_at(b, i, h));
                            if sees(&opts, b, i, h, (b0, j0, hk0)) {
                                assert!(all_nan(row), "{path:?} {label}: row {b} {i} {h}");
                                assert!(lse.is_nan(), "{path:?} {label}: lse {lse}");
                                nan_rows += 1;
                            } else {
                                assert!(finite(row), "{path:?} {label}: row {b} {i} {h}");
                                assert!(lse.is_finite() || lse == f32::NEG_INFINITY);
                            }
                        }
                    }
                }
                if m == 0 {
                    assert_eq!(
                        nan_rows,
                        2 * GQA.n_q,
                        "{path:?} {label}: all rows of 2 heads"
                    );
                }
            }
        }
    }
}

#[test]
fn nan_in_one_value_row_reaches_every_row_that_sees_it() {
    // Unmasked: every row of the heads that read that key/value head is NaN (in the NaN's
    // component; the others and the LSE stay finite). Causal: at least the rows that see the key (the fused kernel may also poison rows of the same key block
    // that do not see it: 0 · NaN = NaN, as documented); the reference exactly those.
    for (m, opts) in masks().into_iter().enumerate() {
        for (b0, j0, hk0, c0) in [(0, 0, 0, 0), (1, 60, 1, 5), (1, 119, 0, 7), (0, 96, 1, 2)] {
            let mut inp = Inputs::random_bshd(GQA, 70);
            inp.v.set([b0, j0, hk0, c0], f32::NAN);
            let label = format!("mask {m}, NaN at v[{b0}, {j0}, {hk0}, {c0}]");
            for path in Path::BOTH {
                let o = run(path, &inp, &opts);
                for b in 0..GQA.batch {
                    for h in 0..GQA.heads {
                        for i in 0..GQA.n_q {
                            let row = o.row(b, i, h);
                            // V does not enter the LSE, and only its component c0 is NaN.
                            assert!(o.lse_at(b, i, h).is_finite(), "{path:?} {label}: lse");
                            for (c, x) in row.iter().enumerate().filter(|&(c, _)| c != c0) {
                                assert!(x.is_finite(), "{path:?} {label}: row {b} {i} {h} c {c}");
                            }
                            if sees(&opts, b, i, h, (b0, j0, hk0)) {
                                assert!(row[c0].is_nan(), "{path:?} {label}: row {b} {i} {h}");
                            } else if path == Path::Reference || m == 0 {
                                assert!(finite(row), "{path:?} {label}: row {b} {i} {h}");
                            }
                            if b != b0 || h / (GQA.heads / GQA.kv_heads) != hk0 {
                                assert!(finite(row), "{path:?} {label}: other head/batch");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn an_infinite_score_makes_its_rows_nan() {
    // +∞ in a key: every row that sees it has an infinite max score, and ∞ − ∞ = NaN.
    let mut inp = Inputs::random_bshd(Shape::simple(5, 9, 4), 80);
    inp.k.set([0, 3, 0, 1], f32::INFINITY);
    inp.q.set([0, 0, 0, 1], 0.5); // positive, so the score of key 3 is +∞ for row 0 …
    for i in 1..5 {
        inp.q.set([0, i, 0, 1], 0.25); // … and for every other row
    }
    for path in Path::BOTH {
        let o = run(path, &inp, &Options::new());
        for i in 0..5 {
            assert!(
                all_nan(o.row(0, i, 0)),
                "{path:?} row {i}: {:?}",
                o.row(0, i, 0)
            );
        }
    }
}

#[test]
fn zero_query_rows_is_ok_and_writes_nothing() {
    for (m, opts) in masks().into_iter().enumerate() {
        let shape = Shape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            n_q: 0,
            n_kv: 30,
            d_k: 8,
            d_v: 8,
        };
        let inp = Inputs::random_bshd(shape, 90);
        for path in Path::BOTH {
            // `run` checks that every padding element (here: the whole buffer) is untouched.
            let o = run(path, &inp, &opts);
            assert!(o.out.is_empty() && o.lse.is_empty(), "{path:?} mask {m}");
        }
        assert!(
            sdpa::reference::error_bounds(&inp.q.view(), &inp.k.view(), &inp.v.view(), &opts)
                .unwrap()
                .is_empty()
        );
    }
}

#[test]
fn zero_batch_is_ok_and_writes_nothing() {
    let shape = Shape {
        batch: 0,
        heads: 4,
        kv_heads: 1,
        n_q: 12,
        n_kv: 30,
        d_k: 8,
        d_v: 8,
    };
    let inp = Inputs::random_bshd(shape, 91);
    for opts in masks() {
        for path in Path::BOTH {
            let o = run(path, &inp, &opts);
            assert!(o.out.is_empty() && o.lse.is_empty());
        }
    }
}

#[test]
fn zero_value_head_size_is_ok_and_still_gives_the_lse() {
    for (m, opts) in masks().into_iter().enumerate() {
        let shape = Shape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            n_q: 40,
            n_kv: 100,
            d_k: 16,
            d_v: 0,
        };
        let inp = Inputs::random_bshd(shape, 92);
        let c = assert_close_to_reference(&inp, Layout::BSHD, &opts, &format!("d_v = 0, {m}"));
        assert!(c.fused.out.is_empty());
        assert!(c.fused.lse.iter().all(|x| x.is_finite()));
        // Without an LSE there is nothing to compute at all.
        let mut out: Vec<f32> = Vec::new();
        let mut view = TensorMut::new(&mut out, shape.out_dims(), [160, 4, 1, 1]).unwrap();
        sdpa::attention(
            &inp.q.view(),
            &inp.k.view(),
            &inp.v.view(),
            &mut view,
            &opts,
        )
        .unwrap();
    }
}

/// Output views with a zero dim, built with the crate's own contiguous constructors, must be
/// accepted: they have no elements, so no two indices can share one. (`n_q = 0` with several
/// batches, `d_v = 0` with several rows, `batch = 0` with several heads.)
#[test]
fn empty_output_views_from_the_contiguous_constructors_are_accepted() {
    let mut empty: Vec<f32> = Vec::new();
    for dims in [[2, 0, 4, 8], [1, 4, 2, 0], [0, 3, 4, 8], [3, 5, 0, 2]] {
        let bshd = TensorMut::bshd(&mut empty, dims).map(|_| ());
        assert_eq!(bshd, Ok(()), "TensorMut::bshd(&mut [], {dims:?})");
        let [b, s, h, d] = dims;
        let bhsd = TensorMut::bhsd(&mut empty, [b, h, s, d]).map(|_| ());
        assert_eq!(bhsd, Ok(()), "TensorMut::bhsd(&mut [], {:?})", [b, h, s, d]);
    }
    // And the whole call with them: n_q = 0, batch 2.
    let q: Vec<f32> = Vec::new();
    let kv = vec![0.5f32; 2 * 30 * 2 * 8];
    let q = Tensor::bshd(&q, [2, 0, 4, 8]).unwrap();
    let k = Tensor::bshd(&kv, [2, 30, 2, 8]).unwrap();
    let mut out = TensorMut::bshd(&mut empty, [2, 0, 4, 8]).expect("n_q = 0 output view");
    sdpa::attention(&q, &k, &k, &mut out, &Options::new()).unwrap();
}

#[test]
fn output_padding_is_never_written() {
    // Output rows interleaved with padding (head-size stride 3, padded rows and heads): only
    // the view's elements change. `assert_close_to_reference` checks the padding of every
    // output it makes; this case makes the padding dense.
    let shape = Shape {
        batch: 2,
        heads: 3,
        kv_heads: 1,
        n_q: 33,
        n_kv: 70,
        d_k: 5,
        d_v: 11,
    };
    let inp = Inputs::random_bshd(shape, 93);
    for opts in masks() {
        let layout = Layout::strided(Layout::BHSD_ORDER, 3, 2, 4);
        let c = assert_close_to_reference(&inp, layout, &opts, "dense output padding");
        assert_eq!(c.empty_rows, 0);
        let probe = Buffer::output(shape.out_dims(), layout);
        let padding = probe
            .data
            .iter()
            .filter(|x| x.to_bits() == OUTPUT_PAD_BITS)
            .count();
        assert!(
            padding > 2 * probe.data.len() / 3,
            "the layout should be mostly padding"
        );
    }
}

#[test]
fn a_pytorch_order_bias_goes_in_through_bhsd() {
    // A bias buffer in PyTorch's `[B, H, L, S]` order with H = L (so a view of the wrong order
    // is accepted too): `Tensor::bhsd(&buf, [B, H, L, S])` reads it as `[b, i, h, j]`, the same
    // bits as the bias copied into that order; `Tensor::bshd` over the same buffer does not.
    let (h, l, s, d) = (3, 3, 5, 4);
    let q: Vec<f32> = (0..l * h * d)
        .map(|x| ((x * 7 % 11) as f32 - 5.0) / 8.0)
        .collect();
    let k: Vec<f32> = (0..s * h * d)
        .map(|x| ((x * 5 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let v: Vec<f32> = (0..s * h * d)
        .map(|x| ((x * 3 % 7) as f32 - 3.0) / 4.0)
        .collect();
    let torch: Vec<f32> = (0..h * l * s)
        .map(|x| (x % 17) as f32 / 4.0 - 2.0)
        .collect();
    let mut ours = vec![0.0f32; l * h * s];
    for hh in 0..h {
        for i in 0..l {
            for j in 0..s {
                ours[(i * h + hh) * s + j] = torch[(hh * l + i) * s + j];
            }
        }
    }
    let call = |bias: Tensor<'_, f32>| {
        let mut out = vec![0.0f32; l * h * d];
        let mut o = TensorMut::bshd(&mut out, [1, l, h, d]).unwrap();
        let (qv, kv, vv) = (
            Tensor::bshd(&q, [1, l, h, d]).unwrap(),
            Tensor::bshd(&k, [1, s, h, d]).unwrap(),
            Tensor::bshd(&v, [1, s, h, d]).unwrap(),
        );
        let opts = Options::new().bias(bias);
        sdpa::attention(&qv, &kv, &vv, &mut o, &opts).unwrap();
        out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let by_name = call(Tensor::bhsd(&torch, [1, h, l, s]).unwrap());
    assert_eq!(by_name, call(Tensor::bshd(&ours, [1, l, h, s]).unwrap()));
    assert_ne!(by_name, call(Tensor::bshd(&torch, [1, l, h, s]).unwrap()));
}
