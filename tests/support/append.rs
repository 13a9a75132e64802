//! `append` on a pool of a given size, for the tests that compare thread counts
//! (`tests/it/append.rs` with a prompt's rows, `tests/it/miri.rs` with a few under Miri).

use sdpa::half::f16;
use sdpa::{append, append_scaled, Rope, RopeStyle, Tensor, TensorMut};

use super::values::SplitMix;

/// The f16 sentinel of unwritten elements (`append` writes values in [-1, 1)).
pub const F16_UNWRITTEN: f32 = 9.0;

/// What [`append_on`] wrote: f16 K then V pools (bits), i8 K then V pools with per-token
/// scales, those scales (bits), and i8 K then V pools with the given scale [`GIVEN`].
/// Unwritten elements keep their sentinels: [`F16_UNWRITTEN`], `i8::MIN` (never written:
/// rows saturate at ±127), scale −1.
#[derive(PartialEq, Debug)]
pub struct Written {
    pub f16: Vec<u16>,
    pub i8: Vec<i8>,
    pub scales: Vec<u32>,
    pub given: Vec<i8>,
}

/// The per-tensor scale of [`Written::given`].
pub const GIVEN: f32 = 0.004;

/// `n` tokens of K and V (`[1, n, hkv, d]`, values of seeds 80 and 81 in [-1, 1)) appended at
/// `slots` into pools `[pages, page, hkv, d]` on a rayon pool of `threads`: into f16 and into
/// i8 (per-token scales) with K rotated (halves, θ 10,000) at `positions`, and into i8 with
/// the scale [`GIVEN`] unrotated. Returns the caches and the rows `(k, v)`.
pub fn append_on(
    threads: usize,
    [n, hkv, d]: [usize; 3],
    [pages, page]: [usize; 2],
    slots: &[usize],
    positions: &[u32],
) -> (Written, (Vec<f32>, Vec<f32>)) {
    let pool = [pages, page, hkv, d];
    let k = SplitMix::unit_values(n * hkv * d, 80);
    let v = SplitMix::unit_values(n * hkv * d, 81);
    let rope = Rope::new(RopeStyle::Halves, d, 10_000.0);
    let size = pages * page * hkv * d;
    let run = || {
        let rows = [1, n, hkv, d];
        let (kt, vt) = (
            Tensor::bshd(&k, rows).unwrap(),
            Tensor::bshd(&v, rows).unwrap(),
        );
        let mut f = vec![f16::from_f32(F16_UNWRITTEN); 2 * size];
        let (kf, vf) = f.split_at_mut(size);
        let rope = Some((&rope, positions));
        let (mut kc, mut vc) = (
            TensorMut::bshd(kf, pool).unwrap(),
            TensorMut::bshd(vf, pool).unwrap(),
        );
        append(&kt, &vt, &mut kc, &mut vc, slots, None, rope).unwrap();
        let mut q8 = vec![i8::MIN; 2 * size];
        let (k8, v8) = q8.split_at_mut(size);
        let mut scales = vec![-1.0f32; 2 * pages * page * hkv];
        let (ks, vs) = scales.split_at_mut(pages * page * hkv);
        let sd = [pages, page, hkv, 1];
        append(
            &kt,
            &vt,
            &mut TensorMut::bshd(k8, pool).unwrap(),
            &mut TensorMut::bshd(v8, pool).unwrap(),
            slots,
            Some((
                &mut TensorMut::bshd(ks, sd).unwrap(),
                &mut TensorMut::bshd(vs, sd).unwrap(),
            )),
            rope,
        )
        .unwrap();
        let mut given = vec![i8::MIN; 2 * size];
        let (kg, vg) = given.split_at_mut(size);
        let g = [GIVEN];
        let g = Tensor::bshd(&g, [1, 1, 1, 1]).unwrap();
        append_scaled(
            &kt,
            &vt,
            &mut TensorMut::bshd(kg, pool).unwrap(),
            &mut TensorMut::bshd(vg, pool).unwrap(),
            slots,
            &g,
            &g,
            None,
        )
        .unwrap();
        Written {
            f16: f.iter().map(|x| x.to_bits()).collect(),
            i8: q8,
            scales: scales.iter().map(|x| x.to_bits()).collect(),
            given,
        }
    };
    let written = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(run);
    (written, (k, v))
}
