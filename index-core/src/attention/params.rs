//! Build parameters of [`super::AttentionIndex`] and their presets.

use crate::codes::Codes;
use crate::error::{Error, Result};
use crate::graph::Prune;

/// How training-query neighbour lists become key–key candidate edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", tag = "rule")]
pub enum Projection {
    /// RoarGraph: each query's nearest key (its pivot) gets the query's other keys as
    /// candidates.
    Pivot,
    /// Every key of a query's list gets the keys ranked within `window` places of it as
    /// candidates, weighted by how many queries agree.
    Rank { window: usize },
}

/// Where searches start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryRule {
    /// The key nearest (L2) to the mean key: the RoarGraph reference's choice.
    L2Medoid,
    /// The keys that appear in the most training-query top-`kq` lists.
    Hub,
    /// The keys that appear in the most top-`kq` lists of the last `queries` training queries
    /// (put a head's own prefill queries last: decode queries continue where they stop, so
    /// their top-k starts near what the latest prefill queries chose).
    RecentHub { queries: usize },
}

/// What the bipartite kNN of the build runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainOn {
    /// The training queries given to the build: the query-aware graph.
    #[default]
    Queries,
    /// The keys themselves, as queries: the key–key graph (the `key-graph` spec), which needs
    /// no queries.
    Keys,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

impl TrainOn {
    fn is_queries(&self) -> bool {
        *self == TrainOn::Queries
    }
}

/// Build parameters of the query-aware graph.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionParams {
    /// Exact top-`kq` keys per training query.
    pub kq: usize,
    /// Out-degree bound.
    pub max_degree: usize,
    pub projection: Projection,
    pub prune: Prune,
    pub entry: EntryRule,
    /// Number of entry points chosen by `entry`.
    pub entry_count: usize,
    /// Also enter at the `recent_entries` last keys (ids are token positions; decode queries
    /// attend heavily to the most recent tokens).
    pub recent_entries: usize,
    /// Link each key to the keys `1..=sequence_edges` positions before and after it (these
    /// edges count towards `max_degree`; attention is local in token position).
    pub sequence_edges: usize,
    /// Result list size of the searches the connectivity pass runs.
    pub build_ef: usize,
    /// `ef` of searches that do not set one (raised to `k` when smaller).
    pub default_ef: usize,
    /// Each training query's top-`kq` comes only from the keys it could attend to: keys
    /// `0..=i` for query `i`, or the counts the build is given per query
    /// ([`crate::AttentionIndex::build_visible`]: a GQA group's pooled queries, keys after the
    /// sinks). Thinning (`queries_per_key`) needs those counts.
    pub causal: bool,
    /// What the kNN runs on (not written to files when it is the queries, so files of
    /// query-trained graphs stay as they were).
    #[serde(default, skip_serializing_if = "TrainOn::is_queries")]
    pub train_on: TrainOn,
    /// At most `queries_per_key · n` training queries enter the kNN, evenly strided over the
    /// rows given (0: all of them). The kNN costs queries × keys and the projection grows with
    /// the queries, so a ratio keeps the build linear in the queries it reads per key; a GQA
    /// group's pooled queries (head-major) are thinned across its heads alike (issue 27).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub queries_per_key: f64,
    /// With `causal`: a training query whose causal top-`kq` looks far back (it sees more than
    /// 1,024 keys and less than this share of its list lies among the last 1,024 of them) gets
    /// its top-`kq` over every key instead (0: off). A causal list ties each key only to the
    /// queries after it, which suits queries that attend near their position; a query that
    /// wants keys from the whole context (Gemma 3 layer 5 head 1 at 32K) also needs the keys
    /// past its position that it would want, because decode queries see them (issue 27).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub global_full: f64,
    /// With `global_full`: when at least this share of the training queries had their causal
    /// lists unmasked (a KV group that reads from the whole context), the build also makes the
    /// graph of full lists (the same queries, no mask) and keeps the one whose worst query head
    /// scans fewer keys for recall@100 0.95 on held-out recent prefill queries (0: off). Such
    /// a group then costs two builds; the others one (issue 27).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub far_check: f64,
    /// 0: off. Otherwise the build measures the `ef` at which every query head's mean
    /// recall@100 on held-out recent prefill queries (those of the far check) reaches this
    /// share, against the exact top-100 of the keys each saw, and raises `default_ef` to it: the
    /// beam a graph needs grows with its keys, so a fixed default that serves 8K keys loses keys
    /// at 32K ([`super::AutoEf`]; issue 23).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub auto_ef: f64,
    /// Candidates per key that the pruning reads, best-weighted first (0: all of them). The
    /// occlusion rule compares each candidate with every kept edge, so an uncapped list makes
    /// the projection cost grow with the queries per key (issue 27).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prune_candidates: usize,
    /// 0: the exact top-`kq` of each training query ([`crate::KnnBackend`]). Otherwise its
    /// best keys among those of its `knn_probe` nearest lists of a coarse IVF over the keys
    /// (`round(4·√n)` lists; the centroid search still goes through the backend): about
    /// `√n` inner products per query instead of `n` (issue 27).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub knn_probe: usize,
    /// 0: off. Otherwise each training query's top-`kq` is searched (`ef = knn_graph`) in an
    /// index built from an evenly strided quarter of the queries, itself built the same way,
    /// down to a level of at most 8,192 queries whose lists are exact: the kNN reads the graph
    /// built so far instead of every key (issue 27). Below `512 · knn_graph` keys, where a
    /// search costs more than an exact scan, the kNN stays exact. Not with `causal` or
    /// `knn_probe`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub knn_graph: usize,
    /// 0: off. Otherwise the training queries are clustered (spherical k-means,
    /// `round(4·√m)` clusters), each cluster's pool is the exact top-`knn_pool` keys of its
    /// mean query, and each query's top-`kq` is taken from its cluster's pool: matrix products
    /// of `m·knn_pool + √m·n` inner products instead of `m·n` (issue 27). While the pools would
    /// hold a quarter of the keys or more, the kNN stays exact. At least `kq`; not with
    /// `causal`, `knn_probe` or `knn_graph`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub knn_pool: usize,
    /// Codes the search traverses on ([`Codes`]; derived from the keys at build and load, not
    /// stored; absent from files without codes).
    #[serde(default, skip_serializing_if = "Codes::is_none")]
    pub codes: Codes,
    /// Candidates re-ranked on the stored keys after a traversal on codes (at least `k`; 0: the
    /// whole list of `ef`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rerank: usize,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

impl Default for AttentionParams {
    fn default() -> Self {
        AttentionParams {
            kq: 100,
            max_degree: 32,
            projection: Projection::Rank { window: 8 },
            // Measured on the real dump: passkey 13/15 (top: 12/15), the same scanned fraction
            // at recall 0.95 and less at 0.99 (docs/BENCHMARKS.md §4c, docs/DECODING.md §5b).
            prune: Prune::OcclusionFill,
            entry: EntryRule::Hub,
            entry_count: 1,
            recent_entries: 1,
            sequence_edges: 1,
            build_ef: 200,
            default_ef: 128,
            causal: false,
            train_on: TrainOn::Queries,
            queries_per_key: 0.0,
            global_full: 0.0,
            far_check: 0.0,
            auto_ef: 0.0,
            prune_candidates: 0,
            knn_probe: 0,
            knn_graph: 0,
            knn_pool: 0,
            codes: Codes::None,
            rerank: 0,
        }
    }
}

impl AttentionParams {
    /// The published RoarGraph recipe (kq = 100, M = 35, L = 500, L2-medoid entry), measured
    /// beside ours as the `roargraph-recipe` variant.
    pub fn roargraph_recipe() -> Self {
        AttentionParams {
            max_degree: 35,
            projection: Projection::Pivot,
            prune: Prune::Occlusion,
            entry: EntryRule::L2Medoid,
            recent_entries: 0,
            sequence_edges: 0,
            build_ef: 500,
            ..Self::default()
        }
    }

    /// The key–key graph: the defaults built with the keys as training queries (measured
    /// beside ours as the `key-graph` variant; needs no queries).
    pub fn key_graph() -> Self {
        AttentionParams {
            train_on: TrainOn::Keys,
            ..AttentionParams::default()
        }
    }

    /// Checks ranges that do not depend on the data.
    pub fn validate(&self) -> Result<()> {
        if self.kq == 0 {
            return Err(Error::invalid_param("kq", self.kq, "must be at least 1"));
        }
        if self.codes == Codes::I4 {
            return Err(Error::invalid_param(
                "codes",
                self.codes.name(),
                "4-bit codes are for the scans (flat, ivf); a walk takes none, i8 or i8-inline",
            ));
        }
        if self.max_degree == 0 {
            return Err(Error::invalid_param(
                "max_degree",
                self.max_degree,
                "must be at least 1",
            ));
        }
        if self.entry_count == 0 {
            return Err(Error::invalid_param(
                "entry_count",
                self.entry_count,
                "must be at least 1",
            ));
        }
        if self.build_ef == 0 {
            return Err(Error::invalid_param(
                "build_ef",
                self.build_ef,
                "must be at least 1",
            ));
        }
        if !(self.queries_per_key.is_finite() && self.queries_per_key >= 0.0) {
            return Err(Error::invalid_param(
                "queries_per_key",
                self.queries_per_key,
                "must be a finite number at least 0 (0: all training queries)",
            ));
        }
        if !(self.global_full.is_finite() && (0.0..=1.0).contains(&self.global_full)) {
            return Err(Error::invalid_param(
                "global_full",
                self.global_full,
                "must be a share from 0 to 1 (0: off)",
            ));
        }
        if self.global_full > 0.0 && !self.causal {
            return Err(Error::invalid_param(
                "global_full",
                self.global_full,
                "unmasks some causal lists (without causal every list is full already)",
            ));
        }
        if !(self.far_check.is_finite() && (0.0..=1.0).contains(&self.far_check)) {
            return Err(Error::invalid_param(
                "far_check",
                self.far_check,
                "must be a share from 0 to 1 (0: off)",
            ));
        }
        if self.far_check > 0.0 && self.global_full <= 0.0 {
            return Err(Error::invalid_param(
                "far_check",
                self.far_check,
                "is triggered by the lists global_full unmasks (set causal and global_full)",
            ));
        }
        if !(self.auto_ef.is_finite() && (0.0..=1.0).contains(&self.auto_ef)) {
            return Err(Error::invalid_param(
                "auto_ef",
                self.auto_ef,
                "must be a recall from 0 to 1 (0: off)",
            ));
        }
        if self.causal && self.knn_probe > 0 {
            return Err(Error::invalid_param(
                "knn_probe",
                self.knn_probe,
                "the coarse kNN has no causal mode (use the exact kNN with causal)",
            ));
        }
        if self.knn_graph > 0 && self.causal {
            return Err(Error::invalid_param(
                "knn_graph",
                self.knn_graph,
                "the graph kNN has no causal mode (use the exact kNN with causal)",
            ));
        }
        if self.knn_graph > 0 && self.knn_probe > 0 {
            return Err(Error::invalid_param(
                "knn_graph",
                self.knn_graph,
                "choose one approximate kNN: knn_graph or knn_probe",
            ));
        }
        if self.knn_pool > 0 {
            if self.causal {
                return Err(Error::invalid_param(
                    "knn_pool",
                    self.knn_pool,
                    "the pooled kNN has no causal mode (use the exact kNN with causal)",
                ));
            }
            if self.knn_graph > 0 || self.knn_probe > 0 {
                return Err(Error::invalid_param(
                    "knn_pool",
                    self.knn_pool,
                    "choose one approximate kNN: knn_pool, knn_graph or knn_probe",
                ));
            }
            if self.knn_pool < self.kq {
                return Err(Error::invalid_param(
                    "knn_pool",
                    self.knn_pool,
                    format!(
                        "must be at least kq = {} (each list comes from a pool)",
                        self.kq
                    ),
                ));
            }
        }
        if let Projection::Rank { window: 0 } = self.projection {
            return Err(Error::invalid_param("window", 0, "must be at least 1"));
        }
        Ok(())
    }
}
