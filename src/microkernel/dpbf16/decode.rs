//! Decode's tiles on bf16 rows as stored: the dot tile (scores by channels, [`Bf16Dot::dots`])
//! and the output tile on V rows interleaved by 16-bit words ([`Bf16Dot::output_in_place`]).

use super::operands::KeyRows;
use crate::simd::bf16::bh;
use crate::simd::{Avx512, Bf16Dot, RowStream, Simd};
use core::arch::x86_64::*;
use half::bf16;

impl Bf16Dot {
    /// Decode's scores by channels (the tiles of [`crate::microkernel::dot_tile`] on bf16
    /// products): `st[j · ld_s + r] = Σ_c k_j[c] · q[r][c]` for the keys `j ∈ [lo, hi)`
    /// and rows `r < rows` (≤ 8), channels `c < d`, in tiles of `keys` keys (1, 2 or 4,
    /// `keys · rows ≤ 16`), then one key at a time. `key.row(j)` is key `j`'s row, bf16 as
    /// stored (at least `d` values), whose consecutive channels already are the pairs; Q
    /// rows are pair rows ([`Bf16Dot::pair_row`]), `⌈d / 2⌉` words each, row `r` at
    /// `q[r · ⌈d / 2⌉ ..]`. The channels past the last whole 32 are read with masked
    /// loads. `next` is requested as the keys are read. Returns the number of tiles.
    #[allow(clippy::too_many_arguments)] // one stage's operands
    pub fn dots(
        self,
        key: impl KeyRows,
        (lo, hi): (usize, usize),
        q: &[f32],
        (d, rows, keys): (usize, usize, usize),
        st: &mut [f32],
        ld_s: usize,
        next: Option<RowStream>,
    ) -> u64 {
        if lo >= hi {
            return 0;
        }
        assert!(matches!(keys, 1 | 2 | 4) && (1..=16 / keys).contains(&rows));
        assert!(q.len() >= rows * d.div_ceil(2) && (hi - 1) * ld_s + rows <= st.len());
        macro_rules! tiles {
            ($($keys:literal x $rows:literal),*) => {
                match (keys, rows) {
                    $(($keys, $rows) => dots::<$keys, $rows>(
                        self.lanes(), &key, (lo, hi), q.as_ptr(), d, st.as_mut_ptr(), ld_s,
                        next,
                    ),)*
                    _ => unreachable!("checked above"),
                }
            };
        }
        // SAFETY: the token proves the features; Q holds `rows` pair rows and `st` the
        // scores (checked above; K's rows are checked as they are read).
        unsafe {
            tiles!(
                4 x 1, 4 x 2, 4 x 3, 4 x 4,
                2 x 1, 2 x 2, 2 x 3, 2 x 4, 2 x 5, 2 x 6, 2 x 7, 2 x 8,
                1 x 1, 1 x 2, 1 x 3, 1 x 4, 1 x 5, 1 x 6, 1 x 7, 1 x 8
            )
        }
    }

    /// Decode's output tile on bf16 V rows as stored: `o[r][0 .. w] = alpha[r] · o[r][..] +
    /// Σ_{j ∈ [lo, hi)} P[j][r] · v[j][..]` for rows `r < rows` (≤ 8) and `w = 16 · vecs`
    /// channels (`vecs` ≤ 4). `p[(j / 2) · ld_p + r]` holds row `r`'s weights of keys
    /// `j & !1` and `j | 1` ([`Bf16Dot::interleave`]); `values.row(j)` is key `j`'s V row
    /// (at least `w` values; rows may lie anywhere, as in a paged cache, so the pairs are the
    /// same whatever the storage). A key whose pair partner lies outside `[lo, hi)` is
    /// paired with a zero row. The rows of each pair are interleaved by 16-bit words inside
    /// 128-bit blocks (one cheap unpack each), so the accumulators hold the channels in
    /// that order: O is permuted into it on entry and back on exit. `next` is requested as
    /// the rows are read, like [`crate::microkernel::output_tile`]'s.
    #[allow(clippy::too_many_arguments)] // one tile's operands
    pub fn output_in_place(
        self,
        p: &[f32],
        ld_p: usize,
        (lo, hi): (usize, usize),
        values: impl KeyRows,
        (rows, vecs): (usize, usize),
        alpha: &[f32],
        o: &mut [f32],
        ld_o: usize,
        next: Option<RowStream>,
    ) {
        if rows == 0 || lo >= hi {
            return;
        }
        let w = 16 * vecs;
        assert!((1..=8).contains(&rows) && (1..=4).contains(&vecs) && alpha.len() >= rows);
        assert!((rows - 1) * ld_o + w <= o.len());
        assert!(((hi - 1) / 2) * ld_p + rows <= p.len());
        // Up to 32 channels a step (one chunk), or 64 (two) for at most five rows, whose
        // accumulators, V pairs and broadcast then fit the 32 registers.
        assert!(vecs <= 2 || rows <= 5, "{rows} rows × {vecs} vectors");
        macro_rules! tile {
            ($($rows:literal x $chunks:literal),*) => {
                match (rows, vecs.div_ceil(2)) {
                    $(($rows, $chunks) => output_pairs::<$rows, $chunks>(
                        p.as_ptr(), ld_p, (lo, hi), &values, w,
                        alpha.as_ptr(), o.as_mut_ptr(), ld_o, next,
                    ),)*
                    _ => unreachable!("checked above"),
                }
            };
        }
        // SAFETY: the token proves the features; every offset of P and O read or written is
        // below the bounds checked above (V's rows are checked as they are read).
        unsafe {
            tile!(
                1 x 1, 2 x 1, 3 x 1, 4 x 1, 5 x 1, 6 x 1, 7 x 1, 8 x 1,
                1 x 2, 2 x 2, 3 x 2, 4 x 2, 5 x 2
            )
        }
    }
}

/// Where key `j`'s row starts, checked to hold the `len` values a kernel reads. (A function
/// of its own, always inlined: the compiler left a closure doing this out of line, and
/// spilled the accumulators around each call.)
#[inline(always)]
fn row_start(rows: &impl KeyRows, j: usize, len: usize) -> *const bf16 {
    let r = rows.row(j);
    assert!(r.len() >= len, "a row shorter than the kernel reads");
    r.as_ptr()
}

/// See [`Bf16Dot::dots`]. Safety: the features; `q` valid for `ROWS · ⌈d / 2⌉` words,
/// `st` for the scores of keys `[lo, hi)`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn dots<const KEYS: usize, const ROWS: usize>(
    lanes: Avx512,
    key: &impl KeyRows,
    (lo, hi): (usize, usize),
    q: *const f32,
    d: usize,
    st: *mut f32,
    ld_s: usize,
    next: Option<RowStream>,
) -> u64 {
    let row = |j| row_start(key, j, d);
    let mut count = 0;
    let mut j = lo;
    while j + KEYS <= hi {
        if let Some(next) = &next {
            next.request(j, KEYS);
        }
        let mut k = [core::ptr::null(); KEYS];
        for (t, x) in k.iter_mut().enumerate() {
            *x = row(j + t);
        }
        // SAFETY: the caller's bounds; keys j .. j + KEYS < hi.
        unsafe { dot_tile::<KEYS, ROWS>(lanes, k, q, d, st.add(j * ld_s), ld_s) };
        j += KEYS;
        count += 1;
    }
    while j < hi {
        if let Some(next) = &next {
            next.request(j, 1);
        }
        // SAFETY: as above, key j < hi.
        unsafe { dot_tile::<1, ROWS>(lanes, [row(j)], q, d, st.add(j * ld_s), ld_s) };
        j += 1;
        count += 1;
    }
    count
}

/// One tile of [`dots`]: keys `k` (rows of `d` bf16 values) × `ROWS` pair rows of Q into
/// `out[t · ld_out + r]`. Safety: the features and the bounds of [`dots`].
#[inline(always)]
unsafe fn dot_tile<const KEYS: usize, const ROWS: usize>(
    lanes: Avx512,
    k: [*const bf16; KEYS],
    q: *const f32,
    d: usize,
    out: *mut f32,
    ld_out: usize,
) {
    let d2 = d.div_ceil(2);
    // Accumulator of key t and row r at `t · ROWS + r`, as the f32 tile's.
    // SAFETY: the caller's features (AVX-512F).
    let mut acc = [unsafe { _mm512_setzero_ps() }; 16];
    // 32 channels: the masks keep `live` channels (a whole chunk: all, so the loads are
    // plain ones), masked-off words read as zero and are never touched.
    let mut chunk = |c: usize, live: usize| {
        let k_mask = (u64::MAX >> (64 - live)) as __mmask32;
        let q_mask = (u32::MAX >> (32 - live.div_ceil(2))) as __mmask16;
        // SAFETY (whole block): the caller's bounds; masked loads do not fault on the
        // lanes they leave out.
        unsafe {
            let mut kv = [_mm512_setzero_si512(); KEYS];
            for (t, x) in kv.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_epi16(k_mask, k[t].add(c).cast());
            }
            for r in 0..ROWS {
                let qv = _mm512_maskz_loadu_ps(q_mask, q.add(r * d2 + c / 2));
                for (t, x) in kv.iter().enumerate() {
                    let a = &mut acc[t * ROWS + r];
                    *a = _mm512_dpbf16_ps(*a, bh(_mm512_castsi512_ps(*x)), bh(qv));
                }
            }
        }
    };
    let whole = d / 32 * 32;
    for c in (0..whole).step_by(32) {
        chunk(c, 32);
    }
    if whole < d {
        chunk(whole, d - whole);
    }
    let sums = lanes.reduce_add16(acc, KEYS * ROWS);
    for t in 0..KEYS {
        for r in 0..ROWS {
            // SAFETY: the caller's bounds on `out`.
            unsafe { *out.add(t * ld_out + r) = sums[t * ROWS + r] };
        }
    }
}

/// Lane `4b + m` of the unpacked pairs of block `b` (of four 128-bit blocks) holds channel
/// `8b + m` (low unpack) or `8b + 4 + m` (high unpack) of a 32-channel chunk: the sources of
/// a chunk's two accumulators in `[channels 0..16 | channels 16..32]`, and back.
const TO_PAIRS: [[i32; 16]; 2] = {
    let mut idx = [[0i32; 16]; 2];
    let mut lane = 0;
    while lane < 16 {
        let (b, m) = (lane as i32 / 4, lane as i32 % 4);
        idx[0][lane] = 8 * b + m;
        idx[1][lane] = 8 * b + 4 + m;
        lane += 1;
    }
    idx
};
const FROM_PAIRS: [[i32; 16]; 2] = {
    let mut idx = [[0i32; 16]; 2];
    let mut ch = 0;
    while ch < 32 {
        let (b, m) = (ch as i32 / 8, ch as i32 % 8);
        idx[ch / 16][ch % 16] = if m < 4 { 4 * b + m } else { 16 + 4 * b + m - 4 };
        ch += 1;
    }
    idx
};

/// The V row a key without its pair partner is paired with: as long as two chunks.
static ZERO_ROW: [bf16; 64] = [bf16::ZERO; 64];

/// See [`Bf16Dot::output_in_place`], `CHUNKS` of 32 channels (the last may hold 16).
/// Safety: the features and the bounds checked there.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn output_pairs<const ROWS: usize, const CHUNKS: usize>(
    p: *const f32,
    ld_p: usize,
    (lo, hi): (usize, usize),
    rows: &impl KeyRows,
    w: usize,
    alpha: *const f32,
    o: *mut f32,
    ld_o: usize,
    next: Option<RowStream>,
) {
    // Words of V, and f32s of O, live in each chunk.
    let mut words = [0usize; CHUNKS];
    for (ch, n) in words.iter_mut().enumerate() {
        *n = w.saturating_sub(32 * ch).min(32);
    }
    let v_mask = words.map(|n| (u64::MAX >> (64 - n)) as __mmask32);
    let half = |ch: usize, h: usize| -> __mmask16 {
        if words[ch] > 16 * h {
            0xFFFF
        } else {
            0
        }
    };
    // SAFETY (whole body): the caller's bounds; masked loads and stores touch only the
    // lanes they keep.
    unsafe {
        let to = TO_PAIRS.map(|x| _mm512_loadu_si512(x.as_ptr().cast()));
        let from = FROM_PAIRS.map(|x| _mm512_loadu_si512(x.as_ptr().cast()));
        let mut acc = [[[_mm512_setzero_ps(); 2]; CHUNKS]; ROWS];
        for (r, a) in acc.iter_mut().enumerate() {
            let scale = _mm512_set1_ps(*alpha.add(r));
            for (ch, ac) in a.iter_mut().enumerate() {
                let at = o.add(r * ld_o + 32 * ch);
                let x0 = _mm512_maskz_loadu_ps(half(ch, 0), at);
                let x1 = _mm512_maskz_loadu_ps(half(ch, 1), at.wrapping_add(16));
                let (x0, x1) = (_mm512_mul_ps(scale, x0), _mm512_mul_ps(scale, x1));
                ac[0] = _mm512_permutex2var_ps(x0, to[0], x1);
                ac[1] = _mm512_permutex2var_ps(x0, to[1], x1);
            }
        }
        let row = |j| row_start(rows, j, w);
        let mut j = lo;
        while j < hi {
            // The pair of keys `j & !1`, `j | 1`; a partner outside [lo, hi) is a zero row.
            let first = j & !1;
            let zeros = ZERO_ROW.as_ptr();
            let pa = if first >= lo { row(first) } else { zeros };
            let pb = if first + 1 < hi {
                row(first + 1)
            } else {
                zeros
            };
            let mut vv = [[_mm512_setzero_si512(); 2]; CHUNKS];
            for (ch, x) in vv.iter_mut().enumerate() {
                let a = _mm512_maskz_loadu_epi16(v_mask[ch], pa.add(32 * ch).cast());
                let b = _mm512_maskz_loadu_epi16(v_mask[ch], pb.add(32 * ch).cast());
                x[0] = _mm512_unpacklo_epi16(a, b);
                x[1] = _mm512_unpackhi_epi16(a, b);
            }
            if let Some(next) = &next {
                next.request(j, (first + 2).min(hi) - j);
            }
            let pw = p.add((first / 2) * ld_p).cast::<i32>();
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = bh(_mm512_castsi512_ps(_mm512_set1_epi32(*pw.add(r))));
                for (ac, x) in a.iter_mut().zip(&vv) {
                    ac[0] = _mm512_dpbf16_ps(ac[0], pr, bh(_mm512_castsi512_ps(x[0])));
                    ac[1] = _mm512_dpbf16_ps(ac[1], pr, bh(_mm512_castsi512_ps(x[1])));
                }
            }
            j = first + 2;
        }
        for (r, a) in acc.iter().enumerate() {
            for (ch, ac) in a.iter().enumerate() {
                let at = o.add(r * ld_o + 32 * ch);
                let x0 = _mm512_permutex2var_ps(ac[0], from[0], ac[1]);
                let x1 = _mm512_permutex2var_ps(ac[0], from[1], ac[1]);
                _mm512_mask_storeu_ps(at, half(ch, 0), x0);
                _mm512_mask_storeu_ps(at.wrapping_add(16), half(ch, 1), x1);
            }
        }
    }
}
