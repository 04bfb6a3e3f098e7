//! Open time, checksum throughput and memory of a large mapped AttentionIndex file, and page
//! sharing between two processes that map it (issue 5).
//!
//! ```text
//! cargo run --release -p qkindex --example big_file -- [--n 1048576] [--d 128] [--train 65536]
//!     [--path /tmp/qkindex-big.qki] [--reuse] [--flat]
//! ```
//! Builds an f16 AttentionIndex over `n` synthetic keys (`qkindex::synth::ood`) from `train`
//! training queries (evenly strided), saves it, then measures: open without verification
//! (header + table only), open with verification (every checksum and structural scan), the
//! xxh3 checksum throughput over the key bytes, resident memory (`/proc/self/smaps_rollup`)
//! after opening and after a full scan, and RSS/PSS of this process and a child process that
//! maps the same file at the same time. `--reuse` skips the build when the file exists;
//! `--flat` writes a FlatIndex instead (no graph build: a quick way to a large file).

use half::f16;
use qkindex::io::{self, LoadOptions};
use qkindex::{AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, KeyStore};
use qkindex::{Scratch, SearchParams};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

struct Args {
    n: usize,
    d: usize,
    train: usize,
    path: PathBuf,
    reuse: bool,
    flat: bool,
    child: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        n: 1 << 20,
        d: 128,
        train: 65_536,
        path: std::env::temp_dir().join("qkindex-big.qki"),
        reuse: false,
        flat: false,
        child: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--n" => a.n = value()?.parse().map_err(|e| format!("--n: {e}"))?,
            "--d" => a.d = value()?.parse().map_err(|e| format!("--d: {e}"))?,
            "--train" => a.train = value()?.parse().map_err(|e| format!("--train: {e}"))?,
            "--path" => a.path = PathBuf::from(value()?),
            "--reuse" => a.reuse = true,
            "--flat" => a.flat = true,
            "--child" => a.child = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// `Rss`, `Pss` and `Shared_Clean` of this process in KiB, from `/proc/self/smaps_rollup`.
fn memory() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Pss:"), field("Shared_Clean:"))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Scores every key once (touches every key page of the mapping).
fn touch_all_keys(keys: &Arc<KeyStore>) -> f32 {
    let flat = FlatIndex::new(keys.clone());
    let q = vec![0.01f32; keys.dim()];
    let mut scratch = Scratch::new(0);
    let out = flat
        .search(&q, 1, &SearchParams::default(), &mut scratch)
        .expect("scan");
    out.scores[0]
}

fn child(path: &Path) {
    let idx = io::load(path, &LoadOptions::no_verify()).expect("child: open");
    touch_all_keys(idx.key_store());
    let (rss, pss, shared) = memory();
    println!("ready {rss} {pss} {shared}");
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("read");
    let (rss, pss, shared) = memory();
    println!("{rss} {pss} {shared}");
}

fn build(a: &Args) {
    let t = Instant::now();
    let data = qkindex::synth::ood(a.n, 0, a.d, 2024);
    let keys = Arc::new(
        KeyStore::from_f16(data.keys.iter().map(|&x| f16::from_f32(x)).collect(), a.d)
            .expect("keys"),
    );
    if a.flat {
        drop(data);
        let t = Instant::now();
        FlatIndex::new(keys).save(&a.path).expect("save");
        println!(
            "saved a flat index to {} in {:.2}s",
            a.path.display(),
            t.elapsed().as_secs_f64()
        );
        return;
    }
    let rows = data.train_queries.len() / a.d;
    let take = a.train.min(rows).max(1);
    let step = rows as f64 / take as f64;
    let train: Vec<f32> = (0..take)
        .flat_map(|i| {
            let r = (i as f64 * step) as usize;
            data.train_queries[r * a.d..(r + 1) * a.d].to_vec()
        })
        .collect();
    drop(data);
    println!(
        "generated {} keys d={} and {take} training queries in {:.1}s",
        a.n,
        a.d,
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let idx =
        AttentionIndex::build(keys, &train, &AttentionParams::default(), &CpuKnn).expect("build");
    println!("built in {:.1}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    idx.save(&a.path).expect("save");
    println!(
        "saved {} in {:.2}s",
        a.path.display(),
        t.elapsed().as_secs_f64()
    );
}

/// Runs `f`, returning its result with wall seconds and CPU seconds of this thread (on a
/// shared machine the CPU time is the steadier figure).
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (wall, cpu) = (Instant::now(), cpu_time::ThreadTime::now());
    let r = f();
    (r, wall.elapsed().as_secs_f64(), cpu.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("big_file: {e}");
            std::process::exit(2);
        }
    };
    if a.child {
        child(&a.path);
        return;
    }
    if !(a.reuse && a.path.exists()) {
        build(&a);
    }
    let file_len = std::fs::metadata(&a.path).expect("stat").len();
    println!(
        "file: {} bytes ({:.1} MiB)",
        file_len,
        file_len as f64 / (1 << 20) as f64
    );
    let (rss0, pss0, _) = memory();

    // Open without verification: header and table only.
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let idx = io::load(&a.path, &LoadOptions::no_verify()).expect("open");
        times.push(t.elapsed().as_secs_f64());
        drop(idx);
    }
    println!(
        "open without verification: median {:.3} ms (min {:.3} ms, 7 opens)",
        median(times.clone()) * 1e3,
        times.iter().copied().fold(f64::INFINITY, f64::min) * 1e3
    );
    let idx = io::load(&a.path, &LoadOptions::no_verify()).expect("open");
    let (rss1, pss1, _) = memory();
    println!(
        "after open: RSS +{:.1} MiB, PSS +{:.1} MiB",
        mib(rss1.saturating_sub(rss0)),
        mib(pss1.saturating_sub(pss0))
    );

    // A graph search on the mapped index touches only the pages it reads.
    let q: Vec<f32> = (0..a.d)
        .map(|i| ((i * 7919) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let mut scratch = idx.new_scratch();
    let (out, wall, _) = timed(|| idx.search(&q, 100, &SearchParams::with_ef(128), &mut scratch));
    let out = out.expect("search");
    let (rss2, pss2, _) = memory();
    println!(
        "one search (k=100, ef=128): {:.3} ms, {} inner products; RSS +{:.1} MiB, PSS +{:.1} MiB since before the open",
        wall * 1e3,
        out.stats.distance_computations,
        mib(rss2.saturating_sub(rss0)),
        mib(pss2.saturating_sub(pss0))
    );

    // Open with verification (pages warm in the page cache after the build or earlier runs).
    let (mut walls, mut cpus) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (v, wall, cpu) = timed(|| io::load(&a.path, &LoadOptions::default()));
        v.expect("open verified");
        walls.push(wall);
        cpus.push(cpu);
    }
    let (tw, tc) = (median(walls), median(cpus));
    println!(
        "open with verification (warm page cache, median of 3): wall {:.1} ms ({:.2} GB/s), thread CPU {:.1} ms ({:.2} GB/s)",
        tw * 1e3,
        file_len as f64 / tw / 1e9,
        tc * 1e3,
        file_len as f64 / tc / 1e9
    );

    // Checksum throughput alone, over the mapped key bytes (warm).
    let bytes = io::key_bytes(idx.key_store());
    let (mut walls, mut cpus) = (Vec::new(), Vec::new());
    let mut sink = 0u64;
    for _ in 0..5 {
        let (c, wall, cpu) = timed(|| io::format::checksum(&bytes));
        sink ^= c;
        walls.push(wall);
        cpus.push(cpu);
    }
    let (tw, tc) = (median(walls), median(cpus));
    let gb = bytes.len() as f64 / 1e9;
    println!(
        "xxh3-64 over {:.1} MiB of keys (median of 5): wall {:.2} GB/s, thread CPU {:.2} GB/s ({sink:x})",
        bytes.len() as f64 / (1 << 20) as f64,
        gb / tw,
        gb / tc
    );

    touch_all_keys(idx.key_store());
    let (rss3, pss3, shared3) = memory();
    println!(
        "after scanning every key, alone: RSS {:.1} MiB, PSS {:.1} MiB, Shared_Clean {:.1} MiB",
        mib(rss3),
        mib(pss3),
        mib(shared3)
    );

    // A second process maps the same file and scans every key too.
    let exe = std::env::current_exe().expect("exe");
    let mut c = Command::new(exe)
        .args(["--child", "--path"])
        .arg(&a.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut lines = std::io::BufReader::new(c.stdout.take().expect("stdout")).lines();
    let ready = lines.next().expect("child line").expect("read");
    let (rss4, pss4, shared4) = memory();
    writeln!(c.stdin.take().expect("stdin")).expect("write");
    let child_now = lines.next().expect("child line").expect("read");
    c.wait().expect("child exit");
    let nums: Vec<u64> = child_now
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    println!(
        "two processes mapping the file: parent RSS {:.1} MiB, PSS {:.1} MiB, Shared_Clean {:.1} MiB; child RSS {:.1} MiB, PSS {:.1} MiB, Shared_Clean {:.1} MiB (child alone: {ready})",
        mib(rss4),
        mib(pss4),
        mib(shared4),
        mib(*nums.first().unwrap_or(&0)),
        mib(*nums.get(1).unwrap_or(&0)),
        mib(*nums.get(2).unwrap_or(&0)),
    );
}
