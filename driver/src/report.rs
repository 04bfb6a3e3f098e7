//! Benchmark rows, summaries and their JSON / CSV / markdown forms (schema `qkindex-bench/1`,
//! DESIGN.md §4).

use anyhow::{Context, Result};
use qkindex::SearchParams;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Recall targets of the summary.
pub const TARGETS: [f64; 3] = [0.90, 0.95, 0.99];

/// One measured setting.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub index: String,
    pub variant: String,
    #[serde(rename = "impl")]
    pub implementation: String,
    pub layer: usize,
    pub head: usize,
    pub queries: String,
    pub params: serde_json::Value,
    pub recall: f64,
    pub scanned: f64,
    pub distance_computations: f64,
    pub qps: f64,
    pub latency_us: Latency,
    pub build_s: serde_json::Value,
    pub mass_ratio: f64,
    pub output_cosine: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Best {
    pub params: serde_json::Value,
    pub qps: f64,
    pub scanned: f64,
}

/// Per (index, variant, layer, head, queries, target): the best-QPS and the fewest-scanned
/// settings reaching the target (null when none does).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub index: String,
    pub variant: String,
    pub layer: usize,
    pub head: usize,
    pub queries: String,
    pub target: f64,
    pub best_qps: Option<Best>,
    pub min_scanned: Option<Best>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub schema: &'static str,
    pub dump: String,
    pub cpu: String,
    pub k: usize,
    /// Clock of QPS and latencies (`wall` or `thread-cpu`).
    pub clock: String,
    pub wall_s: f64,
    pub rows: Vec<Row>,
    pub summary: Vec<Summary>,
}

impl BenchReport {
    pub fn new(dump: &Path, k: usize, clock: &str, rows: Vec<Row>, wall_s: f64) -> Self {
        let summary = summarize(&rows);
        BenchReport {
            schema: "qkindex-bench/1",
            dump: dump.display().to_string(),
            cpu: cpu_name(),
            k,
            clock: clock.to_string(),
            wall_s,
            rows,
            summary,
        }
    }

    /// Writes `bench.json`, `bench.csv` and `report.md` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        write(&dir.join("bench.json"), &json)?;
        write(&dir.join("bench.csv"), &self.csv())?;
        write(&dir.join("report.md"), &self.markdown())?;
        Ok(())
    }

    fn csv(&self) -> String {
        let mut s = String::from("index,variant,impl,layer,head,queries,params,recall,scanned,distance_computations,qps,latency_p50_us,latency_p99_us,build_total_s,mass_ratio,output_cosine\n");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{:.5},{:.5},{:.1},{:.1},{:.2},{:.2},{},{:.5},{}",
                r.index,
                r.variant,
                r.implementation,
                r.layer,
                r.head,
                r.queries,
                params_str(&r.params),
                r.recall,
                r.scanned,
                r.distance_computations,
                r.qps,
                r.latency_us.p50,
                r.latency_us.p99,
                r.build_s
                    .get("total")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0),
                r.mass_ratio,
                r.output_cosine.map_or(String::new(), |c| format!("{c:.5}")),
            );
        }
        s
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# qkindex bench\n\n- dump: `{}`\n- cpu: {}\n- k: {}\n- search clock: {}\n- wall time: {:.1} s\n",
            self.dump, self.cpu, self.k, self.clock, self.wall_s
        );
        let _ = writeln!(s, "## Median over heads at recall@{} ≥ 0.95\n", self.k);
        let _ = writeln!(s, "| index | variant | queries | heads reaching | median min scanned | median best QPS | median QPS / flat |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for line in median_table(self, 0.95) {
            let _ = writeln!(s, "{line}");
        }
        let _ = writeln!(
            s,
            "\n## Per head (recall ≥ 0.95: fewest scanned, best QPS)\n"
        );
        let _ = writeln!(s, "| index | variant | layer | head | queries | min scanned | params | best QPS | params |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        for x in self.summary.iter().filter(|x| x.target == 0.95) {
            let (ms, mp) = x
                .min_scanned
                .as_ref()
                .map_or(("—".into(), "—".into()), |b| {
                    (format!("{:.4}", b.scanned), params_str(&b.params))
                });
            let (bq, bp) = x.best_qps.as_ref().map_or(("—".into(), "—".into()), |b| {
                (format!("{:.0}", b.qps), params_str(&b.params))
            });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                x.index, x.variant, x.layer, x.head, x.queries, ms, mp, bq, bp
            );
        }
        s
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut groups: BTreeMap<(String, String, usize, usize, String), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        groups
            .entry((
                r.index.clone(),
                r.variant.clone(),
                r.layer,
                r.head,
                r.queries.clone(),
            ))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((index, variant, layer, head, queries), rs) in groups {
        for &target in &TARGETS {
            let ok: Vec<&&Row> = rs.iter().filter(|r| r.recall >= target).collect();
            let best = |r: &Row| Best {
                params: r.params.clone(),
                qps: r.qps,
                scanned: r.scanned,
            };
            out.push(Summary {
                index: index.clone(),
                variant: variant.clone(),
                layer,
                head,
                queries: queries.clone(),
                target,
                best_qps: ok
                    .iter()
                    .max_by(|a, b| a.qps.total_cmp(&b.qps))
                    .map(|r| best(r)),
                min_scanned: ok
                    .iter()
                    .min_by(|a, b| a.scanned.total_cmp(&b.scanned))
                    .map(|r| best(r)),
            });
        }
    }
    out
}

/// Markdown rows: per (index, variant, queries), medians over heads at `target`.
fn median_table(report: &BenchReport, target: f64) -> Vec<String> {
    let flat_qps: BTreeMap<(usize, usize, String), f64> = report
        .rows
        .iter()
        .filter(|r| r.index == "flat" && r.implementation == "qkindex")
        .map(|r| ((r.layer, r.head, r.queries.clone()), r.qps))
        .collect();
    let mut groups: BTreeMap<(String, String, String), Vec<&Summary>> = BTreeMap::new();
    for s in report.summary.iter().filter(|s| s.target == target) {
        groups
            .entry((s.index.clone(), s.variant.clone(), s.queries.clone()))
            .or_default()
            .push(s);
    }
    let mut lines = Vec::new();
    for ((index, variant, queries), ss) in groups {
        let reached: Vec<&&Summary> = ss.iter().filter(|s| s.min_scanned.is_some()).collect();
        let mut scanned: Vec<f64> = reached
            .iter()
            .filter_map(|s| s.min_scanned.as_ref().map(|b| b.scanned))
            .collect();
        let mut qps: Vec<f64> = reached
            .iter()
            .filter_map(|s| s.best_qps.as_ref().map(|b| b.qps))
            .collect();
        let mut ratio: Vec<f64> = reached
            .iter()
            .filter_map(|s| {
                let f = flat_qps.get(&(s.layer, s.head, s.queries.clone()))?;
                Some(s.best_qps.as_ref()?.qps / f)
            })
            .collect();
        let fmt = |v: &mut Vec<f64>, p: usize| {
            if v.is_empty() {
                "—".to_string()
            } else {
                format!("{:.*}", p, median(v))
            }
        };
        lines.push(format!(
            "| {index} | {variant} | {queries} | {}/{} | {} | {} | {} |",
            reached.len(),
            ss.len(),
            fmt(&mut scanned, 4),
            fmt(&mut qps, 0),
            fmt(&mut ratio, 2)
        ));
    }
    lines
}

/// Prints the median table for each target to stderr.
pub fn print_summary(report: &BenchReport) {
    for &t in &TARGETS {
        eprintln!("\nrecall@{} >= {t}: index | variant | queries | heads reaching | median min scanned | median best QPS | median QPS/flat", report.k);
        for line in median_table(report, t) {
            eprintln!("{line}");
        }
    }
}

/// Median (sorts in place); NaN for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        0.5 * (v[m - 1] + v[m])
    }
}

/// p50 and p99 (nearest rank) of latencies in µs.
pub fn percentiles(v: &mut [f64]) -> Latency {
    if v.is_empty() {
        return Latency::default();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Latency {
        p50: at(0.50),
        p99: at(0.99),
    }
}

pub fn params_json(p: &SearchParams) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    if let Some(ef) = p.ef {
        m.insert("ef".into(), ef.into());
    }
    if let Some(np) = p.nprobe {
        m.insert("nprobe".into(), np.into());
    }
    serde_json::Value::Object(m)
}

pub fn params_str(v: &serde_json::Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".into(),
    }
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
