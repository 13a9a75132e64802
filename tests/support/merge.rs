//! The `merge` check: `merge_partials` against the unsplit result. Random shapes and values,
//! keys split at random points (empty pieces and pieces where a row sees nothing included,
//! through `kv_lens`), each piece computed by the fused `attention_lse` over its key range,
//! merged, and compared with the fused result over all keys.
//!
//! Tolerance, derived from the crate's own per-row bounds (`reference::error_bounds`): with
//! `B_k`, `L_k` the out/lse bounds of piece `k` and `B` that of the whole problem, each merge
//! weight `e^{lse_k − lse}` is off by a factor within `e^{±2·max L_k}` (θ = e^{2·max L_k} − 1),
//! so `|merged − unsplit| ≤ max_k B_k + B + max‖v‖·(2θ/(1−θ) + 4u)`.

use super::bytes::{urange, Writer};
use arbitrary::{Arbitrary, Result, Unstructured};
use sdpa::{merge_partials, Options, Partial, Tensor, TensorMut};

/// Unit roundoff of f32, `2⁻²⁴`.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Most cut points of one case.
pub const MAX_CUTS: usize = 4;
/// Longest key sequence.
pub const MAX_KV: usize = 80;

/// One merge case: sizes, cut points, optional key lengths and every value.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeCase {
    /// `B`, 1–2.
    pub batch: usize,
    /// `H_kv`, 1–2.
    pub kv_heads: usize,
    /// Query heads per kv head, 1–3.
    pub group: usize,
    /// Query rows, 1–9.
    pub n_q: usize,
    /// Keys, 0–[`MAX_KV`].
    pub n_kv: usize,
    /// Head size (`d_k = d_v`), 1–9.
    pub d: usize,
    /// Cut points in `0..=n_kv`, sorted.
    pub cuts: Vec<usize>,
    /// Per-batch key lengths in `0..=n_kv`.
    pub kv_lens: Option<Vec<usize>>,
    /// Q, K and V in logical BSHD order: multiples of 1/16 in [−4, 4].
    pub q: Vec<f32>,
    /// K.
    pub k: Vec<f32>,
    /// V.
    pub v: Vec<f32>,
}

fn value(u: &mut Unstructured<'_>) -> Result<f32> {
    Ok((urange(u, 0, 128)? as f32 - 64.0) / 16.0)
}

fn write_value(w: &mut Writer, x: f32) {
    let raw = x * 16.0 + 64.0;
    assert!(
        raw.fract() == 0.0 && (0.0..=128.0).contains(&raw),
        "{x} is not a merge value"
    );
    w.urange(raw as usize, 0, 128);
}

impl MergeCase {
    /// Query heads.
    pub fn heads(&self) -> usize {
        self.kv_heads * self.group
    }

    /// A case whose values are `f(operand, index)` (0: Q, 1: K, 2: V; rounded to 1/16).
    pub fn from_fn(
        sizes: [usize; 6],
        cuts: &[usize],
        kv_lens: Option<Vec<usize>>,
        f: impl Fn(usize, usize) -> f32,
    ) -> MergeCase {
        let [batch, kv_heads, group, n_q, n_kv, d] = sizes;
        let h = kv_heads * group;
        let vals = |op: usize, n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((f(op, i) * 16.0).round() / 16.0).clamp(-4.0, 4.0))
                .collect()
        };
        let mut cuts = cuts.to_vec();
        cuts.sort_unstable();
        MergeCase {
            batch,
            kv_heads,
            group,
            n_q,
            n_kv,
            d,
            cuts,
            kv_lens,
            q: vals(0, batch * n_q * h * d),
            k: vals(1, batch * n_kv * kv_heads * d),
            v: vals(2, batch * n_kv * kv_heads * d),
        }
    }

    /// Reads a case.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<MergeCase> {
        let batch = urange(u, 1, 2)?;
        let kv_heads = urange(u, 1, 2)?;
        let group = urange(u, 1, 3)?;
        let n_q = urange(u, 1, 9)?;
        let n_kv = urange(u, 0, MAX_KV)?;
        let d = urange(u, 1, 9)?;
        let n_cuts = urange(u, 0, MAX_CUTS)?;
        let mut cuts: Vec<usize> = (0..n_cuts)
            .map(|_| urange(u, 0, n_kv))
            .collect::<Result<_>>()?;
        cuts.sort_unstable();
        let kv_lens = if urange(u, 0, 1)? == 1 {
            Some(
                (0..batch)
                    .map(|_| urange(u, 0, n_kv))
                    .collect::<Result<_>>()?,
            )
        } else {
            None
        };
        let h = kv_heads * group;
        let mut vals = |n: usize| (0..n).map(|_| value(u)).collect::<Result<Vec<f32>>>();
        let q = vals(batch * n_q * h * d)?;
        let k = vals(batch * n_kv * kv_heads * d)?;
        let v = vals(batch * n_kv * kv_heads * d)?;
        Ok(MergeCase {
            batch,
            kv_heads,
            group,
            n_q,
            n_kv,
            d,
            cuts,
            kv_lens,
            q,
            k,
            v,
        })
    }

    /// Inverse of [`MergeCase::decode`] (cuts must be sorted).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.urange(self.batch, 1, 2)
            .urange(self.kv_heads, 1, 2)
            .urange(self.group, 1, 3)
            .urange(self.n_q, 1, 9)
            .urange(self.n_kv, 0, MAX_KV)
            .urange(self.d, 1, 9)
            .urange(self.cuts.len(), 0, MAX_CUTS);
        assert!(self.cuts.is_sorted(), "cuts must be sorted");
        for &c in &self.cuts {
            w.urange(c, 0, self.n_kv);
        }
        match &self.kv_lens {
            None => {
                w.urange(0, 0, 1);
            }
            Some(lens) => {
                assert_eq!(lens.len(), self.batch);
                w.urange(1, 0, 1);
                for &l in lens {
                    w.urange(l, 0, self.n_kv);
                }
            }
        }
        for &x in self.q.iter().chain(&self.k).chain(&self.v) {
            write_value(&mut w, x);
        }
        w.bytes
    }
}

impl<'a> Arbitrary<'a> for MergeCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        MergeCase::decode(u)
    }
}

/// A piece `[start, start + len)` of the keys of a BSHD `[b, n_kv, hkv, d]` buffer, as a
/// strided sub-view.
fn piece<'a>(data: &'a [f32], start: usize, dims: [usize; 4], n_kv: usize) -> Tensor<'a, f32> {
    let [_, len, hkv, d] = dims;
    let strides = [n_kv * hkv * d, hkv * d, d, 1];
    let data = if len == 0 {
        &data[..0]
    } else {
        &data[start * hkv * d..]
    };
    Tensor::new(data, dims, strides).expect("a piece of the keys")
}

/// Runs and checks one case; panics with a description on any violation. Returns the number of
/// pieces merged.
pub fn check(c: &MergeCase) -> usize {
    let (b, hkv, nq, nkv, d) = (c.batch, c.kv_heads, c.n_q, c.n_kv, c.d);
    let h = c.heads();
    let q = Tensor::bshd(&c.q, [b, nq, h, d]).expect("q");
    let rows = b * h * nq;
    let mut full = vec![0.0f32; b * nq * h * d];
    let mut full_lse = vec![0.0f32; rows];
    let k_full = Tensor::bshd(&c.k, [b, nkv, hkv, d]).expect("k");
    let v_full = Tensor::bshd(&c.v, [b, nkv, hkv, d]).expect("v");
    let mut opts = Options::new();
    if let Some(l) = &c.kv_lens {
        opts = opts.kv_lens(l);
    }
    let mut out = TensorMut::bshd(&mut full, [b, nq, h, d]).expect("out");
    sdpa::attention_lse(&q, &k_full, &v_full, &mut out, &mut full_lse, &opts)
        .expect("unsplit attention");
    let full_bounds =
        sdpa::reference::error_bounds(&q, &k_full, &v_full, &opts).expect("unsplit bounds");

    let mut edges = vec![0];
    edges.extend(&c.cuts);
    edges.push(nkv);
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    let mut piece_bounds = Vec::new();
    for w in edges.windows(2) {
        let (start, len) = (w[0], w[1] - w[0]);
        let dims = [b, len, hkv, d];
        let (k, v) = (piece(&c.k, start, dims, nkv), piece(&c.v, start, dims, nkv));
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
        let mut ov = TensorMut::bshd(&mut o, [b, nq, h, d]).expect("piece out");
        sdpa::attention_lse(&q, &k, &v, &mut ov, &mut l, &piece_opts).expect("piece attention");
        piece_bounds
            .push(sdpa::reference::error_bounds(&q, &k, &v, &piece_opts).expect("piece bounds"));
        outs.push(o);
        lses.push(l);
    }
    let parts: Vec<Partial<'_>> = outs
        .iter()
        .zip(&lses)
        .map(|(o, l)| Partial {
            out: Tensor::bshd(o, [b, nq, h, d]).expect("partial"),
            lse: l,
        })
        .collect();
    let mut merged = vec![0.0f32; b * nq * h * d];
    let mut merged_lse = vec![0.0f32; rows];
    let mut mv = TensorMut::bshd(&mut merged, [b, nq, h, d]).expect("merged");
    merge_partials(&parts, &mut mv, &mut merged_lse).expect("merge_partials");

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
    parts.len()
}
