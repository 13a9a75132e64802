//! The naive reference: the definition of attention, step by step as the math reads, in f64.
//!
//! For every (batch, head) it materializes the full `n_q × n_kv` score matrix, then
//! 1. `s_ij = scale · (q_i · k_j)`,
//! 2. softcap `cap · tanh(s/cap)`, then ALiBi `− slope_h·|i + off − j|` and the bias,
//! 3. marks invisible scores `−∞` (causal, window, key length, boolean mask; element by element),
//! 4. takes the row softmax `p_ij = exp(s_ij − m_i) / (Σ_j exp(s_ij − m_i) + exp(σ_h − m_i))`
//!    (the sink term only with sinks),
//! 5. and the weighted sum `out_i = Σ_{visible j} p_ij · v_j`,
//!    `lse_i = m_i + ln(Σ_j exp(s_ij − m_i) + exp(σ_h − m_i))`.
//!
//! Clarity over speed: it is the oracle every fast path is tested against, and its memory grows
//! as `n_q · n_kv`. Rows with no visible key get output 0 and `lse = −∞`; NaN inputs propagate to
//! every output they touch (a NaN in `v_j` reaches exactly the rows that give key `j` a non-zero
//! weight).
//!
//! The engine layouts have their references too: [`attention_paged`] and [`attention_varlen`]
//! read Q, K, V and the scales of `i8` K/V where those calls read them (a sequence's keys
//! `0 .. kv_len` through its block table or offsets, never the slots past its length) and
//! compute as above, per sequence (its own `n_q` rows and keys), in the same order. So the
//! same values give the same bits whichever layout holds them: a paged or packed reference
//! call equals [`attention_lse`] on the sequences' keys gathered into dense tensors, bit for
//! bit. [`error_bounds_paged`] and [`error_bounds_varlen`] are their accuracy contracts, and
//! [`compare`] and [`compare_varlen`] hold a result against the reference within them in one call
//! (an engine's integration test of each layer).
//!
//! [`rope`] is the rotary embedding's definition in the same spirit (f64 throughout), and
//! [`append`] the definition of [`crate::append`] (rows rotated in f64, rounded to the cache).

mod attention;
mod bounds;
mod cache;
mod compare;
mod rows;

pub use attention::{attention, attention_lse, attention_paged, attention_varlen};
pub use bounds::{error_bounds, error_bounds_paged, error_bounds_varlen, ErrorBound};
pub use cache::{append, rope};
pub use compare::{compare, compare_varlen, Deviation};
