//! `reference::compare` and `reference::compare_varlen`: a result held against the f64
//! reference within its error bounds in one call.
//! * the ratio they report is the worst `|result − reference| / bound` computed here from
//!   `reference::attention_lse` / `attention_varlen` and `error_bounds` / `_varlen` (the same
//!   value, not just "within"), for f16 outputs with `ErrorBound::for_output`;
//! * a perturbation of one output element or one LSE is found where it was made, as large as
//!   it was made; a NaN where the reference is finite is off by an infinite ratio;
//! * packed rows outside every sequence are not compared;
//! * broken operands are typed errors (an output of other dims before any allocation).

use sdpa::half::f16;
use sdpa::reference::{self, Deviation};
use sdpa::{Alignment, Error, Operand, Options, PackedKv};
use sdpa::{Tensor, TensorMut, VarlenKv};

use crate::support::values::SplitMix;

/// Deterministic values in [−2, 2).
fn values(n: usize, seed: u64) -> Vec<f32> {
    SplitMix::unit_values(n, seed)
        .iter()
        .map(|x| 2.0 * x)
        .collect()
}

const B: usize = 2;
const N_Q: usize = 5;
const N_KV: usize = 9;
const H: usize = 4;
const H_KV: usize = 2;
const D: usize = 16;

/// The worst ratio over `(got, want, bound)` triples, as the docs define it.
fn worst(triples: impl Iterator<Item = (f32, f32, f64)>) -> f64 {
    triples
        .map(|(got, want, bound)| (f64::from(got) - f64::from(want)).abs() / bound)
        .fold(0.0, f64::max)
}

#[test]
fn dense_ratio_is_the_worst_error_over_bound_and_finds_a_perturbation() {
    let (q, k, v) = (
        values(B * N_Q * H * D, 1),
        values(B * N_KV * H_KV * D, 2),
        values(B * N_KV * H_KV * D, 3),
    );
    let qv = Tensor::bshd(&q, [B, N_Q, H, D]).unwrap();
    let kv_dims = [B, N_KV, H_KV, D];
    let (kt, vt) = (
        Tensor::bshd(&k, kv_dims).unwrap(),
        Tensor::bshd(&v, kv_dims).unwrap(),
    );
    let opts = Options::new().causal(Alignment::BottomRight);
    let dims = [B, N_Q, H, D];
    let mut out = vec![f16::ZERO; B * N_Q * H * D];
    let mut lse = vec![0.0f32; B * H * N_Q];
    sdpa::attention_lse(
        &qv,
        &kt,
        &vt,
        &mut TensorMut::bshd(&mut out, dims).unwrap(),
        &mut lse,
        &opts,
    )
    .unwrap();

    // The same ratio computed here.
    let (mut want, mut want_lse) = (vec![0.0f32; out.len()], vec![0.0f32; lse.len()]);
    let mut wv = TensorMut::bshd(&mut want, dims).unwrap();
    reference::attention_lse(&qv, &kt, &vt, &mut wv, &mut want_lse, &opts).unwrap();
    let bounds: Vec<_> = reference::error_bounds(&qv, &kt, &vt, &opts)
        .unwrap()
        .into_iter()
        .map(|b| b.for_output::<f16>())
        .collect();
    let row = |b: usize, i: usize, h: usize| (b * H + h) * N_Q + i;
    let at = |b: usize, i: usize, h: usize, c: usize| ((b * N_Q + i) * H + h) * D + c;
    let out_triples = (0..B * N_Q * H * D).map(|e| {
        let (b, i, h) = (e / (N_Q * H * D), e / (H * D) % N_Q, e / D % H);
        (out[e].to_f32(), want[e], bounds[row(b, i, h)].out)
    });
    let lse_triples = (0..lse.len()).map(|r| (lse[r], want_lse[r], bounds[r].lse));
    let expected = worst(out_triples).max(worst(lse_triples));

    let out_view = Tensor::bshd(&out, dims).unwrap();
    let got = reference::compare(&qv, &kt, &vt, &out_view, Some(&lse), &opts).unwrap();
    assert!(got.within_bound(), "{got:?}");
    assert_eq!(got.ratio, expected);
    assert!(
        got.ratio > 0.0,
        "f16 outputs are rounded: some error must show"
    );
    // Without the LSE: the output's worst alone.
    let no_lse = reference::compare(&qv, &kt, &vt, &out_view, None, &opts).unwrap();
    assert!(no_lse.ratio <= got.ratio && !no_lse.in_lse);

    // One output element off by 3 bounds.
    let (pb, pi, ph, pc) = (1, 2, 3, 5);
    let mut bad = out.clone();
    let off = 3.0 * bounds[row(pb, pi, ph)].out;
    bad[at(pb, pi, ph, pc)] = f16::from_f64(f64::from(want[at(pb, pi, ph, pc)]) + off);
    let dev = reference::compare(
        &qv,
        &kt,
        &vt,
        &Tensor::bshd(&bad, dims).unwrap(),
        Some(&lse),
        &opts,
    )
    .unwrap();
    assert!(!dev.within_bound());
    assert!((2.5..3.5).contains(&dev.ratio), "{dev:?}");
    assert_eq!((dev.at, dev.in_lse), ([pb, pi, ph], false));

    // One LSE off by 5 bounds; a NaN output where the reference is finite.
    let mut bad_lse = lse.clone();
    bad_lse[row(0, 1, 2)] =
        (f64::from(want_lse[row(0, 1, 2)]) + 5.0 * bounds[row(0, 1, 2)].lse) as f32;
    let dev = reference::compare(&qv, &kt, &vt, &out_view, Some(&bad_lse), &opts).unwrap();
    assert!((4.5..5.5).contains(&dev.ratio), "{dev:?}");
    assert_eq!((dev.at, dev.in_lse), ([0, 1, 2], true));
    let mut nan = out.clone();
    nan[at(0, 4, 1, 0)] = f16::NAN;
    let dev = reference::compare(
        &qv,
        &kt,
        &vt,
        &Tensor::bshd(&nan, dims).unwrap(),
        None,
        &opts,
    )
    .unwrap();
    assert_eq!(
        dev,
        Deviation {
            ratio: f64::INFINITY,
            at: [0, 4, 1],
            in_lse: false
        }
    );
}

#[test]
fn varlen_compares_the_calls_rows_and_skips_rows_outside_every_sequence() {
    // Sequences of 3, 0 and 2 rows from packed row 1 on; rows 0 and 6..8 outside every one.
    let (cu_q, cu_k) = ([1usize, 4, 4, 6], [0usize, 7, 7, 12]);
    let total_q = 8;
    let q = values(total_q * H * D, 4);
    let (k, v) = (values(12 * H_KV * D, 5), values(12 * H_KV * D, 6));
    let kv_dims = [1, 12, H_KV, D];
    let (kt, vt) = (
        Tensor::bshd(&k, kv_dims).unwrap(),
        Tensor::bshd(&v, kv_dims).unwrap(),
    );
    let qv = Tensor::bshd(&q, [1, total_q, H, D]).unwrap();
    let opts = Options::new().causal(Alignment::BottomRight).softcap(5.0);
    let dims = [1, total_q, H, D];
    let kv = VarlenKv::Packed(PackedKv::new(kt, vt, &cu_k));
    // Rows outside every sequence hold what the caller left there.
    let (mut out, mut lse) = (vec![1e30f32; total_q * H * D], vec![1e30f32; H * total_q]);
    let mut ov = TensorMut::bshd(&mut out, dims).unwrap();
    sdpa::attention_varlen(&qv, &cu_q, &kv, &mut ov, Some(&mut lse), &opts).unwrap();
    let out_view = Tensor::bshd(&out, dims).unwrap();
    let dev = reference::compare_varlen(&qv, &cu_q, &kv, &out_view, Some(&lse), &opts).unwrap();
    assert!(dev.within_bound() && dev.ratio > 0.0, "{dev:?}");
    assert!((1..6).contains(&dev.at[1]), "{dev:?}");

    // A row inside a sequence off: found at its packed row.
    let mut bad = out.clone();
    bad[(5 * H + 2) * D + 7] += 1.0;
    let bad_view = Tensor::bshd(&bad, dims).unwrap();
    let dev = reference::compare_varlen(&qv, &cu_q, &kv, &bad_view, None, &opts).unwrap();
    assert!(!dev.within_bound());
    assert_eq!((dev.at, dev.in_lse), ([0, 5, 2], false));

    // Broken operands: typed errors.
    let short = &lse[..lse.len() - 1];
    let err =
        reference::compare_varlen(&qv, &cu_q, &kv, &out_view, Some(short), &opts).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                operand: Operand::Lse,
                ..
            }
        ),
        "{err:?}"
    );
    // An output of other dims, and a broadcast view of enormous dims: refused by their dims,
    // nothing allocated for them.
    let (wide, one) = (vec![0.0f32; total_q * H * (D + 1)], [0.0f32]);
    for out in [
        Tensor::bshd(&wide, [1, total_q, H, D + 1]).unwrap(),
        Tensor::new(&one, [1, 1 << 40, H, D], [0; 4]).unwrap(),
    ] {
        let err = reference::compare_varlen(&qv, &cu_q, &kv, &out, None, &opts).unwrap_err();
        let output = Operand::Output;
        assert!(
            matches!(err, Error::ShapeMismatch { operand, .. } if operand == output),
            "{err:?}"
        );
    }
}

#[test]
fn no_rows_compare_as_nothing_off_whatever_the_other_dims() {
    // Batch 0 beside enormous broadcast dims (as the api fuzz target draws them): no row to
    // compare, and nothing allocated for the dims that hold none.
    let none: [f32; 0] = [];
    let q = Tensor::new(&none, [0, 1 << 62, H, D], [0; 4]).unwrap();
    let kv = Tensor::new(&none, [0, N_KV, H_KV, D], [0; 4]).unwrap();
    let out = Tensor::new(&none, [0, 1 << 62, H, D], [0; 4]).unwrap();
    let dev = reference::compare(&q, &kv, &kv, &out, Some(&[]), &Options::new()).unwrap();
    assert_eq!((dev.ratio, dev.within_bound()), (0.0, true));
}
