//! Type erasure and dispatch: the validated operands of each element type as one value each
//! ([`AnyTensor`], [`AnyKv`], [`AnyTensorMut`]), which Rust function a call runs ([`Call`],
//! [`Kernel`]), and the dispatch from the three runtime types to the generic call.

use sdpa::half::{bf16, f16};
use sdpa::{Element, KvElement, Operand, Options, PackedKv, PagedKv, Tensor, TensorMut, VarlenKv};

use crate::abi::{SdpaStatus, SdpaTensor, SdpaTensorMut};
use crate::status::Failure;
use crate::validate::{input, operand_name, output, Dtype, Span};

/// A validated tensor of one of the element types.
pub(crate) enum AnyTensor<'a> {
    F32(Tensor<'a, f32>),
    F16(Tensor<'a, f16>),
    Bf16(Tensor<'a, bf16>),
}

/// K and V, which share one element type.
pub(crate) enum AnyKv<'a> {
    F32(Tensor<'a, f32>, Tensor<'a, f32>),
    F16(Tensor<'a, f16>, Tensor<'a, f16>),
    Bf16(Tensor<'a, bf16>, Tensor<'a, bf16>),
    I8(Tensor<'a, i8>, Tensor<'a, i8>),
}

/// A validated output tensor of one of the element types.
pub(crate) enum AnyTensorMut<'a> {
    F32(TensorMut<'a, f32>),
    F16(TensorMut<'a, f16>),
    Bf16(TensorMut<'a, bf16>),
}

/// The failure for an `int8_t` Q or output.
fn kv_only(operand: &str) -> Failure {
    Failure::new(
        SdpaStatus::UnsupportedType,
        format!("{operand}: SDPA_DTYPE_I8 is a K/V type only"),
    )
}

/// An input tensor of type `dtype`.
///
/// # Safety
/// As `raw_tensor` for elements of `dtype`.
pub(crate) unsafe fn any_input<'a>(
    t: &SdpaTensor,
    operand: Operand,
    dtype: Dtype,
    spans: &mut Vec<Span>,
) -> Result<AnyTensor<'a>, Failure> {
    // SAFETY (all arms): forwarded, with the element type the caller declared.
    let (tensor, span) = match dtype {
        Dtype::F32 => unsafe { input(t, operand) }.map(|(x, s)| (AnyTensor::F32(x), s)),
        Dtype::F16 => unsafe { input(t, operand) }.map(|(x, s)| (AnyTensor::F16(x), s)),
        Dtype::Bf16 => unsafe { input(t, operand) }.map(|(x, s)| (AnyTensor::Bf16(x), s)),
        Dtype::I8 => Err(kv_only(&format!("{} tensor", operand_name(operand)))),
    }?;
    spans.push(span);
    Ok(tensor)
}

/// K and V of type `dtype`.
///
/// # Safety
/// As `raw_tensor` for elements of `dtype`, for both tensors.
pub(crate) unsafe fn any_kv<'a>(
    k: &SdpaTensor,
    v: &SdpaTensor,
    dtype: Dtype,
    spans: &mut Vec<Span>,
) -> Result<AnyKv<'a>, Failure> {
    /// # Safety
    /// As [`any_kv`], with `T` the declared type.
    unsafe fn pair<'a, T>(
        k: &SdpaTensor,
        v: &SdpaTensor,
        spans: &mut Vec<Span>,
    ) -> Result<(Tensor<'a, T>, Tensor<'a, T>), Failure> {
        // SAFETY (both): forwarded.
        let (k, ks) = unsafe { input(k, Operand::Key) }?;
        let (v, vs) = unsafe { input(v, Operand::Value) }?;
        spans.extend([ks, vs]);
        Ok((k, v))
    }
    // SAFETY (all arms): forwarded, with the element type the caller declared.
    Ok(match dtype {
        Dtype::F32 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::F32(k, v))?,
        Dtype::F16 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::F16(k, v))?,
        Dtype::Bf16 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::Bf16(k, v))?,
        Dtype::I8 => unsafe { pair(k, v, spans) }.map(|(k, v)| AnyKv::I8(k, v))?,
    })
}

/// An output tensor of type `dtype`, checked against the read spans.
///
/// # Safety
/// As [`output`] for elements of `dtype`.
pub(crate) unsafe fn any_output<'a>(
    t: &SdpaTensorMut,
    dtype: Dtype,
    reads: &[Span],
) -> Result<(AnyTensorMut<'a>, Span), Failure> {
    // SAFETY (all arms): forwarded, with the element type the caller declared.
    match dtype {
        Dtype::F32 => unsafe { output(t, reads) }.map(|(x, s)| (AnyTensorMut::F32(x), s)),
        Dtype::F16 => unsafe { output(t, reads) }.map(|(x, s)| (AnyTensorMut::F16(x), s)),
        Dtype::Bf16 => unsafe { output(t, reads) }.map(|(x, s)| (AnyTensorMut::Bf16(x), s)),
        Dtype::I8 => Err(kv_only("output tensor")),
    }
}

/// Which Rust function an entry point runs, with the arrays (validated and converted) that
/// say where the rows of K and V lie; K and V themselves are typed by the dispatch below.
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    /// `sdpa::attention` / `attention_lse` on dense K and V.
    Fused,
    /// `sdpa::reference::attention` / `attention_lse`.
    Reference,
    /// `sdpa::attention_paged`: K and V are page pools.
    Paged(Pages<'a>),
    /// `sdpa::attention_varlen`: packed Q, K/V packed (`cu_seqlens_k`) or paged.
    Varlen {
        cu_seqlens_q: &'a [usize],
        kv: VarlenLayout<'a>,
    },
}

/// A block table and its row length.
#[derive(Clone, Copy)]
pub(crate) struct Pages<'a> {
    pub(crate) table: &'a [u32],
    pub(crate) pages_per_seq: usize,
}

/// Where the keys of a varlen call lie.
#[derive(Clone, Copy)]
pub(crate) enum VarlenLayout<'a> {
    Packed { cu_seqlens_k: &'a [usize] },
    Paged(Pages<'a>),
}

/// A typed call to run once the element types are known: [`Attention`] for the entry points,
/// a plan's layer for `sdpa_plan_run`.
pub(crate) trait Kernel {
    /// Runs on operands of these element types.
    fn run<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
    ) -> Result<(), sdpa::Error>;
}

/// An entry point's call with its options.
pub(crate) struct Attention<'a> {
    pub(crate) call: Call<'a>,
    pub(crate) opts: &'a Options<'a>,
}

impl Kernel for Attention<'_> {
    /// The generic Rust function for these element types.
    fn run<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
    ) -> Result<(), sdpa::Error> {
        fn paged<'a, T: KvElement>(
            k: &Tensor<'a, T>,
            v: &Tensor<'a, T>,
            p: Pages<'a>,
        ) -> Result<PagedKv<'a, T>, sdpa::Error> {
            PagedKv::new(*k, *v, p.table, p.pages_per_seq)
        }
        let opts = self.opts;
        match (self.call, lse) {
            (Call::Fused, Some(lse)) => sdpa::attention_lse(q, k, v, out, lse, opts),
            (Call::Fused, None) => sdpa::attention(q, k, v, out, opts),
            (Call::Reference, Some(lse)) => sdpa::reference::attention_lse(q, k, v, out, lse, opts),
            (Call::Reference, None) => sdpa::reference::attention(q, k, v, out, opts),
            (Call::Paged(p), lse) => sdpa::attention_paged(q, &paged(k, v, p)?, out, lse, opts),
            (Call::Varlen { cu_seqlens_q, kv }, lse) => {
                let kv = match kv {
                    VarlenLayout::Packed { cu_seqlens_k } => {
                        VarlenKv::Packed(PackedKv::new(*k, *v, cu_seqlens_k))
                    }
                    VarlenLayout::Paged(p) => VarlenKv::Paged(paged(k, v, p)?),
                };
                sdpa::attention_varlen(q, cu_seqlens_q, &kv, out, lse, opts)
            }
        }
    }
}

/// Dispatches on the output's type (Q and K/V already typed).
fn run_out<Q: Element, KV: KvElement>(
    kernel: &mut impl Kernel,
    q: &Tensor<'_, Q>,
    k: &Tensor<'_, KV>,
    v: &Tensor<'_, KV>,
    out: &mut AnyTensorMut<'_>,
    lse: Option<&mut [f32]>,
) -> Result<(), sdpa::Error> {
    match out {
        AnyTensorMut::F32(out) => kernel.run(q, k, v, out, lse),
        AnyTensorMut::F16(out) => kernel.run(q, k, v, out, lse),
        AnyTensorMut::Bf16(out) => kernel.run(q, k, v, out, lse),
    }
}

/// Dispatches on the K/V type (Q already typed).
fn run_kv<Q: Element>(
    kernel: &mut impl Kernel,
    q: &Tensor<'_, Q>,
    kv: &AnyKv<'_>,
    out: &mut AnyTensorMut<'_>,
    lse: Option<&mut [f32]>,
) -> Result<(), sdpa::Error> {
    match kv {
        AnyKv::F32(k, v) => run_out(kernel, q, k, v, out, lse),
        AnyKv::F16(k, v) => run_out(kernel, q, k, v, out, lse),
        AnyKv::Bf16(k, v) => run_out(kernel, q, k, v, out, lse),
        AnyKv::I8(k, v) => run_out(kernel, q, k, v, out, lse),
    }
}

/// Dispatches on all three types: 36 monomorphizations of `kernel`'s [`Kernel::run`].
pub(crate) fn run_any(
    kernel: &mut impl Kernel,
    q: &AnyTensor<'_>,
    kv: &AnyKv<'_>,
    out: &mut AnyTensorMut<'_>,
    lse: Option<&mut [f32]>,
) -> Result<(), sdpa::Error> {
    match q {
        AnyTensor::F32(q) => run_kv(kernel, q, kv, out, lse),
        AnyTensor::F16(q) => run_kv(kernel, q, kv, out, lse),
        AnyTensor::Bf16(q) => run_kv(kernel, q, kv, out, lse),
    }
}
