//! What a work item is: its stacked rows ([`Item`]), what every item of a call reads
//! ([`Ctx`]), the tile geometry of one item ([`Tiles`]), how it reads 8-bit rows ([`IntRows`]),
//! and where the next key block's rows lie, for prefetching ([`next_block`]).

use crate::fused::blocking::Blocking;
use crate::fused::kv::{KeyRange, KvSource};
use crate::problem::Problem;
use crate::simd::RowStream;

/// What every work item of one call reads (Q apart: only [`pack_queries`] reads it, so the
/// block loop is compiled once per K/V source, not once per Q type too).
pub(crate) struct Ctx<'a, KV> {
    pub problem: &'a Problem<'a>,
    pub blocking: Blocking,
    pub kv: KV,
}

/// One work item: `group` query heads (those sharing key/value head `kv_head`) × query rows
/// `q_start .. q_start + q_len` of batch `batch`, over keys `kv_start .. kv_end`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub batch: usize,
    pub kv_head: usize,
    /// Key/value heads `kv_head .. kv_head + heads` ([`Blocking::heads`]).
    pub heads: usize,
    pub q_start: usize,
    pub q_len: usize,
    pub kv_start: usize,
    pub kv_end: usize,
}

impl Item {
    /// Stacked rows: `heads × group × q_len`, row `r` is query head `kv_head·group + r /
    /// q_len` (of kv head `kv_head + r / (group·q_len)`), query position `q_start + r % q_len`.
    pub fn rows(&self, group: usize) -> usize {
        self.heads * group * self.q_len
    }

    /// The (query head, query position) of stacked row `r`.
    pub fn row_origin(&self, group: usize, r: usize) -> (usize, usize) {
        (
            self.kv_head * group + r / self.q_len,
            self.q_start + r % self.q_len,
        )
    }
}

/// The tile geometry of one item.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tiles {
    /// Stacked rows of the item.
    pub(super) rows: usize,
    /// Rows rounded up to whole vectors: the leading dimension of Sᵀ (key `j`'s scores at
    /// `st[j · ld_s ..]`) and the extent of the per-row vectors the softmax reads.
    pub(super) ld_s: usize,
    /// Query/key head size.
    pub(super) d_k: usize,
    /// Value head size, and rounded up to whole vectors (the row length of O and packed V).
    pub(super) d_v: usize,
    pub(super) d_vp: usize,
    /// Few rows (decode): Q packed as rows and scores computed with channels along the lanes
    /// ([`dot_tile`]) instead of the transposed tile, which would leave most lanes idle.
    pub(super) by_channels: bool,
    /// How the item reads 8-bit keys and values ([`plan_int_rows`]; dequantized for every
    /// other K/V type).
    pub(super) int_keys: IntRows,
    pub(super) int_values: IntRows,
}

/// How one side (K or V) of an item's 8-bit rows is read, decided once per item by
/// [`plan_int_rows`] (see [`super::quant`] for the scale granularities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntRows {
    /// Converted to f32 with their scales where the block is loaded ([`KvSource::keys`],
    /// [`load_values`]); every K/V type but i8, and i8 wherever the rows are not read in place.
    Dequantized,
    /// Read in place; each key's scale multiplies its scores as the score tile stores them
    /// ([`crate::microkernel::dot_tile`]) or its weights as the softmax writes them
    /// ([`spread_factors`], [`softmax_update`]).
    PerKey,
    /// Read in place; the channel scales, the same for every key, folded into Q's rows (K)
    /// or the output (V) once per item ([`scale_rows_by_channels`]).
    Folded,
}

impl IntRows {
    pub(super) fn in_place(self) -> bool {
        self != IntRows::Dequantized
    }
}

/// The K and V rows of kv head `at.kv_head` one key block ahead of the block at `at.j0`, for
/// prefetching (the dot products request K, the output tile V); keys at or past the cache's
/// end are not requested. Past the work unit's own keys they are the first block of the
/// item's next key split, the unit that the same thread most often runs next (an item's
/// splits are adjacent units), so that block is not read cold. The addresses are found once
/// per block and head, so that a request in a loop is a multiply and the prefetches
/// themselves (the per-key search this replaced was 10% of a decode step's time in `perf`).
#[inline(always)]
pub(super) fn next_block(cx: &Ctx<'_, impl KvSource>, at: KeyRange) -> [Option<RowStream>; 2] {
    let next = KeyRange {
        j0: at.j0 + cx.blocking.kv_block,
        ..at
    };
    let live = cx.problem.n_kv.saturating_sub(next.j0);
    cx.kv
        .prefetch_streams(next)
        .map(|rows| rows.map(|r| r.limit(live)))
}
