//! Per-worker buffers of the fused kernel and the pool that lends them to rayon jobs.
//!
//! Every buffer is sized from the [`Blocking`] (head sizes, GQA group, key block), never from
//! the sequence lengths, so a call's extra memory is `workers × Scratch::bytes` whatever `n`.
//! [`Scratch::buffers`] is the one list of what is allocated: [`Scratch::try_new`] allocates
//! it and [`Scratch::bytes`] adds it up (the memory bench and `scratch_bytes_per_thread` report
//! that figure).

use super::blocking::{Blocking, TILE_COLUMNS};
use crate::error::Error;
use std::sync::Mutex;

/// Buffers of the score and output tiles of one work item.
pub(crate) struct TileBuffers {
    /// Qᵀ panels: panel `t` (rows `2L·t ..`, `L` lanes) holds `d_k` steps of `2L` rows.
    pub qt: Aligned,
    /// Sᵀ then Pᵀ for one key block: key `j`'s rows at `st[j · ld_s ..]`.
    pub st: Aligned,
    /// Output accumulator, `rows × d_v_pad`.
    pub o: Aligned,
    /// Running max (log2 domain) per row.
    pub m: Aligned,
    /// Running sum of weights per row.
    pub l: Aligned,
    /// Rescale factor of the current block per row.
    pub alpha: Aligned,
    /// The largest score of each row in the current key block, as the score tiles found it
    /// (used when nothing changes the scores after them: no bias, mask or hidden key).
    pub block_max: Aligned,
    /// Visible keys `[lo, hi)` per row (causal, window, key length), inside the item's range.
    pub lo: Vec<usize>,
    /// See `lo`.
    pub hi: Vec<usize>,
    /// ALiBi per row: the distance `i + off − j0` to the block's first key, and
    /// `slope · log₂e`.
    pub alibi_dist: Aligned,
    /// See `alibi_dist`.
    pub alibi_slope: Aligned,
    /// One column panel of the V block, `kv_block` rows of two vectors, contiguous (prefill:
    /// [`output_product`](super::item) copies each panel here before its row tiles read it;
    /// empty for decode, whose single row group reads each panel once).
    pub v_panel: Aligned,
}

/// Buffers of the key/value stage: K and V blocks converted or packed by a
/// [`KvSource`](super::kv::KvSource) when they cannot be read in place.
pub(crate) struct KvBuffers {
    /// The K block, `kv_block × d_k` (empty when the source never packs keys).
    pub k: Aligned,
    /// The V block, `kv_block × d_v_pad`, zero-padded columns.
    pub v: Aligned,
    /// One V row, `d_v_pad`: a value row with NaN or ±∞, added to the rows that see it.
    pub v_row: Aligned,
    /// Block-relative keys whose value row holds NaN or ±∞ (capacity `kv_block`).
    pub non_finite: Vec<usize>,
    /// The per-key scales of 8-bit K or V rows read in place, `kv_block`.
    pub scales: Aligned,
}

/// The operands of the bf16 dot products ([`Blocking::pairs`]; empty otherwise), each a pair
/// of bf16 values per 32-bit word, stored in f32 slots (see [`crate::microkernel::dpbf16`]).
pub(crate) struct PairBuffers {
    /// Qᵀ panels by channel pairs: panel `t` holds `⌈d_k / 2⌉` steps of `2L` rows.
    pub qt: Aligned,
    /// The K block rounded to bf16, `kv_block` rows of `⌈d_k / 2⌉` words (empty by channels).
    pub k: Aligned,
    /// The V block by key pairs, `⌈kv_block / 2⌉ × d_v_pad` words.
    pub v: Aligned,
    /// Pᵀ by key pairs, `⌈kv_block / 2⌉ × rows` words; on AMX tiles P by key pairs,
    /// `rows × tile_pairs` words ([`Blocking::tile_pairs`], also the row count of `v`).
    pub p: Aligned,
    /// AMX tiles: the K pairs of a block of fewer keys than a tile's 16 rows, zero-padded to
    /// 16 rows (empty otherwise).
    pub stage: Aligned,
}

/// Everything one worker needs to run work items.
pub(crate) struct Scratch {
    /// The sizes it was allocated for: it serves any call with the same ones.
    fits: (Blocking, bool),
    pub tile: TileBuffers,
    pub kv: KvBuffers,
    pub pairs: PairBuffers,
    /// Score tiles computed (for the test hook `Options::count_score_tiles`).
    pub tiles: u64,
}

/// Extra f32s an [`Aligned`] buffer allocates to move its start to a 64-byte boundary.
const ALIGN_SLACK: usize = 15;

/// A zeroed f32 buffer whose first element sits on a 64-byte boundary: a cache line, and one
/// AVX-512 vector. Every row of the tiles (Sᵀ rows of `ld_s` floats, O and packed V rows of
/// `d_v_pad`, Qᵀ panels) is a multiple of the vector width, so with an aligned start no vector
/// load or store of the kernel straddles two cache lines. (`Vec<f32>` promises 4-byte
/// alignment only: where malloc happened to put the scratch moved AVX-512 prefill speed by
/// ~15%.)
pub(crate) struct Aligned {
    data: Vec<f32>,
    start: usize,
    len: usize,
}

impl Aligned {
    /// `len` zeros, or `None` if they cannot be allocated.
    fn try_zeroed(len: usize) -> Option<Self> {
        let padded = if len == 0 {
            0
        } else {
            len.checked_add(ALIGN_SLACK)?
        };
        let mut data = Vec::new();
        data.try_reserve_exact(padded).ok()?;
        data.resize(padded, 0.0f32);
        // f32 is 4-byte aligned, so the distance to the next 64-byte boundary is a whole
        // number of floats, at most 15.
        let misalignment = data.as_ptr() as usize % 64;
        let start = if len == 0 {
            0
        } else {
            (64 - misalignment) % 64 / 4
        };
        Some(Aligned { data, start, len })
    }
}

impl std::ops::Deref for Aligned {
    type Target = [f32];
    #[inline(always)]
    fn deref(&self) -> &[f32] {
        &self.data[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data[self.start..self.start + self.len]
    }
}

/// One buffer of [`Scratch::buffers`]: its element count and element size (f32 buffers are
/// [`Aligned`] and allocate [`ALIGN_SLACK`] more).
struct Buffer {
    len: Option<usize>,
    elem: usize,
}

impl Buffer {
    /// Bytes allocated for it (saturating; `usize::MAX` where the length overflowed).
    fn bytes(&self) -> usize {
        let slack = if self.elem == 4 && self.len != Some(0) {
            ALIGN_SLACK
        } else {
            0
        };
        self.len.map_or(usize::MAX, |n| {
            n.saturating_add(slack).saturating_mul(self.elem)
        })
    }
}

impl Scratch {
    /// The buffers [`Scratch::try_new`] allocates, in its order; `None` where a length
    /// overflows. `pack_k`: the K source converts or packs key rows.
    fn buffers(b: &Blocking, pack_k: bool) -> [Buffer; 22] {
        let rows = b.max_panel_rows();
        let d2 = b.d_k.div_ceil(2);
        let kv_pairs = if b.tiles.is_some() {
            b.tile_pairs()
        } else {
            b.kv_block.div_ceil(2)
        };
        let paired = b.pairs.is_some() || b.tiles.is_some();
        let pair = |len: Option<usize>| if paired { len } else { Some(0) };
        let f32s = |len: Option<usize>| Buffer { len, elem: 4 };
        let words = |len: Option<usize>| Buffer {
            len,
            elem: std::mem::size_of::<usize>(),
        };
        [
            f32s(rows.checked_mul(b.d_k)),      // qt
            f32s(b.kv_block.checked_mul(rows)), // st
            f32s(rows.checked_mul(b.d_v_pad)),  // o
            f32s(Some(rows)),                   // m
            f32s(Some(rows)),                   // l
            f32s(Some(rows)),                   // alpha
            f32s(Some(rows)),                   // block_max
            words(Some(rows)),                  // lo
            words(Some(rows)),                  // hi
            f32s(Some(rows)),                   // alibi_dist
            f32s(Some(rows)),                   // alibi_slope
            f32s(if b.by_channels() {
                Some(0)
            } else {
                b.kv_block.checked_mul(b.panel())
            }), // v_panel
            f32s(if pack_k {
                b.kv_block.checked_mul(b.d_k)
            } else {
                Some(0)
            }), // k
            f32s(b.kv_block.checked_mul(b.d_v_pad)), // v
            f32s(Some(b.d_v_pad)),              // v_row
            words(Some(b.kv_block)),            // non_finite (its capacity)
            f32s(Some(b.kv_block)),             // scales
            f32s(pair(rows.checked_mul(d2))),   // pairs.qt
            f32s(pair(if b.by_channels() {
                Some(0) // decode reads bf16 keys as stored, or takes f32 products
            } else {
                b.kv_block.checked_mul(d2)
            })), // pairs.k
            f32s(pair(kv_pairs.checked_mul(b.d_v_pad))), // pairs.v
            f32s(pair(kv_pairs.checked_mul(rows))), // pairs.p
            f32s(if b.tiles.is_some() {
                d2.checked_mul(TILE_COLUMNS)
            } else {
                Some(0)
            }), // pairs.stage
        ]
    }

    /// The sizes this scratch was allocated for: (blocking, whether K is packed).
    pub fn fits(&self) -> &(Blocking, bool) {
        &self.fits
    }

    /// Bytes one scratch takes (saturating at `usize::MAX`).
    pub fn bytes(b: &Blocking, pack_k: bool) -> usize {
        let list = Self::buffers(b, pack_k);
        list.iter()
            .fold(0, |acc: usize, buf| acc.saturating_add(buf.bytes()))
    }

    /// Allocates the buffers of [`Scratch::buffers`] (zeroed), or `None` if they cannot be
    /// allocated (a broadcast view can declare an enormous head size over a tiny slice).
    pub fn try_new(b: &Blocking, pack_k: bool) -> Option<Self> {
        fn zeroed<T: Clone + Default>(buf: &Buffer) -> Option<Vec<T>> {
            let len = buf.len?;
            let mut v = Vec::new();
            v.try_reserve_exact(len).ok()?;
            v.resize(len, T::default());
            Some(v)
        }
        fn aligned(buf: &Buffer) -> Option<Aligned> {
            Aligned::try_zeroed(buf.len?)
        }
        let [qt, st, o, m, l, alpha, block_max, lo, hi, alibi_dist, alibi_slope, v_panel, k, v, v_row, non_finite, scales, pair_qt, pair_k, pair_v, pair_p, pair_stage] =
            Self::buffers(b, pack_k);
        // A list of block keys: allocated with its capacity, used from empty.
        let mut non_finite: Vec<usize> = zeroed(&non_finite)?;
        non_finite.clear();
        Some(Scratch {
            fits: (*b, pack_k),
            tile: TileBuffers {
                qt: aligned(&qt)?,
                st: aligned(&st)?,
                o: aligned(&o)?,
                m: aligned(&m)?,
                l: aligned(&l)?,
                alpha: aligned(&alpha)?,
                block_max: aligned(&block_max)?,
                lo: zeroed(&lo)?,
                hi: zeroed(&hi)?,
                alibi_dist: aligned(&alibi_dist)?,
                alibi_slope: aligned(&alibi_slope)?,
                v_panel: aligned(&v_panel)?,
            },
            kv: KvBuffers {
                k: aligned(&k)?,
                v: aligned(&v)?,
                v_row: aligned(&v_row)?,
                non_finite,
                scales: aligned(&scales)?,
            },
            pairs: PairBuffers {
                qt: aligned(&pair_qt)?,
                k: aligned(&pair_k)?,
                v: aligned(&pair_v)?,
                p: aligned(&pair_p)?,
                stage: aligned(&pair_stage)?,
            },
            tiles: 0,
        })
    }
}

/// Scratches of one call, lent to rayon jobs and taken back when they finish.
///
/// `for_each_init` runs its init once per rayon *job*, and rayon splits a parallel loop into
/// many jobs; a fresh `Scratch` per job (hundreds of KiB, zeroed, often a fresh mmap) made two
/// threads only 1.3× faster than one. All scratches are allocated up front, fallibly, one per
/// thread that can run at once (at most one per work unit), so running out of memory is an
/// error before any output is written, and memory stays O(threads × block).
pub(crate) struct ScratchPool {
    /// The store: this call's scratches, lent by size, and those of other sizes, kept for
    /// the workspace's later calls.
    free: Mutex<Vec<Scratch>>,
}

/// A scratch on loan from a [`ScratchPool`]; returns to it when dropped.
pub(crate) struct Loan<'p> {
    pool: &'p ScratchPool,
    scratch: Option<Scratch>,
}

/// Sizes of scratch a workspace keeps besides the current call's: a serving loop alternates
/// decode-only steps and steps with prefill rows (two blockings, each per K/V type), and
/// reallocating on every switch cost 17–35 allocations per call in an engine trial.
const KEPT_SIZES: usize = 3;

impl ScratchPool {
    /// A pool of at least `count` scratches (at least one) of each `(fits, count)` in
    /// `sizes`, made from `store` (a caller's [`Workspace`](crate::Workspace), or empty): the
    /// scratches in it of these sizes are lent, missing ones allocated, and those of other
    /// sizes kept aside for later calls (those of the [`KEPT_SIZES`] other sizes used last;
    /// older ones are dropped). The list itself is reused too, so a call that finds everything
    /// in `store` allocates nothing.
    ///
    /// # Errors
    /// [`Error::ScratchTooLarge`] if they cannot all be allocated (`store` is then lost).
    pub fn new(
        sizes: &[Option<((Blocking, bool), usize)>],
        mut store: Vec<Scratch>,
    ) -> Result<Self, Error> {
        let wanted = |f: &(Blocking, bool)| sizes.iter().flatten().any(|(s, _)| s == f);
        // The other sizes to keep: the last `KEPT_SIZES` distinct ones in the store (the most
        // recently used are last), found without allocating.
        let mut others: [Option<(Blocking, bool)>; KEPT_SIZES] = [None; KEPT_SIZES];
        let mut distinct = 0;
        for s in store.iter().rev() {
            if distinct == KEPT_SIZES {
                break;
            }
            if !wanted(&s.fits) && !others[..distinct].contains(&Some(s.fits)) {
                others[distinct] = Some(s.fits);
                distinct += 1;
            }
        }
        store.retain(|s| wanted(&s.fits) || others[..distinct].contains(&Some(s.fits)));
        for &(fits, count) in sizes.iter().flatten() {
            let (blocking, pack_k) = fits;
            let too_large = || Error::ScratchTooLarge {
                bytes: Scratch::bytes(&blocking, pack_k),
            };
            let have = store.iter().filter(|s| s.fits == fits).count();
            let count = count.max(1);
            store
                .try_reserve(count.saturating_sub(have))
                .map_err(|_| too_large())?;
            for _ in have..count {
                store.push(Scratch::try_new(&blocking, pack_k).ok_or_else(too_large)?);
            }
        }
        Ok(ScratchPool {
            free: Mutex::new(store),
        })
    }

    /// The scratches, for a caller's workspace to keep (all loans have ended).
    pub fn into_scratches(self) -> Vec<Scratch> {
        match self.free.into_inner() {
            Ok(free) => free,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Lends a scratch. At most as many jobs run at once as the pool has threads, and the pool
    /// holds one scratch per thread, so one is free; should a job still find none (a thread
    /// that holds a loan cannot start another job of this loop, but rayon gives no such
    /// promise in writing), it waits for one to come back rather than allocating mid-call.
    pub fn take(&self, fits: &(Blocking, bool)) -> Loan<'_> {
        loop {
            let mut free = match self.free.lock() {
                Ok(free) => free,
                Err(poisoned) => poisoned.into_inner(),
            };
            // (The last of its size: loans come back to the end.)
            let reused = free
                .iter()
                .rposition(|s| s.fits == *fits)
                .map(|i| free.swap_remove(i));
            drop(free);
            if let Some(scratch) = reused {
                return Loan {
                    pool: self,
                    scratch: Some(scratch),
                };
            }
            std::thread::yield_now();
        }
    }
}

impl Loan<'_> {
    /// The scratch.
    pub fn get(&mut self) -> &mut Scratch {
        self.scratch
            .as_mut()
            .expect("a loan holds its scratch until dropped")
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        if let Some(scratch) = self.scratch.take() {
            match self.pool.free.lock() {
                Ok(mut free) => free.push(scratch),
                Err(poisoned) => poisoned.into_inner().push(scratch),
            }
        }
    }
}
