//! `KvPool`: one layer's owned paged cache, written only by its `append`.
//! * `KvPool::append` writes the bits of `sdpa::append` into views of the same dims (values
//!   and `i8` scales), and nothing on error;
//! * `Plan::run_pool` gives the bits of `Plan::run` on the pool's views with its scales, and of
//!   `attention_varlen` on `KvPool::paged` with `KvPool::options`, for f16 and i8 pools over
//!   two layers of one plan;
//! * a layer that brings scales to `run_pool` is refused; enormous pools are `OutOfMemory`.

use sdpa::half::f16;
use sdpa::{
    append, Alignment, Error, Heads, KvElement, KvPool, Layer, Operand, Options, Plan, Rope,
    RopeStyle, StepKv, Tensor, TensorMut, VarlenKv,
};

use crate::support::values::SplitMix;

const H: usize = 4;
const H_KV: usize = 2;
const D: usize = 16;
const PAGE: usize = 4;

/// (query rows, keys in all) per sequence; each sequence's keys `0 .. len` are in the pool.
const SEQS: [(usize, usize); 4] = [(3, 9), (1, 1), (0, 5), (2, 14)];
const PPS: usize = 4; // pages per sequence in the table
const PAGES: usize = 17; // the pool (more than the table names)

/// Page `p` of sequence `b`: scattered over the pool.
fn table() -> Vec<u32> {
    (0..SEQS.len() * PPS)
        .map(|i| ((7 * i + 2) % PAGES) as u32)
        .collect()
}

/// Every key of every sequence: its slot through the table, and its position.
fn key_slots(table: &[u32]) -> (Vec<usize>, Vec<u32>) {
    let mut out = (vec![], vec![]);
    for (b, &(_, len)) in SEQS.iter().enumerate() {
        for t in 0..len {
            out.0
                .push(table[b * PPS + t / PAGE] as usize * PAGE + t % PAGE);
            out.1.push(t as u32);
        }
    }
    out
}

/// Two layers of one plan on pools of `T`: `KvPool::append` against `append` on plain
/// buffers, then `run_pool` against `run` and against `attention_varlen`.
fn pool_matches_views<T: KvElement + Default>() {
    let table = table();
    let (slots, positions) = key_slots(&table);
    let n = slots.len();
    let rope = Rope::new(RopeStyle::Halves, D, 10_000.0);
    let lens: Vec<usize> = SEQS.iter().map(|s| s.1).collect();
    let mut cu_q = vec![0];
    for &(rows, _) in &SEQS {
        cu_q.push(cu_q.last().unwrap() + rows);
    }
    let total_q = *cu_q.last().unwrap();
    let opts = Options::new().causal(Alignment::BottomRight).kv_lens(&lens);
    let heads = Heads {
        heads: H,
        kv_heads: H_KV,
        d_k: D,
        d_v: D,
    };
    let step = StepKv::Paged {
        block_table: &table,
        pages_per_seq: PPS,
        page_size: PAGE,
    };
    let mut plan = Plan::new(&cu_q, step, heads, &opts).unwrap();
    let dims = [PAGES, PAGE, H_KV, D];
    let scale_dims = [PAGES, PAGE, H_KV, 1];
    for layer in 0..2u64 {
        let (k_new, v_new) = (
            SplitMix::unit_values(n * H_KV * D, 10 + layer),
            SplitMix::unit_values(n * H_KV * D, 20 + layer),
        );
        let rows = |x| Tensor::bshd(x, [1, n, H_KV, D]).unwrap();
        let mut pool = KvPool::<T>::new(PAGES, PAGE, H_KV, D, D).unwrap();
        pool.append(
            &rows(&k_new),
            &rows(&v_new),
            &slots,
            Some((&rope, &positions)),
        )
        .unwrap();
        let (mut k, mut v) = (
            vec![T::default(); PAGES * PAGE * H_KV * D],
            vec![T::default(); PAGES * PAGE * H_KV * D],
        );
        let (mut ks, mut vs) = (
            vec![0.0f32; PAGES * PAGE * H_KV],
            vec![0.0f32; PAGES * PAGE * H_KV],
        );
        {
            let (mut kc, mut vc) = (
                TensorMut::bshd(&mut k, dims).unwrap(),
                TensorMut::bshd(&mut v, dims).unwrap(),
            );
            let (mut kst, mut vst) = (
                TensorMut::bshd(&mut ks, scale_dims).unwrap(),
                TensorMut::bshd(&mut vs, scale_dims).unwrap(),
            );
            let scales = T::QUANTIZED.then_some((&mut kst, &mut vst));
            append(
                &rows(&k_new),
                &rows(&v_new),
                &mut kc,
                &mut vc,
                &slots,
                scales,
                Some((&rope, &positions)),
            )
            .unwrap();
        }
        let bits = |x: &Tensor<'_, T>| {
            (0..PAGES * PAGE * H_KV * D)
                .map(|i| {
                    format!(
                        "{:?}",
                        x.get([
                            i / (PAGE * H_KV * D),
                            i / (H_KV * D) % PAGE,
                            i / D % H_KV,
                            i % D
                        ])
                        .unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        let (kt, vt) = (
            Tensor::bshd(&k, dims).unwrap(),
            Tensor::bshd(&v, dims).unwrap(),
        );
        assert_eq!(bits(&pool.k()), bits(&kt), "{} K", T::NAME);
        assert_eq!(bits(&pool.v()), bits(&vt), "{} V", T::NAME);
        let (kst, vst) = (
            Tensor::bshd(&ks, scale_dims).unwrap(),
            Tensor::bshd(&vs, scale_dims).unwrap(),
        );
        match pool.scales() {
            Some((a, b)) => {
                assert!(T::QUANTIZED);
                for (x, y) in [(a, kst), (b, vst)] {
                    let all = |t: Tensor<'_, f32>| {
                        (0..PAGES * PAGE * H_KV)
                            .map(|i| {
                                t.get([i / (PAGE * H_KV), i / H_KV % PAGE, i % H_KV, 0])
                                    .unwrap()
                                    .to_bits()
                            })
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(all(x), all(y), "scales");
                }
                assert!(ks.iter().any(|&s| s > 0.0), "scales were written");
            }
            None => assert!(!T::QUANTIZED),
        }

        // One run per layer: the pool's, the views', the call's.
        let q = SplitMix::unit_values(total_q * H * D, 30 + layer);
        let qv = Tensor::bshd(&q, [1, total_q, H, D]).unwrap();
        let run = |f: &mut dyn FnMut(&mut TensorMut<'_, f32>, &mut [f32])| {
            let (mut out, mut lse) = (vec![f32::NAN; total_q * H * D], vec![f32::NAN; H * total_q]);
            f(
                &mut TensorMut::bshd(&mut out, [1, total_q, H, D]).unwrap(),
                &mut lse,
            );
            (
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            )
        };
        let pooled = run(&mut |o, l| {
            plan.run_pool(&qv, &pool, o, Some(l), &Layer::new())
                .unwrap()
        });
        let mut views = Layer::new();
        if T::QUANTIZED {
            views = views.kv_scales(kst, vst);
        }
        let viewed = run(&mut |o, l| plan.run(&qv, &kt, &vt, o, Some(l), &views).unwrap());
        let call_opts = pool.options(opts.clone());
        let kv = VarlenKv::Paged(pool.paged(&table, PPS).unwrap());
        let called = run(&mut |o, l| {
            sdpa::attention_varlen(&qv, &cu_q, &kv, o, Some(l), &call_opts).unwrap()
        });
        assert_eq!(pooled, viewed, "{} run_pool against run", T::NAME);
        assert_eq!(
            pooled,
            called,
            "{} run_pool against attention_varlen",
            T::NAME
        );
        assert!(
            pooled.0.iter().all(|&b| !f32::from_bits(b).is_nan()),
            "every row written"
        );

        // A layer may bring sinks, not scales.
        let (mut out, sinks) = (vec![0.0f32; total_q * H * D], [0.5f32; H]);
        let mut o = TensorMut::bshd(&mut out, [1, total_q, H, D]).unwrap();
        plan.run_pool(&qv, &pool, &mut o, None, &Layer::new().sinks(&sinks))
            .unwrap();
        let (one, ones) = ([1.0f32], [1.0f32]);
        let s = Tensor::bshd(&one, [1, 1, 1, 1]).unwrap();
        let err = plan
            .run_pool(
                &qv,
                &pool,
                &mut o,
                None,
                &Layer::new().kv_scales(s, Tensor::bshd(&ones, [1, 1, 1, 1]).unwrap()),
            )
            .unwrap_err();
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
    }
}

#[test]
fn a_pools_runs_give_the_bits_of_runs_on_its_views_and_of_the_call() {
    pool_matches_views::<f16>();
    pool_matches_views::<i8>();
    pool_matches_views::<f32>();
}

#[test]
fn a_pool_append_writes_nothing_on_error_and_enormous_pools_are_refused() {
    let mut pool = KvPool::<i8>::new(2, 4, 1, 8, 8).unwrap();
    let rows = vec![0.5f32; 2 * 8];
    let t = Tensor::bshd(&rows, [1, 2, 1, 8]).unwrap();
    pool.append(&t, &t, &[1, 6], None).unwrap();
    let before = format!(
        "{:?}",
        (0..64)
            .map(|i| *pool.k().get([i / 32, i / 8 % 4, 0, i % 8]).unwrap())
            .collect::<Vec<_>>()
    );
    // A slot past the pool, then a NaN row: typed errors, the pool unchanged.
    let err = pool.append(&t, &t, &[0, 8], None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidValue {
                operand: Operand::Slots,
                ..
            }
        ),
        "{err:?}"
    );
    let nan = vec![f32::NAN; 2 * 8];
    let err = pool
        .append(
            &Tensor::bshd(&nan, [1, 2, 1, 8]).unwrap(),
            &t,
            &[0, 2],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidValue {
                operand: Operand::Key,
                ..
            }
        ),
        "{err:?}"
    );
    let after = format!(
        "{:?}",
        (0..64)
            .map(|i| *pool.k().get([i / 32, i / 8 % 4, 0, i % 8]).unwrap())
            .collect::<Vec<_>>()
    );
    assert_eq!(before, after);
    assert_eq!(pool.k().get([0, 1, 0, 3]), Some(&127)); // 0.5 at scale 0.5/127
    let (ks, _) = pool.scales().unwrap();
    assert_eq!(ks.get([1, 2, 0, 0]), Some(&(0.5 / 127.0)));

    for dims in [[usize::MAX, 2, 1, 1], [1 << 40, 1 << 20, 8, 128]] {
        let err = KvPool::<f16>::new(dims[0], dims[1], dims[2], dims[3], dims[3]).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    }
    // Empty pools are pools; the debug form names the shape, not the values.
    let empty = KvPool::<f32>::new(0, 16, 8, 128, 64).unwrap();
    assert_eq!(empty.dims(), [0, 16, 8, 128]);
    assert_eq!(empty.v().dims(), [0, 16, 8, 64]);
    let shown = format!("{pool:?}");
    assert!(
        shown.contains("i8") && shown.contains("[2, 4, 1, 8]") && shown.len() < 100,
        "{shown}"
    );
}
