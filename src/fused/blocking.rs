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
//! | buffer           | size (f32)        | d = 64 (kv 192) | d = 128 (kv 144) | where it lives |
//! |------------------|-------------------|-----------------|------------------|----------------|
//! | Qᵀ panels        | rows · d_k        | 24 KiB          | 48 KiB           | L2; one 32-row panel (8–16 KiB) in L1 during a score tile |
//! | Sᵀ / Pᵀ          | kv_block · rows   | 72 KiB          | 54 KiB           | L2, written then re-read at once |
//! | V block (packed) | kv_block · d_v    | 48 KiB          | 72 KiB           | L2 (or read in place) |
//! | V panel (copied) | kv_block · 2L     | 24 / 12 KiB     | 18 / 9 KiB       | L1, while every row tile reads it (AVX-512 / AVX2) |
//! | K block          | kv_block · d_k    | 48 KiB          | 72 KiB           | L2 (read in place from the caller's tensor) |
//! | O accumulator    | rows · d_v        | 24 KiB          | 48 KiB           | L2 |
//!
//! (rows = 96 on both backends.) `kv_block` is the largest multiple of `KV_STEP` = 48 keys
//! whose K, V and Sᵀ columns fit half of a 512 KiB L2 (`4·(d_k + d_v_pad + rows)` bytes per
//! key), clamped to 48…192, so everything stays inside L2 (≈ 250 KiB at d = 128; at d = 256
//! `kv_block` drops to 96). The score tile's inner loop touches one Qᵀ panel and 12 K rows
//! (< 24 KiB at d = 128): L1. Larger blocks amortize the per-block work (the rescale of O
//! costs `rows · d_v` loads and stores per block against `rows · d_v · kv_block` FMAs: 0.5% at
//! 192 keys); larger `rows` amortizes nothing in the inner loops but wastes work on the causal
//! diagonal. Rows 48/96 × keys 48/96/192 were swept at n = 1024, d = 64 and 128 on the
//! development machine: 96 rows with this key block was best or within noise of it for both
//! head sizes. The unit tests below hold the resulting table.
//!
//! Decode (at most `lanes / 2` query rows per kv head: one token of a GQA group of ≤ 8 on
//! AVX-512) is memory-bound, and the model changes: the scores are computed with channels
//! along the lanes (`Blocking::by_channels`), an item stacks up to 96 rows of consecutive kv
//! heads (`heads`), and the key block drops to 48 keys, so that one block of all the item's
//! heads — in the token-major layouts engines use, one contiguous region of `48 × H_kv` rows —
//! is read once from memory and stays in L2 while each head's pass uses its part. The block
//! after it is prefetched meanwhile ([`crate::simd::RowStream`]), so two such regions must fit
//! the 512 KiB L2 together: where they would not (f32 rows of 8 kv heads at d = 128, 2 ×
//! 384 KiB), the block drops to the smallest multiple of the backend's tile and lanes that does
//! (24 keys on AVX2 and the portable backend; AVX-512's multiple is 48 already). Measured on a
//! 2-core Zen 3 (512 KiB L2), f32 decode at n_kv = 16384, three alternated rounds: 24 keys
//! 7.70 GB/s against 6.14 for 48 (medians); f16 and i8, whose two regions fit, keep 48 (with
//! 24, f16 the same, i8 −11%). On an AVX-512 Xeon (2 MiB L2) f32 had measured 24 keys at 73%
//! of the read bandwidth against 77% for 48; AVX-512 keeps 48, and only an AVX2-only CPU with
//! a large L2 gives that difference up for the 512 KiB target.

use crate::error::Error;
use crate::microkernel::amx::{tile_engine, TileEngine};
use crate::microkernel::dpbf16::{self, bf16_dot, Bf16Dot};
use crate::problem::Problem;
use crate::simd::Geometry;

/// Stacked query rows per work item the model aims for: whole output tiles (6 or 12 rows) and
/// score panels (16 or 32 rows) on every backend.
const TARGET_ROWS: usize = 96;
/// f32 columns of an AMX accumulator tile (64 bytes): O's rows and Sᵀ's are padded to it when
/// the products run on tiles.
pub(crate) const TILE_COLUMNS: usize = 16;
/// Most keys per block; beyond ~200 the per-block overheads are already below 1%.
const MAX_KV_BLOCK: usize = 192;
/// Fewest keys per block, so per-block work stays amortized even for huge head sizes.
const MIN_KV_BLOCK: usize = 48;
/// Key blocks are multiples of this: of every backend's score-tile height (6, 12) and lane
/// count (8, 16), i.e. of each backend's [`Geometry::key_step`] (checked in the tests).
const KV_STEP: usize = 48;
/// Half of a 512 KiB L2: what the per-block buffers may take, leaving the rest to Qᵀ, O and the
/// K rows streaming through. Also what one decode block's K and V rows of all stacked heads may
/// take, the other half holding the next block, prefetched meanwhile.
const L2_BUDGET_BYTES: usize = 256 * 1024;

/// Work units the scheduler aims for at least: enough for every core of a large server to get
/// a few, so that decode (few query rows, long KV) still spreads over all threads.
const MIN_WORK_UNITS: usize = 32;
/// The most key ranges one item is split into ([`Blocking::kv_splits`] never exceeds it).
pub(crate) const MAX_SPLITS: usize = MIN_WORK_UNITS;
/// Fewest keys worth a split of their own: below this, the fixed cost of a work item (packing
/// Q, writing a partial, merging) stops being negligible.
const MIN_KEYS_PER_SPLIT: usize = 1024;

/// Block sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocking {
    /// Query positions per work item (per head).
    pub q_rows: usize,
    /// Query heads stacked per work item for one key/value head (the GQA group).
    pub group: usize,
    /// Key/value heads per work item: 1, except when a head's rows are few (decode), where
    /// the item takes consecutive kv heads and walks them inside each key block, so that the
    /// K and V rows of one token (adjacent in the token-major layouts engines use) are read
    /// together, as one stream, instead of 512-byte pieces 4 KiB apart per head.
    pub heads: usize,
    /// Keys per key block.
    pub kv_block: usize,
    /// Query/key head size.
    pub d_k: usize,
    /// Value head size rounded up to whole vectors.
    pub d_v_pad: usize,
    /// The register geometry of the backend that runs the call.
    pub geometry: Geometry,
    /// The bf16 dot-product kernels, when the call's products run on bf16 operands
    /// ([`Options::bf16_products`](crate::Options::bf16_products), a CPU and backend that
    /// have them); `None`: f32 products.
    pub pairs: Option<Bf16Dot>,
    /// The tile engine, when prefill's bf16 products run on AMX tiles ([`tile_engine`]: bf16
    /// products, the transposed score tile, a process that has the tiles); then O's rows
    /// (`d_v_pad`) and Sᵀ's (`ld_s`) are whole tiles of 16 f32 columns too.
    pub tiles: Option<TileEngine>,
}

impl Blocking {
    /// Block sizes for `problem` (shape only: never the thread count, so results are identical
    /// whatever the pool).
    ///
    /// # Errors
    /// [`Error::ScratchTooLarge`] when a head size is so large (possible only with broadcast
    /// views over small slices) that the per-block sizes overflow `usize`.
    pub fn for_problem(
        problem: &Problem,
        geometry: Geometry,
        kv_bytes: usize,
    ) -> Result<Self, Error> {
        let too_large = Error::ScratchTooLarge { bytes: usize::MAX };
        let group = problem.group();
        let q_rows = TARGET_ROWS.div_ceil(group).clamp(1, problem.n_q.max(1));
        // Few rows per head: the score kernel runs by channels (`rows ≤ lanes / 2`), and
        // the item stacks kv heads up to the target rows.
        let head_rows = q_rows * group;
        let heads = if by_channels(head_rows, geometry) {
            (TARGET_ROWS / head_rows).clamp(1, problem.kv_heads.max(1))
        } else {
            1
        };
        // (Without the CPU's bf16 conversion, i.e. the software model on a CPU without
        // AVX512_BF16, only on 8 lanes: the tiled loop is not compiled for AVX-512 alone.)
        let pairs =
            if problem.bf16_products && (geometry.lanes, geometry.tile) == (16, dpbf16::TILE) {
                bf16_dot()
            } else {
                None
            };
        let tiles = tile_engine().filter(|_| {
            problem.bf16_products
                && !by_channels(head_rows, geometry)
                && (pairs.is_some() || geometry.lanes == 8)
        });
        let columns = if tiles.is_some() {
            TILE_COLUMNS
        } else {
            geometry.lanes
        };
        let d_v_pad = problem
            .d_v
            .div_ceil(columns)
            .checked_mul(columns)
            .ok_or(too_large.clone())?;
        let panel = 2 * geometry.lanes;
        let max_rows = (q_rows * group * heads).div_ceil(panel) * panel;
        // Per key of a block: its K row (read in place), its packed V row and its Sᵀ column.
        let bytes_per_key = problem
            .d_k
            .checked_add(d_v_pad)
            .and_then(|x| x.checked_add(max_rows))
            .and_then(|x| x.checked_mul(4))
            .ok_or(too_large)?;
        let kv_block = if heads > 1 {
            // Stacked heads walk one block per head: the block's K and V rows of all of them
            // (48 keys × 8 heads × 1 KiB at d = 128 in f32: 384 KiB) are one contiguous region
            // of a token-major cache, read by the first head's pass and still in L2 for the
            // others. Larger blocks let that region outgrow L2 (measured on a Xeon's 2 MiB
            // L2: 192 keys, 44% of the read bandwidth; 96, 59%; 48, 77%; 24, 73%). With the
            // next block prefetched, two regions share the L2: fewer keys where two of 48
            // would not fit half each (module docs), in steps of both the tile and the lanes.
            let step = geometry.key_step();
            let region_per_key = heads
                .saturating_mul(problem.d_k.saturating_add(problem.d_v))
                .saturating_mul(kv_bytes)
                .max(1);
            (L2_BUDGET_BYTES / region_per_key / step * step)
                .min(MIN_KV_BLOCK)
                .max(step)
        } else {
            (L2_BUDGET_BYTES / bytes_per_key / KV_STEP * KV_STEP).clamp(MIN_KV_BLOCK, MAX_KV_BLOCK)
        };
        debug_assert_eq!(kv_block % geometry.tile, 0);
        Ok(Blocking {
            q_rows,
            group,
            heads,
            kv_block,
            d_k: problem.d_k,
            d_v_pad,
            geometry,
            pairs,
            tiles,
        })
    }

    /// How many key ranges each work item is split into (split-KV, FlashDecoding-style): more
    /// than one only when there are too few (batch, kv head, query block) items to occupy the
    /// threads, as in decode. Shape-only, like everything here; at most `MIN_WORK_UNITS` units
    /// in all, which bounds the partial results' memory by 32 items' accumulators.
    /// An item of several kv heads counts each head's keys.
    pub fn kv_splits(&self, n_kv: usize, items: usize) -> usize {
        if items >= MIN_WORK_UNITS {
            return 1;
        }
        (MIN_WORK_UNITS / items.max(1))
            .min(n_kv.saturating_mul(self.heads) / MIN_KEYS_PER_SPLIT)
            .max(1)
    }

    /// Whether the scores are computed with channels along the lanes (few rows per kv head:
    /// decode) rather than with the transposed tile. Shape-only, like everything here: a row's
    /// result does not depend on the block it falls in.
    pub fn by_channels(&self) -> bool {
        by_channels(self.q_rows * self.group, self.geometry)
    }

    /// Stacked rows per work item.
    pub fn rows(&self) -> usize {
        self.q_rows * self.group * self.heads
    }

    /// Rows of one score panel: two vectors.
    pub fn panel(&self) -> usize {
        2 * self.geometry.lanes
    }

    /// Key pairs of a block as the output tiles take them: `⌈kv_block / 2⌉` rounded up to whole
    /// tile steps (the rows of the tiles' V pairs, the row length of their weights).
    pub fn tile_pairs(&self) -> usize {
        self.kv_block.div_ceil(2).div_ceil(TILE_COLUMNS) * TILE_COLUMNS
    }

    /// The most stacked rows an item can have, rounded up to whole score panels: the row
    /// capacity of the per-worker buffers.
    pub fn max_panel_rows(&self) -> usize {
        self.rows().div_ceil(self.panel()) * self.panel()
    }
}

/// Whether `head_rows` query rows per kv head are few enough for the scores by channels: at
/// most half the lanes, where the transposed tile would leave more than half of them idle.
fn by_channels(head_rows: usize, geometry: Geometry) -> bool {
    head_rows <= geometry.lanes / 2
}

/// Key range `split` of `splits` equal ranges over `0 .. n_kv` (the last ones may be shorter
/// or empty). Computed in `u128`, so no length, however large, wraps.
pub(crate) fn split_range(split: usize, splits: usize, n_kv: usize) -> (usize, usize) {
    let chunk = n_kv.div_ceil(splits.max(1)) as u128;
    let at = |s: usize| (s as u128 * chunk).min(n_kv as u128) as usize;
    (at(split), at(split + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Options;
    use crate::tensor::Tensor;

    fn blocking(
        heads: usize,
        kv_heads: usize,
        n_q: usize,
        d_k: usize,
        d_v: usize,
        lanes: usize,
        tile: usize,
    ) -> Blocking {
        blocking_of(heads, kv_heads, n_q, [d_k, d_v], (lanes, tile), 4)
    }

    /// [`blocking`] for K/V elements of `kv_bytes` bytes.
    fn blocking_of(
        heads: usize,
        kv_heads: usize,
        n_q: usize,
        [d_k, d_v]: [usize; 2],
        (lanes, tile): (usize, usize),
        kv_bytes: usize,
    ) -> Blocking {
        let q = vec![0.0f32; 1];
        let qv = Tensor::new(&q, [1, n_q, heads, d_k], [0; 4]).unwrap();
        let kv = Tensor::new(&q, [1, 1, kv_heads, d_k], [0; 4]).unwrap();
        let vv = Tensor::new(&q, [1, 1, kv_heads, d_v], [0; 4]).unwrap();
        let opts = Options::new();
        let p = Problem::new(&qv, &kv, &vv, [1, n_q, heads, d_v], None, &opts).unwrap();
        Blocking::for_problem(&p, Geometry { lanes, tile }, kv_bytes).unwrap()
    }

    /// The cache model's table (module docs), one row per (backend, head sizes, group).
    #[test]
    fn block_sizes_follow_the_cache_model() {
        // (H, H_kv, n_q, d_k, d_v, lanes, tile)
        //     → (q_rows, group, kv_block, d_v_pad, max rows, kv heads per item)
        let table = [
            ((8, 8, 4096, 64, 64, 16, 12), (96, 1, 192, 64, 96, 1)),
            ((8, 8, 4096, 128, 128, 16, 12), (96, 1, 144, 128, 96, 1)),
            ((8, 8, 4096, 64, 64, 8, 6), (96, 1, 192, 64, 96, 1)),
            ((8, 8, 4096, 128, 128, 8, 6), (96, 1, 144, 128, 96, 1)),
            ((8, 8, 4096, 256, 256, 16, 12), (96, 1, 96, 256, 96, 1)),
            ((32, 8, 1, 128, 128, 16, 12), (1, 4, 48, 128, 32, 8)),
            ((32, 8, 1, 128, 128, 8, 6), (1, 4, 24, 128, 32, 8)),
            ((64, 8, 1, 128, 128, 16, 12), (1, 8, 48, 128, 64, 8)),
            ((32, 8, 4096, 128, 128, 16, 12), (24, 4, 144, 128, 96, 1)),
            ((12, 4, 100, 80, 40, 8, 6), (32, 3, 192, 40, 96, 1)),
            ((7, 1, 5, 3, 1, 16, 12), (5, 7, 192, 16, 64, 1)),
            ((1, 1, 1, 4096, 4096, 16, 12), (1, 1, 48, 4096, 32, 1)),
        ];
        for ((h, hkv, n_q, d_k, d_v, lanes, tile), want) in table {
            let b = blocking(h, hkv, n_q, d_k, d_v, lanes, tile);
            let got = (
                b.q_rows,
                b.group,
                b.kv_block,
                b.d_v_pad,
                b.max_panel_rows(),
                b.heads,
            );
            assert_eq!(
                got, want,
                "H={h} H_kv={hkv} n_q={n_q} d_k={d_k} d_v={d_v} lanes={lanes}"
            );
            assert_eq!(b.kv_block % tile, 0);
            assert_eq!(b.kv_block % lanes, 0);
            // The per-block buffers stay inside the L2 budget unless the block is at its floor.
            let per_key = 4 * (d_k + b.d_v_pad + b.max_panel_rows());
            assert!(
                b.kv_block <= MIN_KV_BLOCK || b.kv_block * per_key <= L2_BUDGET_BYTES,
                "{got:?}"
            );
        }
    }

    /// Decode's key block: two blocks of all stacked heads' K and V rows fit the 512 KiB L2
    /// (f32 at d = 128 on AVX2: 24 keys), in steps of the tile and the lanes (AVX-512: 48).
    #[test]
    fn decode_blocks_follow_the_element_size() {
        // ((lanes, tile), kv_bytes) → kv_block, for H = 32, H_kv = 8, n_q = 1, d = 128.
        for (geometry, kv_bytes, want) in [
            ((8, 6), 4, 24),
            ((8, 6), 2, 48),
            ((8, 6), 1, 48),
            ((16, 12), 4, 48),
            ((16, 12), 2, 48),
        ] {
            let b = blocking_of(32, 8, 1, [128, 128], geometry, kv_bytes);
            assert_eq!(b.heads, 8);
            assert_eq!(b.kv_block, want, "{geometry:?}, {kv_bytes} bytes");
        }
        // Huge heads: never below one step.
        let b = blocking_of(32, 8, 1, [4096, 4096], (8, 6), 4);
        assert_eq!(b.kv_block, 24);
    }

    /// Prefill's step of key blocks is whole steps of every backend's geometry.
    #[test]
    fn key_steps_divide_the_prefill_step() {
        for (lanes, tile, step) in [(8, 6, 24), (16, 12, 48)] {
            assert_eq!(Geometry { lanes, tile }.key_step(), step);
            assert_eq!(KV_STEP % step, 0);
        }
        assert_eq!(KV_STEP % crate::simd::geometry().key_step(), 0);
    }

    #[test]
    fn key_splits_depend_on_the_shape_only() {
        // Prefill blocks: one kv head per item.
        let b = blocking(32, 8, 4096, 128, 128, 16, 12);
        assert_eq!(b.heads, 1);
        assert_eq!(b.kv_splits(32768, 8), 4);
        assert_eq!(b.kv_splits(32768, 1), 32);
        assert_eq!(b.kv_splits(2048, 1), 2);
        assert_eq!(b.kv_splits(1023, 1), 1);
        assert_eq!(b.kv_splits(1 << 20, 32), 1);
        assert_eq!(b.kv_splits(0, 0), 1);
        // Decode: all 8 kv heads in one item, so each split counts 8 heads' keys.
        let b = blocking(32, 8, 1, 128, 128, 16, 12);
        assert_eq!(b.heads, 8);
        assert_eq!(b.kv_splits(32768, 1), 32);
        assert_eq!(b.kv_splits(2048, 1), 16);
        assert_eq!(b.kv_splits(127, 1), 1);
        assert_eq!(b.kv_splits(usize::MAX, 1), 32);
    }

    #[test]
    fn split_ranges_cover_the_keys_without_wrapping() {
        for (n_kv, splits) in [(10, 3), (1024, 32), (0, 4), (5, 8)] {
            let mut next = 0;
            for s in 0..splits {
                let (a, b) = split_range(s, splits, n_kv);
                assert_eq!(a, next.min(n_kv));
                assert!(a <= b && b <= n_kv);
                next = b;
            }
            assert_eq!(next, n_kv);
        }
        // Lengths near usize::MAX (broadcast views): the last range ends at n_kv, not at a
        // wrapped product.
        let n = usize::MAX - 3;
        assert_eq!(split_range(31, 32, n).1, n);
        assert!(split_range(30, 32, n).0 < split_range(30, 32, n).1);
    }
}
