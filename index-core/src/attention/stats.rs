//! The figures a build reports ([`BuildStats`]) and those of its held-out checks ([`FarCheck`],
//! [`PruneCheck`], [`AutoEf`]): plain values, the lowest floor of `attention/`, so that the index
//! type can hold them and the checks can fill them without either naming the other's code.

use super::pool_knn::PooledKnn;
use crate::graph::Prune;

/// What a build did, and the wall time of each phase in seconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BuildStats {
    pub train_queries: usize,
    pub kq: usize,
    pub knn_s: f64,
    pub projection_s: f64,
    pub connectivity_s: f64,
    pub total_s: f64,
    /// Keys the connectivity pass had to link in.
    pub linked_unreachable: usize,
    /// Keys in no training query's top-`kq` list: they get no query-side edges, only sequence,
    /// reverse and connectivity ones.
    pub unlisted_keys: usize,
    /// Causal lists replaced by full ones ([`AttentionParams::global_full`]).
    pub unmasked_lists: usize,
    /// The prune check's figures when it ran ([`AttentionParams::prune_check`]); the phase
    /// times are those of the graph kept, `total_s` covers both graphs and the check.
    pub prune_check: Option<PruneCheck>,
    /// The far check's figures when it ran ([`AttentionParams::far_check`]); the other phase
    /// times are those of the graph kept, `total_s` covers both builds and the check.
    pub far_check: Option<FarCheck>,
    /// The `ef` calibration's figures when it ran ([`AttentionParams::auto_ef`]; in
    /// `total_s`).
    pub auto_ef: Option<AutoEf>,
    /// The pooled kNN's figures when it ran ([`AttentionParams::knn_pool`]; in `knn_s`).
    pub pooled_knn: Option<PooledKnn>,
    /// The structure check's figures when it ran ([`AttentionParams::scan_check`]; in
    /// `total_s`): with `scan_wins`, [`crate::IndexSpec::build`] returns the int8 scan instead.
    pub scan_check: Option<ScanCheck>,
    pub edges: usize,
    /// Name of the kNN backend used.
    pub knn_backend: String,
}

/// What the check measured and which lists the build kept.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct FarCheck {
    /// Share of the training queries whose causal lists looked far back (the trigger).
    pub far_share: f64,
    /// Check queries, and the query heads they came from.
    pub queries: usize,
    pub heads: usize,
    /// Scanned fraction the worst head needs for recall@100 0.95 on the check queries, in the
    /// graph of causal lists and in that of full lists (infinite: not reached).
    pub causal_scanned: f64,
    pub full_scanned: f64,
    /// True when the full-list graph was kept.
    pub kept_full: bool,
    /// Seconds of the second build and the check.
    pub seconds: f64,
}

impl std::fmt::Display for FarCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "far check ({:.1} % of lists unmasked, {} queries of {} heads, {:.1} s): the worst \
             head needs {:.4} of the keys with causal lists, {:.4} with full ones; kept {}",
            100.0 * self.far_share,
            self.queries,
            self.heads,
            self.seconds,
            self.causal_scanned,
            self.full_scanned,
            if self.kept_full { "full" } else { "causal" }
        )
    }
}

/// What the prune check measured and which rule the build kept.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PruneCheck {
    /// The rule asked for (`prune`) and the one checked beside it (`prune_check`).
    pub asked: Prune,
    pub other: Prune,
    /// Check queries, and the query heads they came from.
    pub queries: usize,
    pub heads: usize,
    /// Scanned fraction the worst head needs for recall@100 0.95 on the check queries in each
    /// graph (infinite: not reached).
    pub asked_scanned: f64,
    pub other_scanned: f64,
    /// True when the graph of the other rule was kept.
    pub kept_other: bool,
    /// Seconds of the second graph and the check.
    pub seconds: f64,
}

impl PruneCheck {
    /// The rule of the graph kept.
    pub fn kept(&self) -> Prune {
        if self.kept_other {
            self.other
        } else {
            self.asked
        }
    }
}

impl std::fmt::Display for PruneCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "prune check ({} queries of {} heads, {:.1} s): the worst head needs {:.4} of the \
             keys with {}, {:.4} with {}; kept {}",
            self.queries,
            self.heads,
            self.seconds,
            self.asked_scanned,
            self.asked,
            self.other_scanned,
            self.other,
            self.kept()
        )
    }
}

/// What the calibration measured and the `default_ef` it set.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct AutoEf {
    /// Mean recall@100 asked of every head.
    pub target: f64,
    /// Check queries, and the query heads they came from.
    pub queries: usize,
    pub heads: usize,
    /// The `ef` the worst head needed (the first swept `ef` at which its mean recall reached
    /// the target; with `reached` false, the largest `ef` swept).
    pub needed: usize,
    /// Whether every head reached the target.
    pub reached: bool,
    /// The worst head's mean recall at the `default_ef` given, and at the one set.
    pub recall_before: f64,
    pub recall_after: f64,
    /// `default_ef` before and after (the larger of the given one and `needed`).
    pub ef_before: usize,
    pub ef_after: usize,
    /// Per query head (pooled order), the `ef` its searches take when they name their head
    /// (the larger of the given `default_ef` and what the head needed); empty with one head,
    /// or when a head had no check rows.
    pub head_ef: Vec<usize>,
    /// Seconds of the check (truth and sweep).
    pub seconds: f64,
}

impl std::fmt::Display for AutoEf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "auto ef ({} queries of {} heads, {:.1} s): recall@100 {} needs ef {}{}; default ef \
             {} -> {} (worst head's recall {:.4} -> {:.4})",
            self.queries,
            self.heads,
            self.seconds,
            self.target,
            self.needed,
            if self.reached { "" } else { " (not reached)" },
            self.ef_before,
            self.ef_after,
            self.recall_before,
            self.recall_after
        )?;
        if !self.head_ef.is_empty() {
            let efs: Vec<String> = self.head_ef.iter().map(usize::to_string).collect();
            write!(f, "; per query head {}", efs.join("/"))?;
        }
        Ok(())
    }
}

/// What the structure check measured: the graph and the int8 scan timed on the same held-out
/// queries, and which one the build keeps.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ScanCheck {
    /// Check queries.
    pub queries: usize,
    /// Median microseconds per query of the graph (each head at its `ef`) and of the scan.
    pub graph_us: f64,
    pub scan_us: f64,
    /// Their recall@100 against the exact top-100 of every key.
    pub graph_recall: f64,
    pub scan_recall: f64,
    /// Per query head of the group (pooled order): microseconds per query of each structure
    /// (median round) and their recall@100.
    pub head_graph_us: Vec<f64>,
    pub head_scan_us: Vec<f64>,
    pub head_graph_recall: Vec<f64>,
    pub head_scan_recall: Vec<f64>,
    /// Per query head, true where it searches the scan: every head when `scan_wins`, else
    /// those for which the scan is faster and reaches the calibration's recall target
    /// ([`crate::spec::scan_check::choose`]), which the kept graph routes to the scan.
    pub head_scan: Vec<bool>,
    /// True when the scan is faster over the group's check queries and reaches the target:
    /// the build keeps the scan alone.
    pub scan_wins: bool,
    /// Seconds of the check.
    pub seconds: f64,
}

impl ScanCheck {
    /// Query heads the check gave the scan (all of them when `scan_wins`).
    pub fn scan_heads(&self) -> usize {
        self.head_scan.iter().filter(|&&s| s).count()
    }
}

impl std::fmt::Display for ScanCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "scan check ({} queries, {:.1} s): graph {:.1} µs/query at recall {:.4}, \
             int8 scan {:.1} µs/query at recall {:.4}; ",
            self.queries,
            self.seconds,
            self.graph_us,
            self.graph_recall,
            self.scan_us,
            self.scan_recall,
        )?;
        let routed = self.scan_heads();
        match (self.scan_wins, routed) {
            (true, _) => write!(f, "kept the scan"),
            (false, 0) => write!(f, "kept the graph"),
            (false, r) => {
                let per_head: Vec<String> = (self.head_graph_us.iter().zip(&self.head_scan_us))
                    .map(|(g, s)| format!("{g:.0}/{s:.0}"))
                    .collect();
                write!(
                    f,
                    "kept the graph, {r} of {} query heads routed to the scan (graph/scan \
                     µs per head {})",
                    self.head_scan.len(),
                    per_head.join(" ")
                )
            }
        }
    }
}
