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

/// A sequence of the schedule.
struct Seq<T> {
    id: SeqId,
    prompt: usize,
    /// Tokens when it finishes.
    total: usize,
    /// Tokens in the cache.
    len: usize,
    /// The test's dense caches, one per layer.
    dense: Vec<Dense<T>>,
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
    let mut seqs: Vec<Seq<T>> = Vec::new();
    let mut freed_pages: Vec<u32> = Vec::new();
    for step in 0..8 {
        for &(arrival, prompt, total) in &schedule {
            if arrival == step {
                let dense = (0..LAYERS).map(|_| Dense::new()).collect();
                seqs.push(Seq {
                    id: cache.add_sequence(),
                    prompt,
                    total,
                    len: 0,
                    dense,
                });
            }
        }
        // Rows: a prompt chunk or one decode row; sequence 1 sits step 2 out.
        let batch: Vec<(SeqId, usize)> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n = match s.len < s.prompt {
                    true => (s.prompt - s.len).min(CHUNK),
                    false => 1,
                };
                (s.id, if i == 1 && step == 2 { 0 } else { n })
            })
            .collect();
        let total: usize = batch.iter().map(|b| b.1).sum();
        let free_before = cache.free_pages();
        let mut st = cache.begin_step(&batch, attn, rope)?;
        let cu = st.cu_seqlens_q().to_vec();
        let positions: Vec<u32> = seqs
            .iter()
            .zip(&batch)
            .flat_map(|(s, &(_, n))| (s.len..s.len + n).map(|t| t as u32))
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
                let dense = &mut s.dense[layer];
                let rows = r0 * ROW..(r0 + n) * ROW;
                dense.append(&k_data[rows.clone()], &v_data[rows], s.len, rope.as_ref());
                if n == 0 {
                    continue;
                }
                let len = s.len + n;
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
                            let at = format!("seq {b} row {i} head {h} channel {c}");
                            assert!(err <= bound, "{what}: {at}: {got} vs {exp} ({bound:e})");
                        }
                    }
                }
            }
        }
        st.finish()?;
        // Pages: the step took what its sequences' new tokens needed.
        let held: usize = seqs
            .iter()
            .map(|s| cache.block_table(s.id).unwrap().len())
            .sum();
        assert_eq!(cache.free_pages() + held, PAGES);
        assert!(cache.free_pages() <= free_before);
        for (s, &(_, n)) in seqs.iter_mut().zip(&batch) {
            s.len += n;
            assert_eq!(cache.seq_len(s.id)?, s.len);
            assert_eq!(cache.block_table(s.id)?.len(), s.len.div_ceil(PAGE));
            for layer in 0..LAYERS {
                let (k, v) = cache.sequence_kv(layer, s.id)?;
                assert_eq!(k.dims(), &[1, s.len, H_KV, D]);
                let (want_k, want_v) = s.dense[layer].values(s.len);
                assert_eq!(f32s(&k)?, want_k, "step {step} layer {layer}: cached K");
                assert_eq!(f32s(&v)?, want_v, "step {step} layer {layer}: cached V");
            }
        }
        // Finished sequences give their pages back; a later one takes them.
        let mut i = 0;
        while i < seqs.len() {
            if seqs[i].len < seqs[i].total {
                i += 1;
                continue;
            }
            let id = seqs.remove(i).id;
            freed_pages = cache.block_table(id)?.to_vec();
            let free = cache.free_pages();
            cache.free_sequence(id)?;
            assert_eq!(cache.free_pages(), free + freed_pages.len());
            assert!(cache.seq_len(id).is_err());
        }
        if step == 5 {
            // Sequence 3 arrived at step 5 after sequence 0 was freed: its pages are 0's.
            let id = seqs.last().unwrap().id;
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

/// `r` is an error whose message contains `what`.
fn fails<T: std::fmt::Debug>(r: Result<T>, what: &str) {
    match r {
        Ok(x) => panic!("expected an error with {what:?}, got {x:?}"),
        Err(e) => assert!(e.to_string().contains(what), "{e} lacks {what:?}"),
    }
}

fn zeros(dims: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::zeros(dims, dtype, &Device::Cpu)
}

#[test]
fn bad_configs_are_errors() {
    let c = config(KvType::F32);
    fails(
        PagedKvCache::new(PagedKvConfig { page_size: 0, ..c }),
        "page_size must be positive",
    );
    fails(
        PagedKvCache::new(PagedKvConfig { layers: 0, ..c }),
        "layers must be positive",
    );
    fails(
        PagedKvCache::new(PagedKvConfig { heads: 3, ..c }),
        "multiple of kv heads",
    );
    let huge = PagedKvConfig {
        pages: 1 << 20,
        page_size: 1 << 20,
        d_k: 1 << 30,
        ..c
    };
    fails(PagedKvCache::new(huge), "overflow");
    #[cfg(target_pointer_width = "64")]
    fails(
        PagedKvCache::new(PagedKvConfig {
            pages: (1 << 32) + 1,
            ..c
        }),
        "2^32 pages",
    );
}

#[test]
fn unknown_and_repeated_sequences_are_errors() -> Result<()> {
    let mut cache = PagedKvCache::new(config(KvType::F16))?;
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    cache.free_sequence(a)?;
    assert_eq!(cache.sequences(), 1);
    let causal = Attention::new().causal(Alignment::BottomRight);
    fails(
        cache.begin_step(&[(b, 1), (a, 1)], causal, None),
        "not in the cache",
    );
    fails(cache.begin_step(&[(b, 1), (b, 2)], causal, None), "twice");
    fails(cache.free_sequence(a), "not in the cache");
    fails(cache.seq_len(a), "not in the cache");
    fails(cache.block_table(a), "not in the cache");
    fails(cache.sequence_kv(0, a), "not in the cache");
    fails(
        cache.sequence_kv(LAYERS, b),
        "layer 2 of a cache of 2 layers",
    );
    // Nothing was taken.
    assert_eq!((cache.free_pages(), cache.seq_len(b)?), (PAGES, 0));
    assert!(cache.block_table(b)?.is_empty());
    Ok(())
}

#[test]
fn running_out_of_pages_changes_nothing() -> Result<()> {
    let mut cache = PagedKvCache::new(PagedKvConfig {
        pages: 4,
        ..config(KvType::I8)
    })?;
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let causal = Attention::new().causal(Alignment::BottomRight);
    // 4 pages of 4 tokens: 9 + 8 tokens need 5.
    fails(
        cache.begin_step(&[(a, 9), (b, 8)], causal, None),
        "out of pages: the step needs 5 new pages, 4 are free",
    );
    // Absurd counts are errors before anything is sized from them.
    fails(
        cache.begin_step(&[(a, 1 << 31)], causal, None),
        "needs 536870912 new pages",
    );
    #[cfg(target_pointer_width = "64")]
    fails(
        cache.begin_step(&[(a, 1 << 40)], causal, None),
        "positions past u32::MAX",
    );
    fails(
        cache.begin_step(&[(a, 1), (b, usize::MAX)], causal, None),
        "overflow usize",
    );
    assert_eq!((cache.free_pages(), cache.seq_len(a)?), (4, 0));
    assert!(cache.block_table(a)?.is_empty());
    // 8 + 8 fit exactly.
    let mut step = cache.begin_step(&[(a, 8), (b, 8)], causal, None)?;
    for layer in 0..LAYERS {
        let kv = Tensor::ones((16, H_KV, D), DType::F32, &Device::Cpu)?;
        step.append(layer, &kv, &kv)?;
    }
    step.finish()?;
    assert_eq!(cache.free_pages(), 0);
    assert_eq!(
        (cache.block_table(a)?, cache.block_table(b)?),
        (&[0, 1][..], &[2, 3][..])
    );
    fails(
        cache.begin_step(&[(a, 1)], causal, None),
        "needs 1 new pages, 0 are free",
    );
    assert_eq!((cache.seq_len(a)?, cache.block_table(a)?.len()), (8, 2));
    // b's pages go back; a takes the first of them.
    cache.free_sequence(b)?;
    let mut step = cache.begin_step(&[(a, 1)], causal, None)?;
    for layer in 0..LAYERS {
        let kv = Tensor::ones((1, H_KV, D), DType::F32, &Device::Cpu)?;
        step.append(layer, &kv, &kv)?;
    }
    step.finish()?;
    assert_eq!(cache.block_table(a)?, &[0, 1, 2]);
    assert_eq!(cache.free_pages(), 1);
    Ok(())
}

#[test]
fn bad_rows_and_queries_are_errors_and_write_nothing() -> Result<()> {
    let mut cache = PagedKvCache::new(config(KvType::I8))?;
    let a = cache.add_sequence();
    let causal = Attention::new().causal(Alignment::BottomRight);
    let mut step = cache.begin_step(&[(a, 3)], causal, None)?;
    let f32_ = DType::F32;
    let kv = zeros(&[3, H_KV, D], f32_)?;
    fails(
        step.append(LAYERS, &kv, &kv),
        "layer 2 of a cache of 2 layers",
    );
    fails(
        step.attention(0, &zeros(&[1, 3, H, D], f32_)?, None),
        "append this step's K and V before attention",
    );
    fails(
        step.append(0, &zeros(&[2, H_KV, D], f32_)?, &kv),
        "k must be [3, 2, 8] (rows, kv heads, d_k), got [2, 2, 8]",
    );
    fails(
        step.append(0, &kv, &zeros(&[1, 4, H_KV, D], f32_)?),
        "got [1, 4, 2, 8]",
    );
    fails(
        step.append(0, &zeros(&[3, H_KV * D], f32_)?, &kv),
        "k must be [rows, heads, dim]",
    );
    fails(
        step.append(0, &zeros(&[2, 3, H_KV, D], f32_)?, &kv),
        "k must be [rows, heads, dim]",
    );
    fails(
        step.append(0, &zeros(&[3, 1, D], f32_)?, &kv),
        "k must be [3, 2, 8] (rows, kv heads, d_k), got [3, 1, 8]",
    );
    fails(
        step.append(0, &kv, &zeros(&[1, 3, H_KV, 4], f32_)?),
        "v must be [3, 2, 8] (rows, kv heads, d_v), got [1, 3, 2, 4]",
    );
    fails(
        step.append(0, &kv, &zeros(&[3, H_KV, D], DType::F16)?),
        "one dtype",
    );
    fails(
        step.append(
            0,
            &zeros(&[3, H_KV, D], DType::U32)?,
            &zeros(&[3, H_KV, D], DType::U32)?,
        ),
        "f32, f16 and bf16",
    );
    // An i8 cache cannot hold NaN: an error, nothing written, the layer still to append.
    let nan = Tensor::full(f32::NAN, (3, H_KV, D), &Device::Cpu)?;
    fails(step.append(0, &nan, &kv), "cannot be stored in an i8 cache");
    let ones = Tensor::ones((3, H_KV, D), f32_, &Device::Cpu)?;
    step.append(0, &ones, &ones)?;
    fails(step.append(0, &ones, &ones), "layer 0 was already appended");
    fails(
        step.attention(0, &zeros(&[1, 3, H + 1, D], f32_)?, None),
        "q must be [3, 4, 8] (rows, heads, d_k), got [1, 3, 5, 8]",
    );
    fails(
        step.attention(0, &zeros(&[1, 2, H, D], f32_)?, None),
        "got [1, 2, 4, 8]",
    );
    fails(
        step.attention(0, &zeros(&[1, 3, H, D], DType::U8)?, None),
        "f32, f16 and bf16",
    );
    let bad_sinks = Tensor::zeros(H + 1, f32_, &Device::Cpu)?;
    fails(
        step.attention(0, &zeros(&[1, 3, H, D], f32_)?, Some(&bad_sinks)),
        "sinks: length is 5, expected 4",
    );
    fails(step.rotate(&zeros(&[1, 3, H, D], f32_)?), "no rope");
    // Every value 1: each output is 1, whatever the weights; rank 3 in, rank 3 out.
    let out = step.attention(
        0,
        &Tensor::ones((3, H, D), DType::BF16, &Device::Cpu)?,
        None,
    )?;
    assert_eq!((out.dims(), out.dtype()), (&[3, H, D][..], DType::BF16));
    assert!(f32s(&out)?.iter().all(|&x| x == 1.0));
    // Layer 1 never appended: finishing fails and rolls the step back.
    fails(step.finish(), "layer 1 was not appended");
    assert_eq!((cache.seq_len(a)?, cache.free_pages()), (0, PAGES));
    Ok(())
}

#[test]
fn bad_options_and_ropes_fail_at_begin_step() -> Result<()> {
    let mut cache = PagedKvCache::new(config(KvType::F32))?;
    let a = cache.add_sequence();
    let causal = Attention::new().causal(Alignment::BottomRight);
    let odd = Rope::new(RopeStyle::Halves, 7, 10_000.0);
    fails(
        cache.begin_step(&[(a, 5)], causal, Some(odd)),
        "rotary dimension",
    );
    let wide = Rope::new(RopeStyle::Halves, 2 * D, 10_000.0);
    fails(
        cache.begin_step(&[(a, 5)], causal, Some(wide)),
        "rotary dimension",
    );
    // Tables for 4 positions; the step's reach 0 .. 5.
    let table = vec![1.0f32; 4 * D / 2];
    let short = Rope::with_tables(RopeStyle::Halves, D, &table, &table);
    fails(
        cache.begin_step(&[(a, 5)], causal, Some(short)),
        "past the rows",
    );
    fails(
        cache.begin_step(&[(a, 5)], causal.softcap(-1.0), None),
        "softcap",
    );
    let mixed = causal.sliding_window(2, 0, Alignment::TopLeft);
    fails(cache.begin_step(&[(a, 5)], mixed, None), "same alignment");
    assert_eq!((cache.seq_len(a)?, cache.free_pages()), (0, PAGES));
    // A step dropped with a layer missing is rolled back too; one with every layer commits.
    let mut step = cache.begin_step(&[(a, 5)], causal, None)?;
    step.append(
        0,
        &zeros(&[5, H_KV, D], DType::F32)?,
        &zeros(&[5, H_KV, D], DType::F32)?,
    )?;
    drop(step);
    assert_eq!((cache.seq_len(a)?, cache.free_pages()), (0, PAGES));
    assert!(cache.block_table(a)?.is_empty());
    let mut step = cache.begin_step(&[(a, 5)], causal, None)?;
    for layer in 0..LAYERS {
        step.append(
            layer,
            &zeros(&[5, H_KV, D], DType::F32)?,
            &zeros(&[5, H_KV, D], DType::F32)?,
        )?;
    }
    drop(step);
    assert_eq!((cache.seq_len(a)?, cache.free_pages()), (5, PAGES - 2));
    Ok(())
}

#[test]
fn an_empty_step_is_fine() -> Result<()> {
    let mut cache = PagedKvCache::new(config(KvType::BF16))?;
    let a = cache.add_sequence();
    let causal = Attention::new().causal(Alignment::BottomRight);
    for batch in [&[][..], &[(a, 0)][..]] {
        let mut step = cache.begin_step(batch, causal, None)?;
        for layer in 0..LAYERS {
            let kv = zeros(&[0, H_KV, D], DType::F32)?;
            step.append(layer, &kv, &kv)?;
            let out = step.attention(layer, &zeros(&[1, 0, H, D], DType::F32)?, None)?;
            assert_eq!(out.dims(), &[1, 0, H, D]);
        }
        step.finish()?;
    }
    assert_eq!((cache.seq_len(a)?, cache.free_pages()), (0, PAGES));
    Ok(())
}

#[test]
fn the_cache_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PagedKvCache>();
    send_sync::<SeqId>();
}
