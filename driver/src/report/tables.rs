//! The report's forms: `bench.csv`, `report.md` (median, quality and per-head tables, the
//! unbracketed list) and the summary printed to stderr.

use super::summary::{SeriesKey, Summary};
use super::{median, BenchReport, Bracket, Row, TARGETS};
use qkindex::SearchParams;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

impl BenchReport {
    /// `bench.csv`: one line per row.
    pub(super) fn csv(&self) -> String {
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

    /// `report.md`: the median, quality and per-head tables, and the plots in `dir`.
    pub(super) fn markdown(&self, plots: &[std::path::PathBuf], dir: &Path) -> String {
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
