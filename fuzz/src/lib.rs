//! Support library of the fuzz targets: the input decoding and checks of
//! `../tests/fuzz_cases/`, which `cargo test` also runs on stable (see that module's docs).

#[path = "../../tests/fuzz_cases/mod.rs"]
pub mod cases;
