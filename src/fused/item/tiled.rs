//! bf16 products on AMX tiles ([`Blocking::tiles`](crate::fused::blocking::Blocking::tiles)):
//! a prefill item's key-block loop with both products as `tdpbf16ps`
//! ([`crate::microkernel::amx`]); the stages between them are the vector kernel's.
//!
//! ```text
//! stage                    what
//! tile_queries             Qᵀ panels by channel pairs, once per item
//! for each key block:
//!     tile_keys            K rows as channel pairs: bf16 rows where they are stored, else
//!                          rounded into a buffer; a block of fewer than 16 keys zero-padded
//!     tile_scores          Sᵀ = K·Qᵀ on tiles, then scaled into the log2 domain with each
//!                          row's maximum (a vector pass); softcap, ALiBi
//!     bias_and_masks,      the vector kernel's: P = 2^(S − m') in place of Sᵀ in f32,
//!     softmax_update       l summing the f32 weights
//!     tile_weights         P rounded to bf16 and paired by keys, row by row (Sᵀ transposed)
//!     tile_values          V by key pairs (bf16 rows as stored, or load_values' rows)
//!     tile_output          O = α ⊙ O (a vector pass), then O += P·V on tiles
//!     add_non_finite_values
//! ```
//!
//! The numerics are those of the bf16 dot products (the same rounded operands, f32
//! accumulation, `error_bounds` of `bf16_products`); only the order of the f32 additions inside
//! a product differs (the tile's, see [`crate::microkernel::amx::model`]).
//!
//! Pairing rounds with the CPU's conversion where it has AVX512_BF16 ([`Blocking::pairs`],
//! always with AMX hardware), else lane by lane (the software model on other CPUs): the values
//! agree wherever `tdpbf16ps` can tell (it reads bf16 subnormals as zero).
//!
//! [`Blocking::pairs`]: crate::fused::blocking::Blocking::pairs

use super::modifiers::{alibi_distances, bias_and_masks, modify_scores};
use super::ranges::{all_rows_see, panel_keys, Block};
use super::softmax::softmax_update;
use super::values::{add_non_finite_values, all_finite, load_values};
use super::work::{Ctx, Item, Tiles};
use crate::fused::kv::{KeyRange, KvSource, Rows};
use crate::fused::scratch::{KvBuffers, PairBuffers, Scratch, TileBuffers};
use crate::microkernel::amx::kernels::{
    config, output_rows, pair_step, scores_panel, OutputGroup, ScorePanel, EDGE, MAX_STEP,
};
use crate::microkernel::amx::unit::{TileOps, Unit};
use crate::microkernel::amx::Dispatch;
use crate::microkernel::dpbf16::{Bf16Dot, PairKeys, Pairable};
use crate::simd::{Kernel, Lanes, Simd};
use half::bf16;
use std::f32::consts::LOG2_E;

/// How values are rounded to bf16 and paired into 32-bit words: the CPU's conversion
/// ([`Bf16Dot`]) or lane by lane ([`word`]).
#[derive(Clone, Copy)]
pub(super) struct Pairing(pub(super) Option<Bf16Dot>);

/// `bf16(a) | bf16(b) << 16` as an f32 slot, rounded to nearest, ties to even.
fn word(a: f32, b: f32) -> f32 {
    let (a, b) = (bf16::from_f32(a).to_bits(), bf16::from_f32(b).to_bits());
    f32::from_bits(u32::from(a) | u32::from(b) << 16)
}

impl Pairing {
    /// `x` as a row of channel pairs into `dst[.. ⌈x.len() / 2⌉]` (a zero after an odd length).
    #[inline(always)]
    fn row<E: Pairable + Lanes>(self, x: &[E], dst: &mut [f32]) {
        match self.0 {
            Some(bf) => E::pair_row(bf, x, dst),
            None => {
                for (p, d) in dst[..x.len().div_ceil(2)].iter_mut().enumerate() {
                    let hi = x.get(2 * p + 1).map_or(0.0, |v| v.scalar());
                    *d = word(x[2 * p].scalar(), hi);
                }
            }
        }
    }

    /// Rows `a` and `b` (zeros if `None`) interleaved element by element into `dst`.
    #[inline(always)]
    fn interleave<E: Pairable + Lanes>(self, a: &[E], b: Option<&[E]>, dst: &mut [f32]) {
        match self.0 {
            Some(bf) => E::interleave(bf, a, b, dst),
            None => {
                for (x, d) in dst.iter_mut().enumerate() {
                    *d = word(a[x].scalar(), b.map_or(0.0, |b| b[x].scalar()));
                }
            }
        }
    }

    /// Two vectors paired lane by lane into `dst[.. LANES]`.
    #[inline(always)]
    fn vectors<S: Simd>(self, s: S, a: S::V, b: S::V, dst: &mut [f32]) {
        match self.0 {
            Some(bf) => s.pair_bf16(bf, a, b, dst),
            None => {
                let mut x = [0.0f32; 32];
                s.store(&mut x[..S::LANES], a);
                s.store(&mut x[16..16 + S::LANES], b);
                for (i, d) in dst[..S::LANES].iter_mut().enumerate() {
                    *d = word(x[i], x[16 + i]);
                }
            }
        }
    }
}

/// The key-block loop of one prefill item on tiles, run through the lanes' entry point (with
/// BF16 enabled too where the CPU has it, so that the pairing compiles into its loops).
pub(super) struct TiledLoop<'a, 'c, KV> {
    pub(super) cx: &'a Ctx<'c, KV>,
    pub(super) item: &'a Item,
    pub(super) t: Tiles,
    pub(super) keys: (usize, usize),
    pub(super) sc: &'a mut Scratch,
    pub(super) unit: &'a mut Unit<Dispatch>,
}

impl<KV: KvSource> TiledLoop<'_, '_, KV> {
    /// Runs the loop on the AVX-512 lanes with BF16 where the blocking pairs with the CPU's
    /// conversion (the hardware, or the model on such a CPU), else (the model elsewhere) on
    /// `s`'s lanes, which are then 8 wide ([`Blocking::for_problem`]). So the loop compiles
    /// once per 8-lane backend and once for AVX-512 with BF16, not for AVX-512 alone.
    ///
    /// [`Blocking::for_problem`]: crate::fused::blocking::Blocking::for_problem
    #[inline(always)]
    pub(super) fn start<S: Simd>(self, s: S) {
        if let Some(bf) = self.cx.blocking.pairs {
            bf.run(self);
        } else if S::LANES == 8 {
            s.run(self);
        } else {
            unreachable!("tiles without the CPU's bf16 pairing on 16 lanes");
        }
    }
}

impl<KV: KvSource> Kernel for TiledLoop<'_, '_, KV> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let TiledLoop {
            cx,
            item,
            t,
            keys: (first, last),
            sc,
            unit,
        } = self;
        tiled_loop(s, cx, item, &t, (first, last), sc, unit);
    }
}

/// The stages of each key block (module docs).
#[inline(always)]
fn tiled_loop<S: Simd, KV: KvSource, O: TileOps>(
    s: S,
    cx: &Ctx<'_, KV>,
    item: &Item,
    t: &Tiles,
    (first, last): (usize, usize),
    sc: &mut Scratch,
    unit: &mut Unit<O>,
) {
    let bl = &cx.blocking;
    let pairing = Pairing(bl.pairs);
    let Scratch {
        tile, kv, pairs, ..
    } = sc;
    let KvBuffers {
        k: k_buf,
        v: v_buf,
        v_row,
        non_finite,
        ..
    } = kv;
    let PairBuffers {
        qt: q_pairs,
        k: k_pairs,
        v: v_pairs,
        p: p_pairs,
        stage,
    } = pairs;
    let kp = bl.tile_pairs();
    tile_queries(pairing, t, &tile.qt, q_pairs, 2 * S::LANES);
    let mut count = 0;
    let mut j0 = first;
    while j0 < last {
        let j1 = j0 + (last - j0).min(bl.kv_block);
        let block = Block {
            j0,
            j1,
            seen_by_all: all_rows_see(tile, t.rows, j0, j1),
        };
        let c = block.len();
        let at = KeyRange {
            batch: item.batch,
            kv_head: item.kv_head,
            j0,
            len: c,
        };
        let isolate = cx.problem.mask.is_some() || !block.seen_by_all;
        let keys = tile_keys(s, pairing, &cx.kv, at, t.d_k, k_buf, k_pairs, stage);
        count += tile_scores(s, cx, item, t, &block, keys, tile, q_pairs, unit);
        bias_and_masks(cx, item, t, &block, tile);
        let p = cx.problem;
        let known_max = !isolate && p.softcap.is_none() && p.alibi.is_none() && p.bias.is_none();
        softmax_update(s, t, &block, known_max, tile, None, None);
        let used = c.div_ceil(2).div_ceil(MAX_STEP) * MAX_STEP;
        tile_weights(s, pairing, t, c, &tile.st, p_pairs, kp);
        let in_place = cx
            .kv
            .values_in::<bf16>(at, t.d_vp)
            .filter(|v| !isolate || all_finite(s, *v, c, t.d_vp));
        let loaded = match in_place {
            Some(v) => {
                tile_values(pairing, (c, used), t.d_vp, v, v_pairs);
                false
            }
            None => {
                let v = load_values(s, &cx.kv, at, t, isolate, v_buf, non_finite);
                tile_values(pairing, (c, used), t.d_vp, v, v_pairs);
                true
            }
        };
        let group = OutputGroup {
            pa: p_pairs,
            ld_p: kp,
            pv: v_pairs,
            d_vp: t.d_vp,
        };
        tile_output(s, unit, t, &block, tile, &group);
        if loaded {
            add_non_finite_values(s, cx, item, t, at, 0..t.rows, non_finite, v_row, tile);
        }
        j0 = block.j1;
    }
    sc.tiles += count;
}

/// The Qᵀ panels (`nr` rows each, `qt[p · nr + r]`) by channel pairs: step `p` of a pair
/// panel holds each row's channels `2p` and `2p + 1` (zero past an odd `d_k`).
fn tile_queries(pairing: Pairing, t: &Tiles, qt: &[f32], pairs: &mut [f32], nr: usize) {
    let (d, d2) = (t.d_k, t.d_k.div_ceil(2));
    for panel in 0..t.ld_s.div_ceil(nr) {
        let src = &qt[panel * nr * d..][..nr * d];
        let dst = &mut pairs[panel * nr * d2..][..nr * d2];
        for (p, step) in dst.chunks_exact_mut(nr).enumerate() {
            let odd = (2 * p + 1 < d).then(|| &src[(2 * p + 1) * nr..][..nr]);
            pairing.interleave::<f32>(&src[2 * p * nr..][..nr], odd, step);
        }
    }
}

/// The block's K rows as rows of `⌈d_k / 2⌉` channel pairs, at least 16 of them (what the
/// score tiles read): bf16 rows in place where every pair is one 32-bit word of a row (an even
/// head size, an even row stride, the block's rows not split between pages), else rounded
/// into `pairs_k` (f32 rows from [`KvSource::keys`]); a block of fewer than 16 keys copied
/// into `stage`, zero-padded to 16 rows.
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
fn tile_keys<'s, S: Simd, KV: KvSource>(
    s: S,
    pairing: Pairing,
    kv: &'s KV,
    at: KeyRange,
    d_k: usize,
    k_buf: &'s mut [f32],
    pairs_k: &'s mut [f32],
    stage: &'s mut [f32],
) -> PairKeys<'s> {
    fn pair_rows<E: Pairable + Lanes>(
        p: Pairing,
        rows: Rows<'_, E>,
        at: KeyRange,
        d_k: usize,
        dst: &mut [f32],
    ) {
        let d2 = d_k.div_ceil(2);
        for j in 0..at.len {
            p.row(rows.row(j, d_k), &mut dst[j * d2..][..d2]);
        }
    }
    let d2 = d_k.div_ceil(2);
    let mut keys = None;
    if let Some(rows) = kv.keys_in::<bf16>(at) {
        let (data, adjacent) = rows.run(0, at.len);
        let words = d_k.is_multiple_of(2) && rows.ld.is_multiple_of(2) && rows.ld >= d_k;
        if adjacent == at.len && words {
            keys = Some(PairKeys::Bf16(data, rows.ld));
        } else {
            pair_rows(pairing, rows, at, d_k, pairs_k);
        }
    } else {
        pair_rows(pairing, kv.keys(s, at, k_buf), at, d_k, pairs_k);
    }
    let keys = keys.unwrap_or(PairKeys::Words(pairs_k, d2));
    if at.len >= EDGE {
        return keys;
    }
    let stage = &mut stage[..EDGE * d2];
    stage.fill(0.0);
    for (j, dst) in stage.chunks_exact_mut(d2).take(at.len).enumerate() {
        match keys {
            PairKeys::Words(w, ld) => dst.copy_from_slice(&w[j * ld..][..d2]),
            PairKeys::Bf16(b, ld) => {
                for (p, d) in dst.iter_mut().enumerate() {
                    let (lo, hi) = (b[j * ld + 2 * p].to_bits(), b[j * ld + 2 * p + 1].to_bits());
                    *d = f32::from_bits(u32::from(lo) | u32::from(hi) << 16);
                }
            }
        }
    }
    PairKeys::Words(stage, d2)
}

/// `Sᵀ = K · Qᵀ` on tiles, panel by panel over the keys some row of the panel sees, then scaled
/// into the log2 domain with each row's block maximum taken (a vector pass), then softcap and
/// ALiBi. Returns the score tiles the vector kernel would have computed (`⌈keys / TILE⌉` per
/// panel), which `Options::count_score_tiles` compares.
#[allow(clippy::too_many_arguments)] // one stage's operands
#[inline(always)]
fn tile_scores<S: Simd, O: TileOps>(
    s: S,
    cx: &Ctx<'_, impl KvSource>,
    item: &Item,
    t: &Tiles,
    block: &Block,
    keys: PairKeys<'_>,
    tile: &mut TileBuffers,
    q_pairs: &[f32],
    unit: &mut Unit<O>,
) -> u64 {
    let (nr, ld_s, d2) = (2 * S::LANES, t.ld_s, t.d_k.div_ceil(2));
    let p = cx.problem;
    alibi_distances(cx, item, t, block, tile);
    let step = pair_step(d2);
    unit.configure(&config(step));
    let mut count = 0;
    for r0 in (0..ld_s).step_by(nr) {
        let Some((plo, phi)) = panel_keys::<S>(t, block, r0, tile) else {
            continue;
        };
        count += (phi - plo).div_ceil(S::TILE) as u64;
        let width = (ld_s - r0).min(nr);
        let panel = ScorePanel {
            keys,
            qp: &q_pairs[(r0 / nr) * nr * d2..][..nr * d2],
            ld_q: nr,
            width,
            d2,
            step,
        };
        // (At least one tile of keys: past `phi` they are keys of the block no row of the
        // panel sees, or the stage's zero rows; Sᵀ holds `kv_block ≥ 16` rows.)
        scores_panel(unit, &panel, (plo, phi.max(EDGE)), &mut tile.st[r0..], ld_s);
        let factors = [p.scale, LOG2_E];
        let max = &mut tile.block_max[r0..r0 + width];
        scale_scores(s, &mut tile.st[r0..], ld_s, (plo, phi), factors, max);
        if p.softcap.is_some() || p.alibi.is_some() {
            modify_scores(s, cx, t, r0, (plo, phi), false, tile);
        }
    }
    count
}

/// Keys `[plo, phi)` of a panel's dot products (`max.len()` rows from `st`'s start, key `j` at
/// `st[j · ld_s ..]`) times `factors` in order (the vector tiles' two roundings), and each
/// row's largest into `max`.
#[inline(always)]
fn scale_scores<S: Simd>(
    s: S,
    st: &mut [f32],
    ld_s: usize,
    (plo, phi): (usize, usize),
    factors: [f32; 2],
    max: &mut [f32],
) {
    let (f0, f1) = (s.splat(factors[0]), s.splat(factors[1]));
    for v in (0..max.len()).step_by(S::LANES) {
        let mut mx = s.splat(f32::NEG_INFINITY);
        for j in plo..phi {
            let x = &mut st[j * ld_s + v..][..S::LANES];
            let y = s.mul(s.mul(s.load(x), f0), f1);
            s.store(x, y);
            mx = s.max(mx, y);
        }
        s.store(&mut max[v..], mx);
    }
}

/// The block's weights (f32, in Sᵀ) rounded to bf16 and paired by keys, row by row: pair `jp`
/// of row `r` at `pa[r · kp + jp]` holds keys `2jp` and `2jp + 1` (zeros past the block's `c`
/// keys, up to whole tile steps), for every row of `ld_s`. Lane groups of rows × lanes of
/// pairs are paired as vectors (pair `jp` of `LANES` rows) and transposed in registers.
#[inline(always)]
fn tile_weights<S: Simd>(
    s: S,
    pairing: Pairing,
    t: &Tiles,
    c: usize,
    st: &[f32],
    pa: &mut [f32],
    kp: usize,
) {
    let (l, ld_s) = (S::LANES, t.ld_s);
    let c2 = c.div_ceil(2);
    let used = c2.div_ceil(MAX_STEP) * MAX_STEP;
    let mut words = [0.0f32; 256];
    for r0 in (0..ld_s).step_by(l) {
        for jp0 in (0..used).step_by(l) {
            let mut v = [s.splat(0.0); 16];
            for (i, x) in v.iter_mut().enumerate().take(l) {
                let jp = jp0 + i;
                if jp < c2 {
                    let a = s.load(&st[2 * jp * ld_s + r0..]);
                    let b = if 2 * jp + 1 < c {
                        s.load(&st[(2 * jp + 1) * ld_s + r0..])
                    } else {
                        s.splat(0.0)
                    };
                    pairing.vectors(s, a, b, &mut words[i * l..]);
                    *x = s.load(&words[i * l..]);
                }
            }
            s.transpose(&mut v[..l]);
            for (r, x) in v.iter().enumerate().take(l) {
                s.store(&mut pa[(r0 + r) * kp + jp0..], *x);
            }
        }
    }
}

/// The V rows of a block's `c` keys by key pairs for the output tiles: pair `jp` at
/// `pv[jp · d_vp ..]` holds rows `2jp` and `2jp + 1` interleaved channel by channel, zeros
/// past `c` and up to `used` pairs (whole tile steps).
fn tile_values<E: Pairable + Lanes>(
    pairing: Pairing,
    (c, used): (usize, usize),
    d_vp: usize,
    values: Rows<'_, E>,
    pv: &mut [f32],
) {
    let c2 = c.div_ceil(2);
    for jp in 0..c2 {
        let (a, b) = (2 * jp, 2 * jp + 1);
        let second = (b < c).then(|| values.row(b, d_vp));
        pairing.interleave(values.row(a, d_vp), second, &mut pv[jp * d_vp..][..d_vp]);
    }
    pv[c2 * d_vp..used * d_vp].fill(0.0);
}

/// `O = α ⊙ O + P · V` for groups of 32 rows (16 at the end) that see a key of the block:
/// each row rescaled by its `α` (a vector pass over O), then the tiles over the key pairs that
/// hold the group's visible keys, rounded out to whole tile steps. A pair a row does not see
/// has weight 0, and its value is finite (a block that some row does not see see has its
/// non-finite value rows set aside by [`load_values`], or zeros past its end), so it adds
/// exactly nothing.
#[inline(always)]
fn tile_output<S: Simd, O: TileOps>(
    s: S,
    unit: &mut Unit<O>,
    t: &Tiles,
    block: &Block,
    tile: &mut TileBuffers,
    group: &OutputGroup<'_>,
) {
    let d_vp = t.d_vp;
    unit.configure(&config(MAX_STEP));
    for r0 in (0..t.rows).step_by(2 * EDGE) {
        let m = ((t.ld_s - r0) / EDGE).min(2);
        let real = r0..(r0 + m * EDGE).min(t.rows);
        let Some((glo, ghi)) = block.seen_by(&tile.lo[real.clone()], &tile.hi[real]) else {
            continue;
        };
        for r in r0..r0 + m * EDGE {
            let alpha = s.splat(tile.alpha[r]);
            for x in tile.o[r * d_vp..][..d_vp].chunks_exact_mut(S::LANES) {
                s.store(x, s.mul(s.load(x), alpha));
            }
        }
        let p0 = glo / 2 / MAX_STEP * MAX_STEP;
        let p1 = ghi.div_ceil(2).div_ceil(MAX_STEP) * MAX_STEP;
        output_rows(unit, group, (r0, m), (p0, p1), &mut tile.o[r0 * d_vp..]);
    }
}
