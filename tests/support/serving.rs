//! The serving check (`fuzz/fuzz_targets/serving.rs`): bytes decode to a short serving episode
//! ([`ServingCase`]) — a K/V type (f32, f16, bf16 or `i8` with per-(token, kv head) scales),
//! heads, GQA group and head sizes, a page pool, a RoPE style and rotary dim (base or tables),
//! options (causal bottom-right always; a window, a softcap, per-layer sinks) and a few steps
//! in which each of [`SEQS`] sequence slots admits a sequence, prefills a chunk, decodes a
//! row, waits or retires (its pages go back to the pool, stale rows and all).
//!
//! Each step, per layer ([`LAYERS`], each with its own pools): the new K/V rows go in with
//! `sdpa::append` (K rotated), then one `sdpa::Plan` for the step (paged; key lengths by
//! `cache_seqlens` or `kv_lens`, drawn per step) runs the layer. [`check`]:
//! * the caches after `append` equal `reference::append` on the same caches: bit for bit for
//!   f32/f16/bf16; `i8` with the same scales and values that differ by at most 1 where the
//!   quotient is within `127 · 2⁻²⁴` of a half-integer;
//! * every row (out and LSE) within `reference::error_bounds_varlen` of
//!   `reference::attention_varlen` on the same pools (`contract::check_against_reference`);
//!   slots no sequence reaches hold NaN (float pools) or a huge scale (`i8`), which must not
//!   leak;
//! * on a packed step, the same through `StepKv::Packed` on the sequences' keys gathered, and
//!   the packed reference equal, bit for bit, to the paged one;
//! * the faults a step draws: a slot past the cache and a slot written twice (`append` and
//!   `reference::append` fail with the same error, caches and scales unchanged), a pool with
//!   fewer pages than the table reaches (`Plan::run` fails, output and LSE unchanged).

use super::bytes::{uint, urange, Writer};
use super::contract::{check_against_reference, Outputs, RowFacts, Tally};
use super::values::SplitMix;
use arbitrary::{Arbitrary, Result, Unstructured};
use sdpa::half::{bf16, f16};
use sdpa::reference;
use sdpa::{
    Alignment, Dim, Error, Heads, KvElement, Layer, Operand, Options, PackedKv, PagedKv, Plan,
    Rope, RopeStyle, StepKv, Tensor, TensorMut, VarlenKv,
};

/// Most key/value heads.
pub const MAX_KV_HEADS: usize = 3;
/// Largest GQA group.
pub const MAX_GROUP: usize = 3;
/// Largest head size.
pub const MAX_D: usize = 24;
/// Largest page.
pub const MAX_PAGE_SIZE: usize = 8;
/// Most pages in a layer's pool.
pub const MAX_PAGES: usize = 16;
/// Sequence slots.
pub const SEQS: usize = 3;
/// Most steps.
pub const MAX_STEPS: usize = 4;
/// Longest prefill chunk.
pub const MAX_CHUNK: usize = 8;
/// Layers per step, each with its own pools.
pub const LAYERS: usize = 2;

/// The K/V (cache) type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    I8,
}

const KV_TYPES: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Bf16, KvType::I8];

/// The rotary embedding of K (and Q).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeSpec {
    pub style: RopeStyle,
    /// Rotary dim / 2 (1 ..= d_k / 2).
    pub half: usize,
    /// Angles from drawn cos/sin tables (else base 10,000).
    pub tables: bool,
}

/// What a sequence slot does in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `n` new rows (1: a decode row; admits a sequence in an empty slot), fewer if the pool
    /// is full.
    Rows(usize),
    /// No rows (a live sequence stays in the batch with 0 query rows).
    Wait,
    /// The sequence leaves; its pages return to the pool.
    Retire,
}

/// A fault a step injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// An `append` with one slot past the cache.
    SlotPastCache,
    /// An `append` with one slot written twice.
    SlotTwice,
    /// A `Plan::run` with pools of fewer pages than the table reaches.
    FewPages,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepSpec {
    pub actions: [Action; SEQS],
    /// Also run the step with K/V packed (`StepKv::Packed`).
    pub packed: bool,
    /// Key lengths by `kv_lens` (else `cache_seqlens`).
    pub kv_lens: bool,
    pub fault: Fault,
    /// Which token or entry the fault hits.
    pub at: u8,
}

/// One serving episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingCase {
    pub kv: KvType,
    pub kv_heads: usize,
    pub group: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub page_size: usize,
    pub num_pages: usize,
    pub rope: Option<RopeSpec>,
    /// A sliding window of this many keys to the left (bottom-right).
    pub window: Option<usize>,
    pub softcap: bool,
    /// Per-layer sinks.
    pub sinks: bool,
    pub steps: Vec<StepSpec>,
    /// The values' generator seed.
    pub seed: u64,
}

const WINDOWS: [Option<usize>; 4] = [None, None, Some(2), Some(6)];

/// An integer in `lo..=hi`, where exhausted input decodes to `first`.
fn from(u: &mut Unstructured<'_>, lo: usize, hi: usize, first: usize) -> Result<usize> {
    Ok(lo + (urange(u, 0, hi - lo)? + first - lo) % (hi - lo + 1))
}

/// Inverse of [`from`].
fn write_from(w: &mut Writer, x: usize, lo: usize, hi: usize, first: usize) {
    let n = hi - lo + 1;
    w.urange((x - lo + n - (first - lo)) % n, 0, hi - lo);
}

/// Yes on 3 of `0..=3` (exhausted input: no).
fn flag(u: &mut Unstructured<'_>) -> Result<bool> {
    Ok(urange(u, 0, 3)? == 3)
}

fn write_flag(w: &mut Writer, x: bool) {
    w.urange(if x { 3 } else { 0 }, 0, 3);
}

impl Action {
    fn decode(u: &mut Unstructured<'_>) -> Result<Action> {
        Ok(match urange(u, 0, MAX_CHUNK + 1)? {
            n if n < MAX_CHUNK => Action::Rows(n + 1),
            MAX_CHUNK => Action::Wait,
            _ => Action::Retire,
        })
    }

    fn encode(self, w: &mut Writer) {
        let x = match self {
            Action::Rows(n) => n - 1,
            Action::Wait => MAX_CHUNK,
            Action::Retire => MAX_CHUNK + 1,
        };
        w.urange(x, 0, MAX_CHUNK + 1);
    }
}

impl StepSpec {
    fn decode(u: &mut Unstructured<'_>) -> Result<StepSpec> {
        let mut actions = [Action::Wait; SEQS];
        for a in &mut actions {
            *a = Action::decode(u)?;
        }
        Ok(StepSpec {
            actions,
            packed: flag(u)?,
            kv_lens: urange(u, 0, 1)? == 1,
            fault: match urange(u, 0, 7)? {
                5 => Fault::SlotPastCache,
                6 => Fault::SlotTwice,
                7 => Fault::FewPages,
                _ => Fault::None,
            },
            at: uint(u, 1)? as u8,
        })
    }

    fn encode(&self, w: &mut Writer) {
        for a in self.actions {
            a.encode(w);
        }
        write_flag(w, self.packed);
        w.urange(self.kv_lens.into(), 0, 1);
        let fault = match self.fault {
            Fault::None => 0,
            Fault::SlotPastCache => 5,
            Fault::SlotTwice => 6,
            Fault::FewPages => 7,
        };
        w.urange(fault, 0, 7).uint(self.at.into(), 1);
    }
}

impl ServingCase {
    /// Reads a case (exhausted input: f32, one kv head, d 8, pages of 4, three one-row steps).
    pub fn decode(u: &mut Unstructured<'_>) -> Result<ServingCase> {
        let kv = KV_TYPES[urange(u, 0, 3)?];
        let kv_heads = from(u, 1, MAX_KV_HEADS, 1)?;
        let group = from(u, 1, MAX_GROUP, 1)?;
        let d_k = from(u, 1, MAX_D, 8)?;
        let d_v = if flag(u)? { from(u, 1, MAX_D, 8)? } else { d_k };
        let page_size = from(u, 1, MAX_PAGE_SIZE, 4)?;
        let num_pages = from(u, 1, MAX_PAGES, 12)?;
        let kind = urange(u, 0, 4)?;
        let rope = match kind {
            0 => None,
            _ if d_k < 2 => None,
            k => Some(RopeSpec {
                style: [RopeStyle::Halves, RopeStyle::Interleaved][(k - 1) % 2],
                half: from(u, 1, d_k / 2, d_k / 2)?,
                tables: k >= 3,
            }),
        };
        let window = WINDOWS[urange(u, 0, 3)?];
        let softcap = flag(u)?;
        let sinks = flag(u)?;
        let n = from(u, 1, MAX_STEPS, 3)?;
        let steps = (0..n).map(|_| StepSpec::decode(u)).collect::<Result<_>>()?;
        let seed = uint(u, 8)?;
        Ok(ServingCase {
            kv,
            kv_heads,
            group,
            d_k,
            d_v,
            page_size,
            num_pages,
            rope,
            window,
            softcap,
            sinks,
            steps,
            seed,
        })
    }

    /// Inverse of [`ServingCase::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        let kv = KV_TYPES.iter().position(|&t| t == self.kv).expect("a type");
        w.urange(kv, 0, 3);
        write_from(&mut w, self.kv_heads, 1, MAX_KV_HEADS, 1);
        write_from(&mut w, self.group, 1, MAX_GROUP, 1);
        write_from(&mut w, self.d_k, 1, MAX_D, 8);
        write_flag(&mut w, self.d_v != self.d_k);
        if self.d_v != self.d_k {
            write_from(&mut w, self.d_v, 1, MAX_D, 8);
        }
        write_from(&mut w, self.page_size, 1, MAX_PAGE_SIZE, 4);
        write_from(&mut w, self.num_pages, 1, MAX_PAGES, 12);
        match self.rope {
            None => {
                w.urange(0, 0, 4);
            }
            Some(r) => {
                let style = usize::from(r.style == RopeStyle::Interleaved);
                w.urange(1 + style + 2 * usize::from(r.tables), 0, 4);
                write_from(&mut w, r.half, 1, self.d_k / 2, self.d_k / 2);
            }
        }
        w.pick(self.window, &WINDOWS);
        write_flag(&mut w, self.softcap);
        write_flag(&mut w, self.sinks);
        write_from(&mut w, self.steps.len(), 1, MAX_STEPS, 3);
        for s in &self.steps {
            s.encode(&mut w);
        }
        w.uint(self.seed, 8);
        w.bytes
    }
}

impl<'a> Arbitrary<'a> for ServingCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        ServingCase::decode(u)
    }
}

/// What [`check`] verified.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServingStats {
    pub cases: usize,
    /// Steps with at least one query row.
    pub steps: usize,
    /// Layer runs of a paged plan checked against the reference.
    pub paged_runs: usize,
    /// ... of a packed plan.
    pub packed_runs: usize,
    /// `append` calls whose caches were checked against `reference::append`.
    pub appends: usize,
    /// Faults refused with nothing written.
    pub rejected: usize,
    pub rows_in_bound: usize,
    pub rows_empty: usize,
}

impl ServingStats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, o: &ServingStats) {
        self.cases += o.cases;
        self.steps += o.steps;
        self.paged_runs += o.paged_runs;
        self.packed_runs += o.packed_runs;
        self.appends += o.appends;
        self.rejected += o.rejected;
        self.rows_in_bound += o.rows_in_bound;
        self.rows_empty += o.rows_empty;
    }

    fn tally(&mut self, t: Tally) {
        self.rows_in_bound += t.rows_in_bound;
        self.rows_empty += t.rows_empty;
    }
}

/// A cache type and the value that fills the slots no sequence has written.
trait Cache: KvElement + Default {
    const UNWRITTEN: Self;
}
impl Cache for f32 {
    const UNWRITTEN: Self = f32::NAN;
}
impl Cache for f16 {
    const UNWRITTEN: Self = f16::NAN;
}
impl Cache for bf16 {
    const UNWRITTEN: Self = bf16::NAN;
}
impl Cache for i8 {
    const UNWRITTEN: Self = 127;
}

/// The scale of `i8` slots no sequence has written: finite (a page a length reaches is checked
/// whole), and huge, so that a read would show.
const UNWRITTEN_SCALE: f32 = 1e30;

/// One layer's pools `[pages, page, H_kv, d]` and, for `i8`, scales `[pages, page, H_kv, 1]`.
#[derive(Clone)]
struct Pools<T> {
    k: Vec<T>,
    v: Vec<T>,
    ks: Vec<f32>,
    vs: Vec<f32>,
}

/// A live sequence: its pages and length.
#[derive(Debug, Clone, Default)]
struct Seq {
    pages: Vec<u32>,
    len: usize,
}

/// Runs and checks one episode; panics with a description on any violation.
pub fn check(case: &ServingCase) -> ServingStats {
    match case.kv {
        KvType::F32 => episode::<f32>(case),
        KvType::F16 => episode::<f16>(case),
        KvType::Bf16 => episode::<bf16>(case),
        KvType::I8 => episode::<i8>(case),
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn same<T: KvElement>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn episode<T: Cache>(case: &ServingCase) -> ServingStats {
    let mut stats = ServingStats {
        cases: 1,
        ..Default::default()
    };
    let mut rng = SplitMix(case.seed);
    let (h_kv, page, pages) = (case.kv_heads, case.page_size, case.num_pages);
    let h = h_kv * case.group;
    let (d_k, d_v) = (case.d_k, case.d_v);
    let heads = Heads {
        heads: h,
        kv_heads: h_kv,
        d_k,
        d_v,
    };
    let slots_total = pages * page;
    let mut layers: Vec<Pools<T>> = (0..LAYERS)
        .map(|_| Pools {
            k: vec![T::UNWRITTEN; slots_total * h_kv * d_k],
            v: vec![T::UNWRITTEN; slots_total * h_kv * d_v],
            ks: vec![UNWRITTEN_SCALE; slots_total * h_kv],
            vs: vec![UNWRITTEN_SCALE; slots_total * h_kv],
        })
        .collect();
    let half = case.rope.map_or(1, |r| r.half);
    // Tables for positions 0 .. MAX_STEPS · MAX_CHUNK (a sequence never holds more).
    let positions_max = MAX_STEPS * MAX_CHUNK;
    let cos: Vec<f32> = (0..positions_max * half)
        .map(|_| rng.unit() as f32)
        .collect();
    let sin: Vec<f32> = (0..positions_max * half)
        .map(|_| rng.unit() as f32)
        .collect();
    let rope = case.rope.map(|r| match r.tables {
        true => Rope::with_tables(r.style, 2 * r.half, &cos, &sin),
        false => Rope::new(r.style, 2 * r.half, 10_000.0),
    });
    let mut free: Vec<u32> = (0..pages as u32).rev().collect();
    let mut seqs: [Option<Seq>; SEQS] = Default::default();
    for (step_i, step) in case.steps.iter().enumerate() {
        // The step's rows: per live sequence (slot order), its cached length and new rows.
        let (mut cu_q, mut cached, mut slots, mut positions) = (vec![0], vec![], vec![], vec![]);
        let mut live = vec![];
        for (slot, action) in step.actions.iter().enumerate() {
            let want = match (*action, &seqs[slot]) {
                (Action::Retire, Some(s)) => {
                    free.extend(s.pages.iter().rev());
                    seqs[slot] = None;
                    continue;
                }
                (Action::Retire, None) | (Action::Wait, None) => continue,
                (Action::Wait, Some(_)) => 0,
                (Action::Rows(n), _) => n,
            };
            let s = seqs[slot].get_or_insert_with(Seq::default);
            let room = s.pages.len() * page - s.len + free.len() * page;
            let n = want.min(room);
            while s.pages.len() * page < s.len + n {
                s.pages.push(free.pop().expect("room counted"));
            }
            for t in s.len..s.len + n {
                slots.push(s.pages[t / page] as usize * page + t % page);
                positions.push(t as u32);
            }
            cached.push(s.len);
            s.len += n;
            cu_q.push(slots.len());
            live.push(slot);
        }
        let n = slots.len();
        stats.steps += usize::from(n > 0);
        let lens: Vec<usize> = live
            .iter()
            .map(|&s| seqs[s].as_ref().unwrap().len)
            .collect();
        let pps = live
            .iter()
            .map(|&s| seqs[s].as_ref().unwrap().pages.len())
            .max()
            .unwrap_or(0);
        // Entries past a sequence's pages name no page of the pool: never read.
        let mut table = vec![pages as u32 + 5; live.len() * pps];
        for (b, &s) in live.iter().enumerate() {
            let p = &seqs[s].as_ref().unwrap().pages;
            table[b * pps..][..p.len()].copy_from_slice(p);
        }
        let what = format!("{case:?} step {step_i}");
        let mut base = Options::new().causal(Alignment::BottomRight);
        if let Some(w) = case.window {
            base = base.sliding_window(w, 0, Alignment::BottomRight);
        }
        if case.softcap {
            base = base.softcap(4.0);
        }
        let opts = match step.kv_lens {
            true => base.clone().kv_lens(&lens),
            false => base.clone().cache_seqlens(&cached),
        };
        let step_kv = StepKv::Paged {
            block_table: &table,
            pages_per_seq: pps,
            page_size: page,
        };
        let mut plan =
            Plan::new(&cu_q, step_kv, heads, &opts).unwrap_or_else(|e| panic!("{what}: plan: {e}"));
        // Packed: each sequence's keys gathered, in sequence order.
        let mut cu_k = vec![0];
        for &l in &lens {
            cu_k.push(cu_k.last().unwrap() + l);
        }
        let total_k = *cu_k.last().unwrap();
        let mut packed_plan = step.packed.then(|| {
            let kv = StepKv::Packed {
                cu_seqlens_k: &cu_k,
            };
            Plan::new(&cu_q, kv, heads, &opts).unwrap_or_else(|e| panic!("{what}: plan: {e}"))
        });
        for (l, pools) in layers.iter_mut().enumerate() {
            let what = format!("{what} layer {l}");
            let k_new: Vec<f32> = (0..n * h_kv * d_k)
                .map(|_| 2.0 * rng.unit() as f32)
                .collect();
            let v_new: Vec<f32> = (0..n * h_kv * d_v)
                .map(|_| 2.0 * rng.unit() as f32)
                .collect();
            let sinks: Vec<f32> = (0..h).map(|_| rng.unit() as f32).collect();
            let kt = Tensor::bshd(&k_new, [1, n, h_kv, d_k]).unwrap();
            let vt = Tensor::bshd(&v_new, [1, n, h_kv, d_v]).unwrap();
            let rope_at = rope.as_ref().map(|r| (r, &positions[..]));
            // Faults of append: the same error from both paths, nothing written.
            let bad_slots = match step.fault {
                Fault::SlotPastCache if n > 0 => {
                    let mut s = slots.clone();
                    s[step.at as usize % n] = slots_total + step.at as usize % 3;
                    Some(s)
                }
                Fault::SlotTwice if n > 1 => {
                    let mut s = slots.clone();
                    let i = 1 + step.at as usize % (n - 1);
                    s[i] = s[i - 1];
                    Some(s)
                }
                _ => None,
            };
            if let Some(bad) = bad_slots {
                let mut errors = vec![];
                for reference in [false, true] {
                    let mut p = pools.clone();
                    let r = write::<T>(&mut p, [pages, page], (&kt, &vt), &bad, rope_at, reference);
                    let err = r.expect_err(&format!("{what}: append with slots {bad:?}"));
                    assert!(
                        matches!(
                            err,
                            Error::InvalidValue {
                                operand: Operand::Slots,
                                ..
                            }
                        ),
                        "{what}: {err}"
                    );
                    assert!(
                        same(&p.k, &pools.k)
                            && same(&p.v, &pools.v)
                            && bits(&p.ks) == bits(&pools.ks)
                            && bits(&p.vs) == bits(&pools.vs),
                        "{what}: a failed append wrote"
                    );
                    errors.push(err);
                }
                assert_eq!(errors[0], errors[1], "{what}: append errors");
                stats.rejected += 1;
            }
            let mut want = pools.clone();
            write::<T>(pools, [pages, page], (&kt, &vt), &slots, rope_at, false)
                .unwrap_or_else(|e| panic!("{what}: append: {e}"));
            write::<T>(&mut want, [pages, page], (&kt, &vt), &slots, rope_at, true)
                .unwrap_or_else(|e| panic!("{what}: reference append: {e}"));
            let k_rows: Vec<f64> = match &rope {
                Some(r) => reference::rope(r, &kt, &positions).unwrap(),
                None => k_new.iter().map(|&x| f64::from(x)).collect(),
            };
            let v_rows: Vec<f64> = v_new.iter().map(|&x| f64::from(x)).collect();
            compare_caches(
                &what,
                pools,
                &want,
                &slots,
                h_kv,
                (&k_rows, &v_rows),
                [d_k, d_v],
            );
            stats.appends += 1;

            // Attention: Q rotated at the same positions.
            let mut q: Vec<f32> = (0..n * h * d_k).map(|_| rng.unit() as f32).collect();
            if let Some(r) = &rope {
                r.apply(
                    &mut TensorMut::bshd(&mut q, [1, n, h, d_k]).unwrap(),
                    &positions,
                )
                .unwrap();
            }
            let qt = Tensor::bshd(&q, [1, n, h, d_k]).unwrap();
            let (kd, vd) = ([pages, page, h_kv, d_k], [pages, page, h_kv, d_v]);
            let sd = [pages, page, h_kv, 1];
            let kp = Tensor::bshd(&pools.k, kd).unwrap();
            let vp = Tensor::bshd(&pools.v, vd).unwrap();
            let mut layer = Layer::new();
            if T::QUANTIZED {
                layer = layer.kv_scales(
                    Tensor::bshd(&pools.ks, sd).unwrap(),
                    Tensor::bshd(&pools.vs, sd).unwrap(),
                );
            }
            if case.sinks {
                layer = layer.sinks(&sinks);
            }
            let od = [1, n, h, d_v];
            if step.fault == Fault::FewPages {
                let reached = table
                    .iter()
                    .filter(|&&e| (e as usize) < pages)
                    .map(|&e| e as usize + 1)
                    .max()
                    .unwrap_or(0);
                if reached > 0 {
                    let short = reached - 1;
                    let (ks, vs) = (
                        &pools.k[..short * page * h_kv * d_k],
                        &pools.v[..short * page * h_kv * d_v],
                    );
                    let kt = Tensor::bshd(ks, [short, page, h_kv, d_k]).unwrap();
                    let vt = Tensor::bshd(vs, [short, page, h_kv, d_v]).unwrap();
                    let mut out = vec![f32::NAN; n * h * d_v];
                    let mut lse = vec![f32::NAN; h * n];
                    let mut o = TensorMut::bshd(&mut out, od).unwrap();
                    let r = plan.run(&qt, &kt, &vt, &mut o, Some(&mut lse), &layer);
                    let err = r.expect_err(&format!("{what}: a pool of {short} pages"));
                    assert!(
                        matches!(
                            err,
                            Error::ShapeMismatch {
                                operand: Operand::Key,
                                dim: Dim::Batch,
                                ..
                            }
                        ),
                        "{what}: {err}"
                    );
                    assert!(
                        out.iter().chain(&lse).all(|x| x.is_nan()),
                        "{what}: a failed run wrote"
                    );
                    stats.rejected += 1;
                }
            }
            let mut ref_opts = base.clone();
            ref_opts = match step.kv_lens {
                true => ref_opts.kv_lens(&lens),
                false => ref_opts.cache_seqlens(&cached),
            };
            if case.sinks {
                ref_opts = ref_opts.sinks(&sinks);
            }
            let paged_ref_opts = match T::QUANTIZED {
                true => ref_opts.clone().kv_scales(
                    Tensor::bshd(&pools.ks, sd).unwrap(),
                    Tensor::bshd(&pools.vs, sd).unwrap(),
                ),
                false => ref_opts.clone(),
            };
            let paged = PagedKv::new(kp, vp, &table, pps).unwrap();
            let kv = VarlenKv::Paged(paged);
            let fused = {
                let mut out = vec![f32::NAN; n * h * d_v];
                let mut lse = vec![f32::NAN; h * n];
                let mut o = TensorMut::bshd(&mut out, od).unwrap();
                plan.run(&qt, &kp, &vp, &mut o, Some(&mut lse), &layer)
                    .unwrap_or_else(|e| panic!("{what}: run: {e}"));
                Outputs { dims: od, out, lse }
            };
            let refd = reference_run(&what, &qt, &cu_q, &kv, od, &paged_ref_opts);
            let bounds = reference::error_bounds_varlen(&qt, &cu_q, &kv, &paged_ref_opts)
                .unwrap_or_else(|e| panic!("{what}: bounds: {e}"));
            let label = format!("{what} paged");
            stats.tally(check_against_reference(
                &fused,
                &refd,
                &bounds,
                |_| RowFacts::FINITE,
                &label,
            ));
            stats.paged_runs += 1;

            let Some(packed_plan) = packed_plan.as_mut() else {
                continue;
            };
            // The sequences' keys (and scales) gathered, packed.
            let gather = |x: &[T], d: usize| {
                let mut out = Vec::with_capacity(total_k * h_kv * d);
                for &s in &live {
                    let sq = seqs[s].as_ref().unwrap();
                    for t in 0..sq.len {
                        let slot = sq.pages[t / page] as usize * page + t % page;
                        out.extend_from_slice(&x[slot * h_kv * d..][..h_kv * d]);
                    }
                }
                out
            };
            let gather_scales = |x: &[f32]| {
                let mut out = Vec::with_capacity(total_k * h_kv);
                for &s in &live {
                    let sq = seqs[s].as_ref().unwrap();
                    for t in 0..sq.len {
                        let slot = sq.pages[t / page] as usize * page + t % page;
                        out.extend_from_slice(&x[slot * h_kv..][..h_kv]);
                    }
                }
                out
            };
            let (kx, vx) = (gather(&pools.k, d_k), gather(&pools.v, d_v));
            let (ksx, vsx) = (gather_scales(&pools.ks), gather_scales(&pools.vs));
            let kt = Tensor::bshd(&kx, [1, total_k, h_kv, d_k]).unwrap();
            let vt = Tensor::bshd(&vx, [1, total_k, h_kv, d_v]).unwrap();
            let psd = [1, total_k, h_kv, 1];
            let mut layer = Layer::new();
            let mut packed_opts = ref_opts.clone();
            if T::QUANTIZED {
                let (ks, vs) = (
                    Tensor::bshd(&ksx, psd).unwrap(),
                    Tensor::bshd(&vsx, psd).unwrap(),
                );
                layer = layer.kv_scales(ks, vs);
                packed_opts = packed_opts.kv_scales(ks, vs);
            }
            if case.sinks {
                layer = layer.sinks(&sinks);
            }
            let fused = {
                let mut out = vec![f32::NAN; n * h * d_v];
                let mut lse = vec![f32::NAN; h * n];
                let mut o = TensorMut::bshd(&mut out, od).unwrap();
                packed_plan
                    .run(&qt, &kt, &vt, &mut o, Some(&mut lse), &layer)
                    .unwrap_or_else(|e| panic!("{what}: packed run: {e}"));
                Outputs { dims: od, out, lse }
            };
            let kv = VarlenKv::Packed(PackedKv::new(kt, vt, &cu_k));
            let packed_ref = reference_run(&what, &qt, &cu_q, &kv, od, &packed_opts);
            assert_eq!(
                bits(&packed_ref.out),
                bits(&refd.out),
                "{what}: packed reference"
            );
            assert_eq!(
                bits(&packed_ref.lse),
                bits(&refd.lse),
                "{what}: packed reference lse"
            );
            let bounds = reference::error_bounds_varlen(&qt, &cu_q, &kv, &packed_opts)
                .unwrap_or_else(|e| panic!("{what}: packed bounds: {e}"));
            let label = format!("{what} packed");
            stats.tally(check_against_reference(
                &fused,
                &packed_ref,
                &bounds,
                |_| RowFacts::FINITE,
                &label,
            ));
            stats.packed_runs += 1;
        }
    }
    stats
}

/// `reference::attention_varlen` with an LSE, as [`Outputs`] (`[1, total_q, H, d_v]`, LSE
/// `[H][total_q]`: the checker's layout with one batch).
fn reference_run<T: KvElement>(
    what: &str,
    q: &Tensor<'_, f32>,
    cu_q: &[usize],
    kv: &VarlenKv<'_, T>,
    od: [usize; 4],
    opts: &Options<'_>,
) -> Outputs {
    let [_, n, h, d_v] = od;
    let mut out = vec![f32::NAN; n * h * d_v];
    let mut lse = vec![f32::NAN; h * n];
    let mut o = TensorMut::bshd(&mut out, od).unwrap();
    reference::attention_varlen(q, cu_q, kv, &mut o, Some(&mut lse), opts)
        .unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    Outputs { dims: od, out, lse }
}

/// `sdpa::append` (or `reference::append`) of the rows `kv` into `pools` at `slots`.
fn write<T: KvElement>(
    pools: &mut Pools<T>,
    [pages, page]: [usize; 2],
    (k, v): (&Tensor<'_, f32>, &Tensor<'_, f32>),
    slots: &[usize],
    rope: Option<(&Rope<'_>, &[u32])>,
    reference: bool,
) -> std::result::Result<(), Error> {
    let [_, _, h_kv, d_k] = k.dims();
    let d_v = v.dims()[3];
    let mut kc = TensorMut::bshd(&mut pools.k, [pages, page, h_kv, d_k]).unwrap();
    let mut vc = TensorMut::bshd(&mut pools.v, [pages, page, h_kv, d_v]).unwrap();
    let mut ks = TensorMut::bshd(&mut pools.ks, [pages, page, h_kv, 1]).unwrap();
    let mut vs = TensorMut::bshd(&mut pools.vs, [pages, page, h_kv, 1]).unwrap();
    let scales = T::QUANTIZED.then_some((&mut ks, &mut vs));
    match reference {
        true => reference::append(k, v, &mut kc, &mut vc, slots, scales, rope),
        false => sdpa::append(k, v, &mut kc, &mut vc, slots, scales, rope),
    }
}

/// The caches `got` (after `sdpa::append`) against `want` (after `reference::append`): the same
/// bits for float types; for `i8` the same scales and values equal but at near-ties of the
/// quotient (`rows`: the appended K and V rows, K rotated, in f64, `[token][head][channel]`).
fn compare_caches<T: KvElement>(
    what: &str,
    got: &Pools<T>,
    want: &Pools<T>,
    slots: &[usize],
    h_kv: usize,
    rows: (&[f64], &[f64]),
    [d_k, d_v]: [usize; 2],
) {
    assert_eq!(bits(&got.ks), bits(&want.ks), "{what}: K scales");
    assert_eq!(bits(&got.vs), bits(&want.vs), "{what}: V scales");
    for (name, d, rows, g, w, scales) in [
        ("K", d_k, rows.0, &got.k, &want.k, &want.ks),
        ("V", d_v, rows.1, &got.v, &want.v, &want.vs),
    ] {
        if same(g, w) {
            continue;
        }
        assert!(
            T::QUANTIZED,
            "{what}: {name} cache differs from reference::append"
        );
        for (e, (x, y)) in g.iter().zip(w.iter()).enumerate() {
            let (x, y) = (x.to_f64(), y.to_f64());
            if x == y {
                continue;
            }
            let (slot, hk, c) = (e / (h_kv * d), e / d % h_kv, e % d);
            let t = slots.iter().position(|&s| s == slot);
            let t = t.unwrap_or_else(|| panic!("{what}: {name} slot {slot} changed, not appended"));
            let s = f64::from(scales[slot * h_kv + hk]);
            let z = f64::from(rows[(t * h_kv + hk) * d + c] as f32) / s;
            assert!(
                (x - y).abs() == 1.0 && (z - (x + y) / 2.0).abs() <= 127.0 / (1u64 << 24) as f64,
                "{what}: {name} slot {slot} head {hk} channel {c}: {x} vs reference {y} (quotient {z})"
            );
        }
    }
}

/// The named seeds of `fuzz/corpus/serving/`.
pub fn seeds() -> Vec<(&'static str, ServingCase)> {
    let step = |actions: [Action; SEQS]| StepSpec {
        actions,
        packed: false,
        kv_lens: false,
        fault: Fault::None,
        at: 0,
    };
    let base = ServingCase {
        kv: KvType::F32,
        kv_heads: 2,
        group: 2,
        d_k: 8,
        d_v: 8,
        page_size: 4,
        num_pages: 12,
        rope: Some(RopeSpec {
            style: RopeStyle::Halves,
            half: 4,
            tables: false,
        }),
        window: None,
        softcap: false,
        sinks: false,
        steps: vec![
            step([Action::Rows(7), Action::Rows(3), Action::Wait]),
            step([Action::Rows(1), Action::Rows(5), Action::Rows(8)]),
            step([Action::Rows(1), Action::Rows(1), Action::Rows(1)]),
        ],
        seed: 1,
    };
    let with = |f: &dyn Fn(&mut ServingCase)| {
        let mut c = base.clone();
        f(&mut c);
        c
    };
    vec![
        ("prefill-decode-f32", base.clone()),
        ("prefill-decode-f16", with(&|c| c.kv = KvType::F16)),
        (
            "prefill-decode-bf16-interleaved",
            with(&|c| {
                c.kv = KvType::Bf16;
                c.rope = Some(RopeSpec {
                    style: RopeStyle::Interleaved,
                    half: 2,
                    tables: false,
                });
            }),
        ),
        (
            "prefill-decode-i8-tables",
            with(&|c| {
                c.kv = KvType::I8;
                c.rope = Some(RopeSpec {
                    style: RopeStyle::Halves,
                    half: 3,
                    tables: true,
                });
            }),
        ),
        (
            "kv-lens-packed-sinks-window",
            with(&|c| {
                c.sinks = true;
                c.window = Some(2);
                c.softcap = true;
                for s in &mut c.steps {
                    s.kv_lens = true;
                    s.packed = true;
                }
            }),
        ),
        (
            "retire-and-reuse-pages-i8",
            with(&|c| {
                c.kv = KvType::I8;
                c.num_pages = 5;
                c.steps = vec![
                    step([Action::Rows(8), Action::Rows(8), Action::Rows(4)]),
                    step([Action::Retire, Action::Rows(1), Action::Rows(8)]),
                    step([Action::Rows(6), Action::Retire, Action::Rows(1)]),
                    step([Action::Rows(1), Action::Rows(2), Action::Wait]),
                ];
            }),
        ),
        (
            "slot-past-cache",
            with(&|c| c.steps[1].fault = Fault::SlotPastCache),
        ),
        (
            "slot-twice-f16",
            with(&|c| {
                c.kv = KvType::F16;
                c.steps[0].fault = Fault::SlotTwice;
                c.steps[0].at = 3;
            }),
        ),
        (
            "pool-too-few-pages",
            with(&|c| c.steps[2].fault = Fault::FewPages),
        ),
        (
            "no-rope-gqa-odd-dims",
            with(&|c| {
                c.rope = None;
                c.kv_heads = 3;
                c.group = 3;
                c.d_k = 5;
                c.d_v = 3;
                c.page_size = 1;
                c.num_pages = 16;
            }),
        ),
    ]
}
