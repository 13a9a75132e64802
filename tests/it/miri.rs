//! A fast subset for Miri (`cargo +nightly miri test --test miri`: the test target `tests/miri.rs`
//! is this module and the harness alone), which checks the unsafe code
//! for undefined behaviour: the row writers' raw pointers, shared scratch, rayon's threads, and
//! `wide`'s lanes (under Miri the portable backend is always used; the AVX2/AVX-512 intrinsics
//! cannot run there). Shapes are tiny because Miri is about a thousand times slower, but they
//! cross every tile edge of the portable backend (8 lanes, 16-row panels, 6-key tiles): the
//! same checks as the fuzz targets, from `tests/support/`. Also runs on stable in
//! `cargo test`, where it takes milliseconds.
//!
//! `SDPA_MIRI_SHARD=k/n` runs only the cases whose index is `k` modulo `n` (every test, each
//! over its own case list), so that CI can run `n` Miri processes side by side, one per core;
//! Miri itself interprets on one thread. Unset, every case runs. Under Miri the variable
//! reaches the program only through `-Zmiri-env-forward=SDPA_MIRI_SHARD` (`.ci/fuzz`).

use crate::support;

use support::differential::{check, DiffCase, Shape};
use support::layout::Layout;
use support::opts::{CausalKind, OptSpec};
use support::typed::{Elem, Types};
use support::{api, seeds};

/// Largest `B·H·n_q·n_kv·(d_k+d_v)` of a seed run here.
const MIRI_WORK: usize = 2_500;

const fn shape(
    batch: usize,
    kv_heads: usize,
    group: usize,
    n_q: usize,
    n_kv: usize,
    d: usize,
) -> Shape {
    Shape {
        batch,
        heads: kv_heads * group,
        kv_heads,
        n_q,
        n_kv,
        d_k: d,
        d_v: d,
    }
}

/// This process's share of each test's cases: those whose index is `k` modulo `n`, from
/// `SDPA_MIRI_SHARD=k/n`; every case when it is unset.
struct Shard {
    k: usize,
    n: usize,
}

impl Shard {
    /// Reads `SDPA_MIRI_SHARD` (once per test). A malformed value fails the test rather than
    /// silently running a different subset.
    fn from_env() -> Shard {
        let Ok(spec) = std::env::var("SDPA_MIRI_SHARD") else {
            return Shard { k: 0, n: 1 };
        };
        let parsed = spec
            .split_once('/')
            .and_then(|(k, n)| Some((k.trim().parse().ok()?, n.trim().parse().ok()?)));
        match parsed {
            Some((k, n)) if k < n => Shard { k, n },
            _ => panic!("SDPA_MIRI_SHARD={spec:?}: expected k/n with k < n"),
        }
    }

    /// Runs `check` on this shard's part of `cases` (indexed in the order given) and returns
    /// how many cases there were in all.
    fn run<T>(&self, cases: impl IntoIterator<Item = T>, mut check: impl FnMut(T)) -> usize {
        let mut count = 0;
        for case in cases {
            if count % self.n == self.k {
                check(case);
            }
            count += 1;
        }
        count
    }
}

#[test]
fn tiny_differential_seeds() {
    let small = seeds::differential()
        .into_iter()
        .filter(|(_, case)| case.shape.fit().work() <= MIRI_WORK);
    let small = Shard::from_env().run(small, |(name, case)| {
        eprintln!("seed {name}");
        check(&case);
    });
    assert!(small >= 20, "only {small} seeds are small enough");
}

#[test]
fn tile_edges_layouts_and_causal() {
    use CausalKind::{BottomRight, TopLeft};
    let padded = Layout::padded([0, 2, 1, 3], [1, 0, 2, 1], 2);
    let cases = [
        // 7 keys: one 6-key tile and a 1-key tail; 9 rows: a full 8-lane vector and a tail.
        DiffCase::plain(shape(1, 1, 1, 9, 7, 3), OptSpec::causal(TopLeft), 1),
        // 17 stacked rows (GQA 1 × 17): a 16-row panel plus one; head size 17: 16 columns + 1.
        DiffCase::plain(shape(1, 1, 1, 17, 5, 17), OptSpec::causal(BottomRight), 2),
        // GQA: 2 key/value heads, 3 query heads each, n_q < n_kv and n_q > n_kv.
        DiffCase::plain(shape(2, 2, 3, 3, 8, 2), OptSpec::causal(BottomRight), 3),
        DiffCase::plain(shape(1, 2, 3, 8, 3, 2), OptSpec::causal(BottomRight), 4),
        DiffCase::plain(shape(1, 1, 1, 1, 1, 1), OptSpec::default(), 5),
        DiffCase {
            layouts: [Layout::BHSD, padded, Layout::head_dim_strided(2), padded],
            ..DiffCase::plain(shape(2, 1, 2, 5, 6, 3), OptSpec::causal(TopLeft), 6)
        },
        DiffCase {
            layouts: [
                Layout::broadcast(1),
                Layout::broadcast(4),
                Layout::BSHD,
                Layout::BHSD,
            ],
            ..DiffCase::plain(shape(2, 2, 1, 4, 5, 4), OptSpec::default(), 7)
        },
        // i8 K/V with scales, f16 Q, bf16 output: the typed entry point and the dequantizing
        // K/V source.
        DiffCase {
            types: Types {
                q: Elem::F16,
                kv: Elem::I8,
                out: Elem::Bf16,
            },
            ..DiffCase::plain(shape(1, 1, 2, 3, 5, 4), OptSpec::causal(BottomRight), 8)
        },
    ];
    Shard::from_env().run(&cases, |case| {
        let stats = check(case);
        assert_eq!(stats.typed, usize::from(case.types != Types::F32));
    });
}

/// The API seeds of ordinary sizes: validation errors and small valid calls. (Those with
/// `usize::MAX`-sized dims allocate up to `api::LEN_CAP` elements to check, which Miri takes
/// minutes over; they only exercise safe validation code, and run on stable.)
#[test]
fn api_seeds() {
    let small = seeds::api()
        .into_iter()
        .filter(|(_, case)| case.sizes.iter().all(|&n| n <= 64));
    let small = Shard::from_env().run(small, |(name, case)| {
        eprintln!("seed {name}");
        api::check(&case);
    });
    assert!(small >= 20, "only {small} seeds are small enough");
}

/// `append`'s parallel writes (under Miri the threshold is 64 values, so these 6 tokens × 2
/// heads × 6 channels split over a 3-thread pool): f16 pages with RoPE, i8 pages with
/// per-token and given scales, scattered slots, the same bits as on one thread and every
/// slot's row where it belongs.
#[test]
fn parallel_append() {
    // One case: shard 0's.
    Shard::from_env().run([()], |()| parallel_append_case());
}

fn parallel_append_case() {
    use sdpa::half::f16;
    use support::append::append_on;
    let (n, hkv, d, page, pages) = (6, 2, 6, 4, 3);
    let slots = [9usize, 2, 4, 11, 0, 7];
    let positions = [5u32, 1, 0, 9, 3, 2];
    let run = |threads| append_on(threads, [n, hkv, d], [pages, page], &slots, &positions);
    let (one, (_, v)) = run(1);
    assert!(run(3).0 == one, "the same bits on 3 threads");
    // V went in unrotated: each slot holds its token's row (V's pool after K's).
    let size = pages * page * hkv * d;
    for (t, &s) in slots.iter().enumerate() {
        let row = &one.f16[size + s * hkv * d..][..hkv * d];
        let want: Vec<u16> = v[t * hkv * d..][..hkv * d]
            .iter()
            .map(|&x| f16::from_f32(x).to_bits())
            .collect();
        assert_eq!(row, &want[..], "token {t}");
    }
    let unwritten = 2 * (pages * page - n) * hkv * d;
    assert_eq!(one.i8.iter().filter(|&&q| q == i8::MIN).count(), unwritten);
}
