//! The software model of the tile instructions: eight tiles of 16 rows × 64 bytes as arrays,
//! with the arithmetic of `tdpbf16ps` as Intel's pseudocode defines it (Intel SDM, vol. 2,
//! TDPBF16PS):
//!
//! ```text
//! for each row m of C:
//!     even[n] = odd[n] = 0                     (n < colsb(C) / 4)
//!     for each pair k of A's row, for each n:
//!         even[n] = fma(A[m].bf16[2k],     B[k].bf16[2n],     even[n])
//!         odd[n]  = fma(A[m].bf16[2k + 1], B[k].bf16[2n + 1], odd[n])
//!     C[m][n] = C[m][n] + (even[n] + odd[n])
//! ```
//!
//! every operation in f32, rounded to nearest even, bf16 inputs that are subnormal read as zero
//! (DAZ) and subnormal results flushed to zero (FTZ). The product of two bf16 values is exact
//! in f32 (8-bit significands), so each `fma` is one rounding of the exact sum. (The intrinsics
//! guide's shorter pseudocode accumulates each pair straight into `C`: another order of the same
//! additions, inside the same error bound. Which one the hardware follows is checked where it
//! runs: `tests.rs` compares the two on every shape.)
//!
//! Loads and stores follow the configuration: a row of `colsb` bytes, the rest of the tile
//! zero; `ldtilecfg` and `tilerelease` zero every tile.

use super::unit::{TileConfig, TileOps, MAX_COLSB, MAX_ROWS, TILES};

/// The model's state: tiles as rows of 32-bit words, and the configuration in force.
pub(crate) struct Model {
    tiles: Box<[[[u32; MAX_COLSB / 4]; MAX_ROWS]; TILES]>,
    cfg: Option<TileConfig>,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            tiles: Box::new([[[0; MAX_COLSB / 4]; MAX_ROWS]; TILES]),
            cfg: None,
        }
    }
}

impl Model {
    fn shape(&self, t: u8) -> (usize, usize) {
        let cfg = self.cfg.as_ref().expect("configured (the unit checks)");
        cfg.shape(usize::from(t))
    }

    fn clear(&mut self) {
        for tile in self.tiles.iter_mut() {
            *tile = [[0; MAX_COLSB / 4]; MAX_ROWS];
        }
    }
}

/// bf16 bits as f32, subnormals read as zero (DAZ).
fn bf16_daz(bits: u16) -> f32 {
    let x = f32::from_bits(u32::from(bits) << 16);
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// `x` with a subnormal flushed to zero (FTZ).
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

impl TileOps for Model {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        self.cfg = Some(*cfg);
        self.clear();
    }

    fn release(&mut self) {
        self.cfg = None;
        self.clear();
    }

    unsafe fn zero<const T: u8>(&mut self) {
        self.tiles[usize::from(T)] = [[0; MAX_COLSB / 4]; MAX_ROWS];
    }

    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        let tile = &mut self.tiles[usize::from(T)];
        *tile = [[0; MAX_COLSB / 4]; MAX_ROWS];
        for (r, row) in tile.iter_mut().enumerate().take(rows) {
            for (w, word) in row.iter_mut().enumerate().take(colsb / 4) {
                // SAFETY: the caller's contract: `colsb` bytes at `src + r·stride`.
                let bytes = unsafe { src.add(r * stride + 4 * w).cast::<[u8; 4]>().read() };
                *word = u32::from_ne_bytes(bytes);
            }
        }
    }

    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        let tile = &self.tiles[usize::from(T)];
        for (r, row) in tile.iter().enumerate().take(rows) {
            for (w, word) in row.iter().enumerate().take(colsb / 4) {
                // SAFETY: the caller's contract: `colsb` bytes at `dst + r·stride`.
                unsafe {
                    dst.add(r * stride + 4 * w)
                        .cast::<[u8; 4]>()
                        .write(word.to_ne_bytes())
                };
            }
        }
    }

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        let (rows, colsb_c) = self.shape(C);
        let (_, colsb_a) = self.shape(A);
        let (a, b) = (self.tiles[usize::from(A)], self.tiles[usize::from(B)]);
        let c = &mut self.tiles[usize::from(C)];
        let lo = |w: u32| bf16_daz(w as u16);
        let hi = |w: u32| bf16_daz((w >> 16) as u16);
        for m in 0..rows {
            let mut even = [0.0f32; MAX_COLSB / 4];
            let mut odd = [0.0f32; MAX_COLSB / 4];
            for k in 0..colsb_a / 4 {
                for n in 0..colsb_c / 4 {
                    even[n] = ftz(lo(a[m][k]).mul_add(lo(b[k][n]), even[n]));
                    odd[n] = ftz(hi(a[m][k]).mul_add(hi(b[k][n]), odd[n]));
                }
            }
            for n in 0..colsb_c / 4 {
                let sum = ftz(even[n] + odd[n]);
                let acc = ftz(f32::from_bits(c[m][n]));
                c[m][n] = ftz(acc + sum).to_bits();
            }
            c[m][colsb_c / 4..].fill(0);
        }
        for row in c.iter_mut().skip(rows) {
            *row = [0; MAX_COLSB / 4];
        }
    }
}
