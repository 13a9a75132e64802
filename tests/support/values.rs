//! The numbers stored in Q, K and V: a distribution per operand, drawn from a small seeded
//! generator (so a few input bytes describe thousands of values), plus up to
//! [`MAX_SPECIALS`] exact placements of extreme values chosen by the fuzzer.

use super::bytes::{range, uint, urange, variant, Writer};
use arbitrary::{Arbitrary, Result, Unstructured};

/// Most special values one case places.
pub const MAX_SPECIALS: usize = 16;

/// How an operand's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Dist {
    /// Uniform in [−1, 1).
    Unit,
    /// Approximately normal, σ ≈ 1 (sum of four uniforms).
    Gauss,
    /// Integers in [−3, 3]: exact products and many exact ties.
    SmallInts,
    /// One value for every element: all-equal rows, every score tied.
    Constant,
    /// 0 or 1.
    Binary,
    /// Uniform in [−1, 1) times `2^exp`: huge or tiny logits, exactly scaled.
    Scaled,
    /// Random sign, exponent anywhere in the normal range, random mantissa.
    Wide,
    /// Random subnormals.
    Subnormal,
    /// Mostly exact zeros, some ±1.
    Sparse,
    /// Exactly 0 everywhere (a blank to place special values on).
    Zero,
}

/// One operand's distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// The family.
    pub dist: Dist,
    /// Power of two applied by [`Dist::Scaled`], in `−40..=40`.
    pub exp: i8,
    /// Seed of the generator.
    pub seed: u16,
}

impl Fill {
    /// Uniform [−1, 1) from `seed`.
    pub const fn unit(seed: u16) -> Fill {
        Fill {
            dist: Dist::Unit,
            exp: 0,
            seed,
        }
    }

    /// `dist` from `seed`, no scaling.
    pub const fn of(dist: Dist, seed: u16) -> Fill {
        Fill { dist, exp: 0, seed }
    }

    /// Reads a fill.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<Fill> {
        let dist = variant(u)?;
        let exp = if dist == Dist::Scaled {
            (range(u, 0, 80)? as i64 - 40) as i8
        } else {
            0
        };
        let seed = uint(u, 2)? as u16;
        Ok(Fill { dist, exp, seed })
    }

    /// Inverse of [`Fill::decode`].
    pub fn encode(&self, w: &mut Writer) {
        w.variant(&self.dist);
        if self.dist == Dist::Scaled {
            w.range((i64::from(self.exp) + 40) as u64, 0, 80);
        }
        w.uint(self.seed.into(), 2);
    }

    /// A generator for operand number `salt`.
    pub fn sampler(&self, salt: u64) -> Sampler {
        let mut rng = SplitMix(u64::from(self.seed) ^ (salt << 32) ^ 0x5d_a7a5);
        let constant = rng.unit() as f32;
        Sampler {
            fill: *self,
            rng,
            constant,
        }
    }
}

/// Draws the values of one [`Fill`].
pub struct Sampler {
    fill: Fill,
    rng: SplitMix,
    constant: f32,
}

impl Sampler {
    /// The next value.
    pub fn next_value(&mut self) -> f32 {
        let r = &mut self.rng;
        match self.fill.dist {
            Dist::Unit => r.unit() as f32,
            Dist::Gauss => ((r.unit() + r.unit() + r.unit() + r.unit()) * 0.866) as f32,
            Dist::SmallInts => (r.next_u64() % 7) as f32 - 3.0,
            Dist::Constant => self.constant,
            Dist::Binary => (r.next_u64() % 2) as f32,
            Dist::Scaled => (r.unit() * f64::from(self.fill.exp).exp2()) as f32,
            Dist::Wide => {
                let bits = r.next_u64();
                let exponent = 1 + (bits % 254) as u32; // biased 1..=254: normal numbers
                let mantissa = ((bits >> 8) & 0x7f_ffff) as u32;
                let sign = ((bits >> 40) & 1) as u32;
                f32::from_bits(sign << 31 | exponent << 23 | mantissa)
            }
            Dist::Subnormal => {
                let bits = r.next_u64();
                let mantissa = 1 + ((bits & 0x7f_ffff) as u32) % 0x7f_ffff;
                f32::from_bits(((bits >> 40) as u32 & 1) << 31 | mantissa)
            }
            Dist::Sparse => match r.next_u64() % 8 {
                0 => 1.0,
                1 => -1.0,
                _ => 0.0,
            },
            Dist::Zero => 0.0,
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, good-enough deterministic generator.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [−1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// `n` values uniform in [−1, 1) from `seed`: the one deterministic filler of the tests.
    pub fn unit_values(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix(seed);
        (0..n).map(|_| r.unit() as f32).collect()
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.unit() + 1.0) / 2.0) < p
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// One of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// An extreme value the fuzzer places exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum SpecialValue {
    /// NaN.
    Nan,
    /// +∞.
    Inf,
    /// −∞.
    NegInf,
    /// +0.
    Zero,
    /// −0.
    NegZero,
    /// `f32::MAX`.
    Max,
    /// `−f32::MAX`.
    NegMax,
    /// The smallest normal number.
    MinPositive,
    /// The smallest subnormal, 2⁻¹⁴⁹.
    MinSubnormal,
    /// −2⁻¹⁴⁹.
    NegMinSubnormal,
    /// 1e4: a large but ordinary logit factor.
    Big,
    /// −1e4.
    NegBig,
    /// 1e20.
    Huge,
    /// 1.
    One,
    /// −1.
    NegOne,
    /// Any bits (4 more bytes).
    Bits,
}

/// Which elements a special value replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Scope {
    /// One element.
    Element,
    /// A whole row: every head-dim element of one (batch, position, head).
    Row,
    /// One head-dim column of every row (a component shared by all keys, say).
    Column,
}

/// One special placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Special {
    /// 0: Q, 1: K, 2: V.
    pub operand: u8,
    /// What it replaces.
    pub scope: Scope,
    /// Element, row or column number (taken modulo the count).
    pub index: u32,
    /// The value.
    pub value: SpecialValue,
    /// The bits when `value` is [`SpecialValue::Bits`].
    pub bits: u32,
}

impl Special {
    /// `value` at `index` of `operand` (0: Q, 1: K, 2: V).
    pub const fn new(operand: u8, scope: Scope, index: u32, value: SpecialValue) -> Special {
        Special {
            operand,
            scope,
            index,
            value,
            bits: 0,
        }
    }

    /// The number.
    pub fn number(&self) -> f32 {
        match self.value {
            SpecialValue::Nan => f32::NAN,
            SpecialValue::Inf => f32::INFINITY,
            SpecialValue::NegInf => f32::NEG_INFINITY,
            SpecialValue::Zero => 0.0,
            SpecialValue::NegZero => -0.0,
            SpecialValue::Max => f32::MAX,
            SpecialValue::NegMax => -f32::MAX,
            SpecialValue::MinPositive => f32::MIN_POSITIVE,
            SpecialValue::MinSubnormal => f32::from_bits(1),
            SpecialValue::NegMinSubnormal => -f32::from_bits(1),
            SpecialValue::Big => 1e4,
            SpecialValue::NegBig => -1e4,
            SpecialValue::Huge => 1e20,
            SpecialValue::One => 1.0,
            SpecialValue::NegOne => -1.0,
            SpecialValue::Bits => f32::from_bits(self.bits),
        }
    }

    fn decode(u: &mut Unstructured<'_>) -> Result<Special> {
        let operand = urange(u, 0, 2)? as u8;
        let scope = variant(u)?;
        let index = uint(u, 2)? as u32;
        let value = variant(u)?;
        let bits = if value == SpecialValue::Bits {
            uint(u, 4)? as u32
        } else {
            0
        };
        Ok(Special {
            operand,
            scope,
            index,
            value,
            bits,
        })
    }

    fn encode(&self, w: &mut Writer) {
        w.urange(self.operand.into(), 0, 2);
        w.variant(&self.scope);
        w.uint(self.index.into(), 2);
        w.variant(&self.value);
        if self.value == SpecialValue::Bits {
            w.uint(self.bits.into(), 4);
        }
    }
}

/// The values of Q, K and V.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values {
    /// Q's distribution.
    pub q: Fill,
    /// K's distribution.
    pub k: Fill,
    /// V's distribution.
    pub v: Fill,
    /// Exact placements, applied in order after the fills.
    pub specials: Vec<Special>,
}

impl Values {
    /// Uniform values, no specials.
    pub fn unit(seed: u16) -> Values {
        Values {
            q: Fill::unit(seed),
            k: Fill::unit(seed.wrapping_add(1)),
            v: Fill::unit(seed.wrapping_add(2)),
            specials: Vec::new(),
        }
    }

    /// Reads the values.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<Values> {
        let q = Fill::decode(u)?;
        let k = Fill::decode(u)?;
        let v = Fill::decode(u)?;
        let n = urange(u, 0, MAX_SPECIALS)?;
        let specials = (0..n).map(|_| Special::decode(u)).collect::<Result<_>>()?;
        Ok(Values { q, k, v, specials })
    }

    /// Inverse of [`Values::decode`].
    pub fn encode(&self, w: &mut Writer) {
        self.q.encode(w);
        self.k.encode(w);
        self.v.encode(w);
        assert!(self.specials.len() <= MAX_SPECIALS);
        w.urange(self.specials.len(), 0, MAX_SPECIALS);
        for s in &self.specials {
            s.encode(w);
        }
    }
}
