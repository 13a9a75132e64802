//! bf16 dot products (AVX512_BF16): the two tile products of the fused kernel on bf16 operands
//! with f32 accumulation, for [`Options::bf16_products`](crate::Options::bf16_products) (bf16 Q
//! and K/V, whose values convert exactly; the softmax weights are rounded).
//!
//! `vdpbf16ps` multiplies two pairs of bf16 values and adds both products to one f32 lane,
//! `acc += a.lo · b.lo + a.hi · b.hi`: twice the multiply-adds of an f32 FMA per instruction
//! (`bench --peak` measures both rates). The tiles keep the f32 kernel's shape (12 keys or rows
//! × 2 vectors of 16 lanes, see [`crate::microkernel`]) and take the reduction dimension two at
//! a time, so each operand holds a *pair* per 32-bit lane:
//! * scores, `Sᵀ = K · Qᵀ`: Qᵀ panels hold, per pair of channels `(2p, 2p + 1)`, each query
//!   row's two channels in its lane ([`Bf16Dot::interleave`] of the f32 panel's steps `2p` and
//!   `2p + 1`); a K row rounded to bf16 *is* a row of channel pairs ([`Bf16Dot::pair_row`]),
//!   broadcast one 32-bit pair at a time.
//! * output, `O = α ⊙ O + P · V`: Pᵀ with the weights of keys `(2j, 2j + 1)` of a row in its
//!   lane, broadcast; V with rows `2j` and `2j + 1` interleaved channel by channel.
//!
//! Every rounding to bf16 is the instruction's: to nearest, ties to even, NaN kept, and bf16
//! subnormals flushed to zero (on input and output, whatever MXCSR says); the products of two
//! bf16 values are exact in f32 unless they underflow (flushed too). The error bound
//! (`reference::error_bounds`) counts all of it.
//!
//! [`Bf16Dot`] proves that the CPU has AVX-512F, BW, VL and BF16. Each public method is one
//! `#[target_feature]` function that does a whole panel's work, so the call costs nothing
//! against the tiles it runs.

#[cfg(target_arch = "x86_64")]
pub(crate) use imp::Bf16Dot;

#[cfg(not(target_arch = "x86_64"))]
pub(crate) use stub::Bf16Dot;

/// Rows per score panel and per output row group: two vectors of 16 lanes, and the tile
/// height (the AVX-512 backend's geometry, which this path runs under).
pub(crate) const PANEL: usize = 32;
/// Keys per score tile and rows per output tile.
pub(crate) const TILE: usize = 12;

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::{PANEL, TILE};
    use core::arch::x86_64::*;

    /// Proof that the running CPU has AVX-512F, BW, VL and BF16: the only constructor is
    /// [`Bf16Dot::detect`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Bf16Dot {
        _proof: (),
    }

    /// Lane `i` of the result: 16-bit word `i / 2` of `a`'s half if `i` is even, of `b`'s if odd
    /// (for `vpermw` over `[a's 16 words | b's 16 words]`).
    const INTERLEAVE: [i16; 32] = {
        let mut idx = [0i16; 32];
        let mut i = 0;
        while i < 16 {
            idx[2 * i] = i as i16;
            idx[2 * i + 1] = 16 + i as i16;
            i += 1;
        }
        idx
    };

    #[inline(always)]
    fn bh(x: __m512) -> __m512bh {
        // SAFETY: both are 512-bit vectors with no invalid bit patterns.
        unsafe { core::mem::transmute::<__m512, __m512bh>(x) }
    }

    #[inline(always)]
    fn bits(x: __m512bh) -> __m512i {
        // SAFETY: as in `bh`.
        unsafe { core::mem::transmute::<__m512bh, __m512i>(x) }
    }

    impl Bf16Dot {
        /// The token, if the CPU has the features (`std` caches the CPUID queries).
        pub fn detect() -> Option<Self> {
            (is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bf16"))
            .then_some(Self { _proof: () })
        }

        /// `dst[i] = bf16(a[i]) | bf16(b[i]) << 16` for `i < dst.len()` (a multiple of 16),
        /// the pairs as 32-bit words in f32 slots; `b = None` pairs with zeros.
        pub fn interleave(self, a: &[f32], b: Option<&[f32]>, dst: &mut [f32]) {
            let n = dst.len();
            assert!(n.is_multiple_of(16) && a.len() >= n && b.is_none_or(|b| b.len() >= n));
            // SAFETY: the token proves the features; the lengths are checked above.
            unsafe { interleave(a.as_ptr(), b.map(<[f32]>::as_ptr), dst.as_mut_ptr(), n) }
        }

        /// `x` rounded to bf16, two values per 32-bit word (`x[2w]` low, `x[2w + 1]` high, a zero
        /// after an odd count) into `dst[.. ⌈x.len() / 2⌉]`.
        pub fn pair_row(self, x: &[f32], dst: &mut [f32]) {
            assert!(dst.len() >= x.len().div_ceil(2));
            // SAFETY: the token proves the features; the lengths are checked above.
            unsafe { pair_row(x.as_ptr(), x.len(), dst.as_mut_ptr()) }
        }

        /// The score tiles of one panel: keys `[lo, hi)` (pair rows of `d2` words at
        /// `k[j · ld_k ..]`) against `vecs` (1 or 2) vectors of rows of the pair panel `qt`
        /// (`d2` steps of [`PANEL`] words), each score times `factors[0]` then `factors[1]`,
        /// into `st[j · ld_s + r]`; `max[r]` (for `r < 16·vecs`) raised to each row's largest.
        /// Returns the number of tiles.
        #[allow(clippy::too_many_arguments)] // one panel's operands
        pub fn scores_panel(
            self,
            k: &[f32],
            ld_k: usize,
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
            assert!((1..=2).contains(&vecs) && d2 <= ld_k && max.len() >= 16 * vecs);
            assert!((hi - 1) * ld_k + d2 <= k.len() && d2 * PANEL <= qt.len());
            assert!((hi - 1) * ld_s + 16 * vecs <= st.len());
            // SAFETY: the token proves the features; every offset the tiles read or write is
            // below the bounds checked above.
            unsafe {
                scores_panel(
                    k.as_ptr(),
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
                    || ((hi - 1) * ld_p + rows <= p.len()
                        && (hi - 1) * ld_v + 16 * vecs <= v.len())
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

    /// See [`Bf16Dot::interleave`]. Safety: the features; `a`, `b` (if any) and `dst` valid for
    /// `n` f32s, `n` a multiple of 16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn interleave(a: *const f32, b: Option<*const f32>, dst: *mut f32, n: usize) {
        // SAFETY (whole body): the caller's contract; `INTERLEAVE` is 64 bytes.
        unsafe {
            let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            for i in (0..n).step_by(16) {
                let x = _mm512_loadu_ps(a.add(i));
                let y = match b {
                    Some(b) => _mm512_loadu_ps(b.add(i)),
                    None => _mm512_setzero_ps(),
                };
                // x's 16 values in the low 16 words, y's in the high; then word i of each
                // half side by side.
                let words = bits(_mm512_cvtne2ps_pbh(y, x));
                _mm512_storeu_si512(dst.add(i).cast(), _mm512_permutexvar_epi16(idx, words));
            }
        }
    }

    /// See [`Bf16Dot::pair_row`]. Safety: the features; `x` valid for `n` f32s, `dst` for
    /// `⌈n / 2⌉`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn pair_row(x: *const f32, n: usize, dst: *mut f32) {
        let mask = |from: usize, count: usize| -> __mmask16 {
            let live = n.saturating_sub(from).min(count);
            ((1u32 << live) - 1) as __mmask16
        };
        // SAFETY (whole body): the caller's contract; masked-off lanes are neither read nor
        // written (AVX-512 masked loads and stores suppress faults).
        unsafe {
            for i in (0..n).step_by(32) {
                // (`wrapping_add`: past the row's end the address is formed, never read.)
                let lo = _mm512_maskz_loadu_ps(mask(i, 16), x.add(i));
                let hi = _mm512_maskz_loadu_ps(mask(i + 16, 16), x.wrapping_add(i + 16));
                // Words in order: x[i], x[i + 1], …, i.e. pairs (x[2w], x[2w + 1]).
                let words = bits(_mm512_cvtne2ps_pbh(hi, lo));
                let pairs = (n - i).min(32).div_ceil(2);
                let keep = ((1u32 << pairs) - 1) as __mmask16;
                _mm512_mask_storeu_epi32(dst.add(i / 2).cast(), keep, words);
            }
        }
    }

    /// See [`Bf16Dot::scores_panel`]. Safety: the features and the bounds checked there.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn scores_panel(
        k: *const f32,
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
        k: *const f32,
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
            let k = k.add(j0 * ld_k).cast::<i32>();
            let mut acc = [[_mm512_setzero_ps(); VECS]; KEYS];
            for p in 0..d2 {
                let mut q = [_mm512_setzero_ps(); VECS];
                for (v, qv) in q.iter_mut().enumerate() {
                    *qv = _mm512_loadu_ps(qt.add(p * PANEL + 16 * v));
                }
                for (t, a) in acc.iter_mut().enumerate() {
                    let kb = _mm512_castsi512_ps(_mm512_set1_epi32(*k.add(t * ld_k + p)));
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
}

/// No AVX512_BF16 off x86-64: the token cannot exist.
#[cfg(not(target_arch = "x86_64"))]
mod stub {
    /// Uninhabited: [`Bf16Dot::detect`] always answers `None`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Bf16Dot {}

    #[allow(clippy::too_many_arguments, clippy::unused_self)]
    impl Bf16Dot {
        pub fn detect() -> Option<Self> {
            None
        }
        pub fn interleave(self, _: &[f32], _: Option<&[f32]>, _: &mut [f32]) {
            match self {}
        }
        pub fn pair_row(self, _: &[f32], _: &mut [f32]) {
            match self {}
        }
        pub fn scores_panel(
            self,
            _: &[f32],
            _: usize,
            _: (usize, usize),
            _: &[f32],
            _: usize,
            _: &mut [f32],
            _: usize,
            _: usize,
            _: [f32; 2],
            _: &mut [f32],
        ) -> u64 {
            match self {}
        }
        pub fn output_tile(
            self,
            _: &[f32],
            _: usize,
            _: (usize, usize),
            _: &[f32],
            _: usize,
            _: (usize, usize),
            _: &[f32],
            _: &mut [f32],
            _: usize,
        ) {
            match self {}
        }
    }
}
