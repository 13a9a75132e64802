//! The cache model: every block size of the fused kernel comes from here.
//!
//! Targets: L1d ≥ 32 KiB and L2 ≥ 512 KiB per core (AMD Zen 2–4: 32 KiB / 512 KiB–1 MiB;
//! Intel Skylake-SP and later: 32–48 KiB / 1–2 MiB). Sizes are fixed constants rather than
//! read from the CPU: results must not depend on the machine's cache sizes (block boundaries
//! decide rounding), and these fit every current x86-64 server core.
//!
//! One work item is `rows = group × q_rows` stacked query rows (all query heads that share one
//! key/value head, so each K/V block is read once for the whole group) streamed against key
//! blocks of `kv_block` keys. Its working set, for `d = d_k = d_v`:
//!
//! | buffer           | size (f32)        | d = 64 (kv 192) | d = 128 (kv 168) | where it lives |
//! |------------------|-------------------|-----------------|------------------|----------------|
//! | Qᵀ panels        | rows · d_k        | 24 KiB          | 48 KiB           | L2; one 16-row panel (4–8 KiB) in L1 during a score tile |
//! | Sᵀ / Pᵀ          | kv_block · rows   | 72 KiB          | 63 KiB           | L2, written then re-read at once |
//! | V block (packed) | kv_block · d_v    | 48 KiB          | 84 KiB           | L2; one 16-column panel in L1 |
//! | K block          | kv_block · d_k    | 48 KiB          | 84 KiB           | L2 (read in place from the caller's tensor) |
//! | O accumulator    | rows · d_v        | 24 KiB          | 48 KiB           | L2 |
//!
//! `kv_block` is the largest multiple of 24 keys whose K, V and Sᵀ columns fit half of a
//! 512 KiB L2, clamped to 48…192, so everything stays inside L2 (≈ 330 KiB at d = 128, and at
//! d = 256 `kv_block` drops to 96). The score tile's inner loop touches one Qᵀ panel and 6 K
//! rows (< 12 KiB at d = 128): L1. Larger blocks amortize the per-block work (the rescale of O
//! costs `rows · d_v` loads and stores per block against `rows · d_v · kv_block` FMAs: 0.5% at
//! 192 keys); larger `rows` amortizes nothing in the inner loops but wastes work on the causal
//! diagonal. Rows 48/96 × keys 48/96/192 were swept at n = 1024, d = 64 and 128 on the
//! development machine: 96 × 192 was best or within noise of it for both head sizes.

use crate::problem::Problem;
use crate::simd::Geometry;

/// Stacked query rows per work item the model aims for: whole output tiles (6 or 12 rows) and
/// score panels (16 or 32 rows) on every backend.
const TARGET_ROWS: usize = 96;
/// Most keys per block; beyond ~200 the per-block overheads are already below 1%.
const MAX_KV_BLOCK: usize = 192;
/// Fewest keys per block, so per-block work stays amortized even for huge head sizes.
const MIN_KV_BLOCK: usize = 48;
/// Key blocks are multiples of this: of every backend's score-tile height (6, 12) and lane
/// count (8, 16).
const KV_STEP: usize = 48;
/// Half of a 512 KiB L2: what the per-block buffers may take, leaving the rest to Qᵀ, O and the
/// K rows streaming through.
const L2_BUDGET_BYTES: usize = 256 * 1024;

/// Work units the scheduler aims for at least: enough for every core of a large server to get
/// a few, so that decode (few query rows, long KV) still spreads over all threads.
const MIN_WORK_UNITS: usize = 32;
/// Fewest keys worth a split of their own: below this, the fixed cost of a work item (packing
/// Q, writing a partial, merging) stops being negligible.
const MIN_KEYS_PER_SPLIT: usize = 1024;

/// Block sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocking {
    /// Query positions per work item (per head).
    pub q_rows: usize,
    /// Query heads stacked per work item (the GQA group).
    pub group: usize,
    /// Keys per key block.
    pub kv_block: usize,
    /// Query/key head size.
    pub d_k: usize,
    /// Value head size rounded up to whole vectors.
    pub d_v_pad: usize,
    /// The register geometry of the backend that runs the call.
    pub geometry: Geometry,
}

impl Blocking {
    /// Block sizes for `problem` (shape only: never the thread count, so results are identical
    /// whatever the pool).
    pub fn for_problem(problem: &Problem, geometry: Geometry) -> Self {
        let group = problem.group();
        let q_rows = TARGET_ROWS.div_ceil(group).clamp(1, problem.n_q.max(1));
        let d_v_pad = problem.d_v.div_ceil(geometry.lanes) * geometry.lanes;
        let panel = 2 * geometry.lanes;
        let rows_pad = (q_rows * group).div_ceil(panel) * panel;
        // Per key of a block: its K row (read in place), its packed V row and its Sᵀ column.
        let bytes_per_key = 4 * (problem.d_k + d_v_pad + rows_pad);
        let kv_block =
            (L2_BUDGET_BYTES / bytes_per_key / KV_STEP * KV_STEP).clamp(MIN_KV_BLOCK, MAX_KV_BLOCK);
        debug_assert_eq!(kv_block % geometry.tile, 0);
        Blocking {
            q_rows,
            group,
            kv_block,
            d_k: problem.d_k,
            d_v_pad,
            geometry,
        }
    }

    /// How many key ranges each work item is split into (split-KV, FlashDecoding-style): more
    /// than one only when there are too few (batch, kv head, query block) items to occupy the
    /// threads, as in decode. Shape-only, like everything here; at most `MIN_WORK_UNITS` units
    /// in all, which bounds the partial results' memory by 32 items' accumulators.
    pub fn kv_splits(&self, problem: &Problem, items: usize) -> usize {
        if items >= MIN_WORK_UNITS {
            return 1;
        }
        (MIN_WORK_UNITS / items.max(1))
            .min(problem.n_kv / MIN_KEYS_PER_SPLIT)
            .max(1)
    }

    /// Stacked rows per work item.
    pub fn rows(&self) -> usize {
        self.q_rows * self.group
    }

    /// Rows of one score panel: two vectors.
    pub fn panel(&self) -> usize {
        2 * self.geometry.lanes
    }

    /// Stacked rows rounded up to whole score panels.
    pub fn rows_pad(&self) -> usize {
        self.rows().div_ceil(self.panel()) * self.panel()
    }
}
