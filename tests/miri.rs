//! Miri's test target: `cargo +nightly miri test --test miri` (`.ci/fuzz`) runs the fast subset
//! of `tests/it/miri.rs`, with the harness of `tests/support/` and nothing else. Miri compiles
//! the test crate again in each of its processes, so this crate holds only what it runs, not
//! the other suites of the integration-test binary `tests/it/`.
//!
//! Outside Miri the crate is empty (`#![cfg(miri)]`): `cargo test` runs the same tests as the
//! `miri::` module of `tests/it/`, which compiles the harness once for every suite, rather than
//! compiling and linking it once more here.

#![cfg(miri)]

mod support;

#[path = "it/miri.rs"]
mod miri;
