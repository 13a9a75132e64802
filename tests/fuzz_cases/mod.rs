//! Input decoding and checks shared by the cargo-fuzz targets (`fuzz/`) and the stable tests
//! (`tests/fuzz_stable.rs`, `tests/miri.rs`).
//!
//! Why a module included by path rather than a crate: the fuzz project is its own workspace on
//! nightly with libFuzzer, which the main crate's tests must not depend on, and the main crate
//! cannot dev-depend on a crate inside it. This directory depends only on `sdpa`, `arbitrary`
//! and `rayon`, so both sides compile it as a plain module: the tests with `mod fuzz_cases;`,
//! the fuzz crate's library with `#[path = "../../tests/fuzz_cases/mod.rs"]`. It is not a test
//! target itself (Cargo only picks up `tests/*.rs` and `tests/*/main.rs`).
//!
//! * [`bytes`]: how bytes decode to values (and encode back, for the seed corpora);
//! * [`layout`], [`values`], [`opts`]: operand layouts, values and options as fuzz input;
//! * [`differential`]: the fused-vs-reference check; [`api`]: the no-panic / typed-error check;
//! * [`seeds`]: the named seed inputs written to `fuzz/corpus/<target>/`.

#![allow(dead_code)] // each includer uses a different part

pub mod api;
pub mod bytes;
pub mod differential;
pub mod layout;
pub mod opts;
pub mod seeds;
pub mod values;

use arbitrary::Unstructured;

/// The fuzz targets with checks, by corpus directory name.
pub const TARGETS: [&str; 2] = ["differential", "api"];

/// Decodes `data` as an input of `target` and checks it (panicking on a violation).
/// Returns `false` if `target` is not one of [`TARGETS`] (the `merge` stub has no check yet).
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
        _ => false,
    }
}
