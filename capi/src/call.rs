//! The bodies of the entry points: reading the argument and option structs, validating every
//! operand, building the Rust options, and running the typed call on the selected pool.

use sdpa::{Operand, Partial};

use crate::abi::{
    SdpaAttentionArgs, SdpaMergeArgs, SdpaOptions, SdpaPagedArgs, SdpaStatus, SdpaTensor,
    SdpaTensorMut, SdpaVarlenArgs, ATTENTION_ARGS_V1_SIZE, SDPA_KV_PACKED, SDPA_KV_PAGED,
};
use crate::dispatch::{
    any_input, any_kv, any_output, run_any, AnyKv, AnyTensor, Attention, Call, Pages, VarlenLayout,
};
use crate::options::{read_options, OptionInputs};
use crate::status::Failure;
use crate::threads::in_pool;
use crate::validate::{
    dtype, input, input_array, offsets, output, output_array, read_versioned, required_array,
    Dtype, Span,
};

/// Everything an attention call reads, validated and borrowed from the caller.
struct Inputs<'a> {
    q: AnyTensor<'a>,
    kv: AnyKv<'a>,
    spans: Vec<Span>,
    opts: OptionInputs<'a>,
}

/// Q, K, V (K and V as dense tensors, page pools or packed rows: read alike) and the options.
///
/// # Safety
/// The pointers in the tensors and `opts` must be valid as the header documents.
unsafe fn read_inputs<'a>(
    [q, k, v]: [&SdpaTensor; 3],
    types: &Types,
    opts: *const SdpaOptions,
) -> Result<Inputs<'a>, Failure> {
    let mut spans = Vec::new();
    // SAFETY (all blocks below): the caller's contract, forwarded.
    let q = unsafe { any_input(q, Operand::Query, types.q, &mut spans) }?;
    let kv = unsafe { any_kv(k, v, types.kv, &mut spans) }?;
    let opts = unsafe { read_options(opts, &mut spans) }?;
    Ok(Inputs { q, kv, spans, opts })
}

/// The element types of an attention call.
struct Types {
    q: Dtype,
    kv: Dtype,
    out: Dtype,
}

impl Types {
    /// The types `args` declares; `caller_size` tells whether it has the fields added after
    /// the first version (absent: every operand has `q_dtype`, the first version's `dtype`).
    fn of(args: &SdpaAttentionArgs, caller_size: usize) -> Result<Self, Failure> {
        let q = dtype(args.q_dtype, "q_dtype")?;
        if caller_size <= ATTENTION_ARGS_V1_SIZE {
            return Ok(Self { q, kv: q, out: q });
        }
        Ok(Self {
            q,
            kv: dtype(args.kv_dtype, "kv_dtype")?,
            out: dtype(args.out_dtype, "out_dtype")?,
        })
    }
}

/// # Safety
/// As `sdpa_attention`.
pub(crate) unsafe fn attention_entry(
    args: *const SdpaAttentionArgs,
    opts: *const SdpaOptions,
    call: Call<'_>,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let (args, caller_size) =
        unsafe { read_versioned(args, &[ATTENTION_ARGS_V1_SIZE], "attention args") }?;
    let types = Types::of(&args, caller_size)?;
    let outputs = (&args.out, args.lse, args.lse_len);
    unsafe {
        attend(
            [&args.q, &args.k, &args.v],
            &types,
            opts,
            outputs,
            Vec::new(),
            call,
        )
    }
}

/// What every attention entry point does once its struct is read: validates Q, K, V and the
/// options, then the outputs against every span the call reads (`layout`: the spans of the
/// arrays that place the rows, already read into `call`), and runs the typed call on the pool.
///
/// # Safety
/// The pointers in the tensors, `opts` and the outputs must be valid as the header documents.
unsafe fn attend(
    tensors: [&SdpaTensor; 3],
    types: &Types,
    opts: *const SdpaOptions,
    (out, lse, lse_len): (&SdpaTensorMut, *mut f32, usize),
    layout: Vec<Span>,
    call: Call<'_>,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let inputs = unsafe { read_inputs(tensors, types, opts) }?;
    let rust_opts = inputs.opts.options()?;
    let mut reads = layout;
    reads.extend_from_slice(&inputs.spans);
    let (mut out, out_span) = unsafe { any_output(out, types.out, &reads) }?;
    reads.push(out_span);
    let lse = unsafe { output_array(lse, lse_len, &reads, "lse") }?;
    let (q, kv) = (&inputs.q, &inputs.kv);
    let mut kernel = Attention {
        call,
        opts: &rust_opts,
    };
    in_pool(move || run_any(&mut kernel, q, kv, &mut out, lse))??;
    Ok(())
}

/// The element types of a paged or varlen call (structs without a first version).
fn types(q: u32, kv: u32, out: u32) -> Result<Types, Failure> {
    Ok(Types {
        q: dtype(q, "q_dtype")?,
        kv: dtype(kv, "kv_dtype")?,
        out: dtype(out, "out_dtype")?,
    })
}

/// # Safety
/// As `sdpa_attention_paged`.
pub(crate) unsafe fn paged_entry(
    args: *const SdpaPagedArgs,
    opts: *const SdpaOptions,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let args = unsafe { read_versioned(args, &[], "paged args") }?.0;
    let types = types(args.q_dtype, args.kv_dtype, args.out_dtype)?;
    let mut layout = Vec::new();
    let table = unsafe {
        required_array(
            args.block_table,
            args.block_table_len,
            "block table",
            &mut layout,
        )
    }?;
    let call = Call::Paged(Pages {
        table,
        pages_per_seq: args.pages_per_seq,
    });
    let outputs = (&args.out, args.lse, args.lse_len);
    unsafe {
        attend(
            [&args.q, &args.k, &args.v],
            &types,
            opts,
            outputs,
            layout,
            call,
        )
    }
}

/// # Safety
/// As `sdpa_attention_varlen`.
pub(crate) unsafe fn varlen_entry(
    args: *const SdpaVarlenArgs,
    opts: *const SdpaOptions,
) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let args = unsafe { read_versioned(args, &[], "varlen args") }?.0;
    let types = types(args.q_dtype, args.kv_dtype, args.out_dtype)?;
    let mut layout = Vec::new();
    let cu_q = unsafe {
        offsets(
            args.cu_seqlens_q,
            args.cu_seqlens_q_len,
            Operand::CuSeqlensQ,
            &mut layout,
        )
    }?;
    let arrays = unsafe {
        kv_arrays(
            args.kv_layout,
            (args.cu_seqlens_k, args.cu_seqlens_k_len),
            (args.block_table, args.block_table_len, args.pages_per_seq),
            ("block_table, block_table_len and pages_per_seq", false),
            &mut layout,
        )
    }?;
    let kv = match &arrays {
        KvArrays::Packed(cu_k) => VarlenLayout::Packed { cu_seqlens_k: cu_k },
        KvArrays::Paged(pages) => VarlenLayout::Paged(*pages),
    };
    let call = Call::Varlen {
        cu_seqlens_q: &cu_q,
        kv,
    };
    let outputs = (&args.out, args.lse, args.lse_len);
    unsafe {
        attend(
            [&args.q, &args.k, &args.v],
            &types,
            opts,
            outputs,
            layout,
            call,
        )
    }
}

/// Where the keys of a varlen call or a plan lie: converted key offsets or a block table.
pub(crate) enum KvArrays<'a> {
    Packed(Vec<usize>),
    Paged(Pages<'a>),
}

/// The K/V arrays of `kv_layout` (`SDPA_KV_*`): key offsets `(cu_seqlens_k, len)` for packed
/// K/V, the block table `(table, len, pages_per_seq)` for paged. The fields of the other
/// layout must be NULL/0: `paged_fields` names the paged ones, `paged_set` tells whether a
/// paged field outside the table's is set.
///
/// # Safety
/// Each array, unless NULL, is valid for its length.
pub(crate) unsafe fn kv_arrays<'a>(
    kv_layout: u32,
    (cu_k, cu_k_len): (*const i32, usize),
    (table, table_len, pages_per_seq): (*const u32, usize, usize),
    (paged_fields, paged_set): (&str, bool),
    spans: &mut Vec<Span>,
) -> Result<KvArrays<'a>, Failure> {
    let unused = |what: &str, set: bool| {
        if set {
            Err(Failure::new(
                SdpaStatus::InvalidArgument,
                format!("{what} must be NULL/0 with kv_layout {kv_layout}"),
            ))
        } else {
            Ok(())
        }
    };
    // SAFETY (both blocks): the caller's contract, forwarded.
    match kv_layout {
        SDPA_KV_PACKED => {
            let set = !table.is_null() || table_len != 0 || pages_per_seq != 0 || paged_set;
            unused(paged_fields, set)?;
            let cu_k = unsafe { offsets(cu_k, cu_k_len, Operand::CuSeqlensK, spans) }?;
            Ok(KvArrays::Packed(cu_k))
        }
        SDPA_KV_PAGED => {
            unused(
                "cu_seqlens_k and cu_seqlens_k_len",
                !cu_k.is_null() || cu_k_len != 0,
            )?;
            let table = unsafe { required_array(table, table_len, "block table", spans) }?;
            Ok(KvArrays::Paged(Pages {
                table,
                pages_per_seq,
            }))
        }
        other => Err(Failure::new(
            SdpaStatus::InvalidArgument,
            format!("kv_layout: {other} is not an SDPA_KV_* value"),
        )),
    }
}

/// # Safety
/// As `sdpa_merge_partials`.
pub(crate) unsafe fn merge_entry(args: *const SdpaMergeArgs) -> Result<(), Failure> {
    // SAFETY (all blocks): the caller's contract, forwarded.
    let args = unsafe { read_versioned(args, &[], "merge args") }?.0;
    if dtype(args.dtype, "dtype")? != Dtype::F32 {
        return Err(Failure::new(
            SdpaStatus::UnsupportedType,
            "merge: partial results and the merged output are f32 only \
             (write the partials with out_dtype SDPA_DTYPE_F32)",
        ));
    }
    let mut spans = Vec::new();
    let parts_raw =
        unsafe { input_array(args.parts, args.n_parts, "parts", &mut spans) }?.unwrap_or(&[]);
    let mut parts = Vec::with_capacity(parts_raw.len());
    for (i, p) in parts_raw.iter().enumerate() {
        let (out, s) = unsafe { input(&p.out, Operand::Partial) }?;
        spans.push(s);
        let lse = unsafe { input_array(p.lse, p.lse_len, &format!("parts[{i}].lse"), &mut spans) }?
            .ok_or_else(|| {
                Failure::new(
                    SdpaStatus::NullPointer,
                    format!("parts[{i}].lse: pointer is NULL"),
                )
            })?;
        parts.push(Partial { out, lse });
    }
    let (mut out, out_span) = unsafe { output(&args.out, &spans) }?;
    spans.push(out_span);
    let lse = unsafe { output_array(args.lse, args.lse_len, &spans, "lse") }?;
    let mut scratch = Vec::new();
    let lse = match lse {
        Some(lse) => lse,
        None => {
            let [b, n_q, h, _] = args.out.dims;
            let rows = b
                .checked_mul(h)
                .and_then(|x| x.checked_mul(n_q))
                .ok_or_else(|| Failure::from(sdpa::Error::TooManyRows { rows: usize::MAX }))?;
            scratch.try_reserve_exact(rows).map_err(|_| {
                Failure::from(sdpa::Error::OutOfMemory {
                    bytes: rows.saturating_mul(4),
                })
            })?;
            scratch.resize(rows, 0.0f32);
            &mut scratch[..]
        }
    };
    sdpa::merge_partials(&parts, &mut out, lse)?;
    Ok(())
}

/// # Safety
/// As `sdpa_alibi_slopes`.
pub(crate) unsafe fn alibi_entry(
    heads: usize,
    out: *mut f32,
    out_len: usize,
) -> Result<(), Failure> {
    if out_len < heads {
        return Err(Failure::from(sdpa::Error::LengthMismatch {
            operand: Operand::AlibiSlopes,
            expected: heads,
            got: out_len,
        }));
    }
    // SAFETY: the caller's contract.
    let out = unsafe { output_array(out, heads, &[], "alibi slopes") }?
        .ok_or_else(|| Failure::new(SdpaStatus::NullPointer, "alibi slopes: pointer is NULL"))?;
    out.copy_from_slice(&sdpa::alibi_slopes(heads)?);
    Ok(())
}
