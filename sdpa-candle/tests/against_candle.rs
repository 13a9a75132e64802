//! sdpa-candle against attention written with candle's own ops (`matmul`, masks,
//! `softmax_last_dim`), on small Llama- and Mistral-like shapes: prefill, and decode over KV
//! caches grown with `Tensor::cat` (candle-transformers' Llama) and with `slice_set`
//! (`candle_nn::kv_cache::KvCache`, whose views are strided, not contiguous).

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::kv_cache::KvCache;
use sdpa_candle::{flash_attn, sdpa, Alignment, Attention};

const TOL: f32 = 1e-4;

/// candle-transformers' `repeat_kv`: `[B, H_kv, S, D]` → `[B, H_kv·rep, S, D]`.
fn repeat_kv(x: &Tensor, rep: usize) -> Result<Tensor> {
    if rep == 1 {
        return Ok(x.clone());
    }
    let (b, h_kv, s, d) = x.dims4()?;
    Tensor::cat(&vec![x; rep], 2)?.reshape((b, h_kv * rep, s, d))
}

/// Additive mask `[n_q, n_kv]`: 0 where row `i` sees key `j`, −∞ elsewhere; bottom-right
/// causal, optionally with Mistral's sliding window (`j + window > i + off`).
fn causal_mask(n_q: usize, n_kv: usize, window: Option<usize>) -> Result<Tensor> {
    let off = n_kv - n_q;
    let mask: Vec<f32> = (0..n_q)
        .flat_map(|i| {
            (0..n_kv).map(move |j| {
                let visible = j <= i + off && window.is_none_or(|w| j + w > i + off);
                if visible {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (n_q, n_kv), &Device::Cpu)
}

/// The unfused attention of candle-transformers: repeat_kv, `Q·Kᵀ·scale + mask`, softmax, `·V`.
fn unfused(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (_, h, _, d) = q.dims4()?;
    let rep = h / k.dim(1)?;
    let k = repeat_kv(&k.contiguous()?, rep)?;
    let v = repeat_kv(&v.contiguous()?, rep)?;
    let att = (q.contiguous()?.matmul(&k.t()?)? / (d as f64).sqrt())?;
    let att = match mask {
        Some(m) => att.broadcast_add(m)?,
        None => att,
    };
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&v)
}

/// [`unfused`] with the causal mask (bottom-right) on the f32 values of half-precision inputs.
fn unfused_causal_f32(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let mask = causal_mask(q.dim(2)?, k.dim(2)?, None)?;
    unfused(&f32(q)?, &f32(k)?, &f32(v)?, Some(&mask))
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    assert_eq!(a.dims(), b.dims());
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()
}

/// Deterministic pseudo-random values in [-2, 2) (candle's CPU rng cannot be seeded).
fn rand(shape: (usize, usize, usize), seed: u64) -> Result<Tensor> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n = shape.0 * shape.1 * shape.2;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 22) as f32 - 2.0
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu)
}

/// Q, K, V as a model makes them: a `[B, S, heads·D]` projection reshaped and transposed to
/// `[B, heads, S, D]` (a strided view, not contiguous).
fn projections(
    b: usize,
    s: usize,
    h: usize,
    h_kv: usize,
    d: usize,
    seed: u64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let heads = |t: Tensor, n: usize| t.reshape((b, s, n, d))?.transpose(1, 2);
    let q = heads(rand((b, s, h * d), seed)?, h)?;
    let k = heads(rand((b, s, h_kv * d), seed + 1000)?, h_kv)?;
    let v = heads(rand((b, s, h_kv * d), seed + 2000)?, h_kv)?;
    assert!(s == 1 || !q.is_contiguous());
    Ok((q, k, v))
}

#[test]
fn llama_like_gqa_prefill() -> Result<()> {
    // Llama 3 heads ratio (32/8) scaled down: 8 query heads, 2 key/value heads, d = 64.
    let (b, s, h, h_kv, d) = (2, 37, 8, 2, 64);
    let (q, k, v) = projections(b, s, h, h_kv, d, 1)?;
    let scale = 1.0 / (d as f32).sqrt();
    let want = unfused(&q, &k, &v, Some(&causal_mask(s, s, None)?))?;

    let got = sdpa(&q, &k, &v, None, true, scale, 1.0)?;
    assert!(
        max_diff(&got, &want)? < TOL,
        "sdpa: {}",
        max_diff(&got, &want)?
    );

    // The same causal mask given as candle-transformers' Llama makes it: u8, 1 = hidden.
    let hidden: Vec<u8> = (0..s)
        .flat_map(|i| (0..s).map(move |j| u8::from(j > i)))
        .collect();
    let hidden = Tensor::from_vec(hidden, (s, s), &Device::Cpu)?;
    let got = Attention::new().forward(&q, &k, &v, Some(&hidden))?;
    assert!(max_diff(&got, &want)? < TOL);

    // And as an additive f32 mask broadcast to [B, 1, S, S] (stride 0 on heads).
    let additive = causal_mask(s, s, None)?.expand((b, 1, s, s))?;
    let got = sdpa(&q, &k, &v, Some(&additive), false, scale, 1.0)?;
    assert!(max_diff(&got, &want)? < TOL);

    // flash_attn's [B, S, H, D] signature: the same numbers, transposed.
    let got = flash_attn(
        &q.transpose(1, 2)?,
        &k.transpose(1, 2)?,
        &v.transpose(1, 2)?,
        scale,
        true,
    )?;
    assert!(max_diff(&got.transpose(1, 2)?, &want)? < TOL);
    Ok(())
}

#[test]
fn mistral_like_sliding_window_prefill() -> Result<()> {
    // Mistral: 4 query heads per key/value head and a sliding window (4096 there, 8 here).
    let (b, s, h, h_kv, d, w) = (1, 40, 8, 2, 32, 8);
    let (q, k, v) = projections(b, s, h, h_kv, d, 2)?;
    let want = unfused(&q, &k, &v, Some(&causal_mask(s, s, Some(w))?))?;
    let got = Attention::new()
        .causal(Alignment::BottomRight)
        .sliding_window(w - 1, 0, Alignment::BottomRight)
        .forward(&q, &k, &v, None)?;
    assert!(max_diff(&got, &want)? < TOL, "{}", max_diff(&got, &want)?);
    // The additive mask Mistral builds, passed through unchanged.
    let mask = causal_mask(s, s, Some(w))?.expand((b, 1, s, s))?;
    let got = sdpa(&q, &k, &v, Some(&mask), false, 1.0 / (d as f32).sqrt(), 1.0)?;
    assert!(max_diff(&got, &want)? < TOL);
    Ok(())
}

/// Prefill `prompt` tokens, then decode `steps` tokens one at a time, growing the cache with
/// `Tensor::cat` along the sequence dim as candle-transformers' Llama does.
#[test]
fn decode_over_a_cat_grown_kv_cache() -> Result<()> {
    let (b, h, h_kv, d, prompt, steps) = (2, 8, 2, 64, 9, 6);
    let scale = 1.0 / (d as f32).sqrt();
    let (q0, mut kc, mut vc) = projections(b, prompt, h, h_kv, d, 3)?;
    let want = unfused(&q0, &kc, &vc, Some(&causal_mask(prompt, prompt, None)?))?;
    assert!(max_diff(&sdpa(&q0, &kc, &vc, None, true, scale, 1.0)?, &want)? < TOL);
    for step in 0..steps {
        let (q, k, v) = projections(b, 1, h, h_kv, d, 100 + step as u64)?;
        kc = Tensor::cat(&[&kc, &k], 2)?;
        vc = Tensor::cat(&[&vc, &v], 2)?;
        // One new token sees the whole cache: no mask in the unfused version either.
        let want = unfused(&q, &kc, &vc, None)?;
        let got = sdpa(&q, &kc, &vc, None, true, scale, 1.0)?;
        assert_eq!(got.dims(), &[b, h, 1, d]);
        assert!(max_diff(&got, &want)? < TOL, "step {step}");
    }
    Ok(())
}

/// Chunked prefill then decode over `candle_nn::kv_cache::KvCache`, which writes into a
/// preallocated buffer with `slice_set` and returns strided `narrow` views of it.
#[test]
fn decode_over_a_slice_set_kv_cache() -> Result<()> {
    let (b, h, h_kv, d) = (2, 4, 1, 32); // multi-query attention
    let scale = 1.0 / (d as f32).sqrt();
    let mut cache = KvCache::new(2, 64);
    let mut seen = 0;
    for (chunk, len) in [5usize, 4, 1, 1, 1].into_iter().enumerate() {
        let (q, k, v) = projections(b, len, h, h_kv, d, 200 + chunk as u64)?;
        let (kc, vc) = cache.append(&k.contiguous()?, &v.contiguous()?)?;
        seen += len;
        assert_eq!(kc.dim(2)?, seen);
        assert!(!kc.is_contiguous(), "the cache view is strided");
        // A chunk of `len` new tokens after `seen − len` cached ones: bottom-right causal.
        let want = unfused(&q, &kc, &vc, Some(&causal_mask(len, seen, None)?))?;
        let got = sdpa(&q, &kc, &vc, None, true, scale, 1.0)?;
        assert!(max_diff(&got, &want)? < TOL, "chunk {chunk}");
    }
    Ok(())
}

/// Unit roundoff of a half output type: `2⁻¹¹` for f16, `2⁻⁸` for bf16.
fn unit_roundoff(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 1.0 / 2048.0,
        DType::BF16 => 1.0 / 256.0,
        DType::F32 => 0.0, // within TOL
        other => panic!("not a float type: {other:?}"),
    }
}

fn max_abs(t: &Tensor) -> Result<f32> {
    t.to_dtype(DType::F32)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()
}

/// f16/bf16 Q, K, V are read natively and the output comes back in their type: against
/// candle's own ops computed in f32 on the same (rounded) inputs, within the output's one
/// rounding, `u·max|v|`, plus the f32 tolerance.
#[test]
fn half_precision_inputs_run_natively() -> Result<()> {
    let (b, s, h, h_kv, d) = (1, 17, 4, 2, 32);
    let (q, k, v) = projections(b, s, h, h_kv, d, 4)?;
    for dtype in [DType::F16, DType::BF16] {
        // Strided views (transposed half-precision projections), as a model passes them.
        let half = |t: &Tensor| t.transpose(1, 2)?.to_dtype(dtype)?.transpose(1, 2);
        let (qh, kh, vh) = (half(&q)?, half(&k)?, half(&v)?);
        assert!(!qh.is_contiguous() && !kh.is_contiguous());
        let want = unfused_causal_f32(&qh, &kh, &vh)?;
        let tol = unit_roundoff(dtype) * max_abs(&vh)? + TOL;
        let got = sdpa(&qh, &kh, &vh, None, true, 1.0 / (d as f32).sqrt(), 1.0)?;
        assert_eq!(got.dtype(), dtype);
        let err = max_diff(&got, &want)?;
        assert!(err <= tol, "{dtype:?}: {err} > {tol}");
        // An additive mask of the half type (converted to f32: sdpa's bias is f32).
        let mask = causal_mask(s, s, None)?.to_dtype(dtype)?;
        let got = sdpa(
            &qh,
            &kh,
            &vh,
            Some(&mask),
            false,
            1.0 / (d as f32).sqrt(),
            1.0,
        )?;
        let err = max_diff(&got, &want)?;
        assert!(err <= tol, "{dtype:?} mask: {err} > {tol}");
    }
    Ok(())
}

/// f32 queries over a half-precision KV cache grown with `slice_set` (llama.cpp's f16 cache,
/// candle's `KvCache` in f16/bf16): natively, with an f32 result; K and V must share a type.
#[test]
fn f32_queries_over_a_half_kv_cache() -> Result<()> {
    let (b, h, h_kv, d, steps) = (1, 8, 2, 32, 5);
    for dtype in [DType::F16, DType::BF16] {
        let mut cache = KvCache::new(2, 16);
        for step in 0..steps {
            let (q, k, v) = projections(b, 1, h, h_kv, d, 50 + step as u64)?;
            let (k, v) = cache.append(&k.to_dtype(dtype)?, &v.to_dtype(dtype)?)?;
            assert_eq!(k.dtype(), dtype);
            let want = unfused(&q, &k.to_dtype(DType::F32)?, &v.to_dtype(DType::F32)?, None)?;
            let got = sdpa(&q, &k, &v, None, true, 1.0 / (d as f32).sqrt(), 1.0)?;
            assert_eq!(got.dtype(), DType::F32);
            let err = max_diff(&got, &want)?;
            assert!(err <= TOL, "{dtype:?} step {step}: {err}");
            // Half queries over the same cache: the output in Q's type.
            let got = sdpa(
                &q.to_dtype(dtype)?,
                &k,
                &v,
                None,
                true,
                1.0 / (d as f32).sqrt(),
                1.0,
            )?;
            assert_eq!(got.dtype(), dtype);
        }
    }
    let dev = Device::Cpu;
    let q = Tensor::zeros((1, 2, 3, 8), DType::F32, &dev)?;
    let k = Tensor::zeros((1, 2, 3, 8), DType::F16, &dev)?;
    let v = Tensor::zeros((1, 2, 3, 8), DType::BF16, &dev)?;
    let err = sdpa(&q, &k, &v, None, false, 1.0, 1.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("k and v must have one dtype"), "{err}");
    Ok(())
}

#[test]
fn softcap_matches_the_formula() -> Result<()> {
    let (b, s, h, d) = (1, 12, 2, 16);
    let (q, k, v) = projections(b, s, h, h, d, 5)?;
    let (scale, cap) = (0.5f32, 2.0f32);
    let att = (q.contiguous()?.matmul(&k.contiguous()?.t()?)? * f64::from(scale))?;
    let att = ((att / f64::from(cap))?.tanh()? * f64::from(cap))?;
    let want = candle_nn::ops::softmax_last_dim(&att)?.matmul(&v.contiguous()?)?;
    let got = sdpa(&q, &k, &v, None, false, scale, cap)?;
    assert!(max_diff(&got, &want)? < TOL);
    Ok(())
}

#[test]
fn errors_carry_sdpa_messages() -> Result<()> {
    let dev = Device::Cpu;
    let q = Tensor::zeros((1, 3, 4, 8), DType::F32, &dev)?;
    let kv = Tensor::zeros((1, 2, 4, 8), DType::F32, &dev)?;
    let err = sdpa(&q, &kv, &kv, None, false, 1.0, 1.0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("query heads (3) must be a positive multiple of key/value heads (2)"),
        "{err}"
    );
    let err = sdpa(&q.squeeze(0)?, &kv, &kv, None, false, 1.0, 1.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[batch, heads, seq, dim]"), "{err}");
    let ints = Tensor::zeros((1, 2, 4, 8), DType::U32, &dev)?;
    assert!(sdpa(&ints, &ints, &ints, None, false, 1.0, 1.0).is_err());
    Ok(())
}

/// Views that start inside their storage (`narrow` from position 3, as a rolling cache does)
/// are read at their start offset.
#[test]
fn views_with_a_start_offset() -> Result<()> {
    let (b, s, h, h_kv, d) = (2, 12, 4, 2, 16);
    let (q, k, v) = projections(b, s, h, h_kv, d, 6)?;
    let (k, v) = (k.narrow(2, 3, s - 3)?, v.narrow(2, 3, s - 3)?);
    let q = q.narrow(2, 5, 4)?;
    assert!(k.layout().start_offset() > 0 && q.layout().start_offset() > 0);
    let want = unfused(&q, &k, &v, Some(&causal_mask(4, s - 3, None)?))?;
    let got = sdpa(&q, &k, &v, None, true, 1.0 / (d as f32).sqrt(), 1.0)?;
    assert!(max_diff(&got, &want)? < TOL);
    Ok(())
}

/// `Attention::bf16_products` on bf16 projections: within the f32 result plus the weights'
/// and the output's bf16 roundings (`2u·max|v|`); where the CPU has no bf16 dot products,
/// bitwise the plain call.
#[test]
fn bf16_products_on_bf16_inputs() -> Result<()> {
    let (b, s, h, h_kv, d) = (1, 40, 4, 2, 64);
    let (q, k, v) = projections(b, s, h, h_kv, d, 6)?;
    let half = |t: &Tensor| t.to_dtype(DType::BF16);
    let (qh, kh, vh) = (half(&q)?, half(&k)?, half(&v)?);
    let want = unfused_causal_f32(&qh, &kh, &vh)?;
    let plain = Attention::new().causal(Alignment::BottomRight);
    let got = plain.bf16_products().forward(&qh, &kh, &vh, None)?;
    assert_eq!(got.dtype(), DType::BF16);
    let tol = 2.0 * unit_roundoff(DType::BF16) * max_abs(&vh)? + TOL;
    let err = max_diff(&got, &want)?;
    assert!(err <= tol, "{err} > {tol}");
    let without = plain.forward(&qh, &kh, &vh, None)?;
    let same = max_diff(&got, &without)? == 0.0;
    assert_eq!(same, !sdpa_candle::bf16_products_available());
    Ok(())
}
