//! Q into the item's panels (`pack_queries`): the only stage that reads Q, and the only one
//! compiled per Q type (once per backend, as its own entry point); bf16 products' pairs of Q.

use super::work::{Ctx, Item, Tiles};
use crate::element::Element;
use crate::fused::kv::{convert, KvSource};
use crate::microkernel::dpbf16::{Bf16Dot, PANEL as PAIR_PANEL};
use crate::problem::Problem;
use crate::simd::{Kernel, Lanes, Simd};
use crate::tensor::{AnyTensor, Tensor};

/// Q of the item's rows, transposed into panels of two vectors of rows (as given: the scale
/// is applied to the scores; padding rows are zero), or, for few rows, as rows of `d_k`. Run
/// through its own entry point ([`PackQueries`]), compiled once per backend for every Q type
/// and K/V source: it runs once per work item.
#[inline(always)]
pub(super) fn pack_queries<S: Simd>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    q: &AnyTensor<'_>,
    item: &Item,
    t: &Tiles,
    qt: &mut [f32],
) {
    let (problem, group) = (cx.problem, cx.blocking.group);
    match *q {
        AnyTensor::F32(q) => s.run(PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            q,
        }),
        AnyTensor::F16(q) => s.run(PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            q,
        }),
        AnyTensor::Bf16(q) => s.run(PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            q,
        }),
    }
}

/// [`pack_queries`] of one Q type, as a [`Kernel`].
pub(super) struct PackQueries<'a, Q> {
    problem: &'a Problem<'a>,
    group: usize,
    item: &'a Item,
    t: &'a Tiles,
    qt: &'a mut [f32],
    q: Q,
}

impl<Q: Element + Lanes> Kernel for PackQueries<'_, Tensor<'_, Q>> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let PackQueries {
            problem,
            group,
            item,
            t,
            qt,
            q,
        } = self;
        pack_rows(s, problem, group, &q, item, t, qt);
    }
}

/// The body of [`PackQueries`].
#[inline(always)]
pub(super) fn pack_rows<S: Simd, Q: Element + Lanes>(
    s: S,
    problem: &Problem<'_>,
    group: usize,
    q: &Tensor<'_, Q>,
    item: &Item,
    t: &Tiles,
    qt: &mut [f32],
) {
    let nr = 2 * S::LANES;
    let [qs_b, qs_s, qs_h, qs_d] = q.strides();
    let q = q.data();
    // Where row `r` of the item starts in `q`.
    let base = |r: usize| {
        let (h, i) = item.row_origin(group, r);
        let (b, i) = problem.q_row(item.batch, i);
        b * qs_b + i * qs_s + h * qs_h
    };
    if t.by_channels {
        for r in 0..t.rows {
            let base = base(r);
            let row = &mut qt[r * t.d_k..(r + 1) * t.d_k];
            if qs_d == 1 && t.d_k > 0 {
                // Whole vectors (decode packs these rows once per key split: element by
                // element they were 7% of a decode step at n_kv = 4096).
                convert(s, &q[base..base + t.d_k], row);
            } else {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = q[base + c * qs_d].to_f32();
                }
            }
        }
        return;
    }
    if qs_d == 1 {
        // Whole vectors of channels, transposed in registers: element by element this was
        // 14% of a short prefill (n = 128, d = 64).
        return transpose_rows(s, q, base, t, qt);
    }
    qt[..t.rows.div_ceil(nr) * nr * t.d_k].fill(0.0);
    for r in 0..t.rows {
        let base = base(r);
        let panel = &mut qt[(r / nr) * nr * t.d_k..][..nr * t.d_k];
        for c in 0..t.d_k {
            panel[c * nr + r % nr] = q[base + c * qs_d].to_f32();
        }
    }
}

/// [`pack_queries`] for rows of unit channel stride: row `r` of the item is `q[base(r) ..][..d_k]`.
/// `LANES` rows at a time, a `LANES × LANES` block of them is loaded (converted to f32),
/// transposed in registers and stored as `LANES` steps of the panel; channels past the last
/// whole vector one by one. Padding rows are zero.
#[inline(always)]
pub(super) fn transpose_rows<S: Simd, E: Lanes>(
    s: S,
    q: &[E],
    base: impl Fn(usize) -> usize,
    t: &Tiles,
    qt: &mut [f32],
) {
    let (lanes, d) = (S::LANES, t.d_k);
    let nr = 2 * lanes;
    let whole = d / lanes * lanes;
    let panels = t.rows.div_ceil(nr);
    for r0 in (0..panels * nr).step_by(lanes) {
        let panel = &mut qt[(r0 / nr) * nr * d..][..nr * d];
        let lane0 = r0 % nr;
        let live = t.rows.saturating_sub(r0).min(lanes);
        let mut rows: [&[E]; 16] = [&[]; 16];
        for (i, row) in rows[..live].iter_mut().enumerate() {
            *row = &q[base(r0 + i)..][..d];
        }
        let mut v = [s.splat(0.0); 16];
        for c0 in (0..whole).step_by(lanes) {
            for (x, row) in v[..live].iter_mut().zip(&rows) {
                *x = E::load(s, &row[c0..c0 + lanes]);
            }
            for x in &mut v[live..lanes] {
                *x = s.splat(0.0);
            }
            s.transpose(&mut v[..lanes]);
            for (c, &x) in v[..lanes].iter().enumerate() {
                s.store(&mut panel[(c0 + c) * nr + lane0..], x);
            }
        }
        for c in whole..d {
            let step = &mut panel[c * nr + lane0..][..lanes];
            for (i, x) in step.iter_mut().enumerate() {
                *x = if i < live { rows[i][c].scalar() } else { 0.0 };
            }
        }
    }
}

/// Q by channel pairs, rounded to bf16: the f32 Qᵀ panels for [`Bf16Dot::scores_panel`] (step
/// `p` of a pair panel holds, for each row, channels `2p` and `2p + 1`; zero past an odd
/// `d_k`), or, by channels, Q's rows for [`Bf16Dot::dots`] (row `r` at `pairs[r · ⌈d_k /
/// 2⌉ ..]`).
pub(super) fn pair_queries(bf: Bf16Dot, t: &Tiles, qt: &[f32], pairs: &mut [f32]) {
    let (nr, d, d2) = (PAIR_PANEL, t.d_k, t.d_k.div_ceil(2));
    if t.by_channels {
        for r in 0..t.rows {
            bf.pair_row(&qt[r * d..][..d], &mut pairs[r * d2..][..d2]);
        }
        return;
    }
    for panel in 0..t.rows.div_ceil(nr) {
        let src = &qt[panel * nr * d..][..nr * d];
        let dst = &mut pairs[panel * nr * d2..][..nr * d2];
        for (p, step) in dst.chunks_exact_mut(nr).enumerate() {
            let odd = (2 * p + 1 < d).then(|| &src[(2 * p + 1) * nr..][..nr]);
            bf.interleave(&src[2 * p * nr..][..nr], odd, step);
        }
    }
}
