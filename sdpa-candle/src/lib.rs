//! # sdpa-candle: sdpa's fused CPU attention for candle
//!
//! Attention on `candle_core::Tensor`s of the CPU device in candle's `[batch, heads, seq, dim]`
//! layout, computed by [`sdpa`](mod@sdpa)'s fused kernel: no `n_q × n_kv` score matrix, no
//! `contiguous()` copies (the views are built from each tensor's [`Layout`] strides and start
//! offset, so transposed projections and `slice_set` KV caches are read in place), grouped-query
//! attention without `repeat_kv`.
//!
//! Three ways in:
//! * [`sdpa()`]: the signature of `candle_nn::ops::sdpa`, so a model's attention changes in one
//!   line;
//! * [`flash_attn`]: the signature of `candle_flash_attn::flash_attn` (`[batch, seq, heads,
//!   dim]` tensors), for models written against it;
//! * [`Attention`]: a builder with the explicit causal [`Alignment`], sliding window and
//!   softcap; it is also the [`CustomOp3`] itself (`q.apply_op3_no_bwd(&k, &v, &op)`).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use sdpa_candle::{Alignment, Attention};
//!
//! let dev = Device::Cpu;
//! // Llama-like GQA prefill: 8 query heads over 2 key/value heads.
//! let q = Tensor::randn(0f32, 1., (1, 8, 16, 64), &dev)?;
//! let k = Tensor::randn(0f32, 1., (1, 2, 16, 64), &dev)?;
//! let v = Tensor::randn(0f32, 1., (1, 2, 16, 64), &dev)?;
//! let out = Attention::new().causal(Alignment::BottomRight).forward(&q, &k, &v, None)?;
//! assert_eq!(out.dims(), &[1, 8, 16, 64]);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! ## Element types
//! Q, K and V may be f32, f16 or bf16 and are read natively, in place: the views are built
//! straight from candle's `CpuStorage::F32` / `F16` / `BF16` slices, sdpa converts
//! half-precision rows to f32 block by block inside its kernel (arithmetic is f32), and the
//! output, allocated in **Q's dtype**, is rounded once. K and V must share a dtype; Q may differ
//! from them (f32 queries over an f16 or bf16 KV cache run natively, with an f32 result).
//! A float mask of a half type is converted to f32 (one copy of the mask, whose elements sdpa
//! adds to the f32 scores).
//!
//! ## Masks
//! An optional mask broadcasts to `[batch, heads, n_q, n_kv]` (rank 2 to 4; leading dims may
//! be missing, any dim may be 1 or have stride 0):
//! * a float mask (f32 / f16 / bf16) is **added** to the scores (`0` keeps a key, `−∞` hides
//!   it), like the additive masks of candle-transformers' Mistral and of `candle_nn::ops::sdpa`;
//! * a `u8` mask **hides the keys where it is nonzero**, the convention of candle-transformers'
//!   Llama (`masked_fill(&att, &mask, f32::NEG_INFINITY)`): the opposite of sdpa's own `bool`
//!   mask and of its C ABI's byte mask, where `true` / nonzero = visible.
//!
//! Rows in which every key is hidden give 0 (not NaN as an unfused softmax would).
//!
//! ## Serving many sequences
//! [`PagedKvCache`] is a paged K/V cache shared by many sequences (vLLM's page pools and block
//! tables): a model step appends each layer's new K/V rows and runs the layer's packed queries
//! over the cache, one [`sdpa::Plan`] for the whole step.

#![warn(missing_docs)]

mod paged;

use std::borrow::Cow;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor, WithDType,
};
use sdpa::Element;

pub use paged::{KvType, PagedKvCache, PagedKvConfig, PagedStep, SeqId};
pub use sdpa::{amx_available, bf16_products_available, Alignment, Rope, RopeStyle};

/// Attention options and the [`CustomOp3`] that computes `softmax(Q·Kᵀ·scale + mask)·V` on
/// candle CPU tensors `[batch, heads, seq, dim]`.
///
/// Q is `[B, H, n_q, d_k]`, K `[B, H_kv, n_kv, d_k]`, V `[B, H_kv, n_kv, d_v]`, with `H` a
/// multiple of `H_kv`; the result is a new contiguous `[B, H, n_q, d_v]` tensor of Q's type.
/// Each of Q and K/V is f32, f16 or bf16 (K and V share one), read natively.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Attention {
    scale: Option<f32>,
    causal: Option<Alignment>,
    window: Option<(usize, usize, Alignment)>,
    softcap: Option<f32>,
    bf16_products: bool,
}

impl Attention {
    /// Plain attention with scale `1/√d_k`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The softmax scale (default `1/√d_k`).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Causal mask with an explicit diagonal: [`Alignment::BottomRight`] is what a KV-cache
    /// step needs (the last query row sees every key), [`Alignment::TopLeft`] is PyTorch's
    /// `is_causal`. They agree when `n_q = n_kv`.
    pub fn causal(mut self, alignment: Alignment) -> Self {
        self.causal = Some(alignment);
        self
    }

    /// Sliding window (Mistral): row `i` sees key `j` only if `i + off − left ≤ j ≤ i + off +
    /// right` (`right = 0` with causal). See [`sdpa::Options::sliding_window`].
    pub fn sliding_window(mut self, left: usize, right: usize, alignment: Alignment) -> Self {
        self.window = Some((left, right, alignment));
        self
    }

    /// Logit soft-capping `cap·tanh(s/cap)` (Gemma 2).
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Lets the two products run as bf16 dot products with f32 accumulation when Q and
    /// K/V are bf16 and the CPU has them ([`bf16_products_available`]): about twice the f32
    /// multiply-add rate, with the softmax weights rounded to bf16 before `P·V` (as
    /// FlashAttention on GPUs). See [`sdpa::Options::bf16_products`]; other types are unchanged.
    pub fn bf16_products(mut self) -> Self {
        self.bf16_products = true;
        self
    }

    /// Runs attention on CPU tensors, with an optional mask (see the crate docs for its two
    /// kinds).
    ///
    /// # Errors
    /// Non-CPU tensors, unsupported element types, K and V of different types, ranks other
    /// than 4, and every [`sdpa::Error`] (shapes, heads, options), with sdpa's message.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        match mask {
            None => q.apply_op3_no_bwd(k, v, self),
            Some(mask) => {
                // Lock the mask before the op locks Q, K and V (the op's locks are recursive
                // reads, so a mask that shares their storage cannot deadlock).
                let (storage, layout) = mask.storage_and_layout();
                let Storage::Cpu(storage) = &*storage else {
                    bail!("sdpa-candle: the mask must be on the CPU device");
                };
                let op = Op {
                    cfg: self,
                    mask: Some((storage, layout)),
                };
                q.apply_op3_no_bwd(k, v, &op)
            }
        }
    }

    fn options<'a>(
        &self,
        bias: Option<sdpa::Tensor<'a, f32>>,
        keep: Option<sdpa::Tensor<'a, bool>>,
    ) -> sdpa::Options<'a> {
        let mut o = sdpa::Options::new();
        if let Some(s) = self.scale {
            o = o.scale(s);
        }
        if let Some(a) = self.causal {
            o = o.causal(a);
        }
        if let Some((l, r, a)) = self.window {
            o = o.sliding_window(l, r, a);
        }
        if let Some(c) = self.softcap {
            o = o.softcap(c);
        }
        if self.bf16_products {
            o = o.bf16_products();
        }
        if let Some(b) = bias {
            o = o.bias(b);
        }
        if let Some(m) = keep {
            o = o.mask(m);
        }
        o
    }
}

/// `candle_nn::ops::sdpa` on sdpa's CPU kernel, same signature and semantics: Q
/// `[B, H, n_q, d]`, K and V `[B, H_kv, n_kv, d]` (GQA: not pre-tiled), an optional additive
/// mask broadcastable to `[B, H, n_q, n_kv]`, `do_causal` (bottom-right aligned, as a KV-cache
/// step needs), `scale`, and `softcapping` (`1.0`: none, as candle's).
///
/// # Errors
/// As [`Attention::forward`].
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    do_causal: bool,
    scale: f32,
    softcapping: f32,
) -> Result<Tensor> {
    let mut op = Attention::new().scale(scale);
    if do_causal {
        op = op.causal(Alignment::BottomRight);
    }
    if softcapping != 1.0 {
        op = op.softcap(softcapping);
    }
    op.forward(q, k, v, mask)
}

/// `candle_flash_attn::flash_attn` on sdpa's CPU kernel, same signature: Q
/// `[B, n_q, H, d]`, K and V `[B, n_kv, H_kv, d]`, result `[B, n_q, H, d]` (a transposed view of
/// a contiguous `[B, H, n_q, d]` tensor); `causal` is bottom-right aligned, as in
/// FlashAttention ≥ 2.1.
///
/// # Errors
/// As [`Attention::forward`].
pub fn flash_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let mut op = Attention::new().scale(softmax_scale);
    if causal {
        op = op.causal(Alignment::BottomRight);
    }
    // Transposes are free: only the strides change, and sdpa reads any strides.
    op.forward(
        &q.transpose(1, 2)?,
        &k.transpose(1, 2)?,
        &v.transpose(1, 2)?,
        None,
    )?
    .transpose(1, 2)
}

/// The op with a borrowed mask storage.
struct Op<'a> {
    cfg: &'a Attention,
    mask: Option<(&'a CpuStorage, &'a Layout)>,
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "sdpa"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Op {
            cfg: self,
            mask: None,
        }
        .cpu_fwd(s1, l1, s2, l2, s3, l3)
    }
}

impl CustomOp3 for Op<'_> {
    fn name(&self) -> &'static str {
        "sdpa"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let q_dims = dims4(l1, "q")?;
        let v_dims = dims4(l3, "v")?;
        let [b, h, n_q, _] = q_dims;
        let d_v = v_dims[3];

        let mut bias_data = None;
        let mut keep_data = None;
        if let Some((storage, layout)) = self.mask {
            match storage.dtype() {
                DType::U8 => keep_data = Some(BoolMask::new(storage, layout)?),
                DType::F32 | DType::F16 | DType::BF16 => {
                    bias_data = Some(F32View::mask(storage, layout)?)
                }
                other => bail!("sdpa-candle: unsupported mask dtype {other:?}"),
            }
        }
        let bias = bias_data.as_ref().map(|m| m.tensor()).transpose()?;
        let keep = keep_data.as_ref().map(|m| m.tensor()).transpose()?;
        let opts = self.cfg.options(bias, keep);

        let out_dims = [b, h, n_q, d_v];
        let storage = match s1 {
            CpuStorage::F32(q) => with_q(view(q, l1, "q")?, s2, l2, s3, l3, out_dims, &opts),
            CpuStorage::F16(q) => with_q(view(q, l1, "q")?, s2, l2, s3, l3, out_dims, &opts),
            CpuStorage::BF16(q) => with_q(view(q, l1, "q")?, s2, l2, s3, l3, out_dims, &opts),
            other => bail!(
                "sdpa-candle: q has dtype {:?}; f32, f16 and bf16 are supported",
                other.dtype()
            ),
        }?;
        Ok((storage, Shape::from((b, h, n_q, d_v))))
    }
}

/// A rank-4 layout's dims (candle's `[B, H, S, D]`).
fn dims4(layout: &Layout, name: &str) -> Result<[usize; 4]> {
    layout.dims().try_into().map_err(|_| {
        candle_core::Error::msg(format!(
            "sdpa-candle: {name} must be [batch, heads, seq, dim], got shape {:?}",
            layout.dims()
        ))
    })
}

/// sdpa's view of a rank-4 candle tensor, borrowed in place: its storage slice from the
/// layout's start offset, with its strides (any, including transposed and `slice_set` caches).
fn view<'a, T>(data: &'a [T], layout: &Layout, name: &str) -> Result<sdpa::Tensor<'a, T>> {
    let dims = dims4(layout, name)?;
    let strides: [usize; 4] = layout.stride().try_into().expect("rank 4");
    let data = data.get(layout.start_offset()..).unwrap_or(&[]);
    sdpa::Tensor::new(data, bhsd_to_bshd(dims), bhsd_to_bshd(strides))
        .map_err(candle_core::Error::wrap)
}

/// Attention with Q typed: dispatches on the type of K and V, which must share one.
fn with_q<Q: Element + WithDType>(
    q: sdpa::Tensor<'_, Q>,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
    out_dims: [usize; 4],
    opts: &sdpa::Options<'_>,
) -> Result<CpuStorage> {
    match (s2, s3) {
        (CpuStorage::F32(k), CpuStorage::F32(v)) => {
            run(&q, &view(k, l2, "k")?, &view(v, l3, "v")?, out_dims, opts)
        }
        (CpuStorage::F16(k), CpuStorage::F16(v)) => {
            run(&q, &view(k, l2, "k")?, &view(v, l3, "v")?, out_dims, opts)
        }
        (CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
            run(&q, &view(k, l2, "k")?, &view(v, l3, "v")?, out_dims, opts)
        }
        _ if s2.dtype() != s3.dtype() => bail!(
            "sdpa-candle: k and v must have one dtype, got {:?} and {:?}",
            s2.dtype(),
            s3.dtype()
        ),
        _ => bail!(
            "sdpa-candle: k and v have dtype {:?}; f32, f16 and bf16 are supported",
            s2.dtype()
        ),
    }
}

/// The typed call: the output is allocated in Q's type, `[B, H, n_q, d_v]` contiguous.
fn run<Q: Element + WithDType, KV: Element>(
    q: &sdpa::Tensor<'_, Q>,
    k: &sdpa::Tensor<'_, KV>,
    v: &sdpa::Tensor<'_, KV>,
    out_dims: [usize; 4],
    opts: &sdpa::Options<'_>,
) -> Result<CpuStorage> {
    let len = out_dims.iter().product();
    let mut out = vec![<Q as Element>::from_f32(0.0); len];
    let mut out_t = sdpa::TensorMut::bhsd(&mut out, out_dims).map_err(candle_core::Error::wrap)?;
    sdpa::attention(q, k, v, &mut out_t, opts).map_err(candle_core::Error::wrap)?;
    Ok(Q::to_cpu_storage_owned(out))
}

/// Candle `[B, H, S, D]` dims and strides as sdpa's logical `[B, S, H, D]`.
fn bhsd_to_bshd(x: [usize; 4]) -> [usize; 4] {
    [x[0], x[2], x[1], x[3]]
}

/// An f32 view of a float mask: borrowed for f32, a converted copy for f16/bf16 (sdpa's bias is
/// f32). Dims and strides in candle's `[B, H, S, D]` order.
struct F32View<'a> {
    data: Cow<'a, [f32]>,
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<'a> F32View<'a> {
    /// A float mask, padded to rank 4 with broadcast leading dims.
    fn mask(storage: &'a CpuStorage, layout: &Layout) -> Result<Self> {
        let (dims, strides) = mask_dims(layout)?;
        Self::from_parts(storage, layout, dims, strides, "mask")
    }

    fn from_parts(
        storage: &'a CpuStorage,
        layout: &Layout,
        dims: [usize; 4],
        strides: [usize; 4],
        name: &str,
    ) -> Result<Self> {
        let offset = layout.start_offset();
        match storage {
            CpuStorage::F32(v) => {
                let data = v.get(offset..).unwrap_or(&[]);
                Ok(Self {
                    data: Cow::Borrowed(data),
                    dims,
                    strides,
                })
            }
            CpuStorage::F16(v) => Ok(gather(v, layout, dims, strides)),
            CpuStorage::BF16(v) => Ok(gather(v, layout, dims, strides)),
            other => bail!(
                "sdpa-candle: {name} has dtype {:?}; f32, f16 and bf16 are supported",
                other.dtype()
            ),
        }
    }

    fn tensor(&self) -> Result<sdpa::Tensor<'_, f32>> {
        sdpa::Tensor::new(
            &self.data,
            bhsd_to_bshd(self.dims),
            bhsd_to_bshd(self.strides),
        )
        .map_err(candle_core::Error::wrap)
    }
}

/// A contiguous f32 copy of the elements of a half-precision view, in logical order.
fn gather<'a, T: WithDType>(
    v: &[T],
    layout: &Layout,
    dims: [usize; 4],
    strides: [usize; 4],
) -> F32View<'a> {
    let base = layout.start_offset();
    let mut data = Vec::with_capacity(dims.iter().product());
    for a in 0..dims[0] {
        for b in 0..dims[1] {
            for c in 0..dims[2] {
                for d in 0..dims[3] {
                    let at =
                        base + a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3];
                    data.push(v[at].to_f64() as f32);
                }
            }
        }
    }
    F32View {
        data: Cow::Owned(data),
        dims,
        strides: [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1],
    }
}

/// Rank 2 to 4 mask dims and strides padded to `[B, H, n_q, n_kv]` with size-1 leading dims.
fn mask_dims(layout: &Layout) -> Result<([usize; 4], [usize; 4])> {
    let rank = layout.dims().len();
    if !(2..=4).contains(&rank) {
        bail!(
            "sdpa-candle: the mask must have rank 2 to 4 ([n_q, n_kv] … [batch, heads, n_q, n_kv]), got shape {:?}",
            layout.dims()
        );
    }
    let mut dims = [1usize; 4];
    let mut strides = [0usize; 4];
    dims[4 - rank..].copy_from_slice(layout.dims());
    strides[4 - rank..].copy_from_slice(layout.stride());
    Ok((dims, strides))
}

/// A `u8` mask (nonzero = hidden) as sdpa's boolean mask (true = visible): one copy of the
/// elements the view holds, broadcast dims kept broadcast.
struct BoolMask {
    data: Vec<bool>,
    dims: [usize; 4],
    strides: [usize; 4],
}

impl BoolMask {
    fn new(storage: &CpuStorage, layout: &Layout) -> Result<Self> {
        let CpuStorage::U8(v) = storage else {
            bail!("sdpa-candle: expected a u8 mask");
        };
        let (dims, src_strides) = mask_dims(layout)?;
        // Copy only the distinct elements: a dim with stride 0 stays broadcast.
        let kept: [usize; 4] =
            std::array::from_fn(|i| if src_strides[i] == 0 { 1 } else { dims[i] });
        let mut data = Vec::with_capacity(kept.iter().product());
        let base = layout.start_offset();
        for a in 0..kept[0] {
            for b in 0..kept[1] {
                for c in 0..kept[2] {
                    for d in 0..kept[3] {
                        let at = base
                            + a * src_strides[0]
                            + b * src_strides[1]
                            + c * src_strides[2]
                            + d * src_strides[3];
                        data.push(v[at] == 0);
                    }
                }
            }
        }
        let mut strides = [0usize; 4];
        let mut step = 1;
        for i in (0..4).rev() {
            strides[i] = if kept[i] == 1 { 0 } else { step };
            step *= kept[i];
        }
        Ok(Self {
            data,
            dims,
            strides,
        })
    }

    fn tensor(&self) -> Result<sdpa::Tensor<'_, bool>> {
        sdpa::Tensor::new(
            &self.data,
            bhsd_to_bshd(self.dims),
            bhsd_to_bshd(self.strides),
        )
        .map_err(candle_core::Error::wrap)
    }
}
