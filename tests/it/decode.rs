//! The decode path: few query rows per kv head (scores with channels along the lanes), kv
//! heads stacked per work item and walked inside 48-key blocks, half-precision K/V read in
//! place and converted as loaded, next block prefetched. Every type against the reference
//! within the bound, a dominant key at every block and split boundary of one head, NaN values
//! hidden by a mask (the native path falls back to the checked copy), and bitwise identical
//! results for any thread count.

use sdpa::half::{bf16, f16};
use sdpa::{Alignment, Element, Options, Tensor, TensorMut};

use crate::support;
use support::contract::RowFacts;
use support::harness::{assert_tensors_against_reference, Layout};
use support::values::SplitMix;

fn values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
        .into_iter()
        .map(|x| x * scale)
        .collect()
}

fn to<T: Element>(xs: &[f32]) -> Vec<T> {
    xs.iter().map(|&x| T::from_f32(x)).collect()
}

/// B = 2, H = 16, H_kv = 4 (a group of 4: all four kv heads in one item), n_q = 1 or 2,
/// n_kv = 3000 (48-key blocks, 11 key splits), head size `d` (128: V read in place; 72: not a
/// multiple of the lanes, so V is converted into the packed block and the dot products have a
/// scalar tail).
fn decode_case<KV: Element>(d: usize, n_q: usize, opts: &Options<'_>, seed: u64) {
    let (b, h, h_kv, n_kv) = (2, 16, 4, 3000);
    let q = values(b * n_q * h * d, seed, 1.0);
    let k = to::<KV>(&values(b * n_kv * h_kv * d, seed + 1, 1.0));
    let v = to::<KV>(&values(b * n_kv * h_kv * d, seed + 2, 1.0));
    let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
    let kv = Tensor::bshd(&k, [b, n_kv, h_kv, d]).unwrap();
    let vv = Tensor::bshd(&v, [b, n_kv, h_kv, d]).unwrap();
    let label = format!("{} d = {d} n_q = {n_q} seed {seed}", KV::NAME);
    assert_tensors_against_reference::<f32, KV, f32>(
        &qv,
        &kv,
        &vv,
        Layout::BSHD,
        opts,
        |_| RowFacts::FINITE,
        &label,
    );
}

fn decode_grid<KV: Element>() {
    let lens = [3000usize, 1234];
    let slopes = sdpa::alibi_slopes(16).unwrap();
    let sinks: Vec<f32> = (0..16).map(|x| x as f32 * 0.25 - 2.0).collect();
    let br = Alignment::BottomRight;
    let sets = [
        Options::new(),
        Options::new().kv_lens(&lens).causal(br),
        Options::new().sliding_window(700, 0, br).alibi(&slopes, br),
        Options::new().kv_lens(&lens).softcap(20.0).sinks(&sinks),
    ];
    for (o, opts) in sets.iter().enumerate() {
        for d in [128, 72] {
            for n_q in [1, 2] {
                decode_case::<KV>(d, n_q, opts, 40 + o as u64);
            }
        }
    }
}

#[test]
fn decode_with_stacked_heads_is_within_the_bound_for_every_type() {
    decode_grid::<f32>();
    decode_grid::<f16>();
    decode_grid::<bf16>();
}

/// One key of one kv head dominates, at each 48-key block boundary and each split boundary:
/// a key dropped, duplicated or taken from another head misses by far more than the bound.
fn dominant_key<KV: Element>() {
    let (h, h_kv, n_kv, d) = (8, 4, 3000, 32);
    // 11 splits of 273 keys: boundaries at 273, 546, …
    for &j_big in &[0usize, 47, 48, 95, 96, 272, 273, 2999] {
        let q = vec![1.0f32; h * d];
        let mut k = values(n_kv * h_kv * d, 5, 0.1);
        let mut v = values(n_kv * h_kv * d, 6, 1.0);
        let at = (j_big * h_kv + 2) * d; // kv head 2
        k[at..at + d].fill(1.0);
        v[at..at + d].fill(7.0);
        let (k, v) = (to::<KV>(&k), to::<KV>(&v));
        let qv = Tensor::bshd(&q, [1, 1, h, d]).unwrap();
        let kv = Tensor::bshd(&k, [1, n_kv, h_kv, d]).unwrap();
        let vv = Tensor::bshd(&v, [1, n_kv, h_kv, d]).unwrap();
        let opts = Options::new().scale(4.0);
        let label = format!("{} key {j_big}", KV::NAME);
        let c = assert_tensors_against_reference::<f32, KV, f32>(
            &qv,
            &kv,
            &vv,
            Layout::BSHD,
            &opts,
            |_| RowFacts::FINITE,
            &label,
        );
        // Query heads 4 and 5 read kv head 2: the key dominates there and nowhere else.
        for head in 0..h {
            let x = c.fused.out[head * d];
            assert_eq!(x > 6.9, head / 2 == 2, "{label}: head {head} got {x}");
        }
    }
}

#[test]
fn a_dominant_key_of_one_head_is_found_at_every_boundary_for_every_type() {
    dominant_key::<f32>();
    dominant_key::<f16>();
    dominant_key::<bf16>();
}

/// A NaN in a value row that a boolean mask hides from the query: it must not reach the
/// output (the in-place half-precision path checks the block and falls back to the copy that
/// sets such rows aside).
fn masked_nan<KV: Element>() {
    let (h, h_kv, n_kv, d) = (8, 2, 500, 64);
    let q = values(h * d, 7, 1.0);
    let k = to::<KV>(&values(n_kv * h_kv * d, 8, 1.0));
    let mut vf = values(n_kv * h_kv * d, 9, 1.0);
    let hidden = 100;
    vf[(hidden * h_kv + 1) * d + 3] = f32::NAN;
    let v = to::<KV>(&vf);
    let mask: Vec<bool> = (0..h * n_kv).map(|x| x % n_kv != hidden).collect();
    let mask_view = Tensor::new(&mask, [1, 1, h, n_kv], [0, 0, n_kv, 1]).unwrap();
    let opts = Options::new().mask(mask_view);
    let qv = Tensor::bshd(&q, [1, 1, h, d]).unwrap();
    let kv = Tensor::bshd(&k, [1, n_kv, h_kv, d]).unwrap();
    let vv = Tensor::bshd(&v, [1, n_kv, h_kv, d]).unwrap();
    let mut out = vec![0.0f32; h * d];
    let mut ov = TensorMut::bshd(&mut out, [1, 1, h, d]).unwrap();
    sdpa::attention(&qv, &kv, &vv, &mut ov, &opts).unwrap();
    assert!(
        out.iter().all(|x| x.is_finite()),
        "{}: NaN leaked",
        KV::NAME
    );
    // Without the mask, heads 4..8 (kv head 1) see the NaN in column 3, and only there.
    let mut ov = TensorMut::bshd(&mut out, [1, 1, h, d]).unwrap();
    sdpa::attention(&qv, &kv, &vv, &mut ov, &Options::new()).unwrap();
    for (head, row) in out.chunks(d).enumerate() {
        for (c, x) in row.iter().enumerate() {
            assert_eq!(
                x.is_nan(),
                head >= 4 && c == 3,
                "{} head {head} column {c}",
                KV::NAME
            );
        }
    }
}

#[test]
fn masked_nan_values_stay_hidden_on_the_decode_path() {
    masked_nan::<f32>();
    masked_nan::<f16>();
    masked_nan::<bf16>();
}

fn on_threads(threads: usize, f: impl FnOnce() + Send) {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f);
}

fn threads_agree<KV: Element>() {
    let (b, h, h_kv, n_kv, d) = (3, 32, 8, 5000, 128);
    let q = values(b * h * d, 1, 1.0);
    let k = to::<KV>(&values(b * n_kv * h_kv * d, 2, 1.0));
    let v = to::<KV>(&values(b * n_kv * h_kv * d, 3, 1.0));
    let lens = [5000usize, 4097, 333];
    let opts = Options::new().kv_lens(&lens).causal(Alignment::BottomRight);
    let run = |threads| {
        let mut out = vec![0.0f32; b * h * d];
        on_threads(threads, || {
            let qv = Tensor::bshd(&q, [b, 1, h, d]).unwrap();
            let kv = Tensor::bshd(&k, [b, n_kv, h_kv, d]).unwrap();
            let vv = Tensor::bshd(&v, [b, n_kv, h_kv, d]).unwrap();
            let mut ov = TensorMut::bshd(&mut out, [b, 1, h, d]).unwrap();
            sdpa::attention(&qv, &kv, &vv, &mut ov, &opts).unwrap();
        });
        out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let one = run(1);
    for threads in [2, 3, 7] {
        assert_eq!(run(threads), one, "{}: {threads} threads", KV::NAME);
    }
}

#[test]
fn decode_results_are_bitwise_identical_for_any_thread_count() {
    threads_agree::<f32>();
    threads_agree::<f16>();
    threads_agree::<bf16>();
}
