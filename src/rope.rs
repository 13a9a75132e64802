//! Rotary position embeddings (RoPE): [`Rope::apply`] rotates the channel pairs of Q or K rows
//! in place by angles that grow with each token's position, before the rows go into an
//! attention call or a cache.
//!
//! For a rotary dimension `r` (even, at most the head size; channels from `r` on are left as
//! they are) and pair `i < r/2` of a token at position `p`:
//!
//! ```text
//! (a, b) ← (a·cos φ − b·sin φ,  a·sin φ + b·cos φ),   φ = p · θ^(−2i/r)
//! ```
//!
//! with the pair `(x[i], x[i + r/2])` in the GPT-NeoX style ([`RopeStyle::Halves`]: Hugging
//! Face's `rotate_half`, Llama and most models there) or `(x[2i], x[2i + 1])` in the GPT-J style
//! ([`RopeStyle::Interleaved`]: Meta's original Llama code, FlashAttention-2's
//! `rotary_interleaved`). The angles come from a base `θ` ([`Rope::new`]) or from the caller's
//! `cos`/`sin` tables ([`Rope::with_tables`]), for scaled variants (YaRN, Llama 3's, NTK): row
//! `p` of each table holds `cos φ`, `sin φ` of pairs `0 .. r/2` at position `p`.
//!
//! Numerics: with a base, `φ`, `cos φ` and `sin φ` are computed in f64 (accurate at any
//! position, where f32 angles would lose `p · 2⁻²⁴` radians); each rotated value is formed in
//! f64 from the f32 inputs, rounded to f32 and then once to the element type. So each output
//! is within `(u_f32 + u_T + u_f32·u_T) · |exact| + 2⁻⁴⁰ · (|a| + |b|)` of the f64 rotation
//! ([`crate::reference::rope`]) for bases (with tables, the tables' values are taken as exact).
//! Hugging Face computes `φ` in f32; at position 10⁵ its angles differ from these by up to
//! ~10⁻³ radians: pass its tables to reproduce it bit for bit.

use crate::element::Element;
use crate::error::{Error, Operand};
use crate::tensor::{offset, TensorMut};

/// Which channels rotate together (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// GPT-NeoX: channel `i` with channel `i + r/2` (Hugging Face's `rotate_half`).
    Halves,
    /// GPT-J: channels `2i` and `2i + 1`.
    Interleaved,
}

/// Where the angles come from.
#[derive(Debug, Clone, Copy)]
enum Angles<'a> {
    /// `φ = p · θ^(−2i/r)`.
    Base(f32),
    /// `cos φ`, `sin φ` at `[p · r/2 + i]`.
    Tables { cos: &'a [f32], sin: &'a [f32] },
}

/// A rotary embedding: style, rotary dimension and angles (module docs).
#[derive(Debug, Clone, Copy)]
pub struct Rope<'a> {
    style: RopeStyle,
    rotary_dim: usize,
    angles: Angles<'a>,
}

/// One token's rotation: `cos φ_i`, `sin φ_i` for each pair.
pub(crate) struct Rotation {
    cos: Vec<f64>,
    sin: Vec<f64>,
}

impl Rotation {
    /// Room for the pairs of a rotary dimension `r`.
    pub(crate) fn new(r: usize) -> Self {
        Rotation {
            cos: vec![0.0; r / 2],
            sin: vec![0.0; r / 2],
        }
    }
}

impl<'a> Rope<'a> {
    /// Angles `p · θ^(−2i/r)` from the base `theta` (10,000 in most models; 500,000 in Llama 3)
    /// over the first `rotary_dim` channels. Checked when applied: `rotary_dim` even, nonzero
    /// and at most the head size, `theta` finite and positive.
    pub fn new(style: RopeStyle, rotary_dim: usize, theta: f32) -> Self {
        Rope {
            style,
            rotary_dim,
            angles: Angles::Base(theta),
        }
    }

    /// Angles from tables: row `p` of `cos` and `sin` (`rotary_dim / 2` values each) holds the
    /// cosines and sines of position `p`, for positions `0 .. cos.len() / (rotary_dim / 2)`.
    pub fn with_tables(
        style: RopeStyle,
        rotary_dim: usize,
        cos: &'a [f32],
        sin: &'a [f32],
    ) -> Self {
        Rope {
            style,
            rotary_dim,
            angles: Angles::Tables { cos, sin },
        }
    }

    /// The style.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// The rotary dimension.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// Rotates `x` (`[batch, seq, heads, head_dim]`, any strides) in place: token `(b, s)` by
    /// its position `positions[b · seq + s]`, every head alike. Validated first: nothing is
    /// written on error.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for a rotary dimension that is odd, zero or above the head size
    /// or a base that is not finite and positive ([`Operand::Rope`]), or a position past the
    /// tables ([`Operand::Positions`]); [`Error::LengthMismatch`] for `positions` of another
    /// length than `batch · seq`, or tables of unequal lengths or not whole rows
    /// ([`Operand::RopeTables`]).
    pub fn apply<T: Element>(
        &self,
        x: &mut TensorMut<'_, T>,
        positions: &[u32],
    ) -> Result<(), Error> {
        let [batch, seq, heads, d] = x.dims();
        self.check(d, batch * seq, positions)?;
        let (data, _, strides) = x.raw_parts();
        let mut rotation = Rotation::new(self.rotary_dim);
        let mut row = vec![0.0f32; d];
        for b in 0..batch {
            for s in 0..seq {
                self.rotation(positions[b * seq + s], &mut rotation);
                for h in 0..heads {
                    let at = |c: usize| offset([b, s, h, c], strides);
                    for (c, x) in row.iter_mut().enumerate().take(self.rotary_dim) {
                        *x = data[at(c)].to_f32();
                    }
                    self.rotate_row(&rotation, &mut row);
                    for (c, &x) in row.iter().enumerate().take(self.rotary_dim) {
                        data[at(c)] = T::from_f32(x);
                    }
                }
            }
        }
        Ok(())
    }

    /// Rotates the first `rotary_dim` channels of `row` (f32 values) by `rotation`: each value
    /// formed in f64 and rounded to f32.
    pub(crate) fn rotate_row(&self, rotation: &Rotation, row: &mut [f32]) {
        for i in 0..self.rotary_dim / 2 {
            let (ja, jb) = self.pair(i);
            let (a, b) = (f64::from(row[ja]), f64::from(row[jb]));
            let (ra, rb) = rotate(a, b, rotation.cos[i], rotation.sin[i]);
            (row[ja], row[jb]) = (ra as f32, rb as f32);
        }
    }

    /// The channels of pair `i`.
    pub(crate) fn pair(&self, i: usize) -> (usize, usize) {
        match self.style {
            RopeStyle::Halves => (i, i + self.rotary_dim / 2),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        }
    }

    /// `cos φ_i`, `sin φ_i` of every pair at position `p` (f64 for a base, the tables' values
    /// otherwise). The position was checked against the tables.
    pub(crate) fn rotation(&self, p: u32, out: &mut Rotation) {
        let half = self.rotary_dim / 2;
        for i in 0..half {
            let (c, s) = self.angle(p, i);
            out.cos[i] = c;
            out.sin[i] = s;
        }
    }

    /// `(cos φ, sin φ)` of pair `i` at position `p`, in f64.
    pub(crate) fn angle(&self, p: u32, i: usize) -> (f64, f64) {
        let half = self.rotary_dim / 2;
        match self.angles {
            Angles::Base(theta) => {
                let exponent = -((2 * i) as f64) / self.rotary_dim as f64;
                let phi = f64::from(p) * f64::from(theta).powf(exponent);
                (phi.cos(), phi.sin())
            }
            Angles::Tables { cos, sin } => {
                let at = p as usize * half + i;
                (f64::from(cos[at]), f64::from(sin[at]))
            }
        }
    }

    /// The checks of [`Rope::apply`] for head size `d` and `tokens` positions.
    pub(crate) fn check(&self, d: usize, tokens: usize, positions: &[u32]) -> Result<(), Error> {
        let r = self.rotary_dim;
        if r == 0 || !r.is_multiple_of(2) || r > d {
            return Err(Error::InvalidValue {
                operand: Operand::Rope,
                index: r,
                reason: "the rotary dimension must be even, nonzero and at most the head size",
            });
        }
        if positions.len() != tokens {
            return Err(Error::LengthMismatch {
                operand: Operand::Positions,
                expected: tokens,
                got: positions.len(),
            });
        }
        match self.angles {
            Angles::Base(theta) => {
                if !(theta.is_finite() && theta > 0.0) {
                    return Err(Error::InvalidValue {
                        operand: Operand::Rope,
                        index: 0,
                        reason: "the base θ must be finite and positive",
                    });
                }
            }
            Angles::Tables { cos, sin } => {
                let half = r / 2;
                if sin.len() != cos.len() || !cos.len().is_multiple_of(half) {
                    return Err(Error::LengthMismatch {
                        operand: Operand::RopeTables,
                        expected: cos.len().div_ceil(half) * half,
                        got: sin.len(),
                    });
                }
                let rows = cos.len() / half;
                if let Some(at) = positions.iter().position(|&p| p as usize >= rows) {
                    return Err(Error::InvalidValue {
                        operand: Operand::Positions,
                        index: at,
                        reason: "a position past the rows of the cos/sin tables",
                    });
                }
            }
        }
        Ok(())
    }
}

/// `(a·c − b·s, a·s + b·c)`.
pub(crate) fn rotate(a: f64, b: f64, c: f64, s: f64) -> (f64, f64) {
    (a * c - b * s, a * s + b * c)
}
