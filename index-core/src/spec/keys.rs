//! The `key=value` parameters of each kind: how a spec string sets them, how the canonical form
//! prints them, and the errors that name them.
//!
//! Each kind has a fixed list of keys ([`keys_of`]); keys are applied in that order whatever
//! order the string gives them in, so the result never depends on it. The flags that tell a
//! kind's presets apart (HNSW's reduction, IVF's assignment, Vamana's `robust`, what the
//! attention graph trains on) have no key: the preset name says them.

use super::IndexSpec;
use crate::attention::{
    off_at_zero, AttentionParams, Codes, EntryRule, Projection, Prune, TrainKnn,
};
use crate::error::{Error, Result};
use crate::hnsw::HnswParams;
use crate::ivf::IvfParams;
use crate::search::IndexKind;
use crate::vamana::VamanaParams;

/// One key: its name in spec strings and the params field whose validation errors it names.
struct Key {
    name: &'static str,
    field: &'static str,
}

const fn key(name: &'static str, field: &'static str) -> Key {
    Key { name, field }
}

const ATTENTION: &[Key] = &[
    key("kq", "kq"),
    key("degree", "max_degree"),
    key("projection", "projection"),
    key("window", "window"),
    key("prune", "prune"),
    key("entry", "entry"),
    key("recent-queries", "entry"),
    key("entry-count", "entry_count"),
    key("recent-entries", "recent_entries"),
    key("sequence-edges", "sequence_edges"),
    key("build-ef", "build_ef"),
    key("default-ef", "default_ef"),
    key("causal", "causal"),
    key("queries-per-key", "queries_per_key"),
    key("global-full", "global_full"),
    key("far-check", "far_check"),
    key("auto-ef", "auto_ef"),
    key("prune-check", "prune_check"),
    key("prune-cands", "prune_candidates"),
    key("knn-probe", "knn_probe"),
    key("knn-graph", "knn_graph"),
    key("knn-pool", "knn_pool"),
    key("pool-above", "pool_above"),
    key("scan-check", "scan_check"),
    key("codes", "codes"),
    key("rerank", "rerank"),
];

const FLAT: &[Key] = &[key("codes", "codes"), key("rerank", "rerank")];

const HNSW: &[Key] = &[
    key("m", "m"),
    key("ef-construction", "ef_construction"),
    key("keep-pruned", "keep_pruned"),
    key("seed", "seed"),
    key("default-ef", "default_ef"),
];

const IVF: &[Key] = &[
    key("nlist", "nlist"),
    key("iters", "iters"),
    key("max-train-per-list", "max_train_per_list"),
    key("seed", "seed"),
    key("default-nprobe", "default_nprobe"),
    key("codes", "codes"),
    key("rerank", "rerank"),
];

const VAMANA: &[Key] = &[
    key("r", "r"),
    key("l", "l"),
    key("alpha", "alpha"),
    key("stitch-t", "stitch_t"),
    key("stitch-reserve", "stitch_reserve"),
    key("seed", "seed"),
    key("max-batch-fraction", "max_batch_fraction"),
    key("default-ef", "default_ef"),
];

/// The keys of `kind`, in the order they are applied and printed.
fn keys_of(kind: IndexKind) -> &'static [Key] {
    match kind {
        IndexKind::Attention => ATTENTION,
        IndexKind::Flat => FLAT,
        IndexKind::Hnsw => HNSW,
        IndexKind::Ivf => IVF,
        IndexKind::Vamana => VAMANA,
    }
}

/// `params` (`key=value,...`) applied to the preset `base`, then validated.
pub(super) fn parse(base: IndexSpec, params: &str) -> Result<IndexSpec> {
    let keys = keys_of(base.kind());
    let names = || {
        let list: Vec<&str> = keys.iter().map(|k| k.name).collect();
        if list.is_empty() {
            format!("{} takes no parameters", base.kind().name())
        } else {
            format!("valid keys of {}: {}", base.kind().name(), list.join(", "))
        }
    };
    let mut given: Vec<(&'static str, &str)> = Vec::new();
    for item in params.split(',') {
        let item = item.trim();
        let Some((name, value)) = item.split_once('=') else {
            return Err(Error::invalid_param(
                "key",
                item,
                format!("expected key=value ({})", names()),
            ));
        };
        let name = name.trim().replace('_', "-");
        let Some(k) = keys.iter().find(|k| k.name == name) else {
            return Err(Error::invalid_param("key", name, names()));
        };
        if given.iter().any(|g| g.0 == k.name) {
            return Err(Error::invalid_param(k.name, value.trim(), "given twice"));
        }
        given.push((k.name, value.trim()));
    }
    if let IndexSpec::Attention(_) = base {
        let has = |k: &str| given.iter().any(|g| g.0 == k);
        if has("entry") && has("recent-queries") {
            return Err(Error::invalid_param(
                "recent-queries",
                "with entry",
                "recent-queries chooses the entry rule itself (the hubs of the last queries)",
            ));
        }
    }
    let ordered: Vec<(&'static str, &str)> = keys
        .iter()
        .filter_map(|k| given.iter().find(|g| g.0 == k.name).copied())
        .collect();
    let spec = apply(base, &ordered)?;
    validate(&spec).map_err(|e| rename(e, keys))?;
    Ok(spec)
}

/// The keys whose values differ between `base` and `spec` (same kind), in key order, with
/// `spec`'s values.
pub(super) fn diff(base: &IndexSpec, spec: &IndexSpec) -> Vec<(&'static str, String)> {
    keys_of(spec.kind())
        .iter()
        .filter_map(|k| {
            let value = get(spec, k.name)?;
            (get(base, k.name).as_ref() != Some(&value)).then_some((k.name, value))
        })
        .collect()
}

/// `base` with the keys set in the order given.
pub(super) fn apply<V: AsRef<str>>(
    mut base: IndexSpec,
    keys: &[(&'static str, V)],
) -> Result<IndexSpec> {
    for (name, value) in keys {
        set(&mut base, name, value.as_ref())?;
    }
    Ok(base)
}

fn validate(spec: &IndexSpec) -> Result<()> {
    match spec {
        IndexSpec::Attention(p) => p.validate(),
        IndexSpec::Flat(p) => p.validate(),
        IndexSpec::Hnsw(p) => p.validate(),
        IndexSpec::Ivf(p) => p.validate(),
        IndexSpec::Vamana(p) => p.validate(),
    }
}

/// A validation error named by the params field, renamed to the key that sets the field.
fn rename(e: Error, keys: &[Key]) -> Error {
    match e {
        Error::InvalidParam {
            name,
            value,
            reason,
        } => Error::InvalidParam {
            name: keys
                .iter()
                .find(|k| k.field == name)
                .map_or(name, |k| k.name),
            value,
            reason,
        },
        other => other,
    }
}

/// The value of key `name` in `spec`; `None` where the key does not apply (`window` of the
/// pivot projection, `entry` of the recent-hub rule, `recent-queries` of the others).
fn get(spec: &IndexSpec, name: &str) -> Option<String> {
    let value = match spec {
        IndexSpec::Attention(p) => match name {
            "kq" => p.kq.to_string(),
            "degree" => p.max_degree.to_string(),
            "projection" => match p.projection {
                Projection::Pivot => "pivot".into(),
                Projection::Rank { .. } => "rank".into(),
            },
            "window" => match p.projection {
                Projection::Rank { window } => window.to_string(),
                Projection::Pivot => return None,
            },
            "prune" => p.prune.to_string(),
            "entry" => match p.entry {
                EntryRule::Hub => "hub".into(),
                EntryRule::L2Medoid => "l2-medoid".into(),
                EntryRule::RecentHub { .. } => return None,
            },
            "recent-queries" => match p.entry {
                EntryRule::RecentHub { queries } => queries.to_string(),
                EntryRule::Hub | EntryRule::L2Medoid => return None,
            },
            "entry-count" => p.entry_count.to_string(),
            "recent-entries" => p.recent_entries.to_string(),
            "sequence-edges" => p.sequence_edges.to_string(),
            "build-ef" => p.build_ef.to_string(),
            "default-ef" => p.default_ef.to_string(),
            "causal" => p.causal.to_string(),
            "queries-per-key" => p.queries_per_key.to_string(),
            "global-full" => off_zero(p.global_full),
            "far-check" => off_zero(p.far_check),
            "auto-ef" => off_zero(p.auto_ef),
            "prune-check" => p
                .prune_check
                .map_or_else(|| "none".into(), |r| r.to_string()),
            "prune-cands" => p.prune_candidates.to_string(),
            "knn-probe" | "knn-graph" | "knn-pool" => match p.knn.field() {
                Some(f) if f.replace('_', "-") == name => p.knn.size().to_string(),
                _ => "0".into(),
            },
            "pool-above" => p.pool_above.to_string(),
            "scan-check" => p.scan_check.to_string(),
            "codes" => p.codes.name().into(),
            "rerank" => p.rerank.to_string(),
            _ => return None,
        },
        IndexSpec::Flat(p) => match name {
            "codes" => p.codes.name().into(),
            "rerank" => p.rerank.to_string(),
            _ => return None,
        },
        IndexSpec::Hnsw(p) => match name {
            "m" => p.m.to_string(),
            "ef-construction" => p.ef_construction.to_string(),
            "keep-pruned" => p.keep_pruned.to_string(),
            "seed" => p.seed.to_string(),
            "default-ef" => p.default_ef.to_string(),
            _ => return None,
        },
        IndexSpec::Ivf(p) => match name {
            "nlist" => p.nlist.map_or_else(|| "auto".into(), |n| n.to_string()),
            "iters" => p.iters.to_string(),
            "max-train-per-list" => p.max_train_per_list.to_string(),
            "seed" => p.seed.to_string(),
            "default-nprobe" => p.default_nprobe.to_string(),
            "codes" => p.codes.name().into(),
            "rerank" => p.rerank.to_string(),
            _ => return None,
        },
        IndexSpec::Vamana(p) => match name {
            "r" => p.r.to_string(),
            "l" => p.l.to_string(),
            "alpha" => p.alpha.to_string(),
            "stitch-t" => p.stitch_t.to_string(),
            "stitch-reserve" => p.stitch_reserve.to_string(),
            "seed" => p.seed.to_string(),
            "max-batch-fraction" => p.max_batch_fraction.to_string(),
            "default-ef" => p.default_ef.to_string(),
            _ => return None,
        },
    };
    Some(value)
}

/// Sets key `name` of `spec` from `value`.
fn set(spec: &mut IndexSpec, name: &'static str, value: &str) -> Result<()> {
    match spec {
        IndexSpec::Attention(p) => set_attention(p, name, value),
        IndexSpec::Flat(p) => {
            match name {
                "codes" => p.codes = value.parse::<Codes>()?,
                "rerank" => p.rerank = number(name, value)?,
                _ => return Err(unknown(name)),
            }
            Ok(())
        }
        IndexSpec::Hnsw(p) => set_hnsw(p, name, value),
        IndexSpec::Ivf(p) => set_ivf(p, name, value),
        IndexSpec::Vamana(p) => set_vamana(p, name, value),
    }
}

fn set_attention(p: &mut AttentionParams, name: &'static str, value: &str) -> Result<()> {
    match name {
        "kq" => p.kq = number(name, value)?,
        "degree" => p.max_degree = number(name, value)?,
        "projection" => {
            p.projection = match (value, p.projection) {
                ("pivot", _) => Projection::Pivot,
                ("rank", Projection::Rank { window }) => Projection::Rank { window },
                ("rank", Projection::Pivot) => match AttentionParams::default().projection {
                    Projection::Rank { window } => Projection::Rank { window },
                    Projection::Pivot => {
                        return Err(Error::invalid_param(name, value, "needs window=N"))
                    }
                },
                _ => return Err(Error::invalid_param(name, value, "expected pivot or rank")),
            }
        }
        "window" => match &mut p.projection {
            Projection::Rank { window } => *window = number(name, value)?,
            Projection::Pivot => {
                return Err(Error::invalid_param(
                    name,
                    value,
                    "applies to projection=rank only",
                ))
            }
        },
        "prune" => p.prune = value.parse::<Prune>()?,
        "codes" => p.codes = value.parse::<Codes>()?,
        "rerank" => p.rerank = number(name, value)?,
        "entry" => {
            p.entry = match value {
                "hub" => EntryRule::Hub,
                "l2-medoid" => EntryRule::L2Medoid,
                _ => {
                    return Err(Error::invalid_param(
                        name,
                        value,
                        "expected hub or l2-medoid (or recent-queries=N for the hubs of the last N queries)",
                    ))
                }
            }
        }
        "recent-queries" => {
            p.entry = EntryRule::RecentHub {
                queries: number(name, value)?,
            }
        }
        "entry-count" => p.entry_count = number(name, value)?,
        "recent-entries" => p.recent_entries = number(name, value)?,
        "sequence-edges" => p.sequence_edges = number(name, value)?,
        "build-ef" => p.build_ef = number(name, value)?,
        "default-ef" => p.default_ef = number(name, value)?,
        "causal" => p.causal = boolean(name, value)?,
        "queries-per-key" => p.queries_per_key = number(name, value)?,
        "global-full" => p.global_full = off_at_zero(number(name, value)?),
        "far-check" => p.far_check = off_at_zero(number(name, value)?),
        "auto-ef" => p.auto_ef = off_at_zero(number(name, value)?),
        "prune-check" => {
            p.prune_check = match value {
                "none" => None,
                rule => Some(rule.parse::<Prune>().map_err(|_| {
                    Error::invalid_param(name, value, "expected top, occlusion, occlusion-fill or none")
                })?),
            }
        }
        "prune-cands" => p.prune_candidates = number(name, value)?,
        "pool-above" => p.pool_above = number(name, value)?,
        "scan-check" => p.scan_check = boolean(name, value)?,
        "knn-probe" | "knn-graph" | "knn-pool" => {
            let field = name.replace('-', "_");
            let size: usize = number(name, value)?;
            match (p.knn.field(), size) {
                // `knn-X=0`: the exact kNN, unless another key chose a strategy.
                (Some(other), 0) if other != field => {}
                (Some(other), _) if other != field => {
                    return Err(Error::invalid_param(
                        name,
                        value,
                        format!(
                            "choose one approximate kNN: {} is set (knn-probe, knn-graph or \
                             knn-pool)",
                            other.replace('_', "-")
                        ),
                    ))
                }
                _ => {
                    p.knn = TrainKnn::from_field(&field, size).ok_or_else(|| unknown(name))?
                }
            }
        }
        _ => return Err(unknown(name)),
    }
    Ok(())
}

/// An optional share as a spec string prints it: 0 when off.
fn off_zero(x: Option<f64>) -> String {
    x.unwrap_or(0.0).to_string()
}

fn set_hnsw(p: &mut HnswParams, name: &'static str, value: &str) -> Result<()> {
    match name {
        "m" => p.m = number(name, value)?,
        "ef-construction" => p.ef_construction = number(name, value)?,
        "keep-pruned" => p.keep_pruned = boolean(name, value)?,
        "seed" => p.seed = number(name, value)?,
        "default-ef" => p.default_ef = number(name, value)?,
        _ => return Err(unknown(name)),
    }
    Ok(())
}

fn set_ivf(p: &mut IvfParams, name: &'static str, value: &str) -> Result<()> {
    match name {
        "nlist" => {
            p.nlist = match value {
                "auto" => None,
                _ => Some(number(name, value)?),
            }
        }
        "iters" => p.iters = number(name, value)?,
        "max-train-per-list" => p.max_train_per_list = number(name, value)?,
        "seed" => p.seed = number(name, value)?,
        "default-nprobe" => p.default_nprobe = number(name, value)?,
        "codes" => p.codes = value.parse::<Codes>()?,
        "rerank" => p.rerank = number(name, value)?,
        _ => return Err(unknown(name)),
    }
    Ok(())
}

fn set_vamana(p: &mut VamanaParams, name: &'static str, value: &str) -> Result<()> {
    match name {
        "r" => p.r = number(name, value)?,
        "l" => p.l = number(name, value)?,
        "alpha" => p.alpha = number(name, value)?,
        "stitch-t" => p.stitch_t = number(name, value)?,
        "stitch-reserve" => p.stitch_reserve = number(name, value)?,
        "seed" => p.seed = number(name, value)?,
        "max-batch-fraction" => p.max_batch_fraction = number(name, value)?,
        "default-ef" => p.default_ef = number(name, value)?,
        _ => return Err(unknown(name)),
    }
    Ok(())
}

fn unknown(name: &'static str) -> Error {
    Error::invalid_param("key", name, "not a parameter of this kind")
}

fn number<T: std::str::FromStr>(name: &'static str, value: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::invalid_param(
            name,
            value,
            format!("expected a number ({})", std::any::type_name::<T>()),
        )
    })
}

fn boolean(name: &'static str, value: &str) -> Result<bool> {
    value
        .parse()
        .map_err(|_| Error::invalid_param(name, value, "expected true or false"))
}
