//! The differential check: the fused kernel against the f64 reference on one small problem.
//!
//! A [`DiffCase`] is a shape (bounded so one case runs in milliseconds), a layout per operand,
//! the values, and the options. [`check`] runs
//! * `sdpa::attention_lse` on the global rayon pool,
//! * `sdpa::attention` (no LSE) inside a 3-thread pool: its output must be bitwise identical,
//! * `sdpa::reference::attention_lse` and `sdpa::reference::error_bounds`,
//!
//! and then checks every query row through the one checker of the fused result against the
//! reference and its bound, [`super::contract::check_against_reference`] (the contract is
//! stated there), with what each row's inputs allow derived by [`row_facts`] from the case's
//! options model:
//! * a row is empty when no key passes its masks, or every visible key's finite score is
//!   hidden by a −∞ bias; its sink is the option's;
//! * where every score is representable in f32 (the docs' condition for the fused kernel) and
//!   the scores are accurate enough (the bound's `Δ` below 64, so that a weight the reference
//!   flushes to 0 is 0 in the fused kernel too), the fused result is NaN where the reference
//!   is; a NaN anywhere in a Q row (with a visible key) makes the whole row and its LSE NaN on
//!   both paths;
//! * where the inputs are finite and the options valid, the fused result is NaN only where the
//!   reference is;
//! * where every input that can touch the row is finite (the Q row, the K rows it sees, the V
//!   rows of the keys it sees: a −∞ bias gives weight 0 and `0 · NaN` is NaN) and the dot
//!   products, scores and values are in the documented ranges, every output element and the
//!   LSE are within `reference::error_bounds` of the reference (an infinite bound, once
//!   `|logits|` reach ~1e9, still excludes NaN);
//! * no element of an output slice outside the view is written, and every LSE entry is;
//! * an invalid scale is `Error::InvalidScale` from every entry point, with nothing written.

use super::api::assert_one_of;
use super::api::expected_errors;
use super::bytes::{pick, urange, Writer};
use super::contract::{check_against_reference, Outputs, RowAt, RowFacts};
use super::layout::{indices, Buffer, Layout, POISON, SENTINEL};
use super::opts::{OptData, OptSpec};
use super::typed::{check_typed, Types};
use super::values::{Fill, Scope, Values};
use arbitrary::{Arbitrary, Result, Unstructured};
use sdpa::reference::ErrorBound;
use std::sync::OnceLock;

/// Largest `B · H · n_q · n_kv · (d_k + d_v)` a case runs with (the reference and the bound
/// each take about that many scalar steps). Larger decoded shapes are shrunk by [`Shape::fit`].
pub const WORK_BUDGET: usize = 1 << 20;

/// Sequence lengths around the kernel's block edges (6-key tiles, 8/16-row panels, 96-row and
/// 96-key blocks).
const SEQ_EDGES: [usize; 24] = [
    5, 6, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 127, 128, 129, 191, 192, 193, 288,
    289,
];
/// The head sizes models use.
const HEAD_COMMON: [usize; 4] = [64, 80, 96, 128];
/// Small head sizes and 16-column tile edges.
const HEAD_SMALL: [usize; 13] = [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33];
/// Large head sizes.
const HEAD_LARGE: [usize; 5] = [127, 129, 192, 255, 256];
/// Batch sizes (weighted toward 1).
const BATCHES: [usize; 8] = [1, 1, 1, 1, 2, 2, 3, 0];

/// The sizes of one problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// `B`.
    pub batch: usize,
    /// `H_kv`.
    pub kv_heads: usize,
    /// `H`, query heads (a positive multiple of `kv_heads`).
    pub heads: usize,
    /// Query rows.
    pub n_q: usize,
    /// Keys.
    pub n_kv: usize,
    /// Query/key head size.
    pub d_k: usize,
    /// Value head size (0 allowed: LSE only).
    pub d_v: usize,
}

fn seq_len(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(match urange(u, 0, 7)? {
        0 => urange(u, 0, 4)?,
        1 => pick(u, &SEQ_EDGES)?,
        _ => urange(u, 1, 300)?,
    })
}

fn write_seq_len(w: &mut Writer, n: usize) {
    if n <= 4 {
        w.urange(0, 0, 7).urange(n, 0, 4);
    } else if SEQ_EDGES.contains(&n) {
        w.urange(1, 0, 7).pick(n, &SEQ_EDGES);
    } else {
        w.urange(2, 0, 7).urange(n, 1, 300);
    }
}

fn head_dim(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(match urange(u, 0, 7)? {
        0..=3 => pick(u, &HEAD_COMMON)?,
        4 => pick(u, &HEAD_SMALL)?,
        5 => pick(u, &HEAD_LARGE)?,
        _ => urange(u, 1, 256)?,
    })
}

fn write_head_dim(w: &mut Writer, d: usize) {
    if HEAD_COMMON.contains(&d) {
        w.urange(0, 0, 7).pick(d, &HEAD_COMMON);
    } else if HEAD_SMALL.contains(&d) {
        w.urange(4, 0, 7).pick(d, &HEAD_SMALL);
    } else if HEAD_LARGE.contains(&d) {
        w.urange(5, 0, 7).pick(d, &HEAD_LARGE);
    } else {
        w.urange(6, 0, 7).urange(d, 1, 256);
    }
}

impl Shape {
    /// `B, H, H_kv, n_q, n_kv, d_k, d_v` (`H` a multiple of `H_kv`).
    pub const fn new(
        batch: usize,
        heads: usize,
        kv_heads: usize,
        n_q: usize,
        n_kv: usize,
        d_k: usize,
        d_v: usize,
    ) -> Shape {
        assert!(kv_heads > 0 && heads.is_multiple_of(kv_heads));
        Shape {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k,
            d_v,
        }
    }

    /// Batch 1, one head, `d_k = d_v = d`.
    pub const fn simple(n_q: usize, n_kv: usize, d: usize) -> Shape {
        Shape::new(1, 1, 1, n_q, n_kv, d, d)
    }

    /// Q's dims `[B, n_q, H, d_k]`.
    pub fn q_dims(&self) -> [usize; 4] {
        [self.batch, self.n_q, self.heads, self.d_k]
    }

    /// K's dims `[B, n_kv, H_kv, d_k]`.
    pub fn k_dims(&self) -> [usize; 4] {
        [self.batch, self.n_kv, self.kv_heads, self.d_k]
    }

    /// V's dims `[B, n_kv, H_kv, d_v]`.
    pub fn v_dims(&self) -> [usize; 4] {
        [self.batch, self.n_kv, self.kv_heads, self.d_v]
    }

    /// The output's dims `[B, n_q, H, d_v]`.
    pub fn out_dims(&self) -> [usize; 4] {
        [self.batch, self.n_q, self.heads, self.d_v]
    }

    /// Query heads per key/value head.
    pub const fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Rough cost of the reference plus `error_bounds` (f64 multiply-adds).
    pub fn reference_cost(&self) -> usize {
        self.batch * self.heads * self.n_q.max(1) * self.n_kv.max(1) * 2 * (self.d_k + self.d_v)
    }

    /// `B · H · n_q · n_kv · (d_k + d_v)`.
    pub fn work(&self) -> usize {
        self.batch * self.heads * self.n_q * self.n_kv * (self.d_k + self.d_v)
    }

    /// The shape, shrunk until [`Shape::work`] ≤ [`WORK_BUDGET`]: the longer sequence by a
    /// quarter at a time, then batch, group and key/value heads down to 1. Deterministic.
    pub fn fit(mut self) -> Shape {
        while self.work() > WORK_BUDGET {
            if self.n_q.max(self.n_kv) > 8 {
                if self.n_kv >= self.n_q {
                    self.n_kv -= self.n_kv / 4;
                } else {
                    self.n_q -= self.n_q / 4;
                }
            } else if self.batch > 1 {
                self.batch -= 1;
            } else if self.group() > 1 {
                self.heads -= self.kv_heads;
            } else if self.kv_heads > 1 {
                self.kv_heads -= 1;
                self.heads = self.kv_heads;
            } else {
                self.n_q = self.n_q.min(4);
                self.n_kv = self.n_kv.min(4);
            }
        }
        self
    }

    /// Reads a shape.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<Shape> {
        let batch = pick(u, &BATCHES)?;
        let kv_heads = urange(u, 1, 4)?;
        let group = urange(u, 1, 8)?;
        let n_q = seq_len(u)?;
        let n_kv = seq_len(u)?;
        let d_k = head_dim(u)?;
        let d_v = match urange(u, 0, 15)? {
            0..=9 => d_k,
            15 => 0,
            _ => head_dim(u)?,
        };
        Ok(Shape {
            batch,
            heads: kv_heads * group,
            kv_heads,
            n_q,
            n_kv,
            d_k,
            d_v,
        })
    }

    /// Inverse of [`Shape::decode`].
    pub fn encode(&self, w: &mut Writer) {
        w.pick(self.batch, &BATCHES);
        w.urange(self.kv_heads, 1, 4);
        w.urange(self.group(), 1, 8);
        write_seq_len(w, self.n_q);
        write_seq_len(w, self.n_kv);
        write_head_dim(w, self.d_k);
        if self.d_v == self.d_k {
            w.urange(0, 0, 15);
        } else if self.d_v == 0 {
            w.urange(15, 0, 15);
        } else {
            w.urange(10, 0, 15);
            write_head_dim(w, self.d_v);
        }
    }
}

/// One differential case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffCase {
    /// Sizes (shrunk to the work budget before running).
    pub shape: Shape,
    /// Layouts of Q, K, V and the output.
    pub layouts: [Layout; 4],
    /// Values of Q, K, V.
    pub values: Values,
    /// Options.
    pub opts: OptSpec,
    /// Element types (last, one byte: inputs that end before it are all f32), checked after
    /// the f32 run where the inputs stay finite in every type.
    pub types: Types,
}

impl DiffCase {
    /// Contiguous BSHD operands with uniform values.
    pub fn plain(shape: Shape, opts: OptSpec, seed: u16) -> DiffCase {
        DiffCase {
            shape,
            layouts: [Layout::BSHD; 4],
            values: Values::unit(seed),
            opts,
            types: Types::F32,
        }
    }

    /// Reads a case.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<DiffCase> {
        let shape = Shape::decode(u)?;
        let layouts = [
            Layout::decode(u)?,
            Layout::decode(u)?,
            Layout::decode(u)?,
            Layout::decode(u)?,
        ];
        let values = Values::decode(u)?;
        let mut opts = OptSpec::decode(u)?;
        let types = Types::decode(u)?;
        // Appended last (exhausted input: off), so older corpus files decode as before.
        opts.bf16_products = urange(u, 0, 3)? == 3;
        Ok(DiffCase {
            shape,
            layouts,
            values,
            opts,
            types,
        })
    }

    /// Inverse of [`DiffCase::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.shape.encode(&mut w);
        for l in &self.layouts {
            l.encode(&mut w);
        }
        self.values.encode(&mut w);
        self.opts.encode(&mut w);
        self.types.encode(&mut w);
        if self.opts.bf16_products {
            w.urange(3, 0, 3);
        }
        w.bytes
    }
}

impl<'a> Arbitrary<'a> for DiffCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        DiffCase::decode(u)
    }
}

/// What one [`check`] verified, for the stable test's coverage counts.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Cases run.
    pub cases: usize,
    /// Cases whose scale or options were invalid (checked to be the documented errors).
    pub invalid_options: usize,
    /// Rows compared element by element against the bound.
    pub rows_in_bound: usize,
    /// Rows with no visible key (checked to be exactly 0 / −∞).
    pub rows_empty: usize,
    /// Rows checked only for NaN semantics and whichever of output and LSE their inputs
    /// allowed (non-finite inputs, values out of the documented ranges).
    pub rows_nan_only: usize,
    /// Largest `|fused − reference| / bound` seen (0 where the bound was 0 and they agreed).
    pub worst_ratio: f64,
    /// Cases checked once more with f16/bf16/i8 operands or output ([`check_typed`]).
    pub typed: usize,
}

impl Stats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Stats) {
        self.cases += other.cases;
        self.invalid_options += other.invalid_options;
        self.rows_in_bound += other.rows_in_bound;
        self.rows_empty += other.rows_empty;
        self.rows_nan_only += other.rows_nan_only;
        self.typed += other.typed;
        self.worst_ratio = self.worst_ratio.max(other.worst_ratio);
    }
}

/// A second pool, so that every case also runs on a thread count other than the global one.
pub fn side_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a 3-thread pool")
    })
}

/// The inputs of a case, in their layouts.
pub struct Inputs {
    /// Q, `[B, n_q, H, d_k]`.
    pub q: Buffer,
    /// K, `[B, n_kv, H_kv, d_k]`.
    pub k: Buffer,
    /// V, `[B, n_kv, H_kv, d_v]`.
    pub v: Buffer,
}

/// Builds Q, K and V for `shape` (already fitted).
pub fn inputs(shape: &Shape, layouts: &[Layout; 4], values: &Values) -> Inputs {
    let Shape {
        batch: b,
        n_q,
        n_kv,
        d_k,
        d_v,
        ..
    } = *shape;
    let (h, hk) = (shape.heads, shape.kv_heads);
    let mut bufs = [
        Buffer::new([b, n_q, h, d_k], &layouts[0], false, POISON),
        Buffer::new([b, n_kv, hk, d_k], &layouts[1], false, POISON),
        Buffer::new([b, n_kv, hk, d_v], &layouts[2], false, POISON),
    ];
    for (salt, (buf, fill)) in bufs
        .iter_mut()
        .zip([&values.q, &values.k, &values.v])
        .enumerate()
    {
        fill_buffer(buf, fill, salt as u64);
    }
    for s in &values.specials {
        let buf = &mut bufs[usize::from(s.operand)];
        let [nb, ns, nh, nd] = buf.dims;
        let rows = nb * ns * nh;
        if rows == 0 || nd == 0 {
            continue;
        }
        let x = s.number();
        let index = s.index as usize;
        let row = |r: usize| [r / (ns * nh), (r / nh) % ns, r % nh];
        match s.scope {
            Scope::Element => {
                let e = index % (rows * nd);
                let [bi, si, hi] = row(e / nd);
                buf.set([bi, si, hi, e % nd], x);
            }
            Scope::Row => {
                let [bi, si, hi] = row(index % rows);
                for c in 0..nd {
                    buf.set([bi, si, hi, c], x);
                }
            }
            Scope::Column => {
                let c = index % nd;
                for r in 0..rows {
                    let [bi, si, hi] = row(r);
                    buf.set([bi, si, hi, c], x);
                }
            }
        }
    }
    let [q, k, v] = bufs;
    Inputs { q, k, v }
}

fn fill_buffer(buf: &mut Buffer, fill: &Fill, salt: u64) {
    let mut sampler = fill.sampler(salt);
    for i in indices(buf.dims).collect::<Vec<_>>() {
        buf.set(i, sampler.next_value());
    }
}

/// Runs and checks one case; panics with a description on any violation.
pub fn check(case: &DiffCase) -> Stats {
    let shape = case.shape.fit();
    let Shape {
        batch: b, n_q, d_v, ..
    } = shape;
    let h = shape.heads;
    let inp = inputs(&shape, &case.layouts, &case.values);
    let opt_data = case.opts.materialize(b, n_q, h, shape.n_kv);
    let opts = opt_data.options();
    let (q, k, v) = (inp.q.view(), inp.k.view(), inp.v.view());
    let out_dims = [b, n_q, h, d_v];
    let lse_len = b * h * n_q;
    let fresh = || Buffer::new(out_dims, &case.layouts[3], true, SENTINEL);

    let mut fused = fresh();
    let mut fused_lse = vec![f32::from_bits(SENTINEL); lse_len];
    let r_fused = sdpa::attention_lse(&q, &k, &v, &mut fused.view_mut(), &mut fused_lse, &opts);
    let mut fused2 = fresh();
    let r_fused2 =
        side_pool().install(|| sdpa::attention(&q, &k, &v, &mut fused2.view_mut(), &opts));
    let mut reference = fresh();
    let mut reference_lse = vec![f32::from_bits(SENTINEL); lse_len];
    let r_ref = sdpa::reference::attention_lse(
        &q,
        &k,
        &v,
        &mut reference.view_mut(),
        &mut reference_lse,
        &opts,
    );
    let r_bounds = sdpa::reference::error_bounds(&q, &k, &v, &opts);

    let mut stats = Stats {
        cases: 1,
        ..Stats::default()
    };
    let errors = expected_errors(
        inp.q.dims,
        inp.k.dims,
        inp.v.dims,
        Some(out_dims),
        Some(lse_len),
        &opt_data,
    );
    // A valid option value from the ends of its range may be refused with a typed error of
    // that option (`OptData::may_refuse`). Every failed call must have written nothing.
    let refused = [&r_fused, &r_fused2, &r_ref]
        .iter()
        .any(|r| r.as_ref().is_err_and(|e| opt_data.may_refuse(e)))
        || r_bounds.as_ref().is_err_and(|e| opt_data.may_refuse(e));
    if !errors.is_empty() || refused {
        for (name, r) in [
            ("attention_lse", &r_fused),
            ("attention", &r_fused2),
            ("reference::attention_lse", &r_ref),
            (
                "reference::error_bounds",
                &r_bounds.as_ref().map(|_| ()).map_err(|e| e.clone()),
            ),
        ] {
            match r {
                Err(e) if opt_data.may_refuse(e) => {}
                // Some path refused a wide value; this one may handle it.
                Ok(()) if errors.is_empty() => {}
                r => assert_one_of(name, r, &errors),
            }
        }
        for (name, buf, lse, r) in [
            ("fused", &fused, &fused_lse[..], &r_fused),
            ("fused2", &fused2, &[][..], &r_fused2),
            ("reference", &reference, &reference_lse[..], &r_ref),
        ] {
            assert!(
                r.is_ok() || buf.data.iter().chain(lse).all(|x| x.to_bits() == SENTINEL),
                "{name}: output written by a call that failed ({r:?})"
            );
        }
        stats.invalid_options = 1;
        return stats;
    }
    for (name, r) in [
        ("attention_lse", &r_fused),
        ("attention", &r_fused2),
        ("reference::attention_lse", &r_ref),
    ] {
        assert!(r.is_ok(), "{name} failed on a valid case: {r:?}");
    }
    let bounds = r_bounds.unwrap_or_else(|e| panic!("error_bounds failed on a valid case: {e:?}"));
    assert_eq!(bounds.len(), lse_len, "error_bounds length");

    // Determinism: another pool, and the path without LSE, give the same bits.
    // (Any NaN equals any NaN: Rust leaves NaN payloads unspecified, and Miri randomizes them.)
    for (i, (x, y)) in fused.data.iter().zip(&fused2.data).enumerate() {
        assert!(
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            "attention (3 threads) differs from attention_lse at slice element {i}: {x} vs {y}"
        );
    }
    for (name, buf) in [("fused", &fused), ("reference", &reference)] {
        untouched_outside_view(name, buf);
    }
    for (name, lse) in [("fused", &fused_lse), ("reference", &reference_lse)] {
        if let Some(r) = lse.iter().position(|x| x.to_bits() == SENTINEL) {
            panic!("{name} lse[{r}] not written");
        }
    }
    check_rows(
        &Rows {
            shape: &shape,
            opts: &opt_data,
            inputs: &inp,
            fused: &fused,
            fused_lse: &fused_lse,
            reference: &reference,
            reference_lse: &reference_lse,
            bounds: &bounds,
        },
        &mut stats,
    );
    // The drawn element types, where every row had the full f32 check and every input stays
    // finite in every type (f16's largest value is 65504; i8 scales are finite by design).
    let finite = |b: &Buffer| b.logical().iter().all(|x| x.abs() <= 60000.0);
    if case.types != Types::F32
        && stats.rows_nan_only == 0
        && [&inp.q, &inp.k, &inp.v].into_iter().all(finite)
    {
        let label = format!("typed {:?}", case.types);
        let (q, k, v) = (&inp.q, &inp.k, &inp.v);
        let tally = check_typed(case.types, q, k, v, case.layouts[3], &opts, &label);
        stats.worst_ratio = stats.worst_ratio.max(tally.worst_ratio);
        stats.typed = 1;
    }
    stats
}

/// Panics if an element of `buf` outside its view changed from [`SENTINEL`].
pub fn untouched_outside_view(name: &str, buf: &Buffer) {
    for (i, (x, inside)) in buf.data.iter().zip(buf.in_view()).enumerate() {
        assert!(
            inside || x.to_bits() == SENTINEL,
            "{name}: slice element {i}, outside the view, was written ({x})"
        );
    }
}

/// Everything [`check_rows`] compares.
pub struct Rows<'a> {
    /// The (fitted) shape.
    pub shape: &'a Shape,
    /// The options, with their data.
    pub opts: &'a OptData,
    /// Q, K, V.
    pub inputs: &'a Inputs,
    /// Fused output.
    pub fused: &'a Buffer,
    /// Fused LSE.
    pub fused_lse: &'a [f32],
    /// Reference output.
    pub reference: &'a Buffer,
    /// Reference LSE.
    pub reference_lse: &'a [f32],
    /// `reference::error_bounds`.
    pub bounds: &'a [ErrorBound],
}

/// The per-row contract of [`super::contract::check_against_reference`], with each row's
/// [`RowFacts`] from [`row_facts`].
pub fn check_rows(x: &Rows<'_>, stats: &mut Stats) {
    let outputs = |out: &Buffer, lse: &[f32]| Outputs {
        dims: x.shape.out_dims(),
        out: out.logical(),
        lse: lse.to_vec(),
    };
    let label = format!(
        "fused vs reference (scale {:e}, wide sink/slope/softcap {:?})",
        x.opts.spec.effective_scale(x.shape.d_k),
        x.opts.spec.wide
    );
    let tally = check_against_reference(
        &outputs(x.fused, x.fused_lse),
        &outputs(x.reference, x.reference_lse),
        x.bounds,
        |at| row_facts(x, at),
        &label,
    );
    stats.rows_in_bound += tally.rows_in_bound;
    stats.rows_empty += tally.rows_empty;
    stats.rows_nan_only += tally.rows_nan_only;
    stats.worst_ratio = stats.worst_ratio.max(tally.worst_ratio);
}

/// What the inputs of one row (see the module docs) let the contract demand of it.
pub fn row_facts(x: &Rows<'_>, RowAt { b, h, i, index }: RowAt) -> RowFacts {
    let s = x.shape;
    let (q, k, v) = (&x.inputs.q, &x.inputs.k, &x.inputs.v);
    let scale = f64::from(x.opts.spec.effective_scale(s.d_k));
    let hk = h / s.group();
    let sink = x.opts.sink(h);
    let bound = x.bounds[index];
    // Keys that pass the masks (causal, window, key lengths, boolean mask).
    let visible: Vec<usize> = (0..s.n_kv)
        .filter(|&j| x.opts.visible(b, i, h, j))
        .collect();
    let q_row: Vec<f32> = (0..s.d_k).map(|c| q.at([b, i, h, c])).collect();
    let q_nan = q_row.iter().any(|x| x.is_nan());
    let k_finite = visible
        .iter()
        .all(|&j| (0..s.d_k).all(|c| k.at([b, j, hk, c]).is_finite()));
    // Bias entries of the visible keys: −∞ hides a key (exactly, on both paths, once the score
    // it is added to is finite); NaN and +∞ are non-finite inputs.
    let biases: Vec<f32> = visible.iter().map(|&j| x.opts.bias(b, i, h, j)).collect();
    let bias_ok = biases
        .iter()
        .all(|&x| x.is_finite() || x == f32::NEG_INFINITY);
    let logits_finite = q_row.iter().all(|x| x.is_finite()) && k_finite && bias_ok;
    // A NaN or ±∞ in V row j reaches only the rows that see key j (causal, window, key lengths,
    // boolean mask): hidden V rows are never multiplied, so this row's result must be finite
    // and within its bound. A −∞ bias does not hide a key in this sense: its weight is 0 and
    // `0 · NaN = NaN`, on both paths, as documented.
    let v_finite = visible
        .iter()
        .all(|&j| (0..s.d_v).all(|c| v.at([b, j, hk, c]).is_finite()));
    // `Σ_p |q_p k_jp|`, the magnitude of key j's raw dot product.
    let dot = |j: usize| -> f64 {
        (0..s.d_k)
            .map(|c| (f64::from(q_row[c]) * f64::from(k.at([b, j, hk, c]))).abs())
            .sum()
    };
    let finite_abs = |bias: f32| {
        if bias.is_finite() {
            f64::from(bias).abs()
        } else {
            0.0
        }
    };
    // Whether every dot product and every score (and its difference to the row max, in the
    // log2 domain) is representable in f32, as the crate's docs require; beyond, only NaN
    // inputs have a documented effect.
    let cap = x.opts.softcap.map_or(f64::INFINITY, f64::from);
    let (mut largest_dot, mut largest) = (0.0f64, 0.0f64);
    if sink.is_finite() {
        largest = f64::from(sink).abs();
    }
    for (&j, &bias) in visible.iter().zip(&biases) {
        let dot = dot(j);
        let score =
            (scale.abs() * dot).min(cap) + x.opts.alibi_magnitude(b, i, h, j) + finite_abs(bias);
        largest_dot = largest_dot.max(dot);
        largest = largest.max(score);
    }
    let representable = largest_dot < f64::from(f32::MAX)
        && 2.0 * std::f64::consts::LOG2_E * largest < f64::from(f32::MAX);
    // ... and accurate enough that a weight the reference flushes to 0 (e^-745) is 0 in the
    // fused kernel too (it flushes below 2^-127): the bound's Δ ≤ lse bound.
    let nan_rule =
        representable && bound.lse.partial_cmp(&64.0) != Some(std::cmp::Ordering::Greater);
    // Every visible key hidden by a −∞ bias (once its score is finite).
    let all_hidden = representable && biases.iter().all(|&x| x == f32::NEG_INFINITY);
    // The fused kernel's documented value range (crate docs, "Numerics"): its unnormalized
    // accumulator holds up to n_visible · max|v|.
    let v_max = visible
        .iter()
        .flat_map(|&j| (0..s.d_v).map(move |c| (j, c)))
        .map(|(j, c)| f64::from(v.at([b, j, hk, c])).abs())
        .fold(0.0, f64::max);
    let values_in_range = v_max * ((visible.len() + 1) as f64) < f64::from(f32::MAX);
    // ... and each raw dot product must be representable (it is scaled afterwards).
    let dots_in_range = visible.iter().all(|&j| dot(j) < f64::from(f32::MAX) / 2.0);
    // ... and every scaled score, in log2 units (crate docs, "Numerics").
    let scores_in_range = std::f64::consts::LOG2_E * largest < f64::from(f32::MAX) / 2.0;
    // Scores from Q·K and the bias alone (without the sink, ALiBi and the softcap, whose finite
    // values at the ends of their ranges must be handled or refused).
    let qk_largest = visible
        .iter()
        .zip(&biases)
        .map(|(&j, &bias)| scale.abs() * dot(j) + finite_abs(bias))
        .fold(0.0f64, f64::max);
    let no_nan = logits_finite
        && v_finite
        && values_in_range
        && dots_in_range
        && std::f64::consts::LOG2_E * qk_largest < f64::from(f32::MAX) / 2.0
        && sink.partial_cmp(&f32::INFINITY) == Some(std::cmp::Ordering::Less)
        && x.opts.slopes.as_ref().is_none_or(|s| s[h].is_finite());
    RowFacts {
        empty: Some(visible.is_empty() || (logits_finite && all_hidden)),
        sink: Some(sink),
        q_nan,
        nan_where_reference_nan: nan_rule,
        nan_only_where_reference_nan: no_nan,
        out_in_bound: logits_finite
            && scores_in_range
            && v_finite
            && values_in_range
            && dots_in_range,
        lse_in_bound: logits_finite && dots_in_range && scores_in_range,
    }
}
