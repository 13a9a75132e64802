//! Validation of one attention call: the shapes of Q, K, V, O (and LSE) against each other and
//! the options, reduced to a [`Problem`] that both the fused kernel and the reference read.

use crate::error::{Dim, Error, Operand};
use crate::options::Options;
use crate::tensor::Tensor;

/// The validated sizes and semantics of one call. Everything the kernels need to know about
/// *what* to compute, nothing about *how*.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub scale: f32,
    /// Key index aligned with query row 0 (`off`), when a diagonal (causal) applies.
    pub diag_offset: i64,
    /// Keys visible after the diagonal: row `i` sees `j ≤ i + off + right`. `None`: unbounded.
    pub right: Option<usize>,
    /// Keys visible before the diagonal: row `i` sees `j ≥ i + off − left`. `None`: unbounded.
    pub left: Option<usize>,
}

impl Problem {
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }

    /// Whether key `j` is visible from query row `i` of batch `b` (the literal definition; the
    /// reference uses it element by element).
    pub fn is_visible(&self, _b: usize, i: usize, j: usize) -> bool {
        let center = i as i64 + self.diag_offset;
        let j = j as i64;
        let before_right_edge = self.right.is_none_or(|r| j <= center + r as i64);
        let after_left_edge = self.left.is_none_or(|l| j >= center - l as i64);
        before_right_edge && after_left_edge
    }

    /// The half-open range `[lo, hi)` of keys visible from row `i` of batch `b`: causal and
    /// window bounds around the diagonal, clamped to `[0, n_kv)`. Empty when `lo ≥ hi`.
    pub fn visible_keys(&self, _b: usize, i: usize) -> (usize, usize) {
        let n_kv = self.n_kv as i64;
        let center = i as i64 + self.diag_offset;
        let hi = match self.right {
            Some(r) => center.saturating_add(r as i64).saturating_add(1).min(n_kv),
            None => n_kv,
        };
        let lo = match self.left {
            Some(l) => center.saturating_sub(l as i64).max(0),
            None => 0,
        };
        let hi = hi.max(0) as usize;
        let lo = (lo.min(n_kv)) as usize;
        (lo, hi.max(lo))
    }

    /// Validates the operands of a call and the options.
    pub fn new(
        q: &Tensor<'_, f32>,
        k: &Tensor<'_, f32>,
        v: &Tensor<'_, f32>,
        out_dims: [usize; 4],
        lse: Option<&[f32]>,
        opts: &Options,
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
            let expected = batch
                .checked_mul(heads)
                .and_then(|x| x.checked_mul(n_q))
                .ok_or(Error::LengthMismatch {
                    operand: Operand::Lse,
                    expected: usize::MAX,
                    got: lse.len(),
                })?;
            if lse.len() != expected {
                return Err(Error::LengthMismatch {
                    operand: Operand::Lse,
                    expected,
                    got: lse.len(),
                });
            }
        }
        let scale = opts.scale.unwrap_or(1.0 / (d_k as f32).sqrt());
        if !scale.is_finite() {
            return Err(Error::InvalidScale(scale));
        }
        let (diag_offset, right) = match opts.causal {
            Some(a) => (a.offset(n_q, n_kv), Some(0)),
            None => (0, None),
        };
        Ok(Problem {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k,
            d_v,
            scale,
            diag_offset,
            right,
            left: None,
        })
    }
}
