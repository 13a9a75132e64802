//! Regression tests for inputs the public API accepts but once answered with a panic, an abort,
//! a hang or a silently wrong result (issue "a codebase the next contributor can live in",
//! section "Hardening"). Each test names the input class it pins down.

use sdpa::{Alignment, Error, Operand, Options, Partial, Tensor, TensorMut};

use crate::support;
use support::contract::{RowAt, RowFacts};
use support::harness::{assert_tensors_against_reference, assert_views_close_to_reference};
use support::harness::{Layout, Views};

/// An output view with d_v = 0 and strides near `usize::MAX`: valid (it has no element), and
/// the kernel must not form row offsets for it (`b·s0 + i·s1 + h·s2` overflowed in the row
/// writer, a panic with debug assertions). The LSE is still written.
#[test]
fn empty_output_view_with_huge_strides_writes_only_lse() {
    let q = [0.5f32, -1.0, 0.25, 2.0];
    let k = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
    let q = Tensor::bshd(&q, [1, 2, 1, 2]).unwrap();
    let k = Tensor::bshd(&k, [1, 3, 1, 2]).unwrap();
    let v_data: [f32; 0] = [];
    let v = Tensor::new(&v_data, [1, 3, 1, 0], [usize::MAX, usize::MAX / 3, 7, 1]).unwrap();
    let mut out_data: [f32; 0] = [];
    let huge = [usize::MAX - 1, usize::MAX / 2, usize::MAX - 5, usize::MAX];
    let mut out = TensorMut::new(&mut out_data, [1, 2, 1, 0], huge).unwrap();
    let mut lse = [0.0f32; 2];
    sdpa::attention_lse(&q, &k, &v, &mut out, &mut lse, &Options::new()).unwrap();
    let mut want = [0.0f32; 2];
    sdpa::reference::attention_lse(&q, &k, &v, &mut out, &mut want, &Options::new()).unwrap();
    for (g, w) in lse.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{lse:?} vs {want:?}");
    }
    // The same through the split-KV path (few items, many keys: broadcast K and V).
    let one = [0.3f32, -0.7];
    let k = Tensor::new(&one, [1, 5000, 1, 2], [0, 0, 0, 1]).unwrap();
    let v = Tensor::new(&v_data, [1, 5000, 1, 0], [usize::MAX, 1, 1, 1]).unwrap();
    sdpa::attention_lse(&q, &k, &v, &mut out, &mut lse, &Options::new()).unwrap();
    // All 5000 keys are identical: lse = score + ln 5000.
    let q0: f32 = (0.5 * 0.3 + 1.0 * 0.7) / 2f32.sqrt();
    assert!((lse[0] - (q0 + 5000f32.ln())).abs() < 1e-4, "{lse:?}");
}

/// Keys of a bool-masked padding region whose V rows hold NaN (an uninitialised KV-cache slot):
/// rows that do not see them stay finite and correct; a row that sees one is NaN.
#[test]
fn nan_values_reach_only_the_rows_that_see_them() {
    let (n_q, n_kv, d) = (40, 300, 16);
    let q: Vec<f32> = (0..n_q * d).map(|x| (x as f32 * 0.37).sin()).collect();
    let k: Vec<f32> = (0..n_kv * d).map(|x| (x as f32 * 0.11).cos()).collect();
    let mut v: Vec<f32> = (0..n_kv * d).map(|x| (x as f32 * 0.23).sin()).collect();
    // Keys 250.. are padding, hidden from every row by the mask; key 7 is hidden from all rows
    // but row 3 (who sees NaN). Key 100 is seen by everyone but holds a finite value.
    for j in (250..n_kv).chain([7]) {
        v[j * d..(j + 1) * d].fill(f32::NAN);
    }
    v[250 * d + 3] = f32::INFINITY;
    let mut mask = vec![true; n_q * n_kv];
    for i in 0..n_q {
        for j in 250..n_kv {
            mask[i * n_kv + j] = false;
        }
        mask[i * n_kv + 7] = i == 3;
    }
    let qv = Tensor::bshd(&q, [1, n_q, 1, d]).unwrap();
    let kv = Tensor::bshd(&k, [1, n_kv, 1, d]).unwrap();
    let vv = Tensor::bshd(&v, [1, n_kv, 1, d]).unwrap();
    let mv = Tensor::bshd(&mask, [1, n_q, 1, n_kv]).unwrap();
    for causal in [None, Some(Alignment::BottomRight)] {
        let mut opts = Options::new().mask(mv);
        if let Some(a) = causal {
            opts = opts.causal(a);
        }
        // Row 3 is NaN where the reference is (everywhere: all of key 7's value is NaN); every
        // other row within its bound, and every LSE (V does not reach it).
        let facts = |at: RowAt| RowFacts {
            out_in_bound: at.i != 3,
            ..RowFacts::FINITE
        };
        let label = format!("causal {causal:?}");
        let c = assert_tensors_against_reference::<f32, f32, f32>(
            &qv,
            &kv,
            &vv,
            Layout::BSHD,
            &opts,
            facts,
            &label,
        );
        for (i, row) in c.fused.out.chunks(d).enumerate() {
            if i == 3 {
                assert!(row.iter().all(|x| x.is_nan()), "row 3 sees key 7: {row:?}");
            } else {
                assert!(
                    row.iter().all(|x| x.is_finite()),
                    "{label} row {i}: {row:?}"
                );
            }
        }
    }
}

/// ALiBi at positions past 2²⁴, where f32 positions are no longer exact: the distance must be
/// taken in integers (it was |f32(i + off) − f32(j)|, off by up to 2 at 2²⁵).
#[test]
fn alibi_distances_are_exact_at_huge_positions() {
    let n_kv = (1usize << 25) + 3;
    let d = 4;
    let q = [0.25f32, -0.5, 0.75, 1.0];
    let k_row = [0.5f32, 0.5, -0.25, 0.125];
    // K: one row repeated (stride 0), so every visible key has the same dot product and only
    // ALiBi tells them apart. V: a distinct scalar per key.
    let v: Vec<f32> = (0..n_kv).map(|j| (j % 97) as f32 * 0.01).collect();
    let qv = Tensor::bshd(&q, [1, 1, 1, d]).unwrap();
    let kv = Tensor::new(&k_row, [1, n_kv, 1, d], [0, 0, 0, 1]).unwrap();
    let vv = Tensor::new(&v, [1, n_kv, 1, 1], [0, 1, 0, 1]).unwrap();
    let slope = [0.75f32];
    let left = 5;
    let opts = Options::new()
        .sliding_window(left, 0, Alignment::BottomRight)
        .alibi(&slope, Alignment::BottomRight);
    let mut out = [0.0f32; 1];
    let mut lse = [0.0f32; 1];
    let mut ov = TensorMut::bshd(&mut out, [1, 1, 1, 1]).unwrap();
    sdpa::attention_lse(&qv, &kv, &vv, &mut ov, &mut lse, &opts).unwrap();
    // Row 0 sits at key n_kv − 1 and sees keys n_kv − 1 − left ..= n_kv − 1.
    let dot: f64 = q
        .iter()
        .zip(&k_row)
        .map(|(a, b)| f64::from(a * b))
        .sum::<f64>()
        / 2.0;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for dist in 0..=left {
        let j = n_kv - 1 - dist;
        let w = (dot - 0.75 * dist as f64).exp();
        num += w * f64::from(v[j]);
        den += w;
    }
    assert!(
        (f64::from(out[0]) - num / den).abs() < 1e-6,
        "{} vs {}",
        out[0],
        num / den
    );
    assert!(
        (f64::from(lse[0]) - den.ln()).abs() < 1e-5,
        "{} vs {}",
        lse[0],
        den.ln()
    );
}

/// Finite option values whose log2-unit form overflows f32 are typed errors (they gave NaN);
/// values just inside the range work.
#[test]
fn option_values_that_overflow_in_log2_units_are_errors() {
    let q = [1.0f32, 0.5];
    let qv = Tensor::bshd(&q, [1, 1, 1, 2]).unwrap();
    let mut out = [0.0f32; 2];
    let mut lse = [0.0f32; 1];
    let run = |opts: &Options<'_>, out: &mut [f32], lse: &mut [f32]| {
        let mut ov = TensorMut::bshd(out, [1, 1, 1, 2]).unwrap();
        sdpa::attention_lse(&qv, &qv, &qv, &mut ov, lse, opts)
    };
    for cap in [3e38f32, 2.4e38, 5.9e-39, 1e-45, f32::MAX] {
        let err = run(&Options::new().softcap(cap), &mut out, &mut lse).unwrap_err();
        assert_eq!(err, Error::InvalidSoftcap(cap));
    }
    for big in [3e38f32, -3e38, 2.4e38] {
        let sinks = [big];
        let err = run(&Options::new().sinks(&sinks), &mut out, &mut lse).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidValue {
                    operand: Operand::Sinks,
                    index: 0,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = run(
            &Options::new().alibi(&sinks, Alignment::TopLeft),
            &mut out,
            &mut lse,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidValue {
                    operand: Operand::AlibiSlopes,
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // Inside the range: finite results, and a row that sees no key reports lse = σ exactly.
    for cap in [2e38f32, 1.2e-38] {
        run(&Options::new().softcap(cap), &mut out, &mut lse).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "cap {cap}: {out:?}");
    }
    let lens = [0usize];
    for sigma in [-2.3e38f32, 2.3e38, -1e30] {
        let sinks = [sigma];
        run(
            &Options::new().sinks(&sinks).kv_lens(&lens),
            &mut out,
            &mut lse,
        )
        .unwrap();
        assert_eq!((out, lse[0]), ([0.0, 0.0], sigma));
        run(&Options::new().sinks(&sinks), &mut out, &mut lse).unwrap();
        assert!(
            out.iter().all(|x| x.is_finite()) && lse[0].is_finite(),
            "{out:?} {lse:?}"
        );
    }
    // A huge sink dominates: output ≈ 0, lse ≈ σ.
    let sinks = [2.3e38f32];
    run(&Options::new().sinks(&sinks), &mut out, &mut lse).unwrap();
    assert_eq!(out, [0.0, 0.0]);
    assert_eq!(lse[0], 2.3e38);
}

/// Broadcast views declaring lengths near 2⁶⁴: block ends (`j0 + kv_block`) and split-KV
/// ranges (`(split + 1)·chunk`) must not wrap (a release panic, and a wrong `Ok`).
#[test]
fn key_lengths_near_usize_max_do_not_wrap() {
    let n_kv = usize::MAX - 7;
    let q = [0.5f32, 1.0];
    let k_row = [1.0f32, -0.25];
    let v_row = [2.0f32, -3.0, 0.5];
    let qv = Tensor::bshd(&q, [1, 1, 1, 2]).unwrap();
    let kv = Tensor::new(&k_row, [1, n_kv, 1, 2], [0, 0, 0, 1]).unwrap();
    let vv = Tensor::new(&v_row, [1, n_kv, 1, 3], [0, 0, 0, 1]).unwrap();
    let opts = Options::new().sliding_window(9, 0, Alignment::BottomRight);
    let mut out = [0.0f32; 3];
    let mut lse = [0.0f32; 1];
    let mut ov = TensorMut::bshd(&mut out, [1, 1, 1, 3]).unwrap();
    sdpa::attention_lse(&qv, &kv, &vv, &mut ov, &mut lse, &opts).unwrap();
    // Ten identical keys: out = v, lse = score + ln 10.
    assert_eq!(out, v_row);
    let score = (0.5f32 - 0.25) / 2f32.sqrt();
    assert!((lse[0] - (score + 10f32.ln())).abs() < 1e-5, "{lse:?}");
    // The reference and its bound look at the visible keys only: instant, not O(n_kv).
    let bounds = sdpa::reference::error_bounds(&qv, &kv, &vv, &opts).unwrap();
    assert!(bounds[0].out < 1e-5);
}

/// Head sizes so large that the block sizes overflow are `ScratchTooLarge`, not a panic.
#[test]
fn enormous_head_sizes_are_scratch_errors() {
    let one = [1.0f32];
    let d_k = usize::MAX / 2;
    let qv = Tensor::new(&one, [1, 1, 1, d_k], [0; 4]).unwrap();
    let vv = Tensor::new(&one, [1, 1, 1, 1], [0; 4]).unwrap();
    let mut out = [0.0f32; 1];
    let mut ov = TensorMut::bshd(&mut out, [1, 1, 1, 1]).unwrap();
    let err = sdpa::attention(&qv, &qv, &vv, &mut ov, &Options::new()).unwrap_err();
    assert!(matches!(err, Error::ScratchTooLarge { .. }), "{err:?}");
    assert_eq!(out, [0.0]);
    assert!(matches!(
        sdpa::scratch_bytes_per_thread(&qv, &qv, &vv, &Options::new()),
        Err(Error::ScratchTooLarge { .. })
    ));
}

/// `merge_partials` on empty views with enormous head sizes allocates nothing from them.
#[test]
fn merging_empty_views_allocates_nothing() {
    let none: [f32; 0] = [];
    let dims = [0, 5, 3, usize::MAX / 2];
    let part = Tensor::new(&none, dims, [1, 1, 1, 1]).unwrap();
    let mut out_data: [f32; 0] = [];
    let mut out = TensorMut::new(&mut out_data, dims, [1, 1, 1, 1]).unwrap();
    let parts = [Partial {
        out: part,
        lse: &none,
    }; 2];
    let mut lse: [f32; 0] = [];
    sdpa::merge_partials(&parts, &mut out, &mut lse).unwrap();
}

/// The reference answers `Ok` at once when there is nothing to compute, whatever the lengths
/// (it allocated the `n_q × n_kv` score matrix first: `ScoreMatrixTooLarge` for B = 0, hours
/// for d_v = 0).
#[test]
fn reference_with_nothing_to_compute_is_ok() {
    let one = [1.0f32];
    let huge = 1usize << 40;
    let none: [f32; 0] = [];
    let q = Tensor::new(&one, [0, huge, 1, 1], [0; 4]).unwrap();
    let k = Tensor::new(&one, [0, huge, 1, 1], [0; 4]).unwrap();
    let mut out_data: [f32; 0] = [];
    let mut out = TensorMut::new(&mut out_data, [0, huge, 1, 1], [0, 1, 1, 1]).unwrap();
    sdpa::reference::attention(&q, &k, &k, &mut out, &Options::new()).unwrap();
    // d_v = 0, no LSE: no output element.
    let q = Tensor::new(&one, [1, huge, 1, 1], [0; 4]).unwrap();
    let k = Tensor::new(&one, [1, huge, 1, 1], [0; 4]).unwrap();
    let v = Tensor::new(&none, [1, huge, 1, 0], [0; 4]).unwrap();
    let mut out = TensorMut::new(&mut out_data, [1, huge, 1, 0], [0, 0, 0, 1]).unwrap();
    sdpa::reference::attention(&q, &k, &v, &mut out, &Options::new()).unwrap();
}

/// Subnormal values: roundings into the subnormal range err by up to 2⁻¹⁵⁰ absolute, which the
/// relative part of `error_bounds` does not cover (the `kv_cache` fuzz target found a result
/// one subnormal ulp past it); the bound's absolute underflow term does. The fuzz reproducer,
/// then random rows of 1–6 keys with subnormal values.
#[test]
fn subnormal_values_stay_within_the_bound() {
    let check = |q: &[f32], k: &[f32], v: &[f32], what: &str| {
        let n = k.len();
        let x = Views {
            q: Tensor::bshd(q, [1, 1, 1, 1]).unwrap(),
            k: Tensor::bshd(k, [1, n, 1, 1]).unwrap(),
            v: Tensor::bshd(v, [1, n, 1, 1]).unwrap(),
        };
        assert_views_close_to_reference(&x, Layout::BSHD, &Options::new(), what);
    };
    let v = [f32::from_bits(332256), f32::from_bits(29293)];
    check(&[1.0], &[0.729_219_7, 2.114_533_2], &v, "fuzz reproducer");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for case in 0..20_000 {
        let n = 1 + (next() % 6) as usize;
        let k: Vec<f32> = (0..n)
            .map(|_| (next() % 4000) as f32 / 1000.0 - 2.0)
            .collect();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let bits = (next() % 0x80_0000) as u32 | ((next() % 2) as u32) << 31;
                f32::from_bits(bits)
            })
            .collect();
        check(&[1.0], &k, &v, &format!("case {case}"));
    }
}
