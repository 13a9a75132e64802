//! Prefill's tiles: the score panel (`Sᵀ = K · Qᵀ` by channel pairs) and the output tile
//! (`O = α ⊙ O + P · V` by key pairs), with the f32 kernel's `12 × 32` shape.

use super::operands::{PairKeys, PANEL, TILE};
use crate::simd::bf16::bh;
use crate::simd::Bf16Dot;
use core::arch::x86_64::*;

impl Bf16Dot {
    /// The score tiles of one panel: keys `[lo, hi)` (rows of `d2` pairs, [`PairKeys`])
    /// against `vecs` (1 or 2) vectors of rows of the pair panel `qt`
    /// (`d2` steps of [`PANEL`] words), each score times `factors[0]` then `factors[1]`,
    /// into `st[j · ld_s + r]`; `max[r]` (for `r < 16·vecs`) raised to each row's largest.
    /// Returns the number of tiles.
    #[allow(clippy::too_many_arguments)] // one panel's operands
    pub fn scores_panel(
        self,
        k: PairKeys<'_>,
        (lo, hi): (usize, usize),
        qt: &[f32],
        d2: usize,
        st: &mut [f32],
        ld_s: usize,
        vecs: usize,
        factors: [f32; 2],
        max: &mut [f32],
    ) -> u64 {
        if lo >= hi {
            return 0;
        }
        // Bytes: the rows' start, the distance between rows, their extent.
        let (k, ld_k, len) = match k {
            PairKeys::Words(w, ld) => (w.as_ptr().cast::<u8>(), 4 * ld, 4 * w.len()),
            PairKeys::Bf16(x, ld) => {
                assert!(ld.is_multiple_of(2));
                (x.as_ptr().cast::<u8>(), 2 * ld, 2 * x.len())
            }
        };
        assert!((1..=2).contains(&vecs) && 4 * d2 <= ld_k && max.len() >= 16 * vecs);
        assert!((hi - 1) * ld_k + 4 * d2 <= len && d2 * PANEL <= qt.len());
        assert!((hi - 1) * ld_s + 16 * vecs <= st.len());
        // SAFETY: the token proves the features; every offset the tiles read or write is
        // below the bounds checked above.
        unsafe {
            scores_panel(
                k,
                ld_k,
                (lo, hi),
                qt.as_ptr(),
                d2,
                st.as_mut_ptr(),
                ld_s,
                vecs,
                factors,
                max.as_mut_ptr(),
            )
        }
    }

    /// `o[r][0 .. 16·vecs] = alpha[r] · o[r][..] + Σ_{j ∈ [lo, hi)} p[j][r] · v[j][..]` for
    /// rows `r < rows` (≤ [`TILE`]), over key *pairs* `j`: `p[j · ld_p + r]` holds row `r`'s
    /// weights of keys `2j` and `2j + 1`, `v[j · ld_v + x]` their values of channel `x`.
    #[allow(clippy::too_many_arguments)] // one tile's operands
    pub fn output_tile(
        self,
        p: &[f32],
        ld_p: usize,
        (lo, hi): (usize, usize),
        v: &[f32],
        ld_v: usize,
        (rows, vecs): (usize, usize),
        alpha: &[f32],
        o: &mut [f32],
        ld_o: usize,
    ) {
        if rows == 0 {
            return;
        }
        assert!(rows <= TILE && (1..=2).contains(&vecs) && alpha.len() >= rows);
        assert!((rows - 1) * ld_o + 16 * vecs <= o.len());
        assert!(
            lo >= hi
                || ((hi - 1) * ld_p + rows <= p.len() && (hi - 1) * ld_v + 16 * vecs <= v.len())
        );
        // SAFETY: the token proves the features; every offset read or written is below the
        // bounds checked above.
        unsafe {
            output_tile(
                p.as_ptr(),
                ld_p,
                (lo, hi.max(lo)),
                v.as_ptr(),
                ld_v,
                (rows, vecs),
                alpha.as_ptr(),
                o.as_mut_ptr(),
                ld_o,
            )
        }
    }
}

/// See [`Bf16Dot::scores_panel`]. Safety: the features and the bounds checked there.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn scores_panel(
    k: *const u8,
    ld_k: usize,
    (lo, hi): (usize, usize),
    qt: *const f32,
    d2: usize,
    st: *mut f32,
    ld_s: usize,
    vecs: usize,
    factors: [f32; 2],
    max: *mut f32,
) -> u64 {
    let mut mx = [_mm512_set1_ps(f32::NEG_INFINITY); 2];
    let mut count = 0;
    let mut j = lo;
    while j < hi {
        let n = (hi - j).min(TILE);
        macro_rules! tile {
            ($($keys:literal)*) => {
                match (n, vecs) {
                    $(
                        ($keys, 1) => scores_tile::<$keys, 1>(k, ld_k, j, qt, d2, st, ld_s, factors, &mut mx),
                        ($keys, _) => scores_tile::<$keys, 2>(k, ld_k, j, qt, d2, st, ld_s, factors, &mut mx),
                    )*
                    _ => unreachable!("a tile has 1 ..= {TILE} keys"),
                }
            };
        }
        // SAFETY: keys j .. j + n ≤ hi and the rows of `vecs` vectors are in bounds.
        unsafe { tile!(1 2 3 4 5 6 7 8 9 10 11 12) };
        count += 1;
        j += n;
    }
    for (v, &m) in mx.iter().enumerate().take(vecs) {
        // SAFETY: `max` holds 16·vecs values.
        unsafe {
            let at = max.add(16 * v);
            _mm512_storeu_ps(at, _mm512_max_ps(_mm512_loadu_ps(at), m));
        }
    }
    count
}

/// One score tile: keys `j0 .. j0 + KEYS` × `VECS` vectors of rows. Safety: as
/// [`scores_panel`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scores_tile<const KEYS: usize, const VECS: usize>(
    k: *const u8,
    ld_k: usize,
    j0: usize,
    qt: *const f32,
    d2: usize,
    st: *mut f32,
    ld_s: usize,
    factors: [f32; 2],
    mx: &mut [__m512; 2],
) {
    // SAFETY (whole body): the caller's bounds.
    unsafe {
        let k = k.add(j0 * ld_k);
        let mut acc = [[_mm512_setzero_ps(); VECS]; KEYS];
        for p in 0..d2 {
            let mut q = [_mm512_setzero_ps(); VECS];
            for (v, qv) in q.iter_mut().enumerate() {
                *qv = _mm512_loadu_ps(qt.add(p * PANEL + 16 * v));
            }
            for (t, a) in acc.iter_mut().enumerate() {
                let pair = k.add(t * ld_k + 4 * p).cast::<i32>().read_unaligned();
                let kb = _mm512_castsi512_ps(_mm512_set1_epi32(pair));
                for v in 0..VECS {
                    a[v] = _mm512_dpbf16_ps(a[v], bh(kb), bh(q[v]));
                }
            }
        }
        let (f0, f1) = (_mm512_set1_ps(factors[0]), _mm512_set1_ps(factors[1]));
        for (t, a) in acc.iter().enumerate() {
            let row = st.add((j0 + t) * ld_s);
            for (v, &x) in a.iter().enumerate() {
                let y = _mm512_mul_ps(_mm512_mul_ps(x, f0), f1);
                mx[v] = _mm512_max_ps(mx[v], y);
                _mm512_storeu_ps(row.add(16 * v), y);
            }
        }
    }
}

/// See [`Bf16Dot::output_tile`]. Safety: the features and the bounds checked there.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn output_tile(
    p: *const f32,
    ld_p: usize,
    keys: (usize, usize),
    v: *const f32,
    ld_v: usize,
    (rows, vecs): (usize, usize),
    alpha: *const f32,
    o: *mut f32,
    ld_o: usize,
) {
    macro_rules! tile {
        ($($rows:literal)*) => {
            match (rows, vecs) {
                $(
                    ($rows, 1) => output_rows::<$rows, 1>(p, ld_p, keys, v, ld_v, alpha, o, ld_o),
                    ($rows, _) => output_rows::<$rows, 2>(p, ld_p, keys, v, ld_v, alpha, o, ld_o),
                )*
                _ => unreachable!("a tile has 1 ..= {TILE} rows"),
            }
        };
    }
    // SAFETY: the caller's bounds.
    unsafe { tile!(1 2 3 4 5 6 7 8 9 10 11 12) }
}

/// One output tile of `ROWS` rows × `VECS` vectors. Safety: as [`output_tile`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn output_rows<const ROWS: usize, const VECS: usize>(
    p: *const f32,
    ld_p: usize,
    (lo, hi): (usize, usize),
    v: *const f32,
    ld_v: usize,
    alpha: *const f32,
    o: *mut f32,
    ld_o: usize,
) {
    // SAFETY (whole body): the caller's bounds.
    unsafe {
        let p = p.cast::<i32>();
        let mut acc = [[_mm512_setzero_ps(); VECS]; ROWS];
        for (r, a) in acc.iter_mut().enumerate() {
            let scale = _mm512_set1_ps(*alpha.add(r));
            for (x, ax) in a.iter_mut().enumerate() {
                *ax = _mm512_mul_ps(scale, _mm512_loadu_ps(o.add(r * ld_o + 16 * x)));
            }
        }
        for j in lo..hi {
            let mut vv = [_mm512_setzero_ps(); VECS];
            for (x, vx) in vv.iter_mut().enumerate() {
                *vx = _mm512_loadu_ps(v.add(j * ld_v + 16 * x));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = _mm512_castsi512_ps(_mm512_set1_epi32(*p.add(j * ld_p + r)));
                for x in 0..VECS {
                    a[x] = _mm512_dpbf16_ps(a[x], bh(pr), bh(vv[x]));
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (x, &ax) in a.iter().enumerate() {
                _mm512_storeu_ps(o.add(r * ld_o + 16 * x), ax);
            }
        }
    }
}
