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

/// How the build finds each training query's top-`kq` keys (the bipartite kNN).
///
/// Files write it as the three fields it replaced (`knn_probe`, `knn_graph`, `knn_pool`, each
/// absent when not chosen), so files are byte-identical to those written before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "KnnFields", try_from = "KnnFields")]
pub enum TrainKnn {
    /// Each query's exact top-`kq` ([`crate::KnnBackend`]).
    #[default]
    Exact,
    /// Its best keys among those of its `lists` nearest lists of a coarse IVF over the keys
    /// (`round(4·√n)` lists; the centroid search still goes through the backend): about `√n`
    /// inner products per query instead of `n` (issue 27). Not with `causal`.
    Probe { lists: usize },
    /// Its top-`kq` searched (`ef`) in an index built from an evenly strided quarter of the
    /// queries, itself built the same way, down to a level of at most 8,192 queries whose lists
    /// are exact: the kNN reads the graph built so far instead of every key (issue 27). Below
    /// `512 · ef` keys, where a search costs more than an exact scan, the kNN stays exact. Not
    /// with `causal`.
    Graph { ef: usize },
    /// The training queries are clustered (spherical k-means, `round(4·√m)` clusters), each
    /// cluster's pool is the exact top-`size` keys of its mean query, and each query's
    /// top-`kq` is taken from its cluster's pool: matrix products of `m·size + √m·n` inner
    /// products instead of `m·n` (issue 27). While the pools would hold a quarter of the keys
    /// or more, the kNN stays exact. `size` at least `kq`; not with `causal`.
    Pool { size: usize },
}

impl TrainKnn {
    /// The params field (and spec key, with `-`) that chooses this strategy; `None` for the
    /// exact kNN.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            TrainKnn::Exact => None,
            TrainKnn::Probe { .. } => Some("knn_probe"),
            TrainKnn::Graph { .. } => Some("knn_graph"),
            TrainKnn::Pool { .. } => Some("knn_pool"),
        }
    }

    /// The strategy's one number (lists, `ef` or pool size); 0 for the exact kNN.
    pub fn size(&self) -> usize {
        match *self {
            TrainKnn::Exact => 0,
            TrainKnn::Probe { lists } => lists,
            TrainKnn::Graph { ef } => ef,
            TrainKnn::Pool { size } => size,
        }
    }

    /// The strategy a params field names with `size` (0: the exact kNN); `None` for a field
    /// that names none.
    pub fn from_field(field: &str, size: usize) -> Option<TrainKnn> {
        Some(match (field, size) {
            ("knn_probe" | "knn_graph" | "knn_pool", 0) => TrainKnn::Exact,
            ("knn_probe", lists) => TrainKnn::Probe { lists },
            ("knn_graph", ef) => TrainKnn::Graph { ef },
            ("knn_pool", size) => TrainKnn::Pool { size },
            _ => return None,
        })
    }
}

/// [`TrainKnn`] as files write it: one field per strategy, 0 (absent) when not chosen.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct KnnFields {
    #[serde(default, skip_serializing_if = "is_zero")]
    knn_probe: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    knn_graph: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    knn_pool: usize,
}

impl From<TrainKnn> for KnnFields {
    fn from(k: TrainKnn) -> Self {
        let mut f = KnnFields::default();
        match k {
            TrainKnn::Exact => {}
            TrainKnn::Probe { lists } => f.knn_probe = lists,
            TrainKnn::Graph { ef } => f.knn_graph = ef,
            TrainKnn::Pool { size } => f.knn_pool = size,
        }
        f
    }
}

impl TryFrom<KnnFields> for TrainKnn {
    type Error = String;

    fn try_from(f: KnnFields) -> std::result::Result<Self, String> {
        match (f.knn_probe, f.knn_graph, f.knn_pool) {
            (0, 0, 0) => Ok(TrainKnn::Exact),
            (lists, 0, 0) => Ok(TrainKnn::Probe { lists }),
            (0, ef, 0) => Ok(TrainKnn::Graph { ef }),
            (0, 0, size) => Ok(TrainKnn::Pool { size }),
            (p, g, s) => Err(format!(
                "more than one kNN strategy (knn_probe {p}, knn_graph {g}, knn_pool {s})"
            )),
        }
    }
}

/// A share or recall given as a number where 0 says off (spec strings, Python keywords): the
/// `Option` of [`AttentionParams::global_full`], `far_check` and `auto_ef`.
pub fn off_at_zero(x: f64) -> Option<f64> {
    (x != 0.0).then_some(x)
}

/// A share or recall that is off when absent: files never write the `None` (nor did they
/// write the 0 that meant off before the `Option`), and a 0 read is `None`.
fn share_or_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<f64>, D::Error> {
    let x: Option<f64> = serde::Deserialize::deserialize(d)?;
    Ok(x.and_then(off_at_zero))
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
    /// Per query head of the group (in the order the build pooled their queries), the `ef` of
    /// its searches that do not set one ([`crate::SearchParams::head`]); empty: `default_ef`
    /// for every head. `auto_ef` measures it, so that a head whose queries a short beam
    /// serves does not search at the group's worst head's `ef` (issue 44).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub head_ef: Vec<usize>,
    /// Per query head of the group (the order of `head_ef`), true where the head's searches
    /// scan the keys' int8 codes with an exact re-rank instead of walking the graph; empty or
    /// all false: every head walks. The scan check ([`AttentionParams::scan_check`]) sets it
    /// per head where the scan was faster for that head's queries: under GQA one far-looking
    /// query head can need a quarter of the keys from the graph while its group's other heads
    /// need 3 % (Qwen2.5 at 32K, docs/bench/qwen/README.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub head_scan: Vec<bool>,
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
    /// its top-`kq` over every key instead (`None`: off). A causal list ties each key only to the
    /// queries after it, which suits queries that attend near their position; a query that
    /// wants keys from the whole context (Gemma 3 layer 5 head 1 at 32K) also needs the keys
    /// past its position that it would want, because decode queries see them (issue 27).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "share_or_none"
    )]
    pub global_full: Option<f64>,
    /// With `global_full`: when at least this share of the training queries had their causal
    /// lists unmasked (a KV group that reads from the whole context), the build also makes the
    /// graph of full lists (the same queries, no mask) and keeps the one whose worst query head
    /// scans fewer keys for recall@100 0.95 on held-out recent prefill queries (`None`: off). Such
    /// a group then costs two builds; the others one (issue 27).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "share_or_none"
    )]
    pub far_check: Option<f64>,
    /// `None`: off. Otherwise the build measures the `ef` at which every query head's mean
    /// recall@100 on held-out recent prefill queries (those of the far check) reaches this
    /// share, against the exact top-100 of the keys each saw, and raises `default_ef` to it: the
    /// beam a graph needs grows with its keys, so a fixed default that serves 8K keys loses keys
    /// at 32K ([`super::AutoEf`]; issue 23).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "share_or_none"
    )]
    pub auto_ef: Option<f64>,
    /// `None`: off. Otherwise the build also makes the graph this rule prunes from the same
    /// training lists and keeps the one whose worst query head scans fewer keys for recall@100
    /// 0.95 on held-out recent prefill queries (those of the far check); the kept graph's
    /// rule becomes `prune` and the other this field ([`super::PruneCheck`]; issue 50). The kNN
    /// runs once; the projection and connectivity twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune_check: Option<Prune>,
    /// Candidates per key that the pruning reads, best-weighted first (0: all of them). The
    /// occlusion rule compares each candidate with every kept edge, so an uncapped list makes
    /// the projection cost grow with the queries per key (issue 27).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prune_candidates: usize,
    /// How each training query's top-`kq` is found ([`TrainKnn`]; written as the fields
    /// `knn_probe`, `knn_graph`, `knn_pool`, absent for the exact kNN).
    #[serde(flatten)]
    pub knn: TrainKnn,
    /// The kNN chosen by length (0: off). When the exact kNN is asked for and the index holds
    /// more than this many keys, the build takes the pooled kNN instead
    /// (`knn_pool` = [`LONG_POOL`](super::LONG_POOL), no causal mode: `causal`, `global_full` and `far_check`
    /// off), because the exact kNN's cost grows with keys × queries where the prefill's grows
    /// about linearly ([`AttentionParams::for_keys`], `by_length.rs`; the decode default's threshold and the
    /// measurements behind it: docs/DECODING.md, "One default, chosen by length"). The built
    /// index keeps the strategy it used.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pool_above: usize,
    /// With `auto_ef`: the build also times an int8 scan of the keys with an exact re-rank
    /// (`flat:codes=i8`) against the calibrated graph on the same held-out recent queries, and
    /// [`crate::IndexSpec::build`] returns the scan when it is faster at the calibration's
    /// recall ([`super::ScanCheck`]; the check weighs one kind against another, so it runs in
    /// the spec's build, a floor above the kinds: `AttentionIndex::build*` alone skip it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scan_check: bool,
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
            head_ef: Vec::new(),
            head_scan: Vec::new(),
            causal: false,
            train_on: TrainOn::Queries,
            queries_per_key: 0.0,
            global_full: None,
            far_check: None,
            auto_ef: None,
            prune_check: None,
            prune_candidates: 0,
            knn: TrainKnn::Exact,
            pool_above: 0,
            scan_check: false,
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
        let share = |field: &'static str, x: Option<f64>, what: &str| match x {
            Some(x) if !(x.is_finite() && x > 0.0 && x <= 1.0) => Err(Error::invalid_param(
                field,
                x,
                format!("must be {what} above 0 and at most 1 (absent: off)"),
            )),
            _ => Ok(()),
        };
        share("global_full", self.global_full, "a share")?;
        share("far_check", self.far_check, "a share")?;
        share("auto_ef", self.auto_ef, "a recall")?;
        if self.scan_check && self.auto_ef.is_none() {
            return Err(Error::invalid_param(
                "scan_check",
                true,
                "times the graph at the ef auto_ef measures (set auto_ef)",
            ));
        }
        if self.prune_check == Some(self.prune) {
            return Err(Error::invalid_param(
                "prune_check",
                self.prune,
                "names the rule prune already asks for (check another rule, or none)",
            ));
        }
        if let (Some(x), false) = (self.global_full, self.causal) {
            return Err(Error::invalid_param(
                "global_full",
                x,
                "unmasks some causal lists (without causal every list is full already)",
            ));
        }
        if let (Some(x), None) = (self.far_check, self.global_full) {
            return Err(Error::invalid_param(
                "far_check",
                x,
                "is triggered by the lists global_full unmasks (set causal and global_full)",
            ));
        }
        if let (Some(field), 0) = (self.knn.field(), self.knn.size()) {
            return Err(Error::invalid_param(
                field,
                0,
                "must be at least 1 (the exact kNN is TrainKnn::Exact)",
            ));
        }
        if let (Some(field), true) = (self.knn.field(), self.causal) {
            let what = match self.knn {
                TrainKnn::Probe { .. } => "coarse",
                TrainKnn::Graph { .. } => "graph",
                _ => "pooled",
            };
            return Err(Error::invalid_param(
                field,
                self.knn.size(),
                format!("the {what} kNN has no causal mode (use the exact kNN with causal)"),
            ));
        }
        if let TrainKnn::Pool { size } = self.knn {
            if size < self.kq {
                return Err(Error::invalid_param(
                    "knn_pool",
                    size,
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

#[cfg(test)]
mod tests {
    use super::{AttentionParams, TrainKnn};

    /// Files keep the fields the enum and the `Option`s replaced, in their places: a strategy
    /// is its one field, the exact kNN and `None` are absent, and a 0 read back is off.
    #[test]
    fn files_write_the_fields_the_enum_and_options_replaced() {
        let json = |p: &AttentionParams| serde_json::to_string(p).expect("json");
        let plain = json(&AttentionParams::default());
        for absent in [
            "knn_probe",
            "knn_graph",
            "knn_pool",
            "global_full",
            "far_check",
        ] {
            assert!(!plain.contains(absent), "{absent} in {plain}");
        }
        assert!(!plain.contains("auto_ef"), "{plain}");
        let pooled = AttentionParams {
            knn: TrainKnn::Pool { size: 200 },
            causal: true,
            global_full: Some(0.1),
            far_check: Some(0.04),
            auto_ef: Some(0.95),
            prune_candidates: 64,
            ..AttentionParams::default()
        };
        let text = json(&pooled);
        assert!(
            text.contains(
                r#""global_full":0.1,"far_check":0.04,"auto_ef":0.95,"prune_candidates":64,"knn_pool":200}"#
            ),
            "{text}"
        );
        let back: AttentionParams = serde_json::from_str(&text).expect("read");
        assert_eq!(back, pooled);
        for (field, knn) in [
            ("knn_probe", TrainKnn::Probe { lists: 8 }),
            ("knn_graph", TrainKnn::Graph { ef: 64 }),
            ("knn_pool", TrainKnn::Pool { size: 300 }),
        ] {
            let p = AttentionParams {
                knn,
                ..AttentionParams::default()
            };
            let text = json(&p);
            assert!(
                text.contains(&format!("\"{field}\":{}", knn.size())),
                "{text}"
            );
            assert_eq!(knn.field(), Some(field));
            assert_eq!(TrainKnn::from_field(field, knn.size()), Some(knn));
            assert_eq!(
                serde_json::from_str::<AttentionParams>(&text).expect("read"),
                p
            );
        }
        // Zeros written by hand read as off; two strategies are an error, not a choice.
        let zeros = plain.replace('}', r#","global_full":0.0,"knn_pool":0}"#);
        let read: AttentionParams = serde_json::from_str(&zeros).expect("zeros");
        assert_eq!(read, AttentionParams::default());
        let two = plain.replace('}', r#","knn_probe":8,"knn_pool":200}"#);
        let err = serde_json::from_str::<AttentionParams>(&two).expect_err("two strategies");
        assert!(
            err.to_string().contains("more than one kNN strategy"),
            "{err}"
        );
    }

    #[test]
    fn a_strategy_of_size_zero_or_with_causal_lists_is_refused() {
        for knn in [
            TrainKnn::Probe { lists: 0 },
            TrainKnn::Graph { ef: 0 },
            TrainKnn::Pool { size: 0 },
        ] {
            let p = AttentionParams {
                knn,
                ..AttentionParams::default()
            };
            assert!(p.validate().is_err(), "{knn:?}");
            let causal = AttentionParams {
                knn: TrainKnn::from_field(knn.field().expect("field"), 500).expect("knn"),
                causal: true,
                ..AttentionParams::default()
            };
            assert!(causal.validate().is_err(), "{causal:?}");
        }
        let p = AttentionParams {
            far_check: Some(0.1),
            ..AttentionParams::default()
        };
        assert!(p.validate().is_err(), "far_check without global_full");
    }
}
