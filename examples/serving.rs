//! A continuous-batching toy over paged K/V caches: `cargo run --release --example serving`.
//!
//! Two layers, one block table and free list: a [`KvPool`] of f16 (layer 0) and one of int8
//! with a scale per (token, kv head) (layer 1). Sequences arrive at different steps, are
//! admitted when the free list can hold them, prefill in chunks of at most `CHUNK` tokens,
//! decode a few tokens and give their pages back. Each step: one [`Plan`] for its packed rows
//! (prefill chunks and decode rows; lengths before this step's rows, FlashAttention-2's
//! `cache_seqlens`), which places the new rows; then per layer the new K (rotated by the
//! [`Rope`]) and V are appended, Q is rotated alike, [`Plan::run_pool`] runs the layer's causal
//! attention, and its rows are held against the f64 reference within their bounds.
//!
//! GQA: 8 query heads over 2 K/V heads, head size 64, pages of 16 tokens.

use sdpa::half::f16;
use sdpa::{reference, Alignment, Error, Heads, KvElement, KvPool, Layer, Options, Plan, Rope};
use sdpa::{RopeStyle, StepKv, Tensor, TensorMut, VarlenKv, Workspace};

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
    /// `n` values uniform in [−1, 1).
    fn values(&mut self, n: usize) -> Vec<f32> {
        let mut unit = || (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        (0..n).map(|_| unit()).collect()
    }
}

struct Seq {
    id: usize,
    prompt: usize,
    total: usize, // prompt + generated tokens: finished when the cache holds this many
    len: usize,   // tokens whose K/V are in the cache
    pages: Vec<u32>, // block table row: key t is slot t % PAGE of page pages[t / PAGE]
}

/// What every layer of a step shares: the packed rows' offsets, the block table and its row
/// length, the options (with the lengths), and the new rows' slots and positions.
struct Step<'s> {
    cu_q: &'s [usize],
    table: &'s [u32],
    pps: usize,
    opts: &'s Options<'s>,
    new_rows: (&'s [usize], &'s [u32]),
}

/// One layer of a step: the new tokens' K/V appended to its pool (K rotated), Q rotated, the
/// plan run, and the rows held against the f64 reference. Returns the worst error / bound.
fn layer<T: KvElement>(
    pool: &mut KvPool<T>,
    plan: &mut Plan,
    s: &Step,
    rng: &mut Rng,
) -> Result<f64, Error> {
    let ((slots, positions), n) = (s.new_rows, s.new_rows.0.len());
    let rope = Rope::new(RopeStyle::Halves, D, 10_000.0); // Llama's rotary embedding
    let (k_new, v_new) = (rng.values(n * H_KV * D), rng.values(n * H_KV * D));
    let rows = |x| Tensor::bshd(x, [1, n, H_KV, D]);
    pool.append(
        &rows(&k_new)?,
        &rows(&v_new)?,
        slots,
        Some((&rope, positions)),
    )?;
    let mut q = rng.values(n * H * D);
    rope.apply(&mut TensorMut::bshd(&mut q, [1, n, H, D])?, positions)?;

    let q = Tensor::bshd(&q, [1, n, H, D])?;
    let (mut out, mut lse) = (vec![0.0f32; n * H * D], vec![0.0f32; H * n]);
    let mut out_view = TensorMut::bshd(&mut out, [1, n, H, D])?;
    plan.run_pool(&q, pool, &mut out_view, Some(&mut lse), &Layer::new())?;

    let kv = VarlenKv::Paged(pool.paged(s.table, s.pps)?);
    let opts = pool.options(s.opts.clone()); // the int8 pool's scales
    let out = Tensor::bshd(&out, [1, n, H, D])?;
    let off = reference::compare_varlen(&q, s.cu_q, &kv, &out, Some(&lse), &opts)?;
    assert!(off.within_bound(), "{}: {off:?}", T::NAME);
    Ok(off.ratio)
}

fn main() -> Result<(), Error> {
    let mut rng = Rng(2024);
    // (arrival step, prompt length, tokens to generate), in arrival order.
    let mut waiting: Vec<(usize, usize, usize)> = (0..5)
        .map(|i| (3 * i + rng.range(0, 3), rng.range(5, 300), rng.range(2, 8)))
        .collect();
    let mut f16_pool = KvPool::<f16>::new(NUM_PAGES, PAGE, H_KV, D, D)?; // layer 0
    let mut i8_pool = KvPool::<i8>::new(NUM_PAGES, PAGE, H_KV, D, D)?; // layer 1
    let mut free: Vec<u32> = (0..NUM_PAGES as u32).rev().collect(); // pop() hands out page 0 first
    let (mut running, mut ws) = (Vec::<Seq>::new(), Workspace::new()); // kernel memory, kept
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
        // Block table `[B][pages_per_seq]`, rows padded with 0 (never read past a length).
        let pps = running.iter().map(|s| s.pages.len()).max().unwrap_or(0);
        let mut table = vec![0u32; running.len() * pps];
        for (row, s) in table.chunks_mut(pps).zip(&running) {
            row[..s.pages.len()].copy_from_slice(&s.pages);
        }
        // One plan for the step (it places the new rows), one run per layer.
        let causal = Options::new().causal(Alignment::BottomRight);
        let opts = causal.cache_seqlens(&cached);
        let kv = StepKv::Paged {
            block_table: &table,
            pages_per_seq: pps,
            page_size: PAGE,
        };
        let mut plan = Plan::in_workspace(&mut ws, &cu_q, kv, heads, &opts)?;
        let total_q = *cu_q.last().unwrap();
        let (mut slots, mut positions) = (vec![0; total_q], vec![0; total_q]);
        plan.new_rows(&mut slots, &mut positions)?;
        let s = Step {
            cu_q: &cu_q,
            table: &table,
            pps,
            opts: &opts,
            new_rows: (&slots, &positions),
        };
        let worst = layer(&mut f16_pool, &mut plan, &s, &mut rng)?;
        let worst = worst.max(layer(&mut i8_pool, &mut plan, &s, &mut rng)?);
        let prefill = running.iter().filter(|s| s.len <= s.prompt).count();
        let decode = running.len() - prefill;
        println!("step {step:2}: {prefill} prefill, {decode} decode, {total_q:3} rows, {worst:.3}");
        // Finished sequences give their pages back.
        for s in running.iter_mut().filter(|s| s.len == s.total) {
            println!("         seq {} done, pages {:?} freed", s.id, s.pages);
            free.append(&mut s.pages);
        }
        running.retain(|s| s.len < s.total);
        step += 1;
    }
    assert_eq!(free.len(), NUM_PAGES, "every page back on the free list");
    println!("done: {step} steps, workspace {} KiB", ws.bytes() / 1024);
    Ok(())
}
