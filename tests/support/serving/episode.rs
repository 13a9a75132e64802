//! One serving episode of [`super::check`], run and checked (see the parent module's docs).

use super::super::contract::{check_against_reference, Outputs, RowFacts, Tally};
use super::super::values::SplitMix;
use super::{Action, Fault, ServingCase, ServingStats, StepSpec, LAYERS, MAX_CHUNK, MAX_STEPS};
use sdpa::half::{bf16, f16};
use sdpa::reference;
use sdpa::{
    Alignment, Dim, Error, Heads, KvElement, KvPool, Layer, Operand, Options, PackedKv, PagedKv,
    Plan, Rope, StepKv, Tensor, TensorMut, VarlenKv,
};

/// A cache type and the value that fills the slots no sequence has written.
pub(super) trait Cache: KvElement + Default {
    const UNWRITTEN: Self;
}
impl Cache for f32 {
    const UNWRITTEN: Self = f32::NAN;
}
impl Cache for f16 {
    const UNWRITTEN: Self = f16::NAN;
}
impl Cache for bf16 {
    const UNWRITTEN: Self = bf16::NAN;
}
impl Cache for i8 {
    const UNWRITTEN: Self = 127;
}

/// The scale of `i8` slots no sequence has written: finite (a page a length reaches is checked
/// whole), and huge, so that a read would show.
const UNWRITTEN_SCALE: f32 = 1e30;

/// One layer's pools `[pages, page, H_kv, d]` and, for `i8`, scales `[pages, page, H_kv, 1]`.
#[derive(Clone)]
struct Pools<T> {
    k: Vec<T>,
    v: Vec<T>,
    ks: Vec<f32>,
    vs: Vec<f32>,
}

/// A live sequence: its pages and length.
#[derive(Debug, Clone, Default)]
struct Seq {
    pages: Vec<u32>,
    len: usize,
}

/// The shapes of an episode.
#[derive(Debug, Clone, Copy)]
struct Dims {
    h_kv: usize,
    h: usize,
    d_k: usize,
    d_v: usize,
    page: usize,
    pages: usize,
}

impl Dims {
    fn heads(&self) -> Heads {
        Heads {
            heads: self.h,
            kv_heads: self.h_kv,
            d_k: self.d_k,
            d_v: self.d_v,
        }
    }

    /// A pool of head size `d`, or its scales (`d = 1`).
    fn pool(&self, d: usize) -> [usize; 4] {
        [self.pages, self.page, self.h_kv, d]
    }
}

/// One step: its sequences (slot order) and rows.
struct Step {
    /// Query rows per sequence.
    cu_q: Vec<usize>,
    /// Keys before the step (`cache_seqlens`) and after it (`kv_lens`).
    cached: Vec<usize>,
    lens: Vec<usize>,
    /// The new rows' slots and positions.
    slots: Vec<usize>,
    positions: Vec<u32>,
    /// Each sequence's pages, and the block table (padded past them with entries that name no
    /// page of the pool).
    pages: Vec<Vec<u32>>,
    table: Vec<u32>,
    pps: usize,
}

/// Admits, grows and retires the sequences of `seqs` as `spec` says (rows capped by the free
/// pages), and lays out the step.
fn admit(spec: &StepSpec, seqs: &mut [Option<Seq>], free: &mut Vec<u32>, dims: Dims) -> Step {
    let page = dims.page;
    let mut step = Step {
        cu_q: vec![0],
        cached: vec![],
        lens: vec![],
        slots: vec![],
        positions: vec![],
        pages: vec![],
        table: vec![],
        pps: 0,
    };
    for (slot, action) in spec.actions.iter().enumerate() {
        let want = match (*action, &seqs[slot]) {
            (Action::Retire, Some(s)) => {
                free.extend(s.pages.iter().rev());
                seqs[slot] = None;
                continue;
            }
            (Action::Retire, None) | (Action::Wait, None) => continue,
            (Action::Wait, Some(_)) => 0,
            (Action::Rows(n), _) => n,
        };
        let s = seqs[slot].get_or_insert_with(Seq::default);
        let room = s.pages.len() * page - s.len + free.len() * page;
        let n = want.min(room);
        while s.pages.len() * page < s.len + n {
            s.pages.push(free.pop().expect("room counted"));
        }
        for t in s.len..s.len + n {
            step.slots
                .push(s.pages[t / page] as usize * page + t % page);
            step.positions.push(t as u32);
        }
        step.cached.push(s.len);
        s.len += n;
        step.lens.push(s.len);
        step.cu_q.push(step.slots.len());
        step.pages.push(s.pages.clone());
    }
    step.pps = step.pages.iter().map(Vec::len).max().unwrap_or(0);
    step.table = vec![dims.pages as u32 + 5; step.pages.len() * step.pps];
    for (b, p) in step.pages.iter().enumerate() {
        step.table[b * step.pps..][..p.len()].copy_from_slice(p);
    }
    step
}

/// Runs and checks one episode with caches of `T`.
pub(super) fn episode<T: Cache>(case: &ServingCase) -> ServingStats {
    let mut stats = ServingStats {
        cases: 1,
        ..Default::default()
    };
    let mut rng = SplitMix(case.seed);
    let dims = Dims {
        h_kv: case.kv_heads,
        h: case.kv_heads * case.group,
        d_k: case.d_k,
        d_v: case.d_v,
        page: case.page_size,
        pages: case.num_pages,
    };
    let mut layers: Vec<Pools<T>> = (0..LAYERS)
        .map(|_| Pools {
            k: vec![T::UNWRITTEN; dims.pool(dims.d_k).iter().product()],
            v: vec![T::UNWRITTEN; dims.pool(dims.d_v).iter().product()],
            ks: vec![UNWRITTEN_SCALE; dims.pool(1).iter().product()],
            vs: vec![UNWRITTEN_SCALE; dims.pool(1).iter().product()],
        })
        .collect();
    // The same layers as `KvPool`s (their own appends; `Plan::run_pool` must match).
    let mut kv_pools: Vec<KvPool<T>> = (0..LAYERS)
        .map(|_| KvPool::new(dims.pages, dims.page, dims.h_kv, dims.d_k, dims.d_v).unwrap())
        .collect();
    // Tables for positions 0 .. MAX_STEPS · MAX_CHUNK (a sequence never holds more).
    let half = case.rope.map_or(1, |r| r.half);
    let table_len = MAX_STEPS * MAX_CHUNK * half;
    let cos: Vec<f32> = (0..table_len).map(|_| rng.unit() as f32).collect();
    let sin: Vec<f32> = (0..table_len).map(|_| rng.unit() as f32).collect();
    let rope = case.rope.map(|r| match r.tables {
        true => Rope::with_tables(r.style, 2 * r.half, &cos, &sin),
        false => Rope::new(r.style, 2 * r.half, 10_000.0),
    });
    let mut free: Vec<u32> = (0..dims.pages as u32).rev().collect();
    let mut seqs: Vec<Option<Seq>> = vec![None; super::SEQS];
    for (i, spec) in case.steps.iter().enumerate() {
        let step = admit(spec, &mut seqs, &mut free, dims);
        stats.steps += usize::from(!step.slots.is_empty());
        let what = format!("{case:?} step {i}");
        let mut base = Options::new().causal(Alignment::BottomRight);
        if let Some(w) = case.window {
            base = base.sliding_window(w, 0, Alignment::BottomRight);
        }
        if case.softcap {
            base = base.softcap(4.0);
        }
        let opts = match spec.kv_lens {
            true => base.kv_lens(&step.lens),
            false => base.cache_seqlens(&step.cached),
        };
        // Packed K/V: each sequence's keys gathered, in sequence order.
        let mut cu_k = vec![0];
        for &l in &step.lens {
            cu_k.push(cu_k.last().unwrap() + l);
        }
        let paged = StepKv::Paged {
            block_table: &step.table,
            pages_per_seq: step.pps,
            page_size: dims.page,
        };
        let plan = |kv| {
            Plan::new(&step.cu_q, kv, dims.heads(), &opts)
                .unwrap_or_else(|e| panic!("{what}: plan: {e}"))
        };
        let mut paged_plan = plan(paged);
        let packed = StepKv::Packed {
            cu_seqlens_k: &cu_k,
        };
        let mut packed_plan = spec.packed.then(|| plan(packed));
        for (l, (pools, kv_pool)) in layers.iter_mut().zip(&mut kv_pools).enumerate() {
            let what = format!("{what} layer {l}");
            let (n, h, h_kv) = (step.slots.len(), dims.h, dims.h_kv);
            let k_new: Vec<f32> = (0..n * h_kv * dims.d_k)
                .map(|_| 2.0 * rng.unit() as f32)
                .collect();
            let v_new: Vec<f32> = (0..n * h_kv * dims.d_v)
                .map(|_| 2.0 * rng.unit() as f32)
                .collect();
            let sinks: Vec<f32> = (0..h).map(|_| rng.unit() as f32).collect();
            let mut q: Vec<f32> = (0..n * h * dims.d_k).map(|_| rng.unit() as f32).collect();
            let kt = Tensor::bshd(&k_new, [1, n, h_kv, dims.d_k]).unwrap();
            let vt = Tensor::bshd(&v_new, [1, n, h_kv, dims.d_v]).unwrap();
            let rope = rope.as_ref().map(|r| (r, &step.positions[..]));
            append_layer(
                &what,
                dims,
                spec,
                &step,
                pools,
                (&kt, &vt),
                rope,
                &mut stats,
            );
            kv_pool
                .append(&kt, &vt, &step.slots, rope)
                .unwrap_or_else(|e| panic!("{what}: KvPool::append: {e}"));
            // Attention: Q rotated at the same positions.
            if let Some((r, positions)) = rope {
                let mut qv = TensorMut::bshd(&mut q, [1, n, h, dims.d_k]).unwrap();
                r.apply(&mut qv, positions).unwrap();
            }
            let qt = Tensor::bshd(&q, [1, n, h, dims.d_k]).unwrap();
            let mut ref_opts = opts.clone();
            if case.sinks {
                ref_opts = ref_opts.sinks(&sinks);
            }
            let sinks = case.sinks.then_some(&sinks[..]);
            let runs = Runs {
                what: &what,
                q: &qt,
                cu_q: &step.cu_q,
                d_v: dims.d_v,
                sinks,
                opts: &ref_opts,
            };
            let layer_pools = (&*pools, &*kv_pool);
            let paged_ref = runs.paged(dims, spec, &step, layer_pools, &mut paged_plan, &mut stats);
            if let Some(plan) = packed_plan.as_mut() {
                runs.packed(dims, &step, &cu_k, pools, plan, &paged_ref, &mut stats);
            }
        }
    }
    stats
}

/// The step's new rows into one layer's pools: first the drawn fault (the same error from
/// `append` and `reference::append`, nothing written), then the rows, checked against
/// `reference::append` on the same pools.
#[allow(clippy::too_many_arguments)]
fn append_layer<T: Cache>(
    what: &str,
    dims: Dims,
    spec: &StepSpec,
    step: &Step,
    pools: &mut Pools<T>,
    kv: (&Tensor<'_, f32>, &Tensor<'_, f32>),
    rope: Option<(&Rope<'_>, &[u32])>,
    stats: &mut ServingStats,
) {
    let (slots, n) = (&step.slots, step.slots.len());
    let at = spec.at as usize;
    let bad_slots = match spec.fault {
        Fault::SlotPastCache if n > 0 => {
            let mut s = slots.clone();
            s[at % n] = dims.pages * dims.page + at % 3;
            Some(s)
        }
        Fault::SlotTwice if n > 1 => {
            let mut s = slots.clone();
            let i = 1 + at % (n - 1);
            s[i] = s[i - 1];
            Some(s)
        }
        _ => None,
    };
    if let Some(bad) = bad_slots {
        let mut errors = vec![];
        for reference in [false, true] {
            let mut p = pools.clone();
            let r = write::<T>(&mut p, dims, kv, &bad, rope, reference);
            let err = r.expect_err(&format!("{what}: append with slots {bad:?}"));
            let slots_error = matches!(
                err,
                Error::InvalidValue {
                    operand: Operand::Slots,
                    ..
                }
            );
            assert!(slots_error, "{what}: {err}");
            let unchanged = same(&p.k, &pools.k)
                && same(&p.v, &pools.v)
                && bits(&p.ks) == bits(&pools.ks)
                && bits(&p.vs) == bits(&pools.vs);
            assert!(unchanged, "{what}: a failed append wrote");
            errors.push(err);
        }
        assert_eq!(errors[0], errors[1], "{what}: append errors");
        stats.rejected += 1;
    }
    let mut want = pools.clone();
    write::<T>(pools, dims, kv, slots, rope, false)
        .unwrap_or_else(|e| panic!("{what}: append: {e}"));
    write::<T>(&mut want, dims, kv, slots, rope, true)
        .unwrap_or_else(|e| panic!("{what}: reference append: {e}"));
    let k_rows: Vec<f64> = match rope {
        Some((r, positions)) => reference::rope(r, kv.0, positions).unwrap(),
        None => kv.0.data().iter().map(|&x| f64::from(x)).collect(),
    };
    let v_rows: Vec<f64> = kv.1.data().iter().map(|&x| f64::from(x)).collect();
    compare_caches(what, pools, &want, slots, dims, (&k_rows, &v_rows));
    stats.appends += 1;
}

/// What a layer's runs share: its rotated Q, the step's rows, sinks and reference options.
struct Runs<'a> {
    what: &'a str,
    q: &'a Tensor<'a, f32>,
    cu_q: &'a [usize],
    d_v: usize,
    sinks: Option<&'a [f32]>,
    /// The step's options with the layer's sinks (the references take them there).
    opts: &'a Options<'a>,
}

impl Runs<'_> {
    /// Output `[1, total_q, H, d_v]` and LSE `[H, total_q]` buffers, NaN: the checker's layout
    /// with one batch.
    fn buffers(&self) -> Outputs {
        let [_, n, h, _] = self.q.dims();
        let d_v = self.d_v;
        Outputs {
            dims: [1, n, h, d_v],
            out: vec![f32::NAN; n * h * d_v],
            lse: vec![f32::NAN; h * n],
        }
    }

    /// `plan.run`, or the reference (`kv`) with `opts`, into fresh buffers.
    fn run<T: KvElement>(
        &self,
        call: Call<'_, '_, T>,
        layer: &Layer<'_>,
        opts: &Options<'_>,
    ) -> Result<Outputs, Error> {
        let mut o = self.buffers();
        let mut view = TensorMut::bshd(&mut o.out, o.dims).unwrap();
        match call {
            Call::Plan(plan, k, v) => plan.run(self.q, k, v, &mut view, Some(&mut o.lse), layer),
            Call::Reference(kv) => reference::attention_varlen(
                self.q,
                self.cu_q,
                kv,
                &mut view,
                Some(&mut o.lse),
                opts,
            ),
        }?;
        Ok(o)
    }

    /// The fused result against the reference and its bounds.
    fn check<T: KvElement>(
        &self,
        fused: &Outputs,
        reference: &Outputs,
        kv: &VarlenKv<'_, T>,
        opts: &Options<'_>,
        how: &str,
    ) -> Tally {
        let bounds = reference::error_bounds_varlen(self.q, self.cu_q, kv, opts)
            .unwrap_or_else(|e| panic!("{}: {how} bounds: {e}", self.what));
        let label = format!("{} {how}", self.what);
        check_against_reference(fused, reference, &bounds, |_| RowFacts::FINITE, &label)
    }

    /// The paged plan (after the drawn short-pool fault: an error, nothing written) against
    /// the paged reference, and its run on the layer's `KvPool` against its run on the views,
    /// bit for bit; returns the reference's result.
    fn paged<T: Cache>(
        &self,
        dims: Dims,
        spec: &StepSpec,
        step: &Step,
        (pools, kv_pool): (&Pools<T>, &KvPool<T>),
        plan: &mut Plan<'_>,
        stats: &mut ServingStats,
    ) -> Outputs {
        let what = self.what;
        let (kd, vd, sd) = (dims.pool(dims.d_k), dims.pool(dims.d_v), dims.pool(1));
        let scales = T::QUANTIZED.then(|| {
            (
                Tensor::bshd(&pools.ks, sd).unwrap(),
                Tensor::bshd(&pools.vs, sd).unwrap(),
            )
        });
        let layer = layer(scales, self.sinks);
        let reached = step
            .table
            .iter()
            .filter(|&&e| (e as usize) < dims.pages)
            .map(|&e| e as usize + 1)
            .max()
            .unwrap_or(0);
        if spec.fault == Fault::FewPages && reached > 0 {
            let short = reached - 1;
            let per_page = |d: usize| dims.page * dims.h_kv * d;
            let (ks, vs) = (
                &pools.k[..short * per_page(dims.d_k)],
                &pools.v[..short * per_page(dims.d_v)],
            );
            let kt = Tensor::bshd(ks, [short, dims.page, dims.h_kv, dims.d_k]).unwrap();
            let vt = Tensor::bshd(vs, [short, dims.page, dims.h_kv, dims.d_v]).unwrap();
            let mut o = self.buffers();
            let mut view = TensorMut::bshd(&mut o.out, o.dims).unwrap();
            let r = plan.run(self.q, &kt, &vt, &mut view, Some(&mut o.lse), &layer);
            let err = r.expect_err(&format!("{what}: a pool of {short} pages"));
            let key_pages = matches!(
                err,
                Error::ShapeMismatch {
                    operand: Operand::Key,
                    dim: Dim::Batch,
                    ..
                }
            );
            assert!(key_pages, "{what}: {err}");
            let untouched = o.out.iter().chain(&o.lse).all(|x| x.is_nan());
            assert!(untouched, "{what}: a failed run wrote");
            stats.rejected += 1;
        }
        let kp = Tensor::bshd(&pools.k, kd).unwrap();
        let vp = Tensor::bshd(&pools.v, vd).unwrap();
        let fused = self
            .run(Call::Plan(plan, &kp, &vp), &layer, self.opts)
            .unwrap_or_else(|e| panic!("{what}: run: {e}"));
        let mut o = self.buffers();
        let mut view = TensorMut::bshd(&mut o.out, o.dims).unwrap();
        let sinks_only = self.sinks.map_or(Layer::new(), |s| Layer::new().sinks(s));
        plan.run_pool(self.q, kv_pool, &mut view, Some(&mut o.lse), &sinks_only)
            .unwrap_or_else(|e| panic!("{what}: run_pool: {e}"));
        let same_bits = bits(&o.out) == bits(&fused.out) && bits(&o.lse) == bits(&fused.lse);
        assert!(same_bits, "{what}: run_pool differs from run on the views");
        let kv = VarlenKv::Paged(PagedKv::new(kp, vp, &step.table, step.pps).unwrap());
        let mut opts = self.opts.clone();
        if let Some((k, v)) = scales {
            opts = opts.kv_scales(k, v);
        }
        let reference = self
            .run(Call::Reference(&kv), &layer, &opts)
            .unwrap_or_else(|e| panic!("{what}: reference: {e}"));
        stats.tally(self.check(&fused, &reference, &kv, &opts, "paged"));
        stats.paged_runs += 1;
        reference
    }

    /// The packed plan on the sequences' keys (and scales) gathered, against the packed
    /// reference, which must equal the paged one (`paged_ref`) bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn packed<T: Cache>(
        &self,
        dims: Dims,
        step: &Step,
        cu_k: &[usize],
        pools: &Pools<T>,
        plan: &mut Plan<'_>,
        paged_ref: &Outputs,
        stats: &mut ServingStats,
    ) {
        let what = self.what;
        let total_k = *cu_k.last().unwrap();
        let h_kv = dims.h_kv;
        // Sequence b's keys 0 .. lens[b], from its pages, in order.
        let gather = |x: &[T], d: usize| -> Vec<T> {
            let mut out = Vec::with_capacity(total_k * h_kv * d);
            for (pages, &len) in step.pages.iter().zip(&step.lens) {
                for t in 0..len {
                    let slot = pages[t / dims.page] as usize * dims.page + t % dims.page;
                    out.extend_from_slice(&x[slot * h_kv * d..][..h_kv * d]);
                }
            }
            out
        };
        let gather_scales = |x: &[f32]| -> Vec<f32> {
            let mut out = Vec::with_capacity(total_k * h_kv);
            for (pages, &len) in step.pages.iter().zip(&step.lens) {
                for t in 0..len {
                    let slot = pages[t / dims.page] as usize * dims.page + t % dims.page;
                    out.extend_from_slice(&x[slot * h_kv..][..h_kv]);
                }
            }
            out
        };
        let (kx, vx) = (gather(&pools.k, dims.d_k), gather(&pools.v, dims.d_v));
        let (ksx, vsx) = (gather_scales(&pools.ks), gather_scales(&pools.vs));
        let kt = Tensor::bshd(&kx, [1, total_k, h_kv, dims.d_k]).unwrap();
        let vt = Tensor::bshd(&vx, [1, total_k, h_kv, dims.d_v]).unwrap();
        let sd = [1, total_k, h_kv, 1];
        let scales = T::QUANTIZED.then(|| {
            (
                Tensor::bshd(&ksx, sd).unwrap(),
                Tensor::bshd(&vsx, sd).unwrap(),
            )
        });
        let layer = layer(scales, self.sinks);
        let fused = self
            .run(Call::Plan(plan, &kt, &vt), &layer, self.opts)
            .unwrap_or_else(|e| panic!("{what}: packed run: {e}"));
        let kv = VarlenKv::Packed(PackedKv::new(kt, vt, cu_k));
        let mut opts = self.opts.clone();
        if let Some((k, v)) = scales {
            opts = opts.kv_scales(k, v);
        }
        let reference = self
            .run(Call::Reference(&kv), &layer, &opts)
            .unwrap_or_else(|e| panic!("{what}: packed reference: {e}"));
        assert_eq!(
            bits(&reference.out),
            bits(&paged_ref.out),
            "{what}: packed reference output"
        );
        assert_eq!(
            bits(&reference.lse),
            bits(&paged_ref.lse),
            "{what}: packed reference lse"
        );
        stats.tally(self.check(&fused, &reference, &kv, &opts, "packed"));
        stats.packed_runs += 1;
    }
}

/// A layer's `Layer`: the scales of `i8` pools, the sinks.
fn layer<'l>(
    scales: Option<(Tensor<'l, f32>, Tensor<'l, f32>)>,
    sinks: Option<&'l [f32]>,
) -> Layer<'l> {
    let mut layer = Layer::new();
    if let Some((k, v)) = scales {
        layer = layer.kv_scales(k, v);
    }
    if let Some(s) = sinks {
        layer = layer.sinks(s);
    }
    layer
}

/// A run of a layer: a plan with the layer's pools, or the reference on the same K/V.
enum Call<'p, 'a, T> {
    Plan(&'p mut Plan<'a>, &'p Tensor<'p, T>, &'p Tensor<'p, T>),
    Reference(&'p VarlenKv<'p, T>),
}

/// `sdpa::append` (or `reference::append`) of the rows `kv` into `pools` at `slots`.
fn write<T: KvElement>(
    pools: &mut Pools<T>,
    dims: Dims,
    (k, v): (&Tensor<'_, f32>, &Tensor<'_, f32>),
    slots: &[usize],
    rope: Option<(&Rope<'_>, &[u32])>,
    reference: bool,
) -> Result<(), Error> {
    let mut kc = TensorMut::bshd(&mut pools.k, dims.pool(dims.d_k)).unwrap();
    let mut vc = TensorMut::bshd(&mut pools.v, dims.pool(dims.d_v)).unwrap();
    let mut ks = TensorMut::bshd(&mut pools.ks, dims.pool(1)).unwrap();
    let mut vs = TensorMut::bshd(&mut pools.vs, dims.pool(1)).unwrap();
    let scales = T::QUANTIZED.then_some((&mut ks, &mut vs));
    match reference {
        true => reference::append(k, v, &mut kc, &mut vc, slots, scales, rope),
        false => sdpa::append(k, v, &mut kc, &mut vc, slots, scales, rope),
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The same values, bit for bit (through f64, exact for every K/V type).
fn same<T: KvElement>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

/// The caches `got` (after `sdpa::append`) against `want` (after `reference::append`): the
/// same bits for float types; for `i8` the same scales and values equal but at near-ties of
/// the quotient (`rows`: the appended K and V rows, K rotated, in f64, `[token][head][c]`).
fn compare_caches<T: KvElement>(
    what: &str,
    got: &Pools<T>,
    want: &Pools<T>,
    slots: &[usize],
    dims: Dims,
    rows: (&[f64], &[f64]),
) {
    let h_kv = dims.h_kv;
    assert_eq!(bits(&got.ks), bits(&want.ks), "{what}: K scales");
    assert_eq!(bits(&got.vs), bits(&want.vs), "{what}: V scales");
    for (name, d, rows, g, w, scales) in [
        ("K", dims.d_k, rows.0, &got.k, &want.k, &want.ks),
        ("V", dims.d_v, rows.1, &got.v, &want.v, &want.vs),
    ] {
        if same(g, w) {
            continue;
        }
        assert!(
            T::QUANTIZED,
            "{what}: {name} cache differs from reference::append"
        );
        for (e, (x, y)) in g.iter().zip(w.iter()).enumerate() {
            let (x, y) = (x.to_f64(), y.to_f64());
            if x == y {
                continue;
            }
            let (slot, hk, c) = (e / (h_kv * d), e / d % h_kv, e % d);
            let at = format!("{what}: {name} slot {slot} head {hk} channel {c}");
            let t = slots.iter().position(|&s| s == slot);
            let t = t.unwrap_or_else(|| panic!("{at}: changed, not appended"));
            let s = f64::from(scales[slot * h_kv + hk]);
            let z = f64::from(rows[(t * h_kv + hk) * d + c] as f32) / s;
            let near_tie = (z - (x + y) / 2.0).abs() <= 127.0 / (1u64 << 24) as f64;
            assert!(
                (x - y).abs() == 1.0 && near_tie,
                "{at}: {x} vs reference {y} (quotient {z})"
            );
        }
    }
}
