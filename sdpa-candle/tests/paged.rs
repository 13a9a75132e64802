//! `PagedKvCache` against a dense recomputation: a few steps of chunked prefill and decode for
//! sequences that arrive, sit a step out, finish and give their pages to a later one, over two
//! layers, for f32, f16, bf16 and i8 caches. Every step checks:
//! * each sequence's output rows against `sdpa::reference::attention` on that sequence alone,
//!   over the test's own dense K/V (the same rows written by `sdpa::append` into a dense cache
//!   at the sequence's positions), within `reference::error_bounds` (for Q's type);
//! * `PagedStep::rotate` against `Rope::apply` on the test's copy of Q (bit for bit);
//! * after the step, `PagedKvCache::sequence_kv` against the dense cache (bit for bit).
//!
//! Then the error cases: nothing changes in the cache when a call fails.

use candle_core::{DType, Device, Result, Tensor, WithDType};
use sdpa::half::{bf16, f16};
use sdpa::{reference, Alignment, Element, KvElement, Options, Rope, RopeStyle, TensorMut};
use sdpa_candle::{Attention, KvType, PagedKvCache, PagedKvConfig, SeqId};

const H: usize = 4; // query heads
const H_KV: usize = 2; // kv heads
const D: usize = 8; // head size
const PAGE: usize = 4; // tokens per page
const PAGES: usize = 16;
const LAYERS: usize = 2;
const ROW: usize = H_KV * D; // one token's K (or V)
const CAP: usize = 32; // tokens of the test's dense caches
const CHUNK: usize = 4; // most prompt tokens per sequence per step

fn config(kv_type: KvType) -> PagedKvConfig {
    PagedKvConfig {
        layers: LAYERS,
        pages: PAGES,
        page_size: PAGE,
        heads: H,
        kv_heads: H_KV,
        d_k: D,
        d_v: D,
        kv_type,
    }
}

/// splitmix64: deterministic values in [−1, 1).
struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 2.0 * self.unit()).collect()
    }
}

/// A candle tensor of type `S` from f32 values, and its elements as `S`.
fn typed<S: WithDType>(vals: Vec<f32>, dims: &[usize]) -> Result<(Tensor, Vec<S>)> {
    let t = Tensor::from_vec(vals, dims, &Device::Cpu)?.to_dtype(S::DTYPE)?;
    let data = t.flatten_all()?.to_vec1::<S>()?;
    Ok((t, data))
}

fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// The test's dense copy of one (layer, sequence): `[1, CAP, H_kv, D]` of `T` (and i8 scales).
struct Dense<T> {
    k: Vec<T>,
    v: Vec<T>,
    scales: Option<(Vec<f32>, Vec<f32>)>,
}

impl<T: KvElement + Default> Dense<T> {
    fn new() -> Self {
        Dense {
            k: vec![T::default(); CAP * ROW],
            v: vec![T::default(); CAP * ROW],
            scales: T::QUANTIZED.then(|| (vec![0.0; CAP * H_KV], vec![0.0; CAP * H_KV])),
        }
    }

    /// `k` and `v` rows (`[1, n, H_kv, D]`) appended at positions `from .. from + n`.
    fn append<S: Element>(&mut self, k: &[S], v: &[S], from: usize, rope: Option<&Rope<'_>>) {
        let n = k.len() / ROW;
        let dims = [1, CAP, H_KV, D];
        let (kn, vn) = (
            sdpa::Tensor::bshd(k, [1, n, H_KV, D]).unwrap(),
            sdpa::Tensor::bshd(v, [1, n, H_KV, D]).unwrap(),
        );
        let mut kc = TensorMut::bshd(&mut self.k, dims).unwrap();
        let mut vc = TensorMut::bshd(&mut self.v, dims).unwrap();
        let mut sc = self.scales.as_mut().map(|(ks, vs)| {
            let s = [1, CAP, H_KV, 1];
            (
                TensorMut::bshd(ks, s).unwrap(),
                TensorMut::bshd(vs, s).unwrap(),
            )
        });
        let slots: Vec<usize> = (from..from + n).collect();
        let positions: Vec<u32> = slots.iter().map(|&p| p as u32).collect();
        let scales = sc.as_mut().map(|(k, v)| (k, v));
        let rope = rope.map(|r| (r, &positions[..]));
        sdpa::append(&kn, &vn, &mut kc, &mut vc, &slots, scales, rope).unwrap();
    }

    /// The first `len` tokens as the cache's `sequence_kv` returns them (i8: `x · scale`).
    fn values(&self, len: usize) -> (Vec<f32>, Vec<f32>) {
        let deq = |x: &[T], s: Option<&Vec<f32>>| -> Vec<f32> {
            let x = x[..len * ROW].iter().enumerate();
            x.map(|(i, &x)| match s {
                Some(s) => x.to_f64() as f32 * s[i / D],
                None => x.to_f64() as f32,
            })
            .collect()
        };
        let (ks, vs) = match &self.scales {
            Some((ks, vs)) => (Some(ks), Some(vs)),
            None => (None, None),
        };
        (deq(&self.k, ks), deq(&self.v, vs))
    }
}

/// The options a run passes through, besides causal (bottom-right).
#[derive(Debug, Clone, Copy, Default)]
struct Extras {
    rope: bool,
    softcap: Option<f32>,
    window: Option<usize>,
    sinks: bool,
}

/// Runs the schedule with a cache of `T` (`kv_type`) fed rows and queries of type `S`.
fn run<T: KvElement + Default, S: Element + WithDType>(
    kv_type: KvType,
    extras: Extras,
    seed: u64,
) -> Result<()> {
    let mut rng = Rng(seed);
    let mut cache = PagedKvCache::new(config(kv_type))?;
    let rope = Rope::new(RopeStyle::Halves, D, 10_000.0);
    let rope = extras.rope.then_some(rope);
    let mut attn = Attention::new().causal(Alignment::BottomRight);
    if let Some(cap) = extras.softcap {
        attn = attn.softcap(cap);
    }
    if let Some(w) = extras.window {
        attn = attn.sliding_window(w, 0, Alignment::BottomRight);
    }
    // (arrival step, prompt, total): 0 finishes after step 4 and gives its pages to 3.
    let schedule = [(0, 9, 11), (0, 3, 10), (1, 14, 19), (5, 5, 8)];
    // (id, prompt, total, len, dense caches per layer)
    let mut seqs: Vec<(SeqId, usize, usize, usize, Vec<Dense<T>>)> = Vec::new();
    let mut freed_pages: Vec<u32> = Vec::new();
    for step in 0..8 {
        for &(arrival, prompt, total) in &schedule {
            if arrival == step {
                let dense = (0..LAYERS).map(|_| Dense::new()).collect();
                seqs.push((cache.add_sequence(), prompt, total, 0, dense));
            }
        }
        // Rows: a prompt chunk or one decode row; sequence 1 sits step 2 out.
        let batch: Vec<(SeqId, usize)> = seqs
            .iter()
            .enumerate()
            .map(|(i, &(id, prompt, _, len, _))| {
                let n = match len < prompt {
                    true => (prompt - len).min(CHUNK),
                    false => 1,
                };
                (id, if i == 1 && step == 2 { 0 } else { n })
            })
            .collect();
        let total: usize = batch.iter().map(|b| b.1).sum();
        let free_before = cache.free_pages();
        let mut st = cache.begin_step(&batch, attn, rope)?;
        let cu = st.cu_seqlens_q().to_vec();
        let positions: Vec<u32> = seqs
            .iter()
            .zip(&batch)
            .flat_map(|(s, &(_, n))| (s.3..s.3 + n).map(|t| t as u32))
            .collect();
        assert_eq!(st.positions(), &positions[..], "step {step}");
        for layer in 0..LAYERS {
            let what = format!(
                "{} cache, {} rows, step {step} layer {layer}",
                T::NAME,
                S::NAME
            );
            let (k, k_data) = typed::<S>(rng.vals(total * ROW), &[total, H_KV, D])?;
            let (v, v_data) = typed::<S>(rng.vals(total * ROW), &[total, H_KV, D])?;
            let (q, mut q_data) = typed::<S>(rng.vals(total * H * D), &[1, total, H, D])?;
            // Layer 1's K/V go in as strided rank-4 views (a transposed [1, H_kv, n, D]).
            let (k, v) = match layer {
                0 => (k, v),
                _ => {
                    let strided = |t: &Tensor| -> Result<Tensor> {
                        t.unsqueeze(0)?
                            .transpose(1, 2)?
                            .contiguous()?
                            .transpose(1, 2)
                    };
                    (strided(&k)?, strided(&v)?)
                }
            };
            st.append(layer, &k, &v)?;
            let q = match &rope {
                Some(rope) => {
                    let rotated = st.rotate(&q)?;
                    let mut view = TensorMut::bshd(&mut q_data, [1, total, H, D]).unwrap();
                    rope.apply(&mut view, &positions).unwrap();
                    let got = rotated.flatten_all()?.to_vec1::<S>()?;
                    let same = got
                        .iter()
                        .zip(&q_data)
                        .all(|(a, b)| a.to_f32() == b.to_f32());
                    assert!(same, "{what}: rotate differs from Rope::apply");
                    rotated
                }
                None => q,
            };
            let sinks: Vec<f32> = rng.vals(H);
            let sinks_t = Tensor::from_vec(sinks.clone(), H, &Device::Cpu)?;
            let out = st.attention(layer, &q, extras.sinks.then_some(&sinks_t))?;
            assert_eq!(out.dims(), &[1, total, H, D]);
            assert_eq!(out.dtype(), <S as WithDType>::DTYPE);
            let out = f32s(&out)?;
            for (b, s) in seqs.iter_mut().enumerate() {
                let (r0, n) = (cu[b], cu[b + 1] - cu[b]);
                let dense = &mut s.4[layer];
                let rows = r0 * ROW..(r0 + n) * ROW;
                dense.append(&k_data[rows.clone()], &v_data[rows], s.3, rope.as_ref());
                if n == 0 {
                    continue;
                }
                let len = s.3 + n;
                let qs =
                    sdpa::Tensor::bshd(&q_data[r0 * H * D..][..n * H * D], [1, n, H, D]).unwrap();
                let kd = sdpa::Tensor::bshd(&dense.k[..len * ROW], [1, len, H_KV, D]).unwrap();
                let vd = sdpa::Tensor::bshd(&dense.v[..len * ROW], [1, len, H_KV, D]).unwrap();
                let mut opts = Options::new().causal(Alignment::BottomRight);
                if let Some(cap) = extras.softcap {
                    opts = opts.softcap(cap);
                }
                if let Some(w) = extras.window {
                    opts = opts.sliding_window(w, 0, Alignment::BottomRight);
                }
                if extras.sinks {
                    opts = opts.sinks(&sinks);
                }
                if let Some((ks, vs)) = &dense.scales {
                    let s = [1, len, H_KV, 1];
                    opts = opts.kv_scales(
                        sdpa::Tensor::bshd(&ks[..len * H_KV], s).unwrap(),
                        sdpa::Tensor::bshd(&vs[..len * H_KV], s).unwrap(),
                    );
                }
                let mut want = vec![0.0f32; n * H * D];
                let mut wv = TensorMut::bshd(&mut want, [1, n, H, D]).unwrap();
                reference::attention(&qs, &kd, &vd, &mut wv, &opts).unwrap();
                let bounds = reference::error_bounds(&qs, &kd, &vd, &opts).unwrap();
                for h in 0..H {
                    for i in 0..n {
                        let bound = bounds[h * n + i].for_output::<S>().out;
                        for c in 0..D {
                            let at = (i * H + h) * D + c;
                            let (got, exp) = (out[r0 * H * D + at], want[at]);
                            let err = (f64::from(got) - f64::from(exp)).abs();
                            assert!(
                                err <= bound,
                                "{what}: seq {b} row {i} head {h} channel {c}: {got} vs {exp} (bound {bound:e})"
                            );
                        }
                    }
                }
            }
        }
        st.finish()?;
        // Pages: the step took what its sequences' new tokens needed.
        let held: usize = seqs
            .iter()
            .map(|s| cache.block_table(s.0).unwrap().len())
            .sum();
        assert_eq!(cache.free_pages() + held, PAGES);
        assert!(cache.free_pages() <= free_before);
        for (s, &(_, n)) in seqs.iter_mut().zip(&batch) {
            s.3 += n;
            assert_eq!(cache.seq_len(s.0)?, s.3);
            assert_eq!(cache.block_table(s.0)?.len(), s.3.div_ceil(PAGE));
            for layer in 0..LAYERS {
                let (k, v) = cache.sequence_kv(layer, s.0)?;
                assert_eq!(k.dims(), &[1, s.3, H_KV, D]);
                let (want_k, want_v) = s.4[layer].values(s.3);
                assert_eq!(f32s(&k)?, want_k, "step {step} layer {layer}: cached K");
                assert_eq!(f32s(&v)?, want_v, "step {step} layer {layer}: cached V");
            }
        }
        // Finished sequences give their pages back; a later one takes them.
        let mut i = 0;
        while i < seqs.len() {
            if seqs[i].3 < seqs[i].2 {
                i += 1;
                continue;
            }
            let (id, ..) = seqs.remove(i);
            freed_pages = cache.block_table(id)?.to_vec();
            let free = cache.free_pages();
            cache.free_sequence(id)?;
            assert_eq!(cache.free_pages(), free + freed_pages.len());
            assert!(cache.seq_len(id).is_err());
        }
        if step == 5 {
            // Sequence 3 arrived at step 5 after sequence 0 was freed: its pages are 0's.
            let id = seqs.last().unwrap().0;
            let pages = cache.block_table(id)?;
            assert_eq!(
                pages,
                &freed_pages[..pages.len()],
                "the freed pages are reused"
            );
        }
    }
    Ok(())
}

#[test]
fn chunked_prefill_and_decode_match_the_dense_reference() -> Result<()> {
    let rope = Extras {
        rope: true,
        ..Extras::default()
    };
    run::<f32, f32>(KvType::F32, rope, 1)?;
    run::<f16, f16>(KvType::F16, rope, 2)?;
    run::<f16, f32>(KvType::F16, rope, 3)?;
    run::<bf16, bf16>(KvType::BF16, rope, 4)?;
    run::<i8, f32>(KvType::I8, rope, 5)?;
    run::<i8, f16>(KvType::I8, Extras::default(), 6)
}

#[test]
fn softcap_window_and_sinks_pass_through() -> Result<()> {
    let extras = Extras {
        rope: true,
        softcap: Some(3.0),
        window: Some(5),
        sinks: true,
    };
    run::<f32, f32>(KvType::F32, extras, 7)?;
    run::<i8, bf16>(KvType::I8, extras, 8)
}
