//! Failures and how they cross the boundary: [`Failure`], its conversion from `sdpa::Error`,
//! the thread's last error message, the guard every entry point runs in (which also catches
//! panics), and the names of the statuses.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::SdpaStatus;

/// A failed call: the status and its message.
pub(crate) struct Failure {
    status: SdpaStatus,
    message: String,
}

impl Failure {
    pub(crate) fn new(status: SdpaStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<sdpa::Error> for Failure {
    fn from(e: sdpa::Error) -> Self {
        use sdpa::Error as E;
        let status = match &e {
            E::LayoutOverflow { .. } => SdpaStatus::LayoutOverflow,
            E::SliceTooShort { .. } => SdpaStatus::SliceTooShort,
            E::OverlappingOutput { .. } => SdpaStatus::OverlappingOutput,
            E::ShapeMismatch { .. } => SdpaStatus::ShapeMismatch,
            E::HeadsNotDivisible { .. } => SdpaStatus::HeadsNotDivisible,
            E::ZeroHeadDim => SdpaStatus::ZeroHeadDim,
            E::LengthMismatch { .. } => SdpaStatus::LengthMismatch,
            E::InvalidScale(_) => SdpaStatus::InvalidScale,
            E::InvalidSoftcap(_) => SdpaStatus::InvalidSoftcap,
            E::InvalidValue { .. } => SdpaStatus::InvalidValue,
            E::NotBroadcastable { .. } => SdpaStatus::NotBroadcastable,
            E::NoPartials => SdpaStatus::NoPartials,
            E::ConflictingAlignment => SdpaStatus::ConflictingAlignment,
            E::ScoreMatrixTooLarge { .. } => SdpaStatus::ScoreMatrixTooLarge,
            E::ScratchTooLarge { .. } => SdpaStatus::ScratchTooLarge,
            E::TooManyRows { .. } => SdpaStatus::TooManyRows,
            E::OutOfMemory { .. } => SdpaStatus::OutOfMemory,
            E::KvScales { .. } => SdpaStatus::KvScales,
            _ => SdpaStatus::Other,
        };
        Failure::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // `try_with`: a call from a thread-local destructor must not panic here.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

/// Runs one entry point: clears the thread's message, catches panics, records failures.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Failure>) -> SdpaStatus {
    let result = catch_unwind(AssertUnwindSafe(f));
    let failure = match result {
        Ok(Ok(())) => {
            set_last_error("");
            return SdpaStatus::Ok;
        }
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_string());
            Failure::new(SdpaStatus::Panic, format!("internal panic in sdpa: {what}"))
        }
    };
    // Formatting the message cannot panic in practice; stay abort-free regardless.
    let _ = catch_unwind(AssertUnwindSafe(|| set_last_error(&failure.message)));
    failure.status
}

/// The message of the last call made on this thread (see `sdpa_last_error_message`).
pub(crate) fn last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The name of a status (see `sdpa_status_name`).
pub(crate) fn status_name(status: i32) -> &'static CStr {
    match status {
        0 => c"SDPA_STATUS_OK",
        1 => c"SDPA_STATUS_NULL_POINTER",
        2 => c"SDPA_STATUS_INVALID_STRUCT_SIZE",
        3 => c"SDPA_STATUS_UNSUPPORTED_TYPE",
        4 => c"SDPA_STATUS_MISALIGNED",
        5 => c"SDPA_STATUS_ALIASED_BUFFERS",
        6 => c"SDPA_STATUS_INVALID_ARGUMENT",
        7 => c"SDPA_STATUS_LAYOUT_OVERFLOW",
        8 => c"SDPA_STATUS_SLICE_TOO_SHORT",
        9 => c"SDPA_STATUS_OVERLAPPING_OUTPUT",
        10 => c"SDPA_STATUS_SHAPE_MISMATCH",
        11 => c"SDPA_STATUS_HEADS_NOT_DIVISIBLE",
        12 => c"SDPA_STATUS_ZERO_HEAD_DIM",
        13 => c"SDPA_STATUS_LENGTH_MISMATCH",
        14 => c"SDPA_STATUS_INVALID_SCALE",
        15 => c"SDPA_STATUS_INVALID_SOFTCAP",
        16 => c"SDPA_STATUS_INVALID_VALUE",
        17 => c"SDPA_STATUS_NOT_BROADCASTABLE",
        18 => c"SDPA_STATUS_NO_PARTIALS",
        19 => c"SDPA_STATUS_CONFLICTING_ALIGNMENT",
        20 => c"SDPA_STATUS_SCORE_MATRIX_TOO_LARGE",
        21 => c"SDPA_STATUS_SCRATCH_TOO_LARGE",
        22 => c"SDPA_STATUS_TOO_MANY_ROWS",
        23 => c"SDPA_STATUS_THREAD_POOL",
        24 => c"SDPA_STATUS_OTHER",
        25 => c"SDPA_STATUS_PANIC",
        26 => c"SDPA_STATUS_OUT_OF_MEMORY",
        27 => c"SDPA_STATUS_KV_SCALES",
        _ => c"SDPA_STATUS_UNKNOWN",
    }
}
