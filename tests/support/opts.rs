//! The options of a call as fuzz input, and an independent model of what they mean.
//!
//! [`OptSpec`] has one field per option of [`sdpa::Options`]; options that borrow data (key
//! lengths, bias, mask, ALiBi slopes, sinks) are materialized for a given shape by
//! [`OptSpec::materialize`] into an [`OptData`], which owns the data and builds the `Options`.
//! Specs may be invalid on purpose (a key length past `n_kv`, a bias that does not broadcast,
//! a NaN slope, …): [`OptData::errors`] lists the documented error of each broken rule.
//!
//! New options are appended at the end of [`OptSpec`] (their decoding too), so existing corpus
//! files keep decoding to the same cases with the new option off: exhausted input reads as 0,
//! and 0 always decodes to "absent".

use super::bytes::{pick, uint, urange, variant, Writer};
use super::layout::Buffer;
use super::values::{Fill, SplitMix};
use arbitrary::{Arbitrary, Result, Unstructured};
use sdpa::{Alignment, Dim, Error, Operand, Options, Tensor};

/// The softmax scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum ScaleKind {
    /// Not set: `1/√d_k`.
    Default,
    /// 1.
    One,
    /// 1/8, a common explicit value.
    Eighth,
    /// 0.01: nearly uniform weights.
    Small,
    /// 16: sharp weights.
    Large,
    /// −0.3: negative scales are allowed.
    Negative,
    /// 0: every score is 0.
    Zero,
    /// 1e-30.
    Tiny,
    /// 1e30.
    Huge,
    /// Any f32 bits (4 more bytes), NaN and ±∞ included: those are errors.
    Bits,
}

/// The causal mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum CausalKind {
    /// No causal mask.
    None,
    /// `j ≤ i`.
    TopLeft,
    /// `j ≤ i + n_kv − n_q`.
    BottomRight,
}

impl CausalKind {
    /// The alignment, if causal.
    pub fn alignment(self) -> Option<Alignment> {
        match self {
            CausalKind::None => None,
            CausalKind::TopLeft => Some(Alignment::TopLeft),
            CausalKind::BottomRight => Some(Alignment::BottomRight),
        }
    }
}

fn alignment(u: &mut Unstructured<'_>) -> Result<Alignment> {
    pick(u, &[Alignment::TopLeft, Alignment::BottomRight])
}

fn write_alignment(w: &mut Writer, a: Alignment) {
    w.pick(a, &[Alignment::TopLeft, Alignment::BottomRight]);
}

/// Reads whether an optional field is present: absent unless the byte says so (so that
/// exhausted input means absent).
fn present(u: &mut Unstructured<'_>) -> Result<bool> {
    Ok(urange(u, 0, 3)? == 3)
}

fn write_present(w: &mut Writer, p: bool) {
    w.urange(if p { 3 } else { 0 }, 0, 3);
}

/// One side of a sliding window: small, around the sequence lengths, or past `i64::MAX`
/// (documented as unbounded).
fn window_side(u: &mut Unstructured<'_>) -> Result<usize> {
    Ok(match urange(u, 0, 7)? {
        0..=3 => urange(u, 0, 16)?,
        4 | 5 => urange(u, 0, 300)?,
        6 => pick(
            u,
            &[
                usize::MAX,
                i64::MAX as usize,
                i64::MAX as usize + 1,
                usize::MAX - 1,
            ],
        )?,
        _ => uint(u, 8)? as usize,
    })
}

fn write_window_side(w: &mut Writer, x: usize) {
    if x <= 16 {
        w.urange(0, 0, 7).urange(x, 0, 16);
    } else if x <= 300 {
        w.urange(4, 0, 7).urange(x, 0, 300);
    } else {
        w.urange(7, 0, 7).uint(x as u64, 8);
    }
}

/// `sliding_window(left, right, alignment)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// Keys before the diagonal.
    pub left: usize,
    /// Keys after the diagonal.
    pub right: usize,
    /// Its diagonal.
    pub alignment: Alignment,
}

/// Per-batch key lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum KvLensKind {
    /// Every length `n_kv` (no effect).
    Full,
    /// Uniform in `0..=n_kv`.
    Random,
    /// Every length 0: no row sees a key.
    Zeros,
    /// One length `n_kv + 1` (an error).
    PastEnd,
    /// One entry too many (an error).
    WrongCount,
}

/// Which entries of a bias are `−∞` or NaN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Holes {
    /// None.
    None,
    /// About 1 in 8 `−∞`.
    FewNegInf,
    /// About half `−∞`.
    HalfNegInf,
    /// Every entry `−∞`: no row sees a key.
    AllNegInf,
    /// About 1 in 8 NaN.
    FewNan,
    /// About 1 in 8 `+∞`.
    FewInf,
}

/// A bias or boolean mask: shape (with broadcasting), and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSpec {
    /// Bit `d`: dim `d` has size 1.
    pub size_one: u8,
    /// Bit `d`: dim `d` has full size but stride 0.
    pub stride_zero: u8,
    /// Give dim `.0` a size that neither matches nor is 1 (an error).
    pub bad_dim: Option<u8>,
    /// Bias values (unused by a mask).
    pub fill: Fill,
    /// Bias: which entries are non-finite. Mask: 0 all visible … 4 none visible.
    pub holes: Holes,
    /// Mask: fraction of hidden entries, eighths (0–8).
    pub hidden_eighths: u8,
    /// Seed for the holes / the mask.
    pub seed: u16,
}

impl TermSpec {
    /// A full-size term with nothing special.
    pub const fn plain(fill: Fill) -> TermSpec {
        TermSpec {
            size_one: 0,
            stride_zero: 0,
            bad_dim: None,
            fill,
            holes: Holes::None,
            hidden_eighths: 0,
            seed: 0,
        }
    }

    fn decode(u: &mut Unstructured<'_>) -> Result<TermSpec> {
        let size_one = urange(u, 0, 15)? as u8;
        let stride_zero = urange(u, 0, 15)? as u8;
        let bad_dim = if urange(u, 0, 15)? == 15 {
            Some(urange(u, 0, 3)? as u8)
        } else {
            None
        };
        let fill = Fill::decode(u)?;
        let holes = variant(u)?;
        let hidden_eighths = urange(u, 0, 8)? as u8;
        let seed = uint(u, 2)? as u16;
        Ok(TermSpec {
            size_one,
            stride_zero,
            bad_dim,
            fill,
            holes,
            hidden_eighths,
            seed,
        })
    }

    fn encode(&self, w: &mut Writer) {
        w.urange(self.size_one.into(), 0, 15);
        w.urange(self.stride_zero.into(), 0, 15);
        match self.bad_dim {
            Some(d) => w.urange(15, 0, 15).urange(d.into(), 0, 3),
            None => w.urange(0, 0, 15),
        };
        self.fill.encode(w);
        w.variant(&self.holes);
        w.urange(self.hidden_eighths.into(), 0, 8);
        w.uint(self.seed.into(), 2);
    }

    /// Dims and strides of the term's view for a problem `[B, n_q, H, n_kv]`.
    fn layout(&self, want: [usize; 4]) -> ([usize; 4], [usize; 4]) {
        let mut dims = want;
        for (d, n) in dims.iter_mut().enumerate() {
            if self.size_one & (1 << d) != 0 {
                *n = 1;
            }
        }
        if let Some(d) = self.bad_dim {
            let d = usize::from(d) % 4;
            dims[d] = if want[d] == 0 { 2 } else { want[d] + 1 };
        }
        let mut strides = [0; 4];
        let mut next = 1usize;
        for d in (0..4).rev() {
            strides[d] = next;
            next = next.saturating_mul(dims[d].max(1));
        }
        for (d, s) in strides.iter_mut().enumerate() {
            if self.stride_zero & (1 << d) != 0 {
                *s = 0;
            }
        }
        (dims, strides)
    }
}

/// Per-head values (ALiBi slopes or sink logits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum HeadValues {
    /// ALiBi: `alibi_slopes(H)`. Sinks: uniform in [−2, 2).
    Standard,
    /// Uniform in [−1, 1) times `2^exp` (negative slopes reward distance; huge ones hide keys).
    Scaled,
    /// Sinks: every head `−∞` (disabled). ALiBi: all 0.
    Off,
    /// Sinks: some heads `−∞`. ALiBi: some heads 0.
    Mixed,
    /// One entry NaN (an error).
    Nan,
    /// One entry `+∞` (an error for both).
    Inf,
    /// One entry `−∞` (an error for ALiBi, "disabled" for sinks).
    NegInf,
    /// One entry too few (an error).
    WrongCount,
}

/// `alibi(slopes, alignment)` or `sinks(logits)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSpec {
    /// The values.
    pub values: HeadValues,
    /// Power of two for [`HeadValues::Scaled`], `−20..=20`.
    pub exp: i8,
    /// Seed.
    pub seed: u16,
    /// The diagonal (ALiBi only).
    pub alignment: Alignment,
}

impl HeadSpec {
    fn decode(u: &mut Unstructured<'_>, with_alignment: bool) -> Result<HeadSpec> {
        let values = variant(u)?;
        let exp = (urange(u, 0, 40)? as i64 - 20) as i8;
        let seed = uint(u, 2)? as u16;
        let alignment = if with_alignment {
            alignment(u)?
        } else {
            Alignment::TopLeft
        };
        Ok(HeadSpec {
            values,
            exp,
            seed,
            alignment,
        })
    }

    fn encode(&self, w: &mut Writer, with_alignment: bool) {
        w.variant(&self.values);
        w.urange((i64::from(self.exp) + 20) as usize, 0, 40);
        w.uint(self.seed.into(), 2);
        if with_alignment {
            write_alignment(w, self.alignment);
        }
    }

    fn materialize(&self, heads: usize, alibi: bool) -> Vec<f32> {
        let mut rng = SplitMix(u64::from(self.seed) ^ 0xa11b1);
        let n = if self.values == HeadValues::WrongCount {
            heads.saturating_sub(1)
        } else {
            heads
        };
        let off = if alibi { 0.0 } else { f32::NEG_INFINITY };
        let mut v: Vec<f32> = match self.values {
            HeadValues::Standard if alibi => super::alibi_slopes(n).expect("slopes for the heads"),
            HeadValues::Standard => (0..n).map(|_| 2.0 * rng.unit() as f32).collect(),
            HeadValues::Off => vec![off; n],
            HeadValues::Mixed => (0..n)
                .map(|_| {
                    if rng.next_u64().is_multiple_of(2) {
                        off
                    } else {
                        rng.unit() as f32
                    }
                })
                .collect(),
            _ => (0..n)
                .map(|_| (rng.unit() * f64::from(self.exp).exp2()) as f32)
                .collect(),
        };
        if !v.is_empty() {
            let at = (rng.next_u64() as usize) % v.len();
            match self.values {
                HeadValues::Nan => v[at] = f32::NAN,
                HeadValues::Inf => v[at] = f32::INFINITY,
                HeadValues::NegInf => v[at] = f32::NEG_INFINITY,
                _ => {}
            }
        }
        v
    }
}

/// The softcap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum SoftcapKind {
    /// 50 (Gemma 2's attention cap).
    Fifty,
    /// 5.
    Five,
    /// 1.
    One,
    /// 0.01: every score squeezed to about ±0.01.
    Hundredth,
    /// 1e30: no effect.
    Huge,
    /// 0 (an error).
    Zero,
    /// −1 (an error).
    Negative,
    /// NaN (an error).
    Nan,
    /// +∞ (an error).
    Inf,
}

impl SoftcapKind {
    /// The cap.
    pub fn value(self) -> f32 {
        match self {
            SoftcapKind::Fifty => 50.0,
            SoftcapKind::Five => 5.0,
            SoftcapKind::One => 1.0,
            SoftcapKind::Hundredth => 0.01,
            SoftcapKind::Huge => 1e30,
            SoftcapKind::Zero => 0.0,
            SoftcapKind::Negative => -1.0,
            SoftcapKind::Nan => f32::NAN,
            SoftcapKind::Inf => f32::INFINITY,
        }
    }
}

/// Finite softcaps whose conversions overflow (`2/cap` or the cap in log2 units): huge
/// (≥ 2.4e38) and tiny (< 5.9e-39, subnormals included).
pub const WIDE_SOFTCAPS: [f32; 7] = [2.4e38, 3.0e38, f32::MAX, 5.8e-39, 1e-40, 1e-45, 1.2e-38];
/// Finite sink logits and ALiBi slopes at the ends of the f32 range.
pub const WIDE_LOGITS: [f32; 8] = [
    2.4e38,
    3.0e38,
    f32::MAX,
    -2.4e38,
    -3.0e38,
    -f32::MAX,
    1e30,
    -1e30,
];

/// Option values from the ends of their ranges, overriding what the other fields made: a
/// finite softcap, one sink logit and one ALiBi slope near ±f32::MAX or tiny, and key lengths at
/// the limits of `usize`. Each `0` means "no override". (Windows reach `usize::MAX` through
/// [`WindowSpec`] already.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WideSpec {
    /// `1 + index` into [`WIDE_SOFTCAPS`], or 255: any finite bits from `bits`.
    pub softcap: u8,
    /// `1 + index` into [`WIDE_LOGITS`] for the sink of head `at` (sinks made if absent).
    pub sink: u8,
    /// `1 + index` into [`WIDE_LOGITS`] for the slope of head `at` (only with ALiBi).
    pub slope: u8,
    /// Key length of batch `at`: 1 `usize::MAX`, 2 `usize::MAX − 1`, 3 `n_kv`, 4 `n_kv − 1`.
    pub kv_len: u8,
    /// Which head or batch.
    pub at: u16,
    /// Bits for `softcap == 255`.
    pub bits: u32,
}

impl WideSpec {
    fn decode(u: &mut Unstructured<'_>) -> Result<WideSpec> {
        let softcap = match urange(u, 0, 8)? {
            8 => 255,
            x => x as u8,
        };
        let bits = if softcap == 255 {
            uint(u, 4)? as u32
        } else {
            0
        };
        Ok(WideSpec {
            softcap,
            sink: urange(u, 0, WIDE_LOGITS.len())? as u8,
            slope: urange(u, 0, WIDE_LOGITS.len())? as u8,
            kv_len: urange(u, 0, 4)? as u8,
            at: uint(u, 2)? as u16,
            bits,
        })
    }

    fn encode(&self, w: &mut Writer) {
        w.urange(
            if self.softcap == 255 {
                8
            } else {
                self.softcap.into()
            },
            0,
            8,
        );
        if self.softcap == 255 {
            w.uint(self.bits.into(), 4);
        }
        w.urange(self.sink.into(), 0, WIDE_LOGITS.len());
        w.urange(self.slope.into(), 0, WIDE_LOGITS.len());
        w.urange(self.kv_len.into(), 0, 4);
        w.uint(self.at.into(), 2);
    }

    /// The softcap override: finite (non-finite bits count as absent).
    fn softcap(&self) -> Option<f32> {
        match self.softcap {
            0 => None,
            255 => Some(f32::from_bits(self.bits).abs()).filter(|c| c.is_finite() && *c > 0.0),
            i => Some(WIDE_SOFTCAPS[usize::from(i - 1) % WIDE_SOFTCAPS.len()]),
        }
    }

    fn logit(i: u8) -> Option<f32> {
        (i > 0).then(|| WIDE_LOGITS[usize::from(i - 1) % WIDE_LOGITS.len()])
    }
}

/// How often [`OptSpec::random`] uses each option (probability of each).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    pub causal: f64,
    pub window: f64,
    pub kv_lens: f64,
    pub bias: f64,
    pub mask: f64,
    pub alibi: f64,
    pub softcap: f64,
    pub sinks: f64,
    pub scale: f64,
}

impl Mix {
    /// Each option in about a third of the calls.
    pub const SOME: Mix = Mix {
        causal: 0.4,
        window: 0.4,
        kv_lens: 0.35,
        bias: 0.4,
        mask: 0.35,
        alibi: 0.35,
        softcap: 0.35,
        sinks: 0.35,
        scale: 0.25,
    };
    /// Every option in every call.
    pub const ALL: Mix = Mix {
        causal: 1.0,
        window: 1.0,
        kv_lens: 1.0,
        bias: 1.0,
        mask: 1.0,
        alibi: 1.0,
        softcap: 1.0,
        sinks: 1.0,
        scale: 1.0,
    };
}

/// Every option of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptSpec {
    /// The scale.
    pub scale: ScaleKind,
    /// Its bits for [`ScaleKind::Bits`].
    pub scale_bits: u32,
    /// The causal mask.
    pub causal: CausalKind,
    /// `sliding_window`.
    pub window: Option<WindowSpec>,
    /// `kv_lens`, and a seed for random lengths.
    pub kv_lens: Option<(KvLensKind, u16)>,
    /// `bias`.
    pub bias: Option<TermSpec>,
    /// `mask`.
    pub mask: Option<TermSpec>,
    /// `alibi`.
    pub alibi: Option<HeadSpec>,
    /// `softcap`.
    pub softcap: Option<SoftcapKind>,
    /// `sinks`.
    pub sinks: Option<HeadSpec>,
    /// Values from the ends of the ranges of softcap, sinks, slopes and key lengths.
    pub wide: Option<WideSpec>,
    /// `bf16_products`: the fused kernel may run prefill's products on bf16 operands (the bounds
    /// then include the weights' rounding). Not part of this struct's bytes: the differential
    /// target draws it last (`DiffCase::decode`), so older corpus files keep their meaning.
    pub bf16_products: bool,
    // New options go here, after the existing ones (see the module docs).
}

impl Default for OptSpec {
    fn default() -> Self {
        OptSpec {
            scale: ScaleKind::Default,
            scale_bits: 0,
            causal: CausalKind::None,
            window: None,
            kv_lens: None,
            bias: None,
            mask: None,
            alibi: None,
            softcap: None,
            sinks: None,
            wide: None,
            bf16_products: false,
        }
    }
}

impl OptSpec {
    /// Random *valid* options (for any shape), each present with its probability in `mix`;
    /// causal, window and ALiBi share one alignment. The random grids of the test suites draw
    /// their options here, so a new option is taught to this and [`OptSpec::decode`] (the
    /// fuzz targets) only.
    pub fn random(rng: &mut SplitMix, mix: &Mix) -> OptSpec {
        let align = if rng.chance(0.5) {
            Alignment::TopLeft
        } else {
            Alignment::BottomRight
        };
        let seed = |rng: &mut SplitMix| rng.next_u64() as u16;
        let mut o = OptSpec::default();
        if rng.chance(mix.causal) {
            o.causal = match align {
                Alignment::TopLeft => CausalKind::TopLeft,
                _ => CausalKind::BottomRight,
            };
        }
        if rng.chance(mix.window) {
            o.window = Some(WindowSpec {
                left: rng.pick(&[0, 1, 5, 40, 100, 300, 3000, usize::MAX]),
                right: rng.pick(&[0, 3, 17, 200, usize::MAX]),
                alignment: align,
            });
        }
        if rng.chance(mix.kv_lens) {
            let kind = rng.pick(&[KvLensKind::Random, KvLensKind::Random, KvLensKind::Full]);
            o.kv_lens = Some((kind, seed(rng)));
        }
        // A bias or mask: each dim full, of size 1, or full with stride 0.
        let term = |rng: &mut SplitMix, fill: Fill, holes: Holes, hidden: u8| {
            let modes: [u8; 4] = std::array::from_fn(|_| rng.below(4) as u8);
            let bits = |m: u8| (0..4).fold(0u8, |a, d| a | u8::from(modes[d] == m) << d);
            TermSpec {
                size_one: bits(2),
                stride_zero: bits(3),
                bad_dim: None,
                fill,
                holes,
                hidden_eighths: hidden,
                seed: seed(rng),
            }
        };
        if rng.chance(mix.bias) {
            // Uniform in [−2, 2), some entries −∞.
            let fill = Fill {
                dist: super::values::Dist::Scaled,
                exp: 1,
                seed: seed(rng),
            };
            let holes = rng.pick(&[Holes::None, Holes::FewNegInf]);
            o.bias = Some(term(rng, fill, holes, 0));
        }
        if rng.chance(mix.mask) {
            let hidden = rng.pick(&[0, 1, 3]);
            o.mask = Some(term(rng, Fill::unit(0), Holes::None, hidden));
        }
        let heads = |rng: &mut SplitMix, values: &[HeadValues], exp: i8| HeadSpec {
            values: rng.pick(values),
            exp,
            seed: seed(rng),
            alignment: align,
        };
        if rng.chance(mix.alibi) {
            o.alibi = Some(heads(rng, &[HeadValues::Standard, HeadValues::Scaled], 0));
        }
        if rng.chance(mix.softcap) {
            o.softcap = Some(rng.pick(&[
                SoftcapKind::Fifty,
                SoftcapKind::Five,
                SoftcapKind::One,
                SoftcapKind::Huge,
            ]));
        }
        if rng.chance(mix.sinks) {
            let values = [HeadValues::Standard, HeadValues::Mixed, HeadValues::Scaled];
            o.sinks = Some(heads(rng, &values, 2));
        }
        if rng.chance(mix.scale) {
            o.scale = rng.pick(&[
                ScaleKind::One,
                ScaleKind::Eighth,
                ScaleKind::Small,
                ScaleKind::Negative,
            ]);
        }
        o
    }

    /// Plain attention with `causal`.
    pub fn causal(causal: CausalKind) -> OptSpec {
        OptSpec {
            causal,
            ..OptSpec::default()
        }
    }

    /// The explicit scale, if any.
    pub fn scale_value(&self) -> Option<f32> {
        Some(match self.scale {
            ScaleKind::Default => return None,
            ScaleKind::One => 1.0,
            ScaleKind::Eighth => 0.125,
            ScaleKind::Small => 0.01,
            ScaleKind::Large => 16.0,
            ScaleKind::Negative => -0.3,
            ScaleKind::Zero => 0.0,
            ScaleKind::Tiny => 1e-30,
            ScaleKind::Huge => 1e30,
            ScaleKind::Bits => f32::from_bits(self.scale_bits),
        })
    }

    /// The scale the call uses for head size `d_k` (as the crate documents it).
    pub fn effective_scale(&self, d_k: usize) -> f32 {
        self.scale_value()
            .unwrap_or_else(|| 1.0 / (d_k as f32).sqrt())
    }

    /// Reads the options.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<OptSpec> {
        let scale = variant(u)?;
        let scale_bits = if scale == ScaleKind::Bits {
            uint(u, 4)? as u32
        } else {
            0
        };
        let causal = variant(u)?;
        let window = if present(u)? {
            Some(WindowSpec {
                left: window_side(u)?,
                right: window_side(u)?,
                alignment: alignment(u)?,
            })
        } else {
            None
        };
        let kv_lens = if present(u)? {
            Some((variant(u)?, uint(u, 2)? as u16))
        } else {
            None
        };
        let bias = if present(u)? {
            Some(TermSpec::decode(u)?)
        } else {
            None
        };
        let mask = if present(u)? {
            Some(TermSpec::decode(u)?)
        } else {
            None
        };
        let alibi = if present(u)? {
            Some(HeadSpec::decode(u, true)?)
        } else {
            None
        };
        let softcap = if present(u)? { Some(variant(u)?) } else { None };
        let sinks = if present(u)? {
            Some(HeadSpec::decode(u, false)?)
        } else {
            None
        };
        let wide = if present(u)? {
            Some(WideSpec::decode(u)?)
        } else {
            None
        };
        Ok(OptSpec {
            scale,
            scale_bits,
            causal,
            window,
            kv_lens,
            bias,
            mask,
            alibi,
            softcap,
            sinks,
            wide,
            // Drawn at the end of a differential case (`DiffCase::decode`), after its types.
            bf16_products: false,
        })
    }

    /// Inverse of [`OptSpec::decode`].
    pub fn encode(&self, w: &mut Writer) {
        w.variant(&self.scale);
        if self.scale == ScaleKind::Bits {
            w.uint(self.scale_bits.into(), 4);
        }
        w.variant(&self.causal);
        write_present(w, self.window.is_some());
        if let Some(win) = &self.window {
            write_window_side(w, win.left);
            write_window_side(w, win.right);
            write_alignment(w, win.alignment);
        }
        write_present(w, self.kv_lens.is_some());
        if let Some((kind, seed)) = &self.kv_lens {
            w.variant(kind);
            w.uint((*seed).into(), 2);
        }
        write_present(w, self.bias.is_some());
        if let Some(t) = &self.bias {
            t.encode(w);
        }
        write_present(w, self.mask.is_some());
        if let Some(t) = &self.mask {
            t.encode(w);
        }
        write_present(w, self.alibi.is_some());
        if let Some(a) = &self.alibi {
            a.encode(w, true);
        }
        write_present(w, self.softcap.is_some());
        if let Some(c) = &self.softcap {
            w.variant(c);
        }
        write_present(w, self.sinks.is_some());
        if let Some(s) = &self.sinks {
            s.encode(w, false);
        }
        write_present(w, self.wide.is_some());
        if let Some(x) = &self.wide {
            x.encode(w);
        }
    }

    /// The data of the options for a problem of `[B, n_q, H, n_kv]`. Sizes too large to
    /// materialize (the API target's huge dims) leave that option's data empty.
    pub fn materialize(&self, batch: usize, n_q: usize, heads: usize, n_kv: usize) -> OptData {
        const CAP: usize = 1 << 16;
        let want = [batch, n_q, heads, n_kv];
        let kv_lens = self.kv_lens.map(|(kind, seed)| {
            let mut rng = SplitMix(u64::from(seed) ^ 0x1e45);
            let n = batch.min(CAP);
            let mut lens: Vec<usize> = match kind {
                KvLensKind::Full | KvLensKind::PastEnd | KvLensKind::WrongCount => vec![n_kv; n],
                KvLensKind::Zeros => vec![0; n],
                KvLensKind::Random => (0..n)
                    .map(|_| (rng.next_u64() % (n_kv as u64).saturating_add(1).max(1)) as usize)
                    .collect(),
            };
            if !lens.is_empty() && kind == KvLensKind::PastEnd {
                let at = (rng.next_u64() as usize) % lens.len();
                lens[at] = n_kv.saturating_add(1);
            }
            if kind == KvLensKind::WrongCount {
                lens.push(0);
            }
            lens
        });
        let term = |spec: &TermSpec| -> Option<([usize; 4], [usize; 4], usize)> {
            let (dims, strides) = spec.layout(want.map(|n| n.min(CAP)));
            let elements = dims.iter().try_fold(1usize, |a, &n| a.checked_mul(n))?;
            (elements <= CAP && want.iter().all(|&n| n <= CAP)).then(|| {
                let len = if dims.contains(&0) {
                    0
                } else {
                    dims.iter()
                        .zip(&strides)
                        .map(|(&n, &s)| (n - 1) * s)
                        .sum::<usize>()
                        + 1
                };
                (dims, strides, len)
            })
        };
        let bias = self.bias.as_ref().and_then(|spec| {
            let (dims, strides, len) = term(spec)?;
            let mut sampler = spec.fill.sampler(7);
            let mut holes = SplitMix(u64::from(spec.seed) ^ 0xb1a5);
            let data = (0..len)
                .map(|_| {
                    let x = sampler.next_value();
                    let r = holes.next_u64() % 8;
                    match spec.holes {
                        Holes::FewNegInf if r == 0 => f32::NEG_INFINITY,
                        Holes::HalfNegInf if r < 4 => f32::NEG_INFINITY,
                        Holes::AllNegInf => f32::NEG_INFINITY,
                        Holes::FewNan if r == 0 => f32::NAN,
                        Holes::FewInf if r == 0 => f32::INFINITY,
                        _ => x,
                    }
                })
                .collect();
            Some(Buffer {
                data,
                start: 0,
                dims,
                strides,
            })
        });
        let mask = self.mask.as_ref().and_then(|spec| {
            let (dims, strides, len) = term(spec)?;
            let mut rng = SplitMix(u64::from(spec.seed) ^ 0x3a5c);
            let data = (0..len)
                .map(|_| rng.next_u64() % 8 >= u64::from(spec.hidden_eighths))
                .collect();
            Some(Buffer {
                data,
                start: 0,
                dims,
                strides,
            })
        });
        let per_head = |spec: &HeadSpec, alibi| {
            if heads <= CAP {
                spec.materialize(heads, alibi)
            } else {
                Vec::new()
            }
        };
        let mut data = OptData {
            spec: *self,
            want,
            kv_lens,
            bias,
            mask,
            softcap: self.softcap.map(SoftcapKind::value),
            slopes: self.alibi.as_ref().map(|s| per_head(s, true)),
            sinks: self.sinks.as_ref().map(|s| per_head(s, false)),
        };
        if let Some(w) = &self.wide {
            let at = usize::from(w.at);
            if let Some(c) = w.softcap() {
                data.softcap = Some(c);
            }
            if let Some(x) = WideSpec::logit(w.sink) {
                if heads <= CAP {
                    let sinks = data
                        .sinks
                        .get_or_insert_with(|| vec![f32::NEG_INFINITY; heads]);
                    if !sinks.is_empty() {
                        let n = sinks.len();
                        sinks[at % n] = x;
                    }
                }
            }
            if let (Some(x), Some(slopes)) = (WideSpec::logit(w.slope), data.slopes.as_mut()) {
                if !slopes.is_empty() {
                    let n = slopes.len();
                    slopes[at % n] = x;
                }
            }
            if w.kv_len > 0 {
                let lens = data
                    .kv_lens
                    .get_or_insert_with(|| vec![n_kv; batch.min(CAP)]);
                if !lens.is_empty() {
                    let n = lens.len();
                    lens[at % n] = match w.kv_len {
                        1 => usize::MAX,
                        2 => usize::MAX - 1,
                        3 => n_kv,
                        _ => n_kv.saturating_sub(1),
                    };
                }
            }
        }
        data
    }
}

/// The options of one call with their data, for one problem shape.
#[derive(Debug, Clone)]
pub struct OptData {
    /// What they were made from.
    pub spec: OptSpec,
    /// `[B, n_q, H, n_kv]`.
    pub want: [usize; 4],
    /// Key lengths.
    pub kv_lens: Option<Vec<usize>>,
    /// Bias (`None` also when too large to make).
    pub bias: Option<Buffer>,
    /// Mask (`None` also when too large to make).
    pub mask: Option<Buffer<bool>>,
    /// The softcap.
    pub softcap: Option<f32>,
    /// ALiBi slopes.
    pub slopes: Option<Vec<f32>>,
    /// Sink logits.
    pub sinks: Option<Vec<f32>>,
}

/// Index of the element `[b, i, h, j]` of a term, with size-1 dims broadcast.
fn term_offset(dims: [usize; 4], strides: [usize; 4], index: [usize; 4]) -> usize {
    (0..4)
        .map(|d| {
            if dims[d] == 1 {
                0
            } else {
                index[d] * strides[d]
            }
        })
        .sum()
}

impl OptData {
    /// The options to pass.
    pub fn options(&self) -> Options<'_> {
        let s = &self.spec;
        let mut o = Options::new();
        if let Some(x) = s.scale_value() {
            o = o.scale(x);
        }
        if let Some(a) = s.causal.alignment() {
            o = o.causal(a);
        }
        if let Some(w) = &s.window {
            o = o.sliding_window(w.left, w.right, w.alignment);
        }
        if let Some(l) = &self.kv_lens {
            o = o.kv_lens(l);
        }
        if let Some(b) = &self.bias {
            o = o.bias(
                Tensor::new(&b.data[b.start..], b.dims, b.strides).expect("valid bias layout"),
            );
        }
        if let Some(m) = &self.mask {
            o = o.mask(
                Tensor::new(&m.data[m.start..], m.dims, m.strides).expect("valid mask layout"),
            );
        }
        if let (Some(slopes), Some(a)) = (&self.slopes, &s.alibi) {
            o = o.alibi(slopes, a.alignment);
        }
        if let Some(c) = self.softcap {
            o = o.softcap(c);
        }
        if let Some(x) = &self.sinks {
            o = o.sinks(x);
        }
        if s.bf16_products {
            o = o.bf16_products();
        }
        o
    }

    /// Whether every option's data could be made (the API target skips those it could not).
    pub fn complete(&self) -> bool {
        (self.spec.bias.is_none() || self.bias.is_some())
            && (self.spec.mask.is_none() || self.mask.is_some())
    }

    /// The diagonal's offset of batch `b`, `off_b`, if some option has a diagonal (computed
    /// without overflow): bottom-right aligns each sequence at its own key length.
    pub fn offset(&self, b: usize) -> i128 {
        let [_, n_q, _, n_kv] = self.want;
        let n_kv = self.kv_lens.as_ref().map_or(n_kv, |l| l[b]);
        let s = &self.spec;
        let a = s
            .causal
            .alignment()
            .or(s.window.map(|w| w.alignment))
            .or(s.alibi.map(|a| a.alignment));
        match a {
            Some(Alignment::BottomRight) => n_kv as i128 - n_q as i128,
            _ => 0,
        }
    }

    /// Whether key `j` of batch `b` passes the causal, window, key-length and boolean masks for
    /// row `i` of head `h`, from the crate's documented formulas (not its code).
    pub fn visible(&self, b: usize, i: usize, h: usize, j: usize) -> bool {
        let s = &self.spec;
        let center = i as i128 + self.offset(b);
        let j_ = j as i128;
        let bounded = |x: usize| (x <= i64::MAX as usize).then_some(x as i128);
        let right = if s.causal != CausalKind::None {
            Some(0)
        } else {
            s.window.and_then(|w| bounded(w.right))
        };
        let left = s.window.and_then(|w| bounded(w.left));
        right.is_none_or(|r| j_ <= center + r)
            && left.is_none_or(|l| j_ >= center - l)
            && self.kv_lens.as_ref().is_none_or(|l| j < l[b])
            && self
                .mask
                .as_ref()
                .is_none_or(|m| m.data[m.start + term_offset(m.dims, m.strides, [b, i, h, j])])
    }

    /// `|slope_h · (i + off − j)|`, the magnitude of the ALiBi term (0 without ALiBi).
    pub fn alibi_magnitude(&self, b: usize, i: usize, h: usize, j: usize) -> f64 {
        self.slopes.as_ref().map_or(0.0, |s| {
            f64::from(s[h]).abs() * (i as i128 + self.offset(b) - j as i128).abs() as f64
        })
    }

    /// The bias of `[b, i, h, j]` (0 without a bias).
    pub fn bias(&self, b: usize, i: usize, h: usize, j: usize) -> f32 {
        self.bias.as_ref().map_or(0.0, |t| {
            t.data[t.start + term_offset(t.dims, t.strides, [b, i, h, j])]
        })
    }

    /// The sink logit of head `h` (`−∞` without sinks).
    pub fn sink(&self, h: usize) -> f32 {
        self.sinks.as_ref().map_or(f32::NEG_INFINITY, |s| s[h])
    }

    /// The documented error of every option rule these options break (none for a valid set).
    pub fn errors(&self) -> Vec<Error> {
        let s = &self.spec;
        let [batch, _, heads, n_kv] = self.want;
        let mut errors = Vec::new();
        let aligns: Vec<Alignment> = [
            s.causal.alignment(),
            s.window.map(|w| w.alignment),
            s.alibi.map(|a| a.alignment),
        ]
        .into_iter()
        .flatten()
        .collect();
        if aligns.windows(2).any(|w| w[0] != w[1]) {
            errors.push(Error::ConflictingAlignment);
        }
        if let Some(lens) = &self.kv_lens {
            if lens.len() != batch {
                errors.push(Error::LengthMismatch {
                    operand: Operand::KvLens,
                    expected: batch,
                    got: lens.len(),
                });
            } else if let Some(index) = lens.iter().position(|&l| l > n_kv) {
                errors.push(Error::InvalidValue {
                    operand: Operand::KvLens,
                    index,
                    reason: "key length exceeds n_kv",
                });
            }
        }
        for (operand, dims) in [
            (Operand::Bias, self.bias.as_ref().map(|b| b.dims)),
            (Operand::Mask, self.mask.as_ref().map(|m| m.dims)),
        ] {
            let Some(dims) = dims else { continue };
            for (d, dim) in Dim::ALL.into_iter().enumerate() {
                if dims[d] != 1 && dims[d] != self.want[d] {
                    errors.push(Error::NotBroadcastable {
                        operand,
                        dim,
                        expected: self.want[d],
                        got: dims[d],
                    });
                }
            }
        }
        let per_head =
            |errors: &mut Vec<Error>, v: &[f32], operand, reason, ok: &dyn Fn(f32) -> bool| {
                if v.len() != heads {
                    errors.push(Error::LengthMismatch {
                        operand,
                        expected: heads,
                        got: v.len(),
                    });
                } else if let Some(index) = v.iter().position(|&x| !ok(x)) {
                    errors.push(Error::InvalidValue {
                        operand,
                        index,
                        reason,
                    });
                }
            };
        // The documented limits (`Options`' errors): values the kernel turns into log2 units
        // must stay finite there, and a softcap must be a positive normal f32.
        let fits_log2 = |x: f32| (x * std::f32::consts::LOG2_E).is_finite();
        if let Some(v) = &self.slopes {
            let ok = |x: f32| fits_log2(x);
            per_head(
                &mut errors,
                v,
                Operand::AlibiSlopes,
                "slope is not finite, or |slope|·log2(e) overflows f32",
                &ok,
            );
        }
        if let Some(v) = &self.sinks {
            let ok = |x: f32| x == f32::NEG_INFINITY || fits_log2(x);
            let reason = "sink logit is NaN or +inf, or finite with |sink|·log2(e) overflowing f32";
            per_head(&mut errors, v, Operand::Sinks, reason, &ok);
        }
        if let Some(cap) = self.softcap {
            if !(cap >= f32::MIN_POSITIVE && fits_log2(cap)) {
                errors.push(Error::InvalidSoftcap(cap));
            }
        }
        errors
    }

    /// Whether `e` is an error the crate may answer for a valid option value from the ends of
    /// its range ([`WideSpec`]): a finite softcap, sink logit or slope whose conversion
    /// overflows may be handled or refused as a typed error of that option, never a NaN.
    pub fn may_refuse(&self, e: &Error) -> bool {
        let wide = |x: f32| x.abs() >= 2.4e38 || (x != 0.0 && x.abs() < 5.9e-39);
        match e {
            Error::InvalidSoftcap(c) => self.softcap == Some(*c) && wide(*c),
            Error::InvalidValue {
                operand: Operand::Sinks,
                index,
                ..
            } => self
                .sinks
                .as_ref()
                .and_then(|s| s.get(*index))
                .is_some_and(|&x| x.is_finite() && wide(x)),
            Error::InvalidValue {
                operand: Operand::AlibiSlopes,
                index,
                ..
            } => self
                .slopes
                .as_ref()
                .and_then(|s| s.get(*index))
                .is_some_and(|&x| wide(x)),
            _ => false,
        }
    }
}

/// `options` with K's and V's scales (8-bit K/V), if any.
pub fn with_scales<'a>(
    options: Options<'a>,
    scales: Option<(&'a Buffer, &'a Buffer)>,
) -> Options<'a> {
    match scales {
        Some((k, v)) => options.kv_scales(k.view(), v.view()),
        None => options,
    }
}

/// Borrows an owned pair of K's and V's scales, for [`with_scales`].
pub fn scale_refs(scales: &Option<(Buffer, Buffer)>) -> Option<(&Buffer, &Buffer)> {
    scales.as_ref().map(|(k, v)| (k, v))
}
