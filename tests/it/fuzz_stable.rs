//! The fuzz targets' checks on stable, inside `cargo test`:
//! * random cases: bytes from a fixed-seed generator decoded exactly as libFuzzer's inputs are
//!   (`tests/support/`), a fixed number per target (`SDPA_FUZZ_CASES` overrides);
//! * every file of `fuzz/corpus/<target>/` and `tests/regressions/<target>/`, replayed;
//! * the seed files of the corpora, checked to decode to the seeds of `support::seeds`
//!   (`SDPA_WRITE_CORPUS=1` rewrites them).
//!
//! A failing case is reported with its bytes in hex and written to
//! `target/fuzz-stable-failures/`; copy it to `tests/regressions/<target>/` to keep it, and
//! reproduce it with `cargo +nightly fuzz run <target> <file>`.

use crate::support;

use arbitrary::Unstructured;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use support::values::SplitMix;
use support::{api, differential, kv_cache, merge, seeds, serving};

/// Random cases per target: (differential, api, merge), smaller in debug builds, where the f64
/// reference is ~20× slower.
fn case_counts() -> (usize, usize, usize) {
    if let Some(n) = std::env::var("SDPA_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return (n, n, n);
    }
    if cfg!(debug_assertions) {
        (25, 2_000, 50)
    } else {
        (1_500, 20_000, 1_000)
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `fuzz/corpus`, or `None` in a crate unpacked from `cargo package`: cargo leaves `fuzz/` out
/// of the package (a directory with its own Cargo.toml is another package), so there the seeds
/// are taken from their source, `support::seeds`, instead of their files. In the repository a
/// missing corpus is an error, not a skip.
fn corpus_dir() -> Option<PathBuf> {
    let dir = root().join("fuzz/corpus");
    if dir.is_dir() {
        return Some(dir);
    }
    // Cargo.toml.orig exists only in a packaged crate.
    assert!(
        root().join("Cargo.toml.orig").is_file(),
        "{} is missing",
        dir.display()
    );
    None
}

/// Every named seed as (target, name, the bytes its file holds).
fn seed_inputs() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut all = Vec::new();
    all.extend(
        seeds::differential()
            .into_iter()
            .map(|(n, c)| ("differential", n, c.encode())),
    );
    all.extend(
        seeds::api()
            .into_iter()
            .map(|(n, c)| ("api", n, c.encode())),
    );
    all.extend(
        seeds::merge()
            .into_iter()
            .map(|(n, c)| ("merge", n, c.encode())),
    );
    all.extend(
        kv_cache::seeds()
            .into_iter()
            .map(|(n, c)| ("kv_cache", n, c.encode())),
    );
    all.extend(
        serving::seeds()
            .into_iter()
            .map(|(n, c)| ("serving", n, c.encode())),
    );
    all
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

/// Failures collected over many cases, reported together at the end.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    /// Runs `f`; on a panic records the message and saves `data` for reproduction.
    fn run(&mut self, target: &str, label: &str, data: &[u8], f: impl FnOnce()) {
        if let Err(e) = catch_unwind(AssertUnwindSafe(f)) {
            let msg = panic_message(&*e);
            let dir = root().join("target/fuzz-stable-failures").join(target);
            let hash = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            let file = dir.join(format!("{hash:016x}"));
            let saved = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&file, data))
                .map(|()| file.display().to_string())
                .unwrap_or_else(|e| format!("(not saved: {e})"));
            self.0.push(format!(
                "{target} {label}: {msg}\n    input {saved}\n    bytes {}",
                hex(data)
            ));
        }
    }

    fn assert_none(&self, what: &str) {
        assert!(
            self.0.is_empty(),
            "{what}: {} failing case(s):\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// Random bytes: short inputs (which run out before the special values and options, so they
/// decode to plainer cases) half of the time.
fn random_input(rng: &mut SplitMix, max: usize) -> Vec<u8> {
    let len = if rng.next_u64().is_multiple_of(2) {
        20 + (rng.next_u64() % 60) as usize
    } else {
        80 + (rng.next_u64() as usize) % (max - 80)
    };
    rng.bytes(len)
}

#[test]
fn random_differential_cases() {
    let (n, _, _) = case_counts();
    let mut rng = SplitMix(0x5d9a_0001);
    let mut stats = differential::Stats::default();
    let mut failures = Failures::default();
    for i in 0..n {
        let data = random_input(&mut rng, 320);
        let Ok(case) = differential::DiffCase::decode(&mut Unstructured::new(&data)) else {
            continue;
        };
        failures.run("differential", &format!("random case {i}"), &data, || {
            stats.add(&differential::check(&case));
        });
    }
    eprintln!("differential: {stats:?}");
    failures.assert_none("random differential cases");
    // The checks must not be vacuous.
    assert!(stats.cases >= n * 9 / 10, "{stats:?}");
    assert!(stats.rows_in_bound >= 20 * n, "{stats:?}");
    assert!(stats.rows_empty >= n, "{stats:?}");
    assert!(stats.rows_nan_only >= n, "{stats:?}");
    assert!(stats.invalid_options >= n / 50, "{stats:?}");
    assert!(stats.typed >= n / 100, "{stats:?}");
}

#[test]
fn random_api_cases() {
    let (_, n, _) = case_counts();
    let mut rng = SplitMix(0x5d9a_0002);
    let mut stats = api::ApiStats::default();
    let mut failures = Failures::default();
    for i in 0..n {
        let data = random_input(&mut rng, 256);
        let Ok(case) = api::ApiCase::decode(&mut Unstructured::new(&data)) else {
            continue;
        };
        failures.run("api", &format!("random case {i}"), &data, || {
            stats.add(&api::check(&case));
        });
    }
    eprintln!("api: {stats:?}");
    failures.assert_none("random api cases");
    assert!(stats.views_valid >= n / 50, "{stats:?}");
    assert!(stats.ran >= n / 200, "{stats:?}");
    assert!(stats.rejected_calls >= n / 20, "{stats:?}");
    assert!(stats.validated_only >= n / 5_000, "{stats:?}");
}

#[test]
fn random_merge_cases() {
    let (_, _, n) = case_counts();
    let mut rng = SplitMix(0x5d9a_0003);
    let mut failures = Failures::default();
    let (mut cases, mut pieces) = (0, 0);
    for i in 0..n {
        // Long enough for the values of the larger shapes most of the time.
        let len = 16 + (rng.next_u64() % 3000) as usize;
        let data = rng.bytes(len);
        let Ok(case) = merge::MergeCase::decode(&mut Unstructured::new(&data)) else {
            continue;
        };
        failures.run("merge", &format!("random case {i}"), &data, || {
            pieces += merge::check(&case);
            cases += 1;
        });
    }
    eprintln!("merge: {cases} cases, {pieces} pieces");
    failures.assert_none("random merge cases");
    assert!(cases >= n * 9 / 10, "{cases} of {n} cases decoded");
    assert!(pieces >= 2 * cases, "{pieces} pieces in {cases} cases");
}

#[test]
fn random_kv_cache_cases() {
    // Paged and packed K/V: valid and broken tables and offsets. Few in debug builds (each
    // valid case runs the f64 reference per sequence).
    let n = std::env::var("SDPA_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 200 } else { 3_000 });
    let mut rng = SplitMix(0x5d9a_0004);
    let mut stats = kv_cache::KvStats::default();
    let mut failures = Failures::default();
    for i in 0..n {
        let data = random_input(&mut rng, 200);
        let Ok(case) = kv_cache::KvCacheCase::decode(&mut Unstructured::new(&data)) else {
            continue;
        };
        failures.run("kv_cache", &format!("random case {i}"), &data, || {
            stats.add(&kv_cache::check(&case));
        });
    }
    eprintln!("kv_cache: {stats:?}");
    failures.assert_none("random kv_cache cases");
    // The checks must not be vacuous.
    assert!(stats.cases >= n * 9 / 10, "{stats:?}");
    assert!(stats.paged_ok >= n / 50, "{stats:?}");
    assert!(stats.packed_ok >= n / 20, "{stats:?}");
    assert!(stats.varlen_paged_ok >= n / 50, "{stats:?}");
    assert!(stats.rejected >= n / 5, "{stats:?}");
    assert!(stats.ctor_rejected >= n / 100, "{stats:?}");
    assert!(stats.rows_in_bound >= n, "{stats:?}");
    assert!(stats.rows_empty >= n / 20, "{stats:?}");
}

#[test]
fn random_serving_cases() {
    // Serving episodes: appends with RoPE, paged (and packed) plans, faults (tiny shapes:
    // 2,000 episodes take about 3 s in release on a shared 2-core machine).
    let n = std::env::var("SDPA_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 100 } else { 2_000 });
    let mut rng = SplitMix(0x5d9a_0005);
    let mut stats = serving::ServingStats::default();
    let mut failures = Failures::default();
    for i in 0..n {
        let data = random_input(&mut rng, 120);
        let Ok(case) = serving::ServingCase::decode(&mut Unstructured::new(&data)) else {
            continue;
        };
        failures.run("serving", &format!("random case {i}"), &data, || {
            stats.add(&serving::check(&case));
        });
    }
    eprintln!("serving: {stats:?}");
    failures.assert_none("random serving cases");
    // The checks must not be vacuous.
    assert!(stats.cases >= n * 9 / 10, "{stats:?}");
    assert!(stats.steps >= n, "{stats:?}");
    assert!(stats.paged_runs >= 2 * n, "{stats:?}");
    assert!(stats.packed_runs >= n / 4, "{stats:?}");
    assert!(stats.appends >= 2 * n, "{stats:?}");
    assert!(stats.rejected >= n / 4, "{stats:?}");
    assert!(stats.rows_in_bound >= 10 * n, "{stats:?}");
}

/// Every file of `dir/<target>/`, for every target.
fn replay_dir(dir: &Path, failures: &mut Failures) -> usize {
    let mut count = 0;
    for target in support::TARGETS {
        let Ok(entries) = std::fs::read_dir(dir.join(target)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        files.sort();
        for file in files.iter().filter(|f| f.is_file()) {
            let data = std::fs::read(file).expect("readable corpus file");
            let label = file
                .strip_prefix(root())
                .unwrap_or(file)
                .display()
                .to_string();
            failures.run(target, &label, &data, || {
                support::run(target, &data);
            });
            count += 1;
        }
    }
    count
}

#[test]
fn replay_corpora_and_regressions() {
    let mut failures = Failures::default();
    let corpus = match corpus_dir() {
        Some(dir) => replay_dir(&dir, &mut failures),
        None => {
            let seeds = seed_inputs();
            for (target, name, data) in &seeds {
                let label = format!("seed {target}/{name} (packaged crate: no fuzz/corpus)");
                failures.run(target, &label, data, || {
                    assert!(support::run(target, data), "a known target");
                });
            }
            seeds.len()
        }
    };
    let regressions = replay_dir(&root().join("tests/regressions"), &mut failures);
    eprintln!("replayed {corpus} corpus files and {regressions} regression inputs");
    failures.assert_none("corpus and regression replay");
    assert!(corpus >= seeds::differential().len() + seeds::api().len() + seeds::merge().len());
}

#[test]
fn seed_corpus() {
    let write = std::env::var_os("SDPA_WRITE_CORPUS").is_some();
    let mut stale = Vec::new();
    // In a packaged crate (no fuzz/corpus) only the round trip of each seed is checked.
    let corpus = corpus_dir();
    let mut check = |target: &str, name: &str, bytes: Vec<u8>, decodes: bool| {
        assert!(decodes, "{target} seed {name} does not decode to itself");
        let Some(corpus) = &corpus else {
            return;
        };
        let file = corpus.join(target).join(format!("seed-{name}"));
        if write {
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("corpus dir");
            std::fs::write(&file, &bytes).expect("write seed");
        } else if std::fs::read(&file).ok().as_deref() != Some(&bytes[..]) {
            stale.push(file.display().to_string());
        }
    };
    for (name, case) in seeds::differential() {
        let bytes = case.encode();
        let back = differential::DiffCase::decode(&mut Unstructured::new(&bytes));
        check("differential", name, bytes, back.as_ref() == Ok(&case));
    }
    for (name, case) in seeds::api() {
        let bytes = case.encode();
        let back = api::ApiCase::decode(&mut Unstructured::new(&bytes));
        check("api", name, bytes, back.as_ref() == Ok(&case));
    }
    for (name, case) in seeds::merge() {
        let bytes = case.encode();
        let back = merge::MergeCase::decode(&mut Unstructured::new(&bytes));
        check("merge", name, bytes, back.as_ref() == Ok(&case));
    }
    for (name, case) in kv_cache::seeds() {
        let bytes = case.encode();
        let back = kv_cache::KvCacheCase::decode(&mut Unstructured::new(&bytes));
        check("kv_cache", name, bytes, back.as_ref() == Ok(&case));
    }
    for (name, case) in serving::seeds() {
        let bytes = case.encode();
        let back = serving::ServingCase::decode(&mut Unstructured::new(&bytes));
        check("serving", name, bytes, back.as_ref() == Ok(&case));
    }
    // Only named seeds in the corpora: every file is a seed of `support::seeds` (inputs a
    // fuzzing campaign minted belong to that campaign; keep a finding in tests/regressions/).
    let names: Vec<String> = [
        (
            "differential",
            seeds::differential()
                .iter()
                .map(|s| s.0)
                .collect::<Vec<_>>(),
        ),
        ("api", seeds::api().iter().map(|s| s.0).collect()),
        ("merge", seeds::merge().iter().map(|s| s.0).collect()),
        ("kv_cache", kv_cache::seeds().iter().map(|s| s.0).collect()),
        ("serving", serving::seeds().iter().map(|s| s.0).collect()),
    ]
    .iter()
    .flat_map(|(t, ns)| ns.iter().map(move |n| format!("{t}/seed-{n}")))
    .collect();
    for target in support::TARGETS {
        let Some(corpus) = &corpus else { break };
        let dir = corpus.join(target);
        for e in std::fs::read_dir(&dir).expect("corpus dir").flatten() {
            let name = format!("{target}/{}", e.file_name().to_string_lossy());
            if !names.contains(&name) {
                stale.push(format!("{} (not a named seed)", e.path().display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "seed files missing or stale (regenerate with SDPA_WRITE_CORPUS=1 cargo test --test it \
         -- fuzz_stable::seed_corpus): {stale:?}"
    );
}

#[test]
fn layout_permutations_are_distinct() {
    let all: std::collections::HashSet<_> = (0..24).map(support::layout::permutation).collect();
    assert_eq!(all.len(), 24);
    assert_eq!(support::layout::permutation(0), [0, 1, 2, 3]);
}
