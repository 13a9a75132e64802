//! `merge_partials` against the unsplit result: random shapes and values, keys split at random
//! points (empty pieces and pieces where a row sees nothing included, through `kv_lens`), each
//! piece computed by the fused `attention_lse` over its key range, merged, and compared with
//! the fused result over all keys.
//!
//! Tolerance, derived from the crate's own per-row bounds (`reference::error_bounds`): with
//! `B_k`, `L_k` the out/lse bounds of piece `k` and `B` that of the whole problem, each merge
//! weight `e^{lse_k − lse}` is off by a factor within `e^{±2·max L_k}` (θ = e^{2·max L_k} − 1),
//! so `|merged − unsplit| ≤ max_k B_k + B + max‖v‖·(2θ/(1−θ) + 4u)`.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use sdpa::{merge_partials, Options, Partial, Tensor, TensorMut};

const U: f64 = 1.0 / (1u64 << 24) as f64;

#[derive(Debug)]
struct Case {
    b: usize,
    h: usize,
    hkv: usize,
    nq: usize,
    nkv: usize,
    d: usize,
    cuts: Vec<usize>,
    kv_lens: Option<Vec<usize>>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u.int_in_range(1..=2)?;
        let hkv = u.int_in_range(1..=2)?;
        let h = hkv * u.int_in_range(1..=3)?;
        let nq = u.int_in_range(1..=9)?;
        let nkv = u.int_in_range(0..=80)?;
        let d = u.int_in_range(1..=9)?;
        let mut cuts: Vec<usize> = (0..u.int_in_range(0..=4)?)
            .map(|_| u.int_in_range(0..=nkv))
            .collect::<arbitrary::Result<_>>()?;
        cuts.sort_unstable();
        let kv_lens = if u.arbitrary()? {
            Some(
                (0..b)
                    .map(|_| u.int_in_range(0..=nkv))
                    .collect::<arbitrary::Result<_>>()?,
            )
        } else {
            None
        };
        let mut vals = |n: usize| -> arbitrary::Result<Vec<f32>> {
            (0..n)
                .map(|_| Ok(f32::from(u.int_in_range(-64i8..=64)?) / 16.0))
                .collect()
        };
        let q = vals(b * nq * h * d)?;
        let k = vals(b * nkv * hkv * d)?;
        let v = vals(b * nkv * hkv * d)?;
        Ok(Case {
            b,
            h,
            hkv,
            nq,
            nkv,
            d,
            cuts,
            kv_lens,
            q,
            k,
            v,
        })
    }
}

fn run(c: Case) {
    let Case {
        b,
        h,
        hkv,
        nq,
        nkv,
        d,
        ..
    } = c;
    let q = Tensor::bshd(&c.q, [b, nq, h, d]).unwrap();
    let rows = b * h * nq;
    let mut full = vec![0.0f32; b * nq * h * d];
    let mut full_lse = vec![0.0f32; rows];
    let k_full = Tensor::bshd(&c.k, [b, nkv, hkv, d]).unwrap();
    let v_full = Tensor::bshd(&c.v, [b, nkv, hkv, d]).unwrap();
    let mut opts = Options::new();
    if let Some(l) = &c.kv_lens {
        opts = opts.kv_lens(l);
    }
    let mut out = TensorMut::bshd(&mut full, [b, nq, h, d]).unwrap();
    sdpa::attention_lse(&q, &k_full, &v_full, &mut out, &mut full_lse, &opts).unwrap();
    let full_bounds = sdpa::reference::error_bounds(&q, &k_full, &v_full, &opts).unwrap();

    // Pieces [start, end) of the keys; each is a strided sub-view of K and V.
    let mut edges = vec![0];
    edges.extend(&c.cuts);
    edges.push(nkv);
    let strides = [nkv * hkv * d, hkv * d, d, 1];
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    let mut piece_bounds = Vec::new();
    for w in edges.windows(2) {
        let (start, len) = (w[0], w[1] - w[0]);
        let offset = start * hkv * d;
        fn sub(
            data: &[f32],
            offset: usize,
            dims: [usize; 4],
            strides: [usize; 4],
        ) -> Tensor<'_, f32> {
            let data = if dims[1] == 0 {
                &data[..0]
            } else {
                &data[offset..]
            };
            Tensor::new(data, dims, strides).unwrap()
        }
        let dims = [b, len, hkv, d];
        let (k, v) = (
            sub(&c.k, offset, dims, strides),
            sub(&c.v, offset, dims, strides),
        );
        let lens: Option<Vec<usize>> = c.kv_lens.as_ref().map(|l| {
            l.iter()
                .map(|&x| x.saturating_sub(start).min(len))
                .collect()
        });
        let mut piece_opts = Options::new();
        if let Some(l) = &lens {
            piece_opts = piece_opts.kv_lens(l);
        }
        let mut o = vec![0.0f32; b * nq * h * d];
        let mut l = vec![0.0f32; rows];
        let mut ov = TensorMut::bshd(&mut o, [b, nq, h, d]).unwrap();
        sdpa::attention_lse(&q, &k, &v, &mut ov, &mut l, &piece_opts).unwrap();
        piece_bounds.push(sdpa::reference::error_bounds(&q, &k, &v, &piece_opts).unwrap());
        outs.push(o);
        lses.push(l);
    }
    let parts: Vec<Partial<'_>> = outs
        .iter()
        .zip(&lses)
        .map(|(o, l)| Partial {
            out: Tensor::bshd(o, [b, nq, h, d]).unwrap(),
            lse: l,
        })
        .collect();
    let mut merged = vec![0.0f32; b * nq * h * d];
    let mut merged_lse = vec![0.0f32; rows];
    let mut mv = TensorMut::bshd(&mut merged, [b, nq, h, d]).unwrap();
    merge_partials(&parts, &mut mv, &mut merged_lse).unwrap();

    let v_max = c.v.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    for bb in 0..b {
        for hh in 0..h {
            for i in 0..nq {
                let row = (bb * h + hh) * nq + i;
                let piece_out = piece_bounds.iter().map(|p| p[row].out).fold(0.0, f64::max);
                let piece_lse = piece_bounds.iter().map(|p| p[row].lse).fold(0.0, f64::max);
                let theta = (2.0 * piece_lse).exp_m1();
                let weights = if theta < 1.0 {
                    2.0 * theta / (1.0 - theta)
                } else {
                    2.0
                };
                let tol = piece_out + full_bounds[row].out + v_max * (weights + 4.0 * U);
                if full_lse[row] == f32::NEG_INFINITY {
                    assert_eq!(merged_lse[row], f32::NEG_INFINITY, "row {row}: empty row");
                } else {
                    let lse_tol = piece_lse + full_bounds[row].lse + 4.0 * U;
                    let e = (f64::from(merged_lse[row]) - f64::from(full_lse[row])).abs();
                    assert!(e <= lse_tol, "row {row}: lse off by {e} > {lse_tol}");
                }
                for x in 0..d {
                    let idx = ((bb * nq + i) * h + hh) * d + x;
                    let e = (f64::from(merged[idx]) - f64::from(full[idx])).abs();
                    assert!(
                        e <= tol,
                        "row {row} [{x}]: merged {} vs {} > {tol}",
                        merged[idx],
                        full[idx]
                    );
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(case) = Case::arbitrary(&mut Unstructured::new(data)) {
        run(case);
    }
});
