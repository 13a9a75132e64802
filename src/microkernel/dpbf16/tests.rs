//! Decode's two kernels at every shape they are dispatched for, against f64 sums of the
//! same bf16 values (whose products are exact): odd head sizes, key ranges that start or
//! end inside a pair, and every panel width.

use super::{Bf16Dot, KeyRows};
use half::bf16;

fn value(seed: usize) -> bf16 {
    bf16::from_f32(((seed as f32) * 0.618_034).fract() * 2.0 - 1.0)
}

/// Rows `ld` apart in one slice.
struct Strided<'a>(&'a [bf16], usize);

impl KeyRows for Strided<'_> {
    fn row(&self, j: usize) -> &[bf16] {
        &self.0[j * self.1..]
    }
}

fn close(got: f32, want: f64, magnitude: f64, what: &str) {
    let err = (f64::from(got) - want).abs();
    assert!(err <= 1e-6 * magnitude + 1e-30, "{what}: {got} vs {want}");
}

/// `Simd::pair_bf16` of every backend (AVX-512 inlined under [`Bf16Dot::run`], the others
/// the portable default) writes [`Bf16Dot::interleave`]'s words, ties and overflow to ±∞
/// included; NaN stays NaN.
#[test]
fn pair_bf16_of_every_backend_is_interleave() {
    use crate::simd::{Avx2Fma, Kernel, Portable, Simd};
    let Some(bf) = Bf16Dot::detect() else {
        return;
    };
    // Ties at even and odd mantissas, both signs, values past bf16's largest, zeros.
    let special = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -2.5e38,
        3.4e38,
        -0.0,
    ];
    let a: Vec<f32> = (0..32)
        .map(|i| special.get(i).copied().unwrap_or(value(i).to_f32() * 1.37))
        .collect();
    let b: Vec<f32> = (0..32)
        .map(|i| {
            if i == 7 {
                f32::NAN
            } else {
                value(i + 40).to_f32() / 3.0
            }
        })
        .collect();
    let mut want = vec![0.0f32; 32];
    bf.interleave(&a, Some(&b), &mut want);
    struct Pair<'a>(Bf16Dot, &'a [f32], &'a [f32], &'a mut [f32]);
    impl Kernel for Pair<'_> {
        type Output = ();
        fn run<S: Simd>(self, s: S) {
            let Pair(bf, a, b, out) = self;
            for i in (0..32).step_by(S::LANES) {
                s.pair_bf16(bf, s.load(&a[i..]), s.load(&b[i..]), &mut out[i..]);
            }
        }
    }
    let check = |got: &[f32], what: &str| {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (g, w) = (g.to_bits(), w.to_bits());
            let nan = |x: u32| bf16::from_bits((x >> 16) as u16).is_nan();
            if i == 7 {
                assert!(nan(g) && g & 0xFFFF == w & 0xFFFF, "{what}: lane {i}");
            } else {
                assert_eq!(g, w, "{what}: lane {i}");
            }
        }
    };
    let mut got = vec![0.0f32; 32];
    bf.run(Pair(bf, &a, &b, &mut got));
    check(&got, "avx512");
    let mut got = vec![0.0f32; 32];
    Pair(bf, &a, &b, &mut got).run(Portable);
    check(&got, "portable");
    if let Some(avx2) = Avx2Fma::detect() {
        let mut got = vec![0.0f32; 32];
        Pair(bf, &a, &b, &mut got).run(avx2);
        check(&got, "avx2");
    }
}

#[test]
fn dots_of_every_tile_shape() {
    let Some(bf) = Bf16Dot::detect() else {
        return;
    };
    for d in [1usize, 31, 32, 37, 64, 128] {
        let d2 = d.div_ceil(2);
        let n_keys = 11;
        let k: Vec<bf16> = (0..n_keys * d).map(|i| value(i + 1)).collect();
        for (keys, max_rows) in [(4, 4), (2, 8), (1, 8)] {
            for rows in 1..=max_rows {
                let q: Vec<f32> = (0..rows * d).map(|i| value(3 * i + 7).to_f32()).collect();
                let mut qp = vec![0.0f32; rows * d2];
                for r in 0..rows {
                    bf.pair_row(&q[r * d..][..d], &mut qp[r * d2..][..d2]);
                }
                let ld_s = 16;
                let mut st = vec![f32::NAN; n_keys * ld_s];
                let (lo, hi) = (1, n_keys);
                let shape = (d, rows, keys);
                let tiles = bf.dots(Strided(&k, d), (lo, hi), &qp, shape, &mut st, ld_s, None);
                let n = hi - lo;
                assert_eq!(tiles as usize, n / keys + n % keys);
                for j in lo..hi {
                    for r in 0..rows {
                        let terms = (0..d)
                            .map(|c| f64::from(k[j * d + c].to_f32()) * f64::from(q[r * d + c]));
                        let (sum, mag) = terms.fold((0.0, 0.0), |(s, m), x| (s + x, m + x.abs()));
                        let what = format!("d {d}, {keys} keys, {rows} rows, key {j}, row {r}");
                        close(st[j * ld_s + r], sum, mag, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn output_of_every_panel_and_key_range() {
    let Some(bf) = Bf16Dot::detect() else {
        return;
    };
    let (n_keys, ld_v, ld_p, ld_o) = (9, 80, 16, 64);
    let v: Vec<bf16> = (0..n_keys * ld_v).map(|i| value(i + 5)).collect();
    // Weights of keys (2jp, 2jp + 1) per row, already bf16 values.
    let p: Vec<f32> = (0..n_keys * ld_p)
        .map(|i| value(2 * i + 3).to_f32().abs())
        .collect();
    let mut pairs = vec![0.0f32; n_keys.div_ceil(2) * ld_p];
    for jp in 0..n_keys.div_ceil(2) {
        let second = (2 * jp + 1 < n_keys).then(|| &p[(2 * jp + 1) * ld_p..][..ld_p]);
        bf.interleave(
            &p[2 * jp * ld_p..][..ld_p],
            second,
            &mut pairs[jp * ld_p..][..ld_p],
        );
    }
    for rows in 1..=8 {
        for vecs in 1..=(if rows <= 5 { 4 } else { 2 }) {
            for (lo, hi) in [(0, n_keys), (1, n_keys), (1, 8), (3, 4), (2, 3)] {
                let w = 16 * vecs;
                let o0: Vec<f32> = (0..rows * ld_o).map(|i| value(i + 11).to_f32()).collect();
                let alpha: Vec<f32> = (0..rows).map(|r| 0.5 + r as f32 * 0.25).collect();
                let mut o = o0.clone();
                let shape = (rows, vecs);
                let vr = Strided(&v, ld_v);
                bf.output_in_place(
                    &pairs,
                    ld_p,
                    (lo, hi),
                    vr,
                    shape,
                    &alpha,
                    &mut o,
                    ld_o,
                    None,
                );
                for r in 0..rows {
                    for c in 0..ld_o {
                        let what =
                            format!("{rows} rows, {vecs} vecs, keys {lo}..{hi}, row {r}, ch {c}");
                        if c >= w {
                            assert_eq!(
                                o[r * ld_o + c].to_bits(),
                                o0[r * ld_o + c].to_bits(),
                                "{what}"
                            );
                            continue;
                        }
                        let mut sum = f64::from(alpha[r]) * f64::from(o0[r * ld_o + c]);
                        let mut mag = sum.abs();
                        for j in lo..hi {
                            let x =
                                f64::from(p[j * ld_p + r]) * f64::from(v[j * ld_v + c].to_f32());
                            sum += x;
                            mag += x.abs();
                        }
                        close(o[r * ld_o + c], sum, mag, &what);
                    }
                }
            }
        }
    }
}
