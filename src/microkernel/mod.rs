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
//! Both products use a register tile of `TILE × 2` vectors, `TILE` the backend's
//! [`Simd::TILE`]:
//! * AVX2 (16 ymm registers, 8 lanes): the classic BLIS `6 × 16` tile, 12 accumulators + 2
//!   vectors loaded + 1 broadcast = 15 registers. Per reduction step 2 loads + 6 broadcasts
//!   (8 load µops, 4 cycles on 2 ports) feed 12 FMAs (6 cycles on 2 FMA ports): FMA-bound.
//! * AVX-512 (32 zmm registers, 16 lanes): `12 × 32`, 24 accumulators + 2 + 1 = 27 registers;
//!   2 loads + 12 broadcasts (7 cycles) feed 24 FMAs (12 cycles on 2 FMA ports).
//!
//! * [`scores_tile`]: `Sᵀ[TILE keys × 2·LANES rows] = K[TILE × d_k] · Qᵀ[d_k × 2·LANES]`, scaled
//!   into the softmax's log2 domain and its per-row maximum taken while still in registers.
//! * [`output_tile`]: `O[TILE rows × 2·LANES] = α ⊙ O + P[TILE × c] · V[c × 2·LANES]`, the
//!   rescaling `α` of the online softmax fused into the load of the accumulators.
//! * [`dot_tile`]: decode's scores, channels along the lanes (few query rows per kv head,
//!   where the transposed tile would leave most lanes idle).
//!
//! The output and dot tiles read K/V rows of any [`Lanes`] type (f32, f16, bf16), converted
//! to f32 as they are loaded, so decode reads half-precision caches in place.
//!
//! Tails use the same code with smaller const sizes (`KEYS`, `ROWS < TILE`, `VECS = 1`); head
//! sizes are padded to whole vectors by packing, so there are no lane tails.
//!
//! [`dpbf16`] holds the same products on bf16 operands (AVX512_BF16's `vdpbf16ps`, for
//! [`Options::bf16_products`](crate::Options::bf16_products)): tiles of intrinsics rather than
//! of [`Simd`] lanes, the one per-ISA code above the lanes.

pub(crate) mod amx;
pub(crate) mod dpbf16;

use crate::simd::{Lanes, RowStream, Simd};

/// `out[t][0 .. L·VECS] = (Σ_p k[t][p] · qt[p][0 .. L·VECS]) · f₀ · f₁` for each key `t < KEYS`,
/// `L` lanes, and `max[0 .. L·VECS]` raised to the largest of those per row.
///
/// * `k`: `KEYS` key rows of `d` values each.
/// * `qt`: a transposed query panel, `d` steps of `2·L` values (`qt[p · 2L + r]`); only the
///   first `L·VECS` rows of each step are read.
/// * `out`: `KEYS` rows at stride `ld_out` (one per key), `L·VECS` values each.
/// * `factors`: `[f₀, f₁]`, applied in that order (two roundings) while the sums are still in
///   registers: the fused kernel's scale and log₂e.
/// * `max`: the running maximum of each row over the tiles of a key block, so that the
///   softmax does not read the scores again to find it.
#[allow(clippy::too_many_arguments)] // one tile's operands; a struct would only rename them
#[inline(always)]
pub(crate) fn scores_tile<S: Simd, const KEYS: usize, const VECS: usize>(
    s: S,
    k: [&[f32]; KEYS],
    qt: &[f32],
    d: usize,
    out: &mut [f32],
    ld_out: usize,
    factors: [f32; 2],
    max: &mut [f32],
) {
    let lanes = S::LANES;
    let mut k = k;
    for row in k.iter_mut() {
        *row = &row[..d]; // one length check per row, none in the loop below
    }
    let mut acc = [[s.splat(0.0); VECS]; KEYS];
    // (Plain loops rather than `array::from_fn` in these kernels: closures passed to `from_fn`
    // are not always inlined, and an intrinsic outside the `#[target_feature]` entry point
    // becomes a function call: measured 6× slower.)
    for (p, qp) in (0..d).zip(qt.chunks_exact(2 * lanes)) {
        let mut q = [s.splat(0.0); VECS];
        for (v, qv) in q.iter_mut().enumerate() {
            *qv = s.load(&qp[v * lanes..(v + 1) * lanes]);
        }
        for t in 0..KEYS {
            let kb = s.splat(k[t][p]);
            for v in 0..VECS {
                acc[t][v] = s.mul_add(kb, q[v], acc[t][v]);
            }
        }
    }
    // The factors pass through `black_box` here, after the loop, so that their splats cannot
    // be hoisted above it (out of the callers' loops), where they would hold two registers
    // across the loop: AVX2's tile leaves one spare (12 accumulators + 3 of 16). (Inlined into
    // the key-block loop, values hoisted from other stages spilled accumulators even so; the
    // panel of tiles now runs as its own function, see `PanelScores` in `fused/item.rs`.)
    let factors = std::hint::black_box(factors);
    let (f0, f1) = (s.splat(factors[0]), s.splat(factors[1]));
    let max = &mut max[..VECS * lanes];
    let mut mx = [s.splat(f32::NEG_INFINITY); VECS];
    for (t, a) in acc.iter().enumerate() {
        let row = &mut out[t * ld_out..t * ld_out + VECS * lanes];
        for (v, &x) in a.iter().enumerate() {
            let y = s.mul(s.mul(x, f0), f1);
            mx[v] = s.max(mx[v], y);
            s.store(&mut row[v * lanes..(v + 1) * lanes], y);
        }
    }
    for (v, &m) in mx.iter().enumerate() {
        let old = s.load(&max[v * lanes..(v + 1) * lanes]);
        s.store(&mut max[v * lanes..(v + 1) * lanes], s.max(old, m));
    }
}

/// `o[r][0 .. L·VECS] = alpha[r] · o[r][..] + Σ_{j<c} pt[j][r] · v[j][0 .. L·VECS]` for each row
/// `r < ROWS`, `L` lanes.
///
/// * `pt`: the softmax numerators key-major, key `j`'s rows at `pt[j * ld_p ..][..ROWS]`.
/// * `v`: `c` value rows at stride `ld_v`, `L·VECS` columns each (a column panel of the packed
///   block, or of the caller's V read in place).
/// * `o`: the running output accumulator, rows at stride `ld_o`, `L·VECS` columns each.
/// * `next`: rows to prefetch, row `j` requested as value row `j` is read (decode: this panel's
///   part of the same rows one key block ahead); `None` in prefill.
#[allow(clippy::too_many_arguments)] // one tile's operands; a struct would only rename them
#[inline(always)]
pub(crate) fn output_tile<S: Simd, const ROWS: usize, const VECS: usize, E: Lanes>(
    s: S,
    pt: &[f32],
    ld_p: usize,
    c: usize,
    v: &[E],
    ld_v: usize,
    alpha: &[f32],
    o: &mut [f32],
    ld_o: usize,
    next: Option<RowStream>,
) {
    let lanes = S::LANES;
    let width = VECS * lanes;
    let mut acc = [[s.splat(0.0); VECS]; ROWS];
    for (r, a) in acc.iter_mut().enumerate() {
        let scale = s.splat(alpha[r]);
        let row = &o[r * ld_o..r * ld_o + width];
        for (x, ax) in a.iter_mut().enumerate() {
            *ax = s.mul(scale, s.load(&row[x * lanes..(x + 1) * lanes]));
        }
    }
    if c > 0 {
        // The inner loop is the hottest code of the crate: its FMAs must not share the issue
        // slots with bounds checks (measured: 38 → 57 GFLOP/s at d = 64 on AVX2). Check the
        // last key's reads once here, then index unchecked.
        assert!((c - 1) * ld_p + ROWS <= pt.len() && (c - 1) * ld_v + width <= v.len());
        // One key's step; the loop is written twice so that prefill's (no prefetch rows) holds
        // no per-key test of `next` (the compiler kept it inside the loop).
        macro_rules! step {
            ($j:expr) => {{
                let j = $j;
                // SAFETY: j < c, so j·ld_v + width ≤ (c−1)·ld_v + width ≤ v.len(), checked
                // above.
                let vj = unsafe { v.get_unchecked(j * ld_v..j * ld_v + width) };
                let mut vv = [s.splat(0.0); VECS];
                for (x, vx) in vv.iter_mut().enumerate() {
                    *vx = E::load(s, &vj[x * lanes..(x + 1) * lanes]);
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: j·ld_p + r < (c−1)·ld_p + ROWS ≤ pt.len(), checked above.
                    let pr = s.splat(unsafe { *pt.get_unchecked(j * ld_p + r) });
                    for x in 0..VECS {
                        a[x] = s.mul_add(pr, vv[x], a[x]);
                    }
                }
            }};
        }
        match &next {
            Some(next) => {
                for j in 0..c {
                    next.request(j, 1);
                    step!(j);
                }
            }
            None => {
                for j in 0..c {
                    step!(j);
                }
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let row = &mut o[r * ld_o..r * ld_o + width];
        for (x, &ax) in a.iter().enumerate() {
            s.store(&mut row[x * lanes..(x + 1) * lanes], ax);
        }
    }
}

/// `out[t·ld_out + r] = Σ_p k[t][p] · q[r·d + p]` for each key `t < KEYS` and query row
/// `r < ROWS`, channels along the lanes: the score kernel for few query rows (decode), where
/// the transposed tile would leave most lanes idle. `KEYS · ROWS` accumulators, each K vector
/// loaded (and converted) once for all rows and each Q vector once for all keys; the lane sums
/// at the end ([`Simd::reduce_add16`] for more than four scores), and the channels past the
/// last whole vector in scalar. `factors`: each key's score times its factor (8-bit keys with
/// a scale per key), one rounding after the whole sum, in a last pass over the stored tile.
#[inline(always)]
pub(crate) fn dot_tile<S: Simd, const KEYS: usize, const ROWS: usize, E: Lanes>(
    s: S,
    k: [&[E]; KEYS],
    q: &[f32],
    d: usize,
    (out, ld_out): (&mut [f32], usize),
    factors: Option<[f32; KEYS]>,
) {
    let lanes = S::LANES;
    let mut k = k;
    for row in k.iter_mut() {
        *row = &row[..d];
    }
    let q = &q[..ROWS * d];
    let whole = d / lanes * lanes;
    // Accumulator of key t and row r at `t · ROWS + r` (KEYS · ROWS ≤ 16; the rest stay 0).
    let mut acc = [s.splat(0.0); 16];
    assert!(KEYS * ROWS <= 16);
    // As in `output_tile`, the loop's loads must not share the issue slots with bounds checks
    // (compiled with checks, the loop held two compares and a branch per load); every row was
    // cut to its length above.
    let mut p = 0;
    while p < whole {
        let mut kv = [s.splat(0.0); KEYS];
        for (t, v) in kv.iter_mut().enumerate() {
            // SAFETY: p + lanes ≤ whole ≤ d = k[t].len().
            *v = E::load(s, unsafe { k[t].get_unchecked(p..p + lanes) });
        }
        for r in 0..ROWS {
            // SAFETY: r·d + p + lanes ≤ r·d + d ≤ ROWS·d = q.len().
            let qv = s.load(unsafe { q.get_unchecked(r * d + p..r * d + p + lanes) });
            for t in 0..KEYS {
                acc[t * ROWS + r] = s.mul_add(kv[t], qv, acc[t * ROWS + r]);
            }
        }
        p += lanes;
    }
    let out = &mut out[..(KEYS - 1) * ld_out + ROWS];
    if KEYS * ROWS > 4 {
        // All the tile's sums in one transposing reduction, in the order of `acc`.
        let sums = s.reduce_add16(acc, KEYS * ROWS);
        for t in 0..KEYS {
            out[t * ld_out..t * ld_out + ROWS].copy_from_slice(&sums[t * ROWS..(t + 1) * ROWS]);
        }
    } else {
        for t in 0..KEYS {
            for r in 0..ROWS {
                out[t * ld_out + r] = s.reduce_add(acc[t * ROWS + r]);
            }
        }
    }
    // The channels past the last whole vector (none where d is a multiple of the lanes).
    for t in 0..KEYS {
        for r in 0..ROWS {
            for p in whole..d {
                out[t * ld_out + r] += k[t][p].scalar() * q[r * d + p];
            }
        }
    }
    if let Some(f) = factors {
        for (t, &f) in f.iter().enumerate() {
            for x in &mut out[t * ld_out..t * ld_out + ROWS] {
                *x *= f;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Both tiles at every height (1 ..= TILE) and width (one or two vectors) on every backend
    //! this CPU has, against plain f64 sums.
    use super::*;
    use crate::simd::Kernel;

    fn value(seed: usize) -> f32 {
        ((seed as f32) * 0.618_034).fract() * 2.0 - 1.0
    }

    fn check_scores<S: Simd, const KEYS: usize, const VECS: usize>(s: S) {
        let (lanes, d) = (S::LANES, 13);
        let ld = 2 * lanes + 3;
        let keys: Vec<Vec<f32>> = (0..KEYS)
            .map(|t| (0..d).map(|p| value(31 * t + p + 1)).collect())
            .collect();
        let qt: Vec<f32> = (0..d * 2 * lanes).map(|x| value(x + 1000)).collect();
        let mut out = vec![f32::NAN; KEYS * ld];
        let k: [&[f32]; KEYS] = core::array::from_fn(|t| &keys[t][..]);
        // The running maximum starts at a value some rows exceed and others do not.
        let (factors, start) = ([0.75f32, 1.5f32], 0.1f32);
        let mut max = vec![start; VECS * lanes];
        scores_tile::<S, KEYS, VECS>(s, k, &qt, d, &mut out, ld, factors, &mut max);
        for r in 0..VECS * lanes {
            let want = (0..KEYS).map(|t| out[t * ld + r]).fold(start, f32::max);
            assert_eq!(max[r], want, "{KEYS}x{VECS}: max of row {r}");
        }
        for t in 0..KEYS {
            for r in 0..ld {
                let got = out[t * ld + r];
                if r >= VECS * lanes {
                    assert!(got.is_nan(), "wrote past the tile: key {t} row {r}");
                    continue;
                }
                let want: f64 = (0..d)
                    .map(|p| f64::from(keys[t][p]) * f64::from(qt[p * 2 * lanes + r]))
                    .sum::<f64>()
                    * 0.75
                    * 1.5;
                assert!(
                    (f64::from(got) - want).abs() < 1e-5,
                    "{KEYS}x{VECS}: {got} vs {want}"
                );
            }
        }
    }

    fn check_output<S: Simd, const ROWS: usize, const VECS: usize>(s: S) {
        let lanes = S::LANES;
        let width = VECS * lanes;
        for c in [0, 1, 5, 17] {
            let (ld_p, ld_v, ld_o) = (ROWS + 2, width + 5, width + 7);
            let pt: Vec<f32> = (0..c.max(1) * ld_p).map(|x| value(x + 7).abs()).collect();
            let v: Vec<f32> = (0..c.max(1) * ld_v).map(|x| value(x + 99)).collect();
            let alpha: Vec<f32> = (0..ROWS).map(|r| 0.5 + r as f32 * 0.125).collect();
            let o0: Vec<f32> = (0..ROWS * ld_o).map(|x| value(x + 555)).collect();
            let mut o = o0.clone();
            output_tile::<S, ROWS, VECS, f32>(
                s, &pt, ld_p, c, &v, ld_v, &alpha, &mut o, ld_o, None,
            );
            for r in 0..ROWS {
                for x in 0..ld_o {
                    let got = o[r * ld_o + x];
                    if x >= width {
                        assert_eq!(got, o0[r * ld_o + x], "wrote past the tile");
                        continue;
                    }
                    let want = f64::from(alpha[r]) * f64::from(o0[r * ld_o + x])
                        + (0..c)
                            .map(|j| f64::from(pt[j * ld_p + r]) * f64::from(v[j * ld_v + x]))
                            .sum::<f64>();
                    assert!(
                        (f64::from(got) - want).abs() < 1e-5,
                        "{ROWS}x{VECS} c={c}: {got} vs {want}"
                    );
                }
            }
        }
    }

    fn check_dots<S: Simd, const KEYS: usize, const ROWS: usize>(s: S) {
        for d in [1, 13, 2 * S::LANES, 3 * S::LANES + 5] {
            let keys: Vec<Vec<f32>> = (0..KEYS)
                .map(|t| (0..d).map(|p| value(31 * t + p + 1)).collect())
                .collect();
            let q: Vec<f32> = (0..ROWS * d).map(|x| value(x + 1000)).collect();
            let k: [&[f32]; KEYS] = core::array::from_fn(|t| &keys[t][..]);
            let ld = ROWS + 3;
            let mut out = vec![f32::NAN; KEYS * ld];
            dot_tile::<S, KEYS, ROWS, f32>(s, k, &q, d, (&mut out, ld), None);
            for t in 0..KEYS {
                for r in ROWS..ld {
                    assert!(out[t * ld + r].is_nan(), "wrote past the tile");
                }
                for r in 0..ROWS {
                    let want: f64 = (0..d)
                        .map(|p| f64::from(keys[t][p]) * f64::from(q[r * d + p]))
                        .sum();
                    let got = f64::from(out[t * ld + r]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{KEYS}x{ROWS} d={d}: {got} vs {want}"
                    );
                }
            }
            // Per-key factors: each whole sum times its key's factor, one rounding.
            let f: [f32; KEYS] = core::array::from_fn(|t| value(t + 77) * 3.0);
            let mut scaled = vec![f32::NAN; KEYS * ld];
            dot_tile::<S, KEYS, ROWS, f32>(s, k, &q, d, (&mut scaled, ld), Some(f));
            for t in 0..KEYS {
                for r in 0..ld {
                    let (got, plain) = (scaled[t * ld + r], out[t * ld + r]);
                    match r < ROWS {
                        true => assert_eq!(got.to_bits(), (plain * f[t]).to_bits()),
                        false => assert!(got.is_nan(), "wrote past the tile"),
                    }
                }
            }
        }
    }

    struct AllTiles;
    impl Kernel for AllTiles {
        type Output = usize;
        #[inline(always)]
        fn run<S: Simd>(self, s: S) -> usize {
            let mut checked = 0;
            macro_rules! heights {
                ($($n:literal)*) => {$(
                    if $n <= S::TILE {
                        check_scores::<S, $n, 1>(s);
                        check_scores::<S, $n, 2>(s);
                        check_output::<S, $n, 1>(s);
                        check_output::<S, $n, 2>(s);
                        checked += 1;
                    }
                )*};
            }
            heights!(1 2 3 4 5 6 7 8 9 10 11 12);
            // The wide panels of decode's few rows per head (`item::panel_vecs`).
            macro_rules! wide {
                ($($n:literal)*) => {$(
                    check_output::<S, $n, 3>(s);
                    check_output::<S, $n, 4>(s);
                )*};
            }
            wide!(1 2 3 4 5);
            check_dots::<S, 4, 1>(s);
            check_dots::<S, 4, 4>(s);
            check_dots::<S, 2, 8>(s);
            check_dots::<S, 1, 3>(s);
            check_dots::<S, 2, 3>(s);
            check_dots::<S, 4, 2>(s);
            // AVX2's decode tile (`item::dot_keys`), and twelve sums (one and a half groups of
            // eight for AVX2's reduction).
            check_dots::<S, 2, 4>(s);
            check_dots::<S, 4, 3>(s);
            checked
        }
    }

    #[test]
    fn tiles_of_every_size_on_every_backend() {
        assert_eq!(AllTiles.run(crate::simd::Portable), 6);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(s) = crate::simd::Avx2Fma::detect() {
                assert_eq!(crate::simd::avx2::run(s, AllTiles), 6);
            }
            if let Some(s) = crate::simd::Avx512::detect() {
                assert_eq!(crate::simd::avx512::run(s, AllTiles), 12);
            }
        }
    }
}
