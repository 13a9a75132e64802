//! The software model against exact sums, the unit's checks, and the two tile products against
//! plain loops, through the model on every CPU and, where the CPU has AMX, through the
//! hardware too, which must give the model's bits.

use super::kernels::{config, output_rows, pair_step, scores_panel, OutputGroup, ScorePanel};
use super::model::Model;
use super::unit::{TileConfig, TileOps, Unit};
use crate::microkernel::dpbf16::PairKeys;
use half::bf16;

/// Deterministic small values: `k / 8` for integers `|k| ≤ 32`, exact in bf16, with products
/// and sums of a few hundred of them exact in f32 too.
fn small(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x % 65) as f32 - 32.0) / 8.0
        })
        .collect()
}

/// bf16 values paired into words: `word[i] = bits(x[2i]) | bits(x[2i + 1]) << 16`.
fn pairs(x: &[f32]) -> Vec<f32> {
    x.chunks(2)
        .map(|p| {
            let lo = bf16::from_f32(p[0]).to_bits();
            let hi = bf16::from_f32(*p.get(1).unwrap_or(&0.0)).to_bits();
            f32::from_bits(u32::from(lo) | u32::from(hi) << 16)
        })
        .collect()
}

fn model() -> Unit<Model> {
    Unit::new(Model::default())
}

#[test]
fn the_model_computes_exact_sums_exactly() {
    // C (16 × 16) += A (16 rows × 16 pairs) · B (16 pairs × 16 columns), values whose sums are
    // exact: the model must give them bit for bit.
    let mut u = model();
    u.configure(&config(16));
    let a = small(16 * 32, 1); // row m: 32 bf16 values
    let b = small(16 * 32, 2); // pair row k: 16 columns × 2 values
    let c0 = small(256, 3);
    let (pa, pb) = (pairs(&a), pairs(&b));
    u.load::<0, f32>(&c0, 16);
    u.load::<4, f32>(&pa, 16);
    u.load::<6, f32>(&pb, 16);
    u.dpbf16ps::<0, 4, 6>();
    let mut c = vec![0.0f32; 256];
    u.store::<0>(&mut c, 16);
    for m in 0..16 {
        for n in 0..16 {
            let mut want = f64::from(c0[m * 16 + n]);
            for k in 0..16 {
                for e in 0..2 {
                    want += f64::from(a[m * 32 + 2 * k + e]) * f64::from(b[k * 32 + 2 * n + e]);
                }
            }
            assert_eq!(f64::from(c[m * 16 + n]), want, "C[{m}][{n}]");
        }
    }
}

#[test]
fn the_model_reads_subnormals_as_zero_and_flushes_results() {
    let mut u = model();
    u.configure(&TileConfig::new([
        (1, 4),
        (0, 0),
        (0, 0),
        (0, 0),
        (1, 4),
        (0, 0),
        (1, 4),
        (0, 0),
    ]));
    // A subnormal bf16 input reads as zero: bf16 0x0008 (2^-130) · 1 + 0 · 0 = 0.
    assert!(bf16::from_bits(0x0008).to_f32().is_subnormal());
    let a = [f32::from_bits(0x0008)]; // low half bf16 0x0008, high half 0
    let b = [f32::from_bits(0x3f80)]; // low half 1.0
    u.zero::<0>();
    u.load::<4, f32>(&a, 1);
    u.load::<6, f32>(&b, 1);
    u.dpbf16ps::<0, 4, 6>();
    let mut c = [1.0f32];
    u.store::<0>(&mut c, 1);
    assert_eq!(c[0].to_bits(), 0);
    // A product below f32's normal range (2^-70 · 2^-70) flushes to zero.
    let tiny = bf16::from_f32(2f32.powi(-70)).to_bits();
    let a = [f32::from_bits(u32::from(tiny))];
    let b = [f32::from_bits(u32::from(tiny))];
    u.zero::<0>();
    u.load::<4, f32>(&a, 1);
    u.load::<6, f32>(&b, 1);
    u.dpbf16ps::<0, 4, 6>();
    u.store::<0>(&mut c, 1);
    assert_eq!(c[0].to_bits(), 0);
}

#[test]
fn the_unit_checks_operands() {
    let caught = |f: fn()| std::panic::catch_unwind(f).is_err();
    // Out of bounds: 16 rows of 64 bytes need (15 · 16 + 16) f32s.
    assert!(caught(|| {
        let mut u = model();
        u.configure(&config(16));
        u.load::<4, f32>(&[0.0; 255], 16);
    }));
    // Shapes that do not chain (A of 8 pairs against B of 16 rows).
    assert!(caught(|| {
        let mut u = model();
        let mut cfg = [(16, 64); 8];
        cfg[4] = (16, 32);
        u.configure(&TileConfig::new(cfg));
        u.dpbf16ps::<0, 4, 6>();
    }));
    // Not configured, and a tile used as two operands.
    assert!(caught(|| model().zero::<0>()));
    assert!(caught(|| {
        let mut u = model();
        u.configure(&config(16));
        u.dpbf16ps::<4, 4, 6>();
    }));
    // A configuration the instruction would fault on.
    assert!(caught(|| {
        TileConfig::new([(17, 64); 8]);
    }));
}

/// Plain f64 sums of a score panel: `st[j][r] = Σ_p K[j][p] · Q[r][p]` (bf16 values).
fn naive_scores(k: &[f32], q: &[f32], d: usize, keys: usize, rows: usize) -> Vec<f64> {
    let mut out = vec![0.0; keys * rows];
    for j in 0..keys {
        for r in 0..rows {
            out[j * rows + r] = (0..d)
                .map(|p| f64::from(k[j * d + p]) * f64::from(q[r * d + p]))
                .sum();
        }
    }
    out
}

/// [`scores_panel`] on `u` for `keys` keys of head size `d`, `width` rows, keys `lo .. hi`,
/// from bf16 rows as stored (`in_place`) or pair words, checked against the exact sums:
/// returns Sᵀ.
fn score_case<O: TileOps>(
    u: &mut Unit<O>,
    (d, keys, width): (usize, usize, usize),
    (lo, hi): (usize, usize),
    in_place: bool,
) -> Vec<f32> {
    let d2 = d.div_ceil(2);
    let k = small(keys * d, 7);
    let q = small(width * d, 8);
    let ld_q = 32;
    let mut qp = vec![0.0f32; d2 * ld_q];
    for r in 0..width {
        let row = pairs(&q[r * d..(r + 1) * d]);
        for (p, w) in row.iter().enumerate() {
            qp[p * ld_q + r] = *w;
        }
    }
    let k_bf: Vec<bf16> = k.iter().map(|&x| bf16::from_f32(x)).collect();
    let k_words: Vec<f32> = k.chunks(d).flat_map(pairs).collect();
    let source = if in_place {
        PairKeys::Bf16(&k_bf, d)
    } else {
        PairKeys::Words(&k_words, d2)
    };
    let step = pair_step(d2);
    u.configure(&config(step));
    let panel = ScorePanel {
        keys: source,
        qp: &qp,
        ld_q,
        width,
        d2,
        step,
    };
    let ld_s = 48;
    let mut st = vec![f32::NAN; keys * ld_s];
    scores_panel(u, &panel, (lo, hi), &mut st, ld_s);
    let want = naive_scores(&k, &q, d, keys, width);
    for j in lo..hi {
        for r in 0..width {
            assert_eq!(
                f64::from(st[j * ld_s + r]),
                want[j * width + r],
                "key {j} row {r}, d {d}, keys {lo}..{hi}, width {width}"
            );
        }
        assert!(
            st[j * ld_s + width..(j + 1) * ld_s]
                .iter()
                .all(|x| x.is_nan()),
            "past the width"
        );
    }
    st
}

/// ((head size, keys, panel rows), keys computed).
type ScoreCase = ((usize, usize, usize), (usize, usize));

const SCORE_CASES: [ScoreCase; 6] = [
    ((64, 80, 32), (0, 80)),  // 2 × 2 tiles throughout
    ((128, 50, 16), (3, 50)), // one row block; the last tile moved back
    ((38, 40, 32), (7, 23)),  // 19 pairs: steps of one pair
    ((80, 16, 32), (0, 16)),  // 40 pairs, steps of 10; one tile of keys
    ((96, 33, 16), (10, 33)), // 48 pairs, steps of 16
    ((2, 20, 32), (4, 20)),   // a single pair
];

#[test]
fn score_panels_match_exact_sums() {
    for (shape, range) in SCORE_CASES {
        for in_place in [false, true] {
            score_case(&mut model(), shape, range, in_place);
        }
    }
}

/// [`output_rows`] on `u`: `m` row blocks, `d_vp` channels, pairs `p0 .. p1` (of `kp`).
fn output_case<O: TileOps>(
    u: &mut Unit<O>,
    m: usize,
    d_vp: usize,
    (p0, p1): (usize, usize),
) -> Vec<f32> {
    let (rows, kp) = (16 * m + 16, 64);
    let r0 = 16;
    let p = small(rows * 2 * kp, 9);
    let v = small(2 * kp * d_vp, 10);
    let pa: Vec<f32> = p.chunks(2 * kp).flat_map(pairs).collect();
    let mut pv = vec![0.0f32; kp * d_vp];
    for jp in 0..kp {
        for x in 0..d_vp {
            pv[jp * d_vp + x] = pairs(&[v[2 * jp * d_vp + x], v[(2 * jp + 1) * d_vp + x]])[0];
        }
    }
    let o0 = small(rows * d_vp, 11);
    let mut o = o0.clone();
    u.configure(&config(16));
    let group = OutputGroup {
        pa: &pa,
        ld_p: kp,
        pv: &pv,
        d_vp,
    };
    output_rows(u, &group, (r0, m), (p0, p1), &mut o[r0 * d_vp..]);
    for r in 0..rows {
        for x in 0..d_vp {
            let mut want = f64::from(o0[r * d_vp + x]);
            if (r0..r0 + 16 * m).contains(&r) {
                for j in 2 * p0..2 * p1 {
                    want += f64::from(p[r * 2 * kp + j]) * f64::from(v[j * d_vp + x]);
                }
            }
            assert_eq!(f64::from(o[r * d_vp + x]), want, "row {r} channel {x}");
        }
    }
    o
}

const OUTPUT_CASES: [(usize, usize, (usize, usize)); 4] = [
    (2, 64, (0, 64)),
    (1, 48, (16, 48)),
    (2, 16, (32, 48)),
    (1, 128, (0, 16)),
];

#[test]
fn output_rows_match_exact_sums() {
    for (m, d_vp, pairs) in OUTPUT_CASES {
        output_case(&mut model(), m, d_vp, pairs);
    }
}

/// On a CPU with AMX, the instructions against the model: the same bits on every case (exact
/// sums, and sums that round, whose order the two must share).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_hardware_matches_the_model() {
    use super::hardware::{Amx, Hardware};
    let Some(amx) = Amx::detect() else {
        eprintln!("no AMX here: the tile kernels were tested on the model only");
        return;
    };
    for (shape, range) in SCORE_CASES {
        for in_place in [false, true] {
            let hw = score_case(&mut Unit::new(Hardware(amx)), shape, range, in_place);
            let sw = score_case(&mut model(), shape, range, in_place);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&hw), bits(&sw), "{shape:?} {range:?}");
        }
    }
    for (m, d_vp, pairs) in OUTPUT_CASES {
        let hw = output_case(&mut Unit::new(Hardware(amx)), m, d_vp, pairs);
        let sw = output_case(&mut model(), m, d_vp, pairs);
        assert_eq!(hw, sw, "{m} {d_vp} {pairs:?}");
    }
    // Sums that round: bf16 operands of mixed magnitudes, where the order of the additions
    // shows.
    let scaled = |seed, period: usize, shift: i32| -> Vec<f32> {
        let x = small(16 * 32, seed);
        let x: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| (v + 0.1) * 2f32.powi((i % period) as i32 - shift))
            .collect();
        pairs(&x)
    };
    let (a, b, c0) = (scaled(21, 23, 11), scaled(22, 19, 9), small(256, 23));
    let hw = rounded_sums(&mut Unit::new(Hardware(amx)), &a, &b, &c0);
    let sw = rounded_sums(&mut model(), &a, &b, &c0);
    // The SDM's order (even and odd products summed apart, then added to C) is the model's:
    // expected bit for bit. Should the hardware add in another order, the two still agree
    // within the f32 rounding of 33 terms, 2 · 33 · 2⁻²⁴ · Σ|term| (what `error_bounds`
    // assumes of any order); the test then reports it rather than fail.
    let (wa, wb) = (unpair(&a), unpair(&b));
    let mut differ = 0;
    for m in 0..16 {
        for n in 0..16 {
            let (h, w) = (
                f32::from_bits(hw[m * 16 + n]),
                f32::from_bits(sw[m * 16 + n]),
            );
            let mut mag = f64::from(c0[m * 16 + n].abs());
            for k in 0..32 {
                mag += f64::from(wa[m * 32 + k] * wb[(k / 2) * 32 + 2 * n + k % 2]).abs();
            }
            let bound = 2.0 * 33.0 * 2f64.powi(-24) * mag;
            assert!(
                (f64::from(h) - f64::from(w)).abs() <= bound,
                "C[{m}][{n}]: {h} vs {w}"
            );
            differ += usize::from(h.to_bits() != w.to_bits());
        }
    }
    eprintln!("tdpbf16ps against the model: {differ} of 256 rounded sums differ in their bits");
}

/// Pair words back to their bf16 values, as f32.
#[cfg(target_arch = "x86_64")]
fn unpair(words: &[f32]) -> Vec<f32> {
    words
        .iter()
        .flat_map(|w| {
            let bits = w.to_bits();
            [bits as u16, (bits >> 16) as u16].map(|h| bf16::from_bits(h).to_f32())
        })
        .collect()
}

/// One `tdpbf16ps` of 16 × 16 pairs on `c0`, as bits.
#[cfg(target_arch = "x86_64")]
fn rounded_sums<O: TileOps>(u: &mut Unit<O>, a: &[f32], b: &[f32], c0: &[f32]) -> Vec<u32> {
    u.configure(&config(16));
    u.load::<0, f32>(c0, 16);
    u.load::<4, f32>(a, 16);
    u.load::<6, f32>(b, 16);
    u.dpbf16ps::<0, 4, 6>();
    let mut c = vec![0.0f32; 256];
    u.store::<0>(&mut c, 16);
    c.iter().map(|v| v.to_bits()).collect()
}
