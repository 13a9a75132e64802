//! `Plan`: a step validated once and run per layer gives `attention_varlen`'s bits (paged and
//! packed K/V, f32, f16, bf16 with bf16 products, i8 with per-layer scales, per-layer sinks,
//! LSE), checks each layer's tensors with typed errors and writes nothing on error;
//! `Options::cache_seqlens` is `kv_lens` minus each sequence's query rows; a packed batch's
//! sequences without rows cost no work items (their results are the long sequence's alone).

use sdpa::half::{bf16, f16};
use sdpa::{
    Alignment, Error, Heads, KvElement, Layer, Operand, Options, PackedKv, PagedKv, Plan, StepKv,
    Tensor, TensorMut, VarlenKv, Workspace,
};

use crate::support::values::SplitMix;

const H: usize = 4;
const H_KV: usize = 2;
const D: usize = 16;
const PAGE: usize = 4;

fn values(len: usize, seed: u64) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
}

/// A step: (query rows, keys before this step's rows) per sequence, the rows appended after
/// the cached keys. Sequences without rows and without keys, decode rows, prefill chunks.
fn step() -> Vec<(usize, usize)> {
    vec![(3, 5), (0, 0), (1, 8), (17, 0), (0, 6), (1, 30), (5, 2)]
}

/// A paged step: `cu_seqlens_q`, the cached lengths, the total lengths, a shuffled block
/// table and its pages per sequence.
struct Paged {
    cu_q: Vec<usize>,
    before: Vec<usize>,
    after: Vec<usize>,
    table: Vec<u32>,
    pages_per_seq: usize,
    pages: usize,
}

fn paged_step() -> Paged {
    let seqs = step();
    let mut cu_q = vec![0];
    for &(nq, _) in &seqs {
        cu_q.push(cu_q.last().unwrap() + nq);
    }
    let before: Vec<usize> = seqs.iter().map(|s| s.1).collect();
    let after: Vec<usize> = seqs.iter().map(|s| s.0 + s.1).collect();
    let pages_per_seq = after.iter().max().unwrap().div_ceil(PAGE) + 1;
    let pages = seqs.len() * pages_per_seq;
    // Page p of sequence b is pool page (5·(b·pps + p) + 3) mod pages (5 is prime to
    // `pages`): every sequence's pages scattered over the pool.
    assert_ne!(pages % 5, 0);
    let table = (0..pages)
        .map(|i| ((5 * i + 3) % pages) as u32)
        .collect::<Vec<_>>();
    Paged {
        cu_q,
        before,
        after,
        table,
        pages_per_seq,
        pages,
    }
}

fn heads() -> Heads {
    Heads {
        heads: H,
        kv_heads: H_KV,
        d_k: D,
        d_v: D,
    }
}

/// Runs `layers` layers of a paged step of K/V type `T` through one plan (in a workspace) and
/// through `attention_varlen`, and asserts the same bits (outputs and LSE).
fn plan_matches_varlen<T: KvElement>(convert: fn(f32) -> T, opts: Options<'_>, quantized: bool) {
    let s = paged_step();
    let total_q = *s.cu_q.last().unwrap();
    let pool_len = s.pages * PAGE * H_KV * D;
    let pool = [s.pages, PAGE, H_KV, D];
    let scale_dims = [s.pages, PAGE, H_KV, 1];
    let layers: Vec<_> = (0..3)
        .map(|l| {
            let q = values(total_q * H * D, 10 + l);
            let k: Vec<T> = values(pool_len, 20 + l).into_iter().map(convert).collect();
            let v: Vec<T> = values(pool_len, 30 + l).into_iter().map(convert).collect();
            // Positive scales that differ per layer, token and head.
            let ks: Vec<f32> = values(s.pages * PAGE * H_KV, 40 + l)
                .iter()
                .map(|x| (x.abs() + 0.5) / 64.0)
                .collect();
            let vs: Vec<f32> = values(s.pages * PAGE * H_KV, 50 + l)
                .iter()
                .map(|x| (x.abs() + 0.5) / 64.0)
                .collect();
            let sinks = values(H, 60 + l);
            (q, k, v, ks, vs, sinks)
        })
        .collect();
    let step_opts = opts.clone().cache_seqlens(&s.before);
    let call_opts = opts.kv_lens(&s.after);
    let step = StepKv::Paged {
        block_table: &s.table,
        pages_per_seq: s.pages_per_seq,
        page_size: PAGE,
    };
    let mut ws = Workspace::new();
    let mut plan = Plan::in_workspace(&mut ws, &s.cu_q, step, heads(), &step_opts).unwrap();
    assert_eq!(plan.sequences(), 7);
    for (l, (q, k, v, ks, vs, sinks)) in layers.iter().enumerate() {
        let qv = Tensor::bshd(q, [1, total_q, H, D]).unwrap();
        let (kp, vp) = (
            Tensor::bshd(k, pool).unwrap(),
            Tensor::bshd(v, pool).unwrap(),
        );
        let (kst, vst) = (
            Tensor::bshd(ks, scale_dims).unwrap(),
            Tensor::bshd(vs, scale_dims).unwrap(),
        );
        let mut layer = Layer::new().sinks(sinks);
        let mut each = call_opts.clone().sinks(sinks);
        if quantized {
            layer = layer.kv_scales(kst, vst);
            each = each.kv_scales(kst, vst);
        }
        let mut got = vec![f32::NAN; total_q * H * D];
        let mut got_lse = vec![f32::NAN; H * total_q];
        {
            let mut o = TensorMut::bshd(&mut got, [1, total_q, H, D]).unwrap();
            plan.run(&qv, &kp, &vp, &mut o, Some(&mut got_lse), &layer)
                .unwrap();
        }
        let mut want = vec![f32::NAN; got.len()];
        let mut want_lse = vec![f32::NAN; got_lse.len()];
        {
            let paged = PagedKv::new(kp, vp, &s.table, s.pages_per_seq).unwrap();
            let mut o = TensorMut::bshd(&mut want, [1, total_q, H, D]).unwrap();
            let kv = VarlenKv::Paged(paged);
            sdpa::attention_varlen(&qv, &s.cu_q, &kv, &mut o, Some(&mut want_lse), &each).unwrap();
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{}, layer {l}: outputs", T::NAME);
        assert_eq!(
            bits(&got_lse),
            bits(&want_lse),
            "{}, layer {l}: LSE",
            T::NAME
        );
        assert!(got.iter().all(|x| x.is_finite()), "every row written");
    }
    drop(plan);
    assert!(ws.bytes() > 0, "the plan ran in the workspace's memory");
}

#[test]
fn a_plan_gives_the_bits_of_attention_varlen_for_every_cache_type() {
    let causal = || Options::new().causal(Alignment::BottomRight);
    plan_matches_varlen::<f32>(|x| x, causal(), false);
    plan_matches_varlen::<f16>(f16::from_f32, causal().softcap(5.0), false);
    plan_matches_varlen::<bf16>(bf16::from_f32, causal().bf16_products(), false);
    let window = causal().sliding_window(6, 0, Alignment::BottomRight);
    plan_matches_varlen::<i8>(|x| (x * 127.0).round() as i8, window, true);
}

#[test]
fn a_packed_plan_gives_the_bits_of_attention_varlen() {
    let seqs = step();
    let (mut cu_q, mut cu_k) = (vec![0], vec![0]);
    for &(nq, before) in &seqs {
        cu_q.push(cu_q.last().unwrap() + nq);
        cu_k.push(cu_k.last().unwrap() + nq + before);
    }
    let (tq, tk) = (*cu_q.last().unwrap(), *cu_k.last().unwrap());
    let q = values(tq * H * D, 1);
    let k = values(tk * H_KV * D, 2);
    let v = values(tk * H_KV * D, 3);
    let qv = Tensor::bshd(&q, [1, tq, H, D]).unwrap();
    let kv_dims = [1, tk, H_KV, D];
    let (kt, vt) = (
        Tensor::bshd(&k, kv_dims).unwrap(),
        Tensor::bshd(&v, kv_dims).unwrap(),
    );
    let opts = Options::new().causal(Alignment::BottomRight);
    let step = StepKv::Packed {
        cu_seqlens_k: &cu_k,
    };
    let mut plan = Plan::new(&cu_q, step, heads(), &opts).unwrap();
    let mut got = vec![0.0f32; tq * H * D];
    let mut o = TensorMut::bshd(&mut got, [1, tq, H, D]).unwrap();
    plan.run(&qv, &kt, &vt, &mut o, None, &Layer::new())
        .unwrap();
    let mut want = vec![0.0f32; tq * H * D];
    let mut o = TensorMut::bshd(&mut want, [1, tq, H, D]).unwrap();
    let kv = VarlenKv::Packed(PackedKv::new(kt, vt, &cu_k));
    sdpa::attention_varlen(&qv, &cu_q, &kv, &mut o, None, &opts).unwrap();
    assert_eq!(got, want);
}

#[test]
fn cache_seqlens_are_kv_lens_minus_the_query_rows() {
    // Dense: two sequences, 3 query rows each, 5 and 9 keys before them.
    let (b, n_q, n_kv) = (2, 3, 16);
    let q = values(b * n_q * H * D, 1);
    let k = values(b * n_kv * H_KV * D, 2);
    let v = values(b * n_kv * H_KV * D, 3);
    let qv = Tensor::bshd(&q, [b, n_q, H, D]).unwrap();
    let kt = Tensor::bshd(&k, [b, n_kv, H_KV, D]).unwrap();
    let vt = Tensor::bshd(&v, [b, n_kv, H_KV, D]).unwrap();
    let (before, after) = ([5usize, 9], [8usize, 12]);
    let run = |opts: &Options<'_>| {
        let mut out = vec![0.0f32; b * n_q * H * D];
        let mut o = TensorMut::bshd(&mut out, [b, n_q, H, D]).unwrap();
        sdpa::attention(&qv, &kt, &vt, &mut o, opts).map(|()| out)
    };
    let br = Alignment::BottomRight;
    let a = run(&Options::new().causal(br).cache_seqlens(&before)).unwrap();
    let c = run(&Options::new().causal(br).kv_lens(&after)).unwrap();
    assert_eq!(a, c);
    // The later setter wins.
    let d = run(&Options::new()
        .causal(br)
        .kv_lens(&[1, 1])
        .cache_seqlens(&before))
    .unwrap();
    assert_eq!(a, d);
    // Cached keys plus the rows past the buffer, or overflowing: a typed error.
    for before in [[14usize, 0], [0, usize::MAX]] {
        let err = run(&Options::new().cache_seqlens(&before)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidValue {
                    operand: Operand::KvLens,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn a_plan_checks_each_layer_and_writes_nothing_on_error() {
    let s = paged_step();
    let total_q = *s.cu_q.last().unwrap();
    let step = StepKv::Paged {
        block_table: &s.table,
        pages_per_seq: s.pages_per_seq,
        page_size: PAGE,
    };
    let opts = Options::new().cache_seqlens(&s.before);
    let mut plan = Plan::new(&s.cu_q, step, heads(), &opts).unwrap();
    let q = values(total_q * H * D, 1);
    let pool = values(s.pages * PAGE * H_KV * D, 2);
    let qv = Tensor::bshd(&q, [1, total_q, H, D]).unwrap();
    let kp = Tensor::bshd(&pool, [s.pages, PAGE, H_KV, D]).unwrap();
    let mut out = vec![7.0f32; total_q * H * D];
    let sinks = [0.0f32; H + 1];
    let scales = [1.0f32];
    let one = Tensor::bshd(&scales, [1, 1, 1, 1]).unwrap();
    let small = Tensor::bshd(&pool, [s.pages - 1, PAGE, H_KV, D]).unwrap();
    let other_page = Tensor::new(&pool, [s.pages, PAGE / 2, H_KV, D], [PAGE * 32, 32, 16, 1]);
    let other_page = other_page.unwrap();
    let mut lse = vec![0.0f32; 3];
    type Case<'a> = (
        &'a str,
        Tensor<'a, f32>,
        Option<&'a mut [f32]>,
        Layer<'a>,
        fn(&Error) -> bool,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "a pool with fewer pages than the table reaches",
            small,
            None,
            Layer::new(),
            |e| {
                matches!(
                    e,
                    Error::ShapeMismatch {
                        operand: Operand::Key,
                        ..
                    }
                )
            },
        ),
        ("another page size", other_page, None, Layer::new(), |e| {
            matches!(
                e,
                Error::ShapeMismatch {
                    operand: Operand::Key,
                    ..
                }
            )
        }),
        (
            "an LSE of the wrong length",
            kp,
            Some(&mut lse),
            Layer::new(),
            |e| {
                matches!(
                    e,
                    Error::LengthMismatch {
                        operand: Operand::Lse,
                        ..
                    }
                )
            },
        ),
        (
            "sinks of the wrong length",
            kp,
            None,
            Layer::new().sinks(&sinks),
            |e| {
                matches!(
                    e,
                    Error::LengthMismatch {
                        operand: Operand::Sinks,
                        ..
                    }
                )
            },
        ),
        (
            "scales for f32 K/V",
            kp,
            None,
            Layer::new().kv_scales(one, one),
            |e| matches!(e, Error::KvScales { .. }),
        ),
    ];
    for (what, k, lse, layer, is) in cases {
        let mut o = TensorMut::bshd(&mut out, [1, total_q, H, D]).unwrap();
        let err = plan.run(&qv, &k, &k, &mut o, lse, &layer).unwrap_err();
        assert!(is(&err), "{what}: {err:?}");
    }
    // i8 pools without scales.
    let pool_i8 = vec![1i8; pool.len()];
    let k8 = Tensor::bshd(&pool_i8, [s.pages, PAGE, H_KV, D]).unwrap();
    let mut o = TensorMut::bshd(&mut out, [1, total_q, H, D]).unwrap();
    let err = plan.run(&qv, &k8, &k8, &mut o, None, &Layer::new());
    assert!(matches!(err, Err(Error::KvScales { .. })), "{err:?}");
    // Q of another row count.
    let q_short = Tensor::bshd(&q[..(total_q - 1) * H * D], [1, total_q - 1, H, D]).unwrap();
    let mut o = TensorMut::bshd(&mut out, [1, total_q, H, D]).unwrap();
    let err = plan.run(&q_short, &kp, &kp, &mut o, None, &Layer::new());
    assert!(
        matches!(
            err,
            Err(Error::ShapeMismatch {
                operand: Operand::Query,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(out.iter().all(|&x| x == 7.0), "nothing written on error");
    // Scales in the plan's options are refused (they are per layer).
    let opts = Options::new().cache_seqlens(&s.before).kv_scales(one, one);
    let err = Plan::new(&s.cu_q, step, heads(), &opts).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidValue {
                operand: Operand::KeyScales,
                ..
            }
        ),
        "{err:?}"
    );
    // A paged plan needs key lengths, as a paged call does.
    let err = Plan::new(&s.cu_q, step, heads(), &Options::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                operand: Operand::KvLens,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Q, K and V values of `n` packed rows.
fn packed_rows(n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        values(n * H * D, 1),
        values(n * H_KV * D, 2),
        values(n * H_KV * D, 3),
    )
}

/// `[1, n, H, D]` Q and `[1, n, H_KV, D]` K, V views of [`packed_rows`].
fn packed_views<'a>(
    n: usize,
    (q, k, v): (&'a [f32], &'a [f32], &'a [f32]),
) -> (Tensor<'a, f32>, Tensor<'a, f32>, Tensor<'a, f32>) {
    let kv_dims = [1, n, H_KV, D];
    (
        Tensor::bshd(q, [1, n, H, D]).unwrap(),
        Tensor::bshd(k, kv_dims).unwrap(),
        Tensor::bshd(v, kv_dims).unwrap(),
    )
}

/// A packed batch of one long sequence among many without rows gives the long sequence's
/// result alone, bit for bit (its work items, and so its split count, are the same), and
/// the empty sequences schedule no items (`kv_cache_bench` times it).
#[test]
fn sequences_without_rows_cost_no_work_items() {
    let n = 40;
    let (q, k, v) = packed_rows(n);
    let (qv, kt, vt) = packed_views(n, (&q, &k, &v));
    let opts = Options::new().causal(Alignment::BottomRight);
    let run = |cu: &[usize]| {
        let mut out = vec![0.0f32; n * H * D];
        let mut o = TensorMut::bshd(&mut out, [1, n, H, D]).unwrap();
        let kv = VarlenKv::Packed(PackedKv::new(kt, vt, cu));
        sdpa::attention_varlen(&qv, cu, &kv, &mut o, None, &opts).unwrap();
        out
    };
    let alone = run(&[0, n]);
    // 20,000 empty sequences, the long one in the middle.
    let mut cu = vec![0usize; 10_001];
    cu.extend(std::iter::repeat_n(n, 10_001));
    assert_eq!(run(&cu), alone);
}

/// A plan's cached schedule never reaches a later plain call on its workspace, even when the
/// plan is forgotten without being dropped: the next call with other offsets of the same
/// sequence count gives the bits of a fresh workspace.
#[test]
fn a_forgotten_plan_leaves_its_workspace_usable() {
    let n = 200;
    let (q, k, v) = packed_rows(n);
    let (qv, kt, vt) = packed_views(n, (&q, &k, &v));
    let opts = Options::new().causal(Alignment::BottomRight);
    // Query blocks of many rows each: the two offsets give other blocks per sequence.
    let (planned, other) = ([0usize, 190, 200], [0usize, 10, 200]);
    let mut ws = Workspace::new();
    let step = StepKv::Packed {
        cu_seqlens_k: &planned,
    };
    let mut plan = Plan::in_workspace(&mut ws, &planned, step, heads(), &opts).unwrap();
    let mut out = vec![0.0f32; n * H * D];
    let mut o = TensorMut::bshd(&mut out, [1, n, H, D]).unwrap();
    plan.run(&qv, &kt, &vt, &mut o, None, &Layer::new())
        .unwrap();
    std::mem::forget(plan);
    let run = |ws: &mut Workspace| {
        let mut out = vec![0.0f32; n * H * D];
        let mut o = TensorMut::bshd(&mut out, [1, n, H, D]).unwrap();
        let kv = VarlenKv::Packed(PackedKv::new(kt, vt, &other));
        ws.attention_varlen(&qv, &other, &kv, &mut o, None, &opts)
            .unwrap();
        out
    };
    assert_eq!(run(&mut ws), run(&mut Workspace::new()));
}

/// `Plan::new_rows`: each new row's position is its sequence's cached keys plus its index,
/// its slot the block table's page for that position (or the packed row at the sequence's
/// end), whichever length convention the step was given.
#[test]
fn new_rows_are_the_positions_after_the_cached_keys_and_their_slots() {
    let s = paged_step();
    let total_q = *s.cu_q.last().unwrap();
    let (mut want_slots, mut want_positions) = (vec![], vec![]);
    for (b, &before) in s.before.iter().enumerate() {
        for pos in before..s.after[b] {
            let page = s.table[b * s.pages_per_seq + pos / PAGE] as usize;
            want_slots.push(page * PAGE + pos % PAGE);
            want_positions.push(pos as u32);
        }
    }
    assert_eq!(want_slots.len(), total_q);
    let step = StepKv::Paged {
        block_table: &s.table,
        pages_per_seq: s.pages_per_seq,
        page_size: PAGE,
    };
    for opts in [
        Options::new().cache_seqlens(&s.before),
        Options::new().kv_lens(&s.after),
    ] {
        let plan = Plan::new(&s.cu_q, step, heads(), &opts).unwrap();
        let (mut slots, mut positions) = (vec![0; total_q], vec![0; total_q]);
        plan.new_rows(&mut slots, &mut positions).unwrap();
        assert_eq!(slots, want_slots);
        assert_eq!(positions, want_positions);
    }

    // Packed: the rows are the last keys of each sequence's segment.
    let cu_q = [0usize, 2, 2, 5];
    let cu_k = [0usize, 6, 9, 12];
    let step = StepKv::Packed {
        cu_seqlens_k: &cu_k,
    };
    let plan = Plan::new(&cu_q, step, heads(), &Options::new()).unwrap();
    let (mut slots, mut positions) = (vec![0; 5], vec![0; 5]);
    plan.new_rows(&mut slots, &mut positions).unwrap();
    assert_eq!(slots, [4, 5, 9, 10, 11]);
    assert_eq!(positions, [4, 5, 0, 1, 2]);
    // With lengths shorter than the segments, the rows follow each sequence's length.
    let before = [1usize, 3, 0];
    let plan = Plan::new(&cu_q, step, heads(), &Options::new().cache_seqlens(&before)).unwrap();
    plan.new_rows(&mut slots, &mut positions).unwrap();
    assert_eq!(slots, [1, 2, 9, 10, 11]);
    assert_eq!(positions, [1, 2, 0, 1, 2]);
    assert_eq!(step.slot(1, 3), None);
    assert_eq!(step.slot(3, 0), None);
}

#[test]
fn new_rows_refuse_lengths_without_the_rows_and_write_nothing() {
    let s = paged_step();
    let total_q = *s.cu_q.last().unwrap();
    let step = StepKv::Paged {
        block_table: &s.table,
        pages_per_seq: s.pages_per_seq,
        page_size: PAGE,
    };
    // `kv_lens` that leave out the step's rows of sequence 3 (17 rows, 0 cached keys).
    let mut short = s.after.clone();
    short[3] = 16;
    let plan = Plan::new(&s.cu_q, step, heads(), &Options::new().kv_lens(&short)).unwrap();
    let (mut slots, mut positions) = (vec![7; total_q], vec![7; total_q]);
    assert!(matches!(
        plan.new_rows(&mut slots, &mut positions),
        Err(Error::InvalidValue {
            operand: Operand::KvLens,
            index: 3,
            ..
        })
    ));
    assert!(slots.iter().all(|&x| x == 7) && positions.iter().all(|&p| p == 7));
    let plan = Plan::new(&s.cu_q, step, heads(), &Options::new().kv_lens(&s.after)).unwrap();
    let mut one_short = vec![0; total_q - 1];
    assert!(matches!(
        plan.new_rows(&mut one_short, &mut positions),
        Err(Error::LengthMismatch {
            operand: Operand::Slots,
            ..
        })
    ));
    assert!(matches!(
        plan.new_rows(&mut slots, &mut positions[1..]),
        Err(Error::LengthMismatch {
            operand: Operand::Positions,
            ..
        })
    ));
    assert!(slots.iter().all(|&x| x == 7));
    // Paged slots past a table row, or a page size of 0, have no slot.
    assert_eq!(step.slot(0, s.pages_per_seq * PAGE), None);
    let zero = StepKv::Paged {
        block_table: &s.table,
        pages_per_seq: s.pages_per_seq,
        page_size: 0,
    };
    assert_eq!(zero.slot(0, 0), None);
}
