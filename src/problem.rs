//! Validation of one attention call: the shapes of Q, K, V, O (and LSE) against each other and
//! the options, reduced to a [`Problem`] that both the fused kernel and the reference read.

use crate::element::{dtype, Dtype, KvElement};
use crate::error::{Dim, Error, Operand};
use crate::kv_cache::{PagedKv, RowMap, TensorKv, VarlenKv};
use crate::options::{Alignment, Options};
use crate::tensor::{offset, Tensor};

/// A bias or mask view with broadcast dims (size 1) turned into stride 0, indexed
/// `[b, i, h, j]` for any index inside the problem's `[batch, n_q, heads, n_kv]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Broadcast<'a, T> {
    pub data: &'a [T],
    pub strides: [usize; 4],
}

impl<T: Copy> Broadcast<'_, T> {
    /// The value for `[b, i, h, j]` (in range by construction, see [`Problem::new`]).
    #[inline]
    pub fn at(&self, index: [usize; 4]) -> T {
        self.data[offset(index, self.strides)]
    }
}

/// Checks that `t` broadcasts to `want` and returns it with broadcast strides.
pub(crate) fn broadcast<'a, T>(
    t: &Tensor<'a, T>,
    want: [usize; 4],
    operand: Operand,
) -> Result<Broadcast<'a, T>, Error> {
    let mut strides = t.strides();
    for (k, dim) in Dim::ALL.into_iter().enumerate() {
        let got = t.dims()[k];
        if got == 1 {
            strides[k] = 0;
        } else if got != want[k] {
            return Err(Error::NotBroadcastable {
                operand,
                dim,
                expected: want[k],
                got,
            });
        }
    }
    Ok(Broadcast {
        data: t.data(),
        strides,
    })
}

/// The validated scales of 8-bit K and V, each indexed like its tensor's storage
/// `[dim 0, dim 1, kv head, channel]` (broadcast dims have stride 0).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvScales<'a> {
    pub k: Broadcast<'a, f32>,
    pub v: Broadcast<'a, f32>,
}

/// A check of one dim-0 slice of a scale tensor.
type Visit<'v> = dyn FnMut(usize) -> Result<(), Error> + 'v;

/// The largest scale magnitude: `128 · scale` stays finite, so no dequantized value overflows.
pub(crate) const MAX_SCALE: f32 = f32::MAX / 128.0;

/// Checks the scales of [`Options::kv_scales`] against K/V of type `KV` with storage dims
/// `k_dims` and `v_dims`: present exactly for `i8`, broadcastable, and every scale in the
/// dim-0 slices `rows(dim 0 of the scales)` (all of them, or a paged cache's pages in use)
/// finite with `|scale| ≤ MAX_SCALE`.
fn check_scales<'a, KV: KvElement>(
    opts: &Options<'a>,
    k_dims: [usize; 4],
    v_dims: [usize; 4],
    rows: &dyn Fn(usize, &mut Visit<'_>) -> Result<(), Error>,
) -> Result<Option<KvScales<'a>>, Error> {
    let Some((k, v)) = &opts.kv_scales else {
        return match KV::QUANTIZED {
            true => Err(Error::KvScales { kv_type: KV::NAME }),
            false => Ok(None),
        };
    };
    if !KV::QUANTIZED {
        return Err(Error::KvScales { kv_type: KV::NAME });
    }
    let check = |t: &Tensor<'a, f32>, want: [usize; 4], operand: Operand| {
        let view = broadcast(t, want, operand)?;
        let (data, strides) = (t.data(), t.strides());
        if t.dims().contains(&0) {
            return Ok(view); // no scale is read
        }
        // A dim of stride 0 repeats one slice: it is checked once, so that a broadcast view
        // with K/V's full dims (`[1, n_kv, H_kv, d]`, strides 0) costs what its stored values
        // do, not a pass over the logical elements (9× an i8 decode step, Zen 4, 2026-12-05).
        let [n0, n1, n2, n3] = std::array::from_fn(|k| match strides[k] {
            0 => 1,
            _ => t.dims()[k],
        });
        // A NaN fails `≤` too.
        let valid = |x: f32| x.abs() <= MAX_SCALE;
        let all_valid =
            |at: usize, n: usize| data[at..at + n].iter().fold(true, |ok, &x| ok & valid(x));
        // The scales of one dim-0 index usually are one contiguous run (per token and head:
        // `[.., n_kv, H_kv, 1]`): checked without an early exit, so that the scan vectorizes
        // (it runs on every call and must not cost more than the reads it guards); the first
        // bad value is looked up only when there is one.
        let [_, s1, s2, s3] = strides;
        // One run of `n1·n2·n3` values (which then index real storage, so the product fits).
        let run = ((n3 <= 1 || s3 == 1) && (n2 <= 1 || s2 == n3))
            .then(|| n2 * n3)
            .filter(|&inner| n1 <= 1 || s1 == inner)
            .map(|inner| n1 * inner);
        let mut slice = |i0: usize| {
            if run.is_some_and(|n| all_valid(offset([i0, 0, 0, 0], strides), n)) {
                return Ok(());
            }
            for i1 in 0..n1 {
                for i2 in 0..n2 {
                    if s3 == 1 && all_valid(offset([i0, i1, i2, 0], strides), n3) {
                        continue;
                    }
                    for i3 in 0..n3 {
                        let at = offset([i0, i1, i2, i3], strides);
                        if !valid(data[at]) {
                            return Err(Error::InvalidValue {
                                operand,
                                index: at,
                                reason: "scale is not finite, or |scale|·128 overflows f32",
                            });
                        }
                    }
                }
            }
            Ok(())
        };
        match n0 {
            1 => slice(0)?,
            _ => rows(n0, &mut slice)?,
        }
        Ok(view)
    };
    Ok(Some(KvScales {
        k: check(k, k_dims, Operand::KeyScales)?,
        v: check(v, v_dims, Operand::ValueScales)?,
    }))
}

/// Every dim-0 index below `n` (dense and packed K/V).
fn all_rows(n: usize, f: &mut Visit<'_>) -> Result<(), Error> {
    (0..n).try_for_each(f)
}

/// Checks that a per-head or per-batch slice has `len` entries.
fn check_len<T>(s: &[T], len: usize, operand: Operand) -> Result<(), Error> {
    if s.len() == len {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            operand,
            expected: len,
            got: s.len(),
        })
    }
}

/// Checks each dim of `got` against `want` ([`Error::ShapeMismatch`] at the first difference).
pub(crate) fn expect(operand: Operand, got: [usize; 4], want: [usize; 4]) -> Result<(), Error> {
    for ((&g, &w), dim) in got.iter().zip(&want).zip(Dim::ALL) {
        if g != w {
            return Err(Error::ShapeMismatch {
                operand,
                dim,
                expected: w,
                got: g,
            });
        }
    }
    Ok(())
}

/// The LSE length of a dense call, `batch · heads · n_q`. The output view holds
/// `batch · n_q · heads · d_v` elements, but with `d_v = 0` this product can still overflow; a
/// slice that long cannot exist, so it is reported as `usize::MAX`.
fn dense_lse_len(batch: usize, heads: usize, n_q: usize) -> usize {
    batch
        .checked_mul(heads)
        .and_then(|x| x.checked_mul(n_q))
        .unwrap_or(usize::MAX)
}

/// Checks packed-sequence offsets (`cu_seqlens`: one more than the sequences, non-decreasing,
/// the last at most `total` rows) and returns the longest sequence.
fn check_offsets(cu: &[usize], total: usize, operand: Operand) -> Result<usize, Error> {
    if cu.is_empty() {
        return Err(Error::LengthMismatch {
            operand,
            expected: 1,
            got: 0,
        });
    }
    let mut longest = 0;
    for (index, pair) in cu.windows(2).enumerate() {
        if pair[1] < pair[0] {
            return Err(Error::InvalidValue {
                operand,
                index: index + 1,
                reason: "offsets must be non-decreasing",
            });
        }
        longest = longest.max(pair[1] - pair[0]);
    }
    if cu[cu.len() - 1] > total {
        return Err(Error::InvalidValue {
            operand,
            index: cu.len() - 1,
            reason: "offset past the packed rows of the tensor",
        });
    }
    Ok(longest)
}

/// The logical sizes of a call: Q `[batch, n_q, heads, d_k]`, K `[batch, n_kv, kv_heads,
/// d_k]`, V and out alike. For packed or paged storage, `n_q` is the longest query sequence
/// and `n_kv` the largest per-sequence key capacity.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    batch: usize,
    n_q: usize,
    heads: usize,
    kv_heads: usize,
    n_kv: usize,
    d_k: usize,
    d_v: usize,
}

impl Sizes {
    /// The sizes of a call with dense Q `q` `[B, n_q, H, d_k]` and out `[B, n_q, H, d_v]`
    /// against keys of `kv_heads` heads, `n_kv` per sequence; checks the output's dims.
    fn dense(
        q: [usize; 4],
        out_dims: [usize; 4],
        kv_heads: usize,
        n_kv: usize,
        d_v: usize,
    ) -> Result<Sizes, Error> {
        let [batch, n_q, heads, d_k] = q;
        expect(Operand::Output, out_dims, [batch, n_q, heads, d_v])?;
        Ok(Sizes {
            batch,
            n_q,
            heads,
            kv_heads,
            n_kv,
            d_k,
            d_v,
        })
    }
}

/// Checks sink logits: one per query head, each `−∞` or finite in log2 units.
pub(crate) fn check_sinks(sinks: &[f32], heads: usize) -> Result<(), Error> {
    check_len(sinks, heads, Operand::Sinks)?;
    let ok = |x: f32| x == f32::NEG_INFINITY || (x * std::f32::consts::LOG2_E).is_finite();
    match sinks.iter().position(|&x| !ok(x)) {
        Some(index) => Err(Error::InvalidValue {
            operand: Operand::Sinks,
            index,
            reason: "sink logit is NaN or +inf, or finite with |sink|·log2(e) overflowing f32",
        }),
        None => Ok(()),
    }
}

/// Where the sequences of a packed batch lie (`None`: the dense `[B, n, …]` layout).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Seqs<'a> {
    /// Packed queries and outputs: sequence `b` is rows `q[b] .. q[b + 1]` of a
    /// `[1, total_q, H, d]` view.
    pub q: Option<&'a [usize]>,
    /// Packed keys and values: sequence `b`'s keys are rows `kv[b] .. kv[b + 1]`.
    pub kv: Option<&'a [usize]>,
}

/// The validated sizes and semantics of one call. Everything the kernels need to know about
/// *what* to compute, nothing about *how*.
#[derive(Debug, Clone)]
pub(crate) struct Problem<'a> {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub scale: f32,
    /// The alignment of the diagonal of causal, window and ALiBi (`None`: no diagonal).
    pub alignment: Option<Alignment>,
    /// Keys visible after the diagonal: row `i` sees `j ≤ i + off + right`. `None`: unbounded.
    pub right: Option<usize>,
    /// Keys visible before the diagonal: row `i` sees `j ≥ i + off − left`. `None`: unbounded.
    pub left: Option<usize>,
    /// Per-batch key lengths (each at most its sequence's keys), or with `lens_before` the
    /// lengths before the call's query rows ([`Options::cache_seqlens`]).
    pub kv_lens: Option<&'a [usize]>,
    pub lens_before: bool,
    /// Packed sequences, if any.
    pub seqs: Seqs<'a>,
    pub bias: Option<Broadcast<'a, f32>>,
    pub mask: Option<Broadcast<'a, bool>>,
    /// ALiBi slope per query head.
    pub alibi: Option<&'a [f32]>,
    pub softcap: Option<f32>,
    /// Sink logit per query head.
    pub sinks: Option<&'a [f32]>,
    /// The scales of `i8` K/V.
    pub kv_scales: Option<KvScales<'a>>,
    /// [`Options::bf16_products`] with bf16 Q and K/V: the products may run on bf16
    /// operands (the weights `P` rounded to bf16). Off for other types.
    pub bf16_products: bool,
}

/// Whether Q and K/V are bf16, the types [`Options::bf16_products`] applies to: their values
/// are bf16 already, so the bf16 products round only the softmax weights (never a value out of
/// range: an f32 beyond bf16's largest finite value would round to ±∞).
pub(crate) fn bf16_inputs<Q: KvElement, KV: KvElement>() -> bool {
    dtype::<Q>() == Dtype::Bf16 && dtype::<KV>() == Dtype::Bf16
}

impl<'a> Problem<'a> {
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }

    /// The key index aligned with query row 0 of batch `b` (`off_b`): 0 top-left, and
    /// bottom-right the sequence's own key length minus `n_q` (`kv_lens[b] − n_q`, or
    /// `n_kv − n_q` without key lengths), so a preallocated cache `[B, max_len, …]` with
    /// per-sequence lengths puts each sequence's new tokens at its own end, as
    /// FlashAttention-2's `cache_seqlens` does.
    pub fn diag_offset(&self, b: usize) -> i128 {
        match self.alignment {
            Some(Alignment::BottomRight) => self.kv_len(b) as i128 - self.q_len(b) as i128,
            _ => 0,
        }
    }

    /// The number of keys of batch `b`: its key length, or else its packed sequence's length,
    /// or `n_kv`.
    pub fn kv_len(&self, b: usize) -> usize {
        match (self.kv_lens, self.seqs.kv) {
            // (Validated: the sum does not exceed the sequence's keys.)
            (Some(l), _) if self.lens_before => l[b] + self.q_len(b),
            (Some(l), _) => l[b],
            (None, Some(cu)) => cu[b + 1] - cu[b],
            (None, None) => self.n_kv,
        }
    }

    /// The number of query rows of batch `b` (`n_q`, or its packed sequence's length).
    pub fn q_len(&self, b: usize) -> usize {
        self.seqs.q.map_or(self.n_q, |cu| cu[b + 1] - cu[b])
    }

    /// Where query row `i` of batch `b` is stored in Q and out: `(batch, seq)` indices of
    /// the views (`(0, cu_seqlens_q[b] + i)` when packed).
    pub fn q_row(&self, b: usize, i: usize) -> (usize, usize) {
        self.seqs.q.map_or((b, i), |cu| (0, cu[b] + i))
    }

    /// Whether key `j` passes the causal, window and key-length masks for row `i` of batch `b`
    /// (the literal definition; the reference uses it element by element). The boolean mask
    /// and `−∞` biases are applied separately, per head.
    pub fn is_visible(&self, b: usize, i: usize, j: usize) -> bool {
        let center = i as i128 + self.diag_offset(b);
        let j = j as i128;
        let before_right_edge = self
            .right
            .is_none_or(|r| j <= center.saturating_add(r as i128));
        let after_left_edge = self
            .left
            .is_none_or(|l| j >= center.saturating_sub(l as i128));
        before_right_edge && after_left_edge && j < self.kv_len(b) as i128
    }

    /// The half-open range `[lo, hi)` of keys that pass the causal, window and key-length masks
    /// for row `i` of batch `b`. Empty when `lo ≥ hi`. The fused kernel skips key blocks
    /// outside it.
    pub fn visible_keys(&self, b: usize, i: usize) -> (usize, usize) {
        let n_kv = self.kv_len(b) as i128;
        let center = i as i128 + self.diag_offset(b);
        let hi = match self.right {
            Some(r) => center.saturating_add(r as i128).saturating_add(1).min(n_kv),
            None => n_kv,
        };
        let lo = match self.left {
            Some(l) => center.saturating_sub(l as i128).max(0),
            None => 0,
        };
        let hi = hi.max(0) as usize;
        let lo = lo.min(n_kv) as usize;
        (lo, hi.max(lo))
    }

    /// Validates the operands of a call on dense tensors (`out_dims`: the output's logical
    /// dims) and the options.
    pub fn new<Q: KvElement, KV: KvElement>(
        q: &Tensor<'_, Q>,
        k: &Tensor<'_, KV>,
        v: &Tensor<'_, KV>,
        out_dims: [usize; 4],
        lse: Option<&[f32]>,
        opts: &Options<'a>,
    ) -> Result<Self, Error> {
        let [batch, _, _, d_k] = q.dims();
        let [_, n_kv, kv_heads, _] = k.dims();
        let d_v = v.dims()[3];
        expect(Operand::Key, k.dims(), [batch, n_kv, kv_heads, d_k])?;
        expect(Operand::Value, v.dims(), [batch, n_kv, kv_heads, d_v])?;
        let sizes = Sizes::dense(q.dims(), out_dims, kv_heads, n_kv, d_v)?;
        let mut p = Self::build_dense(sizes, lse, opts)?;
        p.bf16_products &= bf16_inputs::<Q, KV>();
        p.kv_scales = check_scales::<KV>(opts, k.dims(), v.dims(), &all_rows)?;
        Ok(p)
    }

    /// Validates a call whose K/V pages are `kv` (Q, out and LSE dense, as in
    /// [`Problem::new`]): the logical key buffer of sequence `b` is its `pages_per_seq` pages,
    /// the key lengths are required, and every table entry a sequence's key length reaches must
    /// name a page of the pool.
    pub fn new_paged<Q: KvElement, KV: KvElement>(
        q: &Tensor<'_, Q>,
        kv: &PagedKv<'a, KV>,
        out_dims: [usize; 4],
        lse: Option<&[f32]>,
        opts: &Options<'a>,
    ) -> Result<Self, Error> {
        let [batch, _, _, d_k] = q.dims();
        let [_, _, kv_heads, d_kk] = kv.k.dims();
        let d_v = kv.v.dims()[3];
        expect(
            Operand::Key,
            [batch, 0, kv_heads, d_kk],
            [batch, 0, kv_heads, d_k],
        )?;
        let sizes = Sizes::dense(q.dims(), out_dims, kv_heads, kv.capacity()?, d_v)?;
        check_len(
            kv.block_table,
            batch.saturating_mul(kv.pages_per_seq),
            Operand::BlockTable,
        )?;
        let mut p = Self::build_dense(sizes, lse, opts)?;
        p.bf16_products &= bf16_inputs::<Q, KV>();
        p.check_pages(kv)?;
        p.kv_scales = p.paged_scales(kv, opts)?;
        Ok(p)
    }

    /// Validates a packed variable-length call: Q `[1, total_q, H, d_k]` with sequence `b` in
    /// rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]`, out alike, LSE `[H, total_q]`, K/V
    /// packed (`[1, total_kv, H_kv, d]` with `cu_seqlens_k`) or paged.
    pub fn new_varlen<Q: KvElement, KV: KvElement>(
        q: &Tensor<'_, Q>,
        cu_seqlens_q: &'a [usize],
        kv: &VarlenKv<'a, KV>,
        out_dims: [usize; 4],
        lse: Option<&[f32]>,
        opts: &Options<'a>,
    ) -> Result<Self, Error> {
        let [one, total_q, heads, d_k] = q.dims();
        expect(Operand::Query, [one, 0, 0, 0], [1, 0, 0, 0])?;
        let batch = cu_seqlens_q.len().saturating_sub(1);
        let n_q = check_offsets(cu_seqlens_q, total_q, Operand::CuSeqlensQ)?;
        let (kv_heads, d_kk, d_v, n_kv, kv_offsets) = match kv {
            VarlenKv::Packed(p) => {
                let [one, total_kv, kv_heads, d_kk] = p.k.dims();
                let d_v = p.v.dims()[3];
                expect(Operand::Key, [one, 0, 0, 0], [1, 0, 0, 0])?;
                expect(Operand::Value, p.v.dims(), [1, total_kv, kv_heads, d_v])?;
                check_len(p.cu_seqlens_k, batch + 1, Operand::CuSeqlensK)?;
                let n_kv = check_offsets(p.cu_seqlens_k, total_kv, Operand::CuSeqlensK)?;
                (kv_heads, d_kk, d_v, n_kv, Some(p.cu_seqlens_k))
            }
            VarlenKv::Paged(p) => {
                let [_, _, kv_heads, d_kk] = p.k.dims();
                let n_kv = p.capacity()?;
                check_len(
                    p.block_table,
                    batch.saturating_mul(p.pages_per_seq),
                    Operand::BlockTable,
                )?;
                (kv_heads, d_kk, p.v.dims()[3], n_kv, None)
            }
        };
        expect(Operand::Key, [0, 0, kv_heads, d_kk], [0, 0, kv_heads, d_k])?;
        expect(Operand::Output, out_dims, [1, total_q, heads, d_v])?;
        let sizes = Sizes {
            batch,
            n_q,
            heads,
            kv_heads,
            n_kv,
            d_k,
            d_v,
        };
        let seqs = Seqs {
            q: Some(cu_seqlens_q),
            kv: kv_offsets,
        };
        let lse_len = heads.saturating_mul(total_q);
        let mut p = Self::build(sizes, seqs, lse.map(|l| (l.len(), lse_len)), opts)?;
        p.bf16_products &= bf16_inputs::<Q, KV>();
        p.kv_scales = match kv {
            VarlenKv::Paged(paged) => {
                p.check_pages(paged)?;
                p.paged_scales(paged, opts)?
            }
            VarlenKv::Packed(packed) => {
                check_scales::<KV>(opts, packed.k.dims(), packed.v.dims(), &all_rows)?
            }
        };
        Ok(p)
    }

    /// The scales of one layer run through a [`crate::Plan`] (`scales`: its K and V scales),
    /// checked against its K/V `kv` as a call checks them.
    pub fn layer_scales<KV: KvElement>(
        &self,
        kv: &TensorKv<'a, KV>,
        scales: Option<(Tensor<'a, f32>, Tensor<'a, f32>)>,
    ) -> Result<Option<KvScales<'a>>, Error> {
        let opts = Options {
            kv_scales: scales,
            ..Options::default()
        };
        match kv.map {
            RowMap::Paged {
                table,
                pages_per_seq,
                ..
            } => {
                let paged = PagedKv {
                    k: kv.k,
                    v: kv.v,
                    block_table: table,
                    pages_per_seq,
                };
                self.paged_scales(&paged, &opts)
            }
            _ => check_scales::<KV>(&opts, kv.k.dims(), kv.v.dims(), &all_rows),
        }
    }

    /// [`Problem::layer_scales`] for scales known valid (a [`KvPool`](crate::KvPool)'s,
    /// written only by `append`): present exactly for `i8` and broadcastable to K/V, their
    /// values not read.
    pub fn known_scales<KV: KvElement>(
        kv: &TensorKv<'a, KV>,
        scales: Option<(Tensor<'a, f32>, Tensor<'a, f32>)>,
    ) -> Result<Option<KvScales<'a>>, Error> {
        match scales {
            Some((k, v)) if KV::QUANTIZED => Ok(Some(KvScales {
                k: broadcast(&k, kv.k.dims(), Operand::KeyScales)?,
                v: broadcast(&v, kv.v.dims(), Operand::ValueScales)?,
            })),
            None if !KV::QUANTIZED => Ok(None),
            _ => Err(Error::KvScales { kv_type: KV::NAME }),
        }
    }

    /// [`check_scales`] for a paged cache: only the scales of the pages that the sequences'
    /// key lengths reach are read, so only those are checked (a pool shared by many
    /// sequences is not scanned on every call). After [`Problem::check_pages`].
    fn paged_scales<KV: KvElement>(
        &self,
        kv: &PagedKv<'a, KV>,
        opts: &Options<'a>,
    ) -> Result<Option<KvScales<'a>>, Error> {
        let page_size = kv.k.dims()[1];
        let used = |_: usize, f: &mut Visit<'_>| {
            (0..self.batch).try_for_each(|b| {
                let n = self.kv_len(b).div_ceil(page_size);
                kv.block_table[b * kv.pages_per_seq..][..n]
                    .iter()
                    .try_for_each(|&page| f(page as usize))
            })
        };
        check_scales::<KV>(opts, kv.k.dims(), kv.v.dims(), &used)
    }

    /// Every table entry that a sequence's key length reaches names a page of the pool.
    /// [`Problem::build`] for dense queries and outputs (LSE `[B, H, n_q]`).
    fn build_dense(sizes: Sizes, lse: Option<&[f32]>, opts: &Options<'a>) -> Result<Self, Error> {
        let lse_len = dense_lse_len(sizes.batch, sizes.heads, sizes.n_q);
        let lse = lse.map(|l| (l.len(), lse_len));
        Self::build(sizes, Seqs::default(), lse, opts)
    }

    /// Paged calls need `kv_lens`: a table row is padded past its sequence's pages, so its
    /// capacity is no length.
    fn check_pages<KV>(&self, kv: &PagedKv<'_, KV>) -> Result<(), Error> {
        if self.kv_lens.is_none() {
            return Err(Error::LengthMismatch {
                operand: Operand::KvLens,
                expected: self.batch,
                got: 0,
            });
        }
        let pages = kv.k.dims()[0];
        let page_size = kv.k.dims()[1];
        for b in 0..self.batch {
            let used = self.kv_len(b).div_ceil(page_size);
            let row = &kv.block_table[b * kv.pages_per_seq..][..used];
            if let Some(p) = row.iter().position(|&page| page as usize >= pages) {
                return Err(Error::InvalidValue {
                    operand: Operand::BlockTable,
                    index: b * kv.pages_per_seq + p,
                    reason: "page index is not below the number of pages in the pool",
                });
            }
        }
        Ok(())
    }

    /// The checks every call shares, on its logical sizes: heads, head size, LSE length
    /// (`lse`: its length and the length the shapes imply), scale and options.
    fn build(
        sizes: Sizes,
        seqs: Seqs<'a>,
        lse: Option<(usize, usize)>,
        opts: &Options<'a>,
    ) -> Result<Self, Error> {
        let Sizes {
            batch,
            n_q,
            heads,
            kv_heads,
            n_kv,
            d_k,
            d_v,
        } = sizes;
        if kv_heads == 0 || heads == 0 || heads % kv_heads != 0 {
            return Err(Error::HeadsNotDivisible { heads, kv_heads });
        }
        if d_k == 0 {
            return Err(Error::ZeroHeadDim);
        }
        if let Some((got, expected)) = lse {
            if got != expected {
                return Err(Error::LengthMismatch {
                    operand: Operand::Lse,
                    expected,
                    got,
                });
            }
        }
        let scale = opts.scale.unwrap_or(1.0 / (d_k as f32).sqrt());
        if !scale.is_finite() {
            return Err(Error::InvalidScale(scale));
        }

        // One diagonal for causal, window and ALiBi.
        let alignments = [
            opts.causal,
            opts.window.map(|w| w.alignment),
            opts.alibi.map(|a| a.1),
        ];
        let mut alignment: Option<Alignment> = None;
        for a in alignments.into_iter().flatten() {
            if alignment.is_some_and(|b| b != a) {
                return Err(Error::ConflictingAlignment);
            }
            alignment = Some(a);
        }
        // A side wider than any index difference (more than i64::MAX, e.g. usize::MAX or
        // usize::MAX − 1) bounds nothing.
        let bounded = |x: usize| i64::try_from(x).is_ok().then_some(x);
        let window_right = opts.window.and_then(|w| bounded(w.right));
        let right = match (opts.causal, window_right) {
            (Some(_), _) => Some(0),
            (None, r) => r,
        };
        let left = opts.window.and_then(|w| bounded(w.left));

        if let Some(lens) = opts.kv_lens {
            check_len(lens, batch, Operand::KvLens)?;
            let capacity = |b: usize| seqs.kv.map_or(n_kv, |cu| cu[b + 1] - cu[b]);
            let q_len = |b: usize| seqs.q.map_or(n_q, |cu| cu[b + 1] - cu[b]);
            let len = |b: usize| match opts.lens_before {
                true => lens[b].checked_add(q_len(b)),
                false => Some(lens[b]),
            };
            if let Some(index) = (0..batch).position(|b| len(b).is_none_or(|l| l > capacity(b))) {
                return Err(Error::InvalidValue {
                    operand: Operand::KvLens,
                    index,
                    reason: match opts.lens_before {
                        true => "cached keys plus the call's query rows exceed the sequence's keys",
                        false => "key length exceeds the sequence's keys (n_kv)",
                    },
                });
            }
        }
        let want = [batch, n_q, heads, n_kv];
        let bias = opts
            .bias
            .as_ref()
            .map(|t| broadcast(t, want, Operand::Bias))
            .transpose()?;
        let mask = opts
            .mask
            .as_ref()
            .map(|t| broadcast(t, want, Operand::Mask))
            .transpose()?;
        let per_head = |s: &[f32], operand: Operand, reason: &'static str, ok: fn(f32) -> bool| {
            check_len(s, heads, operand)?;
            match s.iter().position(|&x| !ok(x)) {
                Some(index) => Err(Error::InvalidValue {
                    operand,
                    index,
                    reason,
                }),
                None => Ok(()),
            }
        };
        // Values that the kernel turns into log2 units must stay finite there.
        fn fits_log2(x: f32) -> bool {
            (x * std::f32::consts::LOG2_E).is_finite()
        }
        if let Some((slopes, _)) = opts.alibi {
            per_head(
                slopes,
                Operand::AlibiSlopes,
                "slope is not finite, or |slope|·log2(e) overflows f32",
                fits_log2,
            )?;
        }
        if let Some(sinks) = opts.sinks {
            check_sinks(sinks, heads)?;
        }
        if let Some(cap) = opts.softcap {
            if !(cap >= f32::MIN_POSITIVE && fits_log2(cap)) {
                return Err(Error::InvalidSoftcap(cap));
            }
        }
        Ok(Problem {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k,
            d_v,
            scale,
            alignment,
            right,
            left,
            kv_lens: opts.kv_lens,
            lens_before: opts.lens_before,
            seqs,
            bias,
            mask,
            alibi: opts.alibi.map(|a| a.0),
            softcap: opts.softcap,
            sinks: opts.sinks,
            kv_scales: None,
            bf16_products: opts.bf16_products,
        })
    }
}
