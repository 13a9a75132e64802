//! The integration tests of `sdpa`, as one test binary (`cargo test --test it`): the shared
//! harness of `tests/support/` is compiled and linked once rather than once per test file.
//! Each file here is the module of what used to be a test binary of its own, so a test's name
//! starts with its file's (`differential::`, `variants::grid::`), and a name filter runs one or
//! more suites: `cargo test --release --test it -- differential:: variants::`.
//!
//! Beside this directory:
//! * `tests/memory.rs` and `tests/workspace.rs` stay binaries of their own: they install a
//!   counting `#[global_allocator]` that counts every thread's allocations (the kernel
//!   allocates on rayon's worker threads, so counting per thread would miss them), and must
//!   run in a process where no other test allocates while they measure;
//! * `tests/miri.rs` is the target Miri runs (`cargo +nightly miri test --test miri`,
//!   `.ci/fuzz`): the module [`miri`] and the harness alone, since Miri compiles the test crate
//!   again in each of its processes. Outside Miri it is empty, and its tests run here.

#[path = "../support/mod.rs"]
mod support;

mod append;
mod bf16_products;
mod compare;
mod decode;
mod differential;
mod edge_cases;
mod element_types;
mod errors;
mod fuzz_findings;
mod fuzz_stable;
mod hardening;
mod int8;
mod kv_cache;
mod kv_lens_alignment;
mod kv_pool;
mod miri;
mod plan;
mod pools;
mod properties;
mod reference_layouts;
mod rope;
mod serving;
mod variants;
mod worked_example;
