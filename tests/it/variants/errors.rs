//! Invalid options are typed errors, from every entry point, before anything is written.

use super::{Buffer, Layout, OUT_INIT_BITS};
use sdpa::{
    merge_partials, reference, Alignment, Dim, Error, Operand, Options, Partial, Tensor, TensorMut,
};

/// B = 2, H = 4, H_kv = 2, n_q = 3, n_kv = 5, d = 4.
const B: usize = 2;
const H: usize = 4;
const N_Q: usize = 3;
const N_KV: usize = 5;

struct Operands {
    q: Vec<f32>,
    kv: Vec<f32>,
}

impl Operands {
    fn new() -> Self {
        Operands {
            q: (0..B * N_Q * H * 4).map(|x| (x % 7) as f32 * 0.1).collect(),
            kv: (0..B * N_KV * 2 * 4)
                .map(|x| (x % 5) as f32 * 0.2)
                .collect(),
        }
    }

    /// The error of `opts` from the fused kernel (with and without LSE), the reference (with
    /// and without LSE) and `error_bounds`; all five must agree, and no output may be written.
    #[track_caller]
    fn error(&self, opts: &Options) -> Error {
        let q = Tensor::bshd(&self.q, [B, N_Q, H, 4]).unwrap();
        let kv = Tensor::bshd(&self.kv, [B, N_KV, 2, 4]).unwrap();
        let mut errs = Vec::new();
        for call in 0..4 {
            let mut out = vec![f32::from_bits(OUT_INIT_BITS); B * N_Q * H * 4];
            let mut lse = vec![f32::from_bits(OUT_INIT_BITS); B * H * N_Q];
            let mut o = TensorMut::bshd(&mut out, [B, N_Q, H, 4]).unwrap();
            let r = match call {
                0 => sdpa::attention(&q, &kv, &kv, &mut o, opts),
                1 => sdpa::attention_lse(&q, &kv, &kv, &mut o, &mut lse, opts),
                2 => reference::attention(&q, &kv, &kv, &mut o, opts),
                _ => reference::attention_lse(&q, &kv, &kv, &mut o, &mut lse, opts),
            };
            errs.push(r.expect_err("an invalid option must be an error"));
            assert!(
                out.iter().chain(&lse).all(|x| x.to_bits() == OUT_INIT_BITS),
                "call {call} wrote output before failing"
            );
        }
        errs.push(reference::error_bounds(&q, &kv, &kv, opts).expect_err("bounds must fail too"));
        // Compared through Debug: `InvalidSoftcap(NaN)` is not `==` to itself.
        for e in &errs[1..] {
            assert_eq!(format!("{e:?}"), format!("{:?}", errs[0]));
        }
        // The message names the problem (Display never panics either).
        assert!(!errs[0].to_string().is_empty());
        errs.swap_remove(0)
    }

    /// `opts` is valid (the control case of each invalid one).
    #[track_caller]
    fn ok(&self, opts: &Options) {
        let q = Tensor::bshd(&self.q, [B, N_Q, H, 4]).unwrap();
        let kv = Tensor::bshd(&self.kv, [B, N_KV, 2, 4]).unwrap();
        let mut out = vec![0.0; B * N_Q * H * 4];
        let mut lse = vec![0.0; B * H * N_Q];
        let mut o = TensorMut::bshd(&mut out, [B, N_Q, H, 4]).unwrap();
        sdpa::attention_lse(&q, &kv, &kv, &mut o, &mut lse, opts).expect("valid options");
    }
}

#[test]
fn invalid_softcap() {
    let ops = Operands::new();
    // Also refused: subnormal caps (2/cap overflows) and caps whose cap·log₂e overflows.
    for cap in [
        f32::NAN,
        -1.0,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        f32::MAX,
        2.4e38,
    ] {
        let e = ops.error(&Options::new().softcap(cap));
        match e {
            Error::InvalidSoftcap(c) => assert!(c.to_bits() == cap.to_bits(), "{c} vs {cap}"),
            e => panic!("softcap {cap}: {e:?}"),
        }
    }
    ops.ok(&Options::new().softcap(f32::MIN_POSITIVE));
    ops.ok(&Options::new().softcap(2.3e38));
}

#[test]
fn invalid_alibi_slopes() {
    let ops = Operands::new();
    let short = [0.5f32; H - 1];
    assert_eq!(
        ops.error(&Options::new().alibi(&short, Alignment::TopLeft)),
        Error::LengthMismatch {
            operand: Operand::AlibiSlopes,
            expected: H,
            got: H - 1
        }
    );
    let long = [0.5f32; H + 1];
    assert_eq!(
        ops.error(&Options::new().alibi(&long, Alignment::TopLeft)),
        Error::LengthMismatch {
            operand: Operand::AlibiSlopes,
            expected: H,
            got: H + 1
        }
    );
    for (index, bad) in [(2, f32::NAN), (0, f32::INFINITY), (3, f32::NEG_INFINITY)] {
        let mut slopes = [0.5f32; H];
        slopes[index] = bad;
        match ops.error(&Options::new().alibi(&slopes, Alignment::BottomRight)) {
            Error::InvalidValue {
                operand: Operand::AlibiSlopes,
                index: i,
                ..
            } => assert_eq!(i, index),
            e => panic!("slope {bad}: {e:?}"),
        }
    }
    // Negative and zero slopes are finite, hence valid.
    ops.ok(&Options::new().alibi(&[0.0, -1.0, 0.5, 2.0], Alignment::TopLeft));
}

#[test]
fn invalid_sinks() {
    let ops = Operands::new();
    assert_eq!(
        ops.error(&Options::new().sinks(&[0.0; 3])),
        Error::LengthMismatch {
            operand: Operand::Sinks,
            expected: H,
            got: 3
        }
    );
    assert_eq!(
        ops.error(&Options::new().sinks(&[])),
        Error::LengthMismatch {
            operand: Operand::Sinks,
            expected: H,
            got: 0
        }
    );
    for (index, bad) in [(1, f32::NAN), (3, f32::INFINITY)] {
        let mut sinks = [0.0f32; H];
        sinks[index] = bad;
        match ops.error(&Options::new().sinks(&sinks)) {
            Error::InvalidValue {
                operand: Operand::Sinks,
                index: i,
                ..
            } => assert_eq!(i, index),
            e => panic!("sink {bad}: {e:?}"),
        }
    }
    // −∞ disables a sink: valid.
    ops.ok(&Options::new().sinks(&[f32::NEG_INFINITY, 0.0, -3.0, 1e30]));
}

#[test]
fn invalid_kv_lens() {
    let ops = Operands::new();
    assert_eq!(
        ops.error(&Options::new().kv_lens(&[N_KV])),
        Error::LengthMismatch {
            operand: Operand::KvLens,
            expected: B,
            got: 1
        }
    );
    assert_eq!(
        ops.error(&Options::new().kv_lens(&[N_KV; 3])),
        Error::LengthMismatch {
            operand: Operand::KvLens,
            expected: B,
            got: 3
        }
    );
    for lens in [[N_KV + 1, 0], [0, N_KV + 1], [3, usize::MAX]] {
        match ops.error(&Options::new().kv_lens(&lens)) {
            Error::InvalidValue {
                operand: Operand::KvLens,
                index,
                ..
            } => assert_eq!(lens[index], *lens.iter().max().unwrap()),
            e => panic!("{lens:?}: {e:?}"),
        }
    }
    ops.ok(&Options::new().kv_lens(&[0, N_KV]));
}

#[test]
fn bias_and_mask_that_do_not_broadcast() {
    let ops = Operands::new();
    let f = vec![0.0f32; 1000];
    let m = vec![true; 1000];
    // (dims, the dim that fails, expected size).
    let cases: [([usize; 4], Dim, usize); 5] = [
        ([3, 1, 1, N_KV], Dim::Batch, B),
        ([1, N_Q - 1, 1, N_KV], Dim::Seq, N_Q),
        ([1, 1, 2, N_KV], Dim::Heads, H),
        ([1, 1, 1, N_KV + 1], Dim::HeadSize, N_KV),
        ([B, N_Q, H, N_KV - 1], Dim::HeadSize, N_KV),
    ];
    for (dims, dim, expected) in cases {
        let got = dims[Dim::ALL.iter().position(|&d| d == dim).unwrap()];
        let bias = Tensor::bshd(&f, dims).unwrap();
        assert_eq!(
            ops.error(&Options::new().bias(bias)),
            Error::NotBroadcastable {
                operand: Operand::Bias,
                dim,
                expected,
                got
            },
            "bias {dims:?}"
        );
        let mask = Tensor::bshd(&m, dims).unwrap();
        assert_eq!(
            ops.error(&Options::new().mask(mask)),
            Error::NotBroadcastable {
                operand: Operand::Mask,
                dim,
                expected,
                got
            },
            "mask {dims:?}"
        );
    }
    // A size-0 key dim does not broadcast either (n_kv = 5).
    let bias = Tensor::bshd(&f, [1, 1, 1, 0]).unwrap();
    assert!(matches!(
        ops.error(&Options::new().bias(bias)),
        Error::NotBroadcastable {
            operand: Operand::Bias,
            dim: Dim::HeadSize,
            expected: N_KV,
            got: 0
        }
    ));
    // Controls: full, size-1 and stride-0 views are fine.
    ops.ok(&Options::new().bias(Tensor::bshd(&f, [B, N_Q, H, N_KV]).unwrap()));
    ops.ok(&Options::new().mask(Tensor::bshd(&m, [1, 1, 1, 1]).unwrap()));
    ops.ok(&Options::new().bias(Tensor::new(&f, [B, N_Q, H, N_KV], [0, 0, 0, 1]).unwrap()));
}

#[test]
fn conflicting_alignments() {
    let ops = Operands::new();
    let slopes = [0.5f32; H];
    let (tl, br) = (Alignment::TopLeft, Alignment::BottomRight);
    let bad = [
        Options::new().causal(tl).sliding_window(2, 0, br),
        Options::new().causal(br).sliding_window(2, 0, tl),
        Options::new().causal(tl).alibi(&slopes, br),
        Options::new().sliding_window(1, 1, br).alibi(&slopes, tl),
        Options::new()
            .causal(br)
            .sliding_window(1, 1, br)
            .alibi(&slopes, tl),
    ];
    for opts in &bad {
        assert_eq!(ops.error(opts), Error::ConflictingAlignment, "{opts:?}");
    }
    for a in [tl, br] {
        ops.ok(&Options::new()
            .causal(a)
            .sliding_window(1, 0, a)
            .alibi(&slopes, a));
    }
}

#[test]
fn invalid_merges() {
    let dims = [1, 2, 3, 4];
    let o = vec![0.0f32; 24];
    let lse6 = [0.0f32; 6];
    let good = Partial {
        out: Tensor::bshd(&o, dims).unwrap(),
        lse: &lse6,
    };
    let mut out = vec![f32::from_bits(OUT_INIT_BITS); 24];
    let mut lse = vec![f32::from_bits(OUT_INIT_BITS); 6];
    let mut merge = |parts: &[Partial]| {
        let r = merge_partials(
            parts,
            &mut TensorMut::bshd(&mut out, dims).unwrap(),
            &mut lse,
        );
        r.expect_err("an invalid merge must be an error")
    };
    // (The closure borrows `out` and `lse` until its last use below.)
    assert_eq!(merge(&[]), Error::NoPartials);

    // A partial whose output has the wrong head size / heads / rows.
    for (k, dim) in Dim::ALL.into_iter().enumerate() {
        let mut d = dims;
        d[k] += 1;
        let big = Partial {
            // Stride 0 everywhere: any dims fit the buffer.
            out: Tensor::new(&o, d, [0, 0, 0, 0]).unwrap(),
            lse: &lse6,
        };
        assert_eq!(
            merge(&[good, big]),
            Error::ShapeMismatch {
                operand: Operand::Partial,
                dim,
                expected: dims[k],
                got: dims[k] + 1
            }
        );
    }
    // A partial with the wrong number of LSE values.
    let lse5 = [0.0f32; 5];
    let short = Partial {
        out: good.out,
        lse: &lse5,
    };
    assert_eq!(
        merge(&[good, short]),
        Error::LengthMismatch {
            operand: Operand::Partial,
            expected: 6,
            got: 5
        }
    );
    assert!(out.iter().chain(&lse).all(|x| x.to_bits() == OUT_INIT_BITS));

    // The merged LSE slice of the wrong length.
    let mut lse7 = [0.0f32; 7];
    assert_eq!(
        merge_partials(
            &[good],
            &mut TensorMut::bshd(&mut out, dims).unwrap(),
            &mut lse7
        ),
        Err(Error::LengthMismatch {
            operand: Operand::Lse,
            expected: 6,
            got: 7
        })
    );
    // Control: the same partial twice is fine.
    let mut o2 = Buffer::from_fn(dims, Layout::BHSD, 0.0f32, |_| 1.0);
    merge_partials(&[good, good], &mut o2.view_mut(), &mut lse).unwrap();
    assert!(lse.iter().all(|&x| (x - 2f32.ln()).abs() < 1e-6));
    assert!(o2.logical().iter().all(|&x| x == 0.0));
}
