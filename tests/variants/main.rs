//! Tests of the attention variants: sliding window, per-sequence key lengths, bias, boolean
//! mask, ALiBi, softcap, attention sinks, `merge_partials`, and block skipping.
//!
//! * [`hand`]: one small case per feature with the expected numbers worked out by hand (d = 1
//!   and scale 1, so a score is just `q·k`), for both the fused kernel and the reference.
//! * [`grid`]: random combinations of every option on random shapes and layouts, the fused
//!   kernel against the f64 reference within `reference::error_bounds`, including decode shapes
//!   that take the split-KV path and an "every key matters" check on block/split boundaries.
//! * [`errors`]: every invalid option is a typed error, never a panic.
//! * [`merge`]: `merge_partials` over keys split at random points, against the unsplit problem.
//! * [`tiles`]: the `count_score_tiles` hook shows masked key blocks are skipped.
//!
//! Every random test names its seed. The helpers below are this test's own (the shared
//! `tests/common` is written concurrently by someone else).

#[path = "../support/mod.rs"]
mod support;

mod errors;
mod grid;
mod hand;
mod merge;
mod tiles;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sdpa::reference::{self, ErrorBound};
use sdpa::{Error, Options, Tensor, TensorMut};

/// Unit roundoff of f32, `2⁻²⁴`.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Bits written to the padding of output buffers (a quiet NaN with a payload): compared
/// bitwise after every call, nothing outside the output view may be written.
pub const OUT_PAD_BITS: u32 = 0x7fc1_2345;
/// Bits of every logical output element before a call: a forgotten element shows up as NaN.
pub const OUT_INIT_BITS: u32 = 0x7fc0_beef;

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// How a `[batch, seq, heads, dim]` tensor is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Contiguous batch, seq, heads, dim.
    Bshd,
    /// Contiguous batch, heads, seq, dim.
    Bhsd,
    /// Dims stored in `order` (outermost first), the innermost at stride `step`, every further
    /// level `pad` elements wider than needed, the view starting `offset` elements in.
    Padded {
        order: [usize; 4],
        step: usize,
        pad: usize,
        offset: usize,
    },
}

impl Layout {
    /// Strides, offset of the first element, and the buffer length.
    pub fn plan(self, dims: [usize; 4]) -> ([usize; 4], usize, usize) {
        let (order, step, pad, offset) = match self {
            Layout::Bshd => ([0, 1, 2, 3], 1, 0, 0),
            Layout::Bhsd => ([0, 2, 1, 3], 1, 0, 0),
            Layout::Padded {
                order,
                step,
                pad,
                offset,
            } => (order, step, pad, offset),
        };
        let mut strides = [0; 4];
        let mut next = step;
        for &axis in order.iter().rev() {
            strides[axis] = next;
            next = next * dims[axis].max(1) + pad;
        }
        let reach = if dims.contains(&0) {
            0
        } else {
            1 + (0..4).map(|a| (dims[a] - 1) * strides[a]).sum::<usize>()
        };
        (strides, offset, offset + reach.max(next))
    }

    /// A random layout: BSHD, BHSD, or a padded (possibly seq-major) one.
    pub fn random(rng: &mut StdRng) -> Self {
        match rng.random_range(0..4) {
            0 => Layout::Bshd,
            1 => Layout::Bhsd,
            _ => {
                let orders = [[0, 1, 2, 3], [0, 2, 1, 3], [1, 0, 2, 3], [2, 0, 1, 3]];
                Layout::Padded {
                    order: orders[rng.random_range(0..orders.len())],
                    step: rng.random_range(1..=2),
                    pad: rng.random_range(0..=3),
                    offset: rng.random_range(0..=5),
                }
            }
        }
    }
}

/// An owned tensor laid out by a [`Layout`].
#[derive(Clone, Debug)]
pub struct Buf<T> {
    pub data: Vec<T>,
    pub offset: usize,
    pub dims: [usize; 4],
    pub strides: [usize; 4],
}

impl<T: Copy> Buf<T> {
    /// Logical element `idx` is `f(idx)`; elements outside the view are `pad`.
    pub fn from_fn(
        dims: [usize; 4],
        layout: Layout,
        pad: T,
        mut f: impl FnMut([usize; 4]) -> T,
    ) -> Self {
        let (strides, offset, len) = layout.plan(dims);
        let mut buf = Buf {
            data: vec![pad; len],
            offset,
            dims,
            strides,
        };
        for_each_index(dims, |idx| {
            let x = f(idx);
            buf.set(idx, x);
        });
        buf
    }

    /// Contiguous BSHD from values in logical order.
    pub fn bshd(dims: [usize; 4], values: &[T]) -> Self {
        assert_eq!(values.len(), dims.iter().product::<usize>());
        Buf {
            data: values.to_vec(),
            offset: 0,
            dims,
            strides: Layout::Bshd.plan(dims).0,
        }
    }

    pub fn pos(&self, idx: [usize; 4]) -> usize {
        self.offset + (0..4).map(|a| idx[a] * self.strides[a]).sum::<usize>()
    }

    pub fn at(&self, idx: [usize; 4]) -> T {
        self.data[self.pos(idx)]
    }

    /// Element `idx` of the view broadcast to a larger shape (dims of size 1 repeat).
    pub fn at_broadcast(&self, idx: [usize; 4]) -> T {
        self.at(std::array::from_fn(|a| {
            if self.dims[a] == 1 {
                0
            } else {
                idx[a]
            }
        }))
    }

    pub fn set(&mut self, idx: [usize; 4], x: T) {
        let p = self.pos(idx);
        self.data[p] = x;
    }

    pub fn view(&self) -> Tensor<'_, T> {
        Tensor::new(&self.data[self.offset..], self.dims, self.strides).expect("valid view")
    }

    /// The elements in logical BSHD order.
    pub fn logical(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.dims.iter().product());
        for_each_index(self.dims, |idx| v.push(self.at(idx)));
        v
    }
}

impl Buf<f32> {
    /// Uniform in `[lo, hi)`, NaN padding (a kernel reading outside the view gets NaN).
    pub fn random(rng: &mut StdRng, dims: [usize; 4], layout: Layout, lo: f32, hi: f32) -> Self {
        Self::from_fn(dims, layout, f32::NAN, |_| rng.random_range(lo..hi))
    }

    pub fn view_mut(&mut self) -> TensorMut<'_, f32> {
        TensorMut::new(&mut self.data[self.offset..], self.dims, self.strides).expect("valid view")
    }

    /// Largest magnitude of the logical elements.
    pub fn max_abs(&self) -> f64 {
        self.logical()
            .iter()
            .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()))
    }
}

pub fn for_each_index(dims: [usize; 4], mut f: impl FnMut([usize; 4])) {
    for a in 0..dims[0] {
        for b in 0..dims[1] {
            for c in 0..dims[2] {
                for d in 0..dims[3] {
                    f([a, b, c, d]);
                }
            }
        }
    }
}

/// Which implementation to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Fused,
    Reference,
}

/// Output (logical BSHD order, `[b][i][h][c]`) and LSE (`[b][h][i]`) of one call.
#[derive(Clone, Debug)]
pub struct Run {
    pub dims: [usize; 4],
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

impl Run {
    pub fn row(&self, b: usize, i: usize, h: usize) -> &[f32] {
        let [_, n_q, heads, d_v] = self.dims;
        let start = ((b * n_q + i) * heads + h) * d_v;
        &self.out[start..start + d_v]
    }

    pub fn lse_at(&self, b: usize, i: usize, h: usize) -> f32 {
        let [_, n_q, heads, _] = self.dims;
        self.lse[(b * heads + h) * n_q + i]
    }
}

/// Runs `path` with LSE into an output laid out by `out_layout`, checks that no padding element
/// of the output was written and that every logical element and LSE was.
pub fn run(
    path: Path,
    q: &Tensor<'_, f32>,
    k: &Tensor<'_, f32>,
    v: &Tensor<'_, f32>,
    opts: &Options<'_>,
    out_layout: Layout,
) -> Result<Run, Error> {
    let [batch, n_q, heads, _] = q.dims();
    let dims = [batch, n_q, heads, v.dims()[3]];
    let mut out = Buf::from_fn(dims, out_layout, f32::from_bits(OUT_PAD_BITS), |_| {
        f32::from_bits(OUT_INIT_BITS)
    });
    let mut lse = vec![f32::from_bits(OUT_INIT_BITS); batch * heads * n_q];
    match path {
        Path::Fused => sdpa::attention_lse(q, k, v, &mut out.view_mut(), &mut lse, opts)?,
        Path::Reference => reference::attention_lse(q, k, v, &mut out.view_mut(), &mut lse, opts)?,
    }
    let mut reached = vec![false; out.data.len()];
    for_each_index(dims, |idx| reached[out.pos(idx)] = true);
    for (p, (&x, &r)) in out.data.iter().zip(&reached).enumerate() {
        assert!(
            r || x.to_bits() == OUT_PAD_BITS,
            "{path:?}: padding element {p} of the output was written"
        );
    }
    let out = out.logical();
    for x in out.iter().chain(&lse) {
        assert_ne!(
            x.to_bits(),
            OUT_INIT_BITS,
            "{path:?}: an output was not written"
        );
    }
    Ok(Run { dims, out, lse })
}

/// What [`check`] saw.
pub struct Checked {
    pub fused: Run,
    pub reference: Run,
    pub bounds: Vec<ErrorBound>,
    /// Largest error / bound over all outputs and LSEs.
    pub worst: f64,
    /// Rows with no visible key (reference LSE −∞).
    pub empty_rows: usize,
}

/// The differential check: the fused kernel against the f64 reference, every output element
/// within its row's `error_bounds().out` and every LSE within `.lse`; rows whose reference LSE
/// is −∞ must be exactly 0 with LSE exactly −∞ in both. `attention` (no LSE) must write bitwise
/// the same output as `attention_lse`.
pub fn check(
    label: &str,
    q: &Tensor<'_, f32>,
    k: &Tensor<'_, f32>,
    v: &Tensor<'_, f32>,
    opts: &Options<'_>,
    out_layout: Layout,
) -> Checked {
    let fused = run(Path::Fused, q, k, v, opts, out_layout)
        .unwrap_or_else(|e| panic!("{label}: fused rejected a valid call: {e}"));
    let refr = run(Path::Reference, q, k, v, opts, out_layout)
        .unwrap_or_else(|e| panic!("{label}: reference rejected a valid call: {e}"));
    let bounds = reference::error_bounds(q, k, v, opts).expect("bounds of a valid call");

    let mut plain = vec![f32::from_bits(OUT_INIT_BITS); fused.out.len()];
    sdpa::attention(
        q,
        k,
        v,
        &mut TensorMut::bshd(&mut plain, fused.dims).unwrap(),
        opts,
    )
    .unwrap();
    assert!(
        plain
            .iter()
            .zip(&fused.out)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{label}: attention and attention_lse differ"
    );

    let [batch, n_q, heads, d_v] = fused.dims;
    assert_eq!(bounds.len(), batch * heads * n_q);
    let mut worst = 0.0f64;
    let mut empty_rows = 0;
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let bound = bounds[(b * heads + h) * n_q + i];
                let (lf, lr) = (fused.lse_at(b, i, h), refr.lse_at(b, i, h));
                let (of, or) = (fused.row(b, i, h), refr.row(b, i, h));
                let at = format!("{label}: b={b} h={h} i={i}");
                if lr == f32::NEG_INFINITY {
                    empty_rows += 1;
                    assert_eq!(lf, f32::NEG_INFINITY, "{at}: fused lse of an empty row");
                    assert!(
                        of.iter().chain(or).all(|&x| x == 0.0),
                        "{at}: empty row not exactly 0: fused {of:?} reference {or:?}"
                    );
                    continue;
                }
                assert!(lr.is_finite(), "{at}: reference lse {lr}");
                let e = (f64::from(lf) - f64::from(lr)).abs();
                assert!(
                    e <= bound.lse,
                    "{at}: lse fused {lf} reference {lr}, error {e:e} > bound {:e}",
                    bound.lse
                );
                worst = worst.max(ratio(e, bound.lse));
                for c in 0..d_v {
                    let e = (f64::from(of[c]) - f64::from(or[c])).abs();
                    assert!(
                        e <= bound.out,
                        "{at} c={c}: out fused {} reference {}, error {e:e} > bound {:e}",
                        of[c],
                        or[c],
                        bound.out
                    );
                    worst = worst.max(ratio(e, bound.out));
                }
            }
        }
    }
    Checked {
        fused,
        reference: refr,
        bounds,
        worst,
        empty_rows,
    }
}

pub fn ratio(err: f64, bound: f64) -> f64 {
    if err == 0.0 {
        0.0
    } else {
        err / bound
    }
}
