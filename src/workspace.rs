//! Memory a caller keeps between calls, so that steady-state calls (decode steps of one shape)
//! allocate nothing in the kernel: ggml's `cplan` work buffer, as a value.

use crate::element::Element;
use crate::error::Error;
use crate::fused;
use crate::options::Options;
use crate::problem::Problem;
use crate::tensor::{Tensor, TensorMut};

/// Reusable memory of the fused kernel: the per-thread scratches and the split-KV partial
/// results. [`attention`](crate::attention) allocates them for each call and frees them after;
/// the methods here take them from the workspace and give them back, so that repeated calls
/// whose head sizes, GQA group and pool size match (every decode step of a model) allocate
/// nothing in the kernel. A call with other sizes reallocates what does not fit and keeps the
/// new buffers. Results are bitwise identical to the plain functions'.
///
/// ```
/// use sdpa::{Options, Tensor, TensorMut, Workspace};
/// let (q, kv) = (vec![0.5f32; 8], vec![0.25f32; 64]);
/// let mut out = vec![0.0f32; 8];
/// let mut ws = Workspace::new();
/// for _step in 0..3 {
///     let q = Tensor::bshd(&q, [1, 1, 1, 8])?;
///     let k = Tensor::bshd(&kv, [1, 8, 1, 8])?;
///     let mut o = TensorMut::bshd(&mut out, [1, 1, 1, 8])?;
///     ws.attention(&q, &k, &k, &mut o, &Options::new())?;
/// }
/// assert!(ws.bytes() > 0);
/// # Ok::<(), sdpa::Error>(())
/// ```
#[derive(Default)]
pub struct Workspace {
    inner: fused::Workspace,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Workspace {
    /// An empty workspace (it allocates on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the workspace holds.
    pub fn bytes(&self) -> usize {
        self.inner.bytes()
    }

    /// [`attention`](crate::attention) with this workspace's memory.
    ///
    /// # Errors
    /// As [`attention`](crate::attention).
    pub fn attention<Q: Element, KV: Element, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        opts: &Options<'_>,
    ) -> Result<(), Error> {
        let problem = Problem::new(q, k, v, out.dims(), None, opts)?;
        fused::run(
            &mut self.inner,
            &problem,
            q,
            k,
            v,
            out,
            None,
            opts.tile_counter,
        )
    }

    /// [`attention_lse`](crate::attention_lse) with this workspace's memory.
    ///
    /// # Errors
    /// As [`attention_lse`](crate::attention_lse).
    pub fn attention_lse<Q: Element, KV: Element, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: &mut [f32],
        opts: &Options<'_>,
    ) -> Result<(), Error> {
        let problem = Problem::new(q, k, v, out.dims(), Some(lse), opts)?;
        fused::run(
            &mut self.inner,
            &problem,
            q,
            k,
            v,
            out,
            Some(lse),
            opts.tile_counter,
        )
    }
}
