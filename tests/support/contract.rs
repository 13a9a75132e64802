//! The one check of a fused result against the f64 reference and its derived bound,
//! [`check_against_reference`]: every checker of the test suites and the fuzz targets decides
//! each query row through it. The harness's `assert_*` functions (hand-made problems whose
//! inputs are finite, [`RowFacts::FINITE`]) and the fuzz oracle's `differential::check_rows`
//! (any inputs; it derives each row's [`RowFacts`] from its model of the options) only say
//! what the inputs of a row allow; what the row must then satisfy is decided here.
//!
//! The contract of one row (crate docs "Numerics", `docs/semantics.md` §5):
//! * the bound `sdpa::reference::error_bounds` gives is never negative;
//! * a row with no visible key is exactly 0 on both paths, whatever the inputs, with LSE
//!   exactly −∞ on both, or with a sink σ the reference's LSE exactly σ and the fused one
//!   within the LSE bound of it;
//! * a NaN in the row's Q (with a visible key) makes every output element and the LSE NaN on
//!   both paths;
//! * where the scores are representable and accurate enough, the fused result is NaN where the
//!   reference is; where the inputs are finite and the options valid, only where it is;
//! * where every input that can touch the row is finite and in the documented ranges, every
//!   output element and the LSE are within the row's bound of the reference:
//!   `|fused − reference| ≤ bound` in f64, which no NaN, no pair of equal infinities and no
//!   NaN bound passes (an infinite bound still demands that). The check adds no tolerance of
//!   its own; typed outputs pass the bound with their rounding term
//!   (`ErrorBound::for_output::<O>()`).

use sdpa::reference::ErrorBound;

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

/// One query row: batch `b`, query head `h`, query index `i`, and `index`, its position in LSE
/// and in the bounds (`(b·H + h)·n_q + i`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowAt {
    pub b: usize,
    pub h: usize,
    pub i: usize,
    pub index: usize,
}

/// What the inputs of one row let the contract demand of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowFacts {
    /// The row sees no key (every key masked, or hidden by a −∞ bias added to a finite score).
    /// `None`: the caller has no model of the masks; the row is then empty where the
    /// reference's LSE is −∞.
    pub empty: Option<bool>,
    /// The row's sink logit (−∞: no sink). `None`: unknown; an empty row then needs LSE −∞.
    pub sink: Option<f32>,
    /// A NaN in the row's Q: everything NaN on both paths (unless the row is empty).
    pub q_nan: bool,
    /// Where the reference is NaN, the fused result must be NaN too.
    pub nan_where_reference_nan: bool,
    /// The fused result may be NaN only where the reference is.
    pub nan_only_where_reference_nan: bool,
    /// Every output element must be within `bound.out` of the reference.
    pub out_in_bound: bool,
    /// The LSE must be within `bound.lse` of the reference.
    pub lse_in_bound: bool,
}

impl RowFacts {
    /// Every input that can touch the row is finite and in range (the harness's hand-made
    /// problems): the whole row within its bound, no NaN anywhere, the row empty where the
    /// reference's LSE is −∞.
    pub const FINITE: RowFacts = RowFacts {
        empty: None,
        sink: None,
        q_nan: false,
        nan_where_reference_nan: true,
        nan_only_where_reference_nan: true,
        out_in_bound: true,
        lse_in_bound: true,
    };
}

/// What one [`check_against_reference`] verified.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Rows whose output elements and LSE were all compared against the bound.
    pub rows_in_bound: usize,
    /// Rows with no visible key (exactly 0 / −∞ or σ).
    pub rows_empty: usize,
    /// Other rows: only the NaN rules and whichever of output and LSE their inputs allowed.
    pub rows_nan_only: usize,
    /// Largest `|fused − reference| / bound` over the compared values (0 where they agree).
    pub worst_ratio: f64,
}

/// Checks every query row of `fused` against `reference` and its bound `bounds[row]` (laid out
/// like LSE), under the contract of the module docs and what `facts` says of the row's inputs.
/// Panics with `label`, the row and the values on the first violation.
pub fn check_against_reference(
    fused: &Outputs,
    reference: &Outputs,
    bounds: &[ErrorBound],
    facts: impl Fn(RowAt) -> RowFacts,
    label: &str,
) -> Tally {
    let [batch, n_q, heads, d_v] = fused.dims;
    assert_eq!(fused.dims, reference.dims, "{label}: output dims");
    let rows = batch * heads * n_q;
    for (name, o) in [("fused", fused), ("reference", reference)] {
        assert_eq!(o.out.len(), rows * d_v, "{label}: {name} output length");
        assert_eq!(o.lse.len(), rows, "{label}: {name} lse length");
    }
    assert_eq!(bounds.len(), rows, "{label}: bounds length");
    // `|f − r| ≤ bound` in f64: false for a NaN on either side or in the bound, and for equal
    // infinities.
    let within = |f: f32, r: f32, bound: f64| (f64::from(f) - f64::from(r)).abs() <= bound;
    let mut tally = Tally::default();
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let index = (b * heads + h) * n_q + i;
                let row = facts(RowAt { b, h, i, index });
                let bound = bounds[index];
                let (fl, rl) = (fused.lse[index], reference.lse[index]);
                let (fo, ro) = (fused.row(b, i, h), reference.row(b, i, h));
                let at = |what: &str| format!("{label}: {what} at b={b} h={h} i={i} (row {index})");
                let negative = |x: f64| x < 0.0;
                assert!(
                    !negative(bound.out) && !negative(bound.lse),
                    "{}: reference::error_bounds returned a negative bound {bound:?}",
                    at("bound")
                );
                if row.empty.unwrap_or(rl == f32::NEG_INFINITY) {
                    for (c, (&f, &r)) in fo.iter().zip(ro).enumerate() {
                        assert!(
                            f == 0.0 && r == 0.0,
                            "{}: fused {f}, reference {r}, want exactly 0 (fused row {fo:?}, \
                             reference row {ro:?})",
                            at(&format!("row with no visible key, out[{c}]"))
                        );
                    }
                    match row.sink {
                        Some(sink) if sink != f32::NEG_INFINITY => assert!(
                            rl == sink && within(fl, rl, bound.lse),
                            "{}: fused {fl}, reference {rl}, want the sink logit {sink} \
                             (bound {:e})",
                            at("row with no visible key, lse"),
                            bound.lse
                        ),
                        _ => assert!(
                            fl == f32::NEG_INFINITY && rl == f32::NEG_INFINITY,
                            "{}: fused {fl}, reference {rl}, want −∞",
                            at("row with no visible key, lse")
                        ),
                    }
                    tally.rows_empty += 1;
                    continue;
                }
                // Output element `Some(c)`, or the LSE (`None`).
                let name = |c: Option<usize>| c.map_or("lse".to_string(), |c| format!("out[{c}]"));
                let values = fo
                    .iter()
                    .zip(ro)
                    .enumerate()
                    .map(|(c, (&f, &r))| (Some(c), f, r, row.out_in_bound, bound.out));
                let lse = (None, fl, rl, row.lse_in_bound, bound.lse);
                for (c, f, r, in_bound, bound) in values.chain([lse]) {
                    if row.q_nan {
                        assert!(
                            f.is_nan() && r.is_nan(),
                            "{}: fused {f}, reference {r}, want NaN (NaN in the Q row)",
                            at(&name(c))
                        );
                    }
                    if row.nan_where_reference_nan && r.is_nan() {
                        assert!(
                            f.is_nan(),
                            "{}: fused {f}, reference NaN, want NaN",
                            at(&name(c))
                        );
                    }
                    if row.nan_only_where_reference_nan && f.is_nan() {
                        assert!(
                            r.is_nan(),
                            "{}: fused NaN, reference {r}: these inputs must not give NaN",
                            at(&name(c))
                        );
                    }
                    if in_bound {
                        let err = (f64::from(f) - f64::from(r)).abs();
                        assert!(
                            within(f, r, bound),
                            "{}: fused {f:e}, reference {r:e}, |diff| {err:e} > bound {bound:e}",
                            at(&name(c))
                        );
                        if err != 0.0 {
                            tally.worst_ratio = tally.worst_ratio.max(err / bound);
                        }
                    }
                }
                if row.out_in_bound && row.lse_in_bound {
                    tally.rows_in_bound += 1;
                } else {
                    tally.rows_nan_only += 1;
                }
            }
        }
    }
    tally
}
