//! The references of the engine layouts (`reference::attention_paged`,
//! `reference::attention_varlen`, their `error_bounds_*`) and of `append`
//! (`reference::append`), over random cases of every K/V type:
//! * the fused paged and varlen calls within the reference's bounds (through the one checker,
//!   `contract::check_against_reference`), packed rows outside every sequence untouched by both;
//! * the paged / packed reference equal, bit for bit, to the dense `reference::attention_lse` on
//!   the keys (and `i8` scales) gathered into dense tensors, and their bounds equal to the dense
//!   bounds: the oracle reads values, not where they lie (slots past a length hold NaN and
//!   table padding names no page, so a read there would show);
//! * `sdpa::append` equal to `reference::append` bit for bit for f32/f16/bf16 caches; for `i8`
//!   the same scales, and values that differ by at most 1, only where the quotient is within
//!   `127 · 2⁻²⁴` of a half-integer (the oracle's within half a step of the rotated row);
//! * the same typed errors from both paths on broken operands, nothing written.

use crate::support::contract::{check_against_reference, Outputs, RowFacts, Tally};
use crate::support::values::SplitMix;
use sdpa::half::{bf16, f16};
use sdpa::reference;
use sdpa::{
    Alignment, Error, KvElement, Options, PackedKv, PagedKv, Rope, RopeStyle, Tensor, TensorMut,
    VarlenKv,
};

/// A K/V type the cases draw values of.
trait Kv: KvElement + Default {
    /// A random stored value (`i8`: any of −127..=127; floats: uniform in [−2, 2)).
    fn draw(rng: &mut SplitMix) -> Self;
    /// NaN where the type has it (slots no call may read), else a large value.
    const POISON: Self;
}

impl Kv for f32 {
    fn draw(rng: &mut SplitMix) -> Self {
        2.0 * rng.unit() as f32
    }
    const POISON: Self = f32::NAN;
}
impl Kv for f16 {
    fn draw(rng: &mut SplitMix) -> Self {
        f16::from_f32(2.0 * rng.unit() as f32)
    }
    const POISON: Self = f16::NAN;
}
impl Kv for bf16 {
    fn draw(rng: &mut SplitMix) -> Self {
        bf16::from_f32(2.0 * rng.unit() as f32)
    }
    const POISON: Self = bf16::NAN;
}
impl Kv for i8 {
    fn draw(rng: &mut SplitMix) -> Self {
        (rng.below(255) as i32 - 127) as i8
    }
    const POISON: Self = 127;
}

/// The options a case draws (besides key lengths and scales).
#[derive(Debug, Clone, Copy)]
struct Drawn {
    causal: Option<Alignment>,
    softcap: Option<f32>,
    sinks: bool,
}

fn draw_opts(rng: &mut SplitMix) -> Drawn {
    Drawn {
        causal: rng.pick(&[None, Some(Alignment::TopLeft), Some(Alignment::BottomRight)]),
        softcap: rng.pick(&[None, None, Some(3.0)]),
        sinks: rng.chance(0.3),
    }
}

impl Drawn {
    fn apply<'a>(&self, mut o: Options<'a>, sinks: &'a [f32]) -> Options<'a> {
        if let Some(a) = self.causal {
            o = o.causal(a);
        }
        if let Some(c) = self.softcap {
            o = o.softcap(c);
        }
        if self.sinks {
            o = o.sinks(sinks);
        }
        o
    }
}

/// The same values, bit for bit (through f64, exact for every K/V type).
fn same_bits<T: KvElement>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// One random paged case of K/V type `T`; returns what the checker verified.
fn paged_case<T: Kv>(seed: u64) -> Tally {
    let mut rng = SplitMix(seed);
    let (h_kv, group) = (1 + rng.below(3), rng.pick(&[1, 2, 4]));
    let h = h_kv * group;
    let d_k = rng.pick(&[1, 3, 8, 16, 33]);
    let d_v = if rng.chance(0.3) {
        rng.pick(&[1, 5, 8])
    } else {
        d_k
    };
    let page = rng.pick(&[1, 2, 5, 16]);
    let (batch, n_q, pps) = (1 + rng.below(3), rng.below(6), rng.below(5));
    let cap = pps * page;
    let pages = batch * pps + 1;
    // Padding past a sequence's pages names no page of the pool: never read.
    let mut table = vec![u32::MAX; batch * pps];
    let lens: Vec<usize> = (0..batch).map(|_| rng.below(cap + 1)).collect();
    for b in 0..batch {
        for e in 0..lens[b].div_ceil(page) {
            table[b * pps + e] = rng.below(pages) as u32; // shared pages too
        }
    }
    // Slots no sequence reaches hold NaN (floats): a read there would show.
    let reached = |page_i: usize, slot: usize| {
        (0..batch).any(|b| {
            (0..lens[b]).any(|j| table[b * pps + j / page] as usize == page_i && j % page == slot)
        })
    };
    let mut pool = |d: usize| -> Vec<T> {
        let mut x = vec![T::POISON; pages * page * h_kv * d];
        for p in 0..pages {
            for s in 0..page {
                if reached(p, s) {
                    for e in &mut x[(p * page + s) * h_kv * d..][..h_kv * d] {
                        *e = T::draw(&mut rng);
                    }
                }
            }
        }
        x
    };
    let (kp, vp) = (pool(d_k), pool(d_v));
    // i8 scales per (slot, kv head), finite everywhere (a reached page is checked whole).
    let scales: Vec<f32> = (0..2 * pages * page * h_kv)
        .map(|_| 0.01 + 0.05 * (rng.unit() as f32 + 1.0))
        .collect();
    let (ks, vs) = scales.split_at(pages * page * h_kv);
    let q: Vec<f32> = (0..batch * n_q * h * d_k)
        .map(|_| rng.unit() as f32)
        .collect();
    let sinks: Vec<f32> = (0..h).map(|_| rng.unit() as f32).collect();
    let drawn = draw_opts(&mut rng);
    // `cache_seqlens` where every sequence holds its query rows, else `kv_lens`.
    let before: Vec<usize> = lens.iter().map(|&l| l.saturating_sub(n_q)).collect();
    let use_before = rng.chance(0.5) && lens.iter().all(|&l| l >= n_q);
    let mut opts = drawn.apply(Options::new(), &sinks);
    opts = match use_before {
        true => opts.cache_seqlens(&before),
        false => opts.kv_lens(&lens),
    };
    let sd = [pages, page, h_kv, 1];
    if T::QUANTIZED {
        opts = opts.kv_scales(Tensor::bshd(ks, sd).unwrap(), Tensor::bshd(vs, sd).unwrap());
    }
    let label = format!(
        "paged seed {seed} {} {drawn:?} lens {lens:?} n_q {n_q}",
        T::NAME
    );
    let qt = Tensor::bshd(&q, [batch, n_q, h, d_k]).unwrap();
    let kv = PagedKv::new(
        Tensor::bshd(&kp, [pages, page, h_kv, d_k]).unwrap(),
        Tensor::bshd(&vp, [pages, page, h_kv, d_v]).unwrap(),
        &table,
        pps,
    )
    .unwrap();
    let od = [batch, n_q, h, d_v];
    let run = |reference: bool| {
        let mut out = vec![f32::NAN; batch * n_q * h * d_v];
        let mut lse = vec![f32::NAN; batch * h * n_q];
        let mut o = TensorMut::bshd(&mut out, od).unwrap();
        match reference {
            true => reference::attention_paged(&qt, &kv, &mut o, Some(&mut lse), &opts),
            false => sdpa::attention_paged(&qt, &kv, &mut o, Some(&mut lse), &opts),
        }
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        Outputs { dims: od, out, lse }
    };
    let (fused, refd) = (run(false), run(true));
    let bounds = reference::error_bounds_paged(&qt, &kv, &opts).unwrap();
    let tally = check_against_reference(&fused, &refd, &bounds, |_| RowFacts::FINITE, &label);

    // The dense reference on the gathered keys: the same bits, the same bounds.
    let gather = |pool: &[T], d: usize| {
        let mut x = vec![T::default(); batch * cap * h_kv * d];
        for b in 0..batch {
            for j in 0..lens[b] {
                let slot = table[b * pps + j / page] as usize * page + j % page;
                x[(b * cap + j) * h_kv * d..][..h_kv * d]
                    .copy_from_slice(&pool[slot * h_kv * d..][..h_kv * d]);
            }
        }
        x
    };
    let (kd, vd) = (gather(&kp, d_k), gather(&vp, d_v));
    let gather_scales = |s: &[f32]| {
        let mut x = vec![0.0f32; batch * cap * h_kv];
        for b in 0..batch {
            for j in 0..lens[b] {
                let slot = table[b * pps + j / page] as usize * page + j % page;
                x[(b * cap + j) * h_kv..][..h_kv].copy_from_slice(&s[slot * h_kv..][..h_kv]);
            }
        }
        x
    };
    let (kds, vds) = (gather_scales(ks), gather_scales(vs));
    let mut dense_opts = drawn.apply(Options::new(), &sinks);
    dense_opts = match use_before {
        true => dense_opts.cache_seqlens(&before),
        false => dense_opts.kv_lens(&lens),
    };
    let dsd = [batch, cap, h_kv, 1];
    if T::QUANTIZED {
        dense_opts = dense_opts.kv_scales(
            Tensor::bshd(&kds, dsd).unwrap(),
            Tensor::bshd(&vds, dsd).unwrap(),
        );
    }
    let kt = Tensor::bshd(&kd, [batch, cap, h_kv, d_k]).unwrap();
    let vt = Tensor::bshd(&vd, [batch, cap, h_kv, d_v]).unwrap();
    let mut out = vec![f32::NAN; batch * n_q * h * d_v];
    let mut lse = vec![f32::NAN; batch * h * n_q];
    let mut o = TensorMut::bshd(&mut out, od).unwrap();
    reference::attention_lse(&qt, &kt, &vt, &mut o, &mut lse, &dense_opts).unwrap();
    assert_eq!(
        bits(&out),
        bits(&refd.out),
        "{label}: dense reference output"
    );
    assert_eq!(bits(&lse), bits(&refd.lse), "{label}: dense reference lse");
    let dense_bounds = reference::error_bounds(&qt, &kt, &vt, &dense_opts).unwrap();
    assert_eq!(dense_bounds, bounds, "{label}: dense bounds");
    tally
}

/// One random varlen case of K/V type `T`, K/V packed or paged.
fn varlen_case<T: Kv>(seed: u64) -> Tally {
    let mut rng = SplitMix(seed);
    let (h_kv, group) = (1 + rng.below(3), rng.pick(&[1, 2, 3]));
    let h = h_kv * group;
    let d_k = rng.pick(&[2, 7, 16]);
    let d_v = if rng.chance(0.3) { 4 } else { d_k };
    let batch = 1 + rng.below(4);
    let q_lens: Vec<usize> = (0..batch).map(|_| rng.below(6)).collect();
    // Key segments and the keys each sequence uses (its length; 0 included).
    let segs: Vec<usize> = (0..batch).map(|_| rng.below(12)).collect();
    let lens: Vec<usize> = segs.iter().map(|&s| s - rng.below(s.min(2) + 1)).collect();
    let give_lens = rng.chance(0.5) || lens != segs;
    let paged = rng.chance(0.4);
    let offsets = |first: usize, n: &[usize]| {
        let mut cu = vec![first];
        for &x in n {
            cu.push(cu.last().unwrap() + x);
        }
        cu
    };
    // Packed rows before the first and after the last sequence: never written.
    let cu_q = offsets(rng.below(3), &q_lens);
    let total_q = cu_q[batch] + rng.below(3);
    let cu_k = offsets(rng.below(3), &segs);
    let total_k = cu_k[batch] + rng.below(3);
    let page = rng.pick(&[1, 3, 8]);
    let pps = segs.iter().max().unwrap().div_ceil(page);
    let pages = batch * pps;
    // Key j of sequence b: packed row cu_k[b] + j; paged slot (b·pps + j/page)·page + j%page
    // (the table in reverse page order, to be sure it is read).
    let table: Vec<u32> = (0..pages).rev().map(|p| p as u32).collect();
    let rows = if paged { pages * page } else { total_k };
    let at = |b: usize, j: usize| match paged {
        true => table[b * pps + j / page] as usize * page + j % page,
        false => cu_k[b] + j,
    };
    let mut store = |d: usize| {
        let mut x = vec![T::POISON; rows * h_kv * d];
        for b in 0..batch {
            for j in 0..lens[b] {
                for e in &mut x[at(b, j) * h_kv * d..][..h_kv * d] {
                    *e = T::draw(&mut rng);
                }
            }
        }
        x
    };
    let (kx, vx) = (store(d_k), store(d_v));
    // i8: scales per (kv head, channel), one view for K and one for V.
    let ks: Vec<f32> = (0..h_kv * d_k).map(|i| 0.02 + 0.001 * i as f32).collect();
    let vs: Vec<f32> = (0..h_kv * d_v).map(|i| 0.03 - 0.0005 * i as f32).collect();
    let q: Vec<f32> = (0..total_q * h * d_k).map(|_| rng.unit() as f32).collect();
    let sinks: Vec<f32> = (0..h).map(|_| rng.unit() as f32).collect();
    let drawn = draw_opts(&mut rng);
    let mut opts = drawn.apply(Options::new(), &sinks);
    if give_lens {
        opts = opts.kv_lens(&lens);
    }
    let (ksd, vsd) = ([1, 1, h_kv, d_k], [1, 1, h_kv, d_v]);
    if T::QUANTIZED {
        opts = opts.kv_scales(
            Tensor::bshd(&ks, ksd).unwrap(),
            Tensor::bshd(&vs, vsd).unwrap(),
        );
    }
    if paged && !give_lens {
        opts = opts.kv_lens(&lens); // paged K/V need lengths
    }
    let label = format!(
        "varlen seed {seed} {} paged {paged} {drawn:?} q {q_lens:?} lens {lens:?}",
        T::NAME
    );
    let qt = Tensor::bshd(&q, [1, total_q, h, d_k]).unwrap();
    let (kdims, vdims) = match paged {
        true => ([pages, page, h_kv, d_k], [pages, page, h_kv, d_v]),
        false => ([1, total_k, h_kv, d_k], [1, total_k, h_kv, d_v]),
    };
    let (kt, vt) = (
        Tensor::bshd(&kx, kdims).unwrap(),
        Tensor::bshd(&vx, vdims).unwrap(),
    );
    let kv: VarlenKv<'_, T> = match paged {
        true => PagedKv::new(kt, vt, &table, pps).unwrap().into(),
        false => PackedKv::new(kt, vt, &cu_k).into(),
    };
    let od = [1, total_q, h, d_v];
    let inside = |t: usize| cu_q[0] <= t && t < cu_q[batch];
    let run = |reference: bool| {
        let mut out = vec![f32::NAN; total_q * h * d_v];
        let mut lse = vec![f32::NAN; h * total_q];
        let mut o = TensorMut::bshd(&mut out, od).unwrap();
        match reference {
            true => reference::attention_varlen(&qt, &cu_q, &kv, &mut o, Some(&mut lse), &opts),
            false => sdpa::attention_varlen(&qt, &cu_q, &kv, &mut o, Some(&mut lse), &opts),
        }
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        // Rows outside every sequence: untouched (NaN), then set as empty rows for the checker.
        for t in (0..total_q).filter(|&t| !inside(t)) {
            for hh in 0..h {
                let row = &mut out[(t * h + hh) * d_v..][..d_v];
                assert!(row.iter().all(|x| x.is_nan()), "{label}: row {t} written");
                row.fill(0.0);
                let l = &mut lse[hh * total_q + t];
                assert!(l.is_nan(), "{label}: lse of row {t} written");
                *l = f32::NEG_INFINITY;
            }
        }
        Outputs { dims: od, out, lse }
    };
    let (fused, refd) = (run(false), run(true));
    let bounds = reference::error_bounds_varlen(&qt, &cu_q, &kv, &opts).unwrap();
    let tally = check_against_reference(&fused, &refd, &bounds, |_| RowFacts::FINITE, &label);

    // Each sequence: the dense reference on its rows and keys alone, bit for bit.
    for b in 0..batch {
        let (r0, n) = (cu_q[b], q_lens[b]);
        let gather = |x: &[T], d: usize| {
            (0..lens[b])
                .flat_map(|j| x[at(b, j) * h_kv * d..][..h_kv * d].iter().copied())
                .collect::<Vec<T>>()
        };
        let (kd, vd) = (gather(&kx, d_k), gather(&vx, d_v));
        let qs = Tensor::bshd(&q[r0 * h * d_k..(r0 + n) * h * d_k], [1, n, h, d_k]).unwrap();
        let kt = Tensor::bshd(&kd, [1, lens[b], h_kv, d_k]).unwrap();
        let vt = Tensor::bshd(&vd, [1, lens[b], h_kv, d_v]).unwrap();
        let mut o = drawn.apply(Options::new(), &sinks);
        if T::QUANTIZED {
            o = o.kv_scales(
                Tensor::bshd(&ks, ksd).unwrap(),
                Tensor::bshd(&vs, vsd).unwrap(),
            );
        }
        let mut out = vec![0.0f32; n * h * d_v];
        let mut lse = vec![0.0f32; h * n];
        let mut ov = TensorMut::bshd(&mut out, [1, n, h, d_v]).unwrap();
        reference::attention_lse(&qs, &kt, &vt, &mut ov, &mut lse, &o).unwrap();
        let seq_bounds = reference::error_bounds(&qs, &kt, &vt, &o).unwrap();
        assert_eq!(
            bits(&out),
            bits(&refd.out[r0 * h * d_v..(r0 + n) * h * d_v]),
            "{label}: sequence {b} output"
        );
        for hh in 0..h {
            for i in 0..n {
                let t = hh * total_q + r0 + i;
                let what = format!("{label}: sequence {b} head {hh} row {i}");
                assert_eq!(
                    lse[hh * n + i].to_bits(),
                    refd.lse[t].to_bits(),
                    "{what}: lse"
                );
                assert_eq!(seq_bounds[hh * n + i], bounds[t], "{what}: bound");
            }
        }
    }
    tally
}

fn cases() -> u64 {
    if cfg!(debug_assertions) {
        20
    } else {
        400
    }
}

#[test]
fn paged_reference_bounds_the_kernel_and_equals_the_dense_reference() {
    let mut total = Tally::default();
    for seed in 0..cases() {
        for t in [
            paged_case::<f32>(seed),
            paged_case::<f16>(1 << 20 | seed),
            paged_case::<bf16>(2 << 20 | seed),
            paged_case::<i8>(3 << 20 | seed),
        ] {
            total.rows_in_bound += t.rows_in_bound;
            total.rows_empty += t.rows_empty;
        }
    }
    assert!(total.rows_in_bound >= 10 * cases() as usize, "{total:?}");
    assert!(total.rows_empty >= cases() as usize / 2, "{total:?}");
}

#[test]
fn varlen_reference_bounds_the_kernel_and_equals_the_dense_reference() {
    let mut total = Tally::default();
    for seed in 0..cases() {
        for t in [
            varlen_case::<f32>(seed),
            varlen_case::<f16>(1 << 20 | seed),
            varlen_case::<bf16>(2 << 20 | seed),
            varlen_case::<i8>(3 << 20 | seed),
        ] {
            total.rows_in_bound += t.rows_in_bound;
            total.rows_empty += t.rows_empty;
        }
    }
    assert!(total.rows_in_bound >= 10 * cases() as usize, "{total:?}");
    assert!(total.rows_empty >= cases() as usize / 2, "{total:?}");
}

/// What an [`append_case`] breaks on purpose.
#[derive(Debug, Clone, Copy, PartialEq)]
enum AppendFault {
    None,
    SlotPastCache,
    SlotTwice,
    PositionsShort,
    NanRow,
}

/// One random `append` of f32 rows into caches of `T`, fast and reference side by side from
/// the same caches; returns whether it was a valid call (checked for equal results).
fn append_case<T: Kv>(seed: u64) -> bool {
    let mut rng = SplitMix(seed);
    let (batch, seq, h_kv) = (1 + rng.below(2), rng.below(5), 1 + rng.below(3));
    let d_k = rng.pick(&[2, 6, 9, 16]);
    let d_v = rng.pick(&[1, 4, 8]);
    let tokens = batch * seq;
    let page = rng.pick(&[1, 3, 4]);
    let pages = tokens.div_ceil(page).max(1) + rng.below(2);
    let capacity = pages * page;
    let mut free: Vec<usize> = (0..capacity).collect();
    let mut slots = Vec::new();
    for _ in 0..tokens {
        slots.push(free.swap_remove(rng.below(free.len())));
    }
    let mag = rng.pick(&[1.0f32, 1e-3, 100.0]);
    let mut rows = |d: usize| -> Vec<f32> {
        let mut x: Vec<f32> = (0..tokens * h_kv * d)
            .map(|_| mag * rng.unit() as f32)
            .collect();
        // A row of zeros now and then (an i8 row of scale 0).
        if tokens > 0 && rng.chance(0.3) {
            x[rng.below(tokens * h_kv) * d..][..d].fill(0.0);
        }
        x
    };
    let (mut k, v) = (rows(d_k), rows(d_v));
    let rotary = 2 * (1 + rng.below(d_k / 2));
    let style = rng.pick(&[RopeStyle::Halves, RopeStyle::Interleaved]);
    let table_rows = 64;
    let cos: Vec<f32> = (0..table_rows * rotary / 2)
        .map(|_| rng.unit() as f32)
        .collect();
    let sin: Vec<f32> = (0..table_rows * rotary / 2)
        .map(|_| rng.unit() as f32)
        .collect();
    let rope = match rng.below(3) {
        0 => None,
        1 => Some(Rope::new(style, rotary, rng.pick(&[10_000.0, 500_000.0]))),
        _ => Some(Rope::with_tables(style, rotary, &cos, &sin)),
    };
    let mut positions: Vec<u32> = (0..tokens).map(|_| rng.below(table_rows) as u32).collect();
    let fault = match rng.below(10) {
        5 if tokens > 0 => AppendFault::SlotPastCache,
        6 if tokens > 1 => AppendFault::SlotTwice,
        7 if tokens > 0 && rope.is_some() => AppendFault::PositionsShort,
        8 if tokens > 0 && T::QUANTIZED => AppendFault::NanRow,
        _ => AppendFault::None,
    };
    match fault {
        AppendFault::SlotPastCache => slots[rng.below(tokens)] = capacity + rng.below(3),
        AppendFault::SlotTwice => slots[1 + rng.below(tokens - 1)] = slots[0],
        AppendFault::PositionsShort => {
            positions.pop();
        }
        AppendFault::NanRow => {
            let i = rng.below(k.len());
            k[i] = f32::NAN;
        }
        AppendFault::None => {}
    }
    let (kc0, vc0): (Vec<T>, Vec<T>) = (
        (0..capacity * h_kv * d_k)
            .map(|_| T::draw(&mut rng))
            .collect(),
        (0..capacity * h_kv * d_v)
            .map(|_| T::draw(&mut rng))
            .collect(),
    );
    let sc0: Vec<f32> = (0..capacity * h_kv).map(|_| rng.unit() as f32).collect();
    let label = format!(
        "append seed {seed} {} {fault:?} rope {rope:?} tokens {tokens} d {d_k}/{d_v}",
        T::NAME
    );
    let kt = Tensor::bshd(&k, [batch, seq, h_kv, d_k]).unwrap();
    let vt = Tensor::bshd(&v, [batch, seq, h_kv, d_v]).unwrap();
    let run = |reference: bool| {
        let (mut kc, mut vc, mut ks, mut vs) = (kc0.clone(), vc0.clone(), sc0.clone(), sc0.clone());
        let mut kcv = TensorMut::bshd(&mut kc, [pages, page, h_kv, d_k]).unwrap();
        let mut vcv = TensorMut::bshd(&mut vc, [pages, page, h_kv, d_v]).unwrap();
        let mut ksv = TensorMut::bshd(&mut ks, [pages, page, h_kv, 1]).unwrap();
        let mut vsv = TensorMut::bshd(&mut vs, [pages, page, h_kv, 1]).unwrap();
        let scales = T::QUANTIZED.then_some((&mut ksv, &mut vsv));
        let rope = rope.as_ref().map(|r| (r, &positions[..]));
        let r = match reference {
            true => reference::append(&kt, &vt, &mut kcv, &mut vcv, &slots, scales, rope),
            false => sdpa::append(&kt, &vt, &mut kcv, &mut vcv, &slots, scales, rope),
        };
        (r, kc, vc, ks, vs)
    };
    let (fast, refd) = (run(false), run(true));
    if fault != AppendFault::None {
        let err = fast.0.clone().expect_err(&label);
        assert_eq!(Err(err), refd.0, "{label}: the same error");
        for (name, r) in [("fast", &fast), ("reference", &refd)] {
            let same = same_bits(&r.1, &kc0) && same_bits(&r.2, &vc0);
            let same_scales = bits(&r.3) == bits(&sc0) && bits(&r.4) == bits(&sc0);
            assert!(same && same_scales, "{label}: {name} wrote on error");
        }
        return false;
    }
    fast.0.unwrap_or_else(|e| panic!("{label}: fast: {e}"));
    refd.0.unwrap_or_else(|e| panic!("{label}: reference: {e}"));
    if !T::QUANTIZED {
        assert!(same_bits(&fast.1, &refd.1), "{label}: K cache bits");
        assert!(same_bits(&fast.2, &refd.2), "{label}: V cache bits");
        return true;
    }
    // i8: the same scales; values equal but at near-ties of the quotient.
    assert_eq!(bits(&fast.3), bits(&refd.3), "{label}: K scales");
    assert_eq!(bits(&fast.4), bits(&refd.4), "{label}: V scales");
    let k_rot: Vec<f64> = match &rope {
        Some(r) => reference::rope(r, &kt, &positions).unwrap(),
        None => k.iter().map(|&x| f64::from(x)).collect(),
    };
    let v_rows: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    let token_of = |slot: usize| slots.iter().position(|&s| s == slot);
    for (name, d, rows, got, want, scales) in [
        ("K", d_k, &k_rot, &fast.1, &refd.1, &refd.3),
        ("V", d_v, &v_rows, &fast.2, &refd.2, &refd.4),
    ] {
        for (e, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
            let (slot, hk, c) = (e / (h_kv * d), e / d % h_kv, e % d);
            let Some(t) = token_of(slot) else {
                assert_eq!(
                    g.to_f64(),
                    w.to_f64(),
                    "{label}: {name} slot {slot} not appended"
                );
                continue;
            };
            let s = f64::from(scales[slot * h_kv + hk]);
            let y = f64::from(rows[(t * h_kv + hk) * d + c] as f32);
            let z = if s > 0.0 { y / s } else { 0.0 };
            let (g, w) = (g.to_f64(), w.to_f64());
            let at = format!("{label}: {name} slot {slot} head {hk} channel {c}");
            assert!((w - z).abs() <= 0.5, "{at}: oracle {w} vs quotient {z}");
            if g != w {
                let tie = (g + w) / 2.0;
                assert!(
                    (g - w).abs() == 1.0 && (z - tie).abs() <= 127.0 / (1u64 << 24) as f64,
                    "{at}: fast {g} vs oracle {w}, quotient {z}"
                );
            }
        }
    }
    true
}

#[test]
fn append_equals_its_reference_and_fails_the_same() {
    let n = if cfg!(debug_assertions) { 40 } else { 400 };
    let mut valid = 0;
    for seed in 0..n {
        valid += usize::from(append_case::<f32>(seed));
        valid += usize::from(append_case::<f16>(1 << 20 | seed));
        valid += usize::from(append_case::<bf16>(2 << 20 | seed));
        valid += usize::from(append_case::<i8>(3 << 20 | seed));
    }
    assert!(valid >= 2 * n as usize, "{valid} valid calls of {}", 4 * n);
}

/// Broken operands: the reference calls return the fast calls' errors and write nothing.
#[test]
fn layout_references_fail_as_the_calls() {
    let q = vec![0.5f32; 2 * 2 * 4];
    let pool = vec![0.25f32; 3 * 2 * 4];
    let qt = Tensor::bshd(&q, [2, 2, 1, 4]).unwrap();
    let pt = Tensor::bshd(&pool, [3, 2, 1, 4]).unwrap();
    let (lens, far) = ([3usize, 2], [3usize, 4]);
    let paged = |table: &'static [u32]| PagedKv::new(pt, pt, table, 2).unwrap();
    let cases: Vec<(PagedKv<'_, f32>, Options<'_>, usize)> = vec![
        (paged(&[0, 1, 2, 9]), Options::new().kv_lens(&far), 4), // entry 3 reached: page 9
        (paged(&[0, 1, 2, 0]), Options::new(), 4),               // no key lengths
        (paged(&[0, 1, 2, 0]), Options::new().kv_lens(&lens), 3), // LSE too short
        (paged(&[0, 1, 2, 0]), Options::new().kv_lens(&[5, 1]), 4), // past the capacity
    ];
    for (kv, opts, lse_len) in cases {
        let mut results = vec![];
        for reference in [false, true] {
            let mut out = vec![f32::NAN; 16];
            let mut lse = vec![f32::NAN; lse_len];
            let mut o = TensorMut::bshd(&mut out, [2, 2, 1, 4]).unwrap();
            let r = match reference {
                true => reference::attention_paged(&qt, &kv, &mut o, Some(&mut lse), &opts),
                false => sdpa::attention_paged(&qt, &kv, &mut o, Some(&mut lse), &opts),
            };
            assert!(
                out.iter().chain(&lse).all(|x| x.is_nan()),
                "written on error"
            );
            if reference {
                assert_eq!(reference::error_bounds_paged(&qt, &kv, &opts).err(), {
                    // (The bounds take no LSE.)
                    match lse_len {
                        4 => r.clone().err(),
                        _ => None,
                    }
                });
            }
            results.push(r.expect_err("a broken operand"));
        }
        assert_eq!(results[0], results[1]);
    }
    // Varlen: decreasing offsets, and K/V offsets of the wrong count.
    let qv = Tensor::bshd(&q, [1, 4, 1, 4]).unwrap();
    let kp = Tensor::bshd(&pool, [1, 6, 1, 4]).unwrap();
    for (cu_q, cu_k) in [
        (&[0usize, 3, 2][..], &[0usize, 2, 4][..]),
        (&[0, 2, 4], &[0, 6]),
    ] {
        let kv: VarlenKv<'_, f32> = PackedKv::new(kp, kp, cu_k).into();
        let mut errors = vec![];
        for reference in [false, true] {
            let mut out = vec![f32::NAN; 16];
            let mut o = TensorMut::bshd(&mut out, [1, 4, 1, 4]).unwrap();
            let opts = Options::new();
            let r = match reference {
                true => reference::attention_varlen(&qv, cu_q, &kv, &mut o, None, &opts),
                false => sdpa::attention_varlen(&qv, cu_q, &kv, &mut o, None, &opts),
            };
            assert!(out.iter().all(|x| x.is_nan()), "written on error");
            errors.push(r.expect_err("broken offsets"));
        }
        assert_eq!(errors[0], errors[1]);
        let bound_err = reference::error_bounds_varlen(&qv, cu_q, &kv, &Options::new());
        assert_eq!(bound_err.err(), Some(errors[0].clone()));
        assert!(matches!(
            errors[0],
            Error::InvalidValue { .. } | Error::LengthMismatch { .. }
        ));
    }
}
