//! The differential grid: random combinations of every option, on random shapes and layouts,
//! the fused kernel against the f64 reference within `reference::error_bounds` (see
//! [`super::check`]: per-row bounds, rows with no visible key exactly 0 / −∞).

use super::{check, rng, Buffer, Layout};
use crate::support::differential::Shape;
use crate::support::harness::{assert_typed_close_to_reference, Elem, Types};
pub use crate::support::opts::Mix;
use crate::support::opts::{OptData, OptSpec};
use crate::support::values::SplitMix;
use rand::rngs::StdRng;
use rand::Rng;
use sdpa::{Alignment, Options};

/// One random call: shapes, operands and the options (drawn by the one generator,
/// `support::opts::OptSpec::random`, with their data).
pub struct Case {
    pub label: String,
    pub shape: Shape,
    pub q: Buffer<f32>,
    pub k: Buffer<f32>,
    pub v: Buffer<f32>,
    pub out_layout: Layout,
    pub opts: OptData,
    /// Element types of Q, K/V and the output (the f32 operands are rounded to them).
    pub types: Types,
}

/// `buf` (a bias or mask whose dims are full, of size 1, or full with stride 0) moved into a
/// random layout, padding `pad`, keeping its stride-0 dims.
fn relayout<T: Copy>(rng: &mut StdRng, buf: &Buffer<T>, pad: T) -> Buffer<T> {
    let stored: [usize; 4] =
        std::array::from_fn(|a| if buf.strides[a] == 0 { 1 } else { buf.dims[a] });
    let layout = if rng.random_bool(0.5) {
        Layout::BSHD
    } else {
        Layout::random(rng)
    };
    let mut out = Buffer::from_fn(stored, layout, pad, |i| buf.at(i));
    for a in 0..4 {
        if buf.strides[a] == 0 {
            out.dims[a] = buf.dims[a];
            out.strides[a] = 0;
        }
    }
    out
}

fn pick<T: Copy>(rng: &mut StdRng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

impl Case {
    /// A random case of the given sizes.
    pub fn random(rng: &mut StdRng, shape: Shape, mix: Mix, label: String) -> Case {
        let Shape {
            batch: b,
            heads: h,
            kv_heads: hkv,
            n_q: nq,
            n_kv: nkv,
            d_k: dk,
            d_v: dv,
        } = shape;
        let q_range = pick(rng, &[0.5f32, 1.0, 3.0]);
        let layouts: [Layout; 4] = std::array::from_fn(|_| Layout::random(rng));
        let q = Buffer::uniform(rng, [b, nq, h, dk], layouts[0], -q_range, q_range);
        let k = Buffer::uniform(rng, [b, nkv, hkv, dk], layouts[1], -1.0, 1.0);
        let v = Buffer::uniform(rng, [b, nkv, hkv, dv], layouts[2], -1.0, 1.0);
        let mut draws = SplitMix(rng.random());
        let spec = OptSpec::random(&mut draws, &mix);
        let types = Types::random(&mut draws);
        let mut opts = spec.materialize(b, nq, h, nkv);
        opts.bias = opts.bias.map(|t| relayout(rng, &t, f32::NAN));
        opts.mask = opts.mask.map(|t| relayout(rng, &t, false));
        Case {
            label,
            shape,
            q,
            k,
            v,
            out_layout: layouts[3],
            opts,
            types,
        }
    }

    pub fn opts(&self) -> Options<'_> {
        self.opts.options()
    }

    /// A one-line description of the case, for failure messages.
    pub fn describe(&self) -> String {
        format!("{} {:?} {:?}", self.label, self.shape, self.opts.spec)
    }

    pub fn check(&self) -> super::Checked {
        assert_typed_close_to_reference(
            self.types,
            &self.q,
            &self.k,
            &self.v,
            self.out_layout,
            &self.opts(),
            &self.describe(),
        )
    }
}

/// Random sizes: GQA ratios 1/2/4/8 (and MQA: one kv head), cross-attention both ways,
/// d_k ≠ d_v, head sizes 1 … 256; shrunk until the f64 reference stays cheap.
fn random_shape(rng: &mut StdRng) -> Shape {
    let b = pick(rng, &[1, 1, 2, 3]);
    let hkv = pick(rng, &[1, 1, 2, 3]);
    let h = hkv * pick(rng, &[1, 2, 4, 8]);
    let dk = pick(rng, &[1, 2, 8, 17, 32, 64, 80, 128, 256]);
    let dv = if rng.random_bool(0.5) {
        dk
    } else {
        pick(rng, &[1, 5, 16, 33, 64, 80, 128])
    };
    let ns: [usize; 12] = [1, 2, 3, 7, 16, 31, 48, 97, 130, 193, 256, 300];
    let mut nq = pick(rng, &ns);
    let mut nkv = pick(rng, &ns);
    // Budget for the reference and the bounds: ~8M multiply-adds each.
    while b * h * nq * nkv * (dk + dv) > 8_000_000 {
        if nq >= nkv {
            nq = nq.div_ceil(2);
        } else {
            nkv = nkv.div_ceil(2);
        }
    }
    Shape::new(b, h, hkv, nq, nkv, dk, dv)
}

#[test]
fn random_option_combinations_match_the_reference() {
    let mut rng = rng(0x7a41_2024);
    let cases = 200;
    let mut worst = 0.0f64;
    let mut empty = 0;
    let mut rows = 0;
    let mut cross = [0, 0];
    let mut typed = 0;
    let mut quantized = 0;
    for case in 0..cases {
        let shape = random_shape(&mut rng);
        // Every 8th case uses every option at once.
        let mix = if case % 8 == 0 { Mix::ALL } else { Mix::SOME };
        let c = Case::random(&mut rng, shape, mix, format!("case {case}"));
        let r = c.check();
        typed += usize::from(c.types != Types::F32);
        quantized += usize::from(c.types.kv == Elem::I8);
        worst = worst.max(r.worst_ratio);
        empty += r.empty_rows;
        rows += r.bounds.len();
        cross[0] += usize::from(shape.n_q < shape.n_kv);
        cross[1] += usize::from(shape.n_q > shape.n_kv);
    }
    eprintln!(
        "{cases} cases: worst error/bound {worst:.3e}, {empty} of {rows} rows empty, \
         cross {cross:?}, {typed} with f16/bf16/i8 operands or output ({quantized} i8 K/V)"
    );
    assert!(typed > 50, "only {typed} cases with other element types");
    assert!(quantized > 10, "only {quantized} cases with i8 K/V");
    // The grid did reach the interesting corners, and most rows do see keys.
    assert!(
        empty > 0 && empty * 2 < rows,
        "{empty} of {rows} rows without visible keys"
    );
    assert!(
        cross[0] > 10 && cross[1] > 10,
        "cross-attention both ways: {cross:?}"
    );
}

/// Decode: a few query rows against a long KV cache with few kv heads, which the fused kernel
/// splits into key ranges (split-KV) and merges; random options on top.
#[test]
fn decode_shapes_with_split_kv_match_the_reference() {
    let mut rng = rng(0xdec0de);
    // Shape::new(batch, heads, kv_heads, n_q, n_kv, d_k, d_v)
    let shapes: [Shape; 8] = [
        Shape::new(1, 8, 1, 1, 4096, 128, 128),
        Shape::new(1, 8, 2, 1, 8192 + 5, 64, 64),
        Shape::new(1, 4, 1, 4, 5000, 64, 80),
        Shape::new(2, 2, 1, 3, 4133, 17, 33),
        Shape::new(1, 32, 8, 1, 4096, 64, 64),
        Shape::new(1, 1, 1, 2, 9000, 80, 16),
        Shape::new(2, 4, 2, 1, 4100, 128, 64),
        Shape::new(1, 2, 2, 4, 6000, 256, 128),
    ];
    let mut worst = 0.0f64;
    for (n, shape) in shapes.into_iter().enumerate() {
        for rep in 0..2 {
            let mix = if rep == 0 { Mix::SOME } else { Mix::ALL };
            let c = Case::random(&mut rng, shape, mix, format!("decode {n}.{rep}"));
            worst = worst.max(c.check().worst_ratio);
        }
    }
    eprintln!("decode: worst error/bound {worst:.3e}");
}

/// Split points of the fused kernel for a decode shape, to aim keys at them. This restates
/// `Blocking::kv_splits` (32 work units, at least 1024 keys per split); if that changes the
/// test still checks the same keys, only less pointedly.
fn splits(batch: usize, kv_heads: usize, n_kv: usize) -> usize {
    (32 / (batch * kv_heads)).min(n_kv / 1024).max(1)
}

/// "Every key matters": the error bound grows with n_kv, so a dropped key could hide inside it.
/// Here one key at a time gets a score ~20 above the rest and a distinctive value, so that it
/// carries > 90% of the weight of every row that sees it (checked on the reference), and the
/// fused result must still be within the bound: dropping or double-counting that key would miss
/// by ~8 against a bound of ~1e-2. The keys sit on block and split boundaries.
#[test]
fn every_key_matters_on_block_and_split_boundaries() {
    let mut rng = rng(0xe4e7);
    // Shape::new(batch, heads, kv_heads, n_q, n_kv, d_k, d_v)
    let shapes: [Shape; 3] = [
        Shape::new(1, 4, 1, 1, 8192 + 5, 64, 64),
        Shape::new(1, 2, 2, 3, 4100, 128, 80),
        Shape::new(2, 4, 1, 2, 4500, 32, 32),
    ];
    const V_BIG: f32 = 8.0;
    for shape in shapes {
        let Shape {
            batch: b,
            heads: h,
            kv_heads: hkv,
            n_q: nq,
            n_kv: nkv,
            d_k: dk,
            d_v: dv,
        } = shape;
        let s = splits(b, hkv, nkv);
        let chunk = nkv.div_ceil(s);
        let mut keys = vec![
            0,
            1,
            167,
            168,
            191,
            192,
            1023,
            1024,
            2047,
            2048,
            nkv - 2,
            nkv - 1,
        ];
        for m in 1..s {
            keys.extend([m * chunk - 1, m * chunk, m * chunk + 1]);
        }
        keys.sort_unstable();
        keys.dedup();
        keys.retain(|&j| j < nkv);

        // Queries positive, so that a key of all-`boost` entries scores
        // ≥ 0.5 · d · boost / √d = 20 (default scale) while the others stay near 0.
        let q = Buffer::uniform(&mut rng, [b, nq, h, dk], Layout::BSHD, 0.5, 1.0);
        let k0 = Buffer::uniform(&mut rng, [b, nkv, hkv, dk], Layout::BHSD, -1.0, 1.0);
        let v0 = Buffer::uniform(&mut rng, [b, nkv, hkv, dv], Layout::BSHD, -1.0, 1.0);
        let boost = 40.0 / (dk as f32).sqrt();
        for (n, &j) in keys.iter().enumerate() {
            let (mut k, mut v) = (k0.clone(), v0.clone());
            for bb in 0..b {
                for hk in 0..hkv {
                    for c in 0..dk {
                        k.set([bb, j, hk, c], boost);
                    }
                    for c in 0..dv {
                        v.set([bb, j, hk, c], V_BIG + (c % 3) as f32);
                    }
                }
            }
            let causal = n % 2 == 1;
            let opts = if causal {
                Options::new().causal(Alignment::BottomRight)
            } else {
                Options::new()
            };
            let label = format!("{shape:?} key {j} causal={causal} splits={s}");
            let r = check(&label, &q.view(), &k.view(), &v.view(), &opts, Layout::BSHD);
            // The test has teeth: every row that sees key j puts > 90% of its weight on it.
            let mut seen = 0;
            for bb in 0..b {
                for i in 0..nq {
                    if causal && j > i + nkv - nq {
                        continue;
                    }
                    seen += 1;
                    for hh in 0..h {
                        let row = r.reference.row(bb, i, hh);
                        for (c, &x) in row.iter().enumerate() {
                            let want = V_BIG + (c % 3) as f32;
                            assert!((x - want).abs() < 0.1 * want, "{label}: weak key: {x}");
                        }
                        let bound = r.bounds[(bb * h + hh) * nq + i].out;
                        assert!(
                            bound < 0.1,
                            "{label}: bound {bound} too loose to see the key"
                        );
                    }
                }
            }
            assert!(seen > 0, "{label}: no row sees the key");
        }
    }
}
