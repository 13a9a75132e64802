//! The thread-count setting of `sdpa_set_num_threads` and the pool each call runs on.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::abi::SdpaStatus;
use crate::status::Failure;

/// 0: rayon's global pool; n ≥ 1: a private pool of n threads per calling thread.
static NUM_THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static POOL: RefCell<Option<(usize, rayon::ThreadPool)>> = const { RefCell::new(None) };
}

/// Runs `f` on the pool `sdpa_set_num_threads` selected.
pub(crate) fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R, Failure> {
    let n = NUM_THREADS.load(Ordering::Relaxed);
    if n == 0 {
        return Ok(f());
    }
    POOL.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(threads, _)| *threads != n) {
            *slot = None; // free the old pool's threads before spawning new ones
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("sdpa-{i}"))
                .build()
                .map_err(|e| {
                    Failure::new(
                        SdpaStatus::ThreadPool,
                        format!("cannot create a pool of {n} threads: {e}"),
                    )
                })?;
            *slot = Some((n, pool));
        }
        let (_, pool) = slot.as_ref().expect("pool just set");
        Ok(pool.install(f))
    })
}

/// Sets the thread count for the calls that follow (see `sdpa_set_num_threads`).
pub(crate) fn set_num_threads(n: usize) {
    NUM_THREADS.store(n, Ordering::Relaxed);
}

/// The current thread-count setting (see `sdpa_get_num_threads`).
pub(crate) fn num_threads() -> usize {
    NUM_THREADS.load(Ordering::Relaxed)
}
