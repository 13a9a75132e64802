//! What to compute besides the plain `softmax(Q·Kᵀ·scale)·V`: a builder whose fields stay
//! private, so new options never break callers.
//!
//! For query row `i` and key `j` of batch `b`, head `h`, the fused kernel and the reference both
//! compute, in this order (the crate docs' "Semantics" and `docs/semantics.md` have the whole
//! contract):
//! 1. `s = scale · q_i·k_j`
//! 2. softcap: `s ← cap · tanh(s / cap)`
//! 3. ALiBi: `s ← s − slope_h · |i + off − j|`, then bias: `s ← s + bias[b, i, h, j]`
//! 4. visibility: `s ← −∞` unless the key passes every mask in use (causal, window, key length,
//!    boolean mask)
//! 5. `p_ij = exp(s_ij − m_i) / (Σ_j exp(s_ij − m_i) + exp(σ_h − m_i))`, the sink term `σ_h` only
//!    with attention sinks
//! 6. `out_i = Σ_j p_ij · v_j`, `lse_i = m_i + ln(Σ_j exp(s_ij − m_i) + exp(σ_h − m_i))`

use crate::error::Error;
use crate::tensor::Tensor;

/// A sliding window: row `i` sees key `j` iff `i + off − left ≤ j ≤ i + off + right`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub left: usize,
    pub right: usize,
    pub alignment: Alignment,
}

/// Where the diagonal of a causal mask, a sliding window or ALiBi sits when `n_q ≠ n_kv`.
///
/// Query row `i` is aligned with key `i + off`:
/// * [`Alignment::TopLeft`]: `off = 0`, PyTorch's `is_causal`. Row 0 sees key 0 only.
/// * [`Alignment::BottomRight`]: `off = n_kv − n_q`, FlashAttention-2's convention and the one a
///   KV-cache decode step needs: the last query row sees every key. With
///   [`Options::kv_lens`] the offset is per sequence, `off_b = kv_lens[b] − n_q`: each
///   sequence's new tokens are the last `n_q` of its own keys, wherever the buffer ends (as
///   FlashAttention-2's `cache_seqlens`, ONNX Runtime's `seqlens_k` and vLLM align them).
///
/// ```text
/// n_q = 2, buffer n_kv = 6, kv_lens = [3, 6]      keys: 0 1 2 3 4 5
/// batch 0 (off = 1)                      row 0:  x x . . . .
///                                        row 1:  x x x . . .
/// batch 1 (off = 4)                      row 0:  x x x x x .
///                                        row 1:  x x x x x x
/// ```
///
/// The two agree when `n_q == n_kv`. There is deliberately no default: top-left causal over a
/// KV cache silently hides the cache from the new tokens (pytorch#108108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Alignment {
    /// Row `i` is aligned with key `i`.
    TopLeft,
    /// Row `i` is aligned with key `i + n_kv − n_q` (`i + kv_lens[b] − n_q` with key lengths).
    BottomRight,
}

impl Alignment {
    /// The key index that query row 0 is aligned with, `off` in the crate's formulas.
    /// (i128: exact for any pair of lengths, which broadcast views can make huge.)
    pub fn offset(self, n_q: usize, n_kv: usize) -> i128 {
        match self {
            Alignment::TopLeft => 0,
            Alignment::BottomRight => n_kv as i128 - n_q as i128,
        }
    }
}

/// Options of an attention call, built with chained methods from [`Options::new`].
///
/// Every combination runs in the fused kernel; none falls back to a slower path. Options that
/// borrow data (key lengths, bias, mask, slopes, sinks) tie the options to that data's
/// lifetime `'a`. Values are checked when the call runs, which returns a typed
/// [`Error`] for anything invalid, before anything is written.
///
/// # Errors
/// Every entry point that takes options ([`attention`](crate::attention),
/// [`attention_lse`](crate::attention_lse), the [`reference`](crate::reference) functions)
/// returns, for invalid options:
/// * [`Error::InvalidScale`]: a NaN or infinite scale;
/// * [`Error::InvalidSoftcap`]: a softcap that is NaN, infinite,
///   not positive, subnormal (below `f32::MIN_POSITIVE`, where `2/cap` overflows) or so large
///   that `cap·log₂e` overflows (above ≈ 2.36e38);
/// * [`Error::LengthMismatch`]: `kv_lens` without one entry per
///   batch, ALiBi slopes or sinks without one entry per query head;
/// * [`Error::InvalidValue`]: `kv_lens[b] > n_kv`; a slope that is
///   not finite or whose `|slope|·log₂e` overflows (above ≈ 2.36e38); a sink that is NaN, `+∞`,
///   or finite with `|σ|·log₂e` overflowing (`σ = −∞` disables the sink and is fine);
/// * [`Error::NotBroadcastable`]: a bias or mask whose dims
///   neither match `[batch, n_q, heads, n_kv]` nor are 1;
/// * [`Error::ConflictingAlignment`]: causal, window and
///   ALiBi given different alignments.
///
/// ```
/// use sdpa::{Alignment, Options};
/// let slopes = sdpa::alibi_slopes(8)?;
/// let opts = Options::new()
///     .scale(0.125)
///     .causal(Alignment::BottomRight)
///     .sliding_window(4096, 0, Alignment::BottomRight)
///     .softcap(50.0)
///     .alibi(&slopes, Alignment::BottomRight);
/// assert_eq!(opts.scale_value(), Some(0.125));
/// # Ok::<(), sdpa::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Options<'a> {
    pub(crate) scale: Option<f32>,
    pub(crate) causal: Option<Alignment>,
    pub(crate) window: Option<Window>,
    pub(crate) kv_lens: Option<&'a [usize]>,
    /// `kv_lens` counts the keys before this call's query rows ([`Options::cache_seqlens`]).
    pub(crate) lens_before: bool,
    pub(crate) bias: Option<Tensor<'a, f32>>,
    pub(crate) mask: Option<Tensor<'a, bool>>,
    pub(crate) alibi: Option<(&'a [f32], Alignment)>,
    pub(crate) softcap: Option<f32>,
    pub(crate) sinks: Option<&'a [f32]>,
    pub(crate) kv_scales: Option<(Tensor<'a, f32>, Tensor<'a, f32>)>,
    pub(crate) bf16_products: bool,
    pub(crate) tile_counter: Option<&'a std::sync::atomic::AtomicU64>,
}

impl<'a> Options<'a> {
    /// Plain, unmasked attention with the default scale `1/√d_k`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Multiply `Q·Kᵀ` by `scale` instead of `1/√d_k`. Must be finite
    /// ([`Error::InvalidScale`] otherwise).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Causal mask: query row `i` sees key `j` only if `j ≤ i + off`, with `off` given by the
    /// [`Alignment`]. Key blocks entirely above the diagonal are skipped, not computed.
    pub fn causal(mut self, alignment: Alignment) -> Self {
        self.causal = Some(alignment);
        self
    }

    /// Sliding-window (local) attention, Mistral style: row `i` sees key `j` only if
    /// `i + off − left ≤ j ≤ i + off + right`. With [`Options::causal`] the effective right
    /// bound is 0 (pass `right = 0`). A side of `usize::MAX` or `usize::MAX − 1` (any side above `i64::MAX`) leaves that
    /// side unbounded. Key blocks
    /// entirely outside the window are skipped, so the cost grows as `n_q · (left + right)`,
    /// not `n_q · n_kv`. Using a different alignment here than for `causal` or `alibi` is an
    /// [`Error::ConflictingAlignment`].
    ///
    /// A model config's `sliding_window = W` (Mistral, Gemma 2, Qwen 2 in Hugging Face: a token
    /// sees itself and the `W − 1` tokens before it) is `sliding_window(W − 1, 0,
    /// Alignment::BottomRight)` with `causal(Alignment::BottomRight)`; FlashAttention-2's
    /// `window_size = (left, right)` is `(left, right)` here, bottom-right.
    pub fn sliding_window(mut self, left: usize, right: usize, alignment: Alignment) -> Self {
        self.window = Some(Window {
            left,
            right,
            alignment,
        });
        self
    }

    /// Per-sequence key lengths (padding, a partially filled KV cache): in batch `b`, keys
    /// `j ≥ kv_lens[b]` are invisible. Needs one entry per batch and `kv_lens[b] ≤ n_kv`.
    /// Key blocks past the length are skipped. Bottom-right alignment then uses each
    /// sequence's own length: `off_b = kv_lens[b] − n_q` (see [`Alignment`]).
    ///
    /// A length counts every key the call reads, this call's new rows included (write them
    /// into the cache first, e.g. with [`append`](crate::append)). FlashAttention-2's
    /// `cache_seqlens` counts the keys *before* the `k` it appends: pass it to
    /// [`Options::cache_seqlens`] instead (or `cache_seqlens[b] + n_new` here).
    pub fn kv_lens(mut self, kv_lens: &'a [usize]) -> Self {
        self.kv_lens = Some(kv_lens);
        self.lens_before = false;
        self
    }

    /// Per-sequence key lengths in FlashAttention-2's `cache_seqlens` convention: the keys in
    /// the cache *before* this call's new rows, which the caller has appended right after them
    /// (e.g. with [`append`](crate::append)). Sequence `b` then has `cache_seqlens[b] + n_q(b)`
    /// keys (`n_q(b)`: its query rows, the call's `n_q` in a dense call), and everything said
    /// of [`Options::kv_lens`] holds for those sums, which must not exceed the sequence's keys.
    /// Replaces any lengths set before, as `kv_lens` replaces these.
    ///
    /// ```
    /// use sdpa::{Alignment, Options};
    /// // Two sequences with 10 and 3 cached keys, each appending this call's query rows:
    /// let before = [10usize, 3];
    /// let opts = Options::new()
    ///     .causal(Alignment::BottomRight)
    ///     .cache_seqlens(&before);
    /// # let _ = opts;
    /// ```
    pub fn cache_seqlens(mut self, cache_seqlens: &'a [usize]) -> Self {
        self.kv_lens = Some(cache_seqlens);
        self.lens_before = true;
        self
    }

    /// An additive bias on the scores, read as `bias[b, i, h, j]` through a view with logical
    /// dims `[batch, n_q, heads, n_kv]`. Each dim must match or be 1; a dim of size 1 (or any
    /// stride 0) broadcasts, so one mask for all heads or one per batch needs no copy. Added
    /// after the softcap, before masking; `−∞` entries hide keys.
    pub fn bias(mut self, bias: Tensor<'a, f32>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// A boolean mask, `true` = visible, read as `mask[b, i, h, j]` with the same broadcasting
    /// as [`Options::bias`]. Equivalent to a bias of 0 / `−∞`. (The C ABI's byte mask has the
    /// same polarity, nonzero = visible; `sdpa-candle`'s `u8` mask follows candle-transformers,
    /// nonzero = *hidden*. PyTorch's boolean `attn_mask` is `true` = visible too.) A bias or
    /// mask buffer in PyTorch's `[B, H, L, S]` order goes in as `Tensor::bhsd(&buf, [B, H, L,
    /// S])`, the view `[b, i, h, j]` over it; `Tensor::bshd(&buf, [B, L, H, S])` would read it
    /// in the wrong order, silently whenever `H = L`.
    pub fn mask(mut self, mask: Tensor<'a, bool>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// ALiBi (Press et al., 2022): subtract `slope_h · |i + off − j|` from the scores of head
    /// `h`, with `off` given by the [`Alignment`]. `slopes` has one finite entry per query head
    /// (with `|slope|·log₂e` finite); [`alibi_slopes`] computes the standard ones. The
    /// distance is taken in integers, exact for any position.
    pub fn alibi(mut self, slopes: &'a [f32], alignment: Alignment) -> Self {
        self.alibi = Some((slopes, alignment));
        self
    }

    /// Logit soft-capping (Gemma 2): `s ← cap · tanh(s / cap)` on the scaled score, before bias
    /// and masking. `cap` must be a positive normal f32 with finite `cap·log₂e` (see the
    /// errors on [`Options`]).
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Attention sinks (gpt-oss): one logit `σ_h` per query head that joins the softmax
    /// denominator only, `+ exp(σ_h − m_i)`, as if a key with score `σ_h` and value 0 were
    /// always visible. The LSE output includes it; a row with no visible key then has output 0
    /// and `lse = σ_h`. `σ_h = −∞` disables the sink of head `h`; NaN, `+∞` and finite values
    /// beyond ±2.36e38 (where `σ·log₂e` overflows) are errors.
    pub fn sinks(mut self, sinks: &'a [f32]) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// The scales of 8-bit (`i8`) keys and values, which the kernel dequantizes as
    /// `k = k_i8 · k_scales[…]`, `v = v_i8 · v_scales[…]` (required with `i8` K/V, an
    /// [`Error::KvScales`] with other types). Each is a view
    /// that broadcasts against its tensor's dims — K's `[dim 0, dim 1, H_kv, d_k]` (for a
    /// dense cache `[B, n_kv, …]`, packed `[1, total_kv, …]`, paged
    /// `[num_pages, page_size, …]`), V's alike with `d_v`: a dim of size 1 (or stride 0)
    /// repeats, so the usual granularities need no copy:
    ///
    /// | granularity | scale dims |
    /// |---|---|
    /// | per tensor | `[1, 1, 1, 1]` |
    /// | per (token, kv head) | `[B, n_kv, H_kv, 1]` |
    /// | per (kv head, channel) | `[1, 1, H_kv, d]` |
    ///
    /// and any other broadcast of the four dims. Every scale the call reads must be finite
    /// with `|scale| ≤ f32::MAX / 128` (so no dequantized value overflows); 0 and negative
    /// scales are fine. [`Operand::KeyScales`](crate::Operand::KeyScales) /
    /// [`Operand::ValueScales`](crate::Operand::ValueScales) name the failing one.
    ///
    /// The dequantized values then obey the limit f32 values do: the output accumulates up to
    /// `n` weighted values (`n` visible keys, weights ≤ 1) before it is normalized, so a
    /// finite result needs `n · max|v| < f32::MAX` (`max|v| ≤ 127 · |v scale|`), and scores
    /// need `|scale · q·k|` finite. A V scale near the accepted maximum overflows with two
    /// keys; scales from [`append`](crate::append) (`max|x| / 127` of f32 rows) are far
    /// inside both. On a paged cache, only the pages the key lengths reach are checked.
    pub fn kv_scales(mut self, k_scales: Tensor<'a, f32>, v_scales: Tensor<'a, f32>) -> Self {
        self.kv_scales = Some((k_scales, v_scales));
        self
    }

    /// Allow the two products (`Q·Kᵀ` and `P·V`) to run as bf16 dot products with f32
    /// accumulation when Q and K/V are bf16 and the CPU has them (AVX512_BF16 on the AVX-512
    /// backend; see [`bf16_products_available`](crate::bf16_products_available)), at about
    /// twice the f32 multiply-add rate — as FlashAttention does on GPUs. The softmax weights
    /// `P` are rounded to bf16 before the second product; scores, softmax, row sums and the
    /// output accumulator stay f32, and bf16 subnormals (below 2⁻¹²⁶) count as zero. The error
    /// bound ([`reference::error_bounds`](crate::reference::error_bounds) with the same
    /// options) grows by about 2⁻⁸ of the largest value. Results stay identical for any thread
    /// count on one machine, but differ between CPUs with and without the instruction. On CPUs
    /// with AMX (AMX-BF16, and Linux granting the tile state) prefill's products run on the
    /// tiles, `tdpbf16ps`, with the same operands and bound
    /// ([`amx_available`](crate::amx_available); `SDPA_AMX=off` turns them off). Decode
    /// (few query rows per kv head) takes the bf16 dot products, reading the cache's bf16 rows as stored,
    /// dense or paged (keys whose channels are not adjacent are converted and take f32
    /// products; the bound covers both). The option changes nothing for other element types
    /// (an f32 value beyond bf16's range would round to ±∞) and on CPUs or backends without the
    /// instruction.
    pub fn bf16_products(mut self) -> Self {
        self.bf16_products = true;
        self
    }

    /// Test hook: the fused kernel adds the number of score tiles it computes (one tile: the
    /// backend's tile height of keys × one panel of up to two vectors of stacked query rows;
    /// 6 × 16 on AVX2, 12 × 32 on AVX-512) to `counter`, so tests can check that masked blocks
    /// are skipped.
    #[doc(hidden)]
    pub fn count_score_tiles(mut self, counter: &'a std::sync::atomic::AtomicU64) -> Self {
        self.tile_counter = Some(counter);
        self
    }

    /// The scale set with [`Options::scale`], if any.
    pub fn scale_value(&self) -> Option<f32> {
        self.scale
    }

    /// The causal alignment set with [`Options::causal`], if any.
    pub fn causal_alignment(&self) -> Option<Alignment> {
        self.causal
    }
}

/// The standard ALiBi slopes for `heads` heads, as in the original paper (Press et al., 2022,
/// "Train Short, Test Long") and its reference code: for a power of two `n`, head `h` (from 0)
/// gets `2^(−8(h+1)/n)`. For other head counts, take the slopes of the largest power of two
/// `n ≤ heads`, then append the even-indexed (0, 2, 4, …) slopes of `2n` until there are `heads`
/// of them.
///
/// # Errors
/// [`Error::OutOfMemory`] when `heads` slopes cannot be allocated, and for more than 2²⁴ heads
/// (64 MiB of slopes; no model has that many, and a larger request can succeed through memory
/// overcommit only to exhaust memory while the slopes are written).
pub fn alibi_slopes(heads: usize) -> Result<Vec<f32>, Error> {
    let out_of_memory = Error::OutOfMemory {
        bytes: heads.saturating_mul(4),
    };
    if heads > MAX_ALIBI_HEADS {
        return Err(out_of_memory);
    }
    let mut slopes = Vec::new();
    slopes.try_reserve_exact(heads).map_err(|_| out_of_memory)?;
    if heads == 0 {
        return Ok(slopes);
    }
    let slope = |h: usize, n: usize| (-8.0 * h as f64 / n as f64).exp2() as f32;
    let n = 1usize << heads.ilog2();
    slopes.extend((1..=n).map(|h| slope(h, n)));
    // 2n may overflow usize for the largest head counts; the slopes of 2n at odd h are those
    // of n at h − ½, i.e. 2^(−8(2h−1)/(2n)).
    slopes.extend((1..=heads - n).map(|h| (-4.0 * (2 * h - 1) as f64 / n as f64).exp2() as f32));
    Ok(slopes)
}

/// The most heads [`alibi_slopes`] computes slopes for.
const MAX_ALIBI_HEADS: usize = 1 << 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_slopes_match_the_paper() {
        // n = 8: 1/2, 1/4, …, 1/256.
        let s8 = alibi_slopes(8).unwrap();
        let want: Vec<f32> = (1..=8).map(|h| 0.5f32.powi(h)).collect();
        assert_eq!(s8, want);
        // n = 12: the 8 above, then slopes 0, 2, 4, 6 of n = 16 (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
        let s12 = alibi_slopes(12).unwrap();
        assert_eq!(&s12[..8], &want[..]);
        for (k, &s) in s12[8..].iter().enumerate() {
            let e = -0.5 - k as f64;
            assert!((f64::from(s) - e.exp2()).abs() < 1e-7, "{k}: {s}");
        }
        assert_eq!(alibi_slopes(1).unwrap(), vec![2f32.powi(-8)]);
        assert!(alibi_slopes(0).unwrap().is_empty());
        // Head counts no memory can hold are an error, not an abort.
        for n in [usize::MAX, (1 << 24) + 1, 1 << 40] {
            assert!(matches!(alibi_slopes(n), Err(Error::OutOfMemory { .. })));
        }
        assert_eq!(alibi_slopes(1 << 20).unwrap().len(), 1 << 20);
    }
}
