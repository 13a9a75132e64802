//! Bottom-right alignment with per-sequence key lengths: each sequence's diagonal sits at its
//! own end, `off_b = kv_lens[b] − n_q`, as FlashAttention-2 (`cache_seqlens`), ONNX Runtime
//! (`seqlens_k`), vLLM and candle align it. Checked against one call per sequence on a view
//! truncated to that sequence's keys, for causal, sliding windows and ALiBi (alone and
//! together), in the fused kernel and the reference.

use sdpa::{Alignment, Options, Tensor, TensorMut};

use crate::support;
use support::harness::{assert_views_close_to_reference, Layout, Views};
use support::values::SplitMix;

/// `len` values uniform in `[−1, 1)`: the tests' one filler.
fn values(len: usize, seed: u64) -> Vec<f32> {
    SplitMix::unit_values(len, seed)
}

#[test]
fn each_sequence_is_aligned_at_its_own_length() {
    // A preallocated cache of 700 positions holding 3 sequences of different fill; 5 new
    // tokens each (chunked prefill), GQA 4:2, and a decode-shaped case (n_q = 1).
    let (b, h, h_kv, max_len, d) = (4, 4, 2, 700, 24);
    let lens = [5usize, 300, 0, 700];
    let slopes = sdpa::alibi_slopes(h).unwrap();
    for n_q in [5usize, 1] {
        let q = values(b * n_q * h * d, 1);
        let k = values(b * max_len * h_kv * d, 2);
        let v = values(b * max_len * h_kv * d, 3);
        let qv = Tensor::bshd(&q, [b, n_q, h, d]).unwrap();
        let kv = Tensor::bshd(&k, [b, max_len, h_kv, d]).unwrap();
        let vv = Tensor::bshd(&v, [b, max_len, h_kv, d]).unwrap();
        let br = Alignment::BottomRight;
        let variants: [(&str, Options<'_>); 4] = [
            ("causal", Options::new().causal(br)),
            ("window", Options::new().sliding_window(64, 0, br)),
            ("alibi", Options::new().alibi(&slopes, br)),
            (
                "all",
                Options::new()
                    .causal(br)
                    .sliding_window(100, 0, br)
                    .alibi(&slopes, br),
            ),
        ];
        for (name, opts) in variants {
            let batched = opts.clone().kv_lens(&lens);
            // The reference agrees, row by row, within the bound (a sequence with no key: 0 and
            // lse −∞ on both paths).
            let x = Views {
                q: qv,
                k: kv,
                v: vv,
            };
            let label = format!("{name} n_q={n_q}");
            let c = assert_views_close_to_reference(&x, Layout::BSHD, &batched, &label);
            let (out, lse) = (c.fused.out, c.fused.lse);
            for (bi, &len) in lens.iter().enumerate() {
                // The same sequence alone: its own rows, its keys truncated to its length.
                let row_q = n_q * h * d;
                let row_kv = max_len * h_kv * d;
                let q1 = Tensor::bshd(&q[bi * row_q..(bi + 1) * row_q], [1, n_q, h, d]).unwrap();
                let k1 = Tensor::new(&k[bi * row_kv..], [1, len, h_kv, d], kv.strides()).unwrap();
                let v1 = Tensor::new(&v[bi * row_kv..], [1, len, h_kv, d], vv.strides()).unwrap();
                let mut one = vec![0.0f32; row_q];
                let mut one_lse = vec![0.0f32; h * n_q];
                let mut onev = TensorMut::bshd(&mut one, [1, n_q, h, d]).unwrap();
                sdpa::attention_lse(&q1, &k1, &v1, &mut onev, &mut one_lse, &opts).unwrap();
                // Same blocks, same keys: bitwise equal.
                assert_eq!(
                    &out[bi * row_q..(bi + 1) * row_q],
                    &one[..],
                    "{name} n_q={n_q} b={bi}"
                );
                assert_eq!(
                    &lse[bi * h * n_q..(bi + 1) * h * n_q],
                    &one_lse[..],
                    "{name} b={bi}"
                );
            }
        }
    }
}

#[test]
fn decode_with_a_window_sees_the_end_of_each_sequence() {
    // One new token per sequence, window of 8 keys: each row must see the last 8 keys of its
    // own sequence (with the buffer's length it saw nothing for short sequences: all zeros).
    let (b, max_len, d) = (2, 64, 8);
    let lens = [10usize, 40];
    let q = values(b * d, 7);
    let k = values(b * max_len * d, 8);
    // V rows hold their key index, so the output is a weighted mean of visible indices.
    let v: Vec<f32> = (0..b * max_len)
        .flat_map(|x| std::iter::repeat_n((x % max_len) as f32, d))
        .collect();
    let qv = Tensor::bshd(&q, [b, 1, 1, d]).unwrap();
    let kv = Tensor::bshd(&k, [b, max_len, 1, d]).unwrap();
    let vv = Tensor::bshd(&v, [b, max_len, 1, d]).unwrap();
    let opts = Options::new()
        .sliding_window(7, 0, Alignment::BottomRight)
        .kv_lens(&lens);
    let mut out = vec![0.0f32; b * d];
    let mut ov = TensorMut::bshd(&mut out, [b, 1, 1, d]).unwrap();
    sdpa::attention(&qv, &kv, &vv, &mut ov, &opts).unwrap();
    for (bi, &len) in lens.iter().enumerate() {
        let x = out[bi * d];
        assert!(
            x >= (len - 8) as f32 - 1e-4 && x <= (len - 1) as f32 + 1e-4,
            "sequence {bi} (length {len}) averaged keys around {x}"
        );
    }
}
