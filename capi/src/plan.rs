//! A serving step's plan through the C ABI ([`SdpaPlan`], the Rust `sdpa::Plan`):
//! `sdpa_plan_new` validates the step once and copies every array and tensor the plan reads
//! from its arguments and options, so the handle borrows nothing from the caller;
//! `sdpa_plan_run` checks and runs one layer's tensors; `sdpa_plan_free` drops the handle.
//!
//! The handle owns the copies ([`Frozen`]) and the `Plan` that borrows them: a self-referential
//! value, sound because the copies live in one heap allocation that is never moved, written
//! or freed while the plan lives, and the plan is dropped first (field order).

use std::ptr::NonNull;

use sdpa::{Element, Heads, KvElement, Layer, Operand, Plan, StepKv, Tensor, TensorMut};

use crate::abi::{SdpaOptions, SdpaPlanArgs, SdpaPlanRunArgs, SdpaStatus};
use crate::call::{kv_arrays, KvArrays};
use crate::dispatch::{any_input, any_kv, any_output, run_any, Kernel};
use crate::options::{copy_array, kv_scales, read_options, OwnedOptions};
use crate::status::Failure;
use crate::threads::in_pool;
use crate::validate::{dtype, input_array, offsets, output_array, read_versioned, Span};

/// A serving step's attention plan (opaque): made by `sdpa_plan_new`, run once per layer by
/// `sdpa_plan_run`, freed by `sdpa_plan_free`.
pub struct SdpaPlan {
    /// Borrows `step` (its `'static` is a stand-in for "as long as `step`"): declared first,
    /// so dropped first.
    plan: Plan<'static>,
    #[expect(
        dead_code,
        reason = "read through `plan`, owned here to be dropped after it"
    )]
    step: Frozen<Step>,
}

/// The library's copies of what a plan borrows.
struct Step {
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    table: Vec<u32>,
    opts: OwnedOptions,
}

/// A value on the heap that borrows may point into while it lives: allocated once, never
/// moved, written or reallocated, freed when this drops.
struct Frozen<T>(NonNull<T>);

impl<T> Frozen<T> {
    fn new(value: T) -> Self {
        Self(NonNull::from(Box::leak(Box::new(value))))
    }

    /// The value, borrowed for a lifetime the caller chooses.
    ///
    /// # Safety
    /// The borrow must end before `self` drops.
    unsafe fn get<'a>(&self) -> &'a T {
        // SAFETY: the allocation is live until `drop` and never written while `self` lives;
        // the caller bounds the borrow by `self`'s life.
        unsafe { self.0.as_ref() }
    }
}

impl<T> Drop for Frozen<T> {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `Box::leak` in `new` and is freed once, here; no borrow
        // from `get` outlives `self` (its contract).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// # Safety
/// As `sdpa_plan_new`.
pub(crate) unsafe fn plan_new_entry(
    args: *const SdpaPlanArgs,
    opts: *const SdpaOptions,
    out: *mut *mut SdpaPlan,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            "out: pointer is NULL",
        ));
    }
    // SAFETY (the blocks up to `Frozen::new`): the caller's contract, forwarded.
    let a = unsafe { read_versioned(args, &[], "plan args") }?.0;
    // The plan copies what it reads: the spans of the caller's buffers are not needed.
    let mut spans = Vec::new();
    let cu_q = unsafe {
        offsets(
            a.cu_seqlens_q,
            a.cu_seqlens_q_len,
            Operand::CuSeqlensQ,
            &mut spans,
        )
    }?;
    let arrays = unsafe {
        kv_arrays(
            a.kv_layout,
            (a.cu_seqlens_k, a.cu_seqlens_k_len),
            (a.block_table, a.block_table_len, a.pages_per_seq),
            (
                "block_table, block_table_len, pages_per_seq and page_size",
                a.page_size != 0,
            ),
            &mut spans,
        )
    }?;
    let opts = unsafe { read_options(opts, &mut spans) }?;
    if opts.kv_scales.is_some() {
        return Err(Failure::from(sdpa::Error::InvalidValue {
            operand: Operand::KeyScales,
            index: 0,
            reason: "a plan takes i8 scales per layer (sdpa_plan_run_args), not in its options",
        }));
    }
    let (cu_k, table, pages_per_seq) = match arrays {
        KvArrays::Packed(cu_k) => (cu_k, Vec::new(), None),
        KvArrays::Paged(p) => (Vec::new(), copy_array(p.table)?, Some(p.pages_per_seq)),
    };
    let opts = opts.into_owned()?;
    let step = Frozen::new(Step {
        cu_q,
        cu_k,
        table,
        opts,
    });
    // SAFETY: what borrows `s` is the plan below, which either fails here (its error borrows
    // nothing) or is stored beside `step` in one handle, declared before it and so dropped
    // before it: no borrow outlives `step`.
    let s: &'static Step = unsafe { step.get() };
    let kv = match pages_per_seq {
        None => StepKv::Packed {
            cu_seqlens_k: &s.cu_k,
        },
        Some(pages_per_seq) => StepKv::Paged {
            block_table: &s.table,
            pages_per_seq,
            page_size: a.page_size,
        },
    };
    let heads = Heads {
        heads: a.heads,
        kv_heads: a.kv_heads,
        d_k: a.d_k,
        d_v: a.d_v,
    };
    let plan = Plan::new(&s.cu_q, kv, heads, &s.opts.options()?)?;
    let handle = Box::into_raw(Box::new(SdpaPlan { plan, step }));
    // SAFETY: `out` is not NULL (checked) and valid for a write of a pointer (the caller's
    // contract); it may hold anything before, and need not be aligned.
    unsafe { out.write_unaligned(handle) };
    Ok(())
}

/// One layer for the dispatch: the plan and the layer's scales and sinks.
struct PlanLayer<'p, 'l> {
    plan: &'p mut Plan<'static>,
    layer: Layer<'l>,
}

impl Kernel for PlanLayer<'_, '_> {
    fn run<Q: Element, KV: KvElement, O: Element>(
        &mut self,
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out: &mut TensorMut<'_, O>,
        lse: Option<&mut [f32]>,
    ) -> Result<(), sdpa::Error> {
        self.plan.run(q, k, v, out, lse, &self.layer)
    }
}

/// # Safety
/// As `sdpa_plan_run`.
pub(crate) unsafe fn plan_run_entry(
    plan: *mut SdpaPlan,
    args: *const SdpaPlanRunArgs,
) -> Result<(), Failure> {
    if plan.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            "plan: pointer is NULL",
        ));
    }
    // SAFETY (all blocks but the last): the caller's contract, forwarded.
    let a = unsafe { read_versioned(args, &[], "plan run args") }?.0;
    let (q_type, kv_type) = (dtype(a.q_dtype, "q_dtype")?, dtype(a.kv_dtype, "kv_dtype")?);
    let out_type = dtype(a.out_dtype, "out_dtype")?;
    let mut spans = Vec::new();
    let q = unsafe { any_input(&a.q, Operand::Query, q_type, &mut spans) }?;
    let kv = unsafe { any_kv(&a.k, &a.v, kv_type, &mut spans) }?;
    let scales = unsafe { kv_scales(&a.k_scales, &a.v_scales, "plan run args", &mut spans) }?;
    let sinks = unsafe { input_array(a.sinks, a.sinks_len, "sinks", &mut spans) }?;
    let (mut out, out_span) = unsafe { any_output(&a.out, out_type, &spans) }?;
    spans.push(out_span);
    let lse = unsafe { output_array(a.lse, a.lse_len, &spans, "lse") }?;
    let mut layer = Layer::new();
    if let Some((k, v)) = scales {
        layer = layer.kv_scales(k, v);
    }
    if let Some(sinks) = sinks {
        layer = layer.sinks(sinks);
    }
    // SAFETY: `plan` is not NULL (checked) and, by the caller's contract, came from
    // `sdpa_plan_new`, is not freed and no other call uses it meanwhile.
    let plan = unsafe { &mut (*plan).plan };
    let mut kernel = PlanLayer { plan, layer };
    in_pool(move || run_any(&mut kernel, &q, &kv, &mut out, lse))??;
    Ok(())
}

/// # Safety
/// As `sdpa_plan_new_rows`.
pub(crate) unsafe fn plan_new_rows_entry(
    plan: *const SdpaPlan,
    slots: *mut usize,
    positions: *mut u32,
    n: usize,
) -> Result<(), Failure> {
    if plan.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            "plan: pointer is NULL",
        ));
    }
    // SAFETY: the caller's contract, forwarded (`slots` is checked against nothing read, then
    // `positions` against `slots`).
    let slots = unsafe { output_array(slots, n, &[], "slots") }?;
    let reads: Vec<Span> = slots.iter().map(|s| Span::of(s)).collect();
    // SAFETY: as above.
    let positions = unsafe { output_array(positions, n, &reads, "positions") }?;
    // SAFETY: `plan` is not NULL (checked) and, by the caller's contract, came from
    // `sdpa_plan_new`, is not freed and no call changes it meanwhile.
    let plan = unsafe { &(*plan).plan };
    plan.new_rows(slots.unwrap_or_default(), positions.unwrap_or_default())?;
    Ok(())
}

/// # Safety
/// As `sdpa_plan_free`.
pub(crate) unsafe fn plan_free_entry(plan: *mut SdpaPlan) -> Result<(), Failure> {
    if !plan.is_null() {
        // SAFETY: by the caller's contract, `plan` came from `sdpa_plan_new` (`Box::into_raw`)
        // and is freed once.
        drop(unsafe { Box::from_raw(plan) });
    }
    Ok(())
}
