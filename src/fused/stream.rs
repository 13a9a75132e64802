//! One work item of the fused kernel: a block of stacked query rows streamed against its key
//! blocks with the online softmax (FlashAttention-2 forward, `../shared/NOTES.md` §2).
//!
//! Scores live in the log2 domain: right after the dot products they are multiplied by `scale`
//! and `log₂e`, so `exp(s − m)` becomes `2^(s' − m')` and every later step (softcap, bias,
//! ALiBi, max, exponent) works on `s' = s·log₂e`. The running max `m` starts
//! at `−f32::MAX` instead of `−∞` and never goes below it, so `s − m` is `−∞` (weight exactly 0)
//! for masked scores and never `−∞ − (−∞) = NaN`, with no branch.

use super::blocking::Blocking;
use crate::microkernel::{output_tile, scores_tile};
use crate::problem::Problem;
use crate::simd::{exp2, Simd};
use crate::tensor::Tensor;

/// The operands of one call, shared by every work item.
pub(crate) struct Operands<'a> {
    pub problem: &'a Problem<'a>,
    pub blocking: Blocking,
    pub q: Tensor<'a, f32>,
    pub k: Tensor<'a, f32>,
    pub v: Tensor<'a, f32>,
}

/// One work item: `group` query heads (those sharing key/value head `kv_head`) × query rows
/// `q_start .. q_start + q_len` of batch `batch`, over keys `kv_start .. kv_end`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub batch: usize,
    pub kv_head: usize,
    pub q_start: usize,
    pub q_len: usize,
    pub kv_start: usize,
    pub kv_end: usize,
}

impl Item {
    /// Stacked rows: `group × q_len`, row `r` is head `kv_head·group + r / q_len`, query
    /// position `q_start + r % q_len`.
    pub fn rows(&self, group: usize) -> usize {
        group * self.q_len
    }

    /// The (query head, query position) of stacked row `r`.
    pub fn row_origin(&self, group: usize, r: usize) -> (usize, usize) {
        (
            self.kv_head * group + r / self.q_len,
            self.q_start + r % self.q_len,
        )
    }
}

/// Per-worker buffers, sized once per call from the [`Blocking`] (never from sequence length).
pub(crate) struct Scratch {
    /// Qᵀ panels: panel `t` (rows `2L·t ..`, `L` lanes) holds `d_k` steps of `2L` rows.
    qt: Vec<f32>,
    /// Sᵀ then Pᵀ for one key block: key `j`'s rows at `st[j · rows_pad ..]`.
    st: Vec<f32>,
    /// The packed V block: `kv_block × d_v_pad`, zero-padded columns.
    v: Vec<f32>,
    /// The K block, packed only when K's head dimension is strided.
    k: Vec<f32>,
    /// Output accumulator, `rows_pad × d_v_pad`.
    pub o: Vec<f32>,
    /// Running max (log2 domain) per row.
    pub m: Vec<f32>,
    /// Running sum of weights per row.
    pub l: Vec<f32>,
    /// Rescale factor of the current block per row.
    alpha: Vec<f32>,
    /// Visible keys `[lo, hi)` per row.
    lo: Vec<usize>,
    hi: Vec<usize>,
    /// ALiBi per row: the diagonal position `i + off` and `slope · log₂e`.
    alibi_pos: Vec<f32>,
    alibi_slope: Vec<f32>,
    /// Score tiles computed (for the test hook [`crate::Options::count_score_tiles`]).
    pub tiles: u64,
}

impl Scratch {
    /// Buffers for `b`, or `None` if they cannot be allocated (a broadcast Q or K view can
    /// declare an enormous head size over a tiny slice). `pack_k`: K's head dim is strided, so
    /// its blocks need a packing buffer too.
    pub fn try_new(b: &Blocking, pack_k: bool) -> Option<Self> {
        fn zeroed<T: Clone + Default>(len: Option<usize>) -> Option<Vec<T>> {
            let len = len?;
            let mut v = Vec::new();
            v.try_reserve_exact(len).ok()?;
            v.resize(len, T::default());
            Some(v)
        }
        let rows_pad = b.rows_pad();
        let k_len = if pack_k {
            b.kv_block.checked_mul(b.d_k)
        } else {
            Some(0)
        };
        Some(Scratch {
            qt: zeroed(rows_pad.checked_mul(b.d_k))?,
            st: zeroed(b.kv_block.checked_mul(rows_pad))?,
            v: zeroed(b.kv_block.checked_mul(b.d_v_pad))?,
            k: zeroed(k_len)?,
            o: zeroed(rows_pad.checked_mul(b.d_v_pad))?,
            m: zeroed(Some(rows_pad))?,
            l: zeroed(Some(rows_pad))?,
            alpha: zeroed(Some(rows_pad))?,
            lo: zeroed(Some(rows_pad))?,
            hi: zeroed(Some(rows_pad))?,
            alibi_pos: zeroed(Some(rows_pad))?,
            alibi_slope: zeroed(Some(rows_pad))?,
            tiles: 0,
        })
    }

    /// Bytes [`Scratch::try_new`] asks for (saturating), for the error it reports.
    pub fn bytes(b: &Blocking, pack_k: bool) -> usize {
        let rows_pad = b.rows_pad();
        let floats = [
            rows_pad.saturating_mul(b.d_k),
            b.kv_block.saturating_mul(rows_pad),
            b.kv_block.saturating_mul(b.d_v_pad),
            if pack_k {
                b.kv_block.saturating_mul(b.d_k)
            } else {
                0
            },
            rows_pad.saturating_mul(b.d_v_pad),
            rows_pad.saturating_mul(5),
        ];
        let words = 2 * rows_pad * std::mem::size_of::<usize>();
        floats
            .iter()
            .fold(words, |acc, &f| acc.saturating_add(f.saturating_mul(4)))
    }
}

/// Runs one work item: afterwards `scratch.o[r]` holds the unnormalized output of row `r`,
/// `scratch.l[r]` its sum of weights and `scratch.m[r]` its max score, log2 domain
/// (`l = 0` for a row that saw no key).
#[inline(always)]
pub(crate) fn stream<S: Simd>(s: S, ops: &Operands<'_>, item: &Item, sc: &mut Scratch) {
    let p = ops.problem;
    let bl = &ops.blocking;
    debug_assert_eq!((S::LANES, S::TILE), (bl.geometry.lanes, bl.geometry.tile));
    #[allow(non_snake_case)] // the register-geometry constants of the module docs
    let (LANES, NR, MR) = (S::LANES, 2 * S::LANES, S::TILE);
    let group = bl.group;
    let rows = item.rows(group);
    let rows_pad = rows.div_ceil(LANES) * LANES;
    let d_k = p.d_k;
    let d_vp = bl.d_v_pad;

    // Q, transposed into panels of two vectors of rows (as given: the scale is applied to
    // the scores).
    let [qs_b, qs_s, qs_h, qs_d] = ops.q.strides();
    let q_data = ops.q.data();
    sc.qt[..rows_pad.div_ceil(NR) * NR * d_k].fill(0.0);
    debug_assert!(rows_pad.div_ceil(NR) * NR <= bl.rows_pad());
    for r in 0..rows {
        let (h, i) = item.row_origin(group, r);
        let base = item.batch * qs_b + i * qs_s + h * qs_h;
        let panel = &mut sc.qt[(r / NR) * NR * d_k..][..NR * d_k];
        for c in 0..d_k {
            panel[c * NR + r % NR] = q_data[base + c * qs_d];
        }
    }

    // Visible keys of each row, restricted to the item's key range.
    let mut any_lo = usize::MAX;
    let mut any_hi = 0;
    for r in 0..rows {
        let (h, i) = item.row_origin(group, r);
        if let Some(slopes) = p.alibi {
            sc.alibi_pos[r] = (i as i128 + p.diag_offset) as f32;
            sc.alibi_slope[r] = slopes[h] * std::f32::consts::LOG2_E;
        }
        let (lo, hi) = p.visible_keys(item.batch, i);
        let (lo, hi) = (lo.max(item.kv_start), hi.min(item.kv_end));
        let (lo, hi) = if lo < hi { (lo, hi) } else { (0, 0) };
        sc.lo[r] = lo;
        sc.hi[r] = hi;
        if lo < hi {
            any_lo = any_lo.min(lo);
            any_hi = any_hi.max(hi);
        }
    }
    sc.m[..rows_pad].fill(-f32::MAX);
    sc.l[..rows_pad].fill(0.0);
    sc.o[..rows_pad * d_vp].fill(0.0);
    if any_lo >= any_hi {
        return;
    }

    let [ks_b, ks_s, ks_h, ks_d] = ops.k.strides();
    let k_data = ops.k.data();
    let k_contiguous = ks_d == 1;
    debug_assert!(k_contiguous || sc.k.len() >= bl.kv_block * d_k);

    let [vs_b, vs_s, vs_h, vs_d] = ops.v.strides();
    // Nothing to read when d_v = 0 (LSE only): the view may be empty, with any strides.
    let v_in_place = vs_d == 1 && p.d_v == d_vp && p.d_v > 0;
    let mut j0 = any_lo;
    while j0 < any_hi {
        let j1 = (j0 + bl.kv_block).min(any_hi);
        let c = j1 - j0;
        // V rows are read in place when they hold whole vectors; packed otherwise.
        let (v_block, ld_v): (&[f32], usize) = if v_in_place {
            let base = item.batch * vs_b + j0 * vs_s + item.kv_head * vs_h;
            (&ops.v.data()[base..], vs_s)
        } else {
            if p.d_v > 0 {
                pack_values(ops, item, j0, c, &mut sc.v, d_vp);
            }
            (&sc.v, d_vp)
        };
        if !k_contiguous {
            for jj in 0..c {
                let base = item.batch * ks_b + (j0 + jj) * ks_s + item.kv_head * ks_h;
                for (x, dst) in sc.k[jj * d_k..(jj + 1) * d_k].iter_mut().enumerate() {
                    *dst = k_data[base + x * ks_d];
                }
            }
        }
        let k_row = |jj: usize| -> &[f32] {
            if k_contiguous {
                let base = item.batch * ks_b + (j0 + jj) * ks_s + item.kv_head * ks_h;
                &k_data[base..base + d_k]
            } else {
                &sc.k[jj * d_k..(jj + 1) * d_k]
            }
        };

        // Sᵀ = K · Qᵀ, panel by panel, only over the keys some row of the panel sees.
        for r0 in (0..rows_pad).step_by(NR) {
            let r1 = (r0 + NR).min(rows_pad);
            let Some((plo, phi)) =
                union_range(&sc.lo[r0..r1.min(rows)], &sc.hi[r0..r1.min(rows)], j0, j1)
            else {
                continue;
            };
            let qt = &sc.qt[(r0 / NR) * NR * d_k..][..NR * d_k];
            let mut jj = plo;
            while jj < phi {
                let n = (phi - jj).min(MR);
                let out = &mut sc.st[jj * rows_pad + r0..];
                score_keys(s, n, r1 - r0, &k_row, jj, qt, d_k, out, rows_pad);
                sc.tiles += 1;
                jj += n;
            }
            // Scale into the log2 domain, `(q·k · scale) · log₂e`, before anything else
            // touches the scores (softcap, masks, bias). Scaling after the dot product rather
            // than folding `scale` into Q keeps every representable scaled score exact: a huge
            // scale times zero dot products is 0, not ∞ · 0; and the two multiplies cannot
            // overflow unless |scale · q·k| itself is beyond f32 (or above 2.3e38 in log2 units).
            let scale = s.splat(p.scale);
            let log2e = s.splat(std::f32::consts::LOG2_E);
            for jj in plo..phi {
                for r in (r0..r1).step_by(LANES) {
                    let x = &mut sc.st[jj * rows_pad + r..][..LANES];
                    let y = s.mul(s.mul(s.load(x), scale), log2e);
                    let y = match p.softcap {
                        Some(cap) => softcap(s, y, cap),
                        None => y,
                    };
                    s.store(x, y);
                }
            }
        }

        // Mask: −∞ outside each row's visible keys (only rows that do not see the whole block),
        // then the caller's bias and boolean mask inside them.
        for r in 0..rows {
            let (lo, hi) = (sc.lo[r].clamp(j0, j1) - j0, sc.hi[r].clamp(j0, j1) - j0);
            let (lo, hi) = if lo < hi { (lo, hi) } else { (c, c) };
            for jj in (0..lo).chain(hi..c) {
                sc.st[jj * rows_pad + r] = f32::NEG_INFINITY;
            }
            if p.bias.is_some() || p.mask.is_some() {
                let (h, i) = item.row_origin(group, r);
                for jj in lo..hi {
                    let at = [item.batch, i, h, j0 + jj];
                    let x = &mut sc.st[jj * rows_pad + r];
                    if let Some(bias) = &p.bias {
                        *x += bias.at(at) * std::f32::consts::LOG2_E;
                    }
                    if p.mask.as_ref().is_some_and(|m| !m.at(at)) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }

        // Online softmax, one query row per lane.
        for r0 in (0..rows_pad).step_by(LANES) {
            let mut mx = s.splat(f32::NEG_INFINITY);
            if p.alibi.is_some() {
                let pos = s.load(&sc.alibi_pos[r0..]);
                let slope = s.load(&sc.alibi_slope[r0..]);
                for jj in 0..c {
                    let x = &mut sc.st[jj * rows_pad + r0..][..LANES];
                    let dist = s.abs(s.sub(pos, s.splat((j0 + jj) as f32)));
                    let y = s.sub(s.load(x), s.mul(slope, dist));
                    s.store(x, y);
                    mx = s.max(mx, y);
                }
            } else {
                for jj in 0..c {
                    mx = s.max(mx, s.load(&sc.st[jj * rows_pad + r0..]));
                }
            }
            let m_old = s.load(&sc.m[r0..]);
            let m_new = s.max(s.splat(-f32::MAX), s.max(m_old, mx));
            let alpha = exp2(s, s.sub(m_old, m_new));
            let mut sum = s.splat(0.0);
            for jj in 0..c {
                let x = &mut sc.st[jj * rows_pad + r0..][..LANES];
                let pj = exp2(s, s.sub(s.load(x), m_new));
                s.store(x, pj);
                sum = s.add(sum, pj);
            }
            let l = s.mul_add(s.load(&sc.l[r0..]), alpha, sum);
            s.store(&mut sc.l[r0..], l);
            s.store(&mut sc.m[r0..], m_new);
            s.store(&mut sc.alpha[r0..], alpha);
        }

        // O = α ⊙ O + P · V, row groups of the tile height over the keys some row of the
        // group sees. Column panels outside, row groups inside: one V panel (kv_block × 2
        // vectors: 24 KiB at 192 keys on AVX-512) stays in L1 while every row group's Pᵀ
        // streams past it, so V is read from L2 once per block instead of once per row group
        // (at d = 64 that halves the block's L2 traffic, 384 → 192 KiB).
        for col in (0..d_vp).step_by(NR) {
            let width = (d_vp - col).min(NR);
            for r0 in (0..rows).step_by(MR) {
                let r1 = (r0 + MR).min(rows);
                let Some((glo, ghi)) = union_range(&sc.lo[r0..r1], &sc.hi[r0..r1], j0, j1) else {
                    continue;
                };
                let pt = &sc.st[glo * rows_pad + r0..];
                let v = &v_block[glo * ld_v + col..];
                let alpha = &sc.alpha[r0..r1];
                let o = &mut sc.o[r0 * d_vp + col..];
                let c = ghi - glo;
                output_rows(s, r1 - r0, width, pt, rows_pad, c, v, ld_v, alpha, o, d_vp);
            }
        }
        j0 = j1;
    }
}

/// Soft-capping in the log2 domain: for a score `x = s·log₂e`, returns `cap·log₂e·tanh(s/cap)`,
/// with `tanh(y) = (e^{2y} − 1)/(e^{2y} + 1)` and `e^{2y} = 2^{x·2/cap}`. The clamped `2^x` keeps
/// it finite for any input (±∞ scores map to ±cap), NaN stays NaN; near 0 the subtraction
/// costs absolute (not relative) accuracy, ~1e-7 · cap, which the error bound accounts for.
#[inline(always)]
fn softcap<S: Simd>(s: S, x: S::V, cap: f32) -> S::V {
    let e = exp2(s, s.mul(x, s.splat(2.0 / cap)));
    let one = s.splat(1.0);
    let t = s.div(s.sub(e, one), s.add(e, one));
    s.mul(t, s.splat(cap * std::f32::consts::LOG2_E))
}

/// The union `[lo, hi)` of the rows' visible ranges intersected with `[j0, j1)`, relative to
/// `j0`; `None` if no row sees a key of the block.
#[inline(always)]
fn union_range(lo: &[usize], hi: &[usize], j0: usize, j1: usize) -> Option<(usize, usize)> {
    let mut u = (usize::MAX, 0);
    for (&l, &h) in lo.iter().zip(hi) {
        let (l, h) = (l.max(j0), h.min(j1));
        if l < h {
            u = (u.0.min(l), u.1.max(h));
        }
    }
    (u.0 < u.1).then(|| (u.0 - j0, u.1 - j0))
}

/// Copies values `j0 .. j0 + c` of the item's key/value head into `dst` rows of `d_vp` floats
/// (the padding columns stay zero: they are never written).
#[inline(always)]
fn pack_values(ops: &Operands<'_>, item: &Item, j0: usize, c: usize, dst: &mut [f32], d_vp: usize) {
    let d_v = ops.problem.d_v;
    let [vs_b, vs_s, vs_h, vs_d] = ops.v.strides();
    let data = ops.v.data();
    for jj in 0..c {
        let base = item.batch * vs_b + (j0 + jj) * vs_s + item.kv_head * vs_h;
        let row = &mut dst[jj * d_vp..jj * d_vp + d_v];
        if vs_d == 1 {
            row.copy_from_slice(&data[base..base + d_v]);
        } else {
            for (x, out) in row.iter_mut().enumerate() {
                *out = data[base + x * vs_d];
            }
        }
    }
}

/// Scores of `n ≤ TILE` keys starting at block key `jj` against one panel of `width` (one or
/// two vectors) rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn score_keys<'k, S: Simd>(
    s: S,
    n: usize,
    width: usize,
    k_row: &impl Fn(usize) -> &'k [f32],
    jj: usize,
    qt: &[f32],
    d: usize,
    out: &mut [f32],
    ld: usize,
) {
    macro_rules! tiles {
        ($($keys:literal)*) => {
            match n {
                // Heights above the backend's tile never occur; `S::TILE` is a constant, so
                // their arms compile away.
                $($keys if $keys <= S::TILE => {
                    let k: [&[f32]; $keys] = core::array::from_fn(|t| k_row(jj + t));
                    if width == 2 * S::LANES {
                        scores_tile::<S, $keys, 2>(s, k, qt, d, out, ld)
                    } else {
                        scores_tile::<S, $keys, 1>(s, k, qt, d, out, ld)
                    }
                })*
                _ => unreachable!("score tile of {n} keys"),
            }
        };
    }
    tiles!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// [`output_tile`] for `rows ≤ TILE` rows and `width` (one or two vectors) columns.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn output_rows<S: Simd>(
    s: S,
    rows: usize,
    width: usize,
    pt: &[f32],
    ld_p: usize,
    c: usize,
    v: &[f32],
    ld_v: usize,
    alpha: &[f32],
    o: &mut [f32],
    ld_o: usize,
) {
    macro_rules! tiles {
        ($($rows:literal)*) => {
            match rows {
                $($rows if $rows <= S::TILE => {
                    if width == 2 * S::LANES {
                        output_tile::<S, $rows, 2>(s, pt, ld_p, c, v, ld_v, alpha, o, ld_o)
                    } else {
                        output_tile::<S, $rows, 1>(s, pt, ld_p, c, v, ld_v, alpha, o, ld_o)
                    }
                })*
                _ => unreachable!("output tile of {rows} rows"),
            }
        };
    }
    tiles!(1 2 3 4 5 6 7 8 9 10 11 12)
}
