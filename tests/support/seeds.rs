//! The seed corpora: named, structured inputs that `tests/it/fuzz_stable.rs` encodes into
//! `fuzz/corpus/<target>/seed-<name>` (and checks that the files on disk still decode to them).
//! Regenerate with `SDPA_WRITE_CORPUS=1 cargo test --test it -- fuzz_stable::seed_corpus`.

use super::api::{ApiCase, Ctor, LenKind, LenSpec, MergeSpec, PartialSpec, StrideKind, ViewSpec};
use super::differential::{DiffCase, Shape};
use super::layout::Layout;
use super::merge::MergeCase;
use super::opts::{
    CausalKind, HeadSpec, HeadValues, Holes, KvLensKind, OptSpec, ScaleKind, SoftcapKind, TermSpec,
    WideSpec, WindowSpec,
};
use super::typed::{Elem, Types};
use super::values::{Dist, Fill, Scope, Special, SpecialValue, SplitMix, Values};
use sdpa::Alignment;

const fn shape(
    batch: usize,
    kv_heads: usize,
    group: usize,
    n_q: usize,
    n_kv: usize,
    d_k: usize,
    d_v: usize,
) -> Shape {
    Shape {
        batch,
        heads: kv_heads * group,
        kv_heads,
        n_q,
        n_kv,
        d_k,
        d_v,
    }
}

fn causal(c: CausalKind) -> OptSpec {
    OptSpec::causal(c)
}

fn scale(kind: ScaleKind, bits: u32) -> OptSpec {
    OptSpec {
        scale: kind,
        scale_bits: bits,
        ..OptSpec::default()
    }
}

/// Ones at the given element indices of Q (0), K (1) or V (2).
fn ones(operand: u8, at: &[u32]) -> impl Iterator<Item = Special> + '_ {
    at.iter()
        .map(move |&i| Special::new(operand, Scope::Element, i, SpecialValue::One))
}

/// The differential seeds.
pub fn differential() -> Vec<(&'static str, DiffCase)> {
    use CausalKind::{BottomRight, TopLeft};
    let plain = DiffCase::plain;
    let none = OptSpec::default();
    // The crate docs' example: 3 tokens, head size 2, q = k = [[1,0],[1,1],[0,1]],
    // v = [[1,0],[0,1],[1,1]].
    let article_values = Values {
        q: Fill::of(Dist::Zero, 0),
        k: Fill::of(Dist::Zero, 0),
        v: Fill::of(Dist::Zero, 0),
        specials: ones(0, &[0, 2, 3, 5])
            .chain(ones(1, &[0, 2, 3, 5]))
            .chain(ones(2, &[0, 3, 4, 5]))
            .collect(),
    };
    let article = |opts| DiffCase {
        values: article_values.clone(),
        ..plain(shape(1, 1, 1, 3, 3, 2, 2), opts, 0)
    };
    let with_types = |mut c: DiffCase, types: Types| {
        c.types = types;
        c
    };
    let with_values = |mut c: DiffCase, values: Values| {
        c.values = values;
        c
    };
    let with_layouts = |mut c: DiffCase, layouts: [Layout; 4]| {
        c.layouts = layouts;
        c
    };
    let unit = Values::unit;
    let special = |operand, scope, index, value| Values {
        specials: vec![Special::new(operand, scope, index, value)],
        ..unit(5)
    };
    let fills = |q: Fill, k: Fill, v: Fill| Values {
        q,
        k,
        v,
        specials: Vec::new(),
    };
    let padded = Layout::padded([0, 2, 1, 3], [1, 2, 3, 0], 3);
    vec![
        ("article-3x3", article(none)),
        ("article-3x3-causal", article(causal(BottomRight))),
        (
            "causal-bottom-right-nq-gt-nkv",
            plain(shape(1, 2, 2, 97, 65, 64, 64), causal(BottomRight), 1),
        ),
        (
            "causal-bottom-right-nq-lt-nkv",
            plain(shape(1, 1, 8, 7, 300, 128, 128), causal(BottomRight), 2),
        ),
        (
            "causal-top-left-nq-gt-nkv",
            plain(shape(2, 1, 1, 129, 63, 32, 32), causal(TopLeft), 3),
        ),
        (
            "causal-top-left-nq-lt-nkv",
            plain(shape(1, 2, 1, 33, 193, 80, 80), causal(TopLeft), 4),
        ),
        (
            "causal-square",
            plain(shape(1, 1, 2, 96, 96, 64, 64), causal(TopLeft), 5),
        ),
        (
            "decode-one-row",
            plain(shape(2, 2, 4, 1, 289, 128, 128), causal(BottomRight), 6),
        ),
        ("gqa-4x2", plain(shape(2, 4, 2, 17, 31, 16, 16), none, 7)),
        (
            "bf16-products-causal",
            with_types(
                plain(
                    shape(1, 2, 1, 97, 299, 37, 24),
                    OptSpec {
                        bf16_products: true,
                        ..causal(BottomRight)
                    },
                    60,
                ),
                Types {
                    q: Elem::Bf16,
                    kv: Elem::Bf16,
                    out: Elem::Bf16,
                },
            ),
        ),
        (
            "bf16-products-plain-d128",
            with_types(
                plain(
                    shape(1, 1, 2, 70, 250, 128, 128),
                    OptSpec {
                        bf16_products: true,
                        ..none
                    },
                    61,
                ),
                Types {
                    q: Elem::Bf16,
                    kv: Elem::Bf16,
                    out: Elem::F32,
                },
            ),
        ),
        ("mqa-8", plain(shape(1, 1, 8, 20, 50, 64, 64), none, 8)),
        (
            "types-f16-i8-bf16",
            with_types(
                plain(shape(2, 4, 2, 17, 31, 16, 16), causal(BottomRight), 7),
                Types {
                    q: Elem::F16,
                    kv: Elem::I8,
                    out: Elem::Bf16,
                },
            ),
        ),
        (
            "types-bf16-decode",
            with_types(
                plain(shape(2, 2, 4, 1, 289, 128, 128), causal(BottomRight), 6),
                Types {
                    q: Elem::Bf16,
                    kv: Elem::Bf16,
                    out: Elem::F16,
                },
            ),
        ),
        (
            "types-f32-i8-decode",
            with_types(
                plain(shape(1, 2, 4, 1, 297, 64, 64), none, 8),
                Types {
                    q: Elem::F32,
                    kv: Elem::I8,
                    out: Elem::F32,
                },
            ),
        ),
        ("tails-63", plain(shape(1, 1, 1, 63, 63, 64, 64), none, 9)),
        ("tails-64", plain(shape(1, 1, 1, 64, 64, 64, 64), none, 10)),
        ("tails-65", plain(shape(1, 1, 1, 65, 65, 65, 65), none, 11)),
        (
            "tails-95-97",
            plain(shape(1, 1, 1, 95, 97, 96, 96), causal(BottomRight), 12),
        ),
        ("head-dim-1", plain(shape(1, 1, 1, 16, 16, 1, 1), none, 13)),
        (
            "head-dims-80-96",
            plain(shape(1, 2, 1, 40, 40, 80, 96), none, 14),
        ),
        (
            "head-dim-256",
            plain(shape(1, 1, 1, 16, 40, 256, 256), causal(TopLeft), 15),
        ),
        ("dk-ne-dv", plain(shape(1, 1, 3, 9, 10, 9, 33), none, 16)),
        ("n-kv-0", plain(shape(1, 1, 2, 5, 0, 8, 8), none, 17)),
        ("n-q-0", plain(shape(1, 1, 1, 0, 5, 8, 8), none, 18)),
        ("batch-0", plain(shape(0, 1, 1, 5, 5, 8, 8), none, 19)),
        (
            "d-v-0-lse-only",
            plain(shape(1, 1, 1, 6, 7, 8, 0), none, 20),
        ),
        (
            "layout-bhsd",
            with_layouts(
                plain(shape(2, 2, 2, 10, 12, 16, 16), causal(TopLeft), 21),
                [Layout::BHSD; 4],
            ),
        ),
        (
            "layout-padded",
            with_layouts(plain(shape(2, 2, 2, 10, 12, 16, 16), none, 22), [padded; 4]),
        ),
        (
            "layout-head-dim-strided",
            with_layouts(
                plain(shape(1, 2, 1, 9, 13, 7, 5), causal(BottomRight), 23),
                [
                    Layout::head_dim_strided(3),
                    Layout::head_dim_strided(2),
                    Layout::head_dim_strided(4),
                    padded,
                ],
            ),
        ),
        (
            "layout-broadcast-kv-over-batch",
            with_layouts(
                plain(shape(3, 1, 2, 8, 8, 16, 16), none, 24),
                [
                    Layout::BSHD,
                    Layout::broadcast(1),
                    Layout::broadcast(1),
                    Layout::BSHD,
                ],
            ),
        ),
        (
            "layout-broadcast-one-query-row",
            with_layouts(
                plain(shape(1, 1, 1, 12, 20, 8, 8), causal(TopLeft), 25),
                [
                    Layout::broadcast(2),
                    Layout::BSHD,
                    Layout::BSHD,
                    Layout::BHSD,
                ],
            ),
        ),
        (
            "nan-in-q-row",
            with_values(
                plain(shape(1, 1, 2, 9, 9, 8, 8), none, 26),
                special(0, Scope::Row, 4, SpecialValue::Nan),
            ),
        ),
        (
            "nan-in-k",
            with_values(
                plain(shape(1, 1, 1, 9, 9, 8, 8), causal(TopLeft), 27),
                special(1, Scope::Element, 40, SpecialValue::Nan),
            ),
        ),
        (
            "nan-in-v-causal",
            with_values(
                plain(shape(1, 1, 1, 9, 9, 8, 8), causal(TopLeft), 28),
                special(2, Scope::Element, 40, SpecialValue::Nan),
            ),
        ),
        (
            "nan-in-v-rows-without-keys",
            with_values(
                plain(shape(1, 1, 1, 8, 4, 4, 4), causal(BottomRight), 29),
                special(2, Scope::Element, 13, SpecialValue::Nan),
            ),
        ),
        (
            "inf-in-k",
            with_values(
                plain(shape(1, 1, 1, 6, 6, 4, 4), none, 30),
                special(1, Scope::Element, 5, SpecialValue::Inf),
            ),
        ),
        (
            "neg-inf-in-q",
            with_values(
                plain(shape(1, 1, 1, 6, 6, 4, 4), none, 31),
                special(0, Scope::Row, 2, SpecialValue::NegInf),
            ),
        ),
        (
            "max-in-v",
            with_values(
                plain(shape(1, 1, 1, 6, 6, 4, 4), none, 32),
                special(2, Scope::Column, 1, SpecialValue::Max),
            ),
        ),
        (
            "huge-logits-1e4",
            with_values(
                plain(shape(1, 1, 1, 20, 30, 16, 16), none, 33),
                Values {
                    specials: vec![Special::new(1, Scope::Column, 3, SpecialValue::Big)],
                    ..unit(33)
                },
            ),
        ),
        (
            "huge-logits-scaled",
            with_values(
                plain(shape(1, 1, 1, 20, 30, 16, 16), causal(TopLeft), 34),
                fills(
                    Fill {
                        dist: Dist::Scaled,
                        exp: 12,
                        seed: 1,
                    },
                    Fill {
                        dist: Dist::Scaled,
                        exp: 12,
                        seed: 2,
                    },
                    Fill::unit(3),
                ),
            ),
        ),
        (
            "tiny-values",
            with_values(
                plain(shape(1, 1, 1, 20, 30, 16, 16), none, 35),
                fills(
                    Fill {
                        dist: Dist::Scaled,
                        exp: -40,
                        seed: 1,
                    },
                    Fill::unit(2),
                    Fill {
                        dist: Dist::Scaled,
                        exp: -30,
                        seed: 3,
                    },
                ),
            ),
        ),
        (
            "subnormal-q",
            with_values(
                plain(shape(1, 1, 1, 8, 8, 8, 8), none, 36),
                fills(Fill::of(Dist::Subnormal, 1), Fill::unit(2), Fill::unit(3)),
            ),
        ),
        (
            "all-scores-tied",
            with_values(
                plain(shape(1, 1, 2, 33, 97, 16, 16), none, 37),
                fills(Fill::unit(1), Fill::of(Dist::Constant, 2), Fill::unit(3)),
            ),
        ),
        (
            "small-ints",
            with_values(
                plain(shape(2, 1, 2, 17, 19, 5, 7), causal(BottomRight), 38),
                fills(
                    Fill::of(Dist::SmallInts, 1),
                    Fill::of(Dist::SmallInts, 2),
                    Fill::of(Dist::SmallInts, 3),
                ),
            ),
        ),
        (
            "binary-sparse",
            with_values(
                plain(shape(1, 2, 1, 13, 14, 32, 32), none, 39),
                fills(
                    Fill::of(Dist::Binary, 1),
                    Fill::of(Dist::Sparse, 2),
                    Fill::of(Dist::Gauss, 3),
                ),
            ),
        ),
        (
            "wide-exponents",
            with_values(
                plain(shape(1, 1, 1, 6, 6, 4, 4), none, 40),
                fills(
                    Fill::of(Dist::Wide, 1),
                    Fill::of(Dist::Wide, 2),
                    Fill::of(Dist::Wide, 3),
                ),
            ),
        ),
        (
            "scale-nan",
            plain(
                shape(1, 1, 1, 4, 4, 4, 4),
                scale(ScaleKind::Bits, f32::NAN.to_bits()),
                41,
            ),
        ),
        (
            "scale-inf",
            plain(
                shape(1, 1, 1, 4, 4, 4, 4),
                scale(ScaleKind::Bits, f32::INFINITY.to_bits()),
                42,
            ),
        ),
        (
            "scale-negative",
            plain(
                shape(1, 1, 1, 30, 30, 16, 16),
                scale(ScaleKind::Negative, 0),
                43,
            ),
        ),
        (
            "scale-zero",
            plain(
                shape(1, 1, 1, 30, 30, 16, 16),
                scale(ScaleKind::Zero, 0),
                44,
            ),
        ),
        (
            "scale-large",
            plain(
                shape(1, 1, 1, 30, 30, 16, 16),
                scale(ScaleKind::Large, 0),
                45,
            ),
        ),
        (
            "window-bottom-right",
            plain(
                shape(1, 2, 2, 40, 130, 32, 32),
                window(8, 3, Alignment::BottomRight, CausalKind::None),
                46,
            ),
        ),
        (
            "window-causal",
            plain(
                shape(1, 1, 2, 100, 100, 16, 16),
                window(17, 0, Alignment::TopLeft, CausalKind::TopLeft),
                47,
            ),
        ),
        (
            "window-unbounded-left",
            plain(
                shape(1, 1, 1, 20, 50, 8, 8),
                window(usize::MAX, 2, Alignment::TopLeft, CausalKind::None),
                48,
            ),
        ),
        (
            "window-conflicting-alignment",
            plain(
                shape(1, 1, 1, 8, 8, 8, 8),
                window(2, 0, Alignment::TopLeft, CausalKind::BottomRight),
                49,
            ),
        ),
        (
            "kv-lens-random",
            plain(
                shape(3, 1, 2, 20, 97, 16, 16),
                OptSpec {
                    kv_lens: Some((KvLensKind::Random, 1)),
                    ..none
                },
                50,
            ),
        ),
        (
            "kv-lens-zero",
            plain(
                shape(2, 1, 1, 5, 9, 8, 8),
                OptSpec {
                    kv_lens: Some((KvLensKind::Zeros, 2)),
                    ..none
                },
                51,
            ),
        ),
        (
            "kv-lens-past-end",
            plain(
                shape(2, 1, 1, 5, 9, 8, 8),
                OptSpec {
                    kv_lens: Some((KvLensKind::PastEnd, 3)),
                    ..none
                },
                52,
            ),
        ),
        (
            "bias-full",
            plain(
                shape(2, 2, 2, 17, 23, 16, 16),
                OptSpec {
                    bias: Some(TermSpec::plain(Fill::unit(4))),
                    ..none
                },
                53,
            ),
        ),
        (
            "bias-broadcast-neg-inf",
            plain(
                shape(2, 1, 4, 17, 23, 16, 16),
                OptSpec {
                    bias: Some(TermSpec {
                        size_one: 0b0101,
                        stride_zero: 0b0010,
                        holes: Holes::HalfNegInf,
                        ..TermSpec::plain(Fill::unit(5))
                    }),
                    ..none
                },
                54,
            ),
        ),
        (
            "bias-not-broadcastable",
            plain(
                shape(1, 1, 2, 4, 5, 8, 8),
                OptSpec {
                    bias: Some(TermSpec {
                        bad_dim: Some(2),
                        ..TermSpec::plain(Fill::unit(6))
                    }),
                    ..none
                },
                55,
            ),
        ),
        (
            "mask-half",
            plain(
                shape(2, 2, 1, 33, 40, 16, 16),
                OptSpec {
                    mask: Some(TermSpec {
                        hidden_eighths: 4,
                        seed: 7,
                        ..TermSpec::plain(Fill::unit(0))
                    }),
                    ..none
                },
                56,
            ),
        ),
        (
            "mask-all-hidden",
            plain(
                shape(1, 1, 2, 9, 9, 8, 8),
                OptSpec {
                    mask: Some(TermSpec {
                        hidden_eighths: 8,
                        size_one: 0b1010,
                        ..TermSpec::plain(Fill::unit(0))
                    }),
                    ..none
                },
                57,
            ),
        ),
        (
            "alibi-standard",
            plain(
                shape(1, 2, 4, 50, 60, 32, 32),
                OptSpec {
                    alibi: Some(head(HeadValues::Standard, 0, Alignment::BottomRight)),
                    causal: CausalKind::BottomRight,
                    ..none
                },
                58,
            ),
        ),
        (
            "alibi-scaled",
            plain(
                shape(1, 1, 2, 30, 30, 8, 8),
                OptSpec {
                    alibi: Some(head(HeadValues::Scaled, 3, Alignment::TopLeft)),
                    ..none
                },
                59,
            ),
        ),
        (
            "alibi-nan-slope",
            plain(
                shape(1, 1, 2, 3, 3, 8, 8),
                OptSpec {
                    alibi: Some(head(HeadValues::Nan, 0, Alignment::TopLeft)),
                    ..none
                },
                60,
            ),
        ),
        (
            "softcap-50",
            plain(
                shape(1, 1, 1, 20, 20, 64, 64),
                OptSpec {
                    softcap: Some(SoftcapKind::Fifty),
                    scale: ScaleKind::Large,
                    ..none
                },
                61,
            ),
        ),
        (
            "softcap-small",
            plain(
                shape(1, 1, 1, 20, 20, 16, 16),
                OptSpec {
                    softcap: Some(SoftcapKind::Hundredth),
                    ..none
                },
                62,
            ),
        ),
        (
            "softcap-zero",
            plain(
                shape(1, 1, 1, 4, 4, 4, 4),
                OptSpec {
                    softcap: Some(SoftcapKind::Zero),
                    ..none
                },
                63,
            ),
        ),
        (
            "sinks",
            plain(
                shape(1, 2, 2, 20, 30, 16, 16),
                OptSpec {
                    sinks: Some(head(HeadValues::Standard, 0, Alignment::TopLeft)),
                    ..none
                },
                64,
            ),
        ),
        (
            "sinks-rows-without-keys",
            plain(
                shape(1, 1, 2, 12, 4, 8, 8),
                OptSpec {
                    sinks: Some(head(HeadValues::Mixed, 0, Alignment::TopLeft)),
                    causal: CausalKind::BottomRight,
                    ..none
                },
                65,
            ),
        ),
        (
            "sinks-nan",
            plain(
                shape(1, 1, 2, 3, 3, 8, 8),
                OptSpec {
                    sinks: Some(head(HeadValues::Nan, 0, Alignment::TopLeft)),
                    ..none
                },
                66,
            ),
        ),
        (
            "every-option",
            plain(
                shape(2, 2, 2, 33, 70, 16, 16),
                OptSpec {
                    causal: CausalKind::BottomRight,
                    window: Some(WindowSpec {
                        left: 20,
                        right: 0,
                        alignment: Alignment::BottomRight,
                    }),
                    kv_lens: Some((KvLensKind::Random, 9)),
                    bias: Some(TermSpec {
                        size_one: 0b0001,
                        ..TermSpec::plain(Fill::unit(8))
                    }),
                    mask: Some(TermSpec {
                        hidden_eighths: 1,
                        size_one: 0b0100,
                        ..TermSpec::plain(Fill::unit(0))
                    }),
                    alibi: Some(head(HeadValues::Standard, 0, Alignment::BottomRight)),
                    softcap: Some(SoftcapKind::Five),
                    sinks: Some(head(HeadValues::Standard, 0, Alignment::TopLeft)),
                    ..none
                },
                67,
            ),
        ),
        (
            "nan-in-v-rows-hidden-by-mask",
            with_values(
                plain(
                    shape(1, 1, 2, 12, 20, 8, 8),
                    OptSpec {
                        mask: Some(TermSpec {
                            hidden_eighths: 6,
                            seed: 9,
                            size_one: 0b0100,
                            ..TermSpec::plain(Fill::unit(0))
                        }),
                        ..none
                    },
                    70,
                ),
                Values {
                    specials: vec![
                        Special::new(2, Scope::Row, 3, SpecialValue::Nan),
                        Special::new(2, Scope::Row, 11, SpecialValue::Inf),
                        Special::new(2, Scope::Element, 17 * 8 + 2, SpecialValue::NegInf),
                    ],
                    ..unit(70)
                },
            ),
        ),
        (
            "nan-in-v-rows-after-causal-diagonal",
            with_values(
                plain(shape(1, 2, 1, 16, 16, 8, 8), causal(TopLeft), 71),
                Values {
                    specials: vec![Special::new(2, Scope::Row, 2 * 12, SpecialValue::Nan)],
                    ..unit(71)
                },
            ),
        ),
        (
            "wide-softcap-huge",
            plain(shape(1, 1, 2, 9, 17, 8, 8), wide(1, 0, 0, 0, 0), 72),
        ),
        (
            "wide-softcap-max",
            plain(shape(1, 1, 1, 9, 17, 8, 8), wide(3, 0, 0, 0, 0), 73),
        ),
        (
            "wide-softcap-tiny",
            plain(shape(1, 1, 2, 9, 17, 8, 8), wide(4, 0, 0, 0, 0), 74),
        ),
        (
            "wide-softcap-subnormal",
            plain(shape(1, 1, 1, 9, 17, 8, 8), wide(6, 0, 0, 0, 0), 75),
        ),
        (
            "wide-sink-huge",
            plain(shape(1, 2, 2, 9, 17, 8, 8), wide(0, 1, 0, 0, 1), 76),
        ),
        (
            "wide-sink-negative-huge",
            plain(shape(1, 2, 2, 9, 17, 8, 8), wide(0, 4, 0, 0, 2), 77),
        ),
        (
            "wide-slope-huge",
            plain(
                shape(1, 1, 4, 9, 17, 8, 8),
                OptSpec {
                    alibi: Some(head(HeadValues::Standard, 0, Alignment::BottomRight)),
                    ..wide(0, 0, 1, 0, 1)
                },
                78,
            ),
        ),
        (
            "wide-slope-negative-huge",
            plain(
                shape(1, 1, 4, 9, 17, 8, 8),
                OptSpec {
                    alibi: Some(head(HeadValues::Standard, 0, Alignment::TopLeft)),
                    ..wide(0, 0, 4, 0, 3)
                },
                79,
            ),
        ),
        (
            "wide-kv-len-max",
            plain(shape(2, 1, 1, 5, 9, 8, 8), wide(0, 0, 0, 1, 1), 80),
        ),
    ]
}

fn window(left: usize, right: usize, alignment: Alignment, causal: CausalKind) -> OptSpec {
    OptSpec {
        causal,
        window: Some(WindowSpec {
            left,
            right,
            alignment,
        }),
        ..OptSpec::default()
    }
}

/// Only wide option values ([`WideSpec`]).
fn wide(softcap: u8, sink: u8, slope: u8, kv_len: u8, at: u16) -> OptSpec {
    OptSpec {
        wide: Some(WideSpec {
            softcap,
            sink,
            slope,
            kv_len,
            at,
            bits: 0,
        }),
        ..OptSpec::default()
    }
}

fn head(values: HeadValues, exp: i8, alignment: Alignment) -> HeadSpec {
    HeadSpec {
        values,
        exp,
        seed: 1,
        alignment,
    }
}

/// The API seeds.
pub fn api() -> Vec<(&'static str, ApiCase)> {
    let valid = |sizes: [usize; 7]| ApiCase {
        sizes,
        views: [ViewSpec::BSHD; 4],
        lse: LenSpec::EXACT,
        opts: OptSpec::default(),
        merge: None,
        alibi_n: None,
    };
    let with_merge = |mut c: ApiCase, parts: Vec<PartialSpec>, lse: LenSpec| {
        c.merge = Some(MergeSpec { parts, lse });
        c
    };
    let part = |mutation, lse| PartialSpec { mutation, lse };
    let with_alibi = |mut c: ApiCase, n: usize| {
        c.alibi_n = Some(n);
        c
    };
    let with_view = |mut c: ApiCase, n: usize, v: ViewSpec| {
        c.views[n] = v;
        c
    };
    let with_opts = |mut c: ApiCase, o: OptSpec| {
        c.opts = o;
        c
    };
    let len = |kind, extra| LenSpec { kind, extra };
    let mutated = |n: u8, x: usize| ViewSpec {
        mutation: Some((n, x)),
        ..ViewSpec::BSHD
    };
    let bhsd = ViewSpec {
        ctor: Ctor::Bhsd,
        ..ViewSpec::BSHD
    };
    let broadcast_all = ViewSpec {
        ctor: Ctor::New,
        strides: StrideKind::Broadcast,
        broadcast: 0xf,
        ..ViewSpec::BSHD
    };
    let big = 1usize << 63;
    vec![
        ("valid-3x3", valid([1, 3, 1, 1, 3, 2, 2])),
        ("valid-gqa", valid([2, 5, 2, 3, 7, 4, 3])),
        (
            "valid-bhsd",
            with_view(with_view(valid([2, 4, 2, 2, 6, 3, 3]), 0, bhsd), 3, bhsd),
        ),
        (
            "valid-causal",
            with_opts(
                valid([1, 6, 1, 2, 4, 3, 3]),
                OptSpec::causal(CausalKind::BottomRight),
            ),
        ),
        ("n-kv-0", valid([1, 4, 1, 2, 0, 3, 3])),
        ("n-q-0", valid([1, 0, 1, 2, 4, 3, 3])),
        ("batch-0", valid([0, 4, 1, 2, 4, 3, 3])),
        ("d-k-0", valid([1, 4, 1, 1, 4, 0, 3])),
        ("d-v-0-bshd", valid([1, 4, 1, 1, 4, 3, 0])),
        (
            "heads-not-divisible",
            with_view(valid([1, 4, 2, 1, 4, 3, 3]), 0, mutated(2, 3)),
        ),
        ("kv-heads-0", valid([1, 4, 0, 1, 4, 3, 3])),
        (
            "key-batch-mismatch",
            with_view(valid([2, 4, 1, 1, 4, 3, 3]), 1, mutated(0, 1)),
        ),
        (
            "value-seq-mismatch",
            with_view(valid([1, 4, 1, 1, 4, 3, 3]), 2, mutated(1, 5)),
        ),
        (
            "output-dim-mismatch",
            with_view(valid([1, 4, 1, 1, 4, 3, 3]), 3, mutated(3, 4)),
        ),
        (
            "slice-short",
            with_view(
                valid([1, 4, 1, 1, 4, 3, 3]),
                1,
                ViewSpec {
                    len: len(LenKind::Short, 0),
                    ..ViewSpec::BSHD
                },
            ),
        ),
        (
            "slice-long",
            with_view(
                valid([1, 4, 1, 1, 4, 3, 3]),
                2,
                ViewSpec {
                    len: len(LenKind::Long, 5),
                    ..ViewSpec::BSHD
                },
            ),
        ),
        (
            "lse-short",
            ApiCase {
                lse: len(LenKind::Short, 0),
                ..valid([1, 4, 2, 2, 4, 3, 3])
            },
        ),
        (
            "lse-long",
            ApiCase {
                lse: len(LenKind::Long, 1),
                ..valid([1, 4, 2, 2, 4, 3, 3])
            },
        ),
        (
            "scale-nan",
            with_opts(
                valid([1, 2, 1, 1, 2, 2, 2]),
                OptSpec {
                    scale: ScaleKind::Bits,
                    scale_bits: f32::NAN.to_bits(),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "scale-neg-inf",
            with_opts(
                valid([1, 2, 1, 1, 2, 2, 2]),
                OptSpec {
                    scale: ScaleKind::Bits,
                    scale_bits: f32::NEG_INFINITY.to_bits(),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "stride-usize-max",
            with_view(
                valid([2, 2, 1, 1, 2, 2, 2]),
                0,
                ViewSpec::explicit([usize::MAX, 1, 1, 1]),
            ),
        ),
        (
            "stride-overflow-sum",
            with_view(
                valid([1, 2, 1, 1, 2, 2, 2]),
                1,
                ViewSpec::explicit([0, usize::MAX / 2, usize::MAX / 2, 1]),
            ),
        ),
        (
            "dims-usize-max",
            with_view(valid([1, 2, 1, 1, 2, 2, 2]), 2, mutated(0, usize::MAX)),
        ),
        (
            "bshd-stride-overflow",
            with_view(valid([1, 2, 1, 1, 2, 2, 2]), 0, mutated(1, 1 << 40)),
        ),
        (
            "output-stride-zero",
            with_view(
                valid([1, 3, 1, 1, 3, 2, 2]),
                3,
                ViewSpec::explicit([0, 0, 0, 1]),
            ),
        ),
        (
            "output-interleaved",
            with_view(
                valid([1, 3, 1, 1, 3, 2, 2]),
                3,
                ViewSpec::explicit([0, 1, 0, 2]),
            ),
        ),
        (
            "output-padded",
            with_view(
                valid([1, 3, 1, 2, 3, 2, 2]),
                3,
                ViewSpec::explicit([100, 9, 4, 1]),
            ),
        ),
        (
            "output-head-dim-strided",
            with_view(
                valid([1, 3, 1, 1, 3, 2, 2]),
                3,
                ViewSpec::explicit([0, 7, 0, 3]),
            ),
        ),
        (
            "broadcast-q-huge-n-q",
            with_view(
                with_view(valid([1, big, 1, 1, 5, 2, 0]), 0, broadcast_all),
                3,
                ViewSpec::explicit([0, 1, 0, 1]),
            ),
        ),
        (
            "broadcast-q-huge-n-q-causal",
            with_opts(
                with_view(
                    with_view(valid([1, big, 1, 1, 0, 2, 0]), 0, broadcast_all),
                    3,
                    ViewSpec::explicit([0, 1, 0, 1]),
                ),
                OptSpec::causal(CausalKind::BottomRight),
            ),
        ),
        (
            "broadcast-kv-huge-n-kv",
            with_view(
                with_view(valid([1, 2, 1, 1, big, 2, 2]), 1, broadcast_all),
                2,
                broadcast_all,
            ),
        ),
        (
            "broadcast-huge-head-dim",
            with_view(
                with_view(valid([1, 2, 1, 1, 3, usize::MAX, 2]), 0, broadcast_all),
                1,
                broadcast_all,
            ),
        ),
        (
            "empty-output-huge-strides",
            with_view(
                valid([0, 2, 1, 2, 2, 1, 1]),
                3,
                ViewSpec::explicit([0, usize::MAX, usize::MAX, 1]),
            ),
        ),
        (
            "option-kv-lens-wrong-count",
            with_opts(
                valid([2, 4, 1, 1, 4, 3, 3]),
                OptSpec {
                    kv_lens: Some((KvLensKind::WrongCount, 1)),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "option-bias-broadcast",
            with_opts(
                valid([2, 4, 1, 2, 4, 3, 3]),
                OptSpec {
                    bias: Some(TermSpec {
                        size_one: 0b0110,
                        ..TermSpec::plain(Fill::unit(1))
                    }),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "option-mask-bad-dim",
            with_opts(
                valid([2, 4, 1, 2, 4, 3, 3]),
                OptSpec {
                    mask: Some(TermSpec {
                        bad_dim: Some(3),
                        ..TermSpec::plain(Fill::unit(1))
                    }),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "option-sinks-wrong-count",
            with_opts(
                valid([1, 4, 1, 2, 4, 3, 3]),
                OptSpec {
                    sinks: Some(head(HeadValues::WrongCount, 0, Alignment::TopLeft)),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "option-softcap-nan",
            with_opts(
                valid([1, 4, 1, 2, 4, 3, 3]),
                OptSpec {
                    softcap: Some(SoftcapKind::Nan),
                    ..OptSpec::default()
                },
            ),
        ),
        (
            "option-window-huge-n-kv",
            with_opts(
                with_view(
                    with_view(valid([1, 2, 1, 1, big, 2, 2]), 1, broadcast_all),
                    2,
                    broadcast_all,
                ),
                window(1, 1, Alignment::TopLeft, CausalKind::None),
            ),
        ),
        (
            "d-v-0-strided-value",
            with_view(
                with_view(
                    valid([1, 4, 1, 1, 4, 1, 0]),
                    2,
                    ViewSpec::explicit([0, 1, 0, 1]),
                ),
                3,
                ViewSpec::explicit([0, 1, 0, 1]),
            ),
        ),
        (
            "merge-no-partials",
            with_merge(valid([1, 2, 1, 1, 2, 2, 2]), vec![], LenSpec::EXACT),
        ),
        (
            "merge-three-partials",
            with_merge(
                valid([2, 3, 1, 2, 4, 3, 5]),
                vec![part(None, LenSpec::EXACT); 3],
                LenSpec::EXACT,
            ),
        ),
        (
            "merge-partial-dim-mismatch",
            with_merge(
                valid([1, 3, 1, 2, 4, 3, 5]),
                vec![
                    part(None, LenSpec::EXACT),
                    part(Some((3, big)), LenSpec::EXACT),
                ],
                LenSpec::EXACT,
            ),
        ),
        (
            "merge-partial-lse-short",
            with_merge(
                valid([1, 3, 1, 2, 4, 3, 5]),
                vec![part(None, len(LenKind::Short, 0))],
                LenSpec::EXACT,
            ),
        ),
        (
            "merge-empty-view-huge-d-v",
            with_merge(
                valid([1, 0, 1, 1, 4, 3, usize::MAX]),
                vec![part(None, LenSpec::EXACT); 2],
                LenSpec::EXACT,
            ),
        ),
        (
            "merge-empty-view-huge-rows",
            with_merge(
                valid([big, 2, 1, 1, 4, 3, 0]),
                vec![part(None, LenSpec::EXACT)],
                LenSpec::EXACT,
            ),
        ),
        (
            "alibi-slopes-0",
            with_alibi(valid([1, 1, 1, 1, 1, 1, 1]), 0),
        ),
        (
            "alibi-slopes-12",
            with_alibi(valid([1, 1, 1, 1, 1, 1, 1]), 12),
        ),
        (
            "alibi-slopes-4096",
            with_alibi(valid([1, 1, 1, 1, 1, 1, 1]), 4096),
        ),
        (
            "alibi-slopes-huge",
            with_alibi(valid([1, 1, 1, 1, 1, 1, 1]), usize::MAX),
        ),
        (
            "option-softcap-huge",
            with_opts(valid([1, 4, 1, 2, 4, 3, 3]), wide(1, 0, 0, 0, 0)),
        ),
        (
            "option-softcap-tiny",
            with_opts(valid([1, 4, 1, 2, 4, 3, 3]), wide(5, 0, 0, 0, 0)),
        ),
        (
            "option-sink-huge",
            with_opts(valid([1, 4, 1, 2, 4, 3, 3]), wide(0, 2, 0, 0, 1)),
        ),
        (
            "option-sink-negative-huge",
            with_opts(valid([1, 4, 1, 2, 4, 3, 3]), wide(0, 5, 0, 0, 0)),
        ),
        (
            "option-kv-len-usize-max",
            with_opts(valid([2, 4, 1, 2, 4, 3, 3]), wide(0, 0, 0, 1, 1)),
        ),
    ]
}

/// The merge seeds.
pub fn merge() -> Vec<(&'static str, MergeCase)> {
    // Values: SplitMix draws per operand, rounded to the 1/16 grid the target decodes.
    let case = |sizes: [usize; 6], cuts: &[usize], kv_lens: Option<Vec<usize>>, seed: u64| {
        MergeCase::from_fn(sizes, cuts, kv_lens, |op, i| {
            let mut r = SplitMix(seed ^ ((op as u64) << 40) ^ i as u64);
            4.0 * r.unit() as f32
        })
    };
    vec![
        ("one-piece", case([1, 1, 1, 3, 10, 4], &[], None, 1)),
        ("two-pieces", case([1, 1, 1, 4, 20, 8], &[9], None, 2)),
        (
            "empty-pieces-at-the-ends",
            case([1, 1, 2, 5, 12, 3], &[0, 0, 12, 12], None, 3),
        ),
        (
            "four-cuts-gqa",
            case([2, 2, 3, 9, 80, 9], &[1, 17, 40, 79], None, 4),
        ),
        ("no-keys", case([1, 1, 1, 2, 0, 2], &[0], None, 5)),
        (
            "kv-lens-rows-without-keys",
            case([2, 1, 2, 3, 30, 5], &[10, 20], Some(vec![0, 15]), 6),
        ),
        (
            "kv-lens-inside-one-piece",
            case([2, 2, 1, 6, 64, 7], &[32], Some(vec![31, 64]), 7),
        ),
        (
            "extreme-values",
            MergeCase::from_fn([1, 1, 1, 4, 16, 4], &[5, 11], None, |op, i| {
                if (i + op) % 3 == 0 {
                    4.0
                } else {
                    -4.0
                }
            }),
        ),
    ]
}
