//! The small interface the tile kernels are written over: a tile configuration
//! ([`TileConfig`]), the five instructions as [`TileOps`] (implemented by the hardware and by the
//! software model), and [`Unit`], which holds the configuration in force and checks every
//! operand against it, so that the kernels call only safe methods.

/// The tile registers: `tmm0` … `tmm7`.
pub(crate) const TILES: usize = 8;
/// Most rows of a tile (palette 1).
pub(crate) const MAX_ROWS: usize = 16;
/// Most bytes per tile row (palette 1).
pub(crate) const MAX_COLSB: usize = 64;

/// `ldtilecfg`'s 64-byte operand for palette 1: per tile its rows and bytes per row (the
/// tiles a kernel does not use stay 0 × 0).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Palette 1 with tile `t` of `shapes[t] = (rows, bytes per row)`: each `rows ≤ 16` and
    /// `bytes ≤ 64`, a multiple of 4 (checked: a configuration out of these bounds would make
    /// `ldtilecfg` fault).
    pub fn new(shapes: [(usize, usize); TILES]) -> Self {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for (t, &(rows, colsb)) in shapes.iter().enumerate() {
            assert!(rows <= MAX_ROWS && colsb <= MAX_COLSB && colsb.is_multiple_of(4));
            assert_eq!(
                rows == 0,
                colsb == 0,
                "a tile is configured in both dimensions or not"
            );
            cfg.rows[t] = rows as u8;
            cfg.colsb[t] = colsb as u16;
        }
        cfg
    }

    /// Tile `t`'s (rows, bytes per row).
    pub fn shape(&self, t: usize) -> (usize, usize) {
        (usize::from(self.rows[t]), usize::from(self.colsb[t]))
    }
}

/// The tile instructions, as the hardware runs them ([`super::hardware`]) or as the software
/// model computes them ([`super::model`]). Tile numbers are constants (the instructions encode
/// them). Only [`Unit`] calls these, after checking what each one's safety section asks.
pub(crate) trait TileOps {
    /// `ldtilecfg`. Safety: `cfg` is valid (what [`TileConfig::new`] checks).
    unsafe fn configure(&mut self, cfg: &TileConfig);
    /// `tilerelease`: every tile zero, no configuration.
    fn release(&mut self);
    /// `tilezero tmmT`. Safety: configured; tile `T` has a shape.
    unsafe fn zero<const T: u8>(&mut self);
    /// `tileloadd tmmT, [src + stride·row]`. Safety: configured; tile `T` has a shape
    /// `(rows, colsb)` and `src` is valid for reading `colsb` bytes at each of `src + r·stride`,
    /// `r < rows`.
    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize);
    /// `tilestored [dst + stride·row], tmmT`. Safety: as [`TileOps::load`], for writing.
    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize);
    /// `tdpbf16ps tmmC, tmmA, tmmB`. Safety: configured; distinct tiles, with `rows(C) =
    /// rows(A)`, `colsb(C) = colsb(B)` and `colsb(A) = 4 · rows(B)`, none empty.
    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self);
}

/// Elements a tile can be loaded from: 32-bit words (f32 slots holding pairs, or f32 values)
/// and bf16 values as stored.
pub(crate) trait Word: Copy {}
impl Word for f32 {}
impl Word for half::bf16 {}

/// A tile unit: the instructions of `O` with the configuration in force, every operand checked
/// against it (bounds and shapes, in release builds too: a few comparisons against an
/// instruction of 16 cycles or more). The tiles are released when it is dropped, so that the
/// thread does not keep the 8 KiB tile state, which every context switch would then save.
pub(crate) struct Unit<O: TileOps> {
    ops: O,
    cfg: Option<TileConfig>,
}

impl<O: TileOps> Unit<O> {
    /// A unit with nothing configured.
    pub fn new(ops: O) -> Self {
        Unit { ops, cfg: None }
    }

    /// Puts `cfg` in force (`ldtilecfg`, which zeroes every tile) unless it already is.
    pub fn configure(&mut self, cfg: &TileConfig) {
        if self.cfg.as_ref() != Some(cfg) {
            // SAFETY: `TileConfig::new` checked the shapes.
            unsafe { self.ops.configure(cfg) };
            self.cfg = Some(*cfg);
        }
    }

    /// Tile `t`'s shape in the configuration in force; panics if none is, or the tile is
    /// empty.
    fn shape(&self, t: u8) -> (usize, usize) {
        let cfg = self.cfg.as_ref().expect("a tile configuration in force");
        let (rows, colsb) = cfg.shape(usize::from(t));
        assert!(
            usize::from(t) < TILES && rows > 0,
            "tile {t} is not configured"
        );
        (rows, colsb)
    }

    /// Checks that rows `0 .. rows` of `colsb` bytes at `stride` bytes apart lie inside
    /// `len` bytes.
    fn check_extent((rows, colsb): (usize, usize), stride: usize, len: usize) {
        let end = (rows - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(colsb));
        assert!(
            end.is_some_and(|end| end <= len),
            "a tile operand out of bounds"
        );
    }

    /// `tilezero tmmT`.
    pub fn zero<const T: u8>(&mut self) {
        self.shape(T);
        // SAFETY: configured, the tile has a shape (checked above).
        unsafe { self.ops.zero::<T>() }
    }

    /// Loads tile `T`: row `r` from `src[r · stride ..]` (in elements of `src`).
    pub fn load<const T: u8, W: Word>(&mut self, src: &[W], stride: usize) {
        let shape = self.shape(T);
        let size = size_of::<W>();
        let stride = stride.checked_mul(size).expect("a tile stride in bytes");
        Self::check_extent(shape, stride, std::mem::size_of_val(src));
        // SAFETY: configured; every row lies inside `src` (checked above).
        unsafe { self.ops.load::<T>(src.as_ptr().cast(), stride) }
    }

    /// Stores tile `T`: row `r` into `dst[r · stride ..]` (f32 elements).
    pub fn store<const T: u8>(&mut self, dst: &mut [f32], stride: usize) {
        let shape = self.shape(T);
        let stride = stride.checked_mul(4).expect("a tile stride in bytes");
        Self::check_extent(shape, stride, std::mem::size_of_val(dst));
        // SAFETY: configured; every row lies inside `dst` (checked above).
        unsafe { self.ops.store::<T>(dst.as_mut_ptr().cast(), stride) }
    }

    /// `tdpbf16ps tmmC, tmmA, tmmB`: `C += A · B` on bf16 pairs.
    pub fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        let (c, a, b) = (self.shape(C), self.shape(A), self.shape(B));
        assert!(C != A && C != B && A != B, "tdpbf16ps on distinct tiles");
        assert!(
            c.0 == a.0 && c.1 == b.1 && a.1 == 4 * b.0,
            "tdpbf16ps shapes: C {c:?}, A {a:?}, B {b:?}"
        );
        // SAFETY: configured; distinct tiles of compatible, non-empty shapes (checked above).
        unsafe { self.ops.dpbf16ps::<C, A, B>() }
    }
}

impl<O: TileOps> Drop for Unit<O> {
    fn drop(&mut self) {
        if self.cfg.is_some() {
            self.ops.release();
        }
    }
}
