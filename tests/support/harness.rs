//! Running hand-made problems: random inputs in any [`Layout`], runners for the fused kernel
//! and the f64 reference into outputs with sentinels, and [`assert_close_to_reference`], the
//! differential check of the integration tests: `attention` bitwise equal to `attention_lse`,
//! padding untouched, and every row through the one checker,
//! [`super::contract::check_against_reference`], with inputs that are finite
//! ([`RowFacts::FINITE`]: every output element and LSE within `reference::error_bounds`, no
//! NaN, rows whose reference LSE is −∞ exactly 0 / −∞ on both paths). The shape, layout and
//! buffer are the ones of [`super::differential`] and [`super::layout`].
//!
//! Compiled into the test targets only (`cfg(test)`): it draws with `rand`, which the fuzz
//! crate does not depend on.

pub use super::contract::Outputs;
use super::contract::{check_against_reference, RowAt, RowFacts};
pub use super::differential::Shape;
pub use super::layout::{Buffer, Layout};
use super::typed::{quantize, Quantized};
pub use super::typed::{Elem, Types};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sdpa::half::{bf16, f16};
use sdpa::reference::{self, ErrorBound};
use sdpa::{Element, KvElement, Options, Tensor};

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

impl Buffer<f32> {
    /// Uniform random entries in `[-range, range)`, NaN padding.
    pub fn random(rng: &mut StdRng, dims: [usize; 4], layout: Layout, range: f32) -> Self {
        Self::from_fn(dims, layout, INPUT_PAD, |_| rng.random_range(-range..range))
    }

    /// Uniform random entries in `[lo, hi)`, NaN padding.
    pub fn uniform(rng: &mut StdRng, dims: [usize; 4], layout: Layout, lo: f32, hi: f32) -> Self {
        Self::from_fn(dims, layout, INPUT_PAD, |_| rng.random_range(lo..hi))
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

    /// Asserts that every element outside the view still holds [`OUTPUT_PAD_BITS`].
    pub fn assert_padding_untouched(&self, what: &str) {
        for (p, (&x, r)) in self.data.iter().zip(self.in_view()).enumerate() {
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
    pub q: Buffer,
    pub k: Buffer,
    pub v: Buffer,
}

impl Inputs {
    /// Uniform random Q in `[-q_range, q_range)`, K and V in `[-1, 1)`, laid out by `layouts`
    /// (Q, K, V).
    pub fn random(shape: Shape, layouts: [Layout; 3], seed: u64, q_range: f32) -> Self {
        let mut r = rng(seed);
        Inputs {
            q: Buffer::random(&mut r, shape.q_dims(), layouts[0], q_range),
            k: Buffer::random(&mut r, shape.k_dims(), layouts[1], 1.0),
            v: Buffer::random(&mut r, shape.v_dims(), layouts[2], 1.0),
        }
    }

    /// Contiguous BSHD random inputs.
    pub fn random_bshd(shape: Shape, seed: u64) -> Self {
        Self::random(shape, [Layout::BSHD; 3], seed, 1.0)
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
/// no padding element of the output was written and that every logical element and LSE was.
pub fn try_run(
    path: Path,
    q: &Tensor<'_, f32>,
    k: &Tensor<'_, f32>,
    v: &Tensor<'_, f32>,
    out_layout: Layout,
    opts: &Options,
) -> Result<Outputs, sdpa::Error> {
    try_run_typed::<f32, f32, f32>(path, q, k, v, out_layout, opts)
}

/// [`try_run`] on views of a valid call.
pub fn run_views(path: Path, x: &Views<'_>, out_layout: Layout, opts: &Options) -> Outputs {
    try_run(path, &x.q, &x.k, &x.v, out_layout, opts)
        .unwrap_or_else(|e| panic!("{path:?} rejected a valid call: {e}"))
}

impl Layout {
    /// A random layout: BSHD, BHSD, or a padded (possibly seq- or head-major) one.
    pub fn random(rng: &mut StdRng) -> Self {
        match rng.random_range(0..4) {
            0 => Layout::BSHD,
            1 => Layout::BHSD,
            _ => {
                let orders = [[0, 1, 2, 3], [0, 2, 1, 3], [1, 0, 2, 3], [2, 0, 1, 3]];
                let order = orders[rng.random_range(0..orders.len())];
                let step = rng.random_range(1..=2);
                let pad = rng.random_range(0..=3);
                let offset = rng.random_range(0..=5);
                Layout::strided(order, step, pad, offset)
            }
        }
    }
}

/// [`run_views`] on owned inputs.
pub fn run_with(path: Path, inp: &Inputs, out_layout: Layout, opts: &Options) -> Outputs {
    run_views(path, &inp.views(), out_layout, opts)
}

/// [`run_with`] into a contiguous BSHD output.
pub fn run(path: Path, inp: &Inputs, opts: &Options) -> Outputs {
    run_with(path, inp, Layout::BSHD, opts)
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

/// Runs the fused kernel and the reference on the same inputs and checks every row with
/// [`assert_within_bounds`]: every output element within the row's `reference::error_bounds`
/// `out` bound and every LSE within its `lse` bound; rows where the reference LSE is −∞ (no
/// visible key) must have fused LSE exactly −∞ and output exactly 0, in both paths. Also checks
/// that `attention` (without LSE) writes bitwise the same output as `attention_lse`, and that
/// no padding element of the output buffer is written.
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
    let (q, k, v, finite) = (&x.q, &x.k, &x.v, |_| RowFacts::FINITE);
    assert_tensors_against_reference::<f32, f32, f32>(q, k, v, out_layout, opts, finite, label)
}

/// The comparison of [`assert_close_to_reference`] on given results: every row through
/// [`check_against_reference`] with finite inputs ([`RowFacts::FINITE`]). Returns the worst
/// error-to-bound ratio and the number of rows with no visible key.
pub fn assert_within_bounds(
    fused: &Outputs,
    reference: &Outputs,
    bounds: &[ErrorBound],
    label: &str,
) -> (f64, usize) {
    let tally = check_against_reference(fused, reference, bounds, |_| RowFacts::FINITE, label);
    (tally.worst_ratio, tally.rows_empty)
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

/// One call of [`assert_typed_close_to_reference`].
struct TypedCall<'a> {
    q: &'a Buffer,
    k: &'a Buffer,
    v: &'a Buffer,
    out_layout: Layout,
    opts: &'a Options<'a>,
    label: &'a str,
}

/// [`try_run`] with Q, K/V and the output of any element type; the output is returned as f32
/// (exact).
pub fn try_run_typed<Q: Element, KV: KvElement, O: Element>(
    path: Path,
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out_layout: Layout,
    opts: &Options,
) -> Result<Outputs, sdpa::Error> {
    let [b, n_q, h, _] = q.dims();
    let out_dims = [b, n_q, h, v.dims()[3]];
    let pad = O::from_f32(f32::from_bits(OUTPUT_PAD_BITS));
    let init = O::from_f32(f32::from_bits(OUTPUT_INIT_BITS));
    let mut out = Buffer::from_fn(out_dims, out_layout, pad, |_| init);
    let mut lse = vec![f32::from_bits(OUTPUT_INIT_BITS); b * h * n_q];
    match path {
        Path::Fused => sdpa::attention_lse(q, k, v, &mut out.view_mut(), &mut lse, opts),
        Path::Reference => reference::attention_lse(q, k, v, &mut out.view_mut(), &mut lse, opts),
    }?;
    assert_typed_padding_untouched(&out, pad, &format!("{path:?} output"));
    let out: Vec<f32> = out.logical().into_iter().map(O::to_f32).collect();
    let init = init.to_f32().to_bits();
    assert!(
        out.iter().all(|x| x.to_bits() != init)
            && lse.iter().all(|x| x.to_bits() != OUTPUT_INIT_BITS),
        "{path:?}: an output element or LSE was not written"
    );
    Ok(Outputs {
        dims: out_dims,
        out,
        lse,
    })
}

fn assert_typed_padding_untouched<O: Element>(out: &Buffer<O>, pad: O, what: &str) {
    let pad = pad.to_f32().to_bits();
    for (p, (&x, r)) in out.data.iter().zip(out.in_view()).enumerate() {
        assert!(
            r || x.to_f32().to_bits() == pad,
            "{what}: padding element {p} outside the view was overwritten with {x:?}"
        );
    }
}

fn typed_check<Q: Element, KV: Element, O: Element>(c: &TypedCall<'_>) -> Comparison {
    let label = &format!(
        "{} [Q {}, K/V {}, out {}]",
        c.label,
        Q::NAME,
        KV::NAME,
        O::NAME
    );
    let (q, k, v) = (
        c.q.map(Q::from_f32),
        c.k.map(KV::from_f32),
        c.v.map(KV::from_f32),
    );
    let (q, k, v) = (&q.view(), &k.view(), &v.view());
    let finite = |_| RowFacts::FINITE;
    assert_tensors_against_reference::<Q, KV, O>(q, k, v, c.out_layout, c.opts, finite, label)
}

/// Runs the fused kernel (with and without LSE) and the reference on `q`, `k`, `v` into an
/// output of type `O`, and checks them: no padding written, `attention` bitwise equal to
/// `attention_lse`, and every row through [`check_against_reference`] against
/// `error_bounds(..).for_output::<O>()` under what `facts` says of its inputs.
pub fn assert_tensors_against_reference<Q: Element, KV: KvElement, O: Element>(
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out_layout: Layout,
    opts: &Options,
    facts: impl Fn(RowAt) -> RowFacts,
    label: &str,
) -> Comparison {
    let run = |path| {
        try_run_typed::<Q, KV, O>(path, q, k, v, out_layout, opts)
            .unwrap_or_else(|e| panic!("{label}: {path:?} rejected a valid call: {e}"))
    };
    let (fused, reference) = (run(Path::Fused), run(Path::Reference));
    let bounds: Vec<ErrorBound> = reference::error_bounds(q, k, v, opts)
        .expect("bounds of a valid call")
        .into_iter()
        .map(ErrorBound::for_output::<O>)
        .collect();

    // `attention` and `attention_lse` must agree bit for bit on the output.
    let pad = O::from_f32(f32::from_bits(OUTPUT_PAD_BITS));
    let mut plain = Buffer::from_fn(fused.dims, out_layout, pad, |_| pad);
    sdpa::attention(q, k, v, &mut plain.view_mut(), opts)
        .unwrap_or_else(|e| panic!("{label}: attention rejected a valid call: {e}"));
    assert_typed_padding_untouched(&plain, pad, label);
    assert!(
        plain
            .logical()
            .iter()
            .zip(&fused.out)
            .all(|(a, b)| a.to_f32().to_bits() == b.to_bits()),
        "{label}: attention and attention_lse outputs differ"
    );

    let tally = check_against_reference(&fused, &reference, &bounds, facts, label);
    Comparison {
        fused,
        reference,
        bounds,
        worst_ratio: tally.worst_ratio,
        empty_rows: tally.rows_empty,
    }
}

fn typed_out<Q: Element, KV: Element>(t: Types, c: &TypedCall<'_>) -> Comparison {
    match t.out {
        Elem::F32 | Elem::I8 => typed_check::<Q, KV, f32>(c),
        Elem::F16 => typed_check::<Q, KV, f16>(c),
        Elem::Bf16 => typed_check::<Q, KV, bf16>(c),
    }
}

fn quantized_out<Q: Element>(t: Types, c: &TypedCall<'_>) -> Comparison {
    match t.out {
        Elem::F32 | Elem::I8 => quantized_check::<Q, f32>(c),
        Elem::F16 => quantized_check::<Q, f16>(c),
        Elem::Bf16 => quantized_check::<Q, bf16>(c),
    }
}

/// The check of [`typed_check`] with i8 K/V from [`quantize`].
fn quantized_check<Q: Element, O: Element>(c: &TypedCall<'_>) -> Comparison {
    let label = &format!("{} [Q {}, K/V i8, out {}]", c.label, Q::NAME, O::NAME);
    let Quantized {
        k,
        v,
        k_scales: ks,
        v_scales: vs,
    } = quantize(c.k, c.v);
    let q = c.q.map(Q::from_f32);
    let opts = c.opts.clone().kv_scales(ks.view(), vs.view());
    let finite = |_| RowFacts::FINITE;
    assert_tensors_against_reference::<Q, i8, O>(
        &q.view(),
        &k.view(),
        &v.view(),
        c.out_layout,
        &opts,
        finite,
        label,
    )
}

fn typed_kv<Q: Element>(t: Types, c: &TypedCall<'_>) -> Comparison {
    match t.kv {
        Elem::F32 => typed_out::<Q, f32>(t, c),
        Elem::F16 => typed_out::<Q, f16>(t, c),
        Elem::Bf16 => typed_out::<Q, bf16>(t, c),
        Elem::I8 => quantized_out::<Q>(t, c),
    }
}

/// The check of [`assert_views_close_to_reference`] with Q, K/V and the output in `types`:
/// the f32 inputs are rounded to their types first (both paths and the bounds see exactly the
/// rounded values), and every output element must be within
/// `error_bounds(..).for_output::<O>()` (the output's own rounding added).
pub fn assert_typed_close_to_reference(
    types: Types,
    q: &Buffer,
    k: &Buffer,
    v: &Buffer,
    out_layout: Layout,
    opts: &Options,
    label: &str,
) -> Comparison {
    let c = TypedCall {
        q,
        k,
        v,
        out_layout,
        opts,
        label,
    };
    match types.q {
        Elem::F32 | Elem::I8 => typed_kv::<f32>(types, &c),
        Elem::F16 => typed_kv::<f16>(types, &c),
        Elem::Bf16 => typed_kv::<bf16>(types, &c),
    }
}
