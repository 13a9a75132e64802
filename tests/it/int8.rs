//! 8-bit K/V (`i8` with f32 scales, `Options::kv_scales`): every scale granularity (per
//! tensor, per (token, kv head), per (kv head, channel), per batch and head, per element) with
//! zero and negative scales, for each Q/out type, prefill and decode shapes, under the options,
//! against the f64 reference within its bound; a negated value scale negates the output
//! exactly and a zero one zeroes it; paged and packed caches equal the dense one bit for bit;
//! invalid scales are typed errors that write nothing.

use sdpa::half::{bf16, f16};
use sdpa::{
    Alignment, Dim, Element, Error, Operand, Options, PackedKv, PagedKv, Tensor, TensorMut,
    VarlenKv,
};

use crate::support;
use support::contract::RowFacts;
use support::harness::{assert_tensors_against_reference, Layout};
use support::values::SplitMix;

/// Uniform 8-bit values in −127..=127 (and, rarely, −128).
fn quantized(len: usize, seed: u64) -> Vec<i8> {
    let mut r = SplitMix(seed);
    (0..len)
        .map(|i| match i % 97 {
            0 => -128,
            _ => (r.below(255) as i32 - 127) as i8,
        })
        .collect()
}

fn values(len: usize, seed: u64) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Granularity {
    Tensor,
    TokenHead,
    HeadChannel,
    BatchHead,
    Element,
}

const GRANULARITIES: [Granularity; 5] = [
    Granularity::Tensor,
    Granularity::TokenHead,
    Granularity::HeadChannel,
    Granularity::BatchHead,
    Granularity::Element,
];

/// Scales for K/V dims `[d0, d1, h, d]` at `g`: about `1/127 · (0.5 … 1.5)`, every third one
/// negative and every seventh 0 (a single per-tensor scale stays positive).
fn scales(g: Granularity, [d0, d1, h, d]: [usize; 4], seed: u64) -> (Vec<f32>, [usize; 4]) {
    let dims = match g {
        Granularity::Tensor => [1, 1, 1, 1],
        Granularity::TokenHead => [d0, d1, h, 1],
        Granularity::HeadChannel => [1, 1, h, d],
        Granularity::BatchHead => [d0, 1, h, 1],
        Granularity::Element => [d0, d1, h, d],
    };
    let n: usize = dims.iter().product();
    let mut r = SplitMix(seed);
    let data = (0..n)
        .map(|i| {
            let x = (0.5 + r.unit() as f32) / 127.0;
            match (n, i % 7, i % 3) {
                (1, _, _) => x,
                (_, 6, _) => 0.0,
                (_, _, 2) => -x,
                _ => x,
            }
        })
        .collect();
    (data, dims)
}

/// One case: `b` sequences, `n_q` query rows, `h` query heads over `h_kv` kv heads, `n_kv`
/// keys, head size `d`; K and V scaled at `g`; every option set of [`option_sets`].
fn case<Q: Element, O: Element>(dims: [usize; 6], g: Granularity, seed: u64) {
    case_with::<Q, O>(dims, [g, g], 1.0, seed);
}

/// [`case`] with K scaled at `gk`, V at `gv`, and Q's values times `q_mag`.
fn case_with<Q: Element, O: Element>(
    dims: [usize; 6],
    gs: [Granularity; 2],
    q_mag: f32,
    seed: u64,
) {
    case_scaled::<Q, O>(dims, gs, [q_mag, 1.0], seed);
}

/// [`case_with`], V's scales also times `v_mag`.
fn case_scaled<Q: Element, O: Element>(
    [b, n_q, h, h_kv, n_kv, d]: [usize; 6],
    [gk, gv]: [Granularity; 2],
    [q_mag, v_mag]: [f32; 2],
    seed: u64,
) {
    let q32 = values(b * n_q * h * d, seed);
    let q: Vec<Q> = q32.iter().map(|&x| Q::from_f32(x * q_mag)).collect();
    let k = quantized(b * n_kv * h_kv * d, seed + 1);
    let v = quantized(b * n_kv * h_kv * d, seed + 2);
    let kv_dims = [b, n_kv, h_kv, d];
    let (ks, ks_dims) = scales(gk, kv_dims, seed + 3);
    let (mut vs, vs_dims) = scales(gv, kv_dims, seed + 4);
    vs.iter_mut().for_each(|x| *x *= v_mag);
    let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
    let kv = Tensor::bshd(&k, kv_dims).unwrap();
    let vv = Tensor::bshd(&v, kv_dims).unwrap();
    let ksv = Tensor::bshd(&ks, ks_dims).unwrap();
    let vsv = Tensor::bshd(&vs, vs_dims).unwrap();
    let lens: Vec<usize> = (0..b).map(|i| n_kv - i * n_kv / 3).collect();
    let slopes = sdpa::alibi_slopes(h).unwrap();
    let sinks: Vec<f32> = (0..h).map(|x| x as f32 * 0.25 - 1.0).collect();
    let bias = values(n_q * n_kv, seed + 5);
    let bias_v = Tensor::bshd(&bias, [1, n_q, 1, n_kv]).unwrap();
    let br = Alignment::BottomRight;
    let sets = [
        ("plain", Options::new()),
        ("causal, kv_lens", Options::new().kv_lens(&lens).causal(br)),
        (
            "window, alibi",
            Options::new()
                .sliding_window(n_kv / 4, 0, br)
                .alibi(&slopes, br),
        ),
        (
            "softcap, sinks, bias",
            Options::new().softcap(5.0).sinks(&sinks).bias(bias_v),
        ),
    ];
    for (name, opts) in sets {
        let opts = opts.kv_scales(ksv, vsv);
        let label = format!(
            "Q {} out {} {gk:?}/{gv:?} [b {b}, n_q {n_q}, h {h}/{h_kv}, n_kv {n_kv}, d {d}] \
             |q| ≤ {q_mag}, V scales ×{v_mag} {name}",
            Q::NAME,
            O::NAME
        );
        let cmp = assert_tensors_against_reference::<Q, i8, O>(
            &qv,
            &kv,
            &vv,
            Layout::BSHD,
            &opts,
            |_| RowFacts::FINITE,
            &label,
        );
        assert!(cmp.worst_ratio <= 1.0, "{label}: {}", cmp.worst_ratio);
    }
}

const PREFILL: [usize; 6] = [2, 37, 4, 2, 150, 72];
const DECODE: [usize; 6] = [2, 1, 16, 4, 3000, 128];

#[test]
fn every_granularity_against_the_reference_f32() {
    for (i, g) in GRANULARITIES.into_iter().enumerate() {
        case::<f32, f32>(PREFILL, g, 10 + i as u64);
        case::<f32, f32>(DECODE, g, 20 + i as u64);
    }
}

#[test]
fn every_granularity_against_the_reference_half() {
    for (i, g) in GRANULARITIES.into_iter().enumerate() {
        case::<f16, f16>(PREFILL, g, 30 + i as u64);
        case::<bf16, bf16>(DECODE, g, 40 + i as u64);
    }
    case::<bf16, f32>(PREFILL, Granularity::TokenHead, 50);
    case::<f16, f32>(DECODE, Granularity::HeadChannel, 51);
}

/// Decode reads rows whose scales vary along one axis in place (integers in the products;
/// per-key scales on the scores and weights, per-channel ones folded into Q and the output)
/// and dequantizes the others: K and V each way round, a head size too small for the
/// in-place path's factors (`d = 8` under 16 stacked rows), queries so large that the integer
/// dot products would overflow f32 before the scale (`128 · Σ|q|` beyond it, with per-key
/// scales and with Q times per-channel ones: keys dequantized, values still in place), and
/// large per-channel V scales, and rows of 20 values, all against the reference.
#[test]
fn decode_in_place_and_dequantized_rows_against_the_reference() {
    use Granularity::{HeadChannel, Tensor, TokenHead};
    for (i, gs) in [
        [TokenHead, HeadChannel],
        [HeadChannel, TokenHead],
        [Tensor, TokenHead],
    ]
    .into_iter()
    .enumerate()
    {
        case_with::<f32, f32>(DECODE, gs, 1.0, 60 + i as u64);
    }
    case_with::<f32, f32>([2, 1, 16, 4, 700, 8], [TokenHead; 2], 1.0, 64);
    case_with::<f32, f32>([1, 2, 8, 2, 500, 64], [TokenHead; 2], 1.0, 65);
    case_with::<f32, f32>([1, 1, 8, 2, 600, 128], [TokenHead; 2], 1e34, 66);
    case_with::<f32, f32>([1, 1, 8, 2, 600, 128], [Tensor; 2], 1e32, 67);
    case_with::<f32, f32>([1, 1, 8, 2, 600, 128], [HeadChannel; 2], 1e36, 68);
    let dims = [1, 1, 8, 2, 600, 128];
    case_scaled::<f32, f32>(dims, [TokenHead, HeadChannel], [1.0, 1e33], 69);
    // A head size that is no whole number of vectors: keys in place (Q folded), values
    // dequantized, so their scales must not also be folded into the output.
    case_with::<f32, f32>([1, 2, 4, 1, 900, 20], [HeadChannel; 2], 1.0, 70);
}

/// Per-channel V scales at README's documented limit (`|v|·n_visible` up to 2·10³⁸, below
/// `f32::MAX`) on values that all are 127: every output is `127 · scale`, finite, with the
/// scales folded into the output (`(Σ p_j·127)·s`) as with the values dequantized.
#[test]
fn channel_scales_at_the_documented_limit_do_not_overflow() {
    let (h, h_kv, n_kv, d) = (8, 2, 600, 128);
    let q = values(h * d, 80);
    let k = quantized(n_kv * h_kv * d, 81);
    let v = vec![127i8; n_kv * h_kv * d];
    let ks = vec![1.0f32 / 127.0; h_kv * d];
    let scale = f32::MAX / 128.0 / 1024.0;
    let vs = vec![scale; h_kv * d];
    let mut out = vec![0.0f32; h * d];
    let kv_dims = [1, n_kv, h_kv, d];
    sdpa::attention(
        &Tensor::bshd(&q, [1, 1, h, d]).unwrap(),
        &Tensor::bshd(&k, kv_dims).unwrap(),
        &Tensor::bshd(&v, kv_dims).unwrap(),
        &mut TensorMut::bshd(&mut out, [1, 1, h, d]).unwrap(),
        &with_scales(&Options::new(), &ks, &vs, [1, 1, h_kv, d]),
    )
    .unwrap();
    let want = 127.0 * f64::from(scale);
    for &x in &out {
        assert!(
            (f64::from(x) - want).abs() <= want * 1e-5,
            "{x} against {want}"
        );
    }
}

/// Decode folds scales that vary along channels only into Q and the output, reading them by
/// whole vectors where they are contiguous, as one value where there is one, and one by one
/// through their strides otherwise. The same scales as a contiguous `[1, 1, H_kv, d]` and as a
/// view with channel stride 2, and one scale as a `[1, 1, 1, 1]` tensor, as a zero-stride view
/// of the full dims or repeated in a contiguous `[1, 1, H_kv, d]`, give the same bits, at head
/// sizes with and without a partial vector (d = 40: K's fold has a tail, V is dequantized;
/// d = 48: both folded).
#[test]
fn channel_scale_views_fold_to_the_same_bits() {
    let (h, h_kv, n_kv) = (8, 2, 600);
    for d in [40, 48] {
        let q = values(h * d, 90);
        let k = quantized(n_kv * h_kv * d, 91);
        let v = quantized(n_kv * h_kv * d, 92);
        let kv_dims = [1, n_kv, h_kv, d];
        let run = |ks: Tensor<'_, f32>, vs: Tensor<'_, f32>| {
            let mut out = vec![0.0f32; h * d];
            sdpa::attention(
                &Tensor::bshd(&q, [1, 1, h, d]).unwrap(),
                &Tensor::bshd(&k, kv_dims).unwrap(),
                &Tensor::bshd(&v, kv_dims).unwrap(),
                &mut TensorMut::bshd(&mut out, [1, 1, h, d]).unwrap(),
                &Options::new().kv_scales(ks, vs),
            )
            .unwrap();
            bits(&out)
        };
        let ks: Vec<f32> = (0..h_kv * d).map(|i| 0.004 + i as f32 * 1e-5).collect();
        let vs: Vec<f32> = (0..h_kv * d).map(|i| 0.01 - i as f32 * 2e-5).collect();
        let spaced = |x: &[f32]| x.iter().flat_map(|&x| [x, f32::NAN]).collect::<Vec<_>>();
        let (ks2, vs2) = (spaced(&ks), spaced(&vs));
        let channels = [1, 1, h_kv, d];
        let contiguous = run(
            Tensor::bshd(&ks, channels).unwrap(),
            Tensor::bshd(&vs, channels).unwrap(),
        );
        let strided = [0, 0, 2 * d, 2];
        let every_other = run(
            Tensor::new(&ks2, channels, strided).unwrap(),
            Tensor::new(&vs2, channels, strided).unwrap(),
        );
        assert_eq!(contiguous, every_other, "d = {d}, channel stride 2");
        let (k1, v1) = ([0.0123f32], [-0.0456f32]);
        let one = run(
            Tensor::bshd(&k1, [1, 1, 1, 1]).unwrap(),
            Tensor::bshd(&v1, [1, 1, 1, 1]).unwrap(),
        );
        let spread = run(
            Tensor::new(&k1, kv_dims, [0; 4]).unwrap(),
            Tensor::new(&v1, kv_dims, [0; 4]).unwrap(),
        );
        assert_eq!(one, spread, "d = {d}, per tensor");
        let (k_all, v_all) = (vec![k1[0]; h_kv * d], vec![v1[0]; h_kv * d]);
        let per_channel = run(
            Tensor::bshd(&k_all, channels).unwrap(),
            Tensor::bshd(&v_all, channels).unwrap(),
        );
        assert_eq!(one, per_channel, "d = {d}, per tensor against per channel");
        assert!(one.iter().any(|&x| x != 0), "d = {d}: a real output");
    }
}

/// Runs dense i8 attention (B = 2, n_q = 3, H = 4, H_kv = 2, n_kv = 100, d = 32) with the
/// given scales into a fresh output.
fn run_dense(k_scale: &[f32], v_scale: &[f32], dims: [usize; 4]) -> Result<Vec<f32>, Error> {
    let (b, n_q, h, h_kv, n_kv, d) = (2, 3, 4, 2, 100, 32);
    let q = values(b * n_q * h * d, 1);
    let k = quantized(b * n_kv * h_kv * d, 2);
    let v = quantized(b * n_kv * h_kv * d, 3);
    let mut out = vec![7.0f32; b * n_q * h * d];
    let opts = Options::new().kv_scales(Tensor::bshd(k_scale, dims)?, Tensor::bshd(v_scale, dims)?);
    sdpa::attention(
        &Tensor::bshd(&q, [b, n_q, h, d])?,
        &Tensor::bshd(&k, [b, n_kv, h_kv, d])?,
        &Tensor::bshd(&v, [b, n_kv, h_kv, d])?,
        &mut TensorMut::bshd(&mut out, [b, n_q, h, d])?,
        &opts,
    )?;
    Ok(out)
}

#[test]
fn negated_value_scales_negate_the_output_and_zero_ones_zero_it() {
    let dims = [1, 1, 2, 32];
    let ks: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) / 900.0).collect();
    let vs: Vec<f32> = (0..64).map(|i| (i as f32 + 1.0) / 500.0).collect();
    let neg: Vec<f32> = vs.iter().map(|x| -x).collect();
    let plus = run_dense(&ks, &vs, dims).unwrap();
    let minus = run_dense(&ks, &neg, dims).unwrap();
    assert!(plus.iter().any(|&x| x != 0.0));
    for (a, b) in plus.iter().zip(&minus) {
        assert_eq!(a.to_bits(), (-b).to_bits());
    }
    let zero = run_dense(&ks, &[0.0; 64], dims).unwrap();
    assert!(zero.iter().all(|&x| x == 0.0), "a zero value scale gives 0");
}

/// Runs the dense case of [`run_dense`] with K scales as the view `(dims, strides)` of
/// `k_scale` and valid per-tensor V scales.
fn run_with_key_scales(
    k_scale: &[f32],
    dims: [usize; 4],
    strides: [usize; 4],
) -> Result<(), Error> {
    let (b, n_q, h, h_kv, n_kv, d) = (2, 1, 4, 2, 100, 32);
    let q = values(b * n_q * h * d, 1);
    let k = quantized(b * n_kv * h_kv * d, 2);
    let mut out = vec![7.0f32; b * n_q * h * d];
    let one = [0.01f32];
    let opts = Options::new().kv_scales(
        Tensor::new(k_scale, dims, strides)?,
        Tensor::bshd(&one, [1, 1, 1, 1])?,
    );
    let result = sdpa::attention(
        &Tensor::bshd(&q, [b, n_q, h, d])?,
        &Tensor::bshd(&k, [b, n_kv, h_kv, d])?,
        &Tensor::bshd(&k, [b, n_kv, h_kv, d])?,
        &mut TensorMut::bshd(&mut out, [b, n_q, h, d])?,
        &opts,
    );
    if result.is_err() {
        assert!(out.iter().all(|&x| x == 7.0), "wrote on error");
    }
    result
}

/// [`run_with_key_scales`] with `ok`'s storage element `at` set to `x` fails with the invalid
/// scale error at `at`.
fn assert_bad_key_scale(
    ok: &[f32],
    x: f32,
    dims: [usize; 4],
    strides: [usize; 4],
    at: usize,
    label: &str,
) {
    let mut bad = ok.to_vec();
    bad[at] = x;
    let e = run_with_key_scales(&bad, dims, strides).unwrap_err();
    let want = Error::InvalidValue {
        operand: Operand::KeyScales,
        index: at,
        reason: "scale is not finite, or |scale|·128 overflows f32",
    };
    assert_eq!(e, want, "{label}");
}

#[test]
fn invalid_scales_are_found_in_every_layout() {
    // Per (token, kv head) scales, `[2, 100, 2, 1]`: contiguous, transposed (token-minor, as
    // a `[B, H_kv, n_kv]` array) and with padded rows (a pitch of 3 per token); the validation
    // scans one contiguous run where it can and element by element otherwise, and must report
    // the storage index of the bad value either way.
    let dims = [2, 100, 2, 1];
    let layouts: [([usize; 4], usize); 3] = [
        ([200, 2, 1, 1], 400),
        ([200, 1, 100, 1], 400),
        ([300, 3, 1, 1], 600),
    ];
    for (strides, len) in layouts {
        let ok = vec![0.02f32; len];
        run_with_key_scales(&ok, dims, strides).unwrap();
        for (b, t, g) in [(0, 0, 0), (0, 57, 1), (1, 0, 1), (1, 99, 0), (1, 99, 1)] {
            let at = b * strides[0] + t * strides[1] + g * strides[2];
            for x in [f32::NAN, f32::INFINITY, -1e37] {
                let label = format!("strides {strides:?}, ({b}, {t}, {g}) = {x}");
                assert_bad_key_scale(&ok, x, dims, strides, at, &label);
            }
        }
        // A bad value in the padding is never read, so it is no error.
        if len == 600 {
            let mut padded = ok.clone();
            padded[2] = f32::NAN;
            run_with_key_scales(&padded, dims, strides).unwrap();
        }
    }
}

#[test]
fn zero_stride_views_of_the_full_dims_are_checked_value_by_value() {
    // Broadcast views with K's full dims `[2, 100, 2, 32]` and zero strides: per tensor, per
    // (kv head, channel), per (batch, kv head). Each stored scale is checked (once), and a bad
    // one is reported at its storage index.
    let dims = [2, 100, 2, 32];
    let views: [([usize; 4], usize); 3] = [([0; 4], 1), ([0, 0, 32, 1], 64), ([2, 0, 1, 0], 4)];
    for (strides, len) in views {
        let ok = vec![0.02f32; len];
        run_with_key_scales(&ok, dims, strides).unwrap();
        for at in 0..len {
            let label = format!("strides {strides:?}, scale {at}");
            assert_bad_key_scale(&ok, f32::NAN, dims, strides, at, &label);
        }
    }
}

#[test]
fn invalid_scales_are_typed_errors_and_write_nothing() {
    let dims = [1, 1, 2, 32];
    let ok = vec![0.01f32; 64];
    let bad_at = |i: usize, x: f32| {
        let mut s = ok.clone();
        s[i] = x;
        s
    };
    for x in [f32::NAN, f32::INFINITY, -f32::INFINITY, f32::MAX, -1e37] {
        let e = run_dense(&ok, &bad_at(33, x), dims).unwrap_err();
        assert_eq!(
            e,
            Error::InvalidValue {
                operand: Operand::ValueScales,
                index: 33,
                reason: "scale is not finite, or |scale|·128 overflows f32",
            },
            "{x}"
        );
        let e = run_dense(&bad_at(5, x), &ok, dims).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidValue {
                    operand: Operand::KeyScales,
                    index: 5,
                    ..
                }
            ),
            "{e}"
        );
    }
    // The largest valid magnitude is accepted.
    run_dense(&bad_at(0, f32::MAX / 128.0), &ok, dims).unwrap();
    // Scales that do not broadcast: 3 heads against 2.
    let three = vec![0.01f32; 96];
    let e = run_dense(&three, &three, [1, 1, 3, 32]).unwrap_err();
    assert_eq!(
        e,
        Error::NotBroadcastable {
            operand: Operand::KeyScales,
            dim: Dim::Heads,
            expected: 2,
            got: 3
        }
    );

    // i8 without scales, and scales with another type; nothing written.
    let q = values(4 * 32, 1);
    let k8 = quantized(10 * 2 * 32, 2);
    let k32 = values(10 * 2 * 32, 2);
    let qv = Tensor::bshd(&q, [1, 1, 4, 32]).unwrap();
    let mut out = vec![7.0f32; 4 * 32];
    let e = sdpa::attention(
        &qv,
        &Tensor::bshd(&k8, [1, 10, 2, 32]).unwrap(),
        &Tensor::bshd(&k8, [1, 10, 2, 32]).unwrap(),
        &mut TensorMut::bshd(&mut out, [1, 1, 4, 32]).unwrap(),
        &Options::new(),
    )
    .unwrap_err();
    assert_eq!(e, Error::KvScales { kv_type: "i8" });
    let scale = Tensor::bshd(&ok[..1], [1, 1, 1, 1]).unwrap();
    let e = sdpa::attention(
        &qv,
        &Tensor::bshd(&k32, [1, 10, 2, 32]).unwrap(),
        &Tensor::bshd(&k32, [1, 10, 2, 32]).unwrap(),
        &mut TensorMut::bshd(&mut out, [1, 1, 4, 32]).unwrap(),
        &Options::new().kv_scales(scale, scale),
    )
    .unwrap_err();
    assert_eq!(e, Error::KvScales { kv_type: "f32" });
    assert!(out.iter().all(|&x| x == 7.0), "an error wrote output");
}

/// A paged pool and a packed batch holding the same i8 keys, values and per-(token, head)
/// scales as a dense cache give the dense result bit for bit; a NaN scale in a page no
/// sequence reaches is never read, one in a page in use is an error.
#[test]
fn paged_and_packed_equal_dense() {
    let (b, n_q, h, h_kv, d, page) = (3, 2, 8, 2, 64, 16);
    let pps = 7;
    let cap = pps * page;
    let lens = [cap, 60, 1];
    let q = values(b * n_q * h * d, 9);
    let k = quantized(b * cap * h_kv * d, 10);
    let v = quantized(b * cap * h_kv * d, 11);
    let (ks, _) = scales(Granularity::TokenHead, [b, cap, h_kv, d], 12);
    let (vs, _) = scales(Granularity::TokenHead, [b, cap, h_kv, d], 13);
    let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
    let opts = Options::new().kv_lens(&lens).causal(Alignment::BottomRight);
    let dense_opts = opts.clone().kv_scales(
        Tensor::bshd(&ks, [b, cap, h_kv, 1]).unwrap(),
        Tensor::bshd(&vs, [b, cap, h_kv, 1]).unwrap(),
    );
    let n_out = b * n_q * h * d;
    // The dense cache's result with `opts`.
    let dense = |opts: &Options| {
        let mut out = vec![0.0f32; n_out];
        sdpa::attention(
            &qv,
            &Tensor::bshd(&k, [b, cap, h_kv, d]).unwrap(),
            &Tensor::bshd(&v, [b, cap, h_kv, d]).unwrap(),
            &mut TensorMut::bshd(&mut out, [b, n_q, h, d]).unwrap(),
            opts,
        )
        .unwrap();
        out
    };
    let want = dense(&dense_opts);

    // Pages in reverse order plus one spare page (index `b·pps`) that no sequence uses.
    let pages = b * pps + 1;
    let (row, srow) = (h_kv * d, h_kv);
    let mut kp = vec![0i8; pages * page * row];
    let mut vp = vec![0i8; pages * page * row];
    let mut ksp = vec![f32::NAN; pages * page * srow];
    let mut vsp = vec![f32::NAN; pages * page * srow];
    let mut table = vec![0u32; b * pps];
    for s in 0..b {
        for p in 0..pps {
            let dst = b * pps - 1 - (s * pps + p);
            table[s * pps + p] = dst as u32;
            for t in 0..page {
                let (from, to) = (s * cap + p * page + t, dst * page + t);
                kp[to * row..][..row].copy_from_slice(&k[from * row..][..row]);
                vp[to * row..][..row].copy_from_slice(&v[from * row..][..row]);
                ksp[to * srow..][..srow].copy_from_slice(&ks[from * srow..][..srow]);
                vsp[to * srow..][..srow].copy_from_slice(&vs[from * srow..][..srow]);
            }
        }
    }
    let pool = |x| Tensor::bshd(x, [pages, page, h_kv, d]).unwrap();
    let paged = PagedKv::new(pool(&kp), pool(&vp), &table, pps).unwrap();
    let scale_dims = [pages, page, h_kv, 1];
    // The paged pool's result with `opts`.
    let paged_out = |opts: &Options| {
        let mut out = vec![9.0f32; n_out];
        let view = TensorMut::bshd(&mut out, [b, n_q, h, d]).unwrap();
        sdpa::attention_paged(&qv, &paged, &mut { view }, None, opts).unwrap();
        out
    };
    let mut got = paged_out(&with_scales(&opts, &ksp, &vsp, scale_dims));
    assert_eq!(bits(&got), bits(&want), "paged");

    // The last slot of sequence 2's first page lies past its one key: never read, but a page
    // in use is checked whole.
    let mut bad = ksp.to_vec();
    bad[(table[2 * pps] as usize * page + page - 1) * srow] = f32::NAN;
    let e = sdpa::attention_paged(
        &qv,
        &paged,
        &mut TensorMut::bshd(&mut got, [b, n_q, h, d]).unwrap(),
        None,
        &with_scales(&opts, &bad, &vsp, scale_dims),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidValue {
                operand: Operand::KeyScales,
                ..
            }
        ),
        "{e}"
    );

    // Scales of other shapes over the same pool: one per (page, kv head) varies along a
    // sequence's keys (as the dense per-token scales it expands to), one per (kv head,
    // channel) does not (the same view for both).
    let per_page: Vec<f32> = (0..pages * srow)
        .map(|i| (1.0 + (i % 5) as f32) / 300.0)
        .collect();
    let expanded: Vec<f32> = (0..b * cap * srow)
        .map(|i| {
            let (key, g) = (i / srow, i % srow);
            let (s, t) = (key / cap, key % cap);
            per_page[table[s * pps + t / page] as usize * srow + g]
        })
        .collect();
    let (channel, _) = scales(Granularity::HeadChannel, [1, 1, h_kv, d], 14);
    // (paged scales, their dims), (dense scales, their dims)
    type View<'a> = (&'a [f32], [usize; 4]);
    let shapes: [(View, View); 2] = [
        (
            (&per_page, [pages, 1, h_kv, 1]),
            (&expanded, [b, cap, h_kv, 1]),
        ),
        ((&channel, [1, 1, h_kv, d]), (&channel, [1, 1, h_kv, d])),
    ];
    for ((paged_scales, paged_dims), (dense_scales, dense_dims)) in shapes {
        let want = dense(&with_scales(&opts, dense_scales, dense_scales, dense_dims));
        let got = paged_out(&with_scales(&opts, paged_scales, paged_scales, paged_dims));
        assert_eq!(bits(&got), bits(&want), "paged, scales {paged_dims:?}");
    }

    // Packed: the sequences' live keys back to back.
    let cu: Vec<usize> = std::iter::once(0)
        .chain(lens.iter().scan(0, |t, &l| {
            *t += l;
            Some(*t)
        }))
        .collect();
    let total = cu[b];
    let pick = |x: &[i8]| -> Vec<i8> {
        (0..b)
            .flat_map(|s| x[s * cap * row..][..lens[s] * row].to_vec())
            .collect()
    };
    let pick_s = |x: &[f32]| -> Vec<f32> {
        (0..b)
            .flat_map(|s| x[s * cap * srow..][..lens[s] * srow].to_vec())
            .collect()
    };
    let (kk, vk, kss, vss) = (pick(&k), pick(&v), pick_s(&ks), pick_s(&vs));
    let packed = PackedKv::new(
        Tensor::bshd(&kk, [1, total, h_kv, d]).unwrap(),
        Tensor::bshd(&vk, [1, total, h_kv, d]).unwrap(),
        &cu,
    );
    let cu_q: Vec<usize> = (0..=b).map(|s| s * n_q).collect();
    let q_packed = Tensor::bshd(&q, [1, b * n_q, h, d]).unwrap();
    let mut got = vec![9.0f32; n_out];
    sdpa::attention_varlen(
        &q_packed,
        &cu_q,
        &VarlenKv::Packed(packed),
        &mut TensorMut::bshd(&mut got, [1, b * n_q, h, d]).unwrap(),
        None,
        &Options::new().causal(Alignment::BottomRight).kv_scales(
            Tensor::bshd(&kss, [1, total, h_kv, 1]).unwrap(),
            Tensor::bshd(&vss, [1, total, h_kv, 1]).unwrap(),
        ),
    )
    .unwrap();
    assert_eq!(bits(&got), bits(&want), "packed");
}

fn with_scales<'a>(
    opts: &Options<'a>,
    ks: &'a [f32],
    vs: &'a [f32],
    dims: [usize; 4],
) -> Options<'a> {
    opts.clone().kv_scales(
        Tensor::bshd(ks, dims).unwrap(),
        Tensor::bshd(vs, dims).unwrap(),
    )
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}
