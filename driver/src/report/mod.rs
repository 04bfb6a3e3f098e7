//! Benchmark rows, summaries and their JSON / CSV / markdown forms (schema `qkindex-bench/1`,
//! docs/DESIGN.md §4).
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the rows and the report: read, merge, write |
//! | `summary.rs` | per head and target: the best settings and whether the sweep brackets the target; medians and percentiles |
//! | `tables.rs` | the report's forms: CSV, markdown tables, the summary printed to stderr |

mod summary;
mod tables;

pub use summary::{median, percentiles, Bracket, Summary};
pub use tables::{params_json, params_str, print_summary};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use summary::summarize;

/// The `schema` field of `bench.json`.
pub const SCHEMA: &str = "qkindex-bench/1";

/// Recall targets of the summary.
pub const TARGETS: [f64; 3] = [0.90, 0.95, 0.99];

/// One measured setting. Fields a peer cannot report (hnswlib counts no inner products) are
/// null, never estimated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub index: String,
    pub variant: String,
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Neighbours searched (recall@k); rows without it take the report's `k`.
    #[serde(default)]
    pub k: usize,
    pub layer: usize,
    pub head: usize,
    pub queries: String,
    pub params: serde_json::Value,
    pub recall: f64,
    pub scanned: Option<f64>,
    pub distance_computations: Option<f64>,
    /// Code estimates per query (int8 or PQ codes ranked before an exact re-rank); they are not
    /// counted in `distance_computations` or `scanned`, which stay full-precision products.
    /// Null for kinds that score no codes.
    #[serde(default)]
    pub code_estimates: Option<f64>,
    pub qps: f64,
    pub latency_us: Latency,
    pub build_s: serde_json::Value,
    /// Bytes of the index structure per key, the keys themselves not counted.
    #[serde(default)]
    pub bytes_per_key: Option<f64>,
    pub mass_ratio: Option<f64>,
    pub output_cosine: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    /// Timed searches the percentiles are taken over.
    #[serde(default)]
    pub samples: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub schema: String,
    pub dump: String,
    pub cpu: String,
    pub k: usize,
    /// Head dimension of the dump (absent in peer files).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Keys per head of the dump (absent in peer files).
    #[serde(default)]
    pub n_keys: Option<usize>,
    /// Clock of QPS and latencies (`wall` or `thread-cpu`).
    #[serde(default)]
    pub clock: String,
    #[serde(default)]
    pub wall_s: f64,
    pub rows: Vec<Row>,
    /// Recomputed from the rows whenever a file is read (peer scripts write their own form).
    #[serde(default, skip_deserializing)]
    pub summary: Vec<Summary>,
}

impl BenchReport {
    pub fn new(dump: &Path, k: usize, clock: &str, rows: Vec<Row>, wall_s: f64) -> Self {
        let summary = summarize(&rows);
        BenchReport {
            schema: SCHEMA.to_string(),
            dump: dump.display().to_string(),
            cpu: cpu_name(),
            k,
            head_dim: None,
            n_keys: None,
            clock: clock.to_string(),
            wall_s,
            rows,
            summary,
        }
    }

    /// Reads a `bench.json` (ours or a peer script's); rows without `k` take the file's `k`.
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut report: BenchReport = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a {SCHEMA} file", path.display()))?;
        if report.schema != SCHEMA {
            anyhow::bail!(
                "{}: schema {:?}, expected {SCHEMA:?}",
                path.display(),
                report.schema
            );
        }
        for r in &mut report.rows {
            if r.k == 0 {
                r.k = report.k;
            }
        }
        report.summary = summarize(&report.rows);
        Ok(report)
    }

    /// Adds the rows of `other` (peers measured in the same run) and recomputes the summary.
    pub fn merge(&mut self, other: BenchReport) {
        self.rows.extend(other.rows);
        self.wall_s += other.wall_s;
        self.summary = summarize(&self.rows);
    }

    /// Writes `bench.json`, `bench.csv`, `report.md` and the plots into `dir`.
    pub fn write(&self, dir: &Path, budget: f64) -> Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        write(&dir.join("bench.json"), &json)?;
        write(&dir.join("bench.csv"), &self.csv())?;
        let plots = crate::plots::write_all(self, dir, budget)?;
        write(&dir.join("report.md"), &self.markdown(&plots, dir))?;
        Ok(())
    }

    pub(crate) fn ks(&self) -> Vec<usize> {
        let mut ks: Vec<usize> = self.rows.iter().map(|r| r.k).collect();
        ks.sort_unstable();
        ks.dedup();
        ks
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
        + &format!(
            " ({} threads, kernels {})",
            rayon::current_num_threads(),
            qkindex::metric::kernels().isa
        )
}
