//! Arbitrary dims, strides, slice lengths and options into the public API: `Ok` or the
//! documented typed error, never a panic, abort or hang. See `tests/support/api.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_fuzz::cases::api::{check, ApiCase};

fuzz_target!(|case: ApiCase| {
    check(&case);
});
