//! `qkindex-gpu-check`: the GPU kNN checks, split so that the GPU machine needs no Rust toolchain.
//!
//! - `prepare --out DIR` (any machine): writes test cases (random and real attention heads) with
//!   the CPU backend's exact top-k, to compare against on the GPU.
//! - `run --cases DIR --out DIR [--quick]` (the GPU machine, prebuilt binary): correctness of both
//!   kernel paths against those CPU results, the measured tensor-core GEMM rate, and the timing of
//!   131,072 queries × 131,072 keys (d = 128, k = 100) as a percentage of the GEMM floor. Writes
//!   `gpu-knn.json` and `gpu-knn.md`.
//!
//! `scripts/gpu-check.sh` runs both halves and the PyTorch reference.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use half::f16;
use qkindex::dump::{Dump, Part};
use qkindex::{npy, CpuKnn, KeyStore, KnnBackend, KnnOptions, KnnResult};
use qkindex_gpu::{compare, CudaKnn, CudaKnnOptions, KernelPath};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(about = "GPU exact-kNN checks: prepare CPU references here, run them on a GPU machine")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write test cases and their CPU top-k (run on a CPU machine).
    Prepare {
        #[arg(long)]
        out: PathBuf,
        /// A Q/K dump (e.g. ../shared/data/smollm2-public-8k) for the real-data cases.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
    /// Run the checks on the GPU.
    Run {
        #[arg(long)]
        cases: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Smaller timing problem (32,768²) and fewer repetitions: under a minute.
        #[arg(long)]
        quick: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Prepare { out, dump } => prepare(&out, dump.as_deref()),
        Cmd::Run { cases, out, quick } => run(&cases, &out, quick),
    }
}

/// One comparison case: queries, keys, k, causal.
struct Case {
    name: String,
    d: usize,
    queries: Vec<f32>,
    keys: Vec<f32>,
    k: usize,
    causal: bool,
}

fn random(rows: usize, d: usize, seed: u64) -> Vec<f32> {
    // A small deterministic generator (splitmix64) so that the cases are reproducible anywhere.
    let mut s = seed;
    (0..rows * d)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn prepare(out: &Path, dump: Option<&Path>) -> Result<()> {
    let mut cases = vec![
        Case {
            name: "random-d64-k100".into(),
            d: 64,
            queries: random(4096, 64, 1),
            keys: random(8192, 64, 2),
            k: 100,
            causal: false,
        },
        Case {
            name: "random-d128-k1024".into(),
            d: 128,
            queries: random(1024, 128, 3),
            keys: random(16384, 128, 4),
            k: 1024,
            causal: false,
        },
        Case {
            name: "random-d128-causal-k100".into(),
            d: 128,
            queries: random(4096, 128, 5),
            keys: random(4096, 128, 6),
            k: 100,
            causal: true,
        },
        Case {
            name: "random-d200-k10".into(),
            d: 200,
            queries: random(1024, 200, 7),
            keys: random(5000, 200, 8),
            k: 10,
            causal: false,
        },
    ];
    if let Some(dir) = dump {
        let dump = Dump::open(dir).with_context(|| format!("opening {}", dir.display()))?;
        let man = dump.manifest.clone();
        for (layer, head) in [(9usize, 0usize), (16, 3)] {
            if !man.layers.contains(&layer) {
                continue;
            }
            let q = dump.read(layer, Part::Q)?;
            let k = dump.read(layer, Part::K)?;
            cases.push(Case {
                name: format!("real-L{layer}-h{head}-causal-k100"),
                d: q.dim,
                queries: q.head(head).to_vec(),
                keys: k.head(man.kv_head_of(head)).to_vec(),
                k: 100,
                causal: true,
            });
        }
    }
    for c in &mut cases {
        // Stored as f16 (half the size to carry); the reference is computed on those values.
        for v in c.queries.iter_mut().chain(c.keys.iter_mut()) {
            *v = f16::from_f32(*v).to_f32();
        }
        let dir = out.join(&c.name);
        std::fs::create_dir_all(&dir)?;
        let m = c.queries.len() / c.d;
        let n = c.keys.len() / c.d;
        let store = KeyStore::from_f32(c.keys.clone(), c.d)?;
        let t = Instant::now();
        let r = CpuKnn.topk(&c.queries, &store, c.k, &KnnOptions::causal(c.causal))?;
        let cpu_s = t.elapsed().as_secs_f64();
        npy::write_f16(&dir.join("queries.npy"), &[m, c.d], &c.queries)?;
        npy::write_f16(&dir.join("keys.npy"), &[n, c.d], &c.keys)?;
        // Padding (u32::MAX) is stored as -1.
        let ids: Vec<i32> = r
            .ids
            .iter()
            .map(|&x| i32::try_from(x).unwrap_or(-1))
            .collect();
        npy::write_i32(&dir.join("cpu_ids.npy"), &[m, c.k], &ids)?;
        let meta =
            json!({"k": c.k, "causal": c.causal, "m": m, "n": n, "d": c.d, "cpu_seconds": cpu_s});
        std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
        println!(
            "{}: {m} queries × {n} keys, d {}, k {}, CPU {cpu_s:.2} s",
            c.name, c.d, c.k
        );
    }
    Ok(())
}

fn load_case(dir: &Path) -> Result<(Value, Vec<f32>, KeyStore, KnnResult)> {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json"))?)?;
    let d = meta["d"].as_u64().context("meta.json: d")? as usize;
    let k = meta["k"].as_u64().context("meta.json: k")? as usize;
    let q = npy::read_f32(&dir.join("queries.npy"))?.data;
    let keys = KeyStore::from_f32(npy::read_f32(&dir.join("keys.npy"))?.data, d)?;
    let ids = npy::read_i64(&dir.join("cpu_ids.npy"))?.data;
    let ids: Vec<u32> = ids
        .iter()
        .map(|&x| u32::try_from(x).unwrap_or(KnnResult::PAD))
        .collect();
    if ids.len() != q.len() / d * k
        || ids
            .iter()
            .any(|&i| i != KnnResult::PAD && i as usize >= keys.len())
    {
        bail!("{}: cpu_ids.npy does not match the case", dir.display());
    }
    // The CPU's scores, recomputed exactly from its ids.
    let scorer = keys.scorer();
    let scores = ids
        .chunks(k)
        .zip(q.chunks(d))
        .flat_map(|(row, qr)| {
            row.iter().map(move |&i| {
                if i == KnnResult::PAD {
                    f32::NEG_INFINITY
                } else {
                    scorer.score(qr, i)
                }
            })
        })
        .collect();
    Ok((meta, q, keys, KnnResult { k, ids, scores }))
}

fn run(cases: &Path, out: &Path, quick: bool) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let probe = CudaKnn::new(0).context("opening the GPU")?;
    let device = probe.device_name().to_string();
    println!("device: {device}; cuBLAS: {}", probe.has_cublas());
    let paths: Vec<KernelPath> = if probe.has_cublas() {
        vec![
            KernelPath::Fused,
            KernelPath::Gemm,
            KernelPath::Radix,
            KernelPath::Auto,
        ]
    } else {
        vec![KernelPath::Fused, KernelPath::Auto]
    };
    // One backend per path (each opening compiles the kernels once).
    let opts = |path, rescore| CudaKnnOptions {
        path,
        rescore,
        query_chunk: 0,
    };
    let mut backends = Vec::new();
    for &path in &paths {
        backends.push((path, CudaKnn::new(0)?.with_options(opts(path, true))));
    }

    // Correctness against the CPU results prepared elsewhere.
    let mut correctness = Vec::new();
    let mut all_ok = true;
    let mut dirs: Vec<_> = std::fs::read_dir(cases)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("meta.json").exists())
        .collect();
    dirs.sort();
    for dir in &dirs {
        let (meta, q, keys, cpu) = load_case(dir)?;
        let name = dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let causal = meta["causal"].as_bool().unwrap_or(false);
        for (path, g) in &backends {
            let path = *path;
            if path == KernelPath::Fused && keys.dim() > 128 {
                continue;
            }
            let (got, t) = g.run(&q, &keys, cpu.k, &KnnOptions::causal(causal))?;
            let c = compare(&q, &keys, &got, &cpu);
            all_ok &= c.ok();
            println!("{name} {path:?}: ok={} recall={:.5} identical_rows={}/{} near_ties={} errors={} kernel={:.2} ms",
                c.ok(), c.recall, c.identical_rows, c.rows, c.near_ties, c.errors, t.kernel_ms);
            correctness.push(
                json!({"case": name, "path": path, "ok": c.ok(), "comparison": c, "timings": t}),
            );
        }
    }

    // The tensor-core rate, then the big problem.
    let gemm_size = if quick { 4096 } else { 8192 };
    let rate = if probe.has_cublas() {
        Some(probe.gemm_tflops(gemm_size, if quick { 5 } else { 20 })?)
    } else {
        None
    };
    println!("cuBLAS f16→f32 GEMM {gemm_size}³: {:?} TFLOP/s", rate);
    let n = if quick { 32_768 } else { 131_072 };
    let (d, k) = (128usize, 100usize);
    let q = random(n, d, 11);
    let keys = KeyStore::from_f16(random(n, d, 12).into_iter().map(f16::from_f32).collect(), d)?;
    let flops = 2.0 * (n as f64) * (n as f64) * d as f64;
    let mut perf = Vec::new();
    let reps = if quick { 1 } else { 3 };
    for (path, g) in &mut backends {
        let path = *path;
        g.set_options(opts(path, false));
        let mut runs = Vec::new();
        for _ in 0..=reps {
            let (_, t) = g.run(&q, &keys, k, &KnnOptions::default())?;
            runs.push(t);
        }
        runs.remove(0); // warm-up (module load, allocator)
        runs.sort_by(|a, b| a.kernel_ms.total_cmp(&b.kernel_ms));
        let t = runs[runs.len() / 2].clone();
        let floor_ms = rate.map(|r| flops / (r * 1e12) * 1e3);
        let pct = floor_ms.map(|f| 100.0 * f / t.kernel_ms);
        println!("{path:?} {n}×{n} d{d} k{k}: kernel {:.2} ms (GEMM floor {:?} ms, {:?} % of floor), wall {:.1} ms",
            t.kernel_ms, floor_ms, pct, t.wall_ms);
        perf.push(
            json!({"path": path, "queries": n, "keys": n, "d": d, "k": k,
            "median_of": reps, "timings": t, "gemm_floor_ms": floor_ms,
            "floor_over_kernel_pct": pct, "kernel_over_floor": floor_ms.map(|f| t.kernel_ms / f)}),
        );
    }
    let report = json!({
        "device": device,
        "quick": quick,
        "correct": all_ok,
        "correctness": correctness,
        "gemm_rate": {"size": gemm_size, "tflops": rate},
        "performance": perf,
    });
    std::fs::write(
        out.join("gpu-knn.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let mut md = format!("# GPU exact kNN on {device}\n\n| case | path | ok | recall | identical rows | near-ties | errors |\n|---|---|---|---|---|---|---|\n");
    for c in &correctness {
        let cmp = &c["comparison"];
        md += &format!(
            "| {} | {} | {} | {:.5} | {}/{} | {} | {} |\n",
            c["case"].as_str().unwrap_or(""),
            c["path"],
            c["ok"],
            cmp["recall"].as_f64().unwrap_or(0.0),
            cmp["identical_rows"],
            cmp["rows"],
            cmp["near_ties"],
            cmp["errors"]
        );
    }
    md += &format!("\nGEMM rate (cuBLAS f16 in, f32 out, {gemm_size}³): {rate:?} TFLOP/s\n\n| path | problem | kernel ms | floor ms | kernel / floor | wall ms |\n|---|---|---|---|---|---|\n");
    for p in &perf {
        md += &format!(
            "| {} | {n}×{n}, d {d}, k {k} | {:.2} | {:.2} | {:.2} | {:.1} |\n",
            p["path"],
            p["timings"]["kernel_ms"].as_f64().unwrap_or(f64::NAN),
            p["gemm_floor_ms"].as_f64().unwrap_or(f64::NAN),
            p["kernel_over_floor"].as_f64().unwrap_or(f64::NAN),
            p["timings"]["wall_ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
    std::fs::write(out.join("gpu-knn.md"), md)?;
    if !all_ok {
        bail!("GPU results differ from the CPU's beyond f16 near-ties (see gpu-knn.json)");
    }
    Ok(())
}
