//! The index kinds `qkindex bench` can build, and the parameter sweep each is measured over.
//!
//! Adding a kind: a name in [`KNOWN`] (and in [`ALL`] if `--kinds all` should run it), and an
//! arm in [`build`] (or [`build_baseline`]) that returns the index with its build times and
//! sweep. `qkindex build` builds the baseline kinds through [`build_baseline`] too, so a bundle
//! holds exactly what the bench measures.

use super::BenchArgs;
use anyhow::{bail, Result};
use clap::Args;
use qkindex::attention::{EntryRule, Projection};
use qkindex::io::AnyIndex;
use qkindex::ivf::Assignment;
use qkindex::{
    AttentionIndex, AttentionParams, FlatIndex, HnswIndex, HnswParams, IvfIndex, IvfParams,
    KeyStore, KnnBackend, SearchParams, VamanaIndex, VamanaParams,
};
use std::sync::Arc;
use std::time::Instant;

/// Every kind name `--kinds` accepts.
pub const KNOWN: &[&str] = &[
    "attention",
    "roargraph-recipe",
    "key-graph",
    "hnsw",
    "hnsw-ip",
    "flat",
    "ivf",
    "ivf-ip",
    "vamana",
    "robust-vamana",
];

/// The kinds `--kinds all` runs.
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

/// Build parameters of the baseline kinds (flags shared by `qkindex bench` and `qkindex build`).
#[derive(Clone, Debug, Args, serde::Serialize)]
pub struct BaselineArgs {
    /// IvfIndex: number of lists (0: round(4·√n)).
    #[arg(long, default_value_t = 0)]
    pub nlist: usize,
    /// VamanaIndex: out-degree bound R.
    #[arg(long, default_value_t = 64)]
    pub vamana_r: usize,
    /// VamanaIndex: build list size L.
    #[arg(long, default_value_t = 100)]
    pub vamana_l: usize,
    /// VamanaIndex: pruning factor α of the second pass.
    #[arg(long, default_value_t = 1.2)]
    pub alpha: f32,
    /// RobustVamana: nearest keys per training query stitched together (T).
    #[arg(long, default_value_t = 16)]
    pub stitch_t: usize,
    /// RobustVamana: degree slots held back from the Vamana passes for stitched edges.
    #[arg(long, default_value_t = 0)]
    pub stitch_reserve: usize,
    /// HnswIndex (hnsw, hnsw-ip): links per key and level (`M`; 2M at level 0).
    #[arg(long, default_value_t = 16)]
    pub hnsw_m: usize,
    /// HnswIndex (hnsw, hnsw-ip): candidate list size of insertions.
    #[arg(long, default_value_t = 200)]
    pub ef_construction: usize,
}

/// What one (layer, query head) provides to the builders.
pub struct HeadInput<'a> {
    pub keys: &'a Arc<KeyStore>,
    /// The same keys as f32, row-major.
    pub keys_f32: &'a [f32],
    /// Training queries (row-major f32).
    pub train: &'a [f32],
    pub layer: usize,
    pub head: usize,
}

/// A built index, how to label its rows, and the settings to measure it at.
pub struct Built {
    /// The index (an [`AnyIndex`], so that `qkindex build` can write it).
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
    /// `--nprobe` values up to `nlist` (larger ones scan every list, as `nlist` does), or
    /// `nlist` alone when every value is larger.
    Nprobe { nlist: usize },
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
}

/// Expands `all` and checks every name.
pub fn expand(kinds: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for k in kinds {
        if k == "all" {
            out.extend(ALL.iter().map(|s| s.to_string()));
        } else if KNOWN.contains(&k.as_str()) {
            out.push(k.clone());
        } else {
            bail!(
                "unknown index kind {k:?} (known: all, {})",
                KNOWN.join(", ")
            );
        }
    }
    Ok(out)
}

/// Builds `kind` for one head.
pub fn build(
    kind: &str,
    input: &HeadInput<'_>,
    args: &BenchArgs,
    knn: &dyn KnnBackend,
) -> Result<Built> {
    let (layer, h) = (input.layer, input.head);
    match kind {
        "flat" => Ok(Built {
            index: AnyIndex::Flat(FlatIndex::new(input.keys.clone())),
            index_name: "flat".into(),
            variant: String::new(),
            build_s: serde_json::json!({"total": 0.0}),
            sweep: Sweep::Single,
        }),
        "attention" | "roargraph-recipe" | "key-graph" => {
            let params = attention_params(kind, args);
            let (train_q, source) = if kind == "key-graph" {
                (input.keys_f32, "keys")
            } else {
                (input.train, "queries")
            };
            let t = Instant::now();
            let spinner = build_spinner(&format!(
                "building {kind} for layer {layer} head {h} ({} keys)",
                input.keys.len()
            ));
            let idx = AttentionIndex::build(input.keys.clone(), train_q, &params, knn);
            spinner.finish_and_clear();
            let idx = idx?;
            let s = idx.build_stats();
            eprintln!(
                "layer {layer} head {h} {kind}: built from {} {source} in {:.2}s (knn {:.2}s, projection {:.2}s, connectivity {:.2}s; {} keys linked)",
                s.train_queries, t.elapsed().as_secs_f64(), s.knn_s, s.projection_s, s.connectivity_s, s.linked_unreachable
            );
            let build_s = serde_json::json!({"total": s.total_s, "knn": s.knn_s, "projection": s.projection_s, "connectivity": s.connectivity_s});
            Ok(Built {
                index: AnyIndex::Attention(idx),
                index_name: "attention".into(),
                variant: if kind == "attention" {
                    String::new()
                } else {
                    kind.to_string()
                },
                build_s,
                sweep: Sweep::Ef,
            })
        }
        other => build_baseline(other, input, &args.baseline, args.seed, knn),
    }
}

/// Builds a baseline kind (hnsw, hnsw-ip, ivf, ivf-ip, vamana, robust-vamana) for one head; `input.train` is read by
/// `robust-vamana` only.
pub fn build_baseline(
    kind: &str,
    input: &HeadInput<'_>,
    args: &BaselineArgs,
    seed: u64,
    knn: &dyn KnnBackend,
) -> Result<Built> {
    let (layer, h) = (input.layer, input.head);
    match kind {
        "ivf" | "ivf-ip" => {
            // `ivf` is faiss IVF-Flat IP's recipe (spherical centroids); `ivf-ip` keeps plain
            // mean centroids.
            let params = IvfParams {
                nlist: (args.nlist > 0).then_some(args.nlist),
                seed,
                assignment: if kind == "ivf-ip" {
                    Assignment::InnerProduct
                } else {
                    Assignment::Spherical
                },
                ..IvfParams::default()
            };
            let spinner = build_spinner(&format!(
                "building {kind} for layer {layer} head {h} ({} keys)",
                input.keys.len()
            ));
            let idx = IvfIndex::build(input.keys, &params);
            spinner.finish_and_clear();
            let idx = idx?;
            let s = idx.build_stats();
            eprintln!(
                "layer {layer} head {h} {kind}: nlist {} trained on {} keys in {:.2}s (k-means {:.2}s, assign {:.2}s; lists {}..{}, imbalance {:.2}, {} re-seeded; {:.1} bytes/key)",
                s.nlist, s.train_keys, s.total_s, s.kmeans_s, s.assign_s, s.min_list, s.max_list, s.imbalance, s.reseeded, idx.bytes_per_key()
            );
            let build_s =
                serde_json::json!({"total": s.total_s, "kmeans": s.kmeans_s, "assign": s.assign_s});
            let sweep = Sweep::Nprobe { nlist: idx.nlist() };
            Ok(Built {
                index: AnyIndex::Ivf(idx),
                index_name: "ivf".into(),
                variant: if kind == "ivf-ip" {
                    "ip".into()
                } else {
                    String::new()
                },
                build_s,
                sweep,
            })
        }
        "vamana" | "robust-vamana" => {
            let robust = kind == "robust-vamana";
            let params = VamanaParams {
                r: args.vamana_r,
                l: args.vamana_l,
                alpha: args.alpha,
                robust,
                stitch_t: args.stitch_t,
                stitch_reserve: if robust { args.stitch_reserve } else { 0 },
                seed,
                ..VamanaParams::default()
            };
            let spinner = build_spinner(&format!(
                "building {kind} for layer {layer} head {h} ({} keys)",
                input.keys.len()
            ));
            let train = robust.then_some(input.train);
            let idx = VamanaIndex::build(input.keys.clone(), train, &params, knn);
            spinner.finish_and_clear();
            let idx = idx?;
            let s = idx.build_stats();
            eprintln!(
                "layer {layer} head {h} {kind}: built in {:.2}s (pass 1 {:.2}s, pass 2 {:.2}s, knn {:.2}s, stitch {:.2}s from {} queries: {} edges; connectivity {:.2}s, {} keys linked; {} edges, max degree {})",
                s.total_s, s.pass1_s, s.pass2_s, s.knn_s, s.stitch_s, s.train_queries, s.stitched_edges, s.connectivity_s, s.linked_unreachable, s.edges, idx.graph().max_degree()
            );
            let build_s = serde_json::json!({"total": s.total_s, "pass1": s.pass1_s, "pass2": s.pass2_s, "knn": s.knn_s, "stitch": s.stitch_s, "connectivity": s.connectivity_s});
            Ok(Built {
                index: AnyIndex::Vamana(idx),
                index_name: "vamana".into(),
                variant: if robust {
                    "robust".into()
                } else {
                    String::new()
                },
                build_s,
                sweep: Sweep::Ef,
            })
        }
        "hnsw" | "hnsw-ip" => {
            let params = HnswParams {
                m: args.hnsw_m,
                ef_construction: args.ef_construction,
                l2_reduction: kind == "hnsw",
                ..HnswParams::default()
            };
            let spinner = build_spinner(&format!(
                "building {kind} for layer {layer} head {h} ({} keys)",
                input.keys.len()
            ));
            let idx = HnswIndex::build(input.keys.clone(), &params);
            spinner.finish_and_clear();
            let idx = idx?;
            let s = idx.build_stats();
            eprintln!(
                "layer {layer} head {h} {kind}: built in {:.2}s (M {}, ef_construction {}; max level {}, {} level-0 edges, {} keys stranded, {} unreachable at level 0)",
                s.total_s, params.m, params.ef_construction, s.max_level, s.edges_level0, s.stranded, s.unreachable
            );
            let build_s = serde_json::json!({"total": s.total_s, "prepare": s.prepare_s, "insert": s.insert_s, "finalize": s.finalize_s});
            Ok(Built {
                index: AnyIndex::Hnsw(idx),
                index_name: "hnsw".into(),
                variant: if kind == "hnsw" {
                    String::new()
                } else {
                    "ip".into()
                },
                build_s,
                sweep: Sweep::Ef,
            })
        }
        other => bail!("unknown index kind {other:?}"),
    }
}

fn attention_params(kind: &str, args: &BenchArgs) -> AttentionParams {
    if kind == "roargraph-recipe" {
        return AttentionParams::roargraph_recipe();
    }
    AttentionParams {
        kq: args.kq,
        max_degree: args.max_degree,
        projection: Projection::Rank {
            window: args.window,
        },
        prune: args.prune.into(),
        entry: if args.recent_queries > 0 {
            EntryRule::RecentHub {
                queries: args.recent_queries,
            }
        } else {
            EntryRule::Hub
        },
        entry_count: args.entry_count,
        recent_entries: args.recent_entries,
        sequence_edges: args.sequence_edges,
        ..AttentionParams::default()
    }
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
