//! The one test harness: shapes, layouts, buffers with sentinels, random problems and options,
//! and the checks against `sdpa::reference` and its `error_bounds`, shared by the integration
//! tests (the one test binary `tests/it/`, whose modules include the stable replay of the fuzz
//! targets, `tests/it/fuzz_stable.rs`, and the Miri subset, `tests/it/miri.rs`), Miri's own
//! test target (`tests/miri.rs`) and the cargo-fuzz targets (`fuzz/`).
//!
//! Why a module included by path rather than a crate: the fuzz project is its own workspace on
//! nightly with libFuzzer, which the main crate's tests must not depend on, and the main crate
//! cannot dev-depend on a crate inside it. This directory depends only on `sdpa`, `arbitrary`,
//! `rand` and `rayon`, so every side compiles it as a plain module: the integration tests with
//! `#[path = "../support/mod.rs"] mod support;` in `tests/it/main.rs`, once for all their
//! modules (which `use crate::support;`); Miri's target with `mod support;` in `tests/miri.rs`
//! (empty outside Miri); the fuzz crate's library with
//! `#[path = "../../tests/support/mod.rs"]`. (`tests/memory.rs` includes only the files it
//! needs.) It is not a test target itself (Cargo only picks up `tests/*.rs` and
//! `tests/*/main.rs`). Each test binary compiles and links what it includes of this directory
//! (about 8,700 lines) once more, which is why the integration tests are one binary.
//!
//! * [`bytes`]: how bytes decode to values (and encode back, for the seed corpora);
//! * [`layout`]: the one layout type and the one buffer type (with sentinel padding);
//! * [`values`]: the one deterministic generator ([`values::SplitMix`]) and value fills;
//! * [`opts`]: the one generator of options ([`opts::OptSpec`]) and the model of what they mean;
//! * [`contract`]: the one check of a fused result against the reference and its bound, row
//!   by row, which every other checker goes through;
//! * [`differential`]: the one shape ([`differential::Shape`]), problems, and the fuzz
//!   oracle's fused-vs-reference check; [`harness`]: running views and checking hand-made
//!   problems; [`api`]: the no-panic / typed-error check; [`merge`]: `merge_partials`;
//! * [`kv_cache`]: paged and packed K/V (`attention_paged`, `attention_varlen`): tables and
//!   offsets valid and broken, against the documented errors, the dense call and the reference;
//! * [`serving`]: serving episodes (append with RoPE, a `Plan` per step, two layers) against
//!   `reference::append` and `reference::attention_varlen`;
//! * [`append`]: `append` on a pool of a given size, for thread-count comparisons;
//! * [`seeds`]: the named seed inputs written to `fuzz/corpus/<target>/`;
//! * [`counting_alloc`]: the counting global allocator (`benches/support/counting_alloc.rs`).
//!
//! Adding an option means teaching [`opts::OptSpec`] (decode, encode, materialize, the model
//! and its errors) and nothing else: every generator and checker goes through it.

#![allow(dead_code)] // each includer uses a different part

pub mod api;
pub mod append;
pub mod bytes;
pub mod contract;
#[path = "../../benches/support/counting_alloc.rs"]
pub mod counting_alloc;
pub mod differential;
#[cfg(test)]
pub mod harness;
pub mod kv_cache;
pub mod layout;
pub mod merge;
pub mod opts;
pub mod seeds;
pub mod serving;
pub mod typed;
pub mod values;

use arbitrary::Unstructured;

/// `sdpa::alibi_slopes(n)` as a `Result`, whether the crate's function returns `Vec<f32>`
/// (infallible, aborting on a huge `n`) or `Result<Vec<f32>, Error>` (fallible): the tests
/// compile against either while the signature changes.
pub fn alibi_slopes(n: usize) -> Result<Vec<f32>, sdpa::Error> {
    Slopes::into_result(sdpa::alibi_slopes(n))
}

/// Whether `sdpa::alibi_slopes` returns a `Result` (then any `n` may be passed).
pub fn alibi_slopes_is_fallible() -> bool {
    fn of<T: Slopes>(_: fn(usize) -> T) -> bool {
        T::FALLIBLE
    }
    of(sdpa::alibi_slopes)
}

trait Slopes {
    const FALLIBLE: bool;
    fn into_result(self) -> Result<Vec<f32>, sdpa::Error>;
}

impl Slopes for Vec<f32> {
    const FALLIBLE: bool = false;
    fn into_result(self) -> Result<Vec<f32>, sdpa::Error> {
        Ok(self)
    }
}

impl Slopes for Result<Vec<f32>, sdpa::Error> {
    const FALLIBLE: bool = true;
    fn into_result(self) -> Self {
        self
    }
}

/// The fuzz targets, by corpus directory name.
pub const TARGETS: [&str; 5] = ["differential", "api", "merge", "kv_cache", "serving"];

/// Decodes `data` as an input of `target` and checks it (panicking on a violation).
/// Returns `false` if `target` is not one of [`TARGETS`].
pub fn run(target: &str, data: &[u8]) -> bool {
    let mut u = Unstructured::new(data);
    match target {
        "differential" => {
            if let Ok(case) = differential::DiffCase::decode(&mut u) {
                differential::check(&case);
            }
            true
        }
        "api" => {
            if let Ok(case) = api::ApiCase::decode(&mut u) {
                api::check(&case);
            }
            true
        }
        "merge" => {
            if let Ok(case) = merge::MergeCase::decode(&mut u) {
                merge::check(&case);
            }
            true
        }
        "kv_cache" => {
            if let Ok(case) = kv_cache::KvCacheCase::decode(&mut u) {
                kv_cache::check(&case);
            }
            true
        }
        "serving" => {
            if let Ok(case) = serving::ServingCase::decode(&mut u) {
                serving::check(&case);
            }
            true
        }
        _ => false,
    }
}
