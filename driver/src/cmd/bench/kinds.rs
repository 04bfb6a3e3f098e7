//! The index kinds `qkindex bench` builds — [`IndexSpec`]s, from `--kinds` — and the parameter
//! sweep each is measured over.
//!
//! `--kinds` takes spec strings (`attention`, `attention:prune=top`, `hnsw-ip:m=32`, ...) and
//! `all` ([`ALL`]). Rows are labelled by the spec's kind (`index`) and [`IndexSpec::variant`]
//! (`variant`: `""` for a kind's defaults, `ip`, `robust`, `roargraph-recipe`, the parameters
//! that differ, ...).

use super::BenchArgs;
use anyhow::{bail, Result};
use qkindex::io::AnyIndex;
use qkindex::{Cancel, IndexKind, IndexSpec, KeyStore, KnnBackend, SearchParams};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The specs `--kinds all` runs.
pub const ALL: &[&str] = &[
    "attention",
    "roargraph-recipe",
    "hnsw",
    "hnsw-ip",
    "flat",
    "ivf",
    "vamana",
    "robust-vamana",
];

/// What one (layer, query head) provides to the builders.
pub struct HeadInput<'a> {
    pub keys: &'a Arc<KeyStore>,
    /// Training queries (row-major f32).
    pub train: &'a [f32],
    /// Keys each training query could attend to (read by causal builds).
    pub visible: &'a [u32],
    pub layer: usize,
    pub head: usize,
}

/// A built index, how to label its rows, and the settings to measure it at.
pub struct Built {
    /// The index (an [`AnyIndex`], so that the build cache can write it).
    pub index: AnyIndex,
    /// The `index` field of its rows (`attention`, `flat`, ...).
    pub index_name: String,
    /// The `variant` field of its rows (empty for a kind's default).
    pub variant: String,
    /// Build phases in seconds (`total` at least).
    pub build_s: serde_json::Value,
    pub sweep: Sweep,
}

/// The search settings a kind is measured at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// One setting (the exact scan).
    Single,
    /// `--ef` (given for k = 100, scaled by k / 100 for other k); values below k run as
    /// `ef = k` with that beam width ([`SearchParams::beam`]).
    Ef,
    /// `--ef` values of at least k (scaled as for `Ef`) as the candidates a scan on codes
    /// re-ranks (`flat:codes=i8`).
    Rerank,
    /// `--nprobe` values up to `nlist` (larger ones scan every list, as `nlist` does), or
    /// `nlist` alone when every value is larger.
    Nprobe { nlist: usize },
    /// Every `Nprobe` value with every `Rerank` value (IVF lists scanned on codes: how many
    /// lists, and how many candidates re-ranked).
    NprobeRerank { nlist: usize },
}

impl Sweep {
    /// The settings at `k`.
    pub fn params(self, args: &BenchArgs, k: usize) -> Vec<SearchParams> {
        match self {
            Sweep::Single => vec![SearchParams::default()],
            Sweep::Ef => {
                let mut efs: Vec<usize> = args
                    .ef
                    .iter()
                    .map(|&ef| if k == 100 { ef } else { ef * k / 100 })
                    .filter(|&ef| ef >= 1)
                    .collect();
                if efs.is_empty() {
                    efs.push(k);
                }
                efs.sort_unstable();
                efs.dedup();
                efs.into_iter()
                    .map(|ef| {
                        if ef >= k {
                            SearchParams::with_ef(ef)
                        } else {
                            SearchParams {
                                ef: Some(k),
                                beam: Some(ef),
                                ..Default::default()
                            }
                        }
                    })
                    .collect()
            }
            Sweep::Rerank => {
                let mut efs: Vec<usize> = Sweep::Ef
                    .params(args, k)
                    .iter()
                    .filter_map(|p| p.ef.filter(|_| p.beam.is_none()))
                    .collect();
                if efs.is_empty() {
                    efs.push(k);
                }
                efs.into_iter().map(SearchParams::with_ef).collect()
            }
            Sweep::NprobeRerank { nlist } => {
                let reranks = Sweep::Rerank.params(args, k);
                Sweep::Nprobe { nlist }
                    .params(args, k)
                    .into_iter()
                    .flat_map(|p| reranks.iter().map(move |r| SearchParams { ef: r.ef, ..p }))
                    .collect()
            }
            Sweep::Nprobe { nlist } => {
                let mut sweep: Vec<SearchParams> = args
                    .nprobe
                    .iter()
                    .filter(|&&p| p <= nlist)
                    .map(|&p| SearchParams::with_nprobe(p))
                    .collect();
                if sweep.is_empty() {
                    sweep.push(SearchParams::with_nprobe(nlist));
                }
                sweep
            }
        }
    }

    /// Settings to measure next so that a head's sweep brackets every target: when its
    /// cheapest setting already reaches the lowest target, one cheaper setting; when its
    /// costliest misses the highest, one costlier. Empty when the measured settings (with their
    /// mean recalls) bracket every target, or when the kind's limits stop the sweep: beam width
    /// 1, `nprobe` 1 and the re-rank's `k` candidates below; `ef` and candidates at `n` keys,
    /// `nprobe` at `nlist` above. Steps are about 20 % of the setting, as in the default grid.
    pub fn extend(
        self,
        measured: &[(SearchParams, f64)],
        targets: &[f64],
        k: usize,
        n: usize,
    ) -> Vec<SearchParams> {
        let (Some(lo), Some(hi)) = (
            targets.iter().copied().reduce(f64::min),
            targets.iter().copied().reduce(f64::max),
        ) else {
            return Vec::new();
        };
        if measured.is_empty() {
            return Vec::new();
        }
        let min_recall = measured.iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
        let max_recall = measured
            .iter()
            .map(|m| m.1)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut out = Vec::new();
        let order = |p: &SearchParams| self.cost(p);
        if min_recall >= lo {
            let cheapest = measured.iter().map(|m| &m.0).min_by_key(|p| order(p));
            if let Some(p) = cheapest.and_then(|p| self.step(p, false, k, n)) {
                out.push(p);
            }
        }
        if max_recall < hi {
            let costliest = measured.iter().map(|m| &m.0).max_by_key(|p| order(p));
            if let Some(p) = costliest.and_then(|p| self.step(p, true, k, n)) {
                out.push(p);
            }
        }
        out.retain(|p| !measured.iter().any(|m| m.0 == *p));
        out
    }

    /// A setting's place in the sweep's order, cheapest first: (lists probed, width) where
    /// the width is the beam width below `ef = k` and `ef` otherwise.
    fn cost(self, p: &SearchParams) -> (usize, usize) {
        let width = p.beam.or(p.ef).unwrap_or(0);
        match self {
            Sweep::Nprobe { .. } => (p.nprobe.unwrap_or(0), 0),
            Sweep::NprobeRerank { .. } => (p.nprobe.unwrap_or(0), p.ef.unwrap_or(0)),
            _ => (0, width),
        }
    }

    /// The next setting beyond `p` (costlier when `up`), or none at the kind's limit.
    fn step(self, p: &SearchParams, up: bool, k: usize, n: usize) -> Option<SearchParams> {
        // About 20 % per step, and at least one.
        let next = |v: usize, floor: usize, ceil: usize| -> Option<usize> {
            let v2 = if up {
                (v + 1).max(v * 5 / 4).min(ceil)
            } else {
                v.saturating_sub(1).min(v * 4 / 5).max(floor)
            };
            (v2 != v && (floor..=ceil).contains(&v2)).then_some(v2)
        };
        match self {
            Sweep::Single => None,
            Sweep::Ef => {
                let width = next(p.beam.or(p.ef)?, 1, n.max(k))?;
                Some(if width >= k {
                    SearchParams::with_ef(width)
                } else {
                    SearchParams {
                        ef: Some(k),
                        beam: Some(width),
                        ..Default::default()
                    }
                })
            }
            Sweep::Rerank => Some(SearchParams::with_ef(next(p.ef?, k, n.max(k))?)),
            Sweep::Nprobe { nlist } => {
                Some(SearchParams::with_nprobe(next(p.nprobe?, 1, nlist.max(1))?))
            }
            Sweep::NprobeRerank { nlist } => {
                // Lists first (the larger part of the cost), then candidates.
                match next(p.nprobe?, 1, nlist.max(1)) {
                    Some(nprobe) => Some(SearchParams {
                        nprobe: Some(nprobe),
                        ..*p
                    }),
                    None => Some(SearchParams {
                        ef: Some(next(p.ef?, k, n.max(k))?),
                        ..*p
                    }),
                }
            }
        }
    }

    /// The sweep of an index kind.
    fn of(index: &AnyIndex) -> Self {
        match index {
            AnyIndex::Flat(f) if f.params().codes.is_none() => Sweep::Single,
            AnyIndex::Flat(_) => Sweep::Rerank,
            AnyIndex::Ivf(i) if i.params().codes.is_none() => Sweep::Nprobe { nlist: i.nlist() },
            AnyIndex::Ivf(i) => Sweep::NprobeRerank { nlist: i.nlist() },
            _ => Sweep::Ef,
        }
    }
}

/// The specs of `--kinds` values: each value is a comma-separated list of specs and `all`,
/// where a `key=value` item continues the spec before it (`attention:kq=100,degree=32,hnsw`
/// is two specs).
pub fn expand(kinds: &[String]) -> Result<Vec<IndexSpec>> {
    let mut names: Vec<String> = Vec::new();
    for item in kinds.iter().flat_map(|k| k.split(',')) {
        let item = item.trim();
        let continues = item
            .split_once('=')
            .is_some_and(|(key, _)| !key.contains(':'));
        match names.last_mut() {
            Some(last) if continues => {
                last.push(',');
                last.push_str(item);
            }
            _ => names.push(item.to_string()),
        }
    }
    let mut out = Vec::new();
    for name in names {
        if name == "all" {
            out.extend(
                ALL.iter()
                    .map(|s| s.parse())
                    .collect::<qkindex::Result<Vec<_>>>()?,
            );
            continue;
        }
        match name.parse::<IndexSpec>() {
            Ok(spec) => out.push(spec),
            Err(e) => bail!("--kinds {name:?}: {e} (or all: {})", ALL.join(", ")),
        }
    }
    Ok(out)
}

/// Builds `spec` for one head.
pub fn build(spec: &IndexSpec, input: &HeadInput<'_>, knn: &dyn KnnBackend) -> Result<Built> {
    let (layer, h) = (input.layer, input.head);
    let t = Instant::now();
    let spinner = (spec.kind() != IndexKind::Flat).then(|| {
        build_spinner(&format!(
            "building {spec} for layer {layer} head {h} ({} keys)",
            input.keys.len()
        ))
    });
    let (keys, visible) = (input.keys.clone(), Some(input.visible));
    let built = spec.build_visible(keys, input.train, visible, knn, &Cancel::new());
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let built = built?;
    if let Some(line) = describe(&built.index, t.elapsed()) {
        eprintln!("layer {layer} head {h} {spec}: {line}");
    }
    let build_s = serde_json::Value::Object(
        built
            .phases
            .iter()
            .map(|&(phase, s)| (phase.to_string(), serde_json::json!(s)))
            .collect(),
    );
    Ok(Built {
        sweep: Sweep::of(&built.index),
        index: built.index,
        index_name: spec.kind().name().into(),
        variant: spec.variant(),
        build_s,
    })
}

/// What a build did, for the log (`elapsed`: the build's wall time as the caller saw it).
fn describe(index: &AnyIndex, elapsed: Duration) -> Option<String> {
    let line = match index {
        AnyIndex::Attention(idx) => {
            let s = idx.build_stats();
            let source = match idx.params().train_on {
                qkindex::attention::TrainOn::Keys => "keys",
                qkindex::attention::TrainOn::Queries => "queries",
            };
            let unmasked = match s.unmasked_lists {
                0 => String::new(),
                u => format!(", {u} causal lists unmasked"),
            };
            let far = match &s.prune_check {
                None => String::new(),
                Some(p) => format!("; {p}"),
            };
            let far = match &s.far_check {
                None => far,
                Some(f) => format!("{far}; {f}"),
            };
            let far = match &s.auto_ef {
                None => far,
                Some(e) => format!("{far}; {e}"),
            };
            let far = match &s.pooled_knn {
                None => far,
                Some(p) => format!("{far}; {p}"),
            };
            let far = match &s.scan_check {
                None => far,
                Some(c) => format!("{far}; {c}"),
            };
            format!(
                "built from {} {source} in {:.2}s (knn {:.2}s, projection {:.2}s, connectivity {:.2}s; {} keys in no list, {} linked{unmasked}{far})",
                s.train_queries, elapsed.as_secs_f64(), s.knn_s, s.projection_s, s.connectivity_s, s.unlisted_keys, s.linked_unreachable
            )
        }
        AnyIndex::Ivf(idx) => {
            let s = idx.build_stats();
            format!(
                "nlist {} trained on {} keys in {:.2}s (k-means {:.2}s, assign {:.2}s; lists {}..{}, imbalance {:.2}, {} re-seeded; {:.1} bytes/key)",
                s.nlist, s.train_keys, s.total_s, s.kmeans_s, s.assign_s, s.min_list, s.max_list, s.imbalance, s.reseeded, idx.bytes_per_key()
            )
        }
        AnyIndex::Vamana(idx) => {
            let s = idx.build_stats();
            format!(
                "built in {:.2}s (pass 1 {:.2}s, pass 2 {:.2}s, knn {:.2}s, stitch {:.2}s from {} queries: {} edges; connectivity {:.2}s, {} keys linked; {} edges, max degree {})",
                s.total_s, s.pass1_s, s.pass2_s, s.knn_s, s.stitch_s, s.train_queries, s.stitched_edges, s.connectivity_s, s.linked_unreachable, s.edges, idx.graph().max_degree()
            )
        }
        AnyIndex::Hnsw(idx) => {
            let (s, p) = (idx.build_stats(), idx.params());
            format!(
                "built in {:.2}s (M {}, ef_construction {}; max level {}, {} level-0 edges, {} keys stranded, {} unreachable at level 0)",
                s.total_s, p.m, p.ef_construction, s.max_level, s.edges_level0, s.stranded, s.unreachable
            )
        }
        _ => return None,
    };
    Some(line)
}

/// A spinner with elapsed time for builds (drawn only when stderr is a terminal; builds of large
/// heads take minutes).
pub fn build_spinner(message: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
        bar.set_style(style);
    }
    bar.set_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(kinds: &[&str]) -> Vec<String> {
        let kinds: Vec<String> = kinds.iter().map(|s| s.to_string()).collect();
        expand(&kinds)
            .expect("valid kinds")
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn kinds_are_specs_and_key_items_continue_the_spec_before_them() {
        assert_eq!(names(&["all"]), ALL);
        assert_eq!(
            names(&["attention:kq=200,degree=48,hnsw-ip:m=32,ivf", "flat"]),
            ["attention:kq=200,degree=48", "hnsw-ip:m=32", "ivf", "flat"]
        );
        assert_eq!(names(&["key-graph,vamana"]), ["key-graph", "vamana"]);
        let bad = expand(&["attention,nope".to_string()]).expect_err("unknown kind");
        assert!(bad.to_string().contains("nope"), "{bad}");
        assert!(expand(&["attention:degree=0".to_string()]).is_err());
    }
}

#[cfg(test)]
mod bracket_tests {
    use super::*;
    use crate::report::{Bracket, TARGETS};

    /// Runs a grid and its extensions against a recall curve of the setting; the settings
    /// measured and their recalls.
    fn sweep(
        sweep: Sweep,
        grid: Vec<SearchParams>,
        k: usize,
        n: usize,
        recall: impl Fn(&SearchParams) -> f64,
    ) -> Vec<(SearchParams, f64)> {
        let mut measured: Vec<(SearchParams, f64)> =
            grid.into_iter().map(|p| (p, recall(&p))).collect();
        for _ in 0..100 {
            let next = sweep.extend(&measured, &TARGETS, k, n);
            if next.is_empty() {
                return measured;
            }
            measured.extend(next.into_iter().map(|p| (p, recall(&p))));
        }
        panic!("the sweep did not stop: {measured:?}");
    }

    fn brackets(measured: &[(SearchParams, f64)]) -> Vec<Bracket> {
        let recalls: Vec<f64> = measured.iter().map(|m| m.1).collect();
        TARGETS
            .iter()
            .map(|&t| Bracket::of(&recalls, measured.len(), t))
            .collect()
    }

    /// A graph whose recall grows with the beam or list width `w`: 1 − 8 / w.
    fn graph_recall(p: &SearchParams) -> f64 {
        let w = p.beam.or(p.ef).unwrap_or(1) as f64;
        (1.0 - 8.0 / w).max(0.0)
    }

    #[test]
    fn an_ef_grid_is_extended_down_and_up_until_it_brackets() {
        // CI's grid: 128 and 256 both reach 0.90 and neither reaches 0.99 (w = 2000 does).
        let grid = vec![SearchParams::with_ef(128), SearchParams::with_ef(256)];
        let m = sweep(Sweep::Ef, grid, 100, 8000, graph_recall);
        assert_eq!(brackets(&m), [Bracket::Yes; 3], "{m:?}");
        // Below ef = k the width is a beam with a list of k.
        assert!(m
            .iter()
            .any(|(p, r)| p.ef == Some(100) && p.beam.is_some_and(|b| b < 100) && *r < 0.90));
        assert!(m
            .iter()
            .any(|(p, r)| p.ef.is_some_and(|e| e > 256) && *r >= 0.99));
        // A bracketing grid gets nothing.
        let beam50 = SearchParams {
            ef: Some(100),
            beam: Some(50),
            ..Default::default()
        };
        let grid = [beam50, SearchParams::with_ef(4000)];
        assert!(Sweep::Ef
            .extend(
                &grid
                    .iter()
                    .map(|p| (*p, graph_recall(p)))
                    .collect::<Vec<_>>(),
                &TARGETS,
                100,
                8000
            )
            .is_empty());
    }

    #[test]
    fn the_kinds_limits_stop_a_sweep_that_cannot_bracket() {
        // Recall 1 everywhere: down to beam 1, then stop (flagged as the floor).
        let m = sweep(
            Sweep::Ef,
            vec![SearchParams::with_ef(64)],
            100,
            8000,
            |_| 1.0,
        );
        assert!(m.iter().any(|(p, _)| p.beam == Some(1)), "{m:?}");
        assert_eq!(brackets(&m), [Bracket::Floor; 3]);
        // Never above 0.5: up to ef = n, then stop.
        let m = sweep(
            Sweep::Ef,
            vec![SearchParams::with_ef(64)],
            100,
            3000,
            |_| 0.5,
        );
        assert!(m.iter().any(|(p, _)| p.ef == Some(3000)), "{m:?}");
        assert!(m.iter().all(|(p, _)| p.ef.is_some_and(|e| e <= 3000)));
        assert_eq!(brackets(&m), [Bracket::Ceiling; 3]);
        // IVF: nprobe within 1..=nlist.
        let m = sweep(
            Sweep::Nprobe { nlist: 40 },
            vec![SearchParams::with_nprobe(8)],
            100,
            8000,
            |p| p.nprobe.map_or(0.0, |np| np as f64 / 40.0),
        );
        assert_eq!(brackets(&m), [Bracket::Yes; 3], "{m:?}");
        assert!(m.iter().any(|(p, _)| p.nprobe == Some(40)));
        // Codes: candidates never below k.
        let m = sweep(
            Sweep::Rerank,
            vec![SearchParams::with_ef(200)],
            100,
            8000,
            |_| 0.999,
        );
        assert!(
            m.iter().all(|(p, _)| p.ef.is_some_and(|e| e >= 100)),
            "{m:?}"
        );
        assert!(m.iter().any(|(p, _)| p.ef == Some(100)));
        assert_eq!(brackets(&m), [Bracket::Floor; 3]);
    }
}
