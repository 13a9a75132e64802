//! Random serving loops: a step's rows appended with RoPE into paged caches of every K/V type,
//! one `Plan` per step (in one workspace), one `run` per layer, for random GQA shapes, head
//! sizes, page sizes, RoPE styles and rotary dims, options (causal, a window, softcap,
//! per-layer sinks) and sequences that arrive, prefill in chunks, decode and sit steps out.
//! Every step checks:
//! * the plan: `Plan::new_rows` gives the loop's own slots and positions, whether the step's
//!   lengths are given before (`cache_seqlens`) or after (`kv_lens`) its rows;
//! * the cache: each appended K element is `reference::rope` of the drawn row rounded to the
//!   cache's type (`i8`: within half its scale, which is `max|x| / 127` of the row), each V
//!   element the drawn value alike;
//! * the attention: every sequence's rows (out and LSE) against `reference::attention_lse` on
//!   that sequence alone, its keys (and scales) gathered from its pages, within
//!   `reference::error_bounds`.

use sdpa::half::{bf16, f16};
use sdpa::reference;
use sdpa::{
    append, Alignment, Element, Heads, KvElement, Layer, Options, Plan, Rope, RopeStyle, StepKv,
    Tensor, TensorMut, Workspace,
};

use crate::support::values::SplitMix;

/// One drawn loop's shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    h_kv: usize,
    group: usize,
    rotary: usize,
    page: usize,
    interleaved: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    sinks: bool,
}

struct Rng(SplitMix);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn unit(&mut self) -> f32 {
        (self.0.unit() * 2.0 - 1.0) as f32
    }
}

/// A layer's caches of `T` (and `i8`'s scale pools), `[pages, page, H_kv, d]`.
struct Caches<T> {
    k: Vec<T>,
    v: Vec<T>,
    scales: Option<(Vec<f32>, Vec<f32>)>,
}

const PAGES: usize = 24;

/// Runs one random loop with K/V type `T` (`to_f32`: a stored value before its scale).
fn run_loop<T: KvElement + Default>(seed: u64, to_f32: fn(T) -> f32, unit: f64) {
    let mut rng = Rng(SplitMix(seed));
    let d = rng.pick(&[4usize, 8, 16, 20]);
    let shape = Shape {
        h_kv: rng.pick(&[1usize, 2, 3]),
        group: rng.pick(&[1usize, 2, 4]),
        rotary: rng.pick(&[d, d / 2 / 2 * 2]).max(2),
        page: rng.pick(&[1usize, 3, 4, 16]),
        interleaved: rng.below(2) == 1,
        window: [None, Some(5)][rng.below(2)],
        softcap: [None, Some(4.0)][rng.below(2)],
        sinks: rng.below(2) == 1,
    };
    let Shape {
        h_kv, group, page, ..
    } = shape;
    let h = h_kv * group;
    let row = h_kv * d;
    let style = match shape.interleaved {
        true => RopeStyle::Interleaved,
        false => RopeStyle::Halves,
    };
    let rope = Rope::new(style, shape.rotary, 10_000.0);
    let quantized = T::QUANTIZED;
    let pool_dims = [PAGES, page, h_kv, d];
    let scale_dims = [PAGES, page, h_kv, 1];
    let mut layers: Vec<Caches<T>> = (0..2)
        .map(|_| Caches {
            k: vec![T::default(); PAGES * page * row],
            v: vec![T::default(); PAGES * page * row],
            scales: quantized.then(|| {
                let s = vec![0.0f32; PAGES * page * h_kv];
                (s.clone(), s)
            }),
        })
        .collect();
    // Sequences: (pages, cached tokens, prompt tokens); a shuffled free list.
    let mut free: Vec<u32> = (0..PAGES as u32).collect();
    for i in (1..free.len()).rev() {
        let j = rng.below(i + 1);
        free.swap(i, j);
    }
    let n_seqs = 1 + rng.below(4);
    let mut seqs: Vec<(Vec<u32>, usize, usize)> = (0..n_seqs)
        .map(|_| (vec![], 0, 1 + rng.below(20)))
        .collect();
    let capacity = PAGES / n_seqs * page; // tokens one sequence may hold
    let mut ws = Workspace::new();
    let heads = Heads {
        heads: h,
        kv_heads: h_kv,
        d_k: d,
        d_v: d,
    };
    for step in 0..5 {
        // Rows this step: a chunk of the prompt, a decode row, or none (the sequence waits).
        let (mut cu_q, mut cached, mut slots, mut positions) = (vec![0], vec![], vec![], vec![]);
        for (pages, len, prompt) in seqs.iter_mut() {
            let want = match rng.below(4) {
                0 => 0,
                _ if *len < *prompt => (*prompt - *len).min(1 + rng.below(9)),
                _ => 1,
            };
            let n = want.min(capacity - *len);
            while pages.len() * page < *len + n {
                pages.push(
                    free.pop()
                        .expect("the pool holds every sequence's capacity"),
                );
            }
            for t in *len..*len + n {
                slots.push(pages[t / page] as usize * page + t % page);
                positions.push(t as u32);
            }
            cached.push(*len);
            *len += n;
            cu_q.push(slots.len());
        }
        let n = slots.len();
        let pps = seqs.iter().map(|s| s.0.len()).max().unwrap_or(0);
        let mut table = vec![0u32; seqs.len() * pps];
        for (r, s) in table.chunks_mut(pps.max(1)).zip(&seqs) {
            r[..s.0.len()].copy_from_slice(&s.0);
        }
        let kv = StepKv::Paged {
            block_table: &table,
            pages_per_seq: pps,
            page_size: page,
        };
        let mut opts = Options::new().causal(Alignment::BottomRight);
        if let Some(w) = shape.window {
            opts = opts.sliding_window(w, 0, Alignment::BottomRight);
        }
        if let Some(cap) = shape.softcap {
            opts = opts.softcap(cap);
        }
        // Lengths before the step's rows, or after them (the same step).
        let after: Vec<usize> = seqs.iter().map(|s| s.1).collect();
        let opts = match rng.below(2) {
            0 => opts.cache_seqlens(&cached),
            _ => opts.kv_lens(&after),
        };
        let what = format!("seed {seed} {} d {d} {shape:?} step {step}", T::NAME);
        let mut plan = Plan::in_workspace(&mut ws, &cu_q, kv, heads, &opts)
            .unwrap_or_else(|e| panic!("{what}: plan: {e}"));
        // The plan places the new rows where the loop does.
        let (mut plan_slots, mut plan_positions) = (vec![0; n], vec![0; n]);
        plan.new_rows(&mut plan_slots, &mut plan_positions)
            .unwrap_or_else(|e| panic!("{what}: new_rows: {e}"));
        assert_eq!(
            (plan_slots, plan_positions),
            (slots.clone(), positions.clone()),
            "{what}"
        );
        for (l, caches) in layers.iter_mut().enumerate() {
            let what = format!("{what} layer {l}");
            let k_new: Vec<f32> = (0..n * row).map(|_| 2.0 * rng.unit()).collect();
            let v_new: Vec<f32> = (0..n * row).map(|_| 2.0 * rng.unit()).collect();
            let mut q: Vec<f32> = (0..n * h * d).map(|_| rng.unit()).collect();
            let sinks: Vec<f32> = (0..h).map(|_| rng.unit()).collect();
            let (kn, vn) = (
                Tensor::bshd(&k_new, [1, n, h_kv, d]).unwrap(),
                Tensor::bshd(&v_new, [1, n, h_kv, d]).unwrap(),
            );
            {
                let mut kc = TensorMut::bshd(&mut caches.k, pool_dims).unwrap();
                let mut vc = TensorMut::bshd(&mut caches.v, pool_dims).unwrap();
                let mut sc = caches.scales.as_mut().map(|(ks, vs)| {
                    (
                        TensorMut::bshd(ks, scale_dims).unwrap(),
                        TensorMut::bshd(vs, scale_dims).unwrap(),
                    )
                });
                let scales = sc.as_mut().map(|(k, v)| (k, v));
                append(
                    &kn,
                    &vn,
                    &mut kc,
                    &mut vc,
                    &slots,
                    scales,
                    Some((&rope, &positions)),
                )
                .unwrap_or_else(|e| panic!("{what}: append: {e}"));
            }
            // The cache holds the rotated K and V, rounded to T (i8: within half a scale).
            let k_rot = reference::rope(&rope, &kn, &positions).unwrap();
            for (t, &slot) in slots.iter().enumerate() {
                for hk in 0..h_kv {
                    let scale = |s: &Option<(Vec<f32>, Vec<f32>)>, v: bool| match s {
                        Some((ks, vs)) => f64::from([ks, vs][usize::from(v)][slot * h_kv + hk]),
                        None => 1.0,
                    };
                    let (sk, sv) = (scale(&caches.scales, false), scale(&caches.scales, true));
                    for c in 0..d {
                        let at = (slot * h_kv + hk) * d + c;
                        let want_k = k_rot[(t * h_kv + hk) * d + c];
                        let want_v = f64::from(v_new[(t * h_kv + hk) * d + c]);
                        let got_k = f64::from(to_f32(caches.k[at])) * sk;
                        let got_v = f64::from(to_f32(caches.v[at])) * sv;
                        // Rounded to T: half an ulp, relative, or half of f16's subnormal
                        // step (2⁻²⁵) near 0; `i8`: half a scale.
                        let tol = |x: f64, s: f64| match quantized {
                            true => s * (0.5 + 1e-6) + 1e-12,
                            false => x.abs() * (unit + 1e-6) + 2f64.powi(-25),
                        };
                        assert!(
                            (got_k - want_k).abs() <= tol(want_k, sk),
                            "{what}: K slot {slot} head {hk} channel {c}: {got_k} vs {want_k}"
                        );
                        assert!(
                            (got_v - want_v).abs() <= tol(want_v, sv),
                            "{what}: V slot {slot} head {hk} channel {c}: {got_v} vs {want_v}"
                        );
                    }
                }
            }
            rope.apply(
                &mut TensorMut::bshd(&mut q, [1, n, h, d]).unwrap(),
                &positions,
            )
            .unwrap();
            let (mut out, mut lse) = (vec![f32::NAN; n * h * d], vec![f32::NAN; h * n]);
            {
                let qv = Tensor::bshd(&q, [1, n, h, d]).unwrap();
                let kp = Tensor::bshd(&caches.k, pool_dims).unwrap();
                let vp = Tensor::bshd(&caches.v, pool_dims).unwrap();
                let mut layer = Layer::new();
                if let Some((ks, vs)) = &caches.scales {
                    layer = layer.kv_scales(
                        Tensor::bshd(ks, scale_dims).unwrap(),
                        Tensor::bshd(vs, scale_dims).unwrap(),
                    );
                }
                if shape.sinks {
                    layer = layer.sinks(&sinks);
                }
                let mut o = TensorMut::bshd(&mut out, [1, n, h, d]).unwrap();
                plan.run(&qv, &kp, &vp, &mut o, Some(&mut lse), &layer)
                    .unwrap_or_else(|e| panic!("{what}: run: {e}"));
            }
            // Each sequence against the reference on it alone.
            for (b, (pages, len, _)) in seqs.iter().enumerate() {
                let (r0, rows) = (cu_q[b], cu_q[b + 1] - cu_q[b]);
                if rows == 0 {
                    continue;
                }
                let slot_of = |t: usize| pages[t / page] as usize * page + t % page;
                let (mut k, mut v, mut ks, mut vs) = (vec![], vec![], vec![], vec![]);
                for t in 0..*len {
                    let s = slot_of(t);
                    k.extend_from_slice(&caches.k[s * row..][..row]);
                    v.extend_from_slice(&caches.v[s * row..][..row]);
                    if let Some((kp, vp)) = &caches.scales {
                        ks.extend_from_slice(&kp[s * h_kv..][..h_kv]);
                        vs.extend_from_slice(&vp[s * h_kv..][..h_kv]);
                    }
                }
                let qs =
                    Tensor::bshd(&q[r0 * h * d..(r0 + rows) * h * d], [1, rows, h, d]).unwrap();
                let kd = Tensor::bshd(&k, [1, *len, h_kv, d]).unwrap();
                let vd = Tensor::bshd(&v, [1, *len, h_kv, d]).unwrap();
                let mut o = Options::new().causal(Alignment::BottomRight);
                if let Some(w) = shape.window {
                    o = o.sliding_window(w, 0, Alignment::BottomRight);
                }
                if let Some(cap) = shape.softcap {
                    o = o.softcap(cap);
                }
                if shape.sinks {
                    o = o.sinks(&sinks);
                }
                if quantized {
                    o = o.kv_scales(
                        Tensor::bshd(&ks, [1, *len, h_kv, 1]).unwrap(),
                        Tensor::bshd(&vs, [1, *len, h_kv, 1]).unwrap(),
                    );
                }
                let (mut want, mut w_lse) = (vec![0.0f32; rows * h * d], vec![0.0f32; h * rows]);
                let mut wv = TensorMut::bshd(&mut want, [1, rows, h, d]).unwrap();
                reference::attention_lse(&qs, &kd, &vd, &mut wv, &mut w_lse, &o).unwrap();
                let bounds = reference::error_bounds(&qs, &kd, &vd, &o).unwrap();
                for hh in 0..h {
                    for i in 0..rows {
                        let bd = bounds[hh * rows + i];
                        let (got, exp) = (lse[hh * n + r0 + i], w_lse[hh * rows + i]);
                        let ok = got == exp || (f64::from(got) - f64::from(exp)).abs() <= bd.lse;
                        assert!(ok, "{what}: seq {b} row {i} head {hh}: LSE {got} vs {exp}");
                        for c in 0..d {
                            let at = (i * h + hh) * d + c;
                            let (got, exp) = (out[(r0 * h) * d + at], want[at]);
                            let err = (f64::from(got) - f64::from(exp)).abs();
                            assert!(
                                err <= bd.out,
                                "{what}: seq {b} row {i} head {hh} channel {c}: {got} vs {exp} (bound {:e})",
                                bd.out
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Loops per K/V type: fewer in debug builds, where the f64 reference is ~20× slower.
fn loops() -> u64 {
    if cfg!(debug_assertions) {
        4
    } else {
        60
    }
}

#[test]
fn random_serving_loops_match_the_reference_for_every_cache_type() {
    for seed in 0..loops() {
        run_loop::<f32>(seed, |x| x, f32::UNIT_ROUNDOFF);
        run_loop::<f16>(1000 + seed, f16::to_f32, f16::UNIT_ROUNDOFF);
        run_loop::<bf16>(2000 + seed, bf16::to_f32, bf16::UNIT_ROUNDOFF);
        run_loop::<i8>(3000 + seed, f32::from, 0.0);
    }
}
