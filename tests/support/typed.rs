//! Element types of a case: Q, K/V and the output in f32, f16 or bf16, K/V also in i8 with
//! scales. [`Types`] is drawn by the generators (and decoded from fuzz input: one trailing
//! byte, so inputs written before types existed still decode as all-f32); [`quantize`] turns
//! f32 K/V into i8 values and scales; [`check_typed`] runs the fused kernel and the
//! reference on the typed operands and compares every row against the bound for the output's
//! type.

use super::bytes::{uint, Writer};
use super::contract::{check_against_reference, Outputs, RowFacts, Tally};
use super::layout::{Buffer, Layout};
use super::opts::with_scales;
use super::values::SplitMix;
use arbitrary::{Result, Unstructured};
use sdpa::half::{bf16, f16};
use sdpa::reference::{self, ErrorBound};
use sdpa::{Element, KvElement, Options};

/// An element type of the crate (`sdpa::Element`; `I8` for K/V only, `sdpa::KvElement`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    Bf16,
    I8,
}

const FLOATS: [Elem; 3] = [Elem::F32, Elem::F16, Elem::Bf16];
const KVS: [Elem; 4] = [Elem::F32, Elem::F16, Elem::Bf16, Elem::I8];

/// The element types of Q, of K and V (one type), and of the output of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Types {
    pub q: Elem,
    pub kv: Elem,
    pub out: Elem,
}

impl Types {
    /// Everything f32.
    pub const F32: Types = Types {
        q: Elem::F32,
        kv: Elem::F32,
        out: Elem::F32,
    };

    /// Combination `i` of the 36 (`i < 36`).
    fn combination(i: usize) -> Types {
        Types {
            q: FLOATS[i % 3],
            kv: KVS[(i / 3) % 4],
            out: FLOATS[i / 12],
        }
    }

    /// All f32 in half of the draws; otherwise each of Q, K/V and the output any type.
    pub fn random(rng: &mut SplitMix) -> Types {
        if rng.chance(0.5) {
            return Types::F32;
        }
        Types {
            q: rng.pick(&FLOATS),
            kv: rng.pick(&KVS),
            out: rng.pick(&FLOATS),
        }
    }

    /// One byte: all f32 below 128 (so an input that ends earlier is all f32), else
    /// combination `(byte − 128) mod 36`.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<Types> {
        let x = uint(u, 1)? as usize;
        Ok(match x {
            0..128 => Types::F32,
            _ => Types::combination((x - 128) % 36),
        })
    }

    /// Inverse of [`Types::decode`]; all f32 writes nothing (it is what an input that ends
    /// decodes to), so the inputs written before types existed are unchanged.
    pub fn encode(&self, w: &mut Writer) {
        if let Some(i) = (0..36).find(|&i| Types::combination(i) == *self) {
            if *self != Types::F32 {
                w.uint(128 + i as u64, 1);
            }
        }
    }
}

/// i8 K and V with their scales.
pub struct Quantized {
    pub k: Buffer<i8>,
    pub v: Buffer<i8>,
    pub k_scales: Buffer,
    pub v_scales: Buffer,
}

/// Each of `k` and `v` quantized by [`quantize_as`] at a granularity the shapes choose: per
/// (token, kv head), per (kv head, channel) or per tensor.
pub fn quantize(k: &Buffer, v: &Buffer) -> Quantized {
    let dims = |b: &Buffer| {
        let [d0, d1, h, d] = b.dims;
        match (d1 + d) % 3 {
            0 => [d0, d1, h, 1],
            1 => [1, 1, h, d],
            _ => [1, 1, 1, 1],
        }
    };
    let (k, k_scales) = quantize_as(k, dims(k));
    let (v, v_scales) = quantize_as(v, dims(v));
    Quantized {
        k,
        v,
        k_scales,
        v_scales,
    }
}

/// `b` quantized with one step `s` (`max |x| / 127` over its finite values; NaN → 0, ±∞ →
/// ±127), in `b`'s layout, and contiguous scales of `scale_dims` (which broadcast against
/// `b`'s dims) cycling through `s`, `s/2`, `−s`, `2s` and 0 (a single scale is `s`). The
/// kernel and the reference see the same i8 values and scales; they need not reproduce the
/// f32 values.
pub fn quantize_as(b: &Buffer, scale_dims: [usize; 4]) -> (Buffer<i8>, Buffer) {
    let m = b
        .logical()
        .into_iter()
        .filter(|x| x.is_finite())
        .fold(0.0f32, |m, x| m.max(x.abs()));
    let s = if m > 0.0 { m / 127.0 } else { 1.0 };
    let values = b.map(|x| match x.is_nan() {
        true => 0,
        false => (x / s).round().clamp(-127.0, 127.0) as i8,
    });
    let n: usize = scale_dims.iter().product();
    let cycle = [1.0, 0.5, -1.0, 2.0, 0.0];
    let scales: Vec<f32> = (0..n)
        .map(|i| {
            if n == 1 {
                s
            } else {
                s * cycle[i % cycle.len()]
            }
        })
        .collect();
    (values, Buffer::bshd(scale_dims, &scales))
}

/// The operands of [`check_typed`], as f32.
struct Call<'a> {
    q: &'a Buffer,
    k: &'a Buffer,
    v: &'a Buffer,
    out_layout: Layout,
    opts: &'a Options<'a>,
    label: &'a str,
}

/// Runs `attention_lse` and the reference on `q`, `k`, `v` rounded to `types` (i8 K/V through
/// [`quantize`]) and checks every row against `error_bounds(..).for_output::<O>()`, for inputs
/// that stay finite in every type (the caller's guarantee). Panics on a violation or an
/// error.
pub fn check_typed(
    types: Types,
    q: &Buffer,
    k: &Buffer,
    v: &Buffer,
    out_layout: Layout,
    opts: &Options<'_>,
    label: &str,
) -> Tally {
    let c = Call {
        q,
        k,
        v,
        out_layout,
        opts,
        label,
    };
    match types.q {
        Elem::F16 => by_kv::<f16>(types, &c),
        Elem::Bf16 => by_kv::<bf16>(types, &c),
        _ => by_kv::<f32>(types, &c),
    }
}

fn by_kv<Q: Element>(t: Types, c: &Call<'_>) -> Tally {
    let q = c.q.map(Q::from_f32);
    match t.kv {
        Elem::F16 => by_out::<Q, f16>(
            t,
            c,
            &q,
            &c.k.map(f16::from_f32),
            &c.v.map(f16::from_f32),
            None,
        ),
        Elem::Bf16 => by_out::<Q, bf16>(
            t,
            c,
            &q,
            &c.k.map(bf16::from_f32),
            &c.v.map(bf16::from_f32),
            None,
        ),
        Elem::I8 => {
            let z = quantize(c.k, c.v);
            by_out::<Q, i8>(t, c, &q, &z.k, &z.v, Some((&z.k_scales, &z.v_scales)))
        }
        Elem::F32 => by_out::<Q, f32>(t, c, &q, c.k, c.v, None),
    }
}

fn by_out<Q: Element, KV: KvElement>(
    t: Types,
    c: &Call<'_>,
    q: &Buffer<Q>,
    k: &Buffer<KV>,
    v: &Buffer<KV>,
    scales: Option<(&Buffer, &Buffer)>,
) -> Tally {
    let opts = with_scales(c.opts.clone(), scales);
    match t.out {
        Elem::F16 => run::<Q, KV, f16>(c, q, k, v, &opts),
        Elem::Bf16 => run::<Q, KV, bf16>(c, q, k, v, &opts),
        _ => run::<Q, KV, f32>(c, q, k, v, &opts),
    }
}

fn run<Q: Element, KV: KvElement, O: Element>(
    c: &Call<'_>,
    q: &Buffer<Q>,
    k: &Buffer<KV>,
    v: &Buffer<KV>,
    opts: &Options<'_>,
) -> Tally {
    let label = format!(
        "{} [Q {}, K/V {}, out {}]",
        c.label,
        Q::NAME,
        KV::NAME,
        O::NAME
    );
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let [b, n_q, h, _] = q.dims;
    let dims = [b, n_q, h, v.dims[3]];
    let outputs = |reference_path: bool| {
        let zero = O::from_f32(0.0);
        let mut out = Buffer::from_fn(dims, c.out_layout, zero, |_| zero);
        let mut lse = vec![0.0f32; b * h * n_q];
        let r = match reference_path {
            false => sdpa::attention_lse(&qv, &kv, &vv, &mut out.view_mut(), &mut lse, opts),
            true => reference::attention_lse(&qv, &kv, &vv, &mut out.view_mut(), &mut lse, opts),
        };
        r.unwrap_or_else(|e| panic!("{label}: a valid typed call failed: {e}"));
        Outputs {
            dims,
            out: out.logical().into_iter().map(O::to_f32).collect(),
            lse,
        }
    };
    let bounds: Vec<ErrorBound> = reference::error_bounds(&qv, &kv, &vv, opts)
        .unwrap_or_else(|e| panic!("{label}: bounds of a valid call: {e}"))
        .into_iter()
        .map(ErrorBound::for_output::<O>)
        .collect();
    let (fused, reference) = (outputs(false), outputs(true));
    check_against_reference(&fused, &reference, &bounds, |_| RowFacts::FINITE, &label)
}
