//! Memory hints: rows for the CPU to start loading ahead of the kernels that read them.

/// Rows to prefetch: row `j` starts `j · stride` bytes after `first` and is `bytes` long; rows
/// from `rows` on are never requested. Only ever used as a hint ([`prefetch`] reads nothing),
/// so the addresses are computed with wrapping arithmetic and may lie anywhere.
#[derive(Clone, Copy)]
pub(crate) struct RowStream {
    first: *const u8,
    stride: usize,
    bytes: usize,
    rows: usize,
}

impl RowStream {
    /// Rows `stride` bytes apart from `first`, `bytes` each, no limit on their count.
    pub fn new(first: *const u8, stride: usize, bytes: usize) -> Self {
        RowStream {
            first,
            stride,
            bytes,
            rows: usize::MAX,
        }
    }

    /// The first `rows` rows only.
    #[inline(always)]
    pub fn limit(self, rows: usize) -> Self {
        RowStream {
            rows: self.rows.min(rows),
            ..self
        }
    }

    /// The same rows from row `j` on.
    #[inline(always)]
    pub fn skip(self, j: usize) -> Self {
        RowStream {
            first: self.first.wrapping_add(j.wrapping_mul(self.stride)),
            rows: self.rows.saturating_sub(j),
            ..self
        }
    }

    /// The part of each row that holds columns `col .. col + n` of rows of `width` columns
    /// (in proportion to the row's bytes, whatever its element type).
    #[inline(always)]
    pub fn columns(self, col: usize, n: usize, width: usize) -> Self {
        let width = width.max(1);
        let start = self.bytes * col / width;
        RowStream {
            first: self.first.wrapping_add(start),
            bytes: (self.bytes * (col + n))
                .div_ceil(width)
                .saturating_sub(start),
            ..self
        }
    }

    /// Asks the CPU to start loading rows `j .. j + n` (those below the limit).
    #[inline(always)]
    pub fn request(&self, j: usize, n: usize) {
        let n = n.min(self.rows.saturating_sub(j));
        let mut row = self.first.wrapping_add(j.wrapping_mul(self.stride));
        for _ in 0..n {
            let mut line = 0;
            while line < self.bytes {
                prefetch(row.wrapping_add(line));
                line += 64;
            }
            row = row.wrapping_add(self.stride);
        }
    }
}

/// Asks the CPU to load the cache line holding `p` into its L2 (and L3; AMD cores before Zen 4
/// fill their L1 too): a hint that reads nothing, so any address is fine.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch never faults and has no effect visible to the program, whatever the
    // address (SSE is part of the x86-64 baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}
