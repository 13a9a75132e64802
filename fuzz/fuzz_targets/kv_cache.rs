//! Paged and packed K/V caches: random block tables and sequence offsets (valid, shared and
//! shuffled pages, entries past the pool, wrong lengths, decreasing offsets, batch dims ≠ 1)
//! into `attention_paged` and `attention_varlen`: `Ok` or a documented typed error with nothing
//! written; paged results bitwise equal to `attention_lse` on the gathered keys, each varlen
//! sequence within `reference::error_bounds` of the reference on that sequence alone. See
//! `tests/support/kv_cache.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_fuzz::cases::kv_cache::{check, KvCacheCase};

fuzz_target!(|case: KvCacheCase| {
    check(&case);
});
