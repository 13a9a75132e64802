//! Peak heap of one attention call beyond its inputs and outputs: the fused kernel, whose extra
//! memory must not depend on the sequence length, against the f64 reference, which holds the
//! whole `n_q × n_kv` score matrix (`n²·8` bytes).
//!
//! ```text
//! cargo bench --bench memory        # n = 256 ..= 65536, about 1-2 minutes on 2 cores
//! ```
//! Prints a Markdown table, writes `target/memory/memory.csv` and draws
//! `target/memory/memory.svg` (log-log, bytes against n). Exits non-zero when the fused kernel's
//! peak grows with n by more than [`SLACK`], or exceeds what the scratch model
//! (`sdpa::scratch_bytes_per_thread`) allows for the pool's threads. Run without `--bench` (as
//! `cargo test --benches` does) it only checks n ≤ 1024 (reference n ≤ 256), quickly, and
//! writes its files under `target/memory/quick/` instead.
//!
//! Every row is one call with B = 1, H = H_kv = 1, d = 64, n_q = n_kv = n, no mask (the mask
//! changes the work, not the buffers), in a rayon pool of one thread and in one of all the
//! machine's threads, and once more with K/V read from a paged cache (pages of 16 tokens, in
//! reverse order, one thread), whose extra memory must be the dense call's: the kernel reads
//! pages in place, it copies nothing per call; and once as decode (the first query row against
//! all `n` keys, one thread: split-KV partials included). One head keeps n = 65536 affordable (about 1.1·10¹² flops) and the
//! reference comparable; the reference runs up to `SDPA_MEMORY_REFERENCE_MAX_N` (default 8192:
//! 512 MiB of scores and about 20 s; each doubling costs 4× the memory and the time).
//!
//! Method: a counting `#[global_allocator]` around the system allocator keeps the live heap
//! bytes of the whole process (all threads) and their high-water mark. Inputs and outputs are
//! allocated first, then the mark is reset to the live bytes, then the call runs, so the peak
//! minus the baseline is exactly what the call allocated on top of its operands. Each pool has
//! run one small call beforehand, so rayon's lazily created state is not counted. This bench
//! prints its own results and stays out of criterion: criterion divides what it measures by
//! the iterations, which makes no sense for a peak.

// The tests' support module: its counting allocator and its one deterministic filler.
#[path = "../tests/support/mod.rs"]
mod support;

use plotters::prelude::*;
use rayon::ThreadPool;
use sdpa::{Options, Tensor, TensorMut};
use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

// ---------------------------------------------------------------------------------------------
// The counting allocator.

use support::counting_alloc::{with_peak_heap, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The peak heap `f` used above the level it started at.
fn peak_during(f: impl FnOnce()) -> usize {
    with_peak_heap(f).1
}

// ---------------------------------------------------------------------------------------------
// The model of the fused kernel's extra memory.

/// Bytes of one fused-kernel scratch for `[1, n_q, heads, d_k]` queries against `kv_heads`
/// key/value heads, as the crate itself computes it (`sdpa::scratch_bytes_per_thread`, from the
/// same buffer list the kernel allocates). It does not depend on the key length at all, and on
/// `n_q` only while `n_q` is below one query block.
///
/// A call allocates one scratch per thread of its pool (at most one per work unit) before any
/// work starts; the pool's list of scratches itself, a `Vec` of a few headers, is left to
/// [`SLACK`]. Calls with few work items (decode) also hold split-KV partial results; the rows
/// measured here have enough items (≥ 32, or too few keys to split) not to split.
fn fused_scratch_bytes(heads: usize, kv_heads: usize, n_q: usize, d_k: usize, d_v: usize) -> usize {
    // Broadcast views of one row each: their head dims are contiguous, like the operands'.
    let row = vec![0.0f32; d_k.max(d_v)];
    let view = |dims| Tensor::new(&row, dims, [0, 0, 0, 1]).expect("a broadcast view");
    let q = view([1, n_q, heads, d_k]);
    let k = view([1, 1, kv_heads, d_k]);
    let v = view([1, 1, kv_heads, d_v]);
    sdpa::scratch_bytes_per_thread(&q, &k, &v, &Options::new()).expect("a valid shape")
}

/// Allowed difference between two fused peaks of one pool, and above the model's bound: the
/// call's scratch free list (~1 KiB) and rayon's own bookkeeping (a new block of its job queue
/// now and then, ~1.5 KiB).
const SLACK: usize = 16 << 10;

// ---------------------------------------------------------------------------------------------
// The measurements.

const HEADS: usize = 1;
const D: usize = 64;

/// Tokens per page of the paged column.
const PAGE: usize = 16;

/// Contiguous BSHD operands `[1, n, HEADS, D]`, deterministic values in [-1, 1), and K/V
/// again as a paged cache: pages of [`PAGE`] tokens in reverse order.
struct Operands {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
    dims: [usize; 4],
    k_pages: Vec<f32>,
    v_pages: Vec<f32>,
    table: Vec<u32>,
}

impl Operands {
    fn new(n: usize) -> Self {
        let len = n * HEADS * D;
        let values = |seed: u64| support::values::SplitMix::unit_values(len, seed);
        let (k, v) = (values(2), values(3));
        let pages = n.div_ceil(PAGE);
        let page_len = PAGE * HEADS * D;
        let table: Vec<u32> = (0..pages as u32).rev().collect();
        let mut k_pages = vec![0.0; pages * page_len];
        let mut v_pages = vec![0.0; pages * page_len];
        for (p, &at) in table.iter().enumerate() {
            let (src, dst) = (p * page_len, at as usize * page_len);
            let n = page_len.min(len - src);
            k_pages[dst..dst + n].copy_from_slice(&k[src..src + n]);
            v_pages[dst..dst + n].copy_from_slice(&v[src..src + n]);
        }
        Operands {
            q: values(1),
            k,
            v,
            out: vec![0.0; len],
            dims: [1, n, HEADS, D],
            k_pages,
            v_pages,
            table,
        }
    }

    /// Peak extra heap of one call on the paged cache, in `pool`.
    fn peak_paged(&mut self, pool: &ThreadPool) -> usize {
        let q = Tensor::bshd(&self.q, self.dims).expect("q view");
        let pages = self.table.len();
        let page = |x| Tensor::bshd(x, [pages, PAGE, HEADS, D]).expect("page pool");
        let kv = sdpa::PagedKv::new(page(&self.k_pages), page(&self.v_pages), &self.table, pages)
            .expect("paged cache");
        let mut out = TensorMut::bshd(&mut self.out, self.dims).expect("out view");
        let lens = [self.dims[1]];
        let opts = Options::new().kv_lens(&lens);
        peak_during(|| {
            pool.install(|| sdpa::attention_paged(&q, &kv, &mut out, None, &opts))
                .expect("paged call");
        })
    }

    /// Peak extra heap of one decode call (the first query row against all `n` keys: split-KV
    /// from 2048 keys on, so the partial results are counted too), in `pool`.
    fn peak_decode(&mut self, pool: &ThreadPool) -> usize {
        let one = [1, 1, HEADS, D];
        let q = Tensor::bshd(&self.q[..HEADS * D], one).expect("q view");
        let k = Tensor::bshd(&self.k, self.dims).expect("k view");
        let v = Tensor::bshd(&self.v, self.dims).expect("v view");
        let mut out = TensorMut::bshd(&mut self.out[..HEADS * D], one).expect("out view");
        let opts = Options::new();
        peak_during(|| {
            pool.install(|| sdpa::attention(&q, &k, &v, &mut out, &opts))
                .expect("decode call");
        })
    }

    /// Bytes of Q, K, V and out together.
    fn bytes(&self) -> usize {
        (self.q.len() + self.k.len() + self.v.len() + self.out.len()) * size_of::<f32>()
    }

    /// Peak extra heap of one call: the fused kernel in `pool`, or the reference.
    fn peak(&mut self, pool: &ThreadPool, reference: bool) -> usize {
        let q = Tensor::bshd(&self.q, self.dims).expect("q view");
        let k = Tensor::bshd(&self.k, self.dims).expect("k view");
        let v = Tensor::bshd(&self.v, self.dims).expect("v view");
        let mut out = TensorMut::bshd(&mut self.out, self.dims).expect("out view");
        let opts = Options::new();
        peak_during(|| {
            if reference {
                // Single-threaded: called directly, so no rayon bookkeeping joins its peak.
                sdpa::reference::attention(&q, &k, &v, &mut out, &opts)
            } else {
                pool.install(|| sdpa::attention(&q, &k, &v, &mut out, &opts))
            }
            .expect("attention call");
        })
    }
}

/// One row of the table.
struct Row {
    n: usize,
    operands: usize,
    reference: Option<usize>,
    fused_1t: usize,
    fused_all: usize,
    paged_1t: usize,
    decode_1t: usize,
}

fn human(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = bytes;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 || x.fract() == 0.0 {
        format!("{x:.0} {}", UNITS[unit])
    } else {
        format!("{x:.1} {}", UNITS[unit])
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("memory: benchmark");
        return Ok(());
    }
    // `cargo bench -- FILTER` passes the filter to every bench binary: run only if it names us.
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| "memory".contains(f.as_str())) {
        return Ok(());
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then a quick check only
    // (as criterion's test mode, also for `-- --test`).
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let max_n = if full { 65536 } else { 1024 };
    let reference_max_n = std::env::var("SDPA_MEMORY_REFERENCE_MAX_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8192)
        .min(if full { usize::MAX } else { 256 });

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let build = |t| rayon::ThreadPoolBuilder::new().num_threads(t).build();
    let (one, all) = (build(1)?, build(threads)?);
    // Lazily created state (rayon's, the backend choice, ...) stays outside the measurements.
    let mut warm = Operands::new(256);
    warm.peak(&one, true);
    for pool in [&one, &all] {
        warm.peak(pool, false);
    }
    warm.peak_paged(&one);
    warm.peak_decode(&one);
    drop(warm);

    let started = Instant::now();
    let mut rows = Vec::new();
    let mut n = 256;
    while n <= max_n {
        let mut ops = Operands::new(n);
        let reference = (n <= reference_max_n).then(|| ops.peak(&one, true));
        let fused_1t = ops.peak(&one, false);
        let fused_all = ops.peak(&all, false);
        let paged_1t = ops.peak_paged(&one);
        let decode_1t = ops.peak_decode(&one);
        eprintln!(
            "memory: n = {n:>5} done after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        rows.push(Row {
            n,
            operands: ops.bytes(),
            reference,
            fused_1t,
            fused_all,
            paged_1t,
            decode_1t,
        });
        n *= 2;
    }

    let scratch = fused_scratch_bytes(HEADS, HEADS, 256, D, D);
    println!("{}", table(&rows, threads));
    // A quick check does not overwrite the full run's files.
    let dir = target_dir().join(if full { "memory" } else { "memory/quick" });
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("memory.csv"), csv(&rows, threads))?;
    plot(&rows, threads, &dir.join("memory.svg"))?;
    println!(
        "wrote {} and {}",
        dir.join("memory.csv").display(),
        dir.join("memory.svg").display()
    );

    // The checks.
    let mut problems = Vec::new();
    let first = &rows[0];
    for r in &rows {
        let model = fused_scratch_bytes(HEADS, HEADS, r.n, D, D);
        if model != scratch {
            problems.push(format!(
                "the scratch model itself depends on n: {model} B at n = {}",
                r.n
            ));
        }
        if r.fused_1t > first.fused_1t + SLACK {
            problems.push(format!(
                "fused peak (1 thread) grows with n: {} B at n = {} against {} B at n = {}",
                r.fused_1t, r.n, first.fused_1t, first.n
            ));
        }
        if r.fused_1t > scratch + SLACK {
            problems.push(format!(
                "fused peak (1 thread) {} B at n = {} is above one scratch, {scratch} B",
                r.fused_1t, r.n
            ));
        }
        if r.paged_1t > scratch + SLACK || r.paged_1t > first.paged_1t + SLACK {
            problems.push(format!(
                "paged peak (1 thread) {} B at n = {} is above one scratch ({scratch} B) or \
                 grows with n (from {} B)",
                r.paged_1t, r.n, first.paged_1t
            ));
        }
        // Decode: a smaller scratch (one query row) plus at most 32 split partials of one row
        // each (32 · (d + 2) · 4 B), inside the slack.
        if r.decode_1t > scratch + SLACK || r.decode_1t > first.decode_1t + SLACK {
            problems.push(format!(
                "decode peak (1 thread) {} B at n = {} is above one scratch ({scratch} B) or \
                 grows with n (from {} B)",
                r.decode_1t, r.n, first.decode_1t
            ));
        }
        if r.fused_all > threads * scratch + SLACK {
            problems.push(format!(
                "fused peak ({threads} threads) {} B at n = {} is above {threads} scratches, {} B",
                r.fused_all,
                r.n,
                threads * scratch
            ));
        }
    }
    if first.fused_1t + SLACK < scratch {
        eprintln!(
            "memory: note: the 1-thread peak ({} B) is well below the model ({scratch} B): \
             the kernel allocates less than sdpa::scratch_bytes_per_thread reports",
            first.fused_1t
        );
    }
    if problems.is_empty() {
        println!(
            "fused peak is flat in n: {} (1 thread), at most {} ({threads} threads)",
            human(rows.iter().map(|r| r.fused_1t).max().unwrap_or(0) as f64),
            human(rows.iter().map(|r| r.fused_all).max().unwrap_or(0) as f64)
        );
        Ok(())
    } else {
        for p in &problems {
            eprintln!("memory: FAILED: {p}");
        }
        std::process::exit(1);
    }
}

/// The Markdown table: measured peaks next to their models (the reference is shown, not checked).
fn table(rows: &[Row], threads: usize) -> String {
    let mut s = String::new();
    let scratch = fused_scratch_bytes(HEADS, HEADS, 256, D, D);
    let _ = writeln!(
        s,
        "Peak heap of one call beyond Q, K, V and out (B = 1, H = {HEADS}, d = {D}, n_q = n_kv = n; \
         backend {:?}).\n\
         Fused model: one scratch = {} ({scratch} B) per pool thread; reference model: n²·8 B.\n",
        sdpa::backend(),
        human(scratch as f64)
    );
    let _ = writeln!(
        s,
        "| n | Q+K+V+out | reference | reference model n²·8 | fused, 1 thread | fused, {threads} threads | paged K/V ({PAGE}-token pages), 1 thread | decode (n_q = 1), 1 thread | fused model, 1 / {threads} workers | fused 1t − model |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let reference = r.reference.map_or("–".to_string(), |b| human(b as f64));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {:+} B |",
            r.n,
            human(r.operands as f64),
            reference,
            human((r.n * r.n * 8) as f64),
            human(r.fused_1t as f64),
            human(r.fused_all as f64),
            human(r.paged_1t as f64),
            human(r.decode_1t as f64),
            human(scratch as f64),
            human((threads * scratch) as f64),
            r.fused_1t as i64 - scratch as i64
        );
    }
    s
}

fn csv(rows: &[Row], threads: usize) -> String {
    let mut s = String::from(
        "n,heads,d,threads_all,operand_bytes,reference_bytes,reference_model_bytes,fused_1t_bytes,fused_all_bytes,paged_1t_bytes,decode_1t_bytes,fused_model_bytes_per_worker\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{},{HEADS},{D},{threads},{},{},{},{},{},{},{},{}",
            r.n,
            r.operands,
            r.reference.map_or(String::new(), |b| b.to_string()),
            r.n * r.n * 8,
            r.fused_1t,
            r.fused_all,
            r.paged_1t,
            r.decode_1t,
            fused_scratch_bytes(HEADS, HEADS, r.n, D, D)
        );
    }
    s
}

/// Log-log plot of the peaks against n, with guides ∝ n² (one f64 score matrix, n²·8 B: the
/// reference's model) and ∝ n (the operands Q, K, V, out).
fn plot(rows: &[Row], threads: usize, path: &std::path::Path) -> Result<(), Box<dyn Error>> {
    let n_min = rows.first().map_or(256, |r| r.n) as f64;
    let n_max = rows.last().map_or(65536, |r| r.n) as f64;
    let fused_min = rows
        .iter()
        .map(|r| r.fused_1t.min(r.fused_all))
        .min()
        .unwrap_or(1)
        .max(1) as f64;
    let y_min = fused_min.min(rows[0].operands as f64) / 4.0;
    let y_max = n_max * n_max * 8.0 * 2.0;

    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("sdpa: peak heap of one call beyond its operands (B=1, H={HEADS}, d={D})"),
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (n_min / 1.3..n_max * 1.3)
                .log_scale()
                .with_key_points(rows.iter().map(|r| r.n as f64).collect()),
            (y_min..y_max).log_scale().with_key_points(
                (0..32)
                    .map(|k| 4f64.powi(k))
                    .filter(|&y| (y_min..=y_max).contains(&y))
                    .collect(),
            ),
        )?;
    chart
        .configure_mesh()
        .x_desc("sequence length n (n_q = n_kv)")
        .y_desc("peak heap beyond the operands")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| human(*y))
        .draw()?;

    let ns: Vec<f64> = rows.iter().map(|r| r.n as f64).collect();
    let guide_n2: Vec<(f64, f64)> = ns.iter().map(|&n| (n, n * n * 8.0)).collect();
    let guide_n: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.n as f64, r.operands as f64))
        .collect();
    let grey = RGBColor(150, 150, 150);
    chart
        .draw_series(DashedLineSeries::new(guide_n2, 6, 4, grey.stroke_width(1)))?
        .label("∝ n²: n²·8 B, one f64 score matrix (reference model)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    let light = RGBColor(190, 190, 190);
    chart
        .draw_series(DashedLineSeries::new(guide_n, 2, 4, light.stroke_width(1)))?
        .label("∝ n: Q, K, V and out together (not counted in the peaks)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], light));

    let series = [
        (
            "reference (f64, full score matrix)".to_string(),
            rows.iter()
                .filter_map(|r| r.reference.map(|b| (r.n as f64, b.max(1) as f64)))
                .collect::<Vec<_>>(),
            RGBColor(200, 40, 40),
        ),
        (
            format!(
                "fused, 1 thread (model: {} per worker)",
                human(fused_scratch_bytes(HEADS, HEADS, n_max as usize, D, D) as f64)
            ),
            rows.iter()
                .map(|r| (r.n as f64, r.fused_1t.max(1) as f64))
                .collect::<Vec<_>>(),
            RGBColor(30, 90, 200),
        ),
        (
            format!("fused, {threads} threads (1 to {threads} scratches live, as scheduled)"),
            rows.iter()
                .map(|r| (r.n as f64, r.fused_all.max(1) as f64))
                .collect::<Vec<_>>(),
            RGBColor(20, 150, 80),
        ),
    ];
    for (label, points, color) in series {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
