//! `Rope::apply`: both styles, partial rotary dimensions, bases and tables, every element type
//! and layout, against `reference::rope` within the stated bound and against the published
//! formulas written out independently (Hugging Face's `rotate_half` for the halves, Meta's
//! complex product for the interleaved pairs); exact cases; errors, with nothing written.

use sdpa::half::{bf16, f16};
use sdpa::{reference, Element, Error, Operand, Rope, RopeStyle, Tensor, TensorMut};

use crate::support::values::SplitMix;

/// `[b, s, h, d]` in BSHD or BHSD order.
fn view_mut<T>(data: &mut [T], bhsd: bool, [b, s, h, d]: [usize; 4]) -> TensorMut<'_, T> {
    if bhsd {
        TensorMut::bhsd(data, [b, h, s, d]).unwrap()
    } else {
        TensorMut::bshd(data, [b, s, h, d]).unwrap()
    }
}

/// The value at `[b, s, h, c]` of a tensor stored in BSHD or BHSD order.
fn at<T: Copy>(
    data: &[T],
    bhsd: bool,
    [_, s_n, h_n, d]: [usize; 4],
    [b, s, h, c]: [usize; 4],
) -> T {
    if bhsd {
        data[((b * h_n + h) * s_n + s) * d + c]
    } else {
        data[((b * s_n + s) * h_n + h) * d + c]
    }
}

/// The published formulas in f64, written out apart from the crate's: NeoX's `x·cos +
/// rotate_half(x)·sin` over the first `r` channels (cos/sin repeated over both halves), GPT-J's
/// `(a + ib)·e^{iφ}` per adjacent pair.
fn published(x: &[f64], style: RopeStyle, r: usize, angle: impl Fn(usize) -> f64) -> Vec<f64> {
    let mut out = x.to_vec();
    let half = r / 2;
    match style {
        RopeStyle::Halves => {
            for c in 0..r {
                let phi = angle(c % half);
                let rotated_half = if c < half { -x[c + half] } else { x[c - half] };
                out[c] = x[c] * phi.cos() + rotated_half * phi.sin();
            }
        }
        RopeStyle::Interleaved => {
            for i in 0..half {
                let phi = angle(i);
                let (a, b) = (x[2 * i], x[2 * i + 1]);
                out[2 * i] = a * phi.cos() - b * phi.sin();
                out[2 * i + 1] = a * phi.sin() + b * phi.cos();
            }
        }
    }
    out
}

/// Rotates values of type `T` with `rope` and checks every value against the reference (within
/// `(u_f32 + u_T + u_f32·u_T)·|exact| + 2⁻⁴⁰·(|a| + |b|)`, with the pair's inputs) and against
/// `published` (the same bound plus the f64 angle's own error).
fn check<T: Element>(
    rope: &Rope<'_>,
    shape: [usize; 4],
    bhsd: bool,
    positions: &[u32],
    angle: impl Fn(u32, usize) -> f64,
) {
    let [b_n, s_n, h_n, d] = shape;
    let len = b_n * s_n * h_n * d;
    let input: Vec<T> = SplitMix::unit_values(len, 5)
        .into_iter()
        .map(|x| T::from_f32(4.0 * x))
        .collect();
    let mut data = input.clone();
    rope.apply(&mut view_mut(&mut data, bhsd, shape), positions)
        .unwrap();
    let x = if bhsd {
        Tensor::bhsd(&input, [b_n, h_n, s_n, d]).unwrap()
    } else {
        Tensor::bshd(&input, shape).unwrap()
    };
    let want = reference::rope(rope, &x, positions).unwrap();
    let u = 2f64.powi(-24) + T::UNIT_ROUNDOFF + 2f64.powi(-24) * T::UNIT_ROUNDOFF;
    let r = rope.rotary_dim();
    for b in 0..b_n {
        for s in 0..s_n {
            let p = positions[b * s_n + s];
            for h in 0..h_n {
                let row: Vec<f64> = (0..d)
                    .map(|c| f64::from(at(&input, bhsd, shape, [b, s, h, c]).to_f32()))
                    .collect();
                let formula = published(&row, rope.style(), r, |i| angle(p, i));
                for c in 0..d {
                    let got = f64::from(at(&data, bhsd, shape, [b, s, h, c]).to_f32());
                    let exact = want[((b * s_n + s) * h_n + h) * d + c];
                    let partner = match (rope.style(), c < r) {
                        (_, false) => c,
                        (RopeStyle::Halves, true) => (c + r / 2) % r,
                        (RopeStyle::Interleaved, true) => c ^ 1,
                    };
                    let inputs = row[c].abs() + row[partner].abs();
                    let bound = u * exact.abs() + 2f64.powi(-40) * inputs;
                    let label =
                        format!("{} {shape:?} bhsd {bhsd} [{b},{s},{h},{c}] p {p}", T::NAME);
                    assert!((got - exact).abs() <= bound, "{label}: {got} vs {exact}");
                    if c >= r {
                        assert_eq!(
                            got.to_bits(),
                            row[c].to_bits(),
                            "{label}: past the rotary dim"
                        );
                    }
                    // The formula's angle is f64 too; its own error at position p is ~p·2⁻⁵².
                    let slack = bound + f64::from(p) * 2f64.powi(-48) * inputs;
                    assert!(
                        (got - formula[c]).abs() <= slack,
                        "{label}: {got} vs formula {}",
                        formula[c]
                    );
                }
            }
        }
    }
}

fn theta_angle(theta: f64, r: usize) -> impl Fn(u32, usize) -> f64 {
    move |p, i| f64::from(p) * theta.powf(-((2 * i) as f64) / r as f64)
}

#[test]
fn both_styles_every_type_and_layout_against_the_reference() {
    let positions: Vec<u32> = vec![0, 1, 2, 7, 100, 4095, 131_071, 3];
    for style in [RopeStyle::Halves, RopeStyle::Interleaved] {
        for (shape, r) in [([2, 4, 3, 64], 64), ([1, 8, 2, 80], 32), ([4, 2, 1, 6], 2)] {
            let rope = Rope::new(style, r, 10_000.0);
            let n = shape[0] * shape[1];
            let pos = &positions[..n];
            for bhsd in [false, true] {
                check::<f32>(&rope, shape, bhsd, pos, theta_angle(10_000.0, r));
                check::<f16>(&rope, shape, bhsd, pos, theta_angle(10_000.0, r));
                check::<bf16>(&rope, shape, bhsd, pos, theta_angle(10_000.0, r));
            }
        }
    }
}

#[test]
fn tables_give_the_callers_angles() {
    // A scaled variant's tables (here: every angle divided by 8, as a linear scaling would),
    // 40 positions of 16 pairs.
    let (r, rows) = (32, 40);
    let scaled = |p: u32, i: usize| theta_angle(500_000.0, r)(p, i) / 8.0;
    let mut cos = Vec::new();
    let mut sin = Vec::new();
    for p in 0..rows {
        for i in 0..r / 2 {
            cos.push(scaled(p, i).cos() as f32);
            sin.push(scaled(p, i).sin() as f32);
        }
    }
    let table_angle = |p: u32, i: usize| {
        let at = p as usize * r / 2 + i;
        f64::from(sin[at]).atan2(f64::from(cos[at]))
    };
    for style in [RopeStyle::Halves, RopeStyle::Interleaved] {
        let rope = Rope::with_tables(style, r, &cos, &sin);
        check::<f32>(&rope, [1, 5, 2, 48], false, &[0, 39, 17, 1, 2], table_angle);
        check::<bf16>(&rope, [1, 5, 2, 48], true, &[0, 39, 17, 1, 2], table_angle);
    }
}

#[test]
fn exact_cases() {
    // Position 0 rotates by nothing: the same bits. A table of cos 0, sin 1 turns each pair
    // (a, b) into (−b, a) exactly.
    let x: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
    let mut y = x.clone();
    Rope::new(RopeStyle::Halves, 8, 10_000.0)
        .apply(&mut TensorMut::bshd(&mut y, [1, 1, 2, 8]).unwrap(), &[0])
        .unwrap();
    assert_eq!(x, y);
    let (cos, sin) = (vec![0.0f32; 4], vec![1.0f32; 4]);
    for (style, want) in [
        (
            RopeStyle::Halves,
            [3.5, 2.5, 1.5, 0.5, -7.5, -6.5, -5.5, -4.5],
        ),
        (
            RopeStyle::Interleaved,
            [6.5, -7.5, 4.5, -5.5, 2.5, -3.5, 0.5, -1.5],
        ),
    ] {
        let mut y = x[..8].to_vec();
        Rope::with_tables(style, 8, &cos, &sin)
            .apply(&mut TensorMut::bshd(&mut y, [1, 1, 1, 8]).unwrap(), &[0])
            .unwrap();
        assert_eq!(y, want, "{style:?}");
    }
}

#[test]
fn errors_write_nothing() {
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let cases: [(Rope<'_>, &[u32], Error); 6] = [
        (
            Rope::new(RopeStyle::Halves, 7, 10_000.0),
            &[1, 2],
            Error::InvalidValue {
                operand: Operand::Rope,
                index: 7,
                reason: "",
            },
        ),
        (
            Rope::new(RopeStyle::Halves, 10, 10_000.0),
            &[1, 2],
            Error::InvalidValue {
                operand: Operand::Rope,
                index: 10,
                reason: "",
            },
        ),
        (
            Rope::new(RopeStyle::Interleaved, 0, 10_000.0),
            &[1, 2],
            Error::InvalidValue {
                operand: Operand::Rope,
                index: 0,
                reason: "",
            },
        ),
        (
            Rope::new(RopeStyle::Interleaved, 8, f32::NAN),
            &[1, 2],
            Error::InvalidValue {
                operand: Operand::Rope,
                index: 0,
                reason: "",
            },
        ),
        (
            Rope::new(RopeStyle::Halves, 8, 10_000.0),
            &[1],
            Error::LengthMismatch {
                operand: Operand::Positions,
                expected: 2,
                got: 1,
            },
        ),
        (
            Rope::with_tables(RopeStyle::Halves, 8, &[1.0; 8], &[0.0; 8]),
            &[1, 2],
            Error::InvalidValue {
                operand: Operand::Positions,
                index: 1,
                reason: "",
            },
        ),
    ];
    for (rope, positions, want) in cases {
        let mut y = x.clone();
        let err = rope
            .apply(
                &mut TensorMut::bshd(&mut y, [1, 2, 2, 8]).unwrap(),
                positions,
            )
            .unwrap_err();
        let same = match (&err, &want) {
            (
                Error::InvalidValue {
                    operand: a,
                    index: i,
                    ..
                },
                Error::InvalidValue {
                    operand: b,
                    index: j,
                    ..
                },
            ) => a == b && i == j,
            _ => err == want,
        };
        assert!(same, "{rope:?}: {err:?}, expected {want:?}");
        assert_eq!(y, x, "nothing written");
        let t = Tensor::bshd(&x, [1, 2, 2, 8]).unwrap();
        assert!(reference::rope(&rope, &t, positions).is_err());
    }
    // Tables of unequal lengths.
    let rope = Rope::with_tables(RopeStyle::Halves, 8, &[1.0; 8], &[0.0; 4]);
    let mut y = x.clone();
    let err = rope
        .apply(&mut TensorMut::bshd(&mut y, [1, 2, 2, 8]).unwrap(), &[0, 1])
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                operand: Operand::RopeTables,
                ..
            }
        ),
        "{err:?}"
    );
}
