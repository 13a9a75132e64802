//! Tests of the attention variants: sliding window, per-sequence key lengths, bias, boolean
//! mask, ALiBi, softcap, attention sinks, `merge_partials`, and block skipping.
//!
//! * [`hand`]: one small case per feature with the expected numbers worked out by hand (d = 1
//!   and scale 1, so a score is just `q·k`), for both the fused kernel and the reference.
//! * [`grid`]: random combinations of every option on random shapes and layouts, the fused
//!   kernel against the f64 reference within `reference::error_bounds`, including decode shapes
//!   that take the split-KV path and an "every key matters" check on block/split boundaries.
//! * [`errors`]: every invalid option is a typed error, never a panic.
//! * [`merge`]: `merge_partials` over keys split at random points, against the unsplit problem.
//! * [`tiles`]: the `count_score_tiles` hook shows masked key blocks are skipped.
//!
//! Every random test names its seed. Shapes, layouts, buffers, runners and the differential
//! check are the shared ones of `tests/support` (`support::harness`).

use crate::support;

mod errors;
mod grid;
mod hand;
mod merge;
mod tiles;

use sdpa::{Error, Options, Tensor};
pub use support::harness::{
    rng, Buffer, Layout, Outputs as Run, Path, OUTPUT_INIT_BITS as OUT_INIT_BITS,
};

/// Unit roundoff of f32, `2⁻²⁴`.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// What [`check`] saw.
pub type Checked = support::harness::Comparison;

/// Runs `path` with LSE into an output laid out by `out_layout` (see
/// [`support::harness::try_run`]).
pub fn run(
    path: Path,
    q: &Tensor<'_, f32>,
    k: &Tensor<'_, f32>,
    v: &Tensor<'_, f32>,
    opts: &Options<'_>,
    out_layout: Layout,
) -> Result<Run, Error> {
    support::harness::try_run(path, q, k, v, out_layout, opts)
}

/// The differential check of [`support::harness::assert_views_close_to_reference`].
pub fn check(
    label: &str,
    q: &Tensor<'_, f32>,
    k: &Tensor<'_, f32>,
    v: &Tensor<'_, f32>,
    opts: &Options<'_>,
    out_layout: Layout,
) -> Checked {
    let views = support::harness::Views {
        q: *q,
        k: *k,
        v: *v,
    };
    support::harness::assert_views_close_to_reference(&views, out_layout, opts, label)
}
