//! The two tile products over a [`Unit`]: a score panel's dot products ([`scores_panel`]) and
//! an output row group's `O += P · V` ([`output_rows`]), each in 2 × 2 blocks of 16 × 16 f32
//! tiles where the operands allow (tiles 0–3 accumulate, 4–5 hold A, 6–7 hold B).

use super::unit::{TileConfig, TileOps, Unit, Word, TILES};
use crate::microkernel::dpbf16::PairKeys;
use half::bf16;

/// Rows of every tile (keys of a score tile, query rows of an output tile) and f32 columns of
/// the accumulators (query rows of a score tile, channels of an output tile).
pub(crate) const EDGE: usize = 16;
/// Most bf16 pairs per A row (64 bytes).
pub(crate) const MAX_STEP: usize = 16;

/// Tiles 0–3 accumulate, 4–5 hold the A operands, 6–7 the B operands.
const A0: u8 = 4;
const B0: u8 = 6;

/// The pairs per product step of a reduction over `d2` pairs: the largest divisor of `d2` up
/// to [`MAX_STEP`] (every step then the same tile shape; `d2 ≥ 1`).
pub(crate) fn pair_step(d2: usize) -> usize {
    (1..=MAX_STEP)
        .rev()
        .find(|s| d2.is_multiple_of(*s))
        .unwrap_or(1)
}

/// The configuration for reductions `step` pairs at a time: accumulators of 16 × 16 f32, A
/// tiles of 16 rows × `step` pairs, B tiles of `step` rows × 16 pairs. (The output product
/// takes `step` = 16.)
pub(crate) fn config(step: usize) -> TileConfig {
    let c = (EDGE, 4 * EDGE);
    let a = (EDGE, 4 * step);
    let b = (step, 4 * EDGE);
    let mut shapes = [c; TILES];
    shapes[usize::from(A0)] = a;
    shapes[usize::from(A0) + 1] = a;
    shapes[usize::from(B0)] = b;
    shapes[usize::from(B0) + 1] = b;
    TileConfig::new(shapes)
}

/// `tdpbf16ps` on accumulator `2i + j`, A tile `i`, B tile `j`, for `i < m`, `j < n` (1 or 2
/// each).
fn products<O: TileOps>(u: &mut Unit<O>, m: usize, n: usize) {
    u.dpbf16ps::<0, A0, B0>();
    if n > 1 {
        u.dpbf16ps::<1, A0, { B0 + 1 }>();
    }
    if m > 1 {
        u.dpbf16ps::<2, { A0 + 1 }, B0>();
        if n > 1 {
            u.dpbf16ps::<3, { A0 + 1 }, { B0 + 1 }>();
        }
    }
}

/// Accumulator `c` (`2i + j`) zeroed.
fn zero<O: TileOps>(u: &mut Unit<O>, c: usize) {
    match c {
        0 => u.zero::<0>(),
        1 => u.zero::<1>(),
        2 => u.zero::<2>(),
        _ => u.zero::<3>(),
    }
}

/// Accumulator `c` loaded from `src` (rows `stride` apart).
fn load_acc<O: TileOps>(u: &mut Unit<O>, c: usize, src: &[f32], stride: usize) {
    match c {
        0 => u.load::<0, f32>(src, stride),
        1 => u.load::<1, f32>(src, stride),
        2 => u.load::<2, f32>(src, stride),
        _ => u.load::<3, f32>(src, stride),
    }
}

/// Accumulator `c` stored into `dst` (rows `stride` apart).
fn store_acc<O: TileOps>(u: &mut Unit<O>, c: usize, dst: &mut [f32], stride: usize) {
    match c {
        0 => u.store::<0>(dst, stride),
        1 => u.store::<1>(dst, stride),
        2 => u.store::<2>(dst, stride),
        _ => u.store::<3>(dst, stride),
    }
}

/// A tile `i` (4 or 5) loaded from `src`, rows `stride` elements apart.
fn load_a<O: TileOps, W: Word>(u: &mut Unit<O>, i: usize, src: &[W], stride: usize) {
    if i == 0 {
        u.load::<A0, W>(src, stride);
    } else {
        u.load::<{ A0 + 1 }, W>(src, stride);
    }
}

/// B tile `i` (6 or 7) loaded from words `src`, rows `stride` apart.
fn load_b<O: TileOps>(u: &mut Unit<O>, i: usize, src: &[f32], stride: usize) {
    if i == 0 {
        u.load::<B0, f32>(src, stride);
    } else {
        u.load::<{ B0 + 1 }, f32>(src, stride);
    }
}

/// A tile `i` loaded from the key rows `j .. j + 16`, pairs `k0 ..` of each.
fn load_keys<O: TileOps>(u: &mut Unit<O>, i: usize, keys: PairKeys<'_>, j: usize, k0: usize) {
    match keys {
        PairKeys::Words(w, ld) => load_a(u, i, &w[j * ld + k0..], ld),
        PairKeys::Bf16(b, ld) => load_a::<O, bf16>(u, i, &b[j * ld + 2 * k0..], ld),
    }
}

/// The operands of one score panel: `Sᵀ[j][r] = Σ_p K[j].pair[p] · Q[r].pair[p]`.
#[derive(Clone, Copy)]
pub(crate) struct ScorePanel<'a> {
    /// Key rows of `d2` channel pairs; key `j` (relative to the block) is row `j`.
    pub keys: PairKeys<'a>,
    /// The panel's Qᵀ by channel pairs: pair `p` of row `r` at `qp[p · ld_q + r]`.
    pub qp: &'a [f32],
    pub ld_q: usize,
    /// Rows of the panel computed: 16 or 32.
    pub width: usize,
    /// Channel pairs, and pairs per step ([`pair_step`], the configuration in force).
    pub d2: usize,
    pub step: usize,
}

/// The unscaled dot products of keys `lo .. hi` with the panel's rows into `st` (key `j`'s at
/// `st[j · ld_s ..][.. width]`), 16 keys per tile. The tiles start at `lo`, `lo + 16`, …, the
/// last moved back to end at `hi` (it recomputes keys of the tile before, which gives the same
/// bits, or keys below `lo`, which the caller masks): so `hi ≥ 16`, and the key rows and `st`
/// must hold `hi` rows. Requires [`config`]`(step)` in force.
pub(crate) fn scores_panel<O: TileOps>(
    u: &mut Unit<O>,
    op: &ScorePanel<'_>,
    (lo, hi): (usize, usize),
    st: &mut [f32],
    ld_s: usize,
) {
    debug_assert!(hi >= EDGE && lo < hi && op.width.is_multiple_of(EDGE));
    let n = op.width / EDGE;
    let start = |j: usize| j.min(hi - EDGE);
    let mut j = lo;
    while j < hi {
        let keys = [start(j), start(j + EDGE)];
        let m = if j + EDGE < hi { 2 } else { 1 };
        for c in 0..2 * m {
            if c % 2 < n {
                zero(u, c);
            }
        }
        for k0 in (0..op.d2).step_by(op.step) {
            for (i, &key) in keys.iter().enumerate().take(m) {
                load_keys(u, i, op.keys, key, k0);
            }
            for b in 0..n {
                load_b(u, b, &op.qp[k0 * op.ld_q + b * EDGE..], op.ld_q);
            }
            products(u, m, n);
        }
        for (i, &key) in keys.iter().enumerate().take(m) {
            for b in 0..n {
                store_acc(u, 2 * i + b, &mut st[key * ld_s + b * EDGE..], ld_s);
            }
        }
        j += 2 * EDGE;
    }
}

/// The operands of the output product: `O[r][x] += Σ_jp P[r].pair[jp] · V.pair[jp][x]`.
#[derive(Clone, Copy)]
pub(crate) struct OutputGroup<'a> {
    /// The weights by key pairs: pair `jp` of row `r` at `pa[r · ld_p + jp]`.
    pub pa: &'a [f32],
    pub ld_p: usize,
    /// The values by key pairs: channel `x` of pair `jp` at `pv[jp · d_vp + x]`.
    pub pv: &'a [f32],
    /// O's row length (a multiple of 16).
    pub d_vp: usize,
}

/// `O += P · V` for rows `r0 .. r0 + 16·m` (`m` = 1 or 2; `o` from row `r0`, rows `d_vp`
/// apart) over key pairs `p0 .. p1` (multiples of 16, inside both operands), all `d_vp`
/// channels, 32 at a time. Requires [`config`]`(16)` in force.
pub(crate) fn output_rows<O: TileOps>(
    u: &mut Unit<O>,
    op: &OutputGroup<'_>,
    (r0, m): (usize, usize),
    (p0, p1): (usize, usize),
    o: &mut [f32],
) {
    let d_vp = op.d_vp;
    debug_assert!(d_vp.is_multiple_of(EDGE) && p0.is_multiple_of(MAX_STEP));
    for x0 in (0..d_vp).step_by(2 * EDGE) {
        let n = ((d_vp - x0) / EDGE).min(2);
        for i in 0..m {
            for b in 0..n {
                load_acc(u, 2 * i + b, &o[i * EDGE * d_vp + x0 + b * EDGE..], d_vp);
            }
        }
        for k0 in (p0..p1).step_by(MAX_STEP) {
            for i in 0..m {
                let a = &op.pa[(r0 + i * EDGE) * op.ld_p + k0..];
                load_a(u, i, a, op.ld_p);
            }
            for b in 0..n {
                load_b(u, b, &op.pv[k0 * d_vp + x0 + b * EDGE..], d_vp);
            }
            products(u, m, n);
        }
        for i in 0..m {
            for b in 0..n {
                store_acc(
                    u,
                    2 * i + b,
                    &mut o[i * EDGE * d_vp + x0 + b * EDGE..],
                    d_vp,
                );
            }
        }
    }
}
