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
//! | buffer           | size (f32)        | d = 64, rows 96, kv 96 | d = 128  | where it lives |
//! |------------------|-------------------|------------------------|----------|----------------|
//! | Qᵀ panels        | rows · d_k        | 24 KiB                 | 48 KiB   | L2, one 16-row panel (4–8 KiB) in L1 during a score tile |
//! | Sᵀ / Pᵀ          | kv_block · rows   | 36 KiB                 | 36 KiB   | L2, written then re-read at once |
//! | V block (packed) | kv_block · d_v    | 24 KiB                 | 48 KiB   | L2; one 16-column panel (6 KiB) in L1 |
//! | O accumulator    | rows · d_v        | 24 KiB                 | 48 KiB   | L2 |
//! | K rows           | 6 · d_k per tile  | 1.5 KiB                | 3 KiB    | L1 (read from the caller's tensor) |
//!
//! Everything together stays under ~250 KiB at d = 128 (~450 KiB at d = 256), inside L2. The
//! score tile's inner loop touches one Qᵀ panel and 6 K rows (< 12 KiB at d = 128): L1.
//! Larger `kv_block` amortizes the per-block work (the rescale of O costs `rows · d_v` loads and
//! stores per block against `rows · d_v · kv_block` FMAs: 1% at 96 keys); larger `rows`
//! amortizes nothing in the inner loops but wastes work on the causal diagonal. Both were swept
//! on the development machine (see README, "Tuning").

use crate::microkernel::{MR, NR};
use crate::problem::Problem;

/// Stacked query rows per work item the model aims for: 6 output tiles of 16 rows.
const TARGET_ROWS: usize = 96;
/// Keys per block: a multiple of the score tile's 6 keys and of the 8 lanes.
const KV_BLOCK: usize = 96;

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
    /// Value head size rounded up to a multiple of the output tile's 16 columns.
    pub d_v_pad: usize,
}

impl Blocking {
    /// Block sizes for `problem` (shape only: never the thread count, so results are identical
    /// whatever the pool).
    pub fn for_problem(problem: &Problem) -> Self {
        let group = problem.group();
        let q_rows = TARGET_ROWS.div_ceil(group).clamp(1, problem.n_q.max(1));
        debug_assert_eq!(KV_BLOCK % MR, 0);
        Blocking {
            q_rows,
            group,
            kv_block: KV_BLOCK,
            d_k: problem.d_k,
            d_v_pad: problem.d_v.div_ceil(NR) * NR,
        }
    }

    /// Stacked rows per work item.
    pub fn rows(&self) -> usize {
        self.q_rows * self.group
    }

    /// Stacked rows rounded up to whole 16-row score panels.
    pub fn rows_pad(&self) -> usize {
        self.rows().div_ceil(NR) * NR
    }
}
