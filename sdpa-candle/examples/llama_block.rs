//! A small randomly initialised Llama-style decoder block in candle (RMSNorm, GQA attention
//! with RoPE and a KV cache, SwiGLU MLP), run twice: with candle's unfused attention, then with
//! sdpa swapped in by one line. Prefill of a prompt, then a few decode steps; prints how far
//! the two runs' hidden states are apart and how long each took.
//!
//! `cargo run --release -p sdpa-candle --example llama_block`

use std::time::Instant;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{linear_no_bias, rms_norm, Linear, RmsNorm, VarBuilder, VarMap};

const HIDDEN: usize = 512;
const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const INTERMEDIATE: usize = 1376;
const MAX_POS: usize = 1024;

#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    CandleUnfused,
    Sdpa,
}

struct Block {
    norm1: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    norm2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    cos: Tensor,
    sin: Tensor,
}

impl Block {
    fn new(vb: VarBuilder) -> Result<Self> {
        let kv = KV_HEADS * HEAD_DIM;
        let inv: Vec<f32> = (0..HEAD_DIM / 2)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / HEAD_DIM as f32))
            .collect();
        let inv = Tensor::from_vec(inv, (1, HEAD_DIM / 2), vb.device())?;
        let pos = Tensor::arange(0u32, MAX_POS as u32, vb.device())?
            .to_dtype(DType::F32)?
            .reshape((MAX_POS, 1))?;
        let freqs = pos.matmul(&inv)?;
        Ok(Self {
            norm1: rms_norm(HIDDEN, 1e-5, vb.pp("norm1"))?,
            q: linear_no_bias(HIDDEN, HIDDEN, vb.pp("q"))?,
            k: linear_no_bias(HIDDEN, kv, vb.pp("k"))?,
            v: linear_no_bias(HIDDEN, kv, vb.pp("v"))?,
            o: linear_no_bias(HIDDEN, HIDDEN, vb.pp("o"))?,
            norm2: rms_norm(HIDDEN, 1e-5, vb.pp("norm2"))?,
            gate: linear_no_bias(HIDDEN, INTERMEDIATE, vb.pp("gate"))?,
            up: linear_no_bias(HIDDEN, INTERMEDIATE, vb.pp("up"))?,
            down: linear_no_bias(INTERMEDIATE, HIDDEN, vb.pp("down"))?,
            cos: freqs.cos()?,
            sin: freqs.sin()?,
        })
    }

    fn attention(
        &self,
        x: &Tensor,
        pos: usize,
        cache: &mut Option<(Tensor, Tensor)>,
        kernel: Kernel,
    ) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let heads = |t: Tensor, h: usize| t.reshape((b, s, h, HEAD_DIM))?.transpose(1, 2);
        let q = heads(self.q.forward(x)?, HEADS)?.contiguous()?;
        let k = heads(self.k.forward(x)?, KV_HEADS)?.contiguous()?;
        let v = heads(self.v.forward(x)?, KV_HEADS)?;
        let cos = self.cos.narrow(0, pos, s)?;
        let sin = self.sin.narrow(0, pos, s)?;
        let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
        let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
        let (k, v) = match cache.take() {
            Some((kc, vc)) => (Tensor::cat(&[&kc, &k], 2)?, Tensor::cat(&[&vc, &v], 2)?),
            None => (k, v.contiguous()?),
        };
        *cache = Some((k.clone(), v.clone()));
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let y = match kernel {
            // The one line that swaps the kernel (same signature as candle_nn::ops::sdpa).
            Kernel::Sdpa => sdpa_candle::sdpa(&q, &k, &v, None, s > 1, scale, 1.0)?,
            Kernel::CandleUnfused => unfused(&q, &k, &v, s > 1, scale)?,
        };
        let y = y.transpose(1, 2)?.reshape((b, s, HIDDEN))?;
        self.o.forward(&y)
    }

    fn forward(
        &self,
        x: &Tensor,
        pos: usize,
        cache: &mut Option<(Tensor, Tensor)>,
        kernel: Kernel,
    ) -> Result<Tensor> {
        let x = (self.attention(&self.norm1.forward(x)?, pos, cache, kernel)? + x)?;
        let h = self.norm2.forward(&x)?;
        let mlp = (candle_nn::ops::silu(&self.gate.forward(&h)?)? * self.up.forward(&h)?)?;
        x + self.down.forward(&mlp)?
    }
}

/// candle-transformers' Llama attention without flash-attn: repeat_kv, masked softmax.
fn unfused(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f32) -> Result<Tensor> {
    let rep = HEADS / KV_HEADS;
    let (b, h_kv, n_kv, d) = k.dims4()?;
    let k = Tensor::cat(&vec![k; rep], 2)?.reshape((b, h_kv * rep, n_kv, d))?;
    let v = Tensor::cat(&vec![v; rep], 2)?.reshape((b, h_kv * rep, n_kv, d))?;
    let att = (q.matmul(&k.t()?)? * f64::from(scale))?;
    let att = if causal {
        let n_q = q.dim(2)?;
        let off = n_kv - n_q;
        let mask: Vec<u8> = (0..n_q)
            .flat_map(|i| (0..n_kv).map(move |j| u8::from(j > i + off)))
            .collect();
        let mask = Tensor::from_vec(mask, (n_q, n_kv), q.device())?.broadcast_as(att.shape())?;
        let ninf = Tensor::new(f32::NEG_INFINITY, q.device())?.broadcast_as(att.shape())?;
        mask.where_cond(&ninf, &att)?
    } else {
        att
    };
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&v)
}

fn run(
    block: &Block,
    prompt: &Tensor,
    steps: &[Tensor],
    kernel: Kernel,
) -> Result<(Vec<Tensor>, f64)> {
    let start = Instant::now();
    let mut cache = None;
    let mut outs = vec![block.forward(prompt, 0, &mut cache, kernel)?];
    for (pos, x) in (prompt.dim(1)?..).zip(steps) {
        outs.push(block.forward(x, pos, &mut cache, kernel)?);
    }
    Ok((outs, start.elapsed().as_secs_f64()))
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let block = Block::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    let prompt_len = 256;
    let prompt = Tensor::randn(0f32, 1., (1, prompt_len, HIDDEN), &dev)?;
    let steps: Vec<Tensor> = (0..16)
        .map(|_| Tensor::randn(0f32, 1., (1, 1, HIDDEN), &dev))
        .collect::<Result<_>>()?;

    let (want, t_unfused) = run(&block, &prompt, &steps, Kernel::CandleUnfused)?;
    let (got, t_sdpa) = run(&block, &prompt, &steps, Kernel::Sdpa)?;
    let mut worst = 0f32;
    for (a, b) in want.iter().zip(&got) {
        let diff = (a - b)?
            .abs()?
            .flatten_all()?
            .max(D::Minus1)?
            .to_scalar::<f32>()?;
        worst = worst.max(diff);
    }
    println!(
        "Llama-style block, hidden {HIDDEN}, {HEADS} heads over {KV_HEADS} kv heads: prefill {prompt_len} + {} decode steps",
        steps.len()
    );
    println!("candle unfused attention: {:.1} ms", t_unfused * 1e3);
    println!("sdpa swapped in:          {:.1} ms", t_sdpa * 1e3);
    println!("max |difference| of the hidden states: {worst:.2e}");
    assert!(worst < 1e-3, "the two kernels disagree");
    Ok(())
}
