//! Benchmark rows, summaries and their JSON / CSV / markdown forms (schema `qkindex-bench/1`,
//! docs/DESIGN.md §4).

use anyhow::{Context, Result};
use qkindex::SearchParams;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

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
pub struct Best {
    pub params: serde_json::Value,
    pub qps: f64,
    pub scanned: Option<f64>,
}

/// Whether a head's sweep brackets a recall target: a figure "at recall R" is what R needs only
/// when the sweep has a setting below R and one at or above it. Otherwise it is the sweep's
/// floor (every setting reaches R: the cheapest setting's cost, which may be far above what R
/// needs) or R is out of its reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bracket {
    /// A setting below the target and one at or above it.
    Yes,
    /// Every setting reaches the target: its figures are the sweep's cheapest setting's.
    Floor,
    /// No setting reaches the target.
    Ceiling,
    /// One setting only (the exact scan): nothing to bracket.
    Single,
}

impl Bracket {
    /// The bracket of `target` by a head's settings (their mean recalls) and how many
    /// distinct settings they are.
    pub fn of(recalls: &[f64], settings: usize, target: f64) -> Self {
        if settings <= 1 {
            return Bracket::Single;
        }
        let below = recalls.iter().any(|&r| r < target);
        let reach = recalls.iter().any(|&r| r >= target);
        match (below, reach) {
            (true, true) => Bracket::Yes,
            (false, _) => Bracket::Floor,
            (true, false) => Bracket::Ceiling,
        }
    }

    /// A figure taken at the target is not what the target needs.
    pub fn flagged(self) -> bool {
        matches!(self, Bracket::Floor | Bracket::Ceiling)
    }

    /// The per-head table's cell.
    fn cell(self) -> &'static str {
        match self {
            Bracket::Yes => "yes",
            Bracket::Floor => "**NO: floor**",
            Bracket::Ceiling => "**NO: ceiling**",
            Bracket::Single => "single setting",
        }
    }
}

/// Per (index, variant, layer, head, queries, target): the best-QPS and the fewest-scanned
/// settings reaching the target (null when none does), and whether the sweep brackets it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    #[serde(rename = "impl")]
    pub implementation: String,
    pub index: String,
    pub variant: String,
    pub k: usize,
    pub layer: usize,
    pub head: usize,
    pub queries: String,
    pub target: f64,
    pub best_qps: Option<Best>,
    pub min_scanned: Option<Best>,
    /// Whether the head's settings bracket the target (recomputed from the rows on reading).
    pub bracket: Bracket,
}

/// A curve of the markdown tables: (impl, index, variant, queries).
type SeriesKey = (String, String, String, String);

impl Summary {
    fn series(&self) -> SeriesKey {
        (
            self.implementation.clone(),
            self.index.clone(),
            self.variant.clone(),
            self.queries.clone(),
        )
    }
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

    fn csv(&self) -> String {
        let mut s = String::from("index,variant,impl,k,layer,head,queries,params,recall,scanned,distance_computations,code_estimates,qps,latency_p50_us,latency_p99_us,latency_samples,build_total_s,bytes_per_key,mass_ratio,output_cosine\n");
        let opt = |v: Option<f64>, p: usize| v.map_or(String::new(), |x| format!("{x:.p$}"));
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{:.5},{},{},{},{:.1},{:.2},{:.2},{},{},{},{},{}",
                csv_field(&r.index),
                csv_field(&r.variant),
                csv_field(&r.implementation),
                r.k,
                r.layer,
                r.head,
                csv_field(&r.queries),
                csv_field(&params_str(&r.params)),
                r.recall,
                opt(r.scanned, 5),
                opt(r.distance_computations, 1),
                opt(r.code_estimates, 1),
                r.qps,
                r.latency_us.p50,
                r.latency_us.p99,
                r.latency_us.samples,
                opt(r.build_s.get("total").and_then(|v| v.as_f64()), 3),
                opt(r.bytes_per_key, 1),
                opt(r.mass_ratio, 5),
                opt(r.output_cosine, 5),
            );
        }
        s
    }

    fn ks(&self) -> Vec<usize> {
        let mut ks: Vec<usize> = self.rows.iter().map(|r| r.k).collect();
        ks.sort_unstable();
        ks.dedup();
        ks
    }

    fn markdown(&self, plots: &[std::path::PathBuf], dir: &Path) -> String {
        let mut s = String::new();
        let impls: std::collections::BTreeSet<&str> = self
            .rows
            .iter()
            .map(|r| r.implementation.as_str())
            .collect();
        let _ = writeln!(
            s,
            "# qkindex bench\n\n- dump: `{}`\n- cpu: {}\n- k: {}\n- implementations: {}\n- search clock: {} (single thread)\n- wall time: {:.1} s\n",
            self.dump,
            self.cpu,
            self.ks().iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", "),
            impls.into_iter().collect::<Vec<_>>().join(", "),
            self.clock,
            self.wall_s
        );
        let _ = writeln!(s, "Medians over heads of the fewest keys scanned and the best single-thread QPS among the settings whose mean recall@k reaches the target; QPS ratios are per head, against the same run's exact scan of that head (`own flat`: the implementation's own, `faiss flat`: faiss IndexFlatIP).\n");
        let _ = writeln!(s, "`not bracketed`: heads whose sweep has no setting below the target (its figures are the cheapest setting's, an upper bound on what the target needs) or none reaching it; they are listed under \"Not bracketed\". {}\n", self.bracket_line());
        for k in self.ks() {
            for &t in &TARGETS {
                let _ = writeln!(s, "## recall@{k} ≥ {t}\n");
                let _ = writeln!(s, "{}", MEDIAN_HEADER);
                let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
                for line in median_table(self, k, t) {
                    let _ = writeln!(s, "{line}");
                }
                let _ = writeln!(s);
            }
            self.quality_table(&mut s, k);
        }
        self.unbracketed_list(&mut s);
        if !plots.is_empty() {
            let _ = writeln!(s, "## Plots\n");
            for p in plots
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "png"))
            {
                let rel = p.strip_prefix(dir).unwrap_or(p);
                let _ = writeln!(s, "![{}]({})\n", rel.display(), rel.display());
            }
        }
        let _ = writeln!(s, "## Per head (recall ≥ 0.95: fewest scanned, best QPS)\n");
        let _ = writeln!(s, "| impl | index | variant | k | layer | head | queries | bracketed | min scanned | params | best QPS | params |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for x in self.summary.iter().filter(|x| x.target == 0.95) {
            let (ms, mp) = x
                .min_scanned
                .as_ref()
                .map_or(("—".into(), "—".into()), |b| {
                    (fmt_opt(b.scanned, 4), params_str(&b.params))
                });
            let (bq, bp) = x.best_qps.as_ref().map_or(("—".into(), "—".into()), |b| {
                (format!("{:.0}", b.qps), params_str(&b.params))
            });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                x.implementation,
                x.index,
                x.variant,
                x.k,
                x.layer,
                x.head,
                x.queries,
                x.bracket.cell(),
                ms,
                mp,
                bq,
                bp
            );
        }
        s
    }

    /// Summaries whose sweep does not bracket their target.
    pub fn unbracketed(&self) -> impl Iterator<Item = &Summary> {
        self.summary.iter().filter(|x| x.bracket.flagged())
    }

    /// One sentence: how many (head, kind, target) figures are not bracketed.
    pub fn bracket_line(&self) -> String {
        let swept = self
            .summary
            .iter()
            .filter(|x| x.bracket != Bracket::Single)
            .count();
        let n = self.unbracketed().count();
        if n == 0 {
            format!("Every sweep brackets every target ({swept} head × kind × target figures).")
        } else {
            format!("**{n} of {swept} head × kind × target figures are not bracketed.**")
        }
    }

    /// The "Not bracketed" section: every flagged (series, head, target), or a line saying
    /// there is none.
    fn unbracketed_list(&self, s: &mut String) {
        let _ = writeln!(s, "## Not bracketed\n");
        if self.unbracketed().next().is_none() {
            let _ = writeln!(
                s,
                "None: every head's sweep has a setting below each target and one reaching it.\n"
            );
            return;
        }
        let _ = writeln!(s, "`floor`: every setting reaches the target (the figure is the cheapest setting's); `ceiling`: none reaches it.\n");
        let _ = writeln!(
            s,
            "| impl | index | variant | queries | k | target | layer | head | why | recall range |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for x in self.unbracketed() {
            let recalls = self.rows.iter().filter(|r| {
                r.k == x.k
                    && r.implementation == x.implementation
                    && r.index == x.index
                    && r.variant == x.variant
                    && r.layer == x.layer
                    && r.head == x.head
                    && r.queries == x.queries
            });
            let (lo, hi) = recalls.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
                (lo.min(r.recall), hi.max(r.recall))
            });
            let why = match x.bracket {
                Bracket::Floor => "floor",
                _ => "ceiling",
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {why} | {lo:.4} – {hi:.4} |",
                x.implementation, x.index, x.variant, x.queries, x.k, x.target, x.layer, x.head
            );
        }
        let _ = writeln!(s);
    }

    /// Attention quality and cost at each index's fewest-scanned 0.95 setting, medians over heads.
    fn quality_table(&self, s: &mut String, k: usize) {
        let _ = writeln!(s, "### recall@{k}: attention quality, latency and size at each head's fewest-scanned setting with recall ≥ 0.95 (medians over heads)\n");
        let _ = writeln!(s, "| impl | index | variant | queries | mass_ratio | output_cosine | p50 µs | p99 µs | latency samples | bytes/key | build s |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        let mut groups: BTreeMap<SeriesKey, Vec<&Row>> = BTreeMap::new();
        for x in self.summary.iter().filter(|x| x.k == k && x.target == 0.95) {
            let Some(best) = &x.min_scanned else { continue };
            if let Some(r) = self.rows.iter().find(|r| {
                r.k == k
                    && r.implementation == x.implementation
                    && r.index == x.index
                    && r.variant == x.variant
                    && r.layer == x.layer
                    && r.head == x.head
                    && r.queries == x.queries
                    && r.params == best.params
            }) {
                groups.entry(x.series()).or_default().push(r);
            }
        }
        for ((imp, index, variant, queries), rs) in groups {
            let med = |f: &dyn Fn(&Row) -> Option<f64>, p: usize| {
                median_or_dash(&mut rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>(), p)
            };
            // Peer files may not record how many calls their percentiles cover.
            let samples = match rs.iter().map(|r| r.latency_us.samples).min() {
                Some(n) if n > 0 => n.to_string(),
                _ => "—".to_string(),
            };
            let _ = writeln!(
                s,
                "| {imp} | {index} | {variant} | {queries} | {} | {} | {} | {} | {} | {} | {} |",
                med(&|r| r.mass_ratio, 4),
                med(&|r| r.output_cosine, 4),
                med(&|r| Some(r.latency_us.p50), 1),
                med(&|r| Some(r.latency_us.p99), 1),
                samples,
                med(&|r| r.bytes_per_key, 1),
                med(&|r| r.build_s.get("total").and_then(|v| v.as_f64()), 2),
            );
        }
        let _ = writeln!(s);
    }
}

const MEDIAN_HEADER: &str = "| impl | index | variant | queries | heads reaching | not bracketed | median min scanned | max min scanned | median best QPS | median QPS / own flat | median QPS / faiss flat |";

/// The median of `v` with `p` decimals, "—" when `v` is empty.
fn median_or_dash(v: &mut [f64], p: usize) -> String {
    if v.is_empty() {
        "—".to_string()
    } else {
        format!("{:.p$}", median(v))
    }
}

fn fmt_opt(v: Option<f64>, p: usize) -> String {
    v.map_or("—".into(), |x| format!("{x:.p$}"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

type GroupKey = (String, String, String, usize, usize, usize, String);

fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut groups: BTreeMap<GroupKey, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        groups
            .entry((
                r.implementation.clone(),
                r.index.clone(),
                r.variant.clone(),
                r.k,
                r.layer,
                r.head,
                r.queries.clone(),
            ))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((implementation, index, variant, k, layer, head, queries), rs) in groups {
        for &target in &TARGETS {
            let ok: Vec<&&Row> = rs.iter().filter(|r| r.recall >= target).collect();
            let best = |r: &Row| Best {
                params: r.params.clone(),
                qps: r.qps,
                scanned: r.scanned,
            };
            let recalls: Vec<f64> = rs.iter().map(|r| r.recall).collect();
            let mut settings: Vec<String> = rs.iter().map(|r| r.params.to_string()).collect();
            settings.sort_unstable();
            settings.dedup();
            out.push(Summary {
                implementation: implementation.clone(),
                index: index.clone(),
                variant: variant.clone(),
                k,
                layer,
                head,
                queries: queries.clone(),
                target,
                best_qps: ok
                    .iter()
                    .max_by(|a, b| a.qps.total_cmp(&b.qps))
                    .map(|r| best(r)),
                // Peers that count no inner products have no scanned figure: fall back to the
                // best-recall setting so that "reached" is still reported.
                min_scanned: ok
                    .iter()
                    .min_by(|a, b| {
                        a.scanned
                            .unwrap_or(f64::INFINITY)
                            .total_cmp(&b.scanned.unwrap_or(f64::INFINITY))
                    })
                    .map(|r| best(r)),
                bracket: Bracket::of(&recalls, settings.len(), target),
            });
        }
    }
    out
}

/// Markdown rows: per (impl, index, variant, queries), medians over heads at `target`.
fn median_table(report: &BenchReport, k: usize, target: f64) -> Vec<String> {
    let flat_of = |imp: &str| -> BTreeMap<(usize, usize, String), f64> {
        report
            .rows
            .iter()
            .filter(|r| {
                r.index == "flat" && r.variant.is_empty() && r.implementation == imp && r.k == k
            })
            .map(|r| ((r.layer, r.head, r.queries.clone()), r.qps))
            .collect()
    };
    let faiss = flat_of("faiss");
    let mut groups: BTreeMap<SeriesKey, Vec<&Summary>> = BTreeMap::new();
    for s in report
        .summary
        .iter()
        .filter(|s| s.target == target && s.k == k)
    {
        groups.entry(s.series()).or_default().push(s);
    }
    let mut lines = Vec::new();
    for ((imp, index, variant, queries), ss) in groups {
        let own = flat_of(&imp);
        let reached: Vec<&&Summary> = ss.iter().filter(|s| s.min_scanned.is_some()).collect();
        let mut scanned: Vec<f64> = reached
            .iter()
            .filter_map(|s| s.min_scanned.as_ref().and_then(|b| b.scanned))
            .collect();
        let max_scanned = scanned.iter().copied().fold(f64::NAN, f64::max);
        let mut qps: Vec<f64> = reached
            .iter()
            .filter_map(|s| s.best_qps.as_ref().map(|b| b.qps))
            .collect();
        let ratio = |flat: &BTreeMap<(usize, usize, String), f64>| -> Vec<f64> {
            reached
                .iter()
                .filter_map(|s| {
                    let f = flat.get(&(s.layer, s.head, s.queries.clone()))?;
                    Some(s.best_qps.as_ref()?.qps / f)
                })
                .collect()
        };
        let (mut own_r, mut faiss_r) = (ratio(&own), ratio(&faiss));
        let flagged = ss.iter().filter(|s| s.bracket.flagged()).count();
        lines.push(format!(
            "| {imp} | {index} | {variant} | {queries} | {}/{} | {} | {} | {} | {} | {} | {} |",
            reached.len(),
            ss.len(),
            if flagged == 0 {
                "0".to_string()
            } else {
                format!("**{flagged}**")
            },
            median_or_dash(&mut scanned, 4),
            if max_scanned.is_nan() {
                "—".to_string()
            } else {
                format!("{max_scanned:.4}")
            },
            median_or_dash(&mut qps, 0),
            median_or_dash(&mut own_r, 2),
            median_or_dash(&mut faiss_r, 2)
        ));
    }
    lines
}

/// Prints the median table for each k and target to stderr.
pub fn print_summary(report: &BenchReport) {
    for k in report.ks() {
        for &t in &TARGETS {
            eprintln!("\nrecall@{k} >= {t}:\n{MEDIAN_HEADER}");
            for line in median_table(report, k, t) {
                eprintln!("{line}");
            }
        }
    }
    eprintln!("\n{}", report.bracket_line().replace("**", ""));
    for x in report.unbracketed() {
        eprintln!(
            "  not bracketed: {} {} {} {} k={} L{} h{} at {} ({:?})",
            x.implementation,
            x.index,
            x.variant,
            x.queries,
            x.k,
            x.layer,
            x.head,
            x.target,
            x.bracket
        );
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
        samples: v.len(),
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
    if let Some(b) = p.beam {
        m.insert("beam".into(), b.into());
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

/// `field` as one CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a
/// quote or a line break (index variants such as `causal=true,queries-per-key=1.25` do).
fn csv_field(field: &str) -> std::borrow::Cow<'_, str> {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\"")).into()
    } else {
        field.into()
    }
}

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn csv_fields_with_commas_or_quotes_are_quoted() {
        assert_eq!(csv_field("attention"), "attention");
        assert_eq!(csv_field(""), "");
        assert_eq!(
            csv_field("causal=true,queries-per-key=1.25"),
            "\"causal=true,queries-per-key=1.25\""
        );
        assert_eq!(csv_field("a\"b"), "\"a\"\"b\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }
}

#[cfg(test)]
mod bracket_tests {
    use super::*;

    fn row(index: &str, head: usize, ef: usize, recall: f64, scanned: f64) -> Row {
        Row {
            index: index.into(),
            variant: String::new(),
            implementation: "qkindex".into(),
            k: 100,
            layer: 9,
            head,
            queries: "q2k".into(),
            params: serde_json::json!({ "ef": ef }),
            recall,
            scanned: Some(scanned),
            distance_computations: None,
            code_estimates: None,
            qps: 1000.0,
            latency_us: Latency::default(),
            build_s: serde_json::Value::Null,
            bytes_per_key: None,
            mass_ratio: None,
            output_cosine: None,
        }
    }

    fn bracket(r: &BenchReport, index: &str, head: usize, target: f64) -> Bracket {
        r.summary
            .iter()
            .find(|s| s.index == index && s.head == head && s.target == target)
            .map(|s| s.bracket)
            .expect("a summary")
    }

    #[test]
    fn the_report_flags_heads_whose_sweep_does_not_bracket_the_target() {
        let rows = vec![
            // Head 0: the cheapest setting already reaches 0.95 (its figure is the floor), and
            // nothing reaches 0.99.
            row("attention", 0, 100, 0.97, 0.08),
            row("attention", 0, 200, 0.98, 0.12),
            // Head 1: below and above every target.
            row("attention", 1, 50, 0.85, 0.04),
            row("attention", 1, 100, 0.96, 0.07),
            row("attention", 1, 200, 0.995, 0.11),
            // The exact scan: one setting, nothing to bracket.
            row("flat", 0, 0, 1.0, 1.0),
        ];
        let r = BenchReport::new(Path::new("dump"), 100, "wall", rows, 1.0);
        assert_eq!(bracket(&r, "attention", 0, 0.90), Bracket::Floor);
        assert_eq!(bracket(&r, "attention", 0, 0.95), Bracket::Floor);
        assert_eq!(bracket(&r, "attention", 0, 0.99), Bracket::Ceiling);
        for t in TARGETS {
            assert_eq!(bracket(&r, "attention", 1, t), Bracket::Yes);
            assert_eq!(bracket(&r, "flat", 0, t), Bracket::Single);
        }
        assert_eq!(r.unbracketed().count(), 3);
        assert!(r
            .unbracketed()
            .all(|s| s.head == 0 && s.index == "attention"));
        assert!(r.bracket_line().contains("3 of 6"), "{}", r.bracket_line());

        let md = r.markdown(&[], Path::new("."));
        // The count in each target's median table, the per-head flag, the list.
        assert!(
            md.contains("| qkindex | attention |  | q2k | 2/2 | **1** | 0.0750 |"),
            "{md}"
        );
        assert!(
            md.contains("| qkindex | attention |  | q2k | 1/2 | **1** | 0.1100 |"),
            "{md}"
        );
        assert!(md.contains("| qkindex | flat |  | q2k | 1/1 | 0 |"), "{md}");
        assert!(
            md.contains("| 9 | 0 | q2k | **NO: floor** | 0.0800 |"),
            "{md}"
        );
        assert!(md.contains("| 9 | 1 | q2k | yes | 0.0700 |"), "{md}");
        assert!(
            md.contains(
                "| qkindex | attention |  | q2k | 100 | 0.95 | 9 | 0 | floor | 0.9700 – 0.9800 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| qkindex | attention |  | q2k | 100 | 0.99 | 9 | 0 | ceiling |"),
            "{md}"
        );
    }

    #[test]
    fn a_bracketing_sweep_is_not_flagged() {
        let rows = vec![
            row("attention", 0, 60, 0.80, 0.05),
            row("attention", 0, 100, 0.97, 0.08),
            row("attention", 0, 300, 0.992, 0.2),
        ];
        let r = BenchReport::new(Path::new("dump"), 100, "wall", rows, 1.0);
        assert_eq!(r.unbracketed().count(), 0);
        let md = r.markdown(&[], Path::new("."));
        assert!(md.contains("None: every head's sweep"), "{md}");
        assert!(!md.contains("**NO"), "{md}");
        assert!(
            md.contains("| qkindex | attention |  | q2k | 1/1 | 0 | 0.0800 |"),
            "{md}"
        );
    }
}
