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

mod episode;

use super::bytes::{uint, urange, Writer};
use super::contract::Tally;
use arbitrary::{Arbitrary, Result, Unstructured};
use episode::episode;
use sdpa::half::{bf16, f16};
use sdpa::RopeStyle;

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

/// Runs and checks one episode; panics with a description on any violation.
pub fn check(case: &ServingCase) -> ServingStats {
    match case.kv {
        KvType::F32 => episode::<f32>(case),
        KvType::F16 => episode::<f16>(case),
        KvType::Bf16 => episode::<bf16>(case),
        KvType::I8 => episode::<i8>(case),
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
