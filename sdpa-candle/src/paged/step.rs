//! [`PagedStep`]: one step of a [`PagedKvCache`](super::PagedKvCache), its layers' appends and
//! attention.

use std::collections::HashMap;
use std::fmt;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Device, Layout, Result, Storage, Tensor, WithDType};
use sdpa::half::{bf16, f16};
use sdpa::{Element, KvElement, Layer, Plan, Rope, TensorMut};

use super::{rollback, Kv, PagedKvConfig, Pools, SeqId, SeqState, StepData};

/// One step of a [`PagedKvCache`](super::PagedKvCache) (see
/// [`PagedKvCache::begin_step`](super::PagedKvCache::begin_step)): per layer,
/// [`append`](PagedStep::append) then [`attention`](PagedStep::attention).
///
/// One type for the whole step, rather than per-layer calls on the cache, because its
/// [`Plan`] (validation, scheduling, block table, lengths) is shared by every layer and
/// borrows the step's arrays, and because the step is one transaction: it is committed
/// (the sequences hold their new tokens) when it is finished or dropped with every layer
/// appended, and rolled back (the pages it took go back, lengths unchanged) when dropped with
/// a layer missing, e.g. by a `?` in the middle of a model's forward.
pub struct PagedStep<'s> {
    plan: Plan<'s>,
    config: &'s PagedKvConfig,
    data: &'s StepData,
    pools: &'s mut Vec<Pools>,
    seqs: &'s mut HashMap<SeqId, SeqState>,
    free: &'s mut Vec<u32>,
    rope: Option<Rope<'s>>,
    appended: Vec<bool>,
}

impl<'s> PagedStep<'s> {
    /// A planned step over the cache's parts.
    pub(super) fn new(
        plan: Plan<'s>,
        config: &'s PagedKvConfig,
        data: &'s StepData,
        pools: &'s mut Vec<Pools>,
        seqs: &'s mut HashMap<SeqId, SeqState>,
        free: &'s mut Vec<u32>,
        rope: Option<Rope<'s>>,
    ) -> Self {
        PagedStep {
            plan,
            config,
            data,
            pools,
            seqs,
            free,
            rope,
            appended: vec![false; config.layers],
        }
    }
}

impl fmt::Debug for PagedStep<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PagedStep")
            .field("sequences", &self.data.ids)
            .field("cu_seqlens_q", &self.data.cu_q)
            .field("appended", &self.appended)
            .finish()
    }
}

impl Drop for PagedStep<'_> {
    fn drop(&mut self) {
        if self.appended.iter().all(|&a| a) {
            let d = self.data;
            for (b, id) in d.ids.iter().enumerate() {
                if let Some(s) = self.seqs.get_mut(id) {
                    s.len = d.cached[b] + (d.cu_q[b + 1] - d.cu_q[b]);
                }
            }
        } else {
            rollback(self.data, self.seqs, self.free);
        }
    }
}

/// The rank-3 `[rows, heads, dim]` or rank-4 `[1, rows, heads, dim]` dims of a tensor.
fn rows_dims(dims: &[usize], name: &str) -> Result<[usize; 3]> {
    match *dims {
        [n, h, d] | [1, n, h, d] => Ok([n, h, d]),
        _ => bail!(
            "sdpa-candle: {name} must be [rows, heads, dim] or [1, rows, heads, dim], \
             got shape {dims:?}"
        ),
    }
}

/// sdpa's `[1, rows, heads, dim]` view of a rank-3 or rank-4 candle tensor, in place.
fn rows_view<'a, T>(data: &'a [T], layout: &Layout, name: &str) -> Result<sdpa::Tensor<'a, T>> {
    let [n, h, d] = rows_dims(layout.dims(), name)?;
    let s = layout.stride();
    let strides = match *s {
        [sn, sh, sd] => [0, sn, sh, sd],
        [s0, sn, sh, sd] => [s0, sn, sh, sd],
        _ => bail!(
            "sdpa-candle: {name}: strides {s:?} for shape {:?}",
            layout.dims()
        ),
    };
    let data = data.get(layout.start_offset()..).unwrap_or(&[]);
    sdpa::Tensor::new(data, [1, n, h, d], strides).map_err(candle_core::Error::wrap)
}

/// A tensor's CPU storage, or an error naming it.
fn cpu<'a>(storage: &'a Storage, name: &str) -> Result<&'a CpuStorage> {
    match storage {
        Storage::Cpu(s) => Ok(s),
        _ => bail!("sdpa-candle: {name} must be on the CPU device"),
    }
}

impl PagedStep<'_> {
    /// The step's packed query-row offsets: sequence `b` of the batch has rows
    /// `cu_seqlens_q()[b] .. cu_seqlens_q()[b + 1]`.
    pub fn cu_seqlens_q(&self) -> &[usize] {
        &self.data.cu_q
    }

    /// Each new row's position (its token's index in its sequence), for a model that
    /// rotates Q and K itself.
    pub fn positions(&self) -> &[u32] {
        &self.data.positions
    }

    fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.config.layers {
            bail!(
                "sdpa-candle: layer {layer} of a cache of {} layers",
                self.config.layers
            );
        }
        Ok(())
    }

    /// Writes layer `layer`'s new K and V rows into their slots: `k` `[total_new, H_kv, d_k]`
    /// or `[1, total_new, H_kv, d_k]` (any strides; row `i` is the step's `i`-th new token),
    /// `v` alike with `d_v`, both f32, f16 or bf16 (one type), converted to the cache's type;
    /// K rotated by the step's rope first. Once per layer per step; nothing is written on
    /// error.
    ///
    /// # Errors
    /// A layer out of range or already appended, tensors not on the CPU, shapes other than
    /// the step's rows × the cache's kv heads and head sizes, K and V of different or
    /// unsupported types, and [`sdpa::append`]'s errors (values an `i8` cache cannot hold).
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.check_layer(layer)?;
        if self.appended[layer] {
            bail!("sdpa-candle: layer {layer} was already appended this step");
        }
        let (total, c) = (self.data.slots.len(), self.config);
        for (t, name, d) in [(k, "k", c.d_k), (v, "v", c.d_v)] {
            let want = [total, c.kv_heads, d];
            if rows_dims(t.dims(), name)? != want {
                let which = if name == "k" { "d_k" } else { "d_v" };
                bail!(
                    "sdpa-candle: {name} must be {want:?} (rows, kv heads, {which}), got {:?}",
                    t.dims()
                );
            }
        }
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (ks, vs) = (cpu(&ks, "k")?, cpu(&vs, "v")?);
        let rope = self.rope.as_ref().map(|r| (r, &self.data.positions[..]));
        let to = Target {
            config: self.config,
            slots: &self.data.slots,
            rope,
        };
        match (ks, vs) {
            (CpuStorage::F32(k), CpuStorage::F32(v)) => {
                let (k, v) = (rows_view(k, kl, "k")?, rows_view(v, vl, "v")?);
                with_kv!(&mut self.pools[layer], kv => to.write(kv, &k, &v))
            }
            (CpuStorage::F16(k), CpuStorage::F16(v)) => {
                let (k, v) = (rows_view(k, kl, "k")?, rows_view(v, vl, "v")?);
                with_kv!(&mut self.pools[layer], kv => to.write(kv, &k, &v))
            }
            (CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
                let (k, v) = (rows_view(k, kl, "k")?, rows_view(v, vl, "v")?);
                with_kv!(&mut self.pools[layer], kv => to.write(kv, &k, &v))
            }
            _ if ks.dtype() != vs.dtype() => bail!(
                "sdpa-candle: k and v must have one dtype, got {:?} and {:?}",
                ks.dtype(),
                vs.dtype()
            ),
            _ => bail!(
                "sdpa-candle: k and v have dtype {:?}; f32, f16 and bf16 are supported",
                ks.dtype()
            ),
        }?;
        self.appended[layer] = true;
        Ok(())
    }

    /// Attention of layer `layer`'s queries over the cache: `q` `[1, total_q, H, d_k]` or
    /// `[total_q, H, d_k]` (any strides, f32, f16 or bf16; the step's packed rows, already
    /// rotated if the model uses RoPE, e.g. by [`PagedStep::rotate`]), with the step's options
    /// and this layer's attention sinks (one per query head, any float type) if given. The
    /// result is a new `[1, total_q, H, d_v]` (or `[total_q, H, d_v]`) tensor of Q's type.
    /// Needs the layer's rows appended first.
    ///
    /// # Errors
    /// A layer out of range or not yet appended this step, `q` not on the CPU, of another
    /// shape (the step's rows × the cache's heads and `d_k`) or type, and [`Plan::run`]'s
    /// errors (sinks) as candle errors.
    pub fn attention(
        &mut self,
        layer: usize,
        q: &Tensor,
        sinks: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.check_layer(layer)?;
        if !self.appended[layer] {
            bail!("sdpa-candle: layer {layer}: append this step's K and V before attention");
        }
        let sinks = match sinks {
            Some(s) => Some(s.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        let c = self.config;
        let want = [self.data.slots.len(), c.heads, c.d_k];
        if rows_dims(q.dims(), "q")? != want {
            bail!(
                "sdpa-candle: q must be {want:?} (rows, heads, d_k), got {:?}",
                q.dims()
            );
        }
        let out_dims: Vec<usize> = match q.rank() {
            3 => vec![want[0], c.heads, c.d_v],
            _ => vec![1, want[0], c.heads, c.d_v],
        };
        let (qs, ql) = q.storage_and_layout();
        let qs = cpu(&qs, "q")?;
        let run = Run {
            config: self.config,
            sinks: sinks.as_deref(),
            out_dims: &out_dims,
        };
        let plan = &mut self.plan;
        let pools = &self.pools[layer];
        match qs {
            CpuStorage::F32(q) => {
                let q = rows_view(q, ql, "q")?;
                with_kv!(pools, kv => run.attend(plan, kv, &q))
            }
            CpuStorage::F16(q) => {
                let q = rows_view(q, ql, "q")?;
                with_kv!(pools, kv => run.attend(plan, kv, &q))
            }
            CpuStorage::BF16(q) => {
                let q = rows_view(q, ql, "q")?;
                with_kv!(pools, kv => run.attend(plan, kv, &q))
            }
            other => bail!(
                "sdpa-candle: q has dtype {:?}; f32, f16 and bf16 are supported",
                other.dtype()
            ),
        }
    }

    /// `q` (`[total_q, heads, d]` or `[1, total_q, heads, d]`, f32, f16 or bf16) rotated by
    /// the step's rope at the rows' positions: a new tensor of `q`'s shape and type.
    ///
    /// # Errors
    /// A step without a rope, `q` of another rank, row count or type, and
    /// [`Rope::apply`]'s errors (the rotary dim against `d`).
    pub fn rotate(&self, q: &Tensor) -> Result<Tensor> {
        let Some(rope) = &self.rope else {
            bail!("sdpa-candle: the step has no rope to rotate with");
        };
        let [n, h, d] = rows_dims(q.dims(), "q")?;
        let positions = &self.data.positions;
        if n != positions.len() {
            bail!(
                "sdpa-candle: q has {n} rows, the step has {} new tokens",
                positions.len()
            );
        }
        fn rotated<T: Element + WithDType>(
            q: &Tensor,
            dims: [usize; 4],
            rope: &Rope<'_>,
            positions: &[u32],
        ) -> Result<Tensor> {
            let mut data = q.flatten_all()?.to_vec1::<T>()?;
            let mut view = TensorMut::bshd(&mut data, dims).map_err(candle_core::Error::wrap)?;
            rope.apply(&mut view, positions)
                .map_err(candle_core::Error::wrap)?;
            Tensor::from_vec(data, q.shape(), q.device())
        }
        let dims = [1, n, h, d];
        match q.dtype() {
            DType::F32 => rotated::<f32>(q, dims, rope, positions),
            DType::F16 => rotated::<f16>(q, dims, rope, positions),
            DType::BF16 => rotated::<bf16>(q, dims, rope, positions),
            other => bail!("sdpa-candle: q has dtype {other:?}; f32, f16 and bf16 are supported"),
        }
    }

    /// Ends the step, committing it (the sequences hold their new tokens).
    ///
    /// # Errors
    /// A layer was not appended: the step is rolled back instead (as when dropped).
    pub fn finish(self) -> Result<()> {
        if let Some(layer) = self.appended.iter().position(|&a| !a) {
            bail!("sdpa-candle: layer {layer} was not appended; the step is rolled back");
        }
        Ok(())
    }
}

/// Where [`PagedStep::append`] writes.
struct Target<'a> {
    config: &'a PagedKvConfig,
    slots: &'a [usize],
    rope: Option<(&'a Rope<'a>, &'a [u32])>,
}

impl Target<'_> {
    fn write<S: Element, T: KvElement>(
        &self,
        kv: &mut Kv<T>,
        k: &sdpa::Tensor<'_, S>,
        v: &sdpa::Tensor<'_, S>,
    ) -> Result<()> {
        let c = self.config;
        let wrap = candle_core::Error::wrap;
        let mut kc = TensorMut::bshd(&mut kv.k, c.pool(c.d_k)).map_err(wrap)?;
        let mut vc = TensorMut::bshd(&mut kv.v, c.pool(c.d_v)).map_err(wrap)?;
        let mut scales = match &mut kv.scales {
            Some((ks, vs)) => Some((
                TensorMut::bshd(ks, c.pool(1)).map_err(wrap)?,
                TensorMut::bshd(vs, c.pool(1)).map_err(wrap)?,
            )),
            None => None,
        };
        let scales = scales.as_mut().map(|(k, v)| (k, v));
        sdpa::append(k, v, &mut kc, &mut vc, self.slots, scales, self.rope).map_err(wrap)
    }
}

/// What [`PagedStep::attention`] runs with besides the plan and tensors.
struct Run<'a> {
    config: &'a PagedKvConfig,
    sinks: Option<&'a [f32]>,
    out_dims: &'a [usize],
}

impl Run<'_> {
    fn attend<Q: Element + WithDType, T: KvElement>(
        &self,
        plan: &mut Plan<'_>,
        kv: &Kv<T>,
        q: &sdpa::Tensor<'_, Q>,
    ) -> Result<Tensor> {
        let c = self.config;
        let wrap = candle_core::Error::wrap;
        let n = q.dims()[1];
        let dims = [1, n, c.heads, c.d_v];
        let mut out = vec![<Q as Element>::from_f32(0.0); n * c.heads * c.d_v];
        let k = sdpa::Tensor::bshd(&kv.k, c.pool(c.d_k)).map_err(wrap)?;
        let v = sdpa::Tensor::bshd(&kv.v, c.pool(c.d_v)).map_err(wrap)?;
        let mut layer = Layer::new();
        if let Some((ks, vs)) = &kv.scales {
            layer = layer.kv_scales(
                sdpa::Tensor::bshd(ks, c.pool(1)).map_err(wrap)?,
                sdpa::Tensor::bshd(vs, c.pool(1)).map_err(wrap)?,
            );
        }
        if let Some(s) = self.sinks {
            layer = layer.sinks(s);
        }
        let mut o = TensorMut::bshd(&mut out, dims).map_err(wrap)?;
        plan.run(q, &k, &v, &mut o, None, &layer).map_err(wrap)?;
        Tensor::from_vec(out, self.out_dims, &Device::Cpu)
    }
}
