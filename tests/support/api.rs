//! The API check: arbitrary dims, strides, slice lengths and options go straight into the
//! public constructors and entry points, which must answer `Ok` or the typed error the docs
//! promise, never panic, abort or hang.
//!
//! An [`ApiCase`] starts from one consistent set of sizes (`B, n_q, H_kv, group, n_kv, d_k,
//! d_v`), so that valid calls are common, then perturbs it: a dim of any view may be replaced by
//! an arbitrary `usize` (0, 1, powers of two, `usize::MAX`, …), strides may be explicit and
//! arbitrary (0, huge, overflowing), and slices may be shorter or longer than needed.
//!
//! [`check`] compares every answer with a model written from the documentation, in `u128`
//! arithmetic so the model itself cannot overflow:
//! * `Tensor::new` / `bshd` / `bhsd` and `TensorMut::…`: exactly `LayoutOverflow`,
//!   `SliceTooShort { needed, got }` or `OverlappingOutput` as documented, else `Ok`; an accepted
//!   writable view is checked to be really injective (brute force, small views); `get` and
//!   `get_mut` return the element at `Σ index·stride` inside the dims and `None` outside;
//! * each entry point (`attention`, `attention_lse`, the reference's two, `error_bounds`)
//!   returns one of the errors whose condition holds (the crate reports the first it finds), or
//!   `Ok` when none holds, and writes nothing when it fails.
//!
//! Valid calls whose work `B·H·(n_q+1)·(n_kv+1)·(d_k+d_v+1) + B·H_kv·(n_kv+1)·(d_k+d_v+1)`
//! (the `+1`s count loop overhead: the reference loops over every (batch, head) even when
//! `n_q = 0`) and, for the reference, whose documented `n_q·n_kv` scratch are within
//! [`WORK_BUDGET`] are run for real
//! and their results go through the differential row checks. Larger valid ones (stride-0 views
//! make enormous problems from tiny slices) still go through validation: with an LSE slice of
//! the wrong length and with a NaN scale, each of which must be refused, and, when the problem
//! needs no work at all (`B = 0`, `n_q = 0`, or `d_v = 0` without LSE), for real.

use super::bytes::{pick, uint, urange, variant, Writer};
use super::differential::{check_rows, untouched_outside_view, Inputs, Rows, Shape, Stats};
use super::layout::{Buffer, SENTINEL};
use super::opts::{OptData, OptSpec, ScaleKind};
use arbitrary::{Arbitrary, Result, Unstructured};
use sdpa::{Dim, Error, Operand, Tensor, TensorMut};

/// Longest slice a case allocates for one operand.
pub const LEN_CAP: usize = 1 << 16;
/// Largest work (see the module docs) run for real.
pub const WORK_BUDGET: u128 = 1 << 20;
/// Views with at most this many elements are checked for injectivity by brute force.
const BRUTE_FORCE_ELEMENTS: u128 = 1 << 14;

/// Reads a size: mostly small, sometimes one of the values that break index arithmetic.
pub fn size(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(match urange(u, 0, 31)? {
        0 => 0,
        1 => 1,
        2..=19 => urange(u, 0, 8)?,
        20..=23 => urange(u, 0, 70)?,
        24 => 1 << urange(u, 0, 63)?,
        25 => (1usize << urange(u, 1, 63)?).wrapping_add(pick(u, &[usize::MAX, 0, 1])?),
        26 => usize::MAX - urange(u, 0, 3)?,
        27 => usize::MAX / urange(u, 1, 16)?,
        28 => isize::MAX as usize + urange(u, 0, 2)?,
        _ => uint(u, 8)? as usize,
    })
}

/// Inverse of [`size`].
pub fn write_size(w: &mut Writer, x: usize) {
    if x == 0 {
        w.urange(0, 0, 31);
    } else if x == 1 {
        w.urange(1, 0, 31);
    } else if x <= 8 {
        w.urange(2, 0, 31).urange(x, 0, 8);
    } else if x <= 70 {
        w.urange(20, 0, 31).urange(x, 0, 70);
    } else if x.is_power_of_two() {
        w.urange(24, 0, 31)
            .urange(x.trailing_zeros() as usize, 0, 63);
    } else if x >= usize::MAX - 3 {
        w.urange(26, 0, 31).urange(usize::MAX - x, 0, 3);
    } else {
        w.urange(29, 0, 31).uint(x as u64, 8);
    }
}

/// How a view is constructed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Ctor {
    /// `Tensor::new` / `TensorMut::new` with the strides of [`StrideKind`].
    New,
    /// `::bshd(dims)`.
    Bshd,
    /// `::bhsd([b, h, s, d])`.
    Bhsd,
}

/// The strides given to `new`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum StrideKind {
    /// Contiguous BSHD strides (computed with wrapping arithmetic).
    Bshd,
    /// Contiguous BHSD strides (wrapping).
    Bhsd,
    /// Four arbitrary strides.
    Explicit,
    /// BSHD strides with stride 0 on some dims.
    Broadcast,
}

/// How long the slice is, relative to what the view needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LenKind {
    /// Exactly the needed length.
    Exact,
    /// One short.
    Short,
    /// 1–8 longer.
    Long,
    /// Empty.
    Zero,
    /// 0–4096, whatever is needed.
    Any,
}

/// Slice lengths, weighted toward the exact one so that valid calls are common.
const LEN_KINDS: [LenKind; 9] = [
    LenKind::Exact,
    LenKind::Exact,
    LenKind::Exact,
    LenKind::Exact,
    LenKind::Exact,
    LenKind::Short,
    LenKind::Long,
    LenKind::Zero,
    LenKind::Any,
];

/// A slice length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LenSpec {
    /// Relative to what.
    pub kind: LenKind,
    /// The amount for `Long` and `Any`.
    pub extra: usize,
}

impl LenSpec {
    /// Exactly what is needed.
    pub const EXACT: LenSpec = LenSpec {
        kind: LenKind::Exact,
        extra: 0,
    };

    fn decode(u: &mut Unstructured<'_>) -> Result<LenSpec> {
        let kind = pick(u, &LEN_KINDS)?;
        let extra = match kind {
            LenKind::Long => urange(u, 1, 8)?,
            LenKind::Any => urange(u, 0, 4096)?,
            _ => 0,
        };
        Ok(LenSpec { kind, extra })
    }

    fn encode(&self, w: &mut Writer) {
        w.pick(self.kind, &LEN_KINDS);
        match self.kind {
            LenKind::Long => {
                w.urange(self.extra, 1, 8);
            }
            LenKind::Any => {
                w.urange(self.extra, 0, 4096);
            }
            _ => {}
        }
    }

    /// The length for a slice that needs `needed` (`None`: more than `usize` holds), at most
    /// [`LEN_CAP`].
    pub fn len(&self, needed: Option<usize>) -> usize {
        let n = needed.unwrap_or(usize::MAX);
        let want = match self.kind {
            LenKind::Exact => n,
            LenKind::Short => n.saturating_sub(1),
            LenKind::Long => n.saturating_add(self.extra),
            LenKind::Zero => 0,
            LenKind::Any => self.extra,
        };
        want.min(LEN_CAP)
    }
}

/// One view of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewSpec {
    /// The constructor.
    pub ctor: Ctor,
    /// Replace logical dim `.0` by `.1`.
    pub mutation: Option<(u8, usize)>,
    /// Strides for [`Ctor::New`].
    pub strides: StrideKind,
    /// The strides for [`StrideKind::Explicit`].
    pub explicit: [usize; 4],
    /// Stride-0 dims for [`StrideKind::Broadcast`] (bit per dim).
    pub broadcast: u8,
    /// Slice length.
    pub len: LenSpec,
}

impl ViewSpec {
    /// `bshd` with the exact length.
    pub const BSHD: ViewSpec = ViewSpec {
        ctor: Ctor::Bshd,
        mutation: None,
        strides: StrideKind::Bshd,
        explicit: [0; 4],
        broadcast: 0,
        len: LenSpec::EXACT,
    };

    /// `new` with explicit strides and the exact length.
    pub const fn explicit(strides: [usize; 4]) -> ViewSpec {
        ViewSpec {
            ctor: Ctor::New,
            strides: StrideKind::Explicit,
            explicit: strides,
            ..ViewSpec::BSHD
        }
    }

    fn decode(u: &mut Unstructured<'_>) -> Result<ViewSpec> {
        let ctor = variant(u)?;
        let mutation = if urange(u, 0, 7)? == 0 {
            Some((urange(u, 0, 3)? as u8, size(u)?))
        } else {
            None
        };
        let mut spec = ViewSpec {
            ctor,
            mutation,
            ..ViewSpec::BSHD
        };
        if ctor == Ctor::New {
            spec.strides = variant(u)?;
            match spec.strides {
                StrideKind::Explicit => {
                    for s in &mut spec.explicit {
                        *s = size(u)?;
                    }
                }
                StrideKind::Broadcast => spec.broadcast = urange(u, 1, 15)? as u8,
                _ => {}
            }
        }
        spec.len = LenSpec::decode(u)?;
        Ok(spec)
    }

    fn encode(&self, w: &mut Writer) {
        w.variant(&self.ctor);
        match self.mutation {
            None => {
                w.urange(1, 0, 7);
            }
            Some((d, x)) => {
                w.urange(0, 0, 7).urange(d.into(), 0, 3);
                write_size(w, x);
            }
        }
        if self.ctor == Ctor::New {
            w.variant(&self.strides);
            match self.strides {
                StrideKind::Explicit => {
                    for &s in &self.explicit {
                        write_size(w, s);
                    }
                }
                StrideKind::Broadcast => {
                    w.urange(self.broadcast.into(), 1, 15);
                }
                _ => {}
            }
        }
        self.len.encode(w);
    }
}

/// One API case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCase {
    /// `[B, n_q, H_kv, group, n_kv, d_k, d_v]`; `H = H_kv · group` (wrapping).
    pub sizes: [usize; 7],
    /// Q, K, V, out.
    pub views: [ViewSpec; 4],
    /// Length of the LSE slice for `attention_lse`, relative to `B · H · n_q`.
    pub lse: LenSpec,
    /// Options (new options append to [`OptSpec`]).
    pub opts: OptSpec,
    /// A `merge_partials` call (appended after the options: old inputs decode it as absent).
    pub merge: Option<MergeSpec>,
    /// An `alibi_slopes(n)` call.
    pub alibi_n: Option<usize>,
}

/// Most partials of a [`MergeSpec`].
pub const MAX_PARTIALS: usize = 5;

/// One partial of a [`MergeSpec`]: its output dims (the merged output's, one of them possibly
/// replaced) as a stride-0 view of one element, and its LSE length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialSpec {
    /// Replace dim `.0` by `.1`.
    pub mutation: Option<(u8, usize)>,
    /// LSE length relative to `B · H · n_q`.
    pub lse: LenSpec,
}

/// `merge_partials(parts, out, lse)` on the case's output view (its dims, data and strides):
/// arbitrary partial counts (0 included), dims and LSE lengths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeSpec {
    /// The partials.
    pub parts: Vec<PartialSpec>,
    /// LSE length of the merged result.
    pub lse: LenSpec,
}

impl MergeSpec {
    fn decode(u: &mut Unstructured<'_>) -> Result<MergeSpec> {
        let n = urange(u, 0, MAX_PARTIALS)?;
        let parts = (0..n)
            .map(|_| {
                let mutation = if urange(u, 0, 3)? == 0 {
                    Some((urange(u, 0, 3)? as u8, size(u)?))
                } else {
                    None
                };
                Ok(PartialSpec {
                    mutation,
                    lse: LenSpec::decode(u)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(MergeSpec {
            parts,
            lse: LenSpec::decode(u)?,
        })
    }

    fn encode(&self, w: &mut Writer) {
        w.urange(self.parts.len(), 0, MAX_PARTIALS);
        for p in &self.parts {
            match p.mutation {
                None => {
                    w.urange(1, 0, 3);
                }
                Some((d, x)) => {
                    w.urange(0, 0, 3).urange(d.into(), 0, 3);
                    write_size(w, x);
                }
            }
            p.lse.encode(w);
        }
        self.lse.encode(w);
    }
}

/// Largest `n` passed to `sdpa::alibi_slopes` while it returns a plain `Vec` (a huge `n` would
/// abort on allocation); any `n` once it returns a `Result` (see `super::alibi_slopes`).
pub const ALIBI_MAX: usize = 4096;

impl ApiCase {
    /// Reads a case.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<ApiCase> {
        let mut sizes = [0; 7];
        for s in &mut sizes {
            *s = size(u)?;
        }
        let views = [
            ViewSpec::decode(u)?,
            ViewSpec::decode(u)?,
            ViewSpec::decode(u)?,
            ViewSpec::decode(u)?,
        ];
        let lse = LenSpec::decode(u)?;
        let opts = OptSpec::decode(u)?;
        let merge = if urange(u, 0, 3)? == 3 {
            Some(MergeSpec::decode(u)?)
        } else {
            None
        };
        let alibi_n = if urange(u, 0, 3)? == 3 {
            Some(size(u)?)
        } else {
            None
        };
        Ok(ApiCase {
            sizes,
            views,
            lse,
            opts,
            merge,
            alibi_n,
        })
    }

    /// Inverse of [`ApiCase::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        for &s in &self.sizes {
            write_size(&mut w, s);
        }
        for v in &self.views {
            v.encode(&mut w);
        }
        self.lse.encode(&mut w);
        self.opts.encode(&mut w);
        w.urange(if self.merge.is_some() { 3 } else { 0 }, 0, 3);
        if let Some(m) = &self.merge {
            m.encode(&mut w);
        }
        w.urange(if self.alibi_n.is_some() { 3 } else { 0 }, 0, 3);
        if let Some(n) = self.alibi_n {
            write_size(&mut w, n);
        }
        w.bytes
    }

    /// The logical dims each view asks for (before mutation): Q, K, V, out.
    pub fn base_dims(&self) -> [[usize; 4]; 4] {
        let [b, n_q, h_kv, group, n_kv, d_k, d_v] = self.sizes;
        let h = h_kv.wrapping_mul(group);
        [
            [b, n_q, h, d_k],
            [b, n_kv, h_kv, d_k],
            [b, n_kv, h_kv, d_v],
            [b, n_q, h, d_v],
        ]
    }
}

impl<'a> Arbitrary<'a> for ApiCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        ApiCase::decode(u)
    }
}

/// The element count a view reaches, `None` if it does not fit `usize` (the documented
/// `LayoutOverflow`). Empty views need nothing.
pub fn needed_len(dims: [usize; 4], strides: [usize; 4]) -> Option<usize> {
    if dims.contains(&0) {
        return Some(0);
    }
    let span: u128 = dims
        .iter()
        .zip(&strides)
        .map(|(&n, &s)| (n as u128 - 1).saturating_mul(s as u128))
        .fold(0, u128::saturating_add);
    usize::try_from(span.saturating_add(1)).ok()
}

/// The documented injectivity rule: an empty view shares nothing; otherwise, with the dims of
/// size > 1 sorted by stride, each stride is at least the extent of the smaller-stride dims.
pub fn injective_rule(dims: [usize; 4], strides: [usize; 4]) -> bool {
    if dims.contains(&0) {
        return true;
    }
    let mut order: Vec<usize> = (0..4).filter(|&i| dims[i] > 1).collect();
    order.sort_by_key(|&i| strides[i]);
    let mut extent = 1u128;
    for &i in &order {
        if (strides[i] as u128) < extent {
            return false;
        }
        extent = extent.saturating_add((strides[i] as u128).saturating_mul(dims[i] as u128 - 1));
    }
    true
}

/// Whether no two logical indices share an element, by enumeration (small views only).
fn injective_brute_force(dims: [usize; 4], strides: [usize; 4]) -> bool {
    let mut seen = std::collections::HashSet::new();
    super::layout::indices(dims).all(|i| seen.insert(super::layout::offset(i, strides)))
}

fn bshd_strides(dims: [usize; 4]) -> Option<[usize; 4]> {
    let [_, s, h, d] = dims;
    let hd = h.checked_mul(d)?;
    Some([s.checked_mul(hd)?, hd, d, 1])
}

fn bhsd_strides(dims: [usize; 4]) -> Option<[usize; 4]> {
    let [_, s, h, d] = dims;
    let sd = s.checked_mul(d)?;
    Some([h.checked_mul(sd)?, d, sd, 1])
}

/// The strides a view uses and what its constructor must return.
fn view_model(
    spec: &ViewSpec,
    dims: [usize; 4],
    len: usize,
    writable: bool,
) -> ([usize; 4], std::result::Result<(), Error>) {
    let strides = match spec.ctor {
        Ctor::New => strides_for(spec, dims),
        Ctor::Bshd => match bshd_strides(dims) {
            Some(s) => s,
            None => return ([0; 4], Err(overflow(dims, [0; 4]))),
        },
        Ctor::Bhsd => match bhsd_strides(dims) {
            Some(s) => s,
            None => return ([0; 4], Err(overflow(dims, [0; 4]))),
        },
    };
    let result = match needed_len(dims, strides) {
        None => Err(overflow(dims, strides)),
        Some(needed) if len < needed => Err(Error::SliceTooShort { needed, got: len }),
        Some(_) if writable && !injective_rule(dims, strides) => {
            Err(Error::OverlappingOutput { dims, strides })
        }
        Some(_) => Ok(()),
    };
    (strides, result)
}

fn overflow(dims: [usize; 4], strides: [usize; 4]) -> Error {
    Error::LayoutOverflow { dims, strides }
}

/// The strides passed to `new`.
fn strides_for(spec: &ViewSpec, dims: [usize; 4]) -> [usize; 4] {
    let [_, s, h, d] = dims;
    match spec.strides {
        StrideKind::Bshd => [s.wrapping_mul(h).wrapping_mul(d), h.wrapping_mul(d), d, 1],
        StrideKind::Bhsd => [h.wrapping_mul(s).wrapping_mul(d), d, s.wrapping_mul(d), 1],
        StrideKind::Explicit => spec.explicit,
        StrideKind::Broadcast => {
            let mut st = [s.wrapping_mul(h).wrapping_mul(d), h.wrapping_mul(d), d, 1];
            for (i, x) in st.iter_mut().enumerate() {
                if spec.broadcast & (1 << i) != 0 {
                    *x = 0;
                }
            }
            st
        }
    }
}

fn bhsd_shape(dims: [usize; 4]) -> [usize; 4] {
    [dims[0], dims[2], dims[1], dims[3]]
}

fn make_view<'d>(spec: &ViewSpec, dims: [usize; 4], data: &'d [f32]) -> Result2<Tensor<'d, f32>> {
    match spec.ctor {
        Ctor::New => Tensor::new(data, dims, strides_for(spec, dims)),
        Ctor::Bshd => Tensor::bshd(data, dims),
        Ctor::Bhsd => Tensor::bhsd(data, bhsd_shape(dims)),
    }
}

fn make_view_mut<'d>(
    spec: &ViewSpec,
    dims: [usize; 4],
    data: &'d mut [f32],
) -> Result2<TensorMut<'d, f32>> {
    match spec.ctor {
        Ctor::New => TensorMut::new(data, dims, strides_for(spec, dims)),
        Ctor::Bshd => TensorMut::bshd(data, dims),
        Ctor::Bhsd => TensorMut::bhsd(data, bhsd_shape(dims)),
    }
}

type Result2<T> = std::result::Result<T, Error>;

/// One entry point, called on an output view and an optional LSE slice.
type Call<'c> = dyn Fn(&mut TensorMut<'_, f32>, Option<&mut [f32]>) -> Result2<()> + 'c;

/// `Ok` when `errors` is empty, else one of them. Scales compare by bits (NaN ≠ NaN).
pub fn assert_one_of(what: &str, got: &Result2<()>, errors: &[Error]) {
    let same = |a: &Error, b: &Error| match (a, b) {
        (Error::InvalidScale(x), Error::InvalidScale(y))
        | (Error::InvalidSoftcap(x), Error::InvalidSoftcap(y)) => x.to_bits() == y.to_bits(),
        // The reason text is not part of the contract: the operand and the index are.
        (
            Error::InvalidValue {
                operand: a,
                index: i,
                ..
            },
            Error::InvalidValue {
                operand: b,
                index: j,
                ..
            },
        ) => a == b && i == j,
        _ => a == b,
    };
    match got {
        Ok(()) => assert!(errors.is_empty(), "{what}: Ok, want one of {errors:?}"),
        Err(e) => assert!(
            errors.iter().any(|x| same(x, e)),
            "{what}: {e:?}, want {}",
            if errors.is_empty() {
                "Ok".to_string()
            } else {
                format!("one of {errors:?}")
            }
        ),
    }
}

/// Every documented validation rule of an attention call that these operands break.
/// `out_dims: None` for `error_bounds` (no output), `lse_len: None` for calls without LSE.
pub fn expected_errors(
    q: [usize; 4],
    k: [usize; 4],
    v: [usize; 4],
    out_dims: Option<[usize; 4]>,
    lse_len: Option<usize>,
    opts: &OptData,
) -> Vec<Error> {
    let [batch, n_q, heads, d_k] = q;
    let [_, n_kv, kv_heads, _] = k;
    let d_v = v[3];
    let mut errors = Vec::new();
    let mut shape = |operand, got: [usize; 4], want: [usize; 4]| {
        for ((g, w), dim) in got.iter().zip(want).zip(Dim::ALL) {
            if *g != w {
                errors.push(Error::ShapeMismatch {
                    operand,
                    dim,
                    expected: w,
                    got: *g,
                });
            }
        }
    };
    shape(Operand::Key, k, [batch, n_kv, kv_heads, d_k]);
    shape(Operand::Value, v, [batch, n_kv, kv_heads, d_v]);
    if let Some(o) = out_dims {
        shape(Operand::Output, o, [batch, n_q, heads, d_v]);
    }
    if kv_heads == 0 || heads == 0 || heads % kv_heads != 0 {
        errors.push(Error::HeadsNotDivisible { heads, kv_heads });
    }
    if d_k == 0 {
        errors.push(Error::ZeroHeadDim);
    }
    if let Some(got) = lse_len {
        let want = batch.checked_mul(heads).and_then(|x| x.checked_mul(n_q));
        if want != Some(got) {
            errors.push(Error::LengthMismatch {
                operand: Operand::Lse,
                expected: want.unwrap_or(usize::MAX),
                got,
            });
        }
    }
    if let Some(s) = opts.spec.scale_value() {
        if !s.is_finite() {
            errors.push(Error::InvalidScale(s));
        }
    }
    errors.extend(opts.errors());
    errors
}

/// Counts of what [`check`] reached, for the stable test.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApiStats {
    /// Cases.
    pub cases: usize,
    /// Cases whose four views were all valid.
    pub views_valid: usize,
    /// Calls expected to fail validation.
    pub rejected_calls: usize,
    /// Valid calls run for real.
    pub ran: usize,
    /// Valid calls too large to run, validated only.
    pub validated_only: usize,
}

impl ApiStats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &ApiStats) {
        self.cases += other.cases;
        self.views_valid += other.views_valid;
        self.rejected_calls += other.rejected_calls;
        self.ran += other.ran;
        self.validated_only += other.validated_only;
    }
}

fn mul(xs: &[usize]) -> u128 {
    xs.iter().fold(1u128, |a, &x| a.saturating_mul(x as u128))
}

/// Runs and checks one case; panics with a description on any violation.
pub fn check(case: &ApiCase) -> ApiStats {
    let mut stats = ApiStats {
        cases: 1,
        ..ApiStats::default()
    };
    let mut dims = case.base_dims();
    for (d, spec) in dims.iter_mut().zip(&case.views) {
        if let Some((i, x)) = spec.mutation {
            d[usize::from(i) % 4] = x;
        }
    }
    // The slices, their lengths from the model, and the constructors against the model.
    let mut datas: Vec<Vec<f32>> = Vec::new();
    let mut models = Vec::new();
    for (n, (spec, &d)) in case.views.iter().zip(&dims).enumerate() {
        let writable = n == 3;
        let (probe_strides, _) = view_model(spec, d, 0, writable);
        let len = spec.len.len(needed_len(d, probe_strides));
        let data: Vec<f32> = if writable {
            vec![f32::from_bits(SENTINEL); len]
        } else {
            (0..len)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
                .collect()
        };
        let model = view_model(spec, d, len, writable);
        datas.push(data);
        models.push(model);
    }
    let names = ["q", "k", "v", "out"];
    let mut all_valid = true;
    for n in 0..4 {
        let (strides, want) = &models[n];
        let what = format!(
            "{} view {:?} dims {:?}",
            names[n], case.views[n].ctor, dims[n]
        );
        let got = if n == 3 {
            let mut data = datas[3].clone();
            let r = make_view_mut(&case.views[n], dims[n], &mut data);
            if let Ok(mut t) = r {
                check_view_mut(&what, &mut t, dims[n], *strides);
                Ok(())
            } else {
                r.map(|_| ())
            }
        } else {
            let r = make_view(&case.views[n], dims[n], &datas[n]);
            if let Ok(t) = r {
                check_view(&what, &t, dims[n], *strides);
                Ok(())
            } else {
                r.map(|_| ())
            }
        };
        assert_eq!(
            &got,
            want,
            "{what} strides {strides:?} len {}",
            datas[n].len()
        );
        all_valid &= got.is_ok();
    }
    if let Some(n) = case.alibi_n {
        check_alibi_slopes(n);
    }
    if let (Some(m), Ok(())) = (&case.merge, &models[3].1) {
        check_merge(m, dims[3], &case.views[3], &datas[3], &mut stats);
    }
    if !all_valid {
        return stats;
    }
    stats.views_valid = 1;
    check_calls(case, dims, &models, &mut datas, &mut stats);
    stats
}

fn check_view(what: &str, t: &Tensor<'_, f32>, dims: [usize; 4], strides: [usize; 4]) {
    assert_eq!((t.dims(), t.strides()), (dims, strides), "{what}");
    for index in probe_indices(dims) {
        let inside = index.iter().zip(&dims).all(|(i, n)| i < n);
        match t.get(index) {
            Some(x) => {
                assert!(
                    inside,
                    "{what}: get({index:?}) outside the dims returned Some"
                );
                let o = super::layout::offset(index, strides);
                assert!(
                    std::ptr::eq(x, &t.data()[o]),
                    "{what}: get({index:?}) wrong element"
                );
            }
            None => assert!(
                !inside,
                "{what}: get({index:?}) inside the dims returned None"
            ),
        }
    }
}

fn check_view_mut(what: &str, t: &mut TensorMut<'_, f32>, dims: [usize; 4], strides: [usize; 4]) {
    assert_eq!((t.dims(), t.strides()), (dims, strides), "{what}");
    if mul(&dims) <= BRUTE_FORCE_ELEMENTS {
        assert!(
            injective_brute_force(dims, strides),
            "{what}: accepted a writable view with strides {strides:?} that maps two indices to one element"
        );
    }
    for index in probe_indices(dims) {
        let inside = index.iter().zip(&dims).all(|(i, n)| i < n);
        assert_eq!(
            t.get_mut(index).is_some(),
            inside,
            "{what}: get_mut({index:?})"
        );
    }
    check_view(what, &t.as_tensor(), dims, strides);
}

/// The first, last and one-past-the-end index of every dim, and a middle one.
fn probe_indices(dims: [usize; 4]) -> Vec<[usize; 4]> {
    let mut out = vec![
        [0; 4],
        dims,
        dims.map(|n| n.saturating_sub(1)),
        dims.map(|n| n / 2),
    ];
    for d in 0..4 {
        let mut i = [0; 4];
        i[d] = dims[d];
        out.push(i);
        i[d] = usize::MAX;
        out.push(i);
    }
    out
}

fn check_calls(
    case: &ApiCase,
    dims: [[usize; 4]; 4],
    models: &[([usize; 4], Result2<()>)],
    datas: &mut [Vec<f32>],
    stats: &mut ApiStats,
) {
    let [qd, kd, vd, od] = dims;
    let [batch, n_q, heads, d_k] = qd;
    let [_, n_kv, kv_heads, _] = kd;
    let d_v = vd[3];
    let opt_data = case.opts.materialize(batch, n_q, heads, n_kv);
    let lse_want = batch.checked_mul(heads).and_then(|x| x.checked_mul(n_q));
    let lse_len = case.lse.len(lse_want);
    let (out_data, inputs) = datas.split_last_mut().expect("four slices");
    let q = make_view(&case.views[0], qd, &inputs[0]).expect("checked above");
    let k = make_view(&case.views[1], kd, &inputs[1]).expect("checked above");
    let v = make_view(&case.views[2], vd, &inputs[2]).expect("checked above");
    let opts = opt_data.options();

    let e_plain = expected_errors(qd, kd, vd, Some(od), None, &opt_data);
    let e_lse = expected_errors(qd, kd, vd, Some(od), Some(lse_len), &opt_data);
    let e_bounds = expected_errors(qd, kd, vd, None, None, &opt_data);

    let plus1 = |x: usize| x.saturating_add(1);
    let dims_sum = plus1(d_k.saturating_add(d_v));
    let work = mul(&[batch, heads, plus1(n_q), plus1(n_kv), dims_sum]).saturating_add(mul(&[
        batch,
        kv_heads,
        plus1(n_kv),
        dims_sum,
    ]));
    let cheap = work <= WORK_BUDGET;
    let reference_cheap = cheap && mul(&[n_q, n_kv]) <= WORK_BUDGET;
    let no_work = batch == 0 || n_q == 0;

    let out_strides = models[3].0;
    let fresh_out = |data: &[f32]| {
        data.iter()
            .map(|_| f32::from_bits(SENTINEL))
            .collect::<Vec<_>>()
    };

    // Runs `call` on a fresh output slice; checks the answer against `errors` and that a
    // failed call wrote nothing. Returns the output and LSE slices.
    let rejected = std::cell::Cell::new(0);
    let run = |what: &str,
               errors: &[Error],
               lse: Option<usize>,
               call: &Call<'_>|
     -> (Vec<f32>, Vec<f32>, bool) {
        let mut out = fresh_out(out_data);
        let mut lse_buf = vec![f32::from_bits(SENTINEL); lse.unwrap_or(0)];
        let mut view = make_view_mut(&case.views[3], od, &mut out).expect("checked above");
        let r = call(&mut view, lse.map(|_| &mut lse_buf[..]));
        // A wide option value may be refused with a typed error (`OptData::may_refuse`).
        if !r.as_ref().is_err_and(|e| opt_data.may_refuse(e)) {
            assert_one_of(what, &r, errors);
        }
        if r.is_err() {
            rejected.set(rejected.get() + 1);
            assert!(
                out.iter().chain(&lse_buf).all(|x| x.to_bits() == SENTINEL),
                "{what}: failed with {r:?} but wrote output"
            );
        }
        (out, lse_buf, r.is_ok())
    };

    let ok_plain = e_plain.is_empty();
    let ok_lse = e_lse.is_empty();
    if !ok_plain || cheap || (no_work || d_v == 0) {
        run("attention", &e_plain, None, &|o, _| {
            sdpa::attention(&q, &k, &v, o, &opts)
        });
    }
    if !ok_plain || reference_cheap {
        run("reference::attention", &e_plain, None, &|o, _| {
            sdpa::reference::attention(&q, &k, &v, o, &opts)
        });
    }
    if !ok_lse || cheap || no_work {
        run("attention_lse", &e_lse, Some(lse_len), &|o, l| {
            sdpa::attention_lse(&q, &k, &v, o, l.expect("lse"), &opts)
        });
    }
    if !ok_lse || reference_cheap {
        run(
            "reference::attention_lse",
            &e_lse,
            Some(lse_len),
            &|o, l| sdpa::reference::attention_lse(&q, &k, &v, o, l.expect("lse"), &opts),
        );
    }
    if !ok_lse || reference_cheap {
        // `reference::compare` reads the output the call would write: the call's checks,
        // before any work (so `Ok` or one of its errors).
        let out = fresh_out(out_data);
        let lse_buf = vec![0.0f32; lse_len];
        if let Ok(view) = make_view(&case.views[3], od, &out) {
            let r = sdpa::reference::compare(&q, &k, &v, &view, Some(&lse_buf), &opts);
            let r = r.map(|d| assert!(!d.ratio.is_nan(), "reference::compare: a NaN ratio"));
            if !r.as_ref().is_err_and(|e| opt_data.may_refuse(e)) {
                assert_one_of("reference::compare", &r, &e_lse);
            }
        }
    }
    if !e_bounds.is_empty() || (cheap && mul(&[batch, heads, n_q]) <= WORK_BUDGET) {
        let r = sdpa::reference::error_bounds(&q, &k, &v, &opts).map(|b| {
            assert_eq!(b.len(), batch * heads * n_q, "error_bounds length");
        });
        if !r.as_ref().is_err_and(|e| opt_data.may_refuse(e)) {
            assert_one_of("reference::error_bounds", &r, &e_bounds);
        }
    }
    stats.rejected_calls += rejected.get();
    if !ok_plain {
        return;
    }
    if !cheap {
        // Too large to run: validation must still refuse a wrong LSE length and a NaN scale.
        stats.validated_only += 1;
        let wrong = match lse_want {
            Some(0) => 1,
            _ => 0,
        };
        let e = expected_errors(qd, kd, vd, Some(od), Some(wrong), &opt_data);
        run(
            "attention_lse (wrong LSE length)",
            &e,
            Some(wrong),
            &|o, l| sdpa::attention_lse(&q, &k, &v, o, l.expect("lse"), &opts),
        );
        let mut nan_data = opt_data.clone();
        nan_data.spec.scale = ScaleKind::Bits;
        nan_data.spec.scale_bits = f32::NAN.to_bits();
        let nan_opts = nan_data.options();
        let e = expected_errors(qd, kd, vd, Some(od), None, &nan_data);
        run("attention (NaN scale)", &e, None, &|o, _| {
            sdpa::attention(&q, &k, &v, o, &nan_opts)
        });
        return;
    }
    if !reference_cheap || !ok_lse {
        return;
    }
    // Small and valid: run everything and compare like the differential target does.
    stats.ran += 1;
    let (fused, fused_lse, ok_fused) = run("attention_lse", &[], Some(lse_len), &|o, l| {
        sdpa::attention_lse(&q, &k, &v, o, l.expect("lse"), &opts)
    });
    let (reference, reference_lse, ok_ref) =
        run("reference::attention_lse", &[], Some(lse_len), &|o, l| {
            sdpa::reference::attention_lse(&q, &k, &v, o, l.expect("lse"), &opts)
        });
    let Ok(bounds) = sdpa::reference::error_bounds(&q, &k, &v, &opts) else {
        return; // refused a wide option value (checked above)
    };
    if !(ok_fused && ok_ref) {
        return; // refused a wide option value (checked in `run`)
    }
    let buffer = |data: Vec<f32>, dims, strides| Buffer {
        start: 0,
        data,
        dims,
        strides,
    };
    let fused = buffer(fused, od, out_strides);
    let reference = buffer(reference, od, out_strides);
    for (name, b) in [
        ("attention_lse", &fused),
        ("reference::attention_lse", &reference),
    ] {
        untouched_outside_view(name, b);
    }
    for (name, l) in [("attention_lse", &fused_lse), ("reference", &reference_lse)] {
        assert!(
            l.iter().all(|x| x.to_bits() != SENTINEL),
            "{name}: lse not fully written"
        );
    }
    let inputs = Inputs {
        q: buffer(inputs[0].clone(), qd, q.strides()),
        k: buffer(inputs[1].clone(), kd, k.strides()),
        v: buffer(inputs[2].clone(), vd, v.strides()),
    };
    let shape = Shape {
        batch,
        heads,
        kv_heads,
        n_q,
        n_kv,
        d_k,
        d_v,
    };
    check_rows(
        &Rows {
            shape: &shape,
            opts: &opt_data,
            inputs: &inputs,
            fused: &fused,
            fused_lse: &fused_lse,
            reference: &reference,
            reference_lse: &reference_lse,
            bounds: &bounds,
        },
        &mut Stats::default(),
    );
}

/// `alibi_slopes(n)`: `n` slopes in (0, 1], decreasing over each power-of-two run (for `n`
/// within [`ALIBI_MAX`], see there).
fn check_alibi_slopes(n: usize) {
    if n > ALIBI_MAX && !super::alibi_slopes_is_fallible() {
        return;
    }
    // Counts between 2^20 and what no allocator can grant may succeed through overcommit and
    // then fill gigabytes; the ends of the range are what must not abort.
    if n > 1 << 20 && n <= isize::MAX as usize / 4 {
        return;
    }
    // Ok, or a typed error for a count too large to allocate.
    let Ok(s) = super::alibi_slopes(n) else {
        assert!(n > ALIBI_MAX, "alibi_slopes({n}) failed");
        return;
    };
    assert_eq!(s.len(), n, "alibi_slopes({n}) length");
    assert!(
        s.iter().all(|&x| x > 0.0 && x <= 1.0),
        "alibi_slopes({n}): a slope outside (0, 1]"
    );
}

/// `merge_partials` on the case's output view (`out_dims`, valid) with the partials of `m`:
/// `Ok` or one of the documented errors, nothing written on an error.
fn check_merge(
    m: &MergeSpec,
    out_dims: [usize; 4],
    out_spec: &ViewSpec,
    out_data: &[f32],
    stats: &mut ApiStats,
) {
    let [batch, n_q, heads, _] = out_dims;
    let rows = batch.checked_mul(heads).and_then(|x| x.checked_mul(n_q));
    let one = [0.5f32];
    let part_dims: Vec<[usize; 4]> = m
        .parts
        .iter()
        .map(|p| {
            let mut d = out_dims;
            if let Some((i, x)) = p.mutation {
                d[usize::from(i) % 4] = x;
            }
            d
        })
        .collect();
    let lses: Vec<Vec<f32>> = m
        .parts
        .iter()
        .map(|p| vec![0.25; p.lse.len(rows)])
        .collect();
    // Every partial is a stride-0 view of one element: any dims, no allocation.
    let parts: Vec<sdpa::Partial<'_>> = part_dims
        .iter()
        .zip(&lses)
        .map(|(&d, l)| sdpa::Partial {
            out: Tensor::new(&one, d, [0; 4]).expect("a stride-0 view of one element"),
            lse: l,
        })
        .collect();
    let mut lse = vec![f32::from_bits(SENTINEL); m.lse.len(rows)];
    let mut errors = Vec::new();
    if parts.is_empty() {
        errors.push(Error::NoPartials);
    }
    let rows_or_max = rows.unwrap_or(usize::MAX);
    if lse.len() != rows_or_max {
        errors.push(Error::LengthMismatch {
            operand: Operand::Lse,
            expected: rows_or_max,
            got: lse.len(),
        });
    }
    for (d, l) in part_dims.iter().zip(&lses) {
        for (k, dim) in Dim::ALL.into_iter().enumerate() {
            if d[k] != out_dims[k] {
                errors.push(Error::ShapeMismatch {
                    operand: Operand::Partial,
                    dim,
                    expected: out_dims[k],
                    got: d[k],
                });
            }
        }
        if l.len() != rows_or_max {
            errors.push(Error::LengthMismatch {
                operand: Operand::Partial,
                expected: rows_or_max,
                got: l.len(),
            });
        }
    }
    let mut out = vec![f32::from_bits(SENTINEL); out_data.len()];
    let mut view = make_view_mut(out_spec, out_dims, &mut out).expect("a valid output view");
    let r = sdpa::merge_partials(&parts, &mut view, &mut lse);
    assert_one_of("merge_partials", &r, &errors);
    if r.is_err() {
        stats.rejected_calls += 1;
        assert!(
            out.iter().chain(&lse).all(|x| x.to_bits() == SENTINEL),
            "merge_partials failed with {r:?} but wrote output"
        );
    } else {
        // Every partial holds 0.5 with LSE 0.25: the merge is 0.5, LSE 0.25 + ln(#parts).
        let want_lse = 0.25 + (parts.len() as f64).ln();
        for &x in &lse {
            assert!(
                (f64::from(x) - want_lse).abs() <= 1e-6,
                "merge_partials lse {x}, want {want_lse}"
            );
        }
        for i in super::layout::indices(out_dims) {
            let x = out[super::layout::offset(i, view_strides(out_spec, out_dims))];
            assert!((x - 0.5).abs() <= 1e-6, "merge_partials out {x}, want 0.5");
        }
    }
}

/// The strides a valid view of `spec` has.
fn view_strides(spec: &ViewSpec, dims: [usize; 4]) -> [usize; 4] {
    view_model(spec, dims, usize::MAX, true).0
}
