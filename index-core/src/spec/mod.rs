//! [`IndexSpec`]: one string names an index kind with its build parameters, as faiss's
//! `index_factory` does — `"attention"`, `"attention:kq=100,degree=32,prune=occlusion-fill"`,
//! `"ivf:nlist=361"`, `"hnsw-ip:m=16"` — and builds it.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`IndexSpec`], its presets, [`IndexSpec::build`] |
//! | `keys.rs` | the `key=value` parameters of each kind: parsing, printing, their errors |
//! | `scan_check.rs` | the decode default's structure check: the calibrated graph or an int8 scan, timed on its held-out queries |
//!
//! ```text
//!  "hnsw-ip:m=32" ──FromStr──► IndexSpec::Hnsw(HnswParams { m: 32, l2_reduction: false, .. })
//!        ▲                          │
//!        └──────── Display ─────────┤ build(keys, train_queries, &dyn KnnBackend)
//!                                   ▼
//!                          AnyIndex::Hnsw(HnswIndex) + per-phase build seconds
//! ```
//!
//! The name before `:` is a preset: a kind with the parameters it starts from (each kind's own
//! name is its defaults, the params' `Default`). Keys after it change single parameters; a key
//! a kind does not have, a bad value, or parameters out of range are an
//! [`Error::InvalidParam`] naming the key. [`Display`](std::fmt::Display) prints the canonical
//! form — the preset needing the fewest keys, then the keys that differ from it, in a fixed
//! order — which parses back to an equal spec. Serde reads and writes specs as that string.
//!
//! | preset | kind | parameters |
//! |---|---|---|
//! | `attention` | [`AttentionIndex`] | [`AttentionParams::default`] |
//! | `roargraph-recipe` | [`AttentionIndex`] | [`AttentionParams::roargraph_recipe`] |
//! | `key-graph` | [`AttentionIndex`] | [`AttentionParams::key_graph`] (keys as training queries) |
//! | `flat` | [`FlatIndex`] | [`FlatParams::default`] (the exact scan; `codes=i8`: a scan on codes) |
//! | `hnsw` / `hnsw-ip` | [`HnswIndex`] | [`HnswParams::default`] / [`HnswParams::inner_product`] |
//! | `ivf` / `ivf-ip` | [`IvfIndex`] | [`IvfParams::default`] / inner-product centroids |
//! | `vamana` / `robust-vamana` | [`VamanaIndex`] | [`VamanaParams::default`] / [`VamanaParams::robust`] |

pub mod any;
mod keys;
pub mod scan_check;

pub use any::AnyIndex;

use crate::attention::{AttentionIndex, AttentionParams, TrainOn};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::flat::{FlatIndex, FlatParams};
use crate::hnsw::{HnswIndex, HnswParams};
use crate::ivf::{Assignment, IvfIndex, IvfParams};
use crate::knn::KnnBackend;
use crate::search::IndexKind;
use crate::store::KeyStore;
use crate::vamana::{VamanaIndex, VamanaParams};
use std::sync::Arc;

/// An index kind and its build parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexSpec {
    Attention(AttentionParams),
    /// The scan: exact, or on int8 codes with an exact re-rank (`flat:codes=i8`).
    Flat(FlatParams),
    /// HNSW; `l2_reduction` tells `hnsw` from `hnsw-ip`.
    Hnsw(HnswParams),
    /// IVF-Flat; the assignment tells `ivf` (spherical) from `ivf-ip`.
    Ivf(IvfParams),
    /// Vamana; `robust` tells `vamana` from `robust-vamana`.
    Vamana(VamanaParams),
}

/// A named starting point of a spec.
struct Preset {
    name: &'static str,
    /// What tells it apart from the other presets of its kind in reports (`""` for the kind's
    /// defaults).
    variant: &'static str,
    make: fn() -> IndexSpec,
}

/// Every preset; the first of each kind is the kind's defaults, under the kind's own name.
const PRESETS: &[Preset] = &[
    Preset {
        name: IndexKind::Attention.name(),
        variant: "",
        make: || IndexSpec::Attention(AttentionParams::default()),
    },
    Preset {
        name: "roargraph-recipe",
        variant: "roargraph-recipe",
        make: || IndexSpec::Attention(AttentionParams::roargraph_recipe()),
    },
    Preset {
        name: "key-graph",
        variant: "key-graph",
        make: || IndexSpec::Attention(AttentionParams::key_graph()),
    },
    Preset {
        name: IndexKind::Flat.name(),
        variant: "",
        make: || IndexSpec::Flat(FlatParams::default()),
    },
    Preset {
        name: IndexKind::Hnsw.name(),
        variant: "",
        make: || IndexSpec::Hnsw(HnswParams::default()),
    },
    Preset {
        name: "hnsw-ip",
        variant: "ip",
        make: || IndexSpec::Hnsw(HnswParams::inner_product()),
    },
    Preset {
        name: IndexKind::Ivf.name(),
        variant: "",
        make: || IndexSpec::Ivf(IvfParams::default()),
    },
    Preset {
        name: "ivf-ip",
        variant: "ip",
        make: || {
            IndexSpec::Ivf(IvfParams {
                assignment: Assignment::InnerProduct,
                ..IvfParams::default()
            })
        },
    },
    Preset {
        name: IndexKind::Vamana.name(),
        variant: "",
        make: || IndexSpec::Vamana(VamanaParams::default()),
    },
    Preset {
        name: "robust-vamana",
        variant: "robust",
        make: || IndexSpec::Vamana(VamanaParams::robust()),
    },
];

/// The index `index-topk` decodes with unless told otherwise: the CLI's `--index`, the driver's
/// `PolicyConfig::new` and `qkindex.hf` all start from it ([`IndexSpec::decode_default`]).
/// Each index is built from its GQA group's prefill queries' causal top-k lists, 1.25 queries
/// per key, a query whose list lies mostly far back taking its full list (`global-full=0.1`),
/// a group where 4 % of the lists do so built both ways and the graph its held-out recent
/// queries need fewer keys in kept (`far-check=0.04`), searched at the `ef` those queries need
/// for recall@100 0.95 on every head (`auto-ef=0.95`). Past 32,768 keys the causal exact kNN
/// gives way to the pooled one (`pool-above=32768`, [`AttentionParams::pool_above`]): the exact
/// kNN's cost grows with the square of the context and the prefill's about linearly (the rule
/// and its measurements: docs/DECODING.md, "One default, chosen by length"). Each build then
/// times its graph against an int8 scan of the same keys on the held-out queries and keeps the
/// faster; a graph kept routes the query heads the scan serves better on their own to a scan
/// of the same keys (`scan-check=true`, [`AttentionParams::scan_check`]).
pub const DECODE_DEFAULT: &str = "attention:causal=true,queries-per-key=1.25,global-full=0.1,\
                                  far-check=0.04,auto-ef=0.95,pool-above=32768,scan-check=true";

/// A freshly built index and the wall time of its build phases.
#[derive(Clone, Debug)]
pub struct BuiltIndex {
    pub index: AnyIndex,
    /// `(phase, seconds)`, `total` first, then the phases of the kind's build stats (attention:
    /// knn, projection, connectivity; hnsw: prepare, insert, finalize; ivf: kmeans, assign;
    /// vamana: pass1, pass2, knn, stitch, connectivity; flat: none).
    pub phases: Vec<(&'static str, f64)>,
    /// The build figures of the graph an attention spec with `scan-check` built and then
    /// replaced by the int8 scan it measured faster (`flat:codes=i8` over the same keys, the
    /// `index`; [`crate::attention::BuildStats::scan_check`] says what was measured). `None`
    /// when `index` is what the spec names (a kept graph holds its own figures).
    pub replaced_graph: Option<crate::attention::BuildStats>,
}

impl IndexSpec {
    /// The decode default ([`DECODE_DEFAULT`]).
    pub fn decode_default() -> IndexSpec {
        IndexSpec::Attention(AttentionParams {
            causal: true,
            queries_per_key: 1.25,
            global_full: Some(0.1),
            far_check: Some(0.04),
            auto_ef: Some(0.95),
            pool_above: 32768,
            scan_check: true,
            ..AttentionParams::default()
        })
    }

    /// Every preset name, in the order of the table in the module docs.
    pub fn preset_names() -> impl Iterator<Item = &'static str> {
        PRESETS.iter().map(|p| p.name)
    }

    /// The preset `name` (`attention`, `hnsw-ip`, ...), if there is one.
    pub fn preset(name: &str) -> Option<IndexSpec> {
        PRESETS.iter().find(|p| p.name == name).map(|p| (p.make)())
    }

    /// The kind it builds.
    pub fn kind(&self) -> IndexKind {
        match self {
            IndexSpec::Attention(_) => IndexKind::Attention,
            IndexSpec::Flat(_) => IndexKind::Flat,
            IndexSpec::Hnsw(_) => IndexKind::Hnsw,
            IndexSpec::Ivf(_) => IndexKind::Ivf,
            IndexSpec::Vamana(_) => IndexKind::Vamana,
        }
    }

    /// The preset its canonical form starts from (`attention`, `roargraph-recipe`, `hnsw-ip`,
    /// ...): the part of [`Display`](std::fmt::Display) before `:`.
    pub fn name(&self) -> &'static str {
        PRESETS[self.canonical().0].name
    }

    /// What tells this spec apart from the others of its kind in reports: `""` for a kind's
    /// defaults, the preset's qualifier (`ip`, `robust`, `roargraph-recipe`, `key-graph`), and
    /// the parameters that differ from the preset (`ip:m=32`, `prune=top`).
    pub fn variant(&self) -> String {
        let (preset, keys) = self.canonical();
        let variant = PRESETS[preset].variant;
        match (variant.is_empty(), keys.is_empty()) {
            (_, true) => variant.to_string(),
            (true, false) => keys,
            (false, false) => format!("{variant}:{keys}"),
        }
    }

    /// True when the build reads training queries (the query-aware graph, RobustVamana).
    pub fn needs_queries(&self) -> bool {
        match self {
            IndexSpec::Attention(p) => p.train_on == TrainOn::Queries,
            IndexSpec::Vamana(p) => p.robust,
            IndexSpec::Flat(_) | IndexSpec::Hnsw(_) | IndexSpec::Ivf(_) => false,
        }
    }

    /// True for the kinds that take keys added after the build in place (attention: query-aware
    /// insertion; flat: an append).
    pub fn inserts(&self) -> bool {
        matches!(self, IndexSpec::Attention(_) | IndexSpec::Flat(_))
    }

    /// Builds the index over `keys`. `train_queries` (`m × dim` row-major f32) are read only
    /// when [`IndexSpec::needs_queries`]; `knn` computes the exact top-k of the kinds that need
    /// one. Data-dependent defaults (IVF's `nlist`, capped sizes) are resolved here.
    ///
    /// Errors: those of the kind's build (bad params, empty or non-finite input, a dimension
    /// mismatch, RobustVamana without training queries).
    pub fn build(
        &self,
        keys: Arc<KeyStore>,
        train_queries: &[f32],
        knn: &dyn KnnBackend,
    ) -> Result<AnyIndex> {
        Ok(self
            .build_with(keys, train_queries, knn, &Cancel::new())?
            .index)
    }

    /// [`IndexSpec::build`] that stops with [`Error::Cancelled`] once `cancel` is set, and also
    /// returns the seconds of each build phase.
    pub fn build_with(
        &self,
        keys: Arc<KeyStore>,
        train_queries: &[f32],
        knn: &dyn KnnBackend,
        cancel: &Cancel,
    ) -> Result<BuiltIndex> {
        self.build_visible(keys, train_queries, None, knn, cancel)
    }

    /// [`IndexSpec::build_with`] with the number of keys each training query could attend to
    /// (`visible`, one per query; see [`AttentionIndex::build_visible`]). Only a causal
    /// query-aware graph reads them; every other spec builds as without them.
    pub fn build_visible(
        &self,
        keys: Arc<KeyStore>,
        train_queries: &[f32],
        visible: Option<&[u32]>,
        knn: &dyn KnnBackend,
        cancel: &Cancel,
    ) -> Result<BuiltIndex> {
        let index: AnyIndex = match self {
            IndexSpec::Attention(p) => {
                let mut graph = match visible {
                    Some(v) => {
                        AttentionIndex::build_visible(keys, train_queries, v, p, knn, cancel)?
                    }
                    None => AttentionIndex::build_with(keys, train_queries, p, knn, cancel)?,
                };
                // The structure check: the calibrated graph against the int8 scan of its
                // keys, on the held-out queries of the calibration (`scan_check.rs`).
                let target = graph.build_stats().auto_ef.as_ref().and(p.auto_ef);
                if let (true, Some(target)) = (p.scan_check, target) {
                    let check =
                        scan_check::measure(&graph, train_queries, visible, target, cancel)?;
                    let (scan_wins, routes) = (check.scan_wins, check.head_scan.clone());
                    graph.record_scan_check(check);
                    if !scan_wins && routes.contains(&true) {
                        // Some query heads of the group scan, the others walk.
                        graph.route_heads_to_scan(routes);
                    } else if scan_wins {
                        // The phases are the graph's, whose build chose the scan.
                        let stats = graph.build_stats().clone();
                        let scan = FlatIndex::with_params(
                            graph.keys().clone(),
                            &scan_check::scan_params(),
                        )?;
                        return Ok(BuiltIndex {
                            phases: phases(&graph.into()),
                            index: scan.into(),
                            replaced_graph: Some(stats),
                        });
                    }
                }
                graph.into()
            }
            IndexSpec::Flat(p) => {
                cancel.check("FlatIndex build")?;
                FlatIndex::with_params(keys, p)?.into()
            }
            IndexSpec::Hnsw(p) => HnswIndex::build_with(keys, p, cancel)?.into(),
            IndexSpec::Ivf(p) => IvfIndex::build_with(&keys, p, cancel)?.into(),
            IndexSpec::Vamana(p) => {
                let train = p.robust.then_some(train_queries);
                VamanaIndex::build_with(keys, train, p, knn, cancel)?.into()
            }
        };
        let phases = phases(&index);
        Ok(BuiltIndex {
            index,
            phases,
            replaced_graph: None,
        })
    }

    /// The canonical preset (an index into [`PRESETS`]) and the keys that differ from it
    /// (`k=v,...`): of the presets of this kind that the keys can turn into this spec, the one
    /// needing the fewest keys (the first on a tie).
    fn canonical(&self) -> (usize, String) {
        let kind = self.kind();
        let mut best: Option<(usize, Vec<(&'static str, String)>)> = None;
        let mut first_of_kind = None;
        for (i, preset) in PRESETS.iter().enumerate() {
            let base = (preset.make)();
            if base.kind() != kind {
                continue;
            }
            first_of_kind.get_or_insert(i);
            let diff = keys::diff(&base, self);
            let reaches = keys::apply(base, &diff).is_ok_and(|spec| spec == *self);
            if reaches && best.as_ref().is_none_or(|b| diff.len() < b.1.len()) {
                best = Some((i, diff));
            }
        }
        // Every parameter outside the presets' own flags has a key, so a preset always reaches
        // the spec; the first of the kind is a total fallback all the same.
        let (preset, diff) = best.unwrap_or_else(|| {
            let i = first_of_kind.unwrap_or(0);
            (i, keys::diff(&(PRESETS[i].make)(), self))
        });
        let keys = diff
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        (preset, keys)
    }
}

/// The phases of [`BuiltIndex::phases`], from a fresh index's build stats.
fn phases(index: &AnyIndex) -> Vec<(&'static str, f64)> {
    match index {
        AnyIndex::Attention(a) => {
            let s = a.build_stats();
            vec![
                ("total", s.total_s),
                ("knn", s.knn_s),
                ("projection", s.projection_s),
                ("connectivity", s.connectivity_s),
            ]
        }
        AnyIndex::Hnsw(h) => {
            let s = h.build_stats();
            vec![
                ("total", s.total_s),
                ("prepare", s.prepare_s),
                ("insert", s.insert_s),
                ("finalize", s.finalize_s),
            ]
        }
        AnyIndex::Ivf(i) => {
            let s = i.build_stats();
            vec![
                ("total", s.total_s),
                ("kmeans", s.kmeans_s),
                ("assign", s.assign_s),
            ]
        }
        AnyIndex::Vamana(v) => {
            let s = v.build_stats();
            vec![
                ("total", s.total_s),
                ("pass1", s.pass1_s),
                ("pass2", s.pass2_s),
                ("knn", s.knn_s),
                ("stitch", s.stitch_s),
                ("connectivity", s.connectivity_s),
            ]
        }
        AnyIndex::Flat(_) => vec![("total", 0.0)],
    }
}

impl std::fmt::Display for IndexSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (preset, keys) = self.canonical();
        f.write_str(PRESETS[preset].name)?;
        if !keys.is_empty() {
            write!(f, ":{keys}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for IndexSpec {
    type Err = Error;

    /// `name[:key=value,...]` (see the module docs). Keys may be written with `_` for `-`.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (name, params) = match s.split_once(':') {
            Some((name, params)) => (name.trim(), Some(params)),
            None => (s, None),
        };
        let base = IndexSpec::preset(name).ok_or_else(|| {
            Error::invalid_param(
                "kind",
                name,
                format!(
                    "unknown index kind (known: {})",
                    IndexSpec::preset_names().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        match params {
            None => Ok(base),
            Some(params) => keys::parse(base, params),
        }
    }
}

impl serde::Serialize for IndexSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for IndexSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
