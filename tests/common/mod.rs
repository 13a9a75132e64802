//! Helpers shared by the integration tests: deterministic random tensors, a builder for
//! contiguous, padded and strided views, runners for the fused kernel and the f64 reference,
//! and [`assert_close_to_reference`], the differential check every accuracy test uses.
//!
//! Each test binary compiles this module on its own and uses a subset of it.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sdpa::reference::{self, ErrorBound};
use sdpa::{Options, Tensor, TensorMut};

/// A deterministic generator: every test names its seed.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// What padding elements of *input* buffers hold: NaN, so that a kernel reading outside the
/// view poisons its result and fails the comparison.
pub const INPUT_PAD: f32 = f32::NAN;
/// Bits of the padding elements of *output* buffers (a quiet NaN with a recognizable payload),
/// compared bitwise after the call: nothing outside the view may be written.
pub const OUTPUT_PAD_BITS: u32 = 0x7fc5_a5a5;
/// Bits every logical output element (and LSE slot) holds before a call, so that an element the
/// kernel forgets to write shows up as a NaN.
pub const OUTPUT_INIT_BITS: u32 = 0x7fc0_dead;

/// `γ_n = n·u / (1 − n·u)` with `u = 2⁻²⁴`: the relative error bound of an n-term f32 sum
/// (Higham, §3.1).
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * f64::from(f32::EPSILON) / 2.0;
    assert!(nu < 1.0);
    nu / (1.0 - nu)
}

/// Problem sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
}

impl Shape {
    /// Batch 1, one head, `d_k = d_v = d`.
    pub fn simple(n_q: usize, n_kv: usize, d: usize) -> Self {
        Shape {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            n_q,
            n_kv,
            d_k: d,
            d_v: d,
        }
    }
    pub fn q_dims(&self) -> [usize; 4] {
        [self.batch, self.n_q, self.heads, self.d_k]
    }
    pub fn k_dims(&self) -> [usize; 4] {
        [self.batch, self.n_kv, self.kv_heads, self.d_k]
    }
    pub fn v_dims(&self) -> [usize; 4] {
        [self.batch, self.n_kv, self.kv_heads, self.d_v]
    }
    pub fn out_dims(&self) -> [usize; 4] {
        [self.batch, self.n_q, self.heads, self.d_v]
    }
    /// Rough cost of the reference plus `error_bounds` (f64 multiply-adds).
    pub fn reference_cost(&self) -> usize {
        self.batch * self.heads * self.n_q.max(1) * self.n_kv.max(1) * 2 * (self.d_k + self.d_v)
    }
}

/// How a `[batch, seq, heads, dim]` tensor is laid out in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Contiguous batch, seq, heads, dim (FlashAttention, KV caches).
    Bshd,
    /// Contiguous batch, heads, seq, dim (PyTorch).
    Bhsd,
    /// Logical dims stored in `order` (outermost first): the innermost one at stride `step`,
    /// each further level `pad` elements wider than it needs, the view starting `offset`
    /// elements into the buffer. Every element the view does not reach is padding.
    Strided {
        order: [usize; 4],
        step: usize,
        pad: usize,
        offset: usize,
    },
}

impl Layout {
    /// Storage order batch, seq, heads, dim.
    pub const BSHD_ORDER: [usize; 4] = [0, 1, 2, 3];
    /// Storage order batch, heads, seq, dim.
    pub const BHSD_ORDER: [usize; 4] = [0, 2, 1, 3];
    /// Storage order seq, batch, heads, dim ("time-major").
    pub const SBHD_ORDER: [usize; 4] = [1, 0, 2, 3];

    /// BSHD with every row and level padded, head-size elements `step` apart.
    pub fn padded_bshd(step: usize, pad: usize) -> Self {
        Layout::Strided {
            order: Self::BSHD_ORDER,
            step,
            pad,
            offset: 5,
        }
    }

    /// BHSD with every row and level padded, head-size elements `step` apart.
    pub fn padded_bhsd(step: usize, pad: usize) -> Self {
        Layout::Strided {
            order: Self::BHSD_ORDER,
            step,
            pad,
            offset: 3,
        }
    }

    /// Element strides for `dims`, and the buffer length (offset and padding included).
    pub fn strides(self, dims: [usize; 4]) -> ([usize; 4], usize) {
        let (order, step, pad, offset) = match self {
            Layout::Bshd => (Self::BSHD_ORDER, 1, 0, 0),
            Layout::Bhsd => (Self::BHSD_ORDER, 1, 0, 0),
            Layout::Strided {
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
            // A zero dim still gets a level of its own, so that the strides of an empty view
            // stay distinct (zero strides would make an empty output view "overlapping").
            next = next * dims[axis].max(1) + pad;
        }
        let reach = if dims.contains(&0) {
            0
        } else {
            1 + dims
                .iter()
                .zip(&strides)
                .map(|(n, s)| (n - 1) * s)
                .sum::<usize>()
        };
        (strides, offset + reach.max(next))
    }

    /// The element offset of the view's first element in the buffer.
    pub fn offset(self) -> usize {
        match self {
            Layout::Strided { offset, .. } => offset,
            _ => 0,
        }
    }
}

/// Calls `f` on every logical index of `dims`, in BSHD order.
pub fn for_each_index(dims: [usize; 4], mut f: impl FnMut([usize; 4])) {
    for b in 0..dims[0] {
        for s in 0..dims[1] {
            for h in 0..dims[2] {
                for d in 0..dims[3] {
                    f([b, s, h, d]);
                }
            }
        }
    }
}

/// A tensor in an owned buffer, laid out by a [`Layout`].
#[derive(Clone, Debug)]
pub struct Buf {
    pub data: Vec<f32>,
    pub offset: usize,
    pub dims: [usize; 4],
    pub strides: [usize; 4],
}

impl Buf {
    /// Logical element `[b, s, h, d]` is `f([b, s, h, d])`; padding elements are `pad`.
    pub fn from_fn(
        dims: [usize; 4],
        layout: Layout,
        pad: f32,
        mut f: impl FnMut([usize; 4]) -> f32,
    ) -> Self {
        let (strides, len) = layout.strides(dims);
        let mut buf = Buf {
            data: vec![pad; len],
            offset: layout.offset(),
            dims,
            strides,
        };
        for_each_index(dims, |idx| {
            let x = f(idx);
            buf.set(idx, x);
        });
        buf
    }

    /// Uniform random entries in `[-range, range)`, NaN padding.
    pub fn random(rng: &mut StdRng, dims: [usize; 4], layout: Layout, range: f32) -> Self {
        Self::from_fn(dims, layout, INPUT_PAD, |_| rng.random_range(-range..range))
    }

    /// Entries given in logical BSHD order, NaN padding.
    pub fn from_logical(dims: [usize; 4], layout: Layout, values: &[f32]) -> Self {
        assert_eq!(values.len(), dims.iter().product::<usize>());
        let mut it = values.iter();
        Self::from_fn(dims, layout, INPUT_PAD, |_| *it.next().unwrap())
    }

    /// An output buffer: logical elements hold [`OUTPUT_INIT_BITS`], padding
    /// [`OUTPUT_PAD_BITS`].
    pub fn output(dims: [usize; 4], layout: Layout) -> Self {
        Self::from_fn(dims, layout, f32::from_bits(OUTPUT_PAD_BITS), |_| {
            f32::from_bits(OUTPUT_INIT_BITS)
        })
    }

    /// Buffer position of logical index `idx`.
    pub fn position(&self, idx: [usize; 4]) -> usize {
        self.offset
            + idx
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }

    pub fn at(&self, idx: [usize; 4]) -> f32 {
        self.data[self.position(idx)]
    }

    pub fn set(&mut self, idx: [usize; 4], x: f32) {
        let p = self.position(idx);
        self.data[p] = x;
    }

    pub fn view(&self) -> Tensor<'_, f32> {
        Tensor::new(&self.data[self.offset..], self.dims, self.strides).expect("valid test view")
    }

    pub fn view_mut(&mut self) -> TensorMut<'_, f32> {
        TensorMut::new(&mut self.data[self.offset..], self.dims, self.strides)
            .expect("valid test view")
    }

    /// The logical elements in BSHD order.
    pub fn logical(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.dims.iter().product());
        for_each_index(self.dims, |idx| v.push(self.at(idx)));
        v
    }

    /// Asserts that every element outside the view still holds [`OUTPUT_PAD_BITS`].
    pub fn assert_padding_untouched(&self, what: &str) {
        let mut reached = vec![false; self.data.len()];
        for_each_index(self.dims, |idx| reached[self.position(idx)] = true);
        for (p, (&x, &r)) in self.data.iter().zip(&reached).enumerate() {
            assert!(
                r || x.to_bits() == OUTPUT_PAD_BITS,
                "{what}: padding element {p} outside the view was overwritten with {x}"
            );
        }
    }
}

/// Q, K and V of one call.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
}

impl Inputs {
    /// Uniform random Q in `[-q_range, q_range)`, K and V in `[-1, 1)`, laid out by `layouts`
    /// (Q, K, V).
    pub fn random(shape: Shape, layouts: [Layout; 3], seed: u64, q_range: f32) -> Self {
        let mut r = rng(seed);
        Inputs {
            q: Buf::random(&mut r, shape.q_dims(), layouts[0], q_range),
            k: Buf::random(&mut r, shape.k_dims(), layouts[1], 1.0),
            v: Buf::random(&mut r, shape.v_dims(), layouts[2], 1.0),
        }
    }

    /// Contiguous BSHD random inputs.
    pub fn random_bshd(shape: Shape, seed: u64) -> Self {
        Self::random(shape, [Layout::Bshd; 3], seed, 1.0)
    }
}

/// Output and LSE of one call, output in logical BSHD order, LSE as `[b][h][i]`.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub dims: [usize; 4],
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

impl Outputs {
    /// Output row `(b, i, h)`: `d_v` values.
    pub fn row(&self, b: usize, i: usize, h: usize) -> &[f32] {
        let [_, n_q, heads, d_v] = self.dims;
        let start = ((b * n_q + i) * heads + h) * d_v;
        &self.out[start..start + d_v]
    }

    /// The LSE of row `(b, i, h)`.
    pub fn lse_at(&self, b: usize, i: usize, h: usize) -> f32 {
        let [_, n_q, heads, _] = self.dims;
        self.lse[(b * heads + h) * n_q + i]
    }
}

/// Which implementation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Fused,
    Reference,
}

impl Path {
    pub const BOTH: [Path; 2] = [Path::Fused, Path::Reference];
}

/// Read-only views of Q, K and V (possibly sharing one buffer).
#[derive(Clone, Copy, Debug)]
pub struct Views<'a> {
    pub q: Tensor<'a, f32>,
    pub k: Tensor<'a, f32>,
    pub v: Tensor<'a, f32>,
}

impl Inputs {
    pub fn views(&self) -> Views<'_> {
        Views {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
        }
    }
}

impl Views<'_> {
    /// Output dims `[batch, n_q, heads, d_v]`.
    pub fn out_dims(&self) -> [usize; 4] {
        let [b, n_q, h, _] = self.q.dims();
        [b, n_q, h, self.v.dims()[3]]
    }
}

/// Runs `attention_lse` of `path` into a fresh output laid out by `out_layout`; checks that
/// the padding is untouched.
pub fn run_views(path: Path, x: &Views<'_>, out_layout: Layout, opts: &Options) -> Outputs {
    let out_dims = x.out_dims();
    let [b, n_q, h, _] = out_dims;
    let mut out = Buf::output(out_dims, out_layout);
    let mut lse = vec![f32::from_bits(OUTPUT_INIT_BITS); b * h * n_q];
    match path {
        Path::Fused => sdpa::attention_lse(&x.q, &x.k, &x.v, &mut out.view_mut(), &mut lse, opts),
        Path::Reference => {
            reference::attention_lse(&x.q, &x.k, &x.v, &mut out.view_mut(), &mut lse, opts)
        }
    }
    .unwrap_or_else(|e| panic!("{path:?} rejected a valid call: {e}"));
    out.assert_padding_untouched(&format!("{path:?} output"));
    Outputs {
        dims: out_dims,
        out: out.logical(),
        lse,
    }
}

/// [`run_views`] on owned inputs.
pub fn run_with(path: Path, inp: &Inputs, out_layout: Layout, opts: &Options) -> Outputs {
    run_views(path, &inp.views(), out_layout, opts)
}

/// [`run_with`] into a contiguous BSHD output.
pub fn run(path: Path, inp: &Inputs, opts: &Options) -> Outputs {
    run_with(path, inp, Layout::Bshd, opts)
}

/// The fused kernel's output and LSE.
pub fn fused(inp: &Inputs, opts: &Options) -> Outputs {
    run(Path::Fused, inp, opts)
}

/// The reference's output and LSE.
pub fn reference(inp: &Inputs, opts: &Options) -> Outputs {
    run(Path::Reference, inp, opts)
}

/// The per-row error bounds of `reference::error_bounds`, laid out like LSE.
pub fn bounds(inp: &Inputs, opts: &Options) -> Vec<ErrorBound> {
    bounds_views(&inp.views(), opts)
}

pub fn bounds_views(x: &Views<'_>, opts: &Options) -> Vec<ErrorBound> {
    reference::error_bounds(&x.q, &x.k, &x.v, opts).expect("bounds of a valid call")
}

/// What one differential check saw.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub fused: Outputs,
    pub reference: Outputs,
    pub bounds: Vec<ErrorBound>,
    /// Largest `|fused − reference| / bound` over all output elements and LSEs (0 where they
    /// agree exactly).
    pub worst_ratio: f64,
    /// Rows with no visible key.
    pub empty_rows: usize,
}

/// Runs the fused kernel and the reference on the same inputs and checks every output element
/// against the row's `reference::error_bounds` `out` bound and every LSE against its `lse`
/// bound. Rows where the reference LSE is −∞ (no visible key) must have fused LSE exactly −∞
/// and output exactly 0, in both paths. Also checks that `attention` (without LSE) writes
/// bitwise the same output as `attention_lse`, and that no padding element of the output
/// buffer is written.
pub fn assert_close_to_reference(
    inp: &Inputs,
    out_layout: Layout,
    opts: &Options,
    label: &str,
) -> Comparison {
    assert_views_close_to_reference(&inp.views(), out_layout, opts, label)
}

/// [`assert_close_to_reference`] on views.
pub fn assert_views_close_to_reference(
    x: &Views<'_>,
    out_layout: Layout,
    opts: &Options,
    label: &str,
) -> Comparison {
    let fused = run_views(Path::Fused, x, out_layout, opts);
    let reference = run_views(Path::Reference, x, out_layout, opts);
    let bounds = bounds_views(x, opts);

    // `attention` and `attention_lse` must agree bit for bit on the output.
    let mut plain = Buf::output(fused.dims, out_layout);
    sdpa::attention(&x.q, &x.k, &x.v, &mut plain.view_mut(), opts)
        .unwrap_or_else(|e| panic!("{label}: attention rejected a valid call: {e}"));
    plain.assert_padding_untouched(label);
    let plain = plain.logical();
    assert!(
        plain
            .iter()
            .zip(&fused.out)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{label}: attention and attention_lse outputs differ"
    );

    let (worst_ratio, empty_rows) = assert_within_bounds(&fused, &reference, &bounds, label);
    Comparison {
        fused,
        reference,
        bounds,
        worst_ratio,
        empty_rows,
    }
}

/// The comparison of [`assert_close_to_reference`] on given results: returns the worst
/// error-to-bound ratio and the number of rows with no visible key.
pub fn assert_within_bounds(
    fused: &Outputs,
    reference: &Outputs,
    bounds: &[ErrorBound],
    label: &str,
) -> (f64, usize) {
    let [batch, n_q, heads, d_v] = fused.dims;
    assert_eq!(fused.dims, reference.dims, "{label}: output dims");
    assert_eq!(bounds.len(), batch * heads * n_q, "{label}: bounds length");
    let mut worst_ratio = 0.0f64;
    let mut empty_rows = 0;
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let row = (b * heads + h) * n_q + i;
                let bound = bounds[row];
                let (lf, lr) = (fused.lse[row], reference.lse[row]);
                let (of, or) = (fused.row(b, i, h), reference.row(b, i, h));
                let at = format!("{label}: row b={b} h={h} i={i}");
                if lr == f32::NEG_INFINITY {
                    empty_rows += 1;
                    assert_eq!(
                        lf,
                        f32::NEG_INFINITY,
                        "{at}: fused lse of a row with no key"
                    );
                    assert!(
                        of.iter().chain(or).all(|&x| x == 0.0),
                        "{at}: a row with no visible key must be exactly 0: fused {of:?}, \
                         reference {or:?}"
                    );
                    continue;
                }
                assert!(lr.is_finite(), "{at}: reference lse {lr}");
                let err = (f64::from(lf) - f64::from(lr)).abs();
                assert!(
                    err <= bound.lse,
                    "{at}: lse fused {lf} vs reference {lr}: error {err:e} > bound {:e}",
                    bound.lse
                );
                worst_ratio = worst_ratio.max(ratio(err, bound.lse));
                for c in 0..d_v {
                    let err = (f64::from(of[c]) - f64::from(or[c])).abs();
                    assert!(
                        err <= bound.out,
                        "{at} c={c}: out fused {} vs reference {}: error {err:e} > bound {:e}",
                        of[c],
                        or[c],
                        bound.out
                    );
                    worst_ratio = worst_ratio.max(ratio(err, bound.out));
                }
            }
        }
    }
    (worst_ratio, empty_rows)
}

fn ratio(err: f64, bound: f64) -> f64 {
    if err == 0.0 {
        0.0
    } else {
        err / bound
    }
}

/// The visible keys `[lo, hi)` of query row `i` under `opts` (test-side restatement of the
/// causal rule: row `i` sees key `j` iff `j ≤ i + off`).
pub fn visible(opts: &Options, n_q: usize, n_kv: usize, i: usize) -> (usize, usize) {
    match opts.causal_alignment() {
        None => (0, n_kv),
        Some(a) => {
            let last = i as i128 + a.offset(n_q, n_kv);
            (0, (last + 1).clamp(0, n_kv as i128) as usize)
        }
    }
}

/// Distance in units in the last place between two finite f32 of the same sign (or zero).
pub fn ulps(a: f32, b: f32) -> u32 {
    if a == b {
        return 0;
    }
    let key = |x: f32| {
        let bits = x.to_bits() as i64;
        if bits & (1 << 31) != 0 {
            -(bits & 0x7fff_ffff)
        } else {
            bits
        }
    };
    (key(a) - key(b)).unsigned_abs() as u32
}
