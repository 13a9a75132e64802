//! How the reference reads its operands: Q rows where the call's layout puts them (dense or
//! packed), K/V rows through their [`RowMap`] (dense, packed or paged), the scales of `i8` K/V
//! at the rows' storage positions, and where each row's LSE and bound go. Element by element,
//! in f64, in channel and key order, whichever layout holds the values: so the same values give
//! the same bits through every layout.

use crate::element::{Element, KvElement};
use crate::kv_cache::{AnyKv, PagedKv, RowMap, TensorKv, VarlenKv};
use crate::problem::{Broadcast, Problem};
use crate::tensor::{AnyTensor, AnyTensorMut, Tensor, TensorMut};

/// K and V, their element type named (so that the reference is compiled once, not per type).
pub(super) fn erase_kv<'a, KV: KvElement>(
    k: &Tensor<'a, KV>,
    v: &Tensor<'a, KV>,
    map: RowMap<'a>,
) -> AnyKv<'a> {
    TensorKv { k: *k, v: *v, map }.erase()
}

/// A paged cache's K/V, read through its block table.
pub(super) fn paged_kv<'a, KV: KvElement>(kv: &PagedKv<'a, KV>) -> AnyKv<'a> {
    let map = RowMap::Paged {
        table: kv.block_table,
        pages_per_seq: kv.pages_per_seq,
        page_size: kv.page_size(),
    };
    erase_kv(&kv.k, &kv.v, map)
}

/// A varlen call's K/V, packed (read through their offsets) or paged.
pub(super) fn varlen_kv<'a, KV: KvElement>(kv: &VarlenKv<'a, KV>) -> AnyKv<'a> {
    match kv {
        VarlenKv::Packed(p) => erase_kv(&p.k, &p.v, RowMap::Packed(p.cu_seqlens_k)),
        VarlenKv::Paged(p) => paged_kv(p),
    }
}

/// The storage position `(index along dim 0, index along dim 1)` of key `j` of sequence `b`
/// (validated by the call: inside the tensors for every key a sequence's length reaches).
fn locate(map: RowMap<'_>, b: usize, j: usize) -> (usize, usize) {
    match map {
        RowMap::Dense => (b, j),
        RowMap::Packed(cu) => (0, cu[b] + j),
        RowMap::Paged {
            table,
            pages_per_seq,
            page_size,
        } => (
            table[b * pages_per_seq + j / page_size] as usize,
            j % page_size,
        ),
    }
}

/// Where row `i` of head `h` of sequence `b` is in LSE and in the bounds: `(b·H + h)·n_q + i`
/// for dense queries, `h · total_q + cu_seqlens_q[b] + i` for packed ones (`total_q`: dim 1 of
/// the packed Q).
pub(super) fn row_index(p: &Problem<'_>, total_q: usize, [b, h, i]: [usize; 3]) -> usize {
    match p.seqs.q {
        None => (b * p.heads + h) * p.n_q + i,
        Some(cu) => h * total_q + cu[b] + i,
    }
}

/// Over the channels of Q's row `(b, i, h)` of the call and K's key `j` of sequence `b`, kv
/// head `hk` (K as the call defines it: times its scales for `i8`), in channel order: `Σ q·k`,
/// `Σ |q·k|` and `Σ (|q| + |k|)`. (One match on the types per row pair, not per element.)
pub(super) fn dots(
    p: &Problem<'_>,
    q: &AnyTensor<'_>,
    kv: &AnyKv<'_>,
    scales: Option<Broadcast<'_, f32>>,
    ([b, i, h], [j, hk]): ([usize; 3], [usize; 2]),
) -> [f64; 3] {
    let (qb, qi) = p.q_row(b, i);
    let qa = [qb, qi, h];
    macro_rules! with_q {
        ($q:expr) => {
            match kv {
                AnyKv::F32(kv) => typed_dots($q, kv, scales, qa, [b, j, hk]),
                AnyKv::F16(kv) => typed_dots($q, kv, scales, qa, [b, j, hk]),
                AnyKv::Bf16(kv) => typed_dots($q, kv, scales, qa, [b, j, hk]),
                AnyKv::I8(kv) => typed_dots($q, kv, scales, qa, [b, j, hk]),
            }
        };
    }
    match q {
        AnyTensor::F32(q) => with_q!(q),
        AnyTensor::F16(q) => with_q!(q),
        AnyTensor::Bf16(q) => with_q!(q),
    }
}

/// [`dots`] of one pair of types (`qa`: Q's storage row; `[b, j, hk]`: the key).
fn typed_dots<Q: KvElement, K: KvElement>(
    q: &Tensor<'_, Q>,
    kv: &TensorKv<'_, K>,
    scales: Option<Broadcast<'_, f32>>,
    qa: [usize; 3],
    [b, j, hk]: [usize; 3],
) -> [f64; 3] {
    let k = &kv.k;
    let (e0, e1) = locate(kv.map, b, j);
    let (qs, ks) = (q.strides(), k.strides());
    let (qd, kd) = (q.data(), k.data());
    // Rows inside the validated views (indices inside their dims).
    let (qb, kb) = (
        qa[0] * qs[0] + qa[1] * qs[1] + qa[2] * qs[2],
        e0 * ks[0] + e1 * ks[1] + hk * ks[2],
    );
    let (mut dot, mut abs, mut norms) = (0.0, 0.0, 0.0);
    for c in 0..q.dims()[3] {
        let qc = qd[qb + c * qs[3]].to_f64();
        let mut kc = kd[kb + c * ks[3]].to_f64();
        if let Some(s) = scales {
            kc *= f64::from(s.at([e0, e1, hk, c]));
        }
        let x = qc * kc;
        dot += x;
        abs += x.abs();
        norms += qc.abs() + kc.abs();
    }
    [dot, abs, norms]
}

/// V's channel `c` of kv head `hk` of sequence `b` weighed by `weights[j]` over the keys `j`
/// with `seen[j]`, in key order: `Σ_j w_j·v_jc` (V times its scales for `i8`). Called for
/// channels that exist only, so V's view is not empty.
pub(super) fn weighted_sum(
    kv: &AnyKv<'_>,
    scales: Option<Broadcast<'_, f32>>,
    [b, hk, c]: [usize; 3],
    weights: &[f64],
    seen: &[bool],
) -> f64 {
    fn typed<T: KvElement>(
        kv: &TensorKv<'_, T>,
        scales: Option<Broadcast<'_, f32>>,
        [b, hk, c]: [usize; 3],
        weights: &[f64],
        seen: &[bool],
    ) -> f64 {
        let st = kv.v.strides();
        let data = kv.v.data();
        let mut acc = 0.0;
        for (j, (&w, _)) in weights
            .iter()
            .zip(seen)
            .enumerate()
            .filter(|(_, (_, &s))| s)
        {
            let (e0, e1) = locate(kv.map, b, j);
            let mut x = data[e0 * st[0] + e1 * st[1] + hk * st[2] + c * st[3]].to_f64();
            if let Some(s) = scales {
                x *= f64::from(s.at([e0, e1, hk, c]));
            }
            acc += w * x;
        }
        acc
    }
    match kv {
        AnyKv::F32(kv) => typed(kv, scales, [b, hk, c], weights, seen),
        AnyKv::F16(kv) => typed(kv, scales, [b, hk, c], weights, seen),
        AnyKv::Bf16(kv) => typed(kv, scales, [b, hk, c], weights, seen),
        AnyKv::I8(kv) => typed(kv, scales, [b, hk, c], weights, seen),
    }
}

/// The largest `|v|` of V's key `j` of sequence `b`, kv head `hk` (times its scales for `i8`).
pub(super) fn value_max(kv: &AnyKv<'_>, scales: Option<Broadcast<'_, f32>>, at: [usize; 3]) -> f64 {
    fn typed<T: KvElement>(
        kv: &TensorKv<'_, T>,
        scales: Option<Broadcast<'_, f32>>,
        [b, j, hk]: [usize; 3],
    ) -> f64 {
        let v = &kv.v;
        if v.dims()[3] == 0 {
            // An empty view: its strides may be anything, even overflowing once multiplied,
            // so no offset is formed.
            return 0.0;
        }
        let (e0, e1) = locate(kv.map, b, j);
        let st = v.strides();
        let (data, base) = (v.data(), e0 * st[0] + e1 * st[1] + hk * st[2]);
        let mut max = 0.0f64;
        for c in 0..v.dims()[3] {
            let mut x = data[base + c * st[3]].to_f64();
            if let Some(s) = scales {
                x *= f64::from(s.at([e0, e1, hk, c]));
            }
            max = max.max(x.abs());
        }
        max
    }
    match kv {
        AnyKv::F32(kv) => typed(kv, scales, at),
        AnyKv::F16(kv) => typed(kv, scales, at),
        AnyKv::Bf16(kv) => typed(kv, scales, at),
        AnyKv::I8(kv) => typed(kv, scales, at),
    }
}

/// Writes `x` to channel `c` of head `h` of row `i` of sequence `b` of `out` (where the call's
/// layout puts it), rounded to the output's type.
pub(super) fn write(p: &Problem<'_>, out: &mut AnyTensorMut<'_>, [b, i, h, c]: [usize; 4], x: f32) {
    fn put<O: Element>(out: &mut TensorMut<'_, O>, index: [usize; 4], x: f32) {
        *out.get_mut(index).expect("index inside validated dims") = O::from_f32(x);
    }
    let (ob, oi) = p.q_row(b, i);
    let index = [ob, oi, h, c];
    match out {
        AnyTensorMut::F32(out) => put(out, index, x),
        AnyTensorMut::F16(out) => put(out, index, x),
        AnyTensorMut::Bf16(out) => put(out, index, x),
    }
}

/// The most keys any sequence of the call has (`n_kv` for a dense call without key lengths):
/// the reference reads keys `0 .. kv_len(b)` of sequence `b` only, so that a paged table's
/// entries past a sequence's length (padding, stale pages) are never read.
pub(super) fn max_keys(p: &Problem<'_>) -> usize {
    if p.kv_lens.is_none() && p.seqs.kv.is_none() {
        return p.n_kv;
    }
    (0..p.batch).map(|b| p.kv_len(b)).max().unwrap_or(0)
}
