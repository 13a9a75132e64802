//! Validation of one attention call: the shapes of Q, K, V, O (and LSE) against each other and
//! the options, reduced to a [`Problem`] that both the fused kernel and the reference read.

use crate::error::{Dim, Error, Operand};
use crate::options::{Alignment, Options};
use crate::tensor::{offset, Tensor};

/// A bias or mask view with broadcast dims (size 1) turned into stride 0, indexed
/// `[b, i, h, j]` for any index inside the problem's `[batch, n_q, heads, n_kv]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Broadcast<'a, T> {
    pub data: &'a [T],
    pub strides: [usize; 4],
}

impl<T: Copy> Broadcast<'_, T> {
    /// The value for `[b, i, h, j]` (in range by construction, see [`Problem::new`]).
    #[inline]
    pub fn at(&self, index: [usize; 4]) -> T {
        self.data[offset(index, self.strides)]
    }
}

/// Checks that `t` broadcasts to `want` and returns it with broadcast strides.
fn broadcast<'a, T>(
    t: &Tensor<'a, T>,
    want: [usize; 4],
    operand: Operand,
) -> Result<Broadcast<'a, T>, Error> {
    let mut strides = t.strides();
    for (k, dim) in Dim::ALL.into_iter().enumerate() {
        let got = t.dims()[k];
        if got == 1 {
            strides[k] = 0;
        } else if got != want[k] {
            return Err(Error::NotBroadcastable {
                operand,
                dim,
                expected: want[k],
                got,
            });
        }
    }
    Ok(Broadcast {
        data: t.data(),
        strides,
    })
}

/// Checks that a per-head or per-batch slice has `len` entries.
fn check_len<T>(s: &[T], len: usize, operand: Operand) -> Result<(), Error> {
    if s.len() == len {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            operand,
            expected: len,
            got: s.len(),
        })
    }
}

/// The validated sizes and semantics of one call. Everything the kernels need to know about
/// *what* to compute, nothing about *how*.
#[derive(Debug, Clone)]
pub(crate) struct Problem<'a> {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub scale: f32,
    /// The alignment of the diagonal of causal, window and ALiBi (`None`: no diagonal).
    pub alignment: Option<Alignment>,
    /// Keys visible after the diagonal: row `i` sees `j ≤ i + off + right`. `None`: unbounded.
    pub right: Option<usize>,
    /// Keys visible before the diagonal: row `i` sees `j ≥ i + off − left`. `None`: unbounded.
    pub left: Option<usize>,
    /// Per-batch key lengths (all `≤ n_kv`).
    pub kv_lens: Option<&'a [usize]>,
    pub bias: Option<Broadcast<'a, f32>>,
    pub mask: Option<Broadcast<'a, bool>>,
    /// ALiBi slope per query head.
    pub alibi: Option<&'a [f32]>,
    pub softcap: Option<f32>,
    /// Sink logit per query head.
    pub sinks: Option<&'a [f32]>,
}

impl<'a> Problem<'a> {
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }

    /// The key index aligned with query row 0 of batch `b` (`off_b`): 0 top-left, and
    /// bottom-right the sequence's own key length minus `n_q` (`kv_lens[b] − n_q`, or
    /// `n_kv − n_q` without key lengths), so a preallocated cache `[B, max_len, …]` with
    /// per-sequence lengths puts each sequence's new tokens at its own end, as
    /// FlashAttention-2's `cache_seqlens` does.
    pub fn diag_offset(&self, b: usize) -> i128 {
        match self.alignment {
            Some(Alignment::BottomRight) => self.kv_len(b) as i128 - self.n_q as i128,
            _ => 0,
        }
    }

    /// The number of keys of batch `b` (its key length, or `n_kv`).
    pub fn kv_len(&self, b: usize) -> usize {
        self.kv_lens.map_or(self.n_kv, |l| l[b])
    }

    /// Whether key `j` passes the causal, window and key-length masks for row `i` of batch `b`
    /// (the literal definition; the reference uses it element by element). The boolean mask
    /// and `−∞` biases are applied separately, per head.
    pub fn is_visible(&self, b: usize, i: usize, j: usize) -> bool {
        let center = i as i128 + self.diag_offset(b);
        let j = j as i128;
        let before_right_edge = self
            .right
            .is_none_or(|r| j <= center.saturating_add(r as i128));
        let after_left_edge = self
            .left
            .is_none_or(|l| j >= center.saturating_sub(l as i128));
        before_right_edge && after_left_edge && j < self.kv_len(b) as i128
    }

    /// The half-open range `[lo, hi)` of keys that pass the causal, window and key-length masks
    /// for row `i` of batch `b`. Empty when `lo ≥ hi`. The fused kernel skips key blocks
    /// outside it.
    pub fn visible_keys(&self, b: usize, i: usize) -> (usize, usize) {
        let n_kv = self.kv_len(b) as i128;
        let center = i as i128 + self.diag_offset(b);
        let hi = match self.right {
            Some(r) => center.saturating_add(r as i128).saturating_add(1).min(n_kv),
            None => n_kv,
        };
        let lo = match self.left {
            Some(l) => center.saturating_sub(l as i128).max(0),
            None => 0,
        };
        let hi = hi.max(0) as usize;
        let lo = lo.min(n_kv) as usize;
        (lo, hi.max(lo))
    }

    /// Validates the operands of a call (`out_dims`: the output's logical dims) and the options.
    pub fn new<Q, KV>(
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out_dims: [usize; 4],
        lse: Option<&[f32]>,
        opts: &Options<'a>,
    ) -> Result<Self, Error> {
        let [batch, n_q, heads, d_k] = q.dims();
        let [_, n_kv, kv_heads, _] = k.dims();
        let d_v = v.dims()[3];
        let expect = |operand: Operand, got: [usize; 4], want: [usize; 4]| {
            for ((&g, &w), dim) in got.iter().zip(&want).zip(Dim::ALL) {
                if g != w {
                    return Err(Error::ShapeMismatch {
                        operand,
                        dim,
                        expected: w,
                        got: g,
                    });
                }
            }
            Ok(())
        };
        expect(Operand::Key, k.dims(), [batch, n_kv, kv_heads, d_k])?;
        expect(Operand::Value, v.dims(), [batch, n_kv, kv_heads, d_v])?;
        expect(Operand::Output, out_dims, [batch, n_q, heads, d_v])?;
        if kv_heads == 0 || heads == 0 || heads % kv_heads != 0 {
            return Err(Error::HeadsNotDivisible { heads, kv_heads });
        }
        if d_k == 0 {
            return Err(Error::ZeroHeadDim);
        }
        if let Some(lse) = lse {
            // The output view holds batch·n_q·heads·d_v elements, but with d_v = 0 the product
            // below can still overflow; a slice that long cannot exist, so report usize::MAX.
            let expected = batch
                .checked_mul(heads)
                .and_then(|x| x.checked_mul(n_q))
                .unwrap_or(usize::MAX);
            check_len(lse, expected, Operand::Lse)?;
        }
        let scale = opts.scale.unwrap_or(1.0 / (d_k as f32).sqrt());
        if !scale.is_finite() {
            return Err(Error::InvalidScale(scale));
        }

        // One diagonal for causal, window and ALiBi.
        let alignments = [
            opts.causal,
            opts.window.map(|w| w.alignment),
            opts.alibi.map(|a| a.1),
        ];
        let mut alignment: Option<Alignment> = None;
        for a in alignments.into_iter().flatten() {
            if alignment.is_some_and(|b| b != a) {
                return Err(Error::ConflictingAlignment);
            }
            alignment = Some(a);
        }
        // A side wider than any index difference (more than i64::MAX, e.g. usize::MAX or
        // usize::MAX − 1) bounds nothing.
        let bounded = |x: usize| i64::try_from(x).is_ok().then_some(x);
        let window_right = opts.window.and_then(|w| bounded(w.right));
        let right = match (opts.causal, window_right) {
            (Some(_), _) => Some(0),
            (None, r) => r,
        };
        let left = opts.window.and_then(|w| bounded(w.left));

        if let Some(lens) = opts.kv_lens {
            check_len(lens, batch, Operand::KvLens)?;
            if let Some(index) = lens.iter().position(|&l| l > n_kv) {
                return Err(Error::InvalidValue {
                    operand: Operand::KvLens,
                    index,
                    reason: "key length exceeds n_kv",
                });
            }
        }
        let want = [batch, n_q, heads, n_kv];
        let bias = opts
            .bias
            .as_ref()
            .map(|t| broadcast(t, want, Operand::Bias))
            .transpose()?;
        let mask = opts
            .mask
            .as_ref()
            .map(|t| broadcast(t, want, Operand::Mask))
            .transpose()?;
        let per_head = |s: &[f32], operand: Operand, reason: &'static str, ok: fn(f32) -> bool| {
            check_len(s, heads, operand)?;
            match s.iter().position(|&x| !ok(x)) {
                Some(index) => Err(Error::InvalidValue {
                    operand,
                    index,
                    reason,
                }),
                None => Ok(()),
            }
        };
        // Values that the kernel turns into log2 units must stay finite there.
        fn fits_log2(x: f32) -> bool {
            (x * std::f32::consts::LOG2_E).is_finite()
        }
        if let Some((slopes, _)) = opts.alibi {
            per_head(
                slopes,
                Operand::AlibiSlopes,
                "slope is not finite, or |slope|·log2(e) overflows f32",
                fits_log2,
            )?;
        }
        if let Some(sinks) = opts.sinks {
            per_head(
                sinks,
                Operand::Sinks,
                "sink logit is NaN or +inf, or finite with |sink|·log2(e) overflowing f32",
                |x| x == f32::NEG_INFINITY || fits_log2(x),
            )?;
        }
        if let Some(cap) = opts.softcap {
            if !(cap >= f32::MIN_POSITIVE && fits_log2(cap)) {
                return Err(Error::InvalidSoftcap(cap));
            }
        }
        Ok(Problem {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k,
            d_v,
            scale,
            alignment,
            right,
            left,
            kv_lens: opts.kv_lens,
            bias,
            mask,
            alibi: opts.alibi.map(|a| a.0),
            softcap: opts.softcap,
            sinks: opts.sinks,
        })
    }
}
