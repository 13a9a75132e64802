//! Memory a caller keeps between calls, so that steady-state calls (decode steps of one shape)
//! allocate nothing in the kernel: ggml's `cplan` work buffer, as a value.

use crate::element::{Element, KvElement};
use crate::error::Error;
use crate::fused;
use crate::kv_cache::{PagedKv, RowMap, TensorKv, VarlenKv};
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

    /// The kernel's memory, lent to a [`Plan`](crate::Plan).
    pub(crate) fn kernel_memory(&mut self) -> &mut fused::Workspace {
        &mut self.inner
    }

    /// Bytes the workspace holds.
    pub fn bytes(&self) -> usize {
        self.inner.bytes()
    }

    /// [`attention`](crate::attention) with this workspace's memory.
    ///
    /// # Errors
    /// As [`attention`](crate::attention).
    pub fn attention<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        opts: &Options<'_>,
    ) -> Result<(), Error> {
        let problem = Problem::new(q, k, v, out.dims(), None, opts)?;
        let kv = TensorKv {
            k: *k,
            v: *v,
            map: RowMap::Dense,
        };
        // (Not a plan's call: whatever a plan left, even one forgotten without its drop.)
        self.inner.set_planned(false);
        fused::run(
            &mut self.inner,
            &problem,
            q,
            kv,
            out,
            None,
            opts.tile_counter,
        )
    }

    /// [`attention_lse`](crate::attention_lse) with this workspace's memory.
    ///
    /// # Errors
    /// As [`attention_lse`](crate::attention_lse).
    pub fn attention_lse<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: &mut [f32],
        opts: &Options<'_>,
    ) -> Result<(), Error> {
        let problem = Problem::new(q, k, v, out.dims(), Some(lse), opts)?;
        let kv = TensorKv {
            k: *k,
            v: *v,
            map: RowMap::Dense,
        };
        // (Not a plan's call: whatever a plan left, even one forgotten without its drop.)
        self.inner.set_planned(false);
        fused::run(
            &mut self.inner,
            &problem,
            q,
            kv,
            out,
            Some(lse),
            opts.tile_counter,
        )
    }

    /// [`attention_paged`](crate::attention_paged) with this workspace's memory.
    ///
    /// # Errors
    /// As [`attention_paged`](crate::attention_paged).
    pub fn attention_paged<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        kv: &PagedKv<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
        opts: &Options<'_>,
    ) -> Result<(), Error> {
        let problem = Problem::new_paged(q, kv, out.dims(), lse.as_deref(), opts)?;
        let source = paged_source(kv);
        // (Not a plan's call: whatever a plan left, even one forgotten without its drop.)
        self.inner.set_planned(false);
        fused::run(
            &mut self.inner,
            &problem,
            q,
            source,
            out,
            lse,
            opts.tile_counter,
        )
    }

    /// [`attention_varlen`](crate::attention_varlen) with this workspace's memory.
    ///
    /// # Errors
    /// As [`attention_varlen`](crate::attention_varlen).
    pub fn attention_varlen<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        cu_seqlens_q: &[usize],
        kv: &VarlenKv<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
        opts: &Options<'_>,
    ) -> Result<(), Error> {
        let problem = Problem::new_varlen(q, cu_seqlens_q, kv, out.dims(), lse.as_deref(), opts)?;
        let source = match kv {
            VarlenKv::Packed(p) => TensorKv {
                k: p.k,
                v: p.v,
                map: RowMap::Packed(p.cu_seqlens_k),
            },
            VarlenKv::Paged(p) => paged_source(p),
        };
        // (Not a plan's call: whatever a plan left, even one forgotten without its drop.)
        self.inner.set_planned(false);
        fused::run(
            &mut self.inner,
            &problem,
            q,
            source,
            out,
            lse,
            opts.tile_counter,
        )
    }
}

/// The kernel's view of a paged cache.
fn paged_source<'a, T: KvElement>(kv: &PagedKv<'a, T>) -> TensorKv<'a, T> {
    TensorKv {
        k: kv.k,
        v: kv.v,
        map: RowMap::Paged {
            table: kv.block_table,
            pages_per_seq: kv.pages_per_seq,
            page_size: kv.page_size(),
        },
    }
}
