//! Fused kernel against the f64 reference on small arbitrary problems: shapes, layouts,
//! options and values (extremes included). See `tests/support/differential.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_fuzz::cases::differential::{check, DiffCase};

fuzz_target!(|case: DiffCase| {
    check(&case);
});
