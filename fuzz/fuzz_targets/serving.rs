//! Serving episodes: a K/V type, heads, head sizes, a page pool, RoPE and a few steps that
//! admit, prefill, decode and retire sequences; each step appends its rows (`sdpa::append`,
//! against `reference::append`) and runs one `Plan` for two layers (paged, and packed on some
//! steps) against `reference::attention_varlen` within `reference::error_bounds_varlen`;
//! broken slots and short pools fail with nothing written. See `tests/support/serving.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_fuzz::cases::serving::{check, ServingCase};

fuzz_target!(|case: ServingCase| {
    check(&case);
});
