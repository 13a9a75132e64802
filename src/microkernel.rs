//! Register-tiled micro-kernels for the two tile products of the fused kernel, written once over
//! [`Simd`] lanes.
//!
//! The score tile is computed *transposed*, `Sᵀ = K · Qᵀ`, with query rows along the lanes:
//! * K rows are read straight from the caller's tensor by scalar broadcasts, so K is never packed
//!   (a broadcast from memory costs a load µop, the same as a vector load);
//! * Q is transposed once per work item into `d_k × 16` panels and reused for every key block;
//! * the online softmax then runs with one query row per lane: running max, rescale and sum are
//!   plain vertical vector operations, with no horizontal reduction per score;
//! * `Pᵀ` comes out key-major, which is exactly what the output product broadcasts from.
//!
//! Both products use the classic AVX2 BLIS register tile `6 × 16`: 12 accumulators (6 × 2
//! vectors of 8) + 2 vectors loaded + 1 broadcast = 15 of the 16 ymm registers. Per reduction
//! step: 2 vector loads + 6 broadcasts (8 load-port µops, 4 cycles on 2 ports) feed 12 FMAs
//! (6 cycles on 2 FMA ports), so the FMA ports set the pace.
//!
//! * [`scores_tile`]: `Sᵀ[6 keys × 16 rows] = K[6 × d_k] · Qᵀ[d_k × 16]`.
//! * [`output_tile`]: `O[6 rows × 16] = α ⊙ O + P[6 × c] · V[c × 16]`, the rescaling `α` of the
//!   online softmax fused into the load of the accumulators.
//!
//! Tails use the same code with smaller const sizes (`KEYS < 6`, `ROWS < 6`, `VECS = 1`); head
//! sizes are padded to multiples of 16 by packing, so there are no column tails.

use crate::simd::{Simd, LANES};

/// Keys per score tile, and rows per output tile.
pub(crate) const MR: usize = 6;
/// Query rows per score tile, and output columns per output tile: two vectors.
pub(crate) const NR: usize = 2 * LANES;

/// `out[t][0 .. 8·VECS] = Σ_p k[t][p] · qt[p][0 .. 8·VECS]` for each key `t < KEYS`.
///
/// * `k`: `KEYS` key rows of `d` values each.
/// * `qt`: a transposed query panel, `d` steps of 16 values (`qt[p * 16 + r]`); only the first
///   `8·VECS` rows of each step are read.
/// * `out`: `KEYS` rows at stride `ld_out` (one per key), `8·VECS` values each.
#[inline(always)]
pub(crate) fn scores_tile<S: Simd, const KEYS: usize, const VECS: usize>(
    s: S,
    k: [&[f32]; KEYS],
    qt: &[f32],
    d: usize,
    out: &mut [f32],
    ld_out: usize,
) {
    let k: [&[f32]; KEYS] = core::array::from_fn(|t| &k[t][..d]);
    let mut acc = [[s.splat(0.0); VECS]; KEYS];
    for (p, qp) in (0..d).zip(qt.chunks_exact(NR)) {
        let q: [S::V; VECS] = core::array::from_fn(|v| s.load(&qp[v * LANES..(v + 1) * LANES]));
        for t in 0..KEYS {
            let kb = s.splat(k[t][p]);
            for v in 0..VECS {
                acc[t][v] = s.mul_add(kb, q[v], acc[t][v]);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        let row = &mut out[t * ld_out..t * ld_out + VECS * LANES];
        for (v, &x) in a.iter().enumerate() {
            s.store(&mut row[v * LANES..(v + 1) * LANES], x);
        }
    }
}

/// `o[r][0..16] = alpha[r] · o[r][0..16] + Σ_{j<c} pt[j][r] · v[j][0..16]` for each row `r < ROWS`.
///
/// * `pt`: the softmax numerators key-major, key `j`'s rows at `pt[j * ld_p ..][..ROWS]`.
/// * `v`: `c` value rows at stride `ld_v`, 16 columns each (a column panel of the packed block,
///   or of the caller's V read in place).
/// * `o`: the running output accumulator, rows at stride `ld_o`, 16 columns each.
#[allow(clippy::too_many_arguments)] // one tile's operands; a struct would only rename them
#[inline(always)]
pub(crate) fn output_tile<S: Simd, const ROWS: usize>(
    s: S,
    pt: &[f32],
    ld_p: usize,
    c: usize,
    v: &[f32],
    ld_v: usize,
    alpha: &[f32],
    o: &mut [f32],
    ld_o: usize,
) {
    let mut acc: [[S::V; 2]; ROWS] = core::array::from_fn(|r| {
        let a = s.splat(alpha[r]);
        let row = &o[r * ld_o..r * ld_o + NR];
        [
            s.mul(a, s.load(&row[..LANES])),
            s.mul(a, s.load(&row[LANES..])),
        ]
    });
    if c > 0 {
        // The inner loop is the hottest code of the crate: its 12 FMAs per key must not share
        // the issue slots with bounds checks (measured: 38 → 57 GFLOP/s at d = 64). Check the
        // last key's reads once here, then index unchecked.
        assert!((c - 1) * ld_p + ROWS <= pt.len() && (c - 1) * ld_v + NR <= v.len());
        for j in 0..c {
            // SAFETY: j < c, so j·ld_v + 16 ≤ (c−1)·ld_v + 16 ≤ v.len(), checked above.
            let vj = unsafe { v.get_unchecked(j * ld_v..j * ld_v + NR) };
            let v0 = s.load(&vj[..LANES]);
            let v1 = s.load(&vj[LANES..]);
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: j·ld_p + r < (c−1)·ld_p + ROWS ≤ pt.len(), checked above.
                let pr = s.splat(unsafe { *pt.get_unchecked(j * ld_p + r) });
                a[0] = s.mul_add(pr, v0, a[0]);
                a[1] = s.mul_add(pr, v1, a[1]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let row = &mut o[r * ld_o..r * ld_o + NR];
        s.store(&mut row[..LANES], a[0]);
        s.store(&mut row[LANES..], a[1]);
    }
}
