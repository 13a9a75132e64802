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
//!   broadcast one 32-bit pair at a time, and a bf16 row is read where it is stored
//!   ([`PairKeys`]).
//! * output, `O = α ⊙ O + P · V`: Pᵀ with the weights of keys `(2j, 2j + 1)` of a row in its
//!   lane (rounded and paired as the softmax writes them, [`Bf16Dot::pair_vectors`]),
//!   broadcast; V with rows `2j` and `2j + 1` interleaved channel by channel (bf16 rows from
//!   their words as stored, [`Pairable`]).
//!
//! Decode (few query rows per kv head, channels along the lanes) has its own two kernels, which
//! read the cache's bf16 rows as stored ([`KeyRows`]):
//! * [`Bf16Dot::dots`]: the f32 dot tile's shape (up to four keys × the rows, one accumulator
//!   each, summed across lanes at the end) with a K row's 32 channels loaded as the 16 pairs
//!   they already are, against Q rows by channel pairs ([`Bf16Dot::pair_row`]).
//! * [`Bf16Dot::output_in_place`]: V rows `2j` and `2j + 1` loaded as stored and interleaved by
//!   `vpunpck{l,h}wd`, which pairs words only inside 128-bit blocks (one cheap instruction each,
//!   against a cross-lane permute). The accumulators then hold the channels in that order; O is
//!   permuted into it when a panel starts and back when it ends.
//!
//! Per key and kv head of four rows at d = 128 that is 16 `vdpbf16ps` for the scores and 16
//! for the output, against 32 FMAs each on f32 lanes plus every K and V vector's conversion.
//!
//! Every rounding to bf16 is the instruction's: to nearest, ties to even, NaN kept, and bf16
//! subnormals flushed to zero (on input and output, whatever MXCSR says); the products of two
//! bf16 values are exact in f32 unless they underflow (flushed too). The error bound
//! (`reference::error_bounds`) counts all of it.
//!
//! [`Bf16Dot`] proves that the CPU has AVX-512F, BW, VL and BF16. Each public method is one
//! `#[target_feature]` function that does a whole panel's (or a block's) work, so the call
//! costs nothing against the tiles it runs, with one exception: [`Bf16Dot::pair_vectors`]
//! rounds and pairs two vectors of weights inside the softmax loop, which runs through
//! [`Bf16Dot::run`]'s entry point so that the conversion compiles into the loop.

#[cfg(target_arch = "x86_64")]
pub(crate) use imp::Bf16Dot;

#[cfg(not(target_arch = "x86_64"))]
pub(crate) use stub::Bf16Dot;

/// Where the bf16 K or V rows that decode's kernels read as stored lie: `row(j)` is key `j`'s
/// row (at least as long as the kernel reads). Its implementations are `#[inline(always)]`, so
/// that finding a row compiles into the kernel's loop: a call there would make the compiler
/// spill the register tile around it. (Off x86-64 nothing reads rows through it.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) trait KeyRows {
    /// Key `j`'s row.
    fn row(&self, j: usize) -> &[half::bf16];
}

/// K rows of channel pairs as [`Bf16Dot::scores_panel`] reads them, a 32-bit pair at a time
/// (off x86-64 nothing reads them).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum PairKeys<'a> {
    /// Rows of pair words ([`Bf16Dot::pair_row`]), row `j` at `[j · ld ..]`.
    Words(&'a [f32], usize),
    /// bf16 rows as stored, row `j` at `[j · ld ..]`, with `ld` and the head size even: then
    /// pair `p` of a row is its values `2p` and `2p + 1`, one 32-bit word (read unaligned).
    Bf16(&'a [half::bf16], usize),
}

/// Rows that the pairing kernels take: f32 values, rounded to bf16 ([`Bf16Dot::pair_row`],
/// [`Bf16Dot::interleave`]), or values that are bf16 already, copied as stored
/// ([`Bf16Dot::pair_bf16_row`], [`Bf16Dot::interleave_bf16`]).
pub(crate) trait Pairable: Sized {
    /// `x` as a row of channel pairs into `dst[.. ⌈x.len() / 2⌉]`.
    fn pair_row(bf: Bf16Dot, x: &[Self], dst: &mut [f32]);
    /// Rows `a` and `b` (zeros if `None`) interleaved channel by channel into `dst`.
    fn interleave(bf: Bf16Dot, a: &[Self], b: Option<&[Self]>, dst: &mut [f32]);
}

impl Pairable for f32 {
    #[inline(always)]
    fn pair_row(bf: Bf16Dot, x: &[f32], dst: &mut [f32]) {
        bf.pair_row(x, dst);
    }
    #[inline(always)]
    fn interleave(bf: Bf16Dot, a: &[f32], b: Option<&[f32]>, dst: &mut [f32]) {
        bf.interleave(a, b, dst);
    }
}

impl Pairable for half::bf16 {
    #[inline(always)]
    fn pair_row(bf: Bf16Dot, x: &[Self], dst: &mut [f32]) {
        bf.pair_bf16_row(x, dst);
    }
    #[inline(always)]
    fn interleave(bf: Bf16Dot, a: &[Self], b: Option<&[Self]>, dst: &mut [f32]) {
        bf.interleave_bf16(a, b, dst);
    }
}

/// Rows per score panel and per output row group: two vectors of 16 lanes, and the tile
/// height (the AVX-512 backend's geometry, which this path runs under).
pub(crate) const PANEL: usize = 32;
/// Keys per score tile and rows per output tile.
pub(crate) const TILE: usize = 12;

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::{KeyRows, PairKeys, PANEL, TILE};
    use crate::simd::{Avx512, Kernel, RowStream, Simd};
    use core::arch::x86_64::*;
    use half::bf16;

    /// Proof that the running CPU has AVX-512F, BW, VL and BF16: the only constructor is
    /// [`Bf16Dot::detect`]. (It holds the AVX-512 lanes' own token, whose lane sums the decode
    /// dot tile uses.)
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Bf16Dot {
        lanes: Avx512,
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
            let lanes = Avx512::detect()?;
            (is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512bf16"))
                .then_some(Self { lanes })
        }

        /// Runs `kernel` on the AVX-512 lanes through an entry point that enables BF16 too,
        /// so that [`Bf16Dot::pair_vectors`] (which [`Simd::pair_bf16`] calls) compiles into
        /// the kernel's loop. (Compiled once per kernel type.)
        pub fn run<K: Kernel>(self, kernel: K) -> K::Output {
            // SAFETY: the token proves the features.
            unsafe { run_with_bf16(self.lanes, kernel) }
        }

        /// [`Bf16Dot::interleave`] of two vectors: `dst[i] = bf16(a[i]) | bf16(b[i]) << 16`
        /// for `i < 16`. Always inlined, for kernels under [`Bf16Dot::run`] (elsewhere the
        /// conversion would be a call).
        #[inline(always)]
        pub fn pair_vectors(self, a: __m512, b: __m512, dst: &mut [f32]) {
            let dst = &mut dst[..16];
            // SAFETY: the token proves the features; `dst` holds 16 f32s (checked above).
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), pair_words(a, b)) }
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

        /// [`Bf16Dot::pair_row`] of values that are bf16 already: `x`'s words copied as they are,
        /// two per 32-bit word, a zero after an odd count, into `dst[.. ⌈x.len() / 2⌉]`. The same
        /// words as `pair_row` of their f32 values but for subnormals and signalling NaNs, which
        /// stay as stored: `vdpbf16ps` reads a subnormal as zero and a NaN as NaN, so every
        /// product is the same.
        pub fn pair_bf16_row(self, x: &[bf16], dst: &mut [f32]) {
            assert!(dst.len() >= x.len().div_ceil(2));
            // SAFETY: the token proves the features; the lengths are checked above; `bf16` is
            // a 16-bit word.
            unsafe { pair_bf16_row(x.as_ptr().cast(), x.len(), dst.as_mut_ptr()) }
        }

        /// [`Bf16Dot::interleave`] of values that are bf16 already, `dst[i] = a[i] | b[i] << 16`
        /// (their words as stored, as in [`Bf16Dot::pair_bf16_row`]).
        pub fn interleave_bf16(self, a: &[bf16], b: Option<&[bf16]>, dst: &mut [f32]) {
            let n = dst.len();
            assert!(n.is_multiple_of(16) && a.len() >= n && b.is_none_or(|b| b.len() >= n));
            // SAFETY: as in `pair_bf16_row`.
            unsafe {
                interleave_bf16(
                    a.as_ptr().cast(),
                    b.map(|b| b.as_ptr().cast()),
                    dst.as_mut_ptr(),
                    n,
                )
            }
        }

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
                            self.lanes, &key, (lo, hi), q.as_ptr(), d, st.as_mut_ptr(), ld_s,
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

    /// See [`Bf16Dot::run`]. Safety: the features.
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn run_with_bf16<K: Kernel>(lanes: Avx512, kernel: K) -> K::Output {
        kernel.run(lanes)
    }

    /// Lane `i`: `bf16(x[i]) | bf16(y[i]) << 16` (the pairs of [`Bf16Dot::interleave`] and
    /// [`Bf16Dot::pair_vectors`]). Safety: the features (AVX-512BW and BF16).
    #[inline(always)]
    unsafe fn pair_words(x: __m512, y: __m512) -> __m512i {
        // SAFETY: the caller's features; `INTERLEAVE` is 64 bytes.
        unsafe {
            let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            // x's 16 values in the low 16 words, y's in the high; then word i of each half
            // side by side.
            let words = bits(_mm512_cvtne2ps_pbh(y, x));
            _mm512_permutexvar_epi16(idx, words)
        }
    }

    /// See [`Bf16Dot::interleave`]. Safety: the features; `a`, `b` (if any) and `dst` valid for
    /// `n` f32s, `n` a multiple of 16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn interleave(a: *const f32, b: Option<*const f32>, dst: *mut f32, n: usize) {
        // SAFETY (whole body): the caller's contract.
        unsafe {
            for i in (0..n).step_by(16) {
                let x = _mm512_loadu_ps(a.add(i));
                let y = match b {
                    Some(b) => _mm512_loadu_ps(b.add(i)),
                    None => _mm512_setzero_ps(),
                };
                _mm512_storeu_si512(dst.add(i).cast(), pair_words(x, y));
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

    /// See [`Bf16Dot::pair_bf16_row`]. Safety: the features; `x` valid for `n` words, `dst`
    /// for `⌈n / 2⌉` f32s.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn pair_bf16_row(x: *const u16, n: usize, dst: *mut f32) {
        // SAFETY (whole body): the caller's contract; masked-off lanes are neither read nor
        // written (AVX-512 masked loads and stores suppress faults).
        unsafe {
            for i in (0..n).step_by(32) {
                let live = (n - i).min(32);
                let words =
                    _mm512_maskz_loadu_epi16(((1u64 << live) - 1) as __mmask32, x.add(i).cast());
                let keep = ((1u32 << live.div_ceil(2)) - 1) as __mmask16;
                _mm512_mask_storeu_epi32(dst.add(i / 2).cast(), keep, words);
            }
        }
    }

    /// See [`Bf16Dot::interleave_bf16`]. Safety: the features; `a`, `b` (if any) valid for `n`
    /// words, `dst` for `n` f32s, `n` a multiple of 16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn interleave_bf16(a: *const u16, b: Option<*const u16>, dst: *mut f32, n: usize) {
        // SAFETY (whole body): the caller's contract; `INTERLEAVE` is 64 bytes.
        unsafe {
            let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            for i in (0..n).step_by(16) {
                let x = _mm256_loadu_si256(a.add(i).cast());
                let y = match b {
                    Some(b) => _mm256_loadu_si256(b.add(i).cast()),
                    None => _mm256_setzero_si256(),
                };
                // a's 16 words low, b's high, as `interleave` has them after rounding.
                let words = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), y);
                _mm512_storeu_si512(dst.add(i).cast(), _mm512_permutexvar_epi16(idx, words));
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
}

/// No AVX512_BF16 off x86-64: the token cannot exist.
#[cfg(not(target_arch = "x86_64"))]
mod stub {
    use super::KeyRows;
    use crate::simd::{Kernel, RowStream};

    /// Uninhabited: [`Bf16Dot::detect`] always answers `None`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Bf16Dot {}

    #[allow(clippy::too_many_arguments, clippy::unused_self)]
    impl Bf16Dot {
        pub fn detect() -> Option<Self> {
            None
        }
        pub fn run<K: Kernel>(self, _: K) -> K::Output {
            match self {}
        }
        pub fn interleave(self, _: &[f32], _: Option<&[f32]>, _: &mut [f32]) {
            match self {}
        }
        pub fn pair_row(self, _: &[f32], _: &mut [f32]) {
            match self {}
        }
        pub fn pair_bf16_row(self, _: &[half::bf16], _: &mut [f32]) {
            match self {}
        }
        pub fn interleave_bf16(self, _: &[half::bf16], _: Option<&[half::bf16]>, _: &mut [f32]) {
            match self {}
        }
        pub fn scores_panel(
            self,
            _: super::PairKeys<'_>,
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
        pub fn dots(
            self,
            _: impl KeyRows,
            _: (usize, usize),
            _: &[f32],
            _: (usize, usize, usize),
            _: &mut [f32],
            _: usize,
            _: Option<RowStream>,
        ) -> u64 {
            match self {}
        }
        pub fn output_in_place(
            self,
            _: &[f32],
            _: usize,
            _: (usize, usize),
            _: impl KeyRows,
            _: (usize, usize),
            _: &[f32],
            _: &mut [f32],
            _: usize,
            _: Option<RowStream>,
        ) {
            match self {}
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
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
                            let terms = (0..d).map(|c| {
                                f64::from(k[j * d + c].to_f32()) * f64::from(q[r * d + c])
                            });
                            let (sum, mag) =
                                terms.fold((0.0, 0.0), |(s, m), x| (s + x, m + x.abs()));
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
                            let what = format!(
                                "{rows} rows, {vecs} vecs, keys {lo}..{hi}, row {r}, ch {c}"
                            );
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
                                let x = f64::from(p[j * ld_p + r])
                                    * f64::from(v[j * ld_v + c].to_f32());
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
}
