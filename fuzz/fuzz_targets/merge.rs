//! `merge_partials` against the unsplit result: keys split at random points (empty pieces and
//! pieces where a row sees nothing included, through `kv_lens`), each piece by the fused
//! `attention_lse`, merged, and compared with the fused result over all keys within a
//! tolerance derived from `reference::error_bounds`. See `tests/support/merge.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_fuzz::cases::merge::{check, MergeCase};

fuzz_target!(|case: MergeCase| {
    check(&case);
});
