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
            let far = match &s.far_check {
                None => String::new(),
                Some(f) => format!("; {f}"),
            };
            let far = match &s.auto_ef {
                None => far,
                Some(e) => format!("{far}; {e}"),
            };
            let far = match &s.pooled_knn {
                None => far,
                Some(p) => format!("{far}; {p}"),
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
