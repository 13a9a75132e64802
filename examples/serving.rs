//! A continuous-batching toy over a paged K/V cache: `cargo run --release --example serving`.
//!
//! * The cache: two page pools `[NUM_PAGES, PAGE, H_KV, D]` of f16 (`Cache` below; make it
//!   `f32` and nothing else changes) and a free list. A sequence takes pages as it grows and
//!   gives them back when it finishes, so later sequences reuse them in scrambled order.
//! * Sequences arrive at different steps with random prompt lengths and are admitted when the
//!   free list can hold them; prompts run in chunks of at most `CHUNK` tokens (chunked
//!   prefill), then each sequence decodes one token per step and finishes after a few.
//! * Each step writes the new tokens' K/V into their pages first with [`append`] (one call for
//!   every sequence's new rows, K rotated by the model's RoPE on the way; Q is rotated by the
//!   same [`Rope`]), packs every
//!   running sequence's new rows (prefill chunks and decode rows mixed) into one
//!   `[1, total_q, H, D]` query with offsets `cu_q`, and makes ONE
//!   [`Workspace::attention_varlen`] call: K/V paged (a block-table row per sequence), causal
//!   bottom-right with `kv_lens` (each sequence's rows are the last of its keys).
//! * Every sequence's rows (out and LSE) are checked against the f64 reference on that
//!   sequence alone, its keys gathered densely from its pages, within
//!   `reference::error_bounds`; a miss panics. One line per step: the worst error / bound.
//!
//! GQA: 8 query heads over 2 K/V heads, head size 64, pages of 16 tokens.

use sdpa::half::f16;
use sdpa::reference;
use sdpa::{append, Alignment, Error, KvElement, Options, PagedKv, Rope, RopeStyle};
use sdpa::{Tensor, TensorMut, VarlenKv, Workspace};

type Cache = f16;
const H: usize = 8; // query heads
const H_KV: usize = 2; // K/V heads (GQA: 4 query heads per K/V head)
const D: usize = 64; // head size
const PAGE: usize = 16; // tokens per page
const NUM_PAGES: usize = 40; // the pool: fewer than all sequences need at once
const CHUNK: usize = 64; // most prompt tokens per sequence per step
const ROW: usize = H_KV * D; // one token's K (or V) in the pool

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

/// Where token `t` of `s` lives in a pool (pool layout `[page, slot, H_KV, D]`).
fn slot(s: &Seq, t: usize) -> usize {
    (s.pages[t / PAGE] as usize * PAGE + t % PAGE) * ROW
}

fn main() -> Result<(), Error> {
    let mut rng = Rng(2024);
    // (arrival step, prompt length, tokens to generate), in arrival order.
    let mut waiting: Vec<(usize, usize, usize)> = (0..5)
        .map(|i| (3 * i + rng.range(0, 3), rng.range(5, 300), rng.range(2, 8)))
        .collect();
    let mut k_pool = vec![Cache::from_f32(0.0); NUM_PAGES * PAGE * ROW];
    let mut v_pool = k_pool.clone();
    let mut free: Vec<u32> = (0..NUM_PAGES as u32).rev().collect(); // pop() hands out page 0 first
    let mut running: Vec<Seq> = Vec::new();
    let mut ws = Workspace::new(); // kernel scratch, kept across steps
    let rope = Rope::new(RopeStyle::Halves, D, 10_000.0); // Llama's rotary embedding
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
        // Schedule: a prefill chunk or one decode row per sequence; pages, K/V, then Q.
        let (mut q, mut cu_q, mut lens) = (Vec::new(), vec![0], Vec::new());
        let (mut k_new, mut v_new, mut slots, mut positions) = (vec![], vec![], vec![], vec![]);
        for s in &mut running {
            let n_new = s.prompt.saturating_sub(s.len).clamp(1, CHUNK); // chunk or decode row
            while s.pages.len() * PAGE < s.len + n_new {
                s.pages.push(free.pop().expect("reserved at admission"));
            }
            for t in s.len..s.len + n_new {
                slots.push(slot(s, t) / ROW);
                positions.push(t as u32);
            }
            k_new.extend((0..n_new * ROW).map(|_| rng.unit()));
            v_new.extend((0..n_new * ROW).map(|_| rng.unit()));
            q.extend((0..n_new * H * D).map(|_| rng.unit()));
            s.len += n_new;
            cu_q.push(q.len() / (H * D));
            lens.push(s.len);
        }
        // The new tokens' K (rotated) and V into their slots, then Q rotated alike.
        let (n, pool_dims) = (slots.len(), [NUM_PAGES, PAGE, H_KV, D]);
        let (kn, vn) = (
            Tensor::bshd(&k_new, [1, n, H_KV, D])?,
            Tensor::bshd(&v_new, [1, n, H_KV, D])?,
        );
        let mut k_cache = TensorMut::bshd(&mut k_pool, pool_dims)?;
        let mut v_cache = TensorMut::bshd(&mut v_pool, pool_dims)?;
        append(
            &kn,
            &vn,
            &mut k_cache,
            &mut v_cache,
            &slots,
            None,
            Some((&rope, &positions)),
        )?;
        rope.apply(&mut TensorMut::bshd(&mut q, [1, n, H, D])?, &positions)?;
        // Block table `[B][pages_per_seq]`, rows padded with 0 (never read past a length).
        let pps = running.iter().map(|s| s.pages.len()).max().unwrap_or(0);
        let mut table = vec![0u32; running.len() * pps];
        for (row, s) in table.chunks_mut(pps).zip(&running) {
            row[..s.pages.len()].copy_from_slice(&s.pages);
        }
        // The one attention call of the step.
        let total_q = cu_q[running.len()];
        let (mut out, mut lse) = (vec![0.0f32; total_q * H * D], vec![0.0f32; H * total_q]);
        let pool = |x| Tensor::bshd(x, [NUM_PAGES, PAGE, H_KV, D]);
        let kv = VarlenKv::Paged(PagedKv::new(pool(&k_pool)?, pool(&v_pool)?, &table, pps)?);
        let opts = Options::new().causal(Alignment::BottomRight).kv_lens(&lens);
        let qv = Tensor::bshd(&q, [1, total_q, H, D])?;
        let mut ov = TensorMut::bshd(&mut out, [1, total_q, H, D])?;
        ws.attention_varlen(&qv, &cu_q, &kv, &mut ov, Some(&mut lse), &opts)?;

        // Check each sequence against the reference on it alone.
        let mut worst = 0.0f64;
        let mut check = |got: f32, want: f32, bound: f64, what: &str| {
            let err = (f64::from(got) - f64::from(want)).abs();
            assert!(err <= bound, "{what}: {got} vs {want} (bound {bound:e})");
            worst = worst.max(err / bound);
        };
        for (b, s) in running.iter().enumerate() {
            let (r0, n) = (cu_q[b], cu_q[b + 1] - cu_q[b]);
            let (mut k, mut v) = (vec![], vec![]);
            for t in 0..s.len {
                k.extend_from_slice(&k_pool[slot(s, t)..][..ROW]);
                v.extend_from_slice(&v_pool[slot(s, t)..][..ROW]);
            }
            let qs = Tensor::bshd(&q[r0 * H * D..(r0 + n) * H * D], [1, n, H, D])?;
            let kv_dims = [1, s.len, H_KV, D];
            let (ks, vs) = (Tensor::bshd(&k, kv_dims)?, Tensor::bshd(&v, kv_dims)?);
            let causal = Options::new().causal(Alignment::BottomRight);
            let (mut want, mut w_lse) = (vec![0.0f32; n * H * D], vec![0.0f32; H * n]);
            let mut wv = TensorMut::bshd(&mut want, [1, n, H, D])?;
            reference::attention_lse(&qs, &ks, &vs, &mut wv, &mut w_lse, &causal)?;
            let bounds = reference::error_bounds(&qs, &ks, &vs, &causal)?;
            for h in 0..H {
                for i in 0..n {
                    let b = bounds[h * n + i];
                    let what = format!("step {step} seq {} row {i} head {h}", s.id);
                    check(lse[h * total_q + r0 + i], w_lse[h * n + i], b.lse, &what);
                    for c in 0..D {
                        let at = (i * H + h) * D + c;
                        check(out[r0 * H * D + at], want[at], b.out, &what);
                    }
                }
            }
        }
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
    println!(
        "done: {step} steps, {} cache, workspace {kib} KiB",
        Cache::NAME
    );
    Ok(())
}
