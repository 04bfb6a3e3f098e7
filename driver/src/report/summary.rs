//! Per head and recall target: the best-QPS and the fewest-scanned settings reaching it, and
//! whether the head's sweep brackets the target ([`Bracket`]); medians and percentiles.

use super::{BenchReport, Latency, Row, TARGETS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    pub(super) fn cell(self) -> &'static str {
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
pub(super) type SeriesKey = (String, String, String, String);

impl Summary {
    pub(super) fn series(&self) -> SeriesKey {
        (
            self.implementation.clone(),
            self.index.clone(),
            self.variant.clone(),
            self.queries.clone(),
        )
    }
}

impl BenchReport {
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
}

type GroupKey = (String, String, String, usize, usize, usize, String);

pub(super) fn summarize(rows: &[Row]) -> Vec<Summary> {
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

#[cfg(test)]
mod bracket_tests {
    use super::super::{BenchReport, Latency, Row};
    use super::*;
    use std::path::Path;

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
