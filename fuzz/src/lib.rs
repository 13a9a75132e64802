//! Support library of the fuzz targets: the input decoding and checks of
//! `../tests/support/`, which `cargo test` also runs on stable (see that module's docs).

#[path = "../../tests/support/mod.rs"]
pub mod cases;
