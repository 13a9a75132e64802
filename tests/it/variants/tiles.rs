//! Block skipping, seen through the `count_score_tiles` test hook: the fused kernel adds the
//! number of score tiles it computes. A tile is one register tile of keys × stacked query rows,
//! whose size depends on the SIMD backend (6 × 16 on AVX2, 12 × 32 on AVX-512), so these tests
//! only compare counts with each other: against the full (unmasked) count of the same shape, and
//! across sequence lengths.
//!
//! Full attention computes every (row, key) pair: `full ≈ n² / pairs per tile`. Any kernel must
//! compute at least the visible pairs, so `tiles / full ≳ visible pairs / n²`, and one that skips
//! invisible blocks computes not much more than that (the tiles straddling the edge of the
//! visible band are computed whole).

use super::{rng, Buffer, Layout};
use sdpa::{Alignment, Options, TensorMut};
use std::sync::atomic::{AtomicU64, Ordering};

const D: usize = 64;
const W: usize = 64;

/// Score tiles the fused kernel computes for `n_q = n_kv = n`, B = 1, H = 1, d = 64 under
/// `opts` (the counter is added to them).
fn tiles(n: usize, opts: &Options<'_>) -> u64 {
    let mut rng = rng(n as u64);
    let q = Buffer::uniform(&mut rng, [1, n, 1, D], Layout::BSHD, -1.0, 1.0);
    let k = Buffer::uniform(&mut rng, [1, n, 1, D], Layout::BSHD, -1.0, 1.0);
    let mut out = vec![0.0f32; n * D];
    let counter = AtomicU64::new(0);
    let o = opts.clone().count_score_tiles(&counter);
    sdpa::attention(
        &q.view(),
        &k.view(),
        &k.view(),
        &mut TensorMut::bshd(&mut out, [1, n, 1, D]).unwrap(),
        &o,
    )
    .unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
    counter.load(Ordering::Relaxed)
}

/// Visible (row, key) pairs of a causal window of `w` keys (the diagonal and `w − 1` before it).
fn window_pairs(n: usize, w: usize) -> u64 {
    (0..n).map(|i| (i + 1).min(w) as u64).sum()
}

#[test]
fn sliding_window_touches_linear_not_quadratic_tiles() {
    let ns = [512usize, 1024, 2048, 4096];
    let window = Options::new()
        .causal(Alignment::BottomRight)
        .sliding_window(W - 1, 0, Alignment::BottomRight);
    let counts: Vec<u64> = ns.iter().map(|&n| tiles(n, &window)).collect();
    let full: Vec<u64> = ns.iter().map(|&n| tiles(n, &Options::new())).collect();
    eprintln!("window {W}: {counts:?}; full: {full:?}");
    for (t, &n) in ns.iter().enumerate() {
        // Between the visible fraction (the least any kernel computes) and 2.5 times it (the band's
        // ragged edges, whole tiles of 12 × 32 around a band of width 64, at most).
        let visible = window_pairs(n, W) as f64 / (n * n) as f64;
        let fraction = counts[t] as f64 / full[t] as f64;
        assert!(
            fraction >= 0.9 * visible && fraction <= 2.5 * visible,
            "n = {n}: {} of {} tiles ({fraction:.4}), visible pairs {visible:.4}",
            counts[t],
            full[t]
        );
    }
    // Linear in n: doubling n doubles the count (within 5%), while the full count quadruples.
    for t in 1..ns.len() {
        let r = counts[t] as f64 / counts[t - 1] as f64;
        assert!(
            (1.9..=2.1).contains(&r),
            "{} → {}: ratio {r}",
            ns[t - 1],
            ns[t]
        );
        let r = full[t] as f64 / full[t - 1] as f64;
        assert!(
            (3.9..=4.1).contains(&r),
            "full {} → {}: ratio {r}",
            ns[t - 1],
            ns[t]
        );
    }
    // Far below the full count: under 4% of it at n = 4096 (w/n = 1.6%).
    assert!(
        counts[3] * 25 < full[3],
        "window/full at 4096: {counts:?} {full:?}"
    );
}

#[test]
fn causal_and_kv_lens_skip_their_share() {
    let n = 2048;
    let full = tiles(n, &Options::new());
    let causal_br = tiles(n, &Options::new().causal(Alignment::BottomRight));
    let causal_tl = tiles(n, &Options::new().causal(Alignment::TopLeft));
    let lens = [n / 4];
    let quarter = tiles(n, &Options::new().kv_lens(&lens));
    eprintln!("n = {n}: full {full}, causal {causal_br}/{causal_tl}, kv_lens n/4 {quarter}");
    // Causal: about half (the diagonal blocks are computed whole: a little over half).
    let r = causal_br as f64 / full as f64;
    assert!((0.5..=0.56).contains(&r), "causal/full = {r}");
    assert_eq!(causal_br, causal_tl, "n_q = n_kv: the alignments agree");
    // A quarter of the keys: a quarter of the tiles.
    let r = quarter as f64 / full as f64;
    assert!((0.25..=0.26).contains(&r), "kv_lens n/4 / full = {r}");
}
