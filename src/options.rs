//! What to compute besides the plain `softmax(Q·Kᵀ·scale)·V`: a builder whose fields stay
//! private, so new options never break callers.

/// Where the diagonal of a causal mask or a sliding window sits when `n_q ≠ n_kv`.
///
/// Query row `i` is aligned with key `i + off`:
/// * [`Alignment::TopLeft`]: `off = 0`, PyTorch's `is_causal`. Row 0 sees key 0 only.
/// * [`Alignment::BottomRight`]: `off = n_kv − n_q`, FlashAttention-2's convention and the one a
///   KV-cache decode step needs: the last query row sees every key.
///
/// The two agree when `n_q == n_kv`. There is deliberately no default: top-left causal over a
/// KV cache silently hides the cache from the new tokens (pytorch#108108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alignment {
    /// Row `i` is aligned with key `i`.
    TopLeft,
    /// Row `i` is aligned with key `i + n_kv − n_q`.
    BottomRight,
}

impl Alignment {
    /// The key index that query row 0 is aligned with, `off` in the crate's formulas.
    pub fn offset(self, n_q: usize, n_kv: usize) -> i64 {
        match self {
            Alignment::TopLeft => 0,
            Alignment::BottomRight => n_kv as i64 - n_q as i64,
        }
    }
}

/// Options of an attention call, built with chained methods from [`Options::new`].
///
/// ```
/// use sdpa::{Alignment, Options};
/// let opts = Options::new().scale(0.125).causal(Alignment::BottomRight);
/// assert_eq!(opts.scale_value(), Some(0.125));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub(crate) scale: Option<f32>,
    pub(crate) causal: Option<Alignment>,
}

impl Options {
    /// Plain, unmasked attention with the default scale `1/√d_k`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Multiply `Q·Kᵀ` by `scale` instead of `1/√d_k`. Must be finite (checked by the call).
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

    /// The scale set with [`Options::scale`], if any.
    pub fn scale_value(&self) -> Option<f32> {
        self.scale
    }

    /// The causal alignment set with [`Options::causal`], if any.
    pub fn causal_alignment(&self) -> Option<Alignment> {
        self.causal
    }
}
