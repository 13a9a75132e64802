//! The paged and packed K/V check (`fuzz/fuzz_targets/kv_cache.rs`): random block tables and
//! sequence offsets, valid and invalid, into `sdpa::attention_paged` (dense Q) and
//! `sdpa::attention_varlen` (K/V packed, and paged).
//!
//! A [`KvCacheCase`] is a small batch (`B ≤ 4`, `H_kv ≤ 3`, GQA group ≤ 3, head sizes ≤ 40,
//! pages of 1–20 tokens, ≤ 6 pages per sequence in a pool of ≤ 12, ≤ 20 query rows per
//! sequence): a pool of pages in BSHD or BHSD layout with a block table whose entries are
//! valid, shuffled and shared pages, packed Q/K/V with gaps before, between and after the
//! sequences, per-sequence key lengths (sometimes past a sequence's capacity), a few options
//! (causal top-left or bottom-right, a window, softcap, sinks, ALiBi, a scale) and finite
//! values. Then faults break it: table entries past the pool (also in entries past a sequence's
//! length, which must be ignored), tables of the wrong length, offsets that decrease, run past
//! the packed rows or have the wrong length, a Q/K/out batch dim other than 1, mismatched dims,
//! LSE, key-length, slope and sink slices of the wrong length, invalid option values.
//!
//! [`check`]:
//! * `PagedKv::new` and every call answer `Ok` exactly when the model written from the docs
//!   (`PagedKv::new`, `attention_paged`, `attention_varlen`, `Options`) finds no broken rule,
//!   and otherwise one of the errors of the broken rules (`api::assert_one_of`: the crate
//!   reports the first it finds); a call that fails writes nothing (output and LSE keep
//!   [`SENTINEL`]);
//! * paged, `Ok`: output and LSE bitwise equal to `sdpa::attention_lse` on the same keys gathered
//!   into a dense `[B, pages_per_seq·page_size, H_kv, d]` buffer with the same options (as the
//!   crate documents), the paged call on another thread count than the dense one;
//! * varlen, `Ok` (K/V packed, and paged): every sequence, through the one checker
//!   [`check_against_reference`], against `sdpa::reference::attention_lse` on that sequence
//!   alone (dense views of its rows and keys) within `reference::error_bounds`: rows without a
//!   visible key (the model's causal/window/length rule) exactly 0 with LSE −∞ (σ with sinks);
//!   packed rows outside every sequence and the LSE of those rows untouched;
//! * with `poison`, every K/V slot no sequence reaches (pages no entry names, slots past a
//!   sequence's length, packed rows between sequences or past their key lengths) holds NaN,
//!   which the docs promise never leaks into results;
//! * with `int8`, K and V are i8 with f32 scales (`Options::kv_scales`) at one of the three
//!   granularities, each view's own: per tensor, per (kv head, channel), or per row of the
//!   pool or packed buffer and kv head (per token). The values are the drawn ones quantized
//!   ([`quantize_as`]; poisoned slots hold 0 there, still a key no result may include); the
//!   dense copy of a paged call and the reference of a sequence get the same i8 rows and their
//!   scales gathered the same way.

use super::api::assert_one_of;
use super::bytes::{pick, uint, urange, Writer};
use super::contract::{check_against_reference, Outputs, RowAt, RowFacts};
use super::differential::{side_pool, untouched_outside_view};
use super::layout::{indices, Buffer, Layout, POISON, SENTINEL};
use super::opts::{scale_refs, with_scales};
use super::typed::quantize_as;
use super::values::{Dist, Fill};
use arbitrary::{Arbitrary, Result, Unstructured};
use sdpa::{
    Alignment, Dim, Error, KvElement, Operand, Options, PackedKv, PagedKv, Tensor, VarlenKv,
};

/// Most sequences.
pub const MAX_BATCH: usize = 4;
/// Most key/value heads.
pub const MAX_KV_HEADS: usize = 3;
/// Largest GQA group (query heads per key/value head).
pub const MAX_GROUP: usize = 3;
/// Largest head size.
pub const MAX_D: usize = 40;
/// Largest page.
pub const MAX_PAGE_SIZE: usize = 20;
/// Most pages per sequence (block-table columns).
pub const MAX_PAGES_PER_SEQ: usize = 6;
/// Most pages in the pool.
pub const MAX_PAGES: usize = 12;
/// Most query rows per sequence.
pub const MAX_Q: usize = 20;

/// Batch sizes, weighted toward 1 (the value of exhausted input).
const BATCHES: [usize; 5] = [1, 2, 3, 4, 0];
/// Packed rows before, between or after sequences.
const GAPS: [usize; 7] = [0, 0, 0, 0, 1, 2, 3];
/// Packed keys of a sequence past its key length.
const K_EXTRA: [usize; 6] = [0, 0, 0, 1, 2, 3];
/// How many faults of a kind a case has.
const COUNTS: [usize; 10] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 2];
/// Batch dims other than 1.
const BAD_BATCH: [usize; 3] = [0, 2, 3];

/// An integer in `lo..=hi`, where exhausted input decodes to `first`.
fn urange_from(u: &mut Unstructured<'_>, lo: usize, hi: usize, first: usize) -> Result<usize> {
    let n = hi - lo + 1;
    let raw = urange(u, 0, hi - lo)?;
    Ok(lo + (raw + first - lo) % n)
}

/// Inverse of [`urange_from`].
fn write_urange_from(w: &mut Writer, x: usize, lo: usize, hi: usize, first: usize) {
    let n = hi - lo + 1;
    w.urange((x - lo + n - (first - lo)) % n, 0, hi - lo);
}

/// How a page pool (and the packed K or V of the case) is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLayout {
    /// `[num_pages, page_size, H_kv, d]` contiguous (vLLM v1): `Tensor::bshd`.
    Bshd,
    /// `[num_pages, H_kv, page_size, d]` contiguous: `Tensor::bhsd`.
    Bhsd,
}

const POOL_LAYOUTS: [PoolLayout; 2] = [PoolLayout::Bshd, PoolLayout::Bhsd];

/// The granularity of 8-bit K/V's scales (each of the four K/V views, pools and packed, has
/// its own scales of that granularity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8 {
    /// `[1, 1, 1, 1]`.
    Tensor,
    /// `[dim 0, dim 1, H_kv, 1]`: per page slot, or per packed row, and kv head.
    Token,
    /// `[1, 1, H_kv, d]`.
    Channel,
}

const INT8: [Int8; 3] = [Int8::Tensor, Int8::Token, Int8::Channel];

/// The first byte value that [`KvCacheCase::decode`] reads as 8-bit K/V (one case in four);
/// below it, and where the input has ended, K/V are f32 (so inputs written before i8 existed
/// decode as they did).
const INT8_FROM: u64 = 192;

impl Int8 {
    /// The dims of the scales of a K or V view of `dims`.
    fn scale_dims(self, [d0, d1, h, d]: [usize; 4]) -> [usize; 4] {
        match self {
            Int8::Tensor => [1, 1, 1, 1],
            Int8::Token => [d0, d1, h, 1],
            Int8::Channel => [1, 1, h, d],
        }
    }
}

impl PoolLayout {
    fn layout(self) -> Layout {
        match self {
            PoolLayout::Bshd => Layout::BSHD,
            PoolLayout::Bhsd => Layout::BHSD,
        }
    }

    /// The view of `buf` (laid out by [`PoolLayout::layout`]) through the crate's constructor.
    fn tensor<T: KvElement>(self, buf: &Buffer<T>) -> Tensor<'_, T> {
        let [n, s, h, d] = buf.dims;
        let t = match self {
            PoolLayout::Bshd => Tensor::bshd(&buf.data, buf.dims),
            PoolLayout::Bhsd => Tensor::bhsd(&buf.data, [n, h, s, d]),
        }
        .expect("a contiguous view of its own buffer");
        assert_eq!(t.dims(), buf.dims);
        if !buf.dims.contains(&0) {
            assert_eq!(t.strides(), buf.strides, "{self:?} strides");
        }
        t
    }
}

/// One sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpec {
    /// Its query rows in the packed calls.
    pub q_len: usize,
    /// Its key length (`kv_lens[b]` when key lengths are given): within the paged capacity
    /// `pages_per_seq · page_size` mostly, 1–3 beyond it sometimes.
    pub kv_len: usize,
    /// Packed keys past `kv_len`: the packed sequence has `kv_len + k_extra` rows.
    pub k_extra: usize,
}

impl SeqSpec {
    fn decode(u: &mut Unstructured<'_>, cap: usize) -> Result<SeqSpec> {
        let q_len = urange_from(u, 0, MAX_Q, 1)?;
        let kv_len = if urange(u, 0, 15)? >= 14 {
            cap + urange(u, 1, 3)?
        } else {
            urange_from(u, 0, cap, cap)?
        };
        Ok(SeqSpec {
            q_len,
            kv_len,
            k_extra: pick(u, &K_EXTRA)?,
        })
    }

    fn encode(&self, w: &mut Writer, cap: usize) {
        write_urange_from(w, self.q_len, 0, MAX_Q, 1);
        if self.kv_len <= cap {
            w.urange(0, 0, 15);
            write_urange_from(w, self.kv_len, 0, cap, cap);
        } else {
            w.urange(14, 0, 15).urange(self.kv_len - cap, 1, 3);
        }
        w.pick(self.k_extra, &K_EXTRA);
    }
}

/// A table entry replaced by a page that is not in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFault {
    /// The entry (modulo the table length).
    pub pos: u8,
    /// 0–3: `num_pages + bad`; 4: `u32::MAX`; 5: `2³¹`.
    pub bad: u8,
}

impl TableFault {
    fn page(&self, num_pages: usize) -> u32 {
        match self.bad {
            0..=3 => (num_pages + usize::from(self.bad)) as u32,
            4 => u32::MAX,
            _ => 1 << 31,
        }
    }
}

/// How offsets (`cu_seqlens_q` or `cu_seqlens_k`) are broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CuFaultKind {
    /// Offset `1 + at % (len − 1)` one below the previous one (wrapping: 0 − 1 = `usize::MAX`).
    Decrease,
    /// The last offset `1 + at % 3` larger (saturating; still valid where the tail gap has room).
    PastEnd,
    /// The last offset removed (one sequence fewer).
    Pop,
    /// The last offset repeated (an empty sequence more).
    Push,
    /// Offset `at % len` set to `usize::MAX`.
    Huge,
    /// No offsets at all.
    Empty,
}

const CU_FAULT_KINDS: [CuFaultKind; 6] = [
    CuFaultKind::Decrease,
    CuFaultKind::PastEnd,
    CuFaultKind::Pop,
    CuFaultKind::Push,
    CuFaultKind::Huge,
    CuFaultKind::Empty,
];

/// A broken offset array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuFault {
    /// `cu_seqlens_k` (else `cu_seqlens_q`).
    pub on_k: bool,
    /// How.
    pub kind: CuFaultKind,
    /// Where / how much.
    pub at: u8,
}

impl CuFault {
    fn apply(&self, cu: &mut Vec<usize>) {
        let at = usize::from(self.at);
        match self.kind {
            CuFaultKind::Decrease => {
                if cu.len() >= 2 {
                    let i = 1 + at % (cu.len() - 1);
                    cu[i] = cu[i - 1].wrapping_sub(1);
                }
            }
            CuFaultKind::PastEnd => {
                if let Some(last) = cu.last_mut() {
                    *last = last.saturating_add(1 + at % 3);
                }
            }
            CuFaultKind::Pop => {
                cu.pop();
            }
            CuFaultKind::Push => cu.push(cu.last().copied().unwrap_or(0)),
            CuFaultKind::Huge => {
                if !cu.is_empty() {
                    let i = at % cu.len();
                    cu[i] = usize::MAX;
                }
            }
            CuFaultKind::Empty => cu.clear(),
        }
    }
}

/// A broken operand of the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The packed Q's batch dim is 0, 2 or 3.
    QBatch,
    /// The packed output's batch dim is 0, 2 or 3.
    OutBatch,
    /// The packed K's batch dim is 0, 2 or 3.
    KBatch,
    /// Q's head size one larger than the keys' (both Q views).
    QHeadSize,
    /// Q has one more head than the output (both Q views).
    QHeads,
    /// Output dim `at % 4` one larger (both outputs).
    OutDim,
    /// V pool dim `at % 4` one larger.
    VPoolDim,
    /// Packed V dim `at % 4` one larger.
    PackedVDim,
    /// Pages of 0 tokens (both pools).
    PageSizeZero,
    /// Head size 0 in Q and K.
    ZeroHeadDim,
    /// LSE slices one longer (`at` even) or shorter.
    LseLen,
    /// One key length too many.
    KvLensLen,
    /// One ALiBi slope too few.
    SlopesLen,
    /// One sink too many.
    SinksLen,
}

const FAULT_KINDS: [FaultKind; 14] = [
    FaultKind::QBatch,
    FaultKind::OutBatch,
    FaultKind::KBatch,
    FaultKind::QHeadSize,
    FaultKind::QHeads,
    FaultKind::OutDim,
    FaultKind::VPoolDim,
    FaultKind::PackedVDim,
    FaultKind::PageSizeZero,
    FaultKind::ZeroHeadDim,
    FaultKind::LseLen,
    FaultKind::KvLensLen,
    FaultKind::SlopesLen,
    FaultKind::SinksLen,
];

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// A parameter.
    pub at: u8,
}

/// The options, as raw selectors (each read always, so exhausted input means "absent").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptsSpec {
    /// The alignment options use mostly: top-left (else bottom-right).
    pub top_left: bool,
    /// 0–23 default scale; 24–29 one of [`SCALES`]; 30 NaN; 31 +∞.
    pub scale: u8,
    /// 0–3 none; 4–6 causal with the main alignment; 7 with the other one.
    pub causal: u8,
    /// 0–4 none; 5–6 a window with the main alignment; 7 with the other one.
    pub window: u8,
    /// Window sides: 0–25 that many keys; 26–31 `usize::MAX` or `usize::MAX − 1` (unbounded).
    pub left: u8,
    /// See `left`.
    pub right: u8,
    /// 0–11 none; 12–14 one of [`SOFTCAPS`]; 15 an invalid one, [`BAD_SOFTCAPS`]`[bad_softcap]`.
    pub softcap: u8,
    /// Index into [`BAD_SOFTCAPS`].
    pub bad_softcap: u8,
    /// 0–5 none; 6–7 sinks, from [`SINKS`] by `sink_seed`.
    pub sinks: u8,
    /// Which sinks.
    pub sink_seed: u8,
    /// 0–4 none; 5–6 ALiBi (`alibi_slopes(H)`) with the main alignment; 7 with the other one.
    pub alibi: u8,
}

/// Explicit scales.
pub const SCALES: [f32; 6] = [0.125, 2.0, -0.5, 0.0, 1e3, 1e-3];
/// Valid softcaps.
pub const SOFTCAPS: [f32; 3] = [0.5, 1.5, 30.0];
/// Invalid softcaps.
pub const BAD_SOFTCAPS: [f32; 5] = [0.0, -1.0, f32::NAN, 1e-40, f32::INFINITY];
/// Sink logits (−∞: no sink for that head).
pub const SINKS: [f32; 5] = [f32::NEG_INFINITY, -3.0, 0.0, 1.5, 20.0];

impl OptsSpec {
    fn decode(u: &mut Unstructured<'_>) -> Result<OptsSpec> {
        Ok(OptsSpec {
            top_left: urange(u, 0, 1)? == 1,
            scale: urange(u, 0, 31)? as u8,
            causal: urange(u, 0, 7)? as u8,
            window: urange(u, 0, 7)? as u8,
            left: urange(u, 0, 31)? as u8,
            right: urange(u, 0, 31)? as u8,
            softcap: urange(u, 0, 15)? as u8,
            bad_softcap: urange(u, 0, 4)? as u8,
            sinks: urange(u, 0, 7)? as u8,
            sink_seed: uint(u, 1)? as u8,
            alibi: urange(u, 0, 7)? as u8,
        })
    }

    fn encode(&self, w: &mut Writer) {
        w.urange(self.top_left.into(), 0, 1)
            .urange(self.scale.into(), 0, 31)
            .urange(self.causal.into(), 0, 7)
            .urange(self.window.into(), 0, 7)
            .urange(self.left.into(), 0, 31)
            .urange(self.right.into(), 0, 31)
            .urange(self.softcap.into(), 0, 15)
            .urange(self.bad_softcap.into(), 0, 4)
            .urange(self.sinks.into(), 0, 7)
            .uint(self.sink_seed.into(), 1)
            .urange(self.alibi.into(), 0, 7);
    }

    fn main(&self) -> Alignment {
        if self.top_left {
            Alignment::TopLeft
        } else {
            Alignment::BottomRight
        }
    }

    fn other(&self) -> Alignment {
        if self.top_left {
            Alignment::BottomRight
        } else {
            Alignment::TopLeft
        }
    }

    /// The explicit scale.
    pub fn scale(&self) -> Option<f32> {
        match self.scale {
            0..=23 => None,
            24..=29 => Some(SCALES[usize::from(self.scale - 24)]),
            30 => Some(f32::NAN),
            _ => Some(f32::INFINITY),
        }
    }

    /// The causal alignment.
    pub fn causal(&self) -> Option<Alignment> {
        match self.causal {
            0..=3 => None,
            4..=6 => Some(self.main()),
            _ => Some(self.other()),
        }
    }

    /// `(left, right, alignment)` of the window.
    pub fn window(&self) -> Option<(usize, usize, Alignment)> {
        let side = |x: u8| match x {
            0..=25 => usize::from(x),
            _ => usize::MAX - usize::from(x % 2),
        };
        let a = match self.window {
            0..=4 => return None,
            5 | 6 => self.main(),
            _ => self.other(),
        };
        Some((side(self.left), side(self.right), a))
    }

    /// The softcap.
    pub fn softcap(&self) -> Option<f32> {
        match self.softcap {
            0..=11 => None,
            12..=14 => Some(SOFTCAPS[usize::from(self.softcap - 12)]),
            _ => Some(BAD_SOFTCAPS[usize::from(self.bad_softcap) % BAD_SOFTCAPS.len()]),
        }
    }

    /// `heads` sink logits.
    pub fn sinks(&self, heads: usize) -> Option<Vec<f32>> {
        (self.sinks >= 6).then(|| {
            (0..heads)
                .map(|h| SINKS[(usize::from(self.sink_seed) + 3 * h) % SINKS.len()])
                .collect()
        })
    }

    /// The ALiBi alignment.
    pub fn alibi(&self) -> Option<Alignment> {
        match self.alibi {
            0..=4 => None,
            5 | 6 => Some(self.main()),
            _ => Some(self.other()),
        }
    }

    /// The alignments in use, `None` if they conflict (`Error::ConflictingAlignment`).
    pub fn alignment(&self) -> Option<Option<Alignment>> {
        let mut all = [self.causal(), self.window().map(|w| w.2), self.alibi()]
            .into_iter()
            .flatten();
        let first = all.next();
        match first {
            Some(a) if all.any(|b| b != a) => None,
            _ => Some(first),
        }
    }
}

/// One case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCacheCase {
    /// `B` (sequences).
    pub batch: usize,
    /// `H_kv`.
    pub kv_heads: usize,
    /// `H / H_kv`.
    pub group: usize,
    /// Q/K head size.
    pub d_k: usize,
    /// V head size.
    pub d_v: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Block-table columns.
    pub pages_per_seq: usize,
    /// Pages in the pool.
    pub num_pages: usize,
    /// Query rows per sequence of the paged call (dense Q `[B, n_q, H, d_k]`).
    pub n_q: usize,
    /// Layouts of the K and the V pool (and of the packed K and V).
    pub pools: [PoolLayout; 2],
    /// Layout of both Q views.
    pub q_layout: Layout,
    /// Layout of both outputs.
    pub out_layout: Layout,
    /// The sequences (`batch` of them).
    pub seqs: Vec<SeqSpec>,
    /// Key lengths passed as `Options::kv_lens` (else packed sequences have all their rows,
    /// and the paged calls must refuse: they require key lengths).
    pub kv_lens_given: bool,
    /// The block table, `batch · pages_per_seq` pages of the pool (0 if the pool is empty).
    pub table: Vec<u32>,
    /// 0–6 the right length; 7 one entry less; 8 one more; 9 a row less; 10 a row more.
    pub table_len: u8,
    /// Entries replaced by pages not in the pool.
    pub table_faults: Vec<TableFault>,
    /// Packed rows before the first and after the last sequence, in Q and in K/V.
    pub gaps: [usize; 4],
    /// Broken offsets.
    pub cu_faults: Vec<CuFault>,
    /// Broken operands.
    pub faults: Vec<Fault>,
    /// Whether the calls get an LSE slice.
    pub lse_given: bool,
    /// The options.
    pub opts: OptsSpec,
    /// Values of Q, K and V (`Dist::Wide`, whose values overflow the scores, is drawn as
    /// `Dist::Gauss`).
    pub fills: [Fill; 3],
    /// K/V slots no sequence reaches hold NaN.
    pub poison: bool,
    /// 8-bit K/V with scales of this granularity (else f32).
    pub int8: Option<Int8>,
}

impl KvCacheCase {
    /// Keys one sequence's pages hold.
    pub fn capacity(&self) -> usize {
        self.pages_per_seq * self.page_size
    }

    /// A valid case without options: sequences of `(q_len, kv_len)`, each in its own pages
    /// (pages `b · pages_per_seq ..` in order), `pages_per_seq` whole pages of `page_size`.
    pub fn plain(
        kv_heads: usize,
        group: usize,
        d: usize,
        page_size: usize,
        pages_per_seq: usize,
        seqs: &[(usize, usize)],
    ) -> KvCacheCase {
        let batch = seqs.len();
        let num_pages = (batch * pages_per_seq).clamp(1, MAX_PAGES);
        KvCacheCase {
            batch,
            kv_heads,
            group,
            d_k: d,
            d_v: d,
            page_size,
            pages_per_seq,
            num_pages,
            n_q: seqs.first().map_or(1, |s| s.0),
            pools: [PoolLayout::Bshd; 2],
            q_layout: Layout::BSHD,
            out_layout: Layout::BSHD,
            seqs: seqs
                .iter()
                .map(|&(q_len, kv_len)| SeqSpec {
                    q_len,
                    kv_len,
                    k_extra: 0,
                })
                .collect(),
            kv_lens_given: true,
            table: (0..batch * pages_per_seq)
                .map(|e| (e % num_pages) as u32)
                .collect(),
            table_len: 0,
            table_faults: Vec::new(),
            gaps: [0; 4],
            cu_faults: Vec::new(),
            faults: Vec::new(),
            lse_given: true,
            opts: OptsSpec::default(),
            fills: [Fill::unit(1), Fill::unit(2), Fill::unit(3)],
            poison: false,
            int8: None,
        }
    }

    /// Reads a case.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<KvCacheCase> {
        let batch = pick(u, &BATCHES)?;
        let kv_heads = urange_from(u, 1, MAX_KV_HEADS, 1)?;
        let group = urange_from(u, 1, MAX_GROUP, 1)?;
        let d_k = urange_from(u, 1, MAX_D, 8)?;
        let d_v = if urange(u, 0, 3)? == 3 {
            urange_from(u, 1, MAX_D, 8)?
        } else {
            d_k
        };
        let page_size = urange_from(u, 1, MAX_PAGE_SIZE, 4)?;
        let pages_per_seq = urange_from(u, 0, MAX_PAGES_PER_SEQ, 2)?;
        let num_pages = urange_from(u, 0, MAX_PAGES, 8)?;
        let n_q = urange_from(u, 0, MAX_Q, 1)?;
        let pools = [pick(u, &POOL_LAYOUTS)?, pick(u, &POOL_LAYOUTS)?];
        let q_layout = Layout::decode(u)?;
        let out_layout = Layout::decode(u)?;
        let cap = pages_per_seq * page_size;
        let seqs = (0..batch)
            .map(|_| SeqSpec::decode(u, cap))
            .collect::<Result<_>>()?;
        let kv_lens_given = urange(u, 0, 3)? != 3;
        let table = (0..batch * pages_per_seq)
            .map(|_| Ok(urange(u, 0, num_pages.saturating_sub(1))? as u32))
            .collect::<Result<_>>()?;
        let table_len = urange(u, 0, 10)? as u8;
        let table_faults = (0..pick(u, &COUNTS)?)
            .map(|_| {
                Ok(TableFault {
                    pos: uint(u, 1)? as u8,
                    bad: urange(u, 0, 5)? as u8,
                })
            })
            .collect::<Result<_>>()?;
        let mut gaps = [0; 4];
        for g in &mut gaps {
            *g = pick(u, &GAPS)?;
        }
        let cu_faults = (0..pick(u, &COUNTS)?)
            .map(|_| {
                Ok(CuFault {
                    on_k: urange(u, 0, 1)? == 1,
                    kind: pick(u, &CU_FAULT_KINDS)?,
                    at: uint(u, 1)? as u8,
                })
            })
            .collect::<Result<_>>()?;
        let faults = (0..pick(u, &COUNTS)?)
            .map(|_| {
                Ok(Fault {
                    kind: pick(u, &FAULT_KINDS)?,
                    at: uint(u, 1)? as u8,
                })
            })
            .collect::<Result<_>>()?;
        let lse_given = urange(u, 0, 3)? != 3;
        let opts = OptsSpec::decode(u)?;
        let fills = [Fill::decode(u)?, Fill::decode(u)?, Fill::decode(u)?];
        let poison = urange(u, 0, 1)? == 1;
        let int8 = match uint(u, 1)? {
            x if x >= INT8_FROM => Some(INT8[(x - INT8_FROM) as usize % INT8.len()]),
            _ => None,
        };
        Ok(KvCacheCase {
            batch,
            kv_heads,
            group,
            d_k,
            d_v,
            page_size,
            pages_per_seq,
            num_pages,
            n_q,
            pools,
            q_layout,
            out_layout,
            seqs,
            kv_lens_given,
            table,
            table_len,
            table_faults,
            gaps,
            cu_faults,
            faults,
            lse_given,
            opts,
            fills,
            poison,
            int8,
        })
    }

    /// Inverse of [`KvCacheCase::decode`] (panics on a case `decode` cannot produce).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.pick(self.batch, &BATCHES);
        write_urange_from(&mut w, self.kv_heads, 1, MAX_KV_HEADS, 1);
        write_urange_from(&mut w, self.group, 1, MAX_GROUP, 1);
        write_urange_from(&mut w, self.d_k, 1, MAX_D, 8);
        if self.d_v == self.d_k {
            w.urange(0, 0, 3);
        } else {
            w.urange(3, 0, 3);
            write_urange_from(&mut w, self.d_v, 1, MAX_D, 8);
        }
        write_urange_from(&mut w, self.page_size, 1, MAX_PAGE_SIZE, 4);
        write_urange_from(&mut w, self.pages_per_seq, 0, MAX_PAGES_PER_SEQ, 2);
        write_urange_from(&mut w, self.num_pages, 0, MAX_PAGES, 8);
        write_urange_from(&mut w, self.n_q, 0, MAX_Q, 1);
        for p in self.pools {
            w.pick(p, &POOL_LAYOUTS);
        }
        self.q_layout.encode(&mut w);
        self.out_layout.encode(&mut w);
        assert_eq!(self.seqs.len(), self.batch, "one SeqSpec per sequence");
        for s in &self.seqs {
            s.encode(&mut w, self.capacity());
        }
        w.urange(if self.kv_lens_given { 0 } else { 3 }, 0, 3);
        assert_eq!(self.table.len(), self.batch * self.pages_per_seq, "table");
        for &e in &self.table {
            w.urange(e as usize, 0, self.num_pages.saturating_sub(1));
        }
        w.urange(self.table_len.into(), 0, 10);
        w.pick(self.table_faults.len(), &COUNTS);
        for f in &self.table_faults {
            w.uint(f.pos.into(), 1).urange(f.bad.into(), 0, 5);
        }
        for &g in &self.gaps {
            w.pick(g, &GAPS);
        }
        w.pick(self.cu_faults.len(), &COUNTS);
        for f in &self.cu_faults {
            w.urange(f.on_k.into(), 0, 1)
                .pick(f.kind, &CU_FAULT_KINDS)
                .uint(f.at.into(), 1);
        }
        w.pick(self.faults.len(), &COUNTS);
        for f in &self.faults {
            w.pick(f.kind, &FAULT_KINDS).uint(f.at.into(), 1);
        }
        w.urange(if self.lse_given { 0 } else { 3 }, 0, 3);
        self.opts.encode(&mut w);
        for f in &self.fills {
            f.encode(&mut w);
        }
        w.urange(self.poison.into(), 0, 1);
        // f32 writes nothing: it is what an input that ends here decodes to.
        if let Some(g) = self.int8 {
            let i = INT8.iter().position(|&x| x == g).expect("in INT8");
            w.uint(INT8_FROM + i as u64, 1);
        }
        w.bytes
    }
}

impl<'a> Arbitrary<'a> for KvCacheCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        KvCacheCase::decode(u)
    }
}

/// Everything the calls get, faults applied.
#[derive(Debug, Clone)]
struct Plan {
    /// `H = H_kv · group`, the heads the per-head option data is made for.
    heads: usize,
    /// Dense Q of the paged call, its output.
    q_paged: [usize; 4],
    out_paged: [usize; 4],
    /// Packed Q of the varlen calls, its output.
    q_varlen: [usize; 4],
    out_varlen: [usize; 4],
    /// Page pools.
    k_pool: [usize; 4],
    v_pool: [usize; 4],
    /// Packed K and V.
    k_packed: [usize; 4],
    v_packed: [usize; 4],
    table: Vec<u32>,
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    kv_lens: Option<Vec<usize>>,
    lse_paged: Option<usize>,
    lse_varlen: Option<usize>,
    slopes: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
}

fn offsets(first: usize, lens: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut cu = vec![first];
    for l in lens {
        cu.push(cu.last().expect("non-empty") + l);
    }
    cu
}

impl Plan {
    fn new(case: &KvCacheCase) -> Plan {
        let heads = case.kv_heads * case.group;
        let (b, pps, np) = (case.batch, case.pages_per_seq, case.num_pages);
        let [q_lead, q_tail, k_lead, k_tail] = case.gaps;
        let mut cu_q = offsets(q_lead, case.seqs.iter().map(|s| s.q_len));
        let mut cu_k = offsets(k_lead, case.seqs.iter().map(|s| s.kv_len + s.k_extra));
        let total_q = cu_q.last().expect("non-empty") + q_tail;
        let total_k = cu_k.last().expect("non-empty") + k_tail;
        let (mut q_batch, mut q_heads, mut q_dk) = (1, heads, case.d_k);
        let mut out_paged = [b, case.n_q, heads, case.d_v];
        let mut out_varlen = [1, total_q, heads, case.d_v];
        let mut k_pool = [np, case.page_size, case.kv_heads, case.d_k];
        let mut v_pool = [np, case.page_size, case.kv_heads, case.d_v];
        let mut k_packed = [1, total_k, case.kv_heads, case.d_k];
        let mut v_packed = [1, total_k, case.kv_heads, case.d_v];
        let mut kv_lens = case
            .kv_lens_given
            .then(|| case.seqs.iter().map(|s| s.kv_len).collect::<Vec<_>>());
        let mut slopes = case
            .opts
            .alibi()
            .map(|_| super::alibi_slopes(heads).expect("slopes for a few heads"));
        let mut sinks = case.opts.sinks(heads);
        let mut lse_delta: Option<bool> = None;
        for f in &case.faults {
            let at = usize::from(f.at);
            let bad_batch = BAD_BATCH[at % BAD_BATCH.len()];
            match f.kind {
                FaultKind::QBatch => q_batch = bad_batch,
                FaultKind::OutBatch => out_varlen[0] = bad_batch,
                FaultKind::KBatch => k_packed[0] = bad_batch,
                FaultKind::QHeadSize => q_dk += 1,
                FaultKind::QHeads => q_heads += 1,
                FaultKind::OutDim => {
                    out_paged[at % 4] += 1;
                    out_varlen[at % 4] += 1;
                }
                FaultKind::VPoolDim => v_pool[at % 4] += 1,
                FaultKind::PackedVDim => v_packed[at % 4] += 1,
                FaultKind::PageSizeZero => {
                    k_pool[1] = 0;
                    v_pool[1] = 0;
                }
                FaultKind::ZeroHeadDim => {
                    q_dk = 0;
                    k_pool[3] = 0;
                    k_packed[3] = 0;
                }
                FaultKind::LseLen => lse_delta = Some(at % 2 == 0),
                FaultKind::KvLensLen => {
                    if let Some(l) = &mut kv_lens {
                        l.push(0);
                    }
                }
                FaultKind::SlopesLen => {
                    if let Some(s) = &mut slopes {
                        s.pop();
                    }
                }
                FaultKind::SinksLen => {
                    if let Some(s) = &mut sinks {
                        s.push(0.0);
                    }
                }
            }
        }
        let q_paged = [b, case.n_q, q_heads, q_dk];
        let q_varlen = [q_batch, total_q, q_heads, q_dk];
        let lse = |want: usize| {
            case.lse_given.then(|| match lse_delta {
                None => want,
                Some(true) => want + 1,
                Some(false) if want == 0 => 1,
                Some(false) => want - 1,
            })
        };
        let mut table = case.table.clone();
        for f in &case.table_faults {
            if !table.is_empty() {
                let pos = usize::from(f.pos) % table.len();
                table[pos] = f.page(np);
            }
        }
        match case.table_len {
            0..=6 => {}
            7 => {
                table.pop();
            }
            8 => table.push(0),
            9 => table.truncate(table.len().saturating_sub(pps.max(1))),
            _ => table.extend(std::iter::repeat_n(0, pps.max(1))),
        }
        for f in &case.cu_faults {
            f.apply(if f.on_k { &mut cu_k } else { &mut cu_q });
        }
        Plan {
            heads,
            q_paged,
            out_paged,
            q_varlen,
            out_varlen,
            k_pool,
            v_pool,
            k_packed,
            v_packed,
            table,
            cu_q,
            cu_k,
            kv_lens,
            lse_paged: lse(b * q_heads * case.n_q),
            lse_varlen: lse(q_heads * total_q),
            slopes,
            sinks,
        }
    }

    /// The case's options; with the key lengths if `with_kv_lens` (and they are given).
    fn options(&self, spec: &OptsSpec, with_kv_lens: bool) -> Options<'_> {
        let mut o = Options::new();
        if let Some(s) = spec.scale() {
            o = o.scale(s);
        }
        if let Some(a) = spec.causal() {
            o = o.causal(a);
        }
        if let Some((left, right, a)) = spec.window() {
            o = o.sliding_window(left, right, a);
        }
        if let Some(c) = spec.softcap() {
            o = o.softcap(c);
        }
        if let Some(s) = &self.sinks {
            o = o.sinks(s);
        }
        if let (Some(s), Some(a)) = (&self.slopes, spec.alibi()) {
            o = o.alibi(s, a);
        }
        match &self.kv_lens {
            Some(l) if with_kv_lens => o.kv_lens(l),
            _ => o,
        }
    }

    /// Key length of sequence `b` of a paged call with capacity `cap`: `None` where the key
    /// lengths are missing or invalid (the call fails on them first).
    fn paged_kv_len(&self, b: usize, batch: usize, cap: usize) -> Option<usize> {
        match &self.kv_lens {
            Some(l) if l.len() == batch && l[b] <= cap => Some(l[b]),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model of the documented errors.

fn shape_errors(errors: &mut Vec<Error>, operand: Operand, got: [usize; 4], want: [usize; 4]) {
    for ((&g, &w), dim) in got.iter().zip(&want).zip(Dim::ALL) {
        if g != w {
            errors.push(Error::ShapeMismatch {
                operand,
                dim,
                expected: w,
                got: g,
            });
        }
    }
}

fn invalid(operand: Operand, index: usize) -> Error {
    Error::InvalidValue {
        operand,
        index,
        reason: "",
    }
}

/// Offsets must be non-empty, non-decreasing, and end at most at `total`. Returns whether they
/// are.
fn offset_errors(errors: &mut Vec<Error>, cu: &[usize], total: usize, operand: Operand) -> bool {
    if cu.is_empty() {
        errors.push(Error::LengthMismatch {
            operand,
            expected: 1,
            got: 0,
        });
        return false;
    }
    let before = errors.len();
    for (i, pair) in cu.windows(2).enumerate() {
        if pair[1] < pair[0] {
            errors.push(invalid(operand, i + 1));
        }
    }
    if cu[cu.len() - 1] > total {
        errors.push(invalid(operand, cu.len() - 1));
    }
    errors.len() == before
}

/// What `PagedKv::new` refuses: pools that disagree in pages, page size or heads, a page size
/// of 0, a table that is not whole rows.
fn ctor_errors(plan: &Plan, pages_per_seq: usize) -> Vec<Error> {
    let mut errors = Vec::new();
    let (k, v) = (plan.k_pool, plan.v_pool);
    for (d, dim) in Dim::ALL.into_iter().enumerate().take(3) {
        if v[d] != k[d] {
            errors.push(Error::ShapeMismatch {
                operand: Operand::Value,
                dim,
                expected: k[d],
                got: v[d],
            });
        }
    }
    if k[1] == 0 {
        errors.push(invalid(Operand::BlockTable, 0));
    }
    let whole_rows = match pages_per_seq {
        0 => plan.table.is_empty(),
        n => plan.table.len().is_multiple_of(n),
    };
    if !whole_rows {
        errors.push(invalid(Operand::BlockTable, plan.table.len()));
    }
    errors
}

/// The rules every call shares: heads, head size, LSE length, scale, alignments, key lengths
/// (`capacity(b)`: sequence `b`'s keys, `None` where unknown because its offsets are broken),
/// per-head slices, softcap.
struct Common<'a> {
    heads: usize,
    kv_heads: usize,
    d_k: usize,
    /// (length given, length wanted).
    lse: Option<(usize, usize)>,
    batch: usize,
    capacity: &'a dyn Fn(usize) -> Option<usize>,
}

fn common_errors(errors: &mut Vec<Error>, c: &Common<'_>, plan: &Plan, spec: &OptsSpec) {
    let Common {
        heads,
        kv_heads,
        d_k,
        batch,
        ..
    } = *c;
    if kv_heads == 0 || heads == 0 || heads % kv_heads != 0 {
        errors.push(Error::HeadsNotDivisible { heads, kv_heads });
    }
    if d_k == 0 {
        errors.push(Error::ZeroHeadDim);
    }
    if let Some((got, expected)) = c.lse {
        if got != expected {
            errors.push(Error::LengthMismatch {
                operand: Operand::Lse,
                expected,
                got,
            });
        }
    }
    let scale = spec.scale().unwrap_or(1.0 / (d_k as f32).sqrt());
    if !scale.is_finite() {
        errors.push(Error::InvalidScale(scale));
    }
    if spec.alignment().is_none() {
        errors.push(Error::ConflictingAlignment);
    }
    if let Some(lens) = &plan.kv_lens {
        if lens.len() != batch {
            errors.push(Error::LengthMismatch {
                operand: Operand::KvLens,
                expected: batch,
                got: lens.len(),
            });
        } else {
            for (b, &l) in lens.iter().enumerate() {
                if (c.capacity)(b).is_some_and(|cap| l > cap) {
                    errors.push(invalid(Operand::KvLens, b));
                }
            }
        }
    }
    for (operand, s) in [
        (Operand::AlibiSlopes, &plan.slopes),
        (Operand::Sinks, &plan.sinks),
    ] {
        if let Some(s) = s {
            if s.len() != heads {
                errors.push(Error::LengthMismatch {
                    operand,
                    expected: heads,
                    got: s.len(),
                });
            }
        }
    }
    if let Some(cap) = spec.softcap() {
        if !(cap >= f32::MIN_POSITIVE && (cap * std::f32::consts::LOG2_E).is_finite()) {
            errors.push(Error::InvalidSoftcap(cap));
        }
    }
}

/// Paged calls require key lengths (a padded table row is no length), and every table entry a
/// sequence's key length reaches must be a page of the pool (entries past it are not read).
fn page_errors(errors: &mut Vec<Error>, plan: &Plan, pages_per_seq: usize, batch: usize) {
    if plan.kv_lens.is_none() {
        errors.push(Error::LengthMismatch {
            operand: Operand::KvLens,
            expected: batch,
            got: 0,
        });
    }
    let [pages, page_size, ..] = plan.k_pool;
    if page_size == 0 || plan.table.len() != batch * pages_per_seq {
        return; // refused before (PagedKv::new, the table length)
    }
    let cap = pages_per_seq * page_size;
    for b in 0..batch {
        let Some(len) = plan.paged_kv_len(b, batch, cap) else {
            continue; // refused before (the key lengths)
        };
        let row = &plan.table[b * pages_per_seq..][..len.div_ceil(page_size)];
        for (p, &page) in row.iter().enumerate() {
            if page as usize >= pages {
                errors.push(invalid(Operand::BlockTable, b * pages_per_seq + p));
            }
        }
    }
}

/// What `attention_paged` must refuse (its `PagedKv` was accepted).
fn paged_errors(plan: &Plan, case: &KvCacheCase) -> Vec<Error> {
    let mut errors = Vec::new();
    let [batch, n_q, heads, d_q] = plan.q_paged;
    let [_, page_size, kv_heads, d_kk] = plan.k_pool;
    let d_v = plan.v_pool[3];
    let pps = case.pages_per_seq;
    shape_errors(
        &mut errors,
        Operand::Key,
        [batch, 0, kv_heads, d_kk],
        [batch, 0, kv_heads, d_q],
    );
    shape_errors(
        &mut errors,
        Operand::Output,
        plan.out_paged,
        [batch, n_q, heads, d_v],
    );
    if plan.table.len() != batch * pps {
        errors.push(Error::LengthMismatch {
            operand: Operand::BlockTable,
            expected: batch * pps,
            got: plan.table.len(),
        });
    }
    let cap = pps * page_size;
    let common = Common {
        heads,
        kv_heads,
        d_k: d_q,
        lse: plan.lse_paged.map(|l| (l, batch * heads * n_q)),
        batch,
        capacity: &|_| Some(cap),
    };
    common_errors(&mut errors, &common, plan, &case.opts);
    page_errors(&mut errors, plan, pps, batch);
    errors
}

/// What `attention_varlen` must refuse, K/V `packed` or paged (its `PagedKv` accepted).
fn varlen_errors(plan: &Plan, case: &KvCacheCase, packed: bool) -> Vec<Error> {
    let mut errors = Vec::new();
    let [q_batch, total_q, heads, d_q] = plan.q_varlen;
    if q_batch != 1 {
        errors.push(Error::ShapeMismatch {
            operand: Operand::Query,
            dim: Dim::Batch,
            expected: 1,
            got: q_batch,
        });
    }
    offset_errors(&mut errors, &plan.cu_q, total_q, Operand::CuSeqlensQ);
    let batch = plan.cu_q.len().saturating_sub(1);
    let pps = case.pages_per_seq;
    let (kv_heads, d_kk, d_v, packed_caps) = if packed {
        let [k_batch, total_k, kv_heads, d_kk] = plan.k_packed;
        let d_v = plan.v_packed[3];
        if k_batch != 1 {
            errors.push(Error::ShapeMismatch {
                operand: Operand::Key,
                dim: Dim::Batch,
                expected: 1,
                got: k_batch,
            });
        }
        shape_errors(
            &mut errors,
            Operand::Value,
            plan.v_packed,
            [1, total_k, kv_heads, d_v],
        );
        let len_ok = plan.cu_k.len() == batch + 1;
        if !len_ok {
            errors.push(Error::LengthMismatch {
                operand: Operand::CuSeqlensK,
                expected: batch + 1,
                got: plan.cu_k.len(),
            });
        }
        let ok = offset_errors(&mut errors, &plan.cu_k, total_k, Operand::CuSeqlensK);
        let caps = (len_ok && ok).then(|| plan.cu_k.windows(2).map(|p| p[1] - p[0]).collect());
        (kv_heads, d_kk, d_v, caps)
    } else {
        let [_, _, kv_heads, d_kk] = plan.k_pool;
        if plan.table.len() != batch * pps {
            errors.push(Error::LengthMismatch {
                operand: Operand::BlockTable,
                expected: batch * pps,
                got: plan.table.len(),
            });
        }
        (kv_heads, d_kk, plan.v_pool[3], None::<Vec<usize>>)
    };
    shape_errors(
        &mut errors,
        Operand::Key,
        [0, 0, kv_heads, d_kk],
        [0, 0, kv_heads, d_q],
    );
    shape_errors(
        &mut errors,
        Operand::Output,
        plan.out_varlen,
        [1, total_q, heads, d_v],
    );
    let paged_cap = pps * plan.k_pool[1];
    let capacity = |b: usize| match (packed, &packed_caps) {
        (true, Some(c)) => Some(c[b]),
        (true, None) => None,
        (false, _) => Some(paged_cap),
    };
    let common = Common {
        heads,
        kv_heads,
        d_k: d_q,
        lse: plan.lse_varlen.map(|l| (l, heads * total_q)),
        batch,
        capacity: &capacity,
    };
    common_errors(&mut errors, &common, plan, &case.opts);
    if !packed {
        page_errors(&mut errors, plan, pps, batch);
    }
    errors
}

// ---------------------------------------------------------------------------------------------
// Data.

/// The values of a fill, finite and in the documented ranges (`Dist::Wide` drawn as Gauss).
fn finite(fill: &Fill) -> Fill {
    match fill.dist {
        Dist::Wide => Fill {
            dist: Dist::Gauss,
            ..*fill
        },
        _ => *fill,
    }
}

/// A buffer of `dims` in `layout`, every logical element drawn from `fill` (salted).
fn filled(dims: [usize; 4], layout: &Layout, fill: &Fill, salt: u64) -> Buffer {
    let mut buf = Buffer::new(dims, layout, false, POISON);
    let mut sampler = finite(fill).sampler(salt);
    for i in indices(dims).collect::<Vec<_>>() {
        buf.set(i, sampler.next_value());
    }
    buf
}

/// Q (dense and packed), the pools and the packed K/V: f32, or i8 with `scales`.
struct Data<KV = f32> {
    q_paged: Buffer,
    q_varlen: Buffer,
    k_pool: Buffer<KV>,
    v_pool: Buffer<KV>,
    k_packed: Buffer<KV>,
    v_packed: Buffer<KV>,
    scales: Option<Scales>,
}

/// The scales of 8-bit K/V: of the pools (paged calls) and of the packed K/V.
struct Scales {
    k_pool: Buffer,
    v_pool: Buffer,
    k_packed: Buffer,
    v_packed: Buffer,
}

/// A K/V element type of the check, and what a gathered slot that no call reads holds.
trait Slot: KvElement {
    const UNREAD: Self;
}

impl Slot for f32 {
    const UNREAD: f32 = f32::from_bits(POISON);
}

impl Slot for i8 {
    const UNREAD: i8 = 0;
}

impl Data<f32> {
    /// The same case with 8-bit K/V: each view quantized with its own scales of granularity
    /// `g` (NaN, the poison, becomes 0).
    fn quantized(&self, g: Int8) -> Data<i8> {
        let q = |b: &Buffer| quantize_as(b, g.scale_dims(b.dims));
        let ((k_pool, ks_pool), (v_pool, vs_pool)) = (q(&self.k_pool), q(&self.v_pool));
        let ((k_packed, ks_packed), (v_packed, vs_packed)) = (q(&self.k_packed), q(&self.v_packed));
        Data {
            q_paged: self.q_paged.clone(),
            q_varlen: self.q_varlen.clone(),
            k_pool,
            v_pool,
            k_packed,
            v_packed,
            scales: Some(Scales {
                k_pool: ks_pool,
                v_pool: vs_pool,
                k_packed: ks_packed,
                v_packed: vs_packed,
            }),
        }
    }

    fn new(case: &KvCacheCase, plan: &Plan) -> Data {
        let [fq, fk, fv] = &case.fills;
        let [lk, lv] = case.pools.map(PoolLayout::layout);
        let mut data = Data {
            q_paged: filled(plan.q_paged, &case.q_layout, fq, 0),
            q_varlen: filled(plan.q_varlen, &case.q_layout, fq, 3),
            k_pool: filled(plan.k_pool, &lk, fk, 1),
            v_pool: filled(plan.v_pool, &lv, fv, 2),
            k_packed: filled(plan.k_packed, &lk, fk, 4),
            v_packed: filled(plan.v_packed, &lv, fv, 5),
            scales: None,
        };
        if case.poison {
            data.poison(case, plan);
        }
        data
    }

    /// NaN in every pool slot no sequence of either call reaches and every packed key row
    /// outside the sequences' key lengths.
    fn poison(&mut self, case: &KvCacheCase, plan: &Plan) {
        let [pages, page_size, ..] = plan.k_pool;
        let pps = case.pages_per_seq;
        let cap = pps * page_size;
        let mut reached = vec![false; pages * page_size];
        let sequences = case.batch.max(plan.cu_q.len().saturating_sub(1));
        for b in 0..sequences {
            let len = match &plan.kv_lens {
                Some(l) => l.get(b).copied().unwrap_or(cap),
                None => cap,
            };
            for j in 0..len.min(cap) {
                if let Some(&page) = plan.table.get(b * pps + j / page_size) {
                    if (page as usize) < pages {
                        reached[page as usize * page_size + j % page_size] = true;
                    }
                }
            }
        }
        for buf in [&mut self.k_pool, &mut self.v_pool] {
            if buf.dims[..2] != [pages, page_size] {
                continue; // refused by PagedKv::new
            }
            for i in indices(buf.dims).collect::<Vec<_>>() {
                if !reached[i[0] * page_size + i[1]] {
                    buf.set(i, f32::from_bits(POISON));
                }
            }
        }
        let total_k = plan.k_packed[1];
        let mut live = vec![false; total_k];
        for (b, pair) in plan.cu_k.windows(2).enumerate() {
            let (start, end) = (pair[0], pair[1]);
            if start > end || end > total_k {
                continue;
            }
            let len = match &plan.kv_lens {
                Some(l) => l.get(b).map_or(end - start, |&l| l.min(end - start)),
                None => end - start,
            };
            live[start..start + len].fill(true);
        }
        for buf in [&mut self.k_packed, &mut self.v_packed] {
            for i in indices(buf.dims).collect::<Vec<_>>() {
                if i[1] < total_k && !live[i[1]] {
                    buf.set(i, f32::from_bits(POISON));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The check.

/// Counts of what [`check`] reached, for the stable test.
#[derive(Debug, Default, Clone, Copy)]
pub struct KvStats {
    /// Cases.
    pub cases: usize,
    /// ... of them with 8-bit K/V.
    pub int8: usize,
    /// `PagedKv::new` refused the pools or table.
    pub ctor_rejected: usize,
    /// `attention_paged` calls that succeeded (and matched the dense call bitwise).
    pub paged_ok: usize,
    /// `attention_varlen` calls that succeeded, K/V packed.
    pub packed_ok: usize,
    /// ... K/V paged.
    pub varlen_paged_ok: usize,
    /// Calls refused with an expected error.
    pub rejected: usize,
    /// Sequences compared with the reference.
    pub sequences: usize,
    /// Rows within their bound.
    pub rows_in_bound: usize,
    /// Rows with no visible key (exactly 0, LSE −∞ or σ).
    pub rows_empty: usize,
}

impl KvStats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &KvStats) {
        self.cases += other.cases;
        self.int8 += other.int8;
        self.ctor_rejected += other.ctor_rejected;
        self.paged_ok += other.paged_ok;
        self.packed_ok += other.packed_ok;
        self.varlen_paged_ok += other.varlen_paged_ok;
        self.rejected += other.rejected;
        self.sequences += other.sequences;
        self.rows_in_bound += other.rows_in_bound;
        self.rows_empty += other.rows_empty;
    }
}

fn sentinel(n: usize) -> Vec<f32> {
    vec![f32::from_bits(SENTINEL); n]
}

fn same_bits(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// A failed call wrote nothing.
fn assert_nothing_written(
    what: &str,
    r: &std::result::Result<(), Error>,
    out: &Buffer,
    lse: &[f32],
) {
    assert!(
        out.data.iter().chain(lse).all(|x| x.to_bits() == SENTINEL),
        "{what}: failed with {r:?} but wrote output or LSE"
    );
}

/// Runs and checks one case; panics with a description on any violation.
pub fn check(case: &KvCacheCase) -> KvStats {
    let plan = Plan::new(case);
    let data = Data::new(case, &plan);
    match case.int8 {
        Some(g) => check_with(case, &plan, &data.quantized(g)),
        None => check_with(case, &plan, &data),
    }
}

/// A BSHD buffer of `[n0, n1]` rows of `src`'s heads and channels: at `[i, j]` the row
/// `[x, y]` (`src`'s first two indices) that `rows(i, j)` names, `unread` where it names none.
fn gather_rows<T: Copy>(
    src: &Buffer<T>,
    [n0, n1]: [usize; 2],
    unread: T,
    rows: impl Fn(usize, usize) -> Option<[usize; 2]>,
) -> Buffer<T> {
    let [_, _, heads, d] = src.dims;
    let mut buf = Buffer::filled([n0, n1, heads, d], &Layout::BSHD, false, unread);
    for [i, j, h, c] in indices(buf.dims).collect::<Vec<_>>() {
        if let Some([x, y]) = rows(i, j) {
            buf.set([i, j, h, c], src.at([x, y, h, c]));
        }
    }
    buf
}

/// [`gather_scales`] of K's and V's scales, if any.
fn gather_scale_pair(
    scales: Option<(&Buffer, &Buffer)>,
    n: [usize; 2],
    rows: impl Fn(usize, usize) -> Option<[usize; 2]> + Copy,
) -> Option<(Buffer, Buffer)> {
    scales.map(|(ks, vs)| (gather_scales(ks, n, rows), gather_scales(vs, n, rows)))
}

/// [`gather_rows`] of scales: those that vary along rows (per token) gathered (1 where no row
/// is named: never read), the others the same view.
fn gather_scales(
    scales: &Buffer,
    n: [usize; 2],
    rows: impl Fn(usize, usize) -> Option<[usize; 2]>,
) -> Buffer {
    if scales.dims[..2] == [1, 1] {
        scales.clone()
    } else {
        gather_rows(scales, n, 1.0, rows)
    }
}

/// [`check`] on the case's K/V as `KV`.
fn check_with<KV: Slot>(case: &KvCacheCase, plan: &Plan, data: &Data<KV>) -> KvStats {
    let mut stats = KvStats {
        cases: 1,
        int8: data.scales.is_some().into(),
        ..KvStats::default()
    };
    let k_pool = case.pools[0].tensor(&data.k_pool);
    let v_pool = case.pools[1].tensor(&data.v_pool);
    let paged = PagedKv::new(k_pool, v_pool, &plan.table, case.pages_per_seq);
    assert_one_of(
        "PagedKv::new",
        &paged.as_ref().map(|_| ()).map_err(Clone::clone),
        &ctor_errors(plan, case.pages_per_seq),
    );
    if let Ok(kv) = &paged {
        check_paged(case, plan, data, kv, &mut stats);
    } else {
        stats.ctor_rejected += 1;
    }
    let packed = PackedKv::new(
        case.pools[0].tensor(&data.k_packed),
        case.pools[1].tensor(&data.v_packed),
        &plan.cu_k,
    );
    check_varlen(case, plan, data, &VarlenKv::from(packed), &mut stats);
    if let Ok(kv) = paged {
        check_varlen(case, plan, data, &VarlenKv::from(kv), &mut stats);
    }
    stats
}

/// `attention_paged`: the model's answer, and on `Ok` bitwise the dense `attention_lse` on the
/// gathered keys.
fn check_paged<KV: Slot>(
    case: &KvCacheCase,
    plan: &Plan,
    data: &Data<KV>,
    kv: &PagedKv<'_, KV>,
    stats: &mut KvStats,
) {
    let errors = paged_errors(plan, case);
    let pool_scales = data.scales.as_ref().map(|s| (&s.k_pool, &s.v_pool));
    let opts = with_scales(plan.options(&case.opts, true), pool_scales);
    let q = data.q_paged.view();
    let mut out = Buffer::new(plan.out_paged, &case.out_layout, true, SENTINEL);
    let mut lse = plan.lse_paged.map(sentinel);
    let r = side_pool()
        .install(|| sdpa::attention_paged(&q, kv, &mut out.view_mut(), lse.as_deref_mut(), &opts));
    assert_one_of("attention_paged", &r, &errors);
    let lse = lse.unwrap_or_default();
    if r.is_err() {
        assert_nothing_written("attention_paged", &r, &out, &lse);
        stats.rejected += 1;
        return;
    }
    stats.paged_ok += 1;
    untouched_outside_view("attention_paged", &out);

    // The same keys, dense: slot j of sequence b is slot j % page_size of its table entry's
    // page (NaN where the entry is not a page: past the sequence's length, never read).
    let [batch, n_q, heads, _] = plan.q_paged;
    let [pages, page_size, ..] = plan.k_pool;
    let pps = case.pages_per_seq;
    let cap = pps * page_size;
    let slot = |b: usize, j: usize| {
        let page = plan.table[b * pps + j / page_size] as usize;
        (page < pages).then_some([page, j % page_size])
    };
    let gather = |pool: &Buffer<KV>| gather_rows(pool, [batch, cap], KV::UNREAD, slot);
    let (k, v) = (gather(&data.k_pool), gather(&data.v_pool));
    let dense_scales = gather_scale_pair(pool_scales, [batch, cap], slot);
    let opts = with_scales(plan.options(&case.opts, true), scale_refs(&dense_scales));
    let mut dense = Buffer::new(plan.out_paged, &case.out_layout, true, SENTINEL);
    let mut dense_lse = sentinel(batch * heads * n_q);
    sdpa::attention_lse(
        &q,
        &k.view(),
        &v.view(),
        &mut dense.view_mut(),
        &mut dense_lse,
        &opts,
    )
    .unwrap_or_else(|e| panic!("attention_lse refused the dense copy of a valid paged call: {e}"));
    for (i, (x, y)) in out.data.iter().zip(&dense.data).enumerate() {
        assert!(
            same_bits(*x, *y),
            "attention_paged differs from attention_lse on the gathered keys at output slice \
             element {i}: {x:e} vs {y:e}"
        );
    }
    assert!(
        out.logical().iter().all(|x| x.to_bits() != SENTINEL),
        "attention_paged left an output element unwritten"
    );
    if case.lse_given {
        for (i, (x, y)) in lse.iter().zip(&dense_lse).enumerate() {
            assert!(
                same_bits(*x, *y),
                "attention_paged lse[{i}] {x:e}, attention_lse on the gathered keys {y:e}"
            );
        }
    }
}

/// Whether row `i` of a sequence of `n_q` rows and `n_kv` keys sees a key under the case's
/// causal, window and length rules (the docs' definition).
fn sees_a_key(spec: &OptsSpec, i: usize, n_q: usize, n_kv: usize) -> bool {
    if n_kv == 0 {
        return false;
    }
    let off = match spec.alignment().flatten() {
        Some(Alignment::BottomRight) => n_kv as i128 - n_q as i128,
        _ => 0,
    };
    let center = i as i128 + off;
    let bounded = |x: usize| i64::try_from(x).is_ok().then_some(x as i128);
    let window = spec.window();
    let right = match (spec.causal(), window.and_then(|w| bounded(w.1))) {
        (Some(_), _) => Some(0),
        (None, r) => r,
    };
    let left = window.and_then(|w| bounded(w.0));
    let hi = right.map_or(n_kv as i128 - 1, |r| (center + r).min(n_kv as i128 - 1));
    let lo = left.map_or(0, |l| (center - l).max(0));
    lo <= hi
}

/// `attention_varlen` with `kv`: the model's answer, and on `Ok` every sequence against the
/// reference on that sequence alone.
fn check_varlen<KV: Slot>(
    case: &KvCacheCase,
    plan: &Plan,
    data: &Data<KV>,
    kv: &VarlenKv<'_, KV>,
    stats: &mut KvStats,
) {
    let packed = matches!(kv, VarlenKv::Packed(_));
    // What the call reads: the packed K/V or the pools, with their scales.
    let (what, k_src, v_src, scales) = match packed {
        true => (
            "attention_varlen (K/V packed)",
            &data.k_packed,
            &data.v_packed,
            data.scales.as_ref().map(|s| (&s.k_packed, &s.v_packed)),
        ),
        false => (
            "attention_varlen (K/V paged)",
            &data.k_pool,
            &data.v_pool,
            data.scales.as_ref().map(|s| (&s.k_pool, &s.v_pool)),
        ),
    };
    // Packed K/V carry their lengths in the offsets; key lengths on top of them too when given.
    let errors = varlen_errors(plan, case, packed);
    let opts = with_scales(plan.options(&case.opts, true), scales);
    let q = data.q_varlen.view();
    let mut out = Buffer::new(plan.out_varlen, &case.out_layout, true, SENTINEL);
    let mut lse = plan.lse_varlen.map(sentinel);
    let r = sdpa::attention_varlen(
        &q,
        &plan.cu_q,
        kv,
        &mut out.view_mut(),
        lse.as_deref_mut(),
        &opts,
    );
    assert_one_of(what, &r, &errors);
    let lse = lse.unwrap_or_default();
    if r.is_err() {
        assert_nothing_written(what, &r, &out, &lse);
        stats.rejected += 1;
        return;
    }
    if packed {
        stats.packed_ok += 1;
    } else {
        stats.varlen_paged_ok += 1;
    }
    untouched_outside_view(what, &out);
    let [_, total_q, heads, d_q] = plan.q_varlen;
    let cu = &plan.cu_q;
    let mut inside = vec![false; total_q];
    for pair in cu.windows(2) {
        inside[pair[0]..pair[1]].fill(true);
    }
    let d_v = plan.out_varlen[3];
    for t in (0..total_q).filter(|&t| !inside[t]) {
        for h in 0..heads {
            for c in 0..d_v {
                let x = out.at([0, t, h, c]);
                assert!(
                    x.to_bits() == SENTINEL,
                    "{what}: packed row {t} is in no sequence but was written ({x})"
                );
            }
            if case.lse_given {
                let x = lse[h * total_q + t];
                assert!(
                    x.to_bits() == SENTINEL,
                    "{what}: lse of packed row {t} (in no sequence) was written ({x})"
                );
            }
        }
    }

    for (b, pair) in cu.windows(2).enumerate() {
        let (first, n_q) = (pair[0], pair[1] - pair[0]);
        // The sequence's keys: where key j's row is, as the first two indices of the packed
        // K/V (`[0, row]`) or of the pools (`[page, slot]`).
        let keys: Vec<[usize; 2]> = match kv {
            VarlenKv::Packed(_) => {
                let (start, rows) = (plan.cu_k[b], plan.cu_k[b + 1] - plan.cu_k[b]);
                let n = plan.kv_lens.as_ref().map_or(rows, |l| l[b]);
                (start..start + n).map(|row| [0, row]).collect()
            }
            VarlenKv::Paged(_) => {
                let [_, page_size, ..] = plan.k_pool;
                let pps = case.pages_per_seq;
                let n = plan.kv_lens.as_ref().map_or(pps * page_size, |l| l[b]);
                (0..n)
                    .map(|j| [plan.table[b * pps + j / page_size] as usize, j % page_size])
                    .collect()
            }
        };
        let n_kv = keys.len();
        let row = |_: usize, j: usize| Some(keys[j]);
        let (k, v) = (
            gather_rows(k_src, [1, n_kv], KV::UNREAD, row),
            gather_rows(v_src, [1, n_kv], KV::UNREAD, row),
        );
        let alone_scales = gather_scale_pair(scales, [1, n_kv], row);
        let alone = with_scales(plan.options(&case.opts, false), scale_refs(&alone_scales));
        let mut qs = Buffer::new([1, n_q, heads, d_q], &Layout::BSHD, false, POISON);
        for [_, i, h, c] in indices(qs.dims).collect::<Vec<_>>() {
            qs.set([0, i, h, c], data.q_varlen.at([0, first + i, h, c]));
        }
        let out_dims = [1, n_q, heads, d_v];
        let mut reference = Buffer::new(out_dims, &Layout::BSHD, true, SENTINEL);
        let mut reference_lse = sentinel(heads * n_q);
        let label = format!("{what}, sequence {b} ({n_q} rows, {n_kv} keys)");
        sdpa::reference::attention_lse(
            &qs.view(),
            &k.view(),
            &v.view(),
            &mut reference.view_mut(),
            &mut reference_lse,
            &alone,
        )
        .unwrap_or_else(|e| panic!("{label}: the reference refused the sequence alone: {e}"));
        let bounds = sdpa::reference::error_bounds(&qs.view(), &k.view(), &v.view(), &alone)
            .unwrap_or_else(|e| panic!("{label}: error_bounds refused the sequence alone: {e}"));
        let fused_out: Vec<f32> = indices(out_dims)
            .map(|[_, i, h, c]| out.at([0, first + i, h, c]))
            .collect();
        // Without an LSE slice only the outputs are compared.
        let fused_lse: Vec<f32> = if case.lse_given {
            (0..heads)
                .flat_map(|h| (0..n_q).map(move |i| h * total_q + first + i))
                .map(|t| lse[t])
                .collect()
        } else {
            reference_lse.clone()
        };
        let fused = Outputs {
            dims: out_dims,
            out: fused_out,
            lse: fused_lse,
        };
        let reference = Outputs {
            dims: out_dims,
            out: reference.logical(),
            lse: reference_lse,
        };
        let sinks = plan.sinks.as_deref();
        let facts = |at: RowAt| RowFacts {
            empty: Some(!sees_a_key(&case.opts, at.i, n_q, n_kv)),
            sink: Some(sinks.map_or(f32::NEG_INFINITY, |s| s[at.h])),
            ..RowFacts::FINITE
        };
        let tally = check_against_reference(&fused, &reference, &bounds, facts, &label);
        stats.sequences += 1;
        stats.rows_in_bound += tally.rows_in_bound;
        stats.rows_empty += tally.rows_empty;
    }
}

/// The named seeds of `fuzz/corpus/kv_cache/`.
pub fn seeds() -> Vec<(&'static str, KvCacheCase)> {
    let with = |mut c: KvCacheCase, f: &dyn Fn(&mut KvCacheCase)| {
        f(&mut c);
        c
    };
    let fault = |kind, at| Fault { kind, at };
    let cu_fault = |on_k, kind, at| CuFault { on_k, kind, at };
    // Two sequences in pages of 4: prefill rows against a cache, decode rows against another.
    let base = KvCacheCase::plain(2, 2, 8, 4, 3, &[(3, 10), (1, 7)]);
    // Three sequences sharing a prefix page, pages shuffled, garbage past the lengths.
    let shared = with(
        KvCacheCase::plain(1, 3, 16, 3, 4, &[(2, 7), (4, 12), (1, 0)]),
        &|c| {
            c.num_pages = 9;
            c.table = vec![5, 2, 7, 0, 5, 2, 8, 1, 3, 6, 4, 0];
            c.table_faults = vec![
                TableFault { pos: 3, bad: 4 },  // past sequence 0's 7 keys: not read
                TableFault { pos: 11, bad: 0 }, // past sequence 2's 0 keys
            ];
            c.gaps = [1, 2, 2, 1];
            c.seqs[1].k_extra = 2;
            c.poison = true;
        },
    );
    // Pages of one token, three kv heads in GQA groups of 3, `d_v ≠ d_k`, the table reversed.
    let page_size_1_gqa = with(
        KvCacheCase::plain(3, 3, 5, 1, 6, &[(4, 6), (6, 2), (0, 5), (2, 0)]),
        &|c| {
            c.d_v = 11;
            c.num_pages = 12;
            c.table.reverse();
        },
    );
    let opts = |o: OptsSpec| move |c: &mut KvCacheCase| c.opts = o;
    vec![
        ("plain", base.clone()),
        ("shared-shuffled-pages", shared.clone()),
        (
            "bhsd-pools-poison",
            with(base.clone(), &|c| {
                c.pools = [PoolLayout::Bhsd; 2];
                c.poison = true;
                c.seqs[0].k_extra = 3;
            }),
        ),
        ("page-size-1-gqa", page_size_1_gqa.clone()),
        (
            "decode-rows-long-pages",
            with(
                KvCacheCase::plain(2, 1, 32, 20, 6, &[(1, 117), (1, 64)]),
                &|c| {
                    c.opts = OptsSpec {
                        causal: 4,
                        ..OptsSpec::default()
                    }
                },
            ),
        ),
        (
            "no-key-lengths",
            with(base.clone(), &|c| {
                c.kv_lens_given = false;
                c.lse_given = false;
            }),
        ),
        ("empty-batch", KvCacheCase::plain(1, 1, 4, 4, 2, &[])),
        (
            "zero-pages-per-sequence",
            KvCacheCase::plain(1, 2, 8, 4, 0, &[(3, 0), (2, 0)]),
        ),
        (
            "entry-past-pool-read",
            with(base.clone(), &|c| {
                c.table_faults = vec![TableFault { pos: 1, bad: 0 }];
            }),
        ),
        (
            "entry-past-pool-unread",
            with(base.clone(), &|c| {
                c.table_faults = vec![TableFault { pos: 5, bad: 5 }];
            }),
        ),
        ("table-one-short", with(base.clone(), &|c| c.table_len = 7)),
        ("table-row-long", with(base.clone(), &|c| c.table_len = 10)),
        (
            "key-length-past-capacity",
            with(base.clone(), &|c| c.seqs[1].kv_len = c.capacity() + 2),
        ),
        (
            "cu-q-decreasing",
            with(shared.clone(), &|c| {
                c.cu_faults = vec![cu_fault(false, CuFaultKind::Decrease, 1)];
            }),
        ),
        (
            "cu-q-past-end-in-tail",
            with(shared.clone(), &|c| {
                c.cu_faults = vec![cu_fault(false, CuFaultKind::PastEnd, 1)];
            }),
        ),
        (
            "cu-k-past-end",
            with(base.clone(), &|c| {
                c.cu_faults = vec![cu_fault(true, CuFaultKind::PastEnd, 0)];
            }),
        ),
        (
            "cu-k-one-more",
            with(base.clone(), &|c| {
                c.cu_faults = vec![cu_fault(true, CuFaultKind::Push, 0)];
            }),
        ),
        (
            "cu-q-empty",
            with(base.clone(), &|c| {
                c.cu_faults = vec![cu_fault(false, CuFaultKind::Empty, 0)];
            }),
        ),
        (
            "cu-q-huge",
            with(base.clone(), &|c| {
                c.cu_faults = vec![cu_fault(false, CuFaultKind::Huge, 2)];
            }),
        ),
        (
            "q-batch-2",
            with(base.clone(), &|c| {
                c.faults = vec![fault(FaultKind::QBatch, 1)];
            }),
        ),
        (
            "v-pool-page-size",
            with(base.clone(), &|c| {
                c.faults = vec![fault(FaultKind::VPoolDim, 1)];
            }),
        ),
        (
            "page-size-0",
            with(base.clone(), &|c| {
                c.faults = vec![fault(FaultKind::PageSizeZero, 0)];
            }),
        ),
        (
            "lse-short-head-size",
            with(base.clone(), &|c| {
                c.faults = vec![fault(FaultKind::LseLen, 1), fault(FaultKind::QHeadSize, 0)];
            }),
        ),
        (
            "causal-top-left-window",
            with(
                shared.clone(),
                &opts(OptsSpec {
                    top_left: true,
                    causal: 4,
                    window: 5,
                    left: 3,
                    ..OptsSpec::default()
                }),
            ),
        ),
        (
            "window-bottom-right",
            with(
                shared.clone(),
                &opts(OptsSpec {
                    window: 5,
                    left: 2,
                    right: 1,
                    ..OptsSpec::default()
                }),
            ),
        ),
        (
            "softcap-sinks-alibi",
            with(
                shared.clone(),
                &opts(OptsSpec {
                    scale: 25,
                    softcap: 13,
                    sinks: 6,
                    sink_seed: 1,
                    alibi: 5,
                    causal: 4,
                    ..OptsSpec::default()
                }),
            ),
        ),
        (
            "conflicting-alignment",
            with(
                base.clone(),
                &opts(OptsSpec {
                    causal: 4,
                    alibi: 7,
                    ..OptsSpec::default()
                }),
            ),
        ),
        (
            "int8-token-scales-shared-pages",
            with(shared.clone(), &|c| c.int8 = Some(Int8::Token)),
        ),
        (
            "int8-channel-scales-gqa-d-v",
            with(page_size_1_gqa.clone(), &|c| c.int8 = Some(Int8::Channel)),
        ),
        (
            "int8-tensor-scale-bhsd-poison",
            with(base.clone(), &|c| {
                c.pools = [PoolLayout::Bhsd; 2];
                c.poison = true;
                c.int8 = Some(Int8::Tensor);
            }),
        ),
        (
            "int8-decode-rows-token-scales",
            with(
                KvCacheCase::plain(2, 3, 32, 20, 6, &[(1, 117), (1, 64)]),
                &|c| c.int8 = Some(Int8::Token),
            ),
        ),
        (
            "invalid-softcap",
            with(
                base.clone(),
                &opts(OptsSpec {
                    softcap: 15,
                    bad_softcap: 3,
                    ..OptsSpec::default()
                }),
            ),
        ),
    ]
}
