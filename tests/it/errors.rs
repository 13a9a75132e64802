//! Every invalid input is answered with the right `sdpa::Error` variant and fields, by the
//! fused entry points and the reference alike, never with a panic; the output is left
//! untouched; and the message names what is wrong (operand, dimension, numbers).

use sdpa::reference;
use sdpa::{Dim, Error, Operand, Options, Tensor, TensorMut};

/// Logical dims of Q, K, V and the output of one call.
#[derive(Clone, Copy, Debug)]
struct Dims {
    q: [usize; 4],
    k: [usize; 4],
    v: [usize; 4],
    out: [usize; 4],
}

/// A valid problem: B = 2, n_q = 5, H = 4, H_kv = 2, n_kv = 6, d_k = 8, d_v = 3.
const GOOD: Dims = Dims {
    q: [2, 5, 4, 8],
    k: [2, 6, 2, 8],
    v: [2, 6, 2, 3],
    out: [2, 5, 4, 3],
};

const SENTINEL: f32 = 4242.0;

fn filled(dims: [usize; 4]) -> Vec<f32> {
    vec![0.25; dims.iter().product()]
}

/// Calls every entry point on contiguous BSHD views of `dims` with an LSE of `lse_len`
/// values, and returns their results: `attention`, `attention_lse`, `reference::attention`,
/// `reference::attention_lse`. Also checks that no call that fails writes its output or LSE.
fn call_all(dims: Dims, lse_len: usize, opts: &Options) -> [Result<(), Error>; 4] {
    let (q, k, v) = (filled(dims.q), filled(dims.k), filled(dims.v));
    let q = Tensor::bshd(&q, dims.q).unwrap();
    let k = Tensor::bshd(&k, dims.k).unwrap();
    let v = Tensor::bshd(&v, dims.v).unwrap();
    let mut results = Vec::new();
    for entry in 0..4 {
        let mut out = vec![SENTINEL; dims.out.iter().product::<usize>()];
        let mut lse = vec![SENTINEL; lse_len];
        let mut o = TensorMut::new(&mut out, dims.out, distinct_strides(dims.out)).unwrap();
        let r = match entry {
            0 => sdpa::attention(&q, &k, &v, &mut o, opts),
            1 => sdpa::attention_lse(&q, &k, &v, &mut o, &mut lse, opts),
            2 => reference::attention(&q, &k, &v, &mut o, opts),
            _ => reference::attention_lse(&q, &k, &v, &mut o, &mut lse, opts),
        };
        if r.is_err() {
            assert!(
                out.iter().chain(&lse).all(|&x| x == SENTINEL),
                "entry point {entry} wrote its output before failing with {r:?}"
            );
        }
        results.push(r);
    }
    results.try_into().unwrap()
}

/// Contiguous BSHD strides, with a zero dim counted as 1 so that an empty output view still
/// has distinct strides (`TensorMut::bshd` gives zero strides there, see
/// `edge_cases::empty_output_views_from_the_contiguous_constructors_are_accepted`).
fn distinct_strides(dims: [usize; 4]) -> [usize; 4] {
    let [_, s, h, d] = dims.map(|n| n.max(1));
    [s * h * d, h * d, d, 1]
}

/// `reference::error_bounds` on contiguous views of `dims` (it takes no output).
fn bounds_result(dims: Dims, opts: &Options) -> Result<(), Error> {
    let (q, k, v) = (filled(dims.q), filled(dims.k), filled(dims.v));
    let q = Tensor::bshd(&q, dims.q).unwrap();
    let k = Tensor::bshd(&k, dims.k).unwrap();
    let v = Tensor::bshd(&v, dims.v).unwrap();
    reference::error_bounds(&q, &k, &v, opts).map(|_| ())
}

fn good_lse_len(d: Dims) -> usize {
    d.q[0] * d.q[2] * d.q[1]
}

/// All four entry points (and `error_bounds`, unless `bounds` is false) fail with `want`.
fn expect_everywhere(dims: Dims, opts: &Options, want: &Error, bounds: bool) {
    for (entry, r) in call_all(dims, good_lse_len(dims), opts).iter().enumerate() {
        assert_eq!(
            r.as_ref().err(),
            Some(want),
            "entry point {entry} on {dims:?}"
        );
    }
    if bounds {
        assert_eq!(
            bounds_result(dims, opts).err().as_ref(),
            Some(want),
            "error_bounds"
        );
    }
}

/// The decimal numbers that occur in `s`.
fn numbers_in(s: &str) -> Vec<u128> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}

/// The message of `e` contains every word of `words` and every number of `numbers`.
fn assert_message(e: &Error, words: &[&str], numbers: &[usize]) {
    let msg = e.to_string();
    for w in words {
        assert!(
            msg.contains(w),
            "message {msg:?} of {e:?} does not mention {w:?}"
        );
    }
    let found = numbers_in(&msg);
    for &n in numbers {
        assert!(
            found.contains(&(n as u128)),
            "message {msg:?} of {e:?} does not mention {n}"
        );
    }
}

#[test]
fn the_valid_problem_is_accepted_everywhere() {
    for r in call_all(GOOD, good_lse_len(GOOD), &Options::new()) {
        assert_eq!(r, Ok(()));
    }
    assert_eq!(bounds_result(GOOD, &Options::new()), Ok(()));
}

#[test]
fn shape_mismatches_name_the_operand_and_the_dim() {
    // (operand, dim, the dims that break it, expected, got). K's seq and heads define n_kv
    // and H_kv, and V's head size defines d_v, so those cannot mismatch.
    let cases: Vec<(Operand, Dim, Dims, usize, usize)> = vec![
        (
            Operand::Key,
            Dim::Batch,
            Dims {
                k: [3, 6, 2, 8],
                ..GOOD
            },
            2,
            3,
        ),
        (
            Operand::Key,
            Dim::HeadSize,
            Dims {
                k: [2, 6, 2, 7],
                ..GOOD
            },
            8,
            7,
        ),
        (
            Operand::Value,
            Dim::Batch,
            Dims {
                v: [1, 6, 2, 3],
                ..GOOD
            },
            2,
            1,
        ),
        (
            Operand::Value,
            Dim::Seq,
            Dims {
                v: [2, 7, 2, 3],
                ..GOOD
            },
            6,
            7,
        ),
        (
            Operand::Value,
            Dim::Heads,
            Dims {
                v: [2, 6, 1, 3],
                ..GOOD
            },
            2,
            1,
        ),
        (
            Operand::Output,
            Dim::Batch,
            Dims {
                out: [3, 5, 4, 3],
                ..GOOD
            },
            2,
            3,
        ),
        (
            Operand::Output,
            Dim::Seq,
            Dims {
                out: [2, 9, 4, 3],
                ..GOOD
            },
            5,
            9,
        ),
        (
            Operand::Output,
            Dim::Heads,
            Dims {
                out: [2, 5, 2, 3],
                ..GOOD
            },
            4,
            2,
        ),
        (
            Operand::Output,
            Dim::HeadSize,
            Dims {
                out: [2, 5, 4, 8],
                ..GOOD
            },
            3,
            8,
        ),
    ];
    for (operand, dim, dims, expected, got) in cases {
        let want = Error::ShapeMismatch {
            operand,
            dim,
            expected,
            got,
        };
        // `error_bounds` has no output argument.
        expect_everywhere(dims, &Options::new(), &want, operand != Operand::Output);
        let dim_name = match dim {
            Dim::Batch => "batch",
            Dim::Seq => "seq",
            Dim::Heads => "heads",
            Dim::HeadSize => "head size",
        };
        let operand_name = match operand {
            Operand::Key => "key",
            Operand::Value => "value",
            _ => "output",
        };
        assert_message(&want, &[operand_name, dim_name], &[expected, got]);
    }
}

#[test]
fn query_heads_must_be_a_positive_multiple_of_key_value_heads() {
    for (heads, kv_heads) in [(4, 3), (4, 0), (0, 2), (3, 2), (2, 4), (0, 0)] {
        let dims = Dims {
            q: [2, 5, heads, 8],
            k: [2, 6, kv_heads, 8],
            v: [2, 6, kv_heads, 3],
            out: [2, 5, heads, 3],
        };
        let want = Error::HeadsNotDivisible { heads, kv_heads };
        expect_everywhere(dims, &Options::new(), &want, true);
        assert_message(&want, &["heads"], &[heads, kv_heads]);
    }
}

#[test]
fn zero_query_key_head_size_is_rejected() {
    let dims = Dims {
        q: [2, 5, 4, 0],
        k: [2, 6, 2, 0],
        ..GOOD
    };
    expect_everywhere(dims, &Options::new(), &Error::ZeroHeadDim, true);
    assert_message(&Error::ZeroHeadDim, &["head size"], &[0]);
}

#[test]
fn lse_of_the_wrong_length_is_rejected() {
    let want_len = good_lse_len(GOOD); // 2 · 4 · 5 = 40
    for len in [0, 1, want_len - 1, want_len + 1, 2 * want_len] {
        let results = call_all(GOOD, len, &Options::new());
        let want = Error::LengthMismatch {
            operand: Operand::Lse,
            expected: want_len,
            got: len,
        };
        // The entry points without an LSE do not care.
        assert_eq!(results[0], Ok(()));
        assert_eq!(results[2], Ok(()));
        assert_eq!(results[1].as_ref().err(), Some(&want), "fused, len {len}");
        assert_eq!(
            results[3].as_ref().err(),
            Some(&want),
            "reference, len {len}"
        );
        assert_message(&want, &["lse"], &[want_len, len]);
    }
}

#[test]
fn non_finite_scales_are_rejected() {
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
        let opts = Options::new().scale(scale);
        let mut results = call_all(GOOD, good_lse_len(GOOD), &opts).to_vec();
        results.push(bounds_result(GOOD, &opts));
        for (entry, r) in results.into_iter().enumerate() {
            match r {
                Err(Error::InvalidScale(s)) => {
                    assert!(s.to_bits() == scale.to_bits() || (s.is_nan() && scale.is_nan()));
                    let msg = Error::InvalidScale(s).to_string();
                    assert!(msg.contains("scale"), "{msg}");
                    let shown = if s.is_nan() { "NaN" } else { "inf" };
                    assert!(msg.contains(shown), "{msg} should show {shown}");
                    if s == f32::NEG_INFINITY {
                        assert!(msg.contains("-inf"), "{msg}");
                    }
                }
                other => panic!("entry point {entry}, scale {scale}: got {other:?}"),
            }
        }
    }
    // Finite scales of any sign and size are valid, including a subnormal and zero.
    for scale in [0.0, -0.0, 1e-40, -3.0, f32::MAX] {
        let r = call_all(GOOD, good_lse_len(GOOD), &Options::new().scale(scale));
        assert!(r.iter().all(|r| r.is_ok()), "scale {scale}: {r:?}");
    }
}

#[test]
fn the_first_problem_found_is_reported_in_a_fixed_order() {
    // Shapes (K, then V, then the output) before heads, head size, LSE length and scale.
    let dims = Dims {
        q: [2, 5, 4, 0],
        k: [3, 6, 3, 0],
        v: [2, 6, 3, 3],
        out: [2, 5, 4, 3],
    };
    let opts = Options::new().scale(f32::NAN);
    let r = call_all(dims, 1, &opts);
    let want = Error::ShapeMismatch {
        operand: Operand::Key,
        dim: Dim::Batch,
        expected: 2,
        got: 3,
    };
    assert!(r.iter().all(|r| r.as_ref().err() == Some(&want)), "{r:?}");
    let dims = Dims {
        k: [2, 6, 3, 0],
        v: [2, 6, 3, 3],
        ..dims
    };
    let r = call_all(dims, 1, &opts);
    let want = Error::HeadsNotDivisible {
        heads: 4,
        kv_heads: 3,
    };
    assert!(r.iter().all(|r| r.as_ref().err() == Some(&want)), "{r:?}");
}

#[test]
fn short_slices_are_rejected_by_every_constructor() {
    let dims = [2, 3, 4, 5]; // 120 elements
    let data = vec![0.0f32; 120];
    let want = |got| Error::SliceTooShort { needed: 120, got };
    for got in [0, 1, 119] {
        assert_eq!(Tensor::bshd(&data[..got], dims).unwrap_err(), want(got));
        assert_eq!(
            Tensor::bhsd(&data[..got], [2, 4, 3, 5]).unwrap_err(),
            want(got)
        );
        let mut buf = data[..got].to_vec();
        assert_eq!(TensorMut::bshd(&mut buf, dims).unwrap_err(), want(got));
        assert_eq!(
            TensorMut::bhsd(&mut buf, [2, 4, 3, 5]).unwrap_err(),
            want(got)
        );
    }
    assert!(Tensor::bshd(&data, dims).is_ok());
    // Strided: the largest reachable index is 1·100 + 2·30 + 3·7 + 4·1 = 185, so 186 needed.
    let strides = [100, 30, 7, 1];
    let big = vec![0.0f32; 186];
    let want = Error::SliceTooShort {
        needed: 186,
        got: 185,
    };
    assert_eq!(Tensor::new(&big[..185], dims, strides).unwrap_err(), want);
    let mut buf = big[..185].to_vec();
    assert_eq!(TensorMut::new(&mut buf, dims, strides).unwrap_err(), want);
    assert!(Tensor::new(&big, dims, strides).is_ok());
    assert_message(&want, &["slice"], &[186, 185]);
}

#[test]
fn overflowing_dims_and_strides_are_rejected() {
    let data = vec![0.0f32; 16];
    let mut buf = data.clone();
    let max = usize::MAX;
    // Contiguous strides that do not fit: S·H·D overflows.
    let dims = [2, max / 2, 4, 2];
    let want = Error::LayoutOverflow {
        dims,
        strides: [0; 4],
    };
    assert_eq!(Tensor::bshd(&data, dims).unwrap_err(), want);
    assert_eq!(TensorMut::bshd(&mut buf, dims).unwrap_err(), want);
    // BHSD: H·S·D overflows (storage shape [b, h, s, d], logical dims [b, s, h, d]).
    let want_bhsd = Error::LayoutOverflow {
        dims: [2, max / 2, 4, 2],
        strides: [0; 4],
    };
    assert_eq!(
        Tensor::bhsd(&data, [2, 4, max / 2, 2]).unwrap_err(),
        want_bhsd
    );
    assert_eq!(
        TensorMut::bhsd(&mut buf, [2, 4, max / 2, 2]).unwrap_err(),
        want_bhsd
    );
    // Contiguous strides fit but the batch span does not.
    let dims = [max, 2, 2, 2];
    let want = Error::LayoutOverflow {
        dims,
        strides: [8, 4, 2, 1],
    };
    assert_eq!(Tensor::bshd(&data, dims).unwrap_err(), want);
    // One stride times its dim overflows.
    let (dims, strides) = ([3, 2, 1, 1], [max, 1, 1, 1]);
    let want = Error::LayoutOverflow { dims, strides };
    assert_eq!(Tensor::new(&data, dims, strides).unwrap_err(), want);
    assert_eq!(TensorMut::new(&mut buf, dims, strides).unwrap_err(), want);
    // The span of one dim fits, adding the next does not.
    let (dims, strides) = ([2, 2, 1, 1], [max, 1, 1, 1]);
    let want = Error::LayoutOverflow { dims, strides };
    assert_eq!(Tensor::new(&data, dims, strides).unwrap_err(), want);
    assert_eq!(TensorMut::new(&mut buf, dims, strides).unwrap_err(), want);
    // Each span fits, their sum does not.
    let half = max / 2 + 1;
    let (dims, strides) = ([2, 2, 1, 1], [half, half, 1, 1]);
    let want = Error::LayoutOverflow { dims, strides };
    assert_eq!(Tensor::new(&data, dims, strides).unwrap_err(), want);
    assert_eq!(TensorMut::new(&mut buf, dims, strides).unwrap_err(), want);
    assert_message(&want, &["overflow"], &[half, 2]);
}

#[test]
fn overlapping_output_strides_are_rejected() {
    let mut buf = vec![0.0f32; 64];
    let cases = [
        // A zero stride on a dim larger than 1 (broadcast): fine to read, not to write.
        ([1, 4, 2, 3], [0, 3, 0, 1]),
        // Rows two apart but three long: rows 0 and 1 share an element.
        ([1, 4, 1, 3], [0, 2, 0, 1]),
        // Heads and head-size interleaved onto the same elements.
        ([2, 2, 3, 4], [24, 12, 2, 1]),
        // Batch stride smaller than what seq and heads span.
        ([2, 3, 2, 2], [5, 4, 2, 1]),
    ];
    for (dims, strides) in cases {
        let want = Error::OverlappingOutput { dims, strides };
        assert_eq!(
            TensorMut::new(&mut buf, dims, strides).unwrap_err(),
            want,
            "{dims:?} {strides:?}"
        );
        assert!(Tensor::new(&buf, dims, strides).is_ok(), "reading is fine");
        let numbers: Vec<usize> = dims.iter().chain(&strides).copied().collect();
        assert_message(&want, &["strides"], &numbers);
    }
    // Padded and permuted layouts are not overlapping.
    assert!(TensorMut::new(&mut buf, [1, 3, 2, 4], [0, 9, 5, 1]).is_ok());
    assert!(TensorMut::new(&mut buf, [1, 3, 2, 4], [0, 4, 12, 1]).is_ok());
    assert!(TensorMut::new(&mut buf, [1, 3, 2, 4], [0, 16, 1, 2]).is_ok());
}

/// An empty writable view (a zero dim) with large other dims and strides: `TensorMut::new`
/// must answer (`Ok`: there are no elements to overlap), not overflow while checking that
/// distinct indices land on distinct elements.
#[test]
fn empty_writable_views_with_huge_strides_do_not_panic() {
    let cases = [
        ([usize::MAX, 2, 0, 1], [1, usize::MAX, 1, 1]),
        ([1 << 33, (1 << 31) + 3, 2, 0], [1, 1 << 33, 1 << 34, 1]),
    ];
    for (dims, strides) in cases {
        let r = std::panic::catch_unwind(|| {
            let mut empty: Vec<f32> = Vec::new();
            TensorMut::new(&mut empty, dims, strides).map(|_| ())
        });
        assert!(r.is_ok(), "TensorMut::new({dims:?}, {strides:?}) panicked");
        assert_eq!(r.unwrap(), Ok(()), "{dims:?} {strides:?}");
    }
}

#[test]
fn operand_and_dim_names() {
    let names = [
        (Operand::Query, "query"),
        (Operand::Key, "key"),
        (Operand::Value, "value"),
        (Operand::Output, "output"),
        (Operand::Lse, "lse"),
    ];
    for (op, name) in names {
        assert_eq!(op.to_string(), name);
    }
    let dims = ["batch", "seq", "heads", "head size"];
    for (d, name) in Dim::ALL.iter().zip(dims) {
        assert_eq!(d.to_string(), name);
    }
}

/// A stride-0 view may declare any head size over one element: the fused kernel's buffers grow
/// with the head size, so an impossible one is a typed error, never an allocation abort.
#[test]
fn broadcast_views_with_an_impossible_head_size_are_an_error_not_an_abort() {
    let one = [0.5f32];
    let huge = 1usize << 60;
    let q = sdpa::Tensor::new(&one, [1, 2, 1, huge], [0, 0, 0, 0]).unwrap();
    let k = sdpa::Tensor::new(&one, [1, 3, 1, huge], [0, 0, 0, 0]).unwrap();
    let v = sdpa::Tensor::new(&one, [1, 3, 1, 1], [0, 0, 0, 0]).unwrap();
    let mut out = [0.0f32; 2];
    let mut view = sdpa::TensorMut::bshd(&mut out, [1, 2, 1, 1]).unwrap();
    let err = sdpa::attention(&q, &k, &v, &mut view, &sdpa::Options::new()).unwrap_err();
    assert!(
        matches!(err, sdpa::Error::ScratchTooLarge { bytes } if bytes > huge),
        "{err:?}"
    );
    assert!(err.to_string().contains("cannot be allocated"));
    assert_eq!(out, [0.0, 0.0], "nothing written on error");
}

/// The reference materializes n_q × n_kv scores per head: broadcast views can ask for more than
/// memory holds, which is a typed error.
#[test]
fn reference_score_matrix_larger_than_memory_is_an_error() {
    let one = [0.5f32];
    let (n_q, n_kv) = (1usize << 20, 1usize << 44);
    let q = sdpa::Tensor::new(&one, [1, n_q, 1, 1], [0, 0, 0, 0]).unwrap();
    let k = sdpa::Tensor::new(&one, [1, n_kv, 1, 1], [0, 0, 0, 0]).unwrap();
    let v = sdpa::Tensor::new(&one, [1, n_kv, 1, 0], [0, 0, 0, 0]).unwrap();
    let mut out: [f32; 0] = [];
    let mut view = sdpa::TensorMut::new(&mut out, [1, n_q, 1, 0], [0, 0, 0, 0]).unwrap();
    // With d_v = 0 only the LSE needs the scores (plain attention has nothing to write and
    // returns Ok at once).
    let mut lse = vec![0.0f32; n_q];
    let opts = sdpa::Options::new();
    let err = sdpa::reference::attention_lse(&q, &k, &v, &mut view, &mut lse, &opts).unwrap_err();
    assert_eq!(err, sdpa::Error::ScoreMatrixTooLarge { n_q, n_kv });
    sdpa::reference::attention(&q, &k, &v, &mut view, &opts).unwrap();
}
