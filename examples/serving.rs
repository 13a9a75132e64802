//! A continuous-batching toy over paged K/V caches: `cargo run --release --example serving`.
//!
//! * Two layers, each with its own caches: page pools `[NUM_PAGES, PAGE, H_KV, D]` of f16
//!   (layer 0) and of int8 with a scale per (token, kv head) (layer 1), sharing one block
//!   table and free list. A sequence takes pages as it grows and gives them back when it
//!   finishes, so later sequences reuse them in scrambled order.
//! * Sequences arrive at different steps with random prompt lengths and are admitted when the
//!   free list can hold them; prompts run in chunks of at most `CHUNK` tokens (chunked
//!   prefill), then each sequence decodes one token per step and finishes after a few.
//! * Each step: one [`Plan`] for the step's packed rows (prefill chunks and decode rows mixed,
//!   offsets `cu_q`), its block table and its lengths (`cache_seqlens`: the keys before this
//!   step's rows, FlashAttention-2's convention), which also gives the new rows' slots and
//!   positions ([`Plan::new_rows`]); then per layer, [`append`] writes the new
//!   tokens' K (rotated by the model's [`Rope`]) and V into their slots, converted to the
//!   cache's type (int8 rows with their scales), Q is rotated alike, and [`Plan::run`] does
//!   the layer's attention: causal, bottom-right, every sequence in one call.
//! * Every layer's rows (out and LSE) are checked against the f64 reference over the same
//!   pages (`reference::attention_varlen`), within its bound per row
//!   (`reference::error_bounds_varlen`); a miss panics. One line per step: the worst error /
//!   bound.
//!
//! GQA: 8 query heads over 2 K/V heads, head size 64, pages of 16 tokens.

use sdpa::half::f16;
use sdpa::reference;
use sdpa::{append, Alignment, Error, Heads, KvElement, Layer, Options, Plan, Rope, RopeStyle};
use sdpa::{PagedKv, StepKv, Tensor, TensorMut, VarlenKv, Workspace};

const H: usize = 8; // query heads
const H_KV: usize = 2; // K/V heads (GQA: 4 query heads per K/V head)
const D: usize = 64; // head size
const PAGE: usize = 16; // tokens per page
const NUM_PAGES: usize = 40; // the pool: fewer than all sequences need at once
const CHUNK: usize = 64; // most prompt tokens per sequence per step

/// splitmix64: deterministic values without dependencies.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo) as u64) as usize
    }
    /// Uniform in [−1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

struct Seq {
    id: usize,
    prompt: usize,
    total: usize, // prompt + generated tokens: finished when the cache holds this many
    len: usize,   // tokens whose K/V are in the cache
    pages: Vec<u32>, // block table row: key t is slot t % PAGE of page pages[t / PAGE]
}

/// One layer's caches: K/V pools of `T` and, for int8, their scale pools.
struct Caches<T> {
    k: Vec<T>,
    v: Vec<T>,
    scales: Option<(Vec<f32>, Vec<f32>)>,
}

impl<T: KvElement + Default> Caches<T> {
    fn new(quantized: bool) -> Self {
        let scales = vec![0.0f32; NUM_PAGES * PAGE * H_KV];
        Caches {
            k: vec![T::default(); NUM_PAGES * PAGE * H_KV * D],
            v: vec![T::default(); NUM_PAGES * PAGE * H_KV * D],
            scales: quantized.then(|| (scales.clone(), scales)),
        }
    }
}

/// The dims of a pool and of a scale pool.
const POOL: [usize; 4] = [NUM_PAGES, PAGE, H_KV, D];
const SCALES: [usize; 4] = [NUM_PAGES, PAGE, H_KV, 1];

/// What every layer of a step shares: the packed rows' offsets, the block table (and its row
/// length), the options, and the new rows' slots and positions.
type StepRows<'s> = (
    &'s [usize],
    &'s [u32],
    usize,
    &'s Options<'s>,
    &'s [usize],
    &'s [u32],
);

/// One layer of a step: the new tokens' K/V appended (K rotated), Q rotated, the plan run, and
/// the rows checked against the f64 reference over the same pages. Returns the worst error /
/// bound.
fn layer<T: KvElement + Default>(
    caches: &mut Caches<T>,
    plan: &mut Plan<'_>,
    (cu_q, table, pps, opts, slots, positions): StepRows<'_>,
    rope: &Rope<'_>,
    rng: &mut Rng,
) -> Result<f64, Error> {
    let n = slots.len();
    let (k_new, v_new): (Vec<f32>, Vec<f32>) =
        (0..n * H_KV * D).map(|_| (rng.unit(), rng.unit())).unzip();
    let mut q: Vec<f32> = (0..n * H * D).map(|_| rng.unit()).collect();
    let (kn, vn) = (
        Tensor::bshd(&k_new, [1, n, H_KV, D])?,
        Tensor::bshd(&v_new, [1, n, H_KV, D])?,
    );
    let (mut kc, mut vc) = (
        TensorMut::bshd(&mut caches.k, POOL)?,
        TensorMut::bshd(&mut caches.v, POOL)?,
    );
    let mut scales = match &mut caches.scales {
        Some((ks, vs)) => Some((TensorMut::bshd(ks, SCALES)?, TensorMut::bshd(vs, SCALES)?)),
        None => None,
    };
    let scale_views = scales.as_mut().map(|(k, v)| (k, v));
    append(
        &kn,
        &vn,
        &mut kc,
        &mut vc,
        slots,
        scale_views,
        Some((rope, positions)),
    )?;
    rope.apply(&mut TensorMut::bshd(&mut q, [1, n, H, D])?, positions)?;

    let (qv, kp, vp) = (
        Tensor::bshd(&q, [1, n, H, D])?,
        Tensor::bshd(&caches.k, POOL)?,
        Tensor::bshd(&caches.v, POOL)?,
    );
    let (mut this_layer, mut ref_opts) = (Layer::new(), opts.clone());
    if let Some((ks, vs)) = &caches.scales {
        let (ks, vs) = (Tensor::bshd(ks, SCALES)?, Tensor::bshd(vs, SCALES)?);
        (this_layer, ref_opts) = (this_layer.kv_scales(ks, vs), ref_opts.kv_scales(ks, vs));
    }
    let (mut out, mut lse) = (vec![0.0f32; n * H * D], vec![0.0f32; H * n]);
    let mut ov = TensorMut::bshd(&mut out, [1, n, H, D])?;
    plan.run(&qv, &kp, &vp, &mut ov, Some(&mut lse), &this_layer)?;

    // The f64 reference over the same pages, and its error bound per row.
    let kv = VarlenKv::Paged(PagedKv::new(kp, vp, table, pps)?);
    let (mut want, mut want_lse) = (vec![0.0f32; n * H * D], vec![0.0f32; H * n]);
    let mut wv = TensorMut::bshd(&mut want, [1, n, H, D])?;
    reference::attention_varlen(&qv, cu_q, &kv, &mut wv, Some(&mut want_lse), &ref_opts)?;
    let bounds = reference::error_bounds_varlen(&qv, cu_q, &kv, &ref_opts)?;
    let mut worst = 0.0f64;
    for (h, t) in (0..H).flat_map(|h| (0..n).map(move |t| (h, t))) {
        let bound = bounds[h * n + t];
        let row = (t * H + h) * D..(t * H + h + 1) * D;
        let lse_err = (f64::from(lse[h * n + t]) - f64::from(want_lse[h * n + t])).abs();
        let out_err = (out[row.clone()].iter().zip(&want[row]))
            .map(|(a, b)| (f64::from(*a) - f64::from(*b)).abs())
            .fold(0.0, f64::max);
        let what = format!("{} cache, row {t} head {h}", T::NAME);
        assert!(lse_err <= bound.lse, "{what}: LSE off by {lse_err:e}");
        assert!(out_err <= bound.out, "{what}: out off by {out_err:e}");
        worst = worst.max(lse_err / bound.lse).max(out_err / bound.out);
    }
    Ok(worst)
}

fn main() -> Result<(), Error> {
    let mut rng = Rng(2024);
    // (arrival step, prompt length, tokens to generate), in arrival order.
    let mut waiting: Vec<(usize, usize, usize)> = (0..5)
        .map(|i| (3 * i + rng.range(0, 3), rng.range(5, 300), rng.range(2, 8)))
        .collect();
    let mut f16_layer = Caches::<f16>::new(false);
    let mut i8_layer = Caches::<i8>::new(true);
    let mut free: Vec<u32> = (0..NUM_PAGES as u32).rev().collect(); // pop() hands out page 0 first
    let mut running: Vec<Seq> = Vec::new();
    let mut ws = Workspace::new(); // kernel memory, kept across steps
    let rope = Rope::new(RopeStyle::Halves, D, 10_000.0); // Llama's rotary embedding
    let heads = Heads {
        heads: H,
        kv_heads: H_KV,
        d_k: D,
        d_v: D,
    };
    let (mut step, mut next_id) = (0, 0);
    while !waiting.is_empty() || !running.is_empty() {
        // Admit arrived sequences while the free list covers every running sequence's growth.
        let growth = |s: &Seq| s.total.div_ceil(PAGE) - s.pages.len();
        while let Some(&(arrival, prompt, gen)) = waiting.first() {
            let reserved: usize = running.iter().map(growth).sum();
            if arrival > step || free.len() < reserved + (prompt + gen).div_ceil(PAGE) {
                break;
            }
            waiting.remove(0);
            running.push(Seq {
                id: next_id,
                prompt,
                total: prompt + gen,
                len: 0,
                pages: vec![],
            });
            println!("step {step:2}: seq {next_id} admitted (prompt {prompt}, generates {gen})");
            next_id += 1;
        }
        if running.is_empty() {
            println!("step {step:2}: idle");
            step += 1;
            continue;
        }
        // Schedule: a prefill chunk or one decode row per sequence, and its pages.
        let (mut cu_q, mut cached) = (vec![0], Vec::new());
        for s in &mut running {
            let n_new = s.prompt.saturating_sub(s.len).clamp(1, CHUNK); // chunk or decode row
            while s.pages.len() * PAGE < s.len + n_new {
                s.pages.push(free.pop().expect("reserved at admission"));
            }
            cached.push(s.len);
            s.len += n_new;
            cu_q.push(cu_q.last().unwrap() + n_new);
        }
        let total_q = *cu_q.last().unwrap();
        // Block table `[B][pages_per_seq]`, rows padded with 0 (never read past a length).
        let pps = running.iter().map(|s| s.pages.len()).max().unwrap_or(0);
        let mut table = vec![0u32; running.len() * pps];
        for (row, s) in table.chunks_mut(pps).zip(&running) {
            row[..s.pages.len()].copy_from_slice(&s.pages);
        }
        // One plan for the step, one run per layer.
        let kv = StepKv::Paged {
            block_table: &table,
            pages_per_seq: pps,
            page_size: PAGE,
        };
        let opts = Options::new()
            .causal(Alignment::BottomRight)
            .cache_seqlens(&cached);
        let mut plan = Plan::in_workspace(&mut ws, &cu_q, kv, heads, &opts)?;
        // The new rows' slots (for `append`) and positions (for RoPE), after the cached keys.
        let (mut slots, mut positions) = (vec![0; total_q], vec![0; total_q]);
        plan.new_rows(&mut slots, &mut positions)?;
        let step_rows = (
            &cu_q[..],
            &table[..],
            pps,
            &opts,
            &slots[..],
            &positions[..],
        );
        let worst = layer(&mut f16_layer, &mut plan, step_rows, &rope, &mut rng)?.max(layer(
            &mut i8_layer,
            &mut plan,
            step_rows,
            &rope,
            &mut rng,
        )?);
        drop(plan);
        let prefill = running.iter().filter(|s| s.len <= s.prompt).count();
        println!(
            "step {step:2}: {} running ({prefill} prefill, {} decode), {total_q:3} rows, max err/bound {worst:.3}",
            running.len(),
            running.len() - prefill
        );
        // Finished sequences give their pages back.
        running.retain_mut(|s| {
            if s.len < s.total {
                return true;
            }
            println!("         seq {} done, pages {:?} freed", s.id, s.pages);
            free.append(&mut s.pages);
            false
        });
        step += 1;
    }
    assert_eq!(free.len(), NUM_PAGES, "every page back on the free list");
    let kib = ws.bytes() / 1024;
    println!("done: {step} steps, f16 and int8 caches, workspace {kib} KiB");
    Ok(())
}
