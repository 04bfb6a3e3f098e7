//! `qkindex build`: builds indexes from a dump and writes them as a bundle (DESIGN.md §4,
//! docs/FORMAT.md): one key file per (layer, KV head), one index file per (layer, query head).
//!
//! Training queries are chosen as `qkindex bench` chooses them (the prefill queries of the
//! head's GQA group, pooled, unless `--no-pool`). With pooling every query head of a group gets
//! the same graph, so it is built once per KV head and written once per query head.
//!
//! The baseline kinds (hnsw, hnsw-ip, ivf, ivf-ip, vamana, robust-vamana) are built by the
//! bench's own builder ([`super::bench::kinds::build_baseline`]) with the bench's flags and
//! defaults. Except for robust-vamana (which reads training queries) they depend on the keys
//! only, so they too are built once per KV head. IVF files hold their own list-ordered copy of
//! the keys (docs/FORMAT.md), the graph kinds reference the bundle's key file.

use super::bench::kinds::{build_baseline, BaselineArgs, HeadInput};
use super::bench::training_queries;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use half::f16;
use qkindex::dump::{Dump, Part};
use qkindex::io::bundle::BundleWriter;
use qkindex::io::{AnyIndex, Persist};
use qkindex::{AttentionIndex, AttentionParams, FlatIndex, KeyStore};
use qkindex_driver::devices::Devices;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Index kinds `qkindex build` writes (the names of `qkindex bench --kinds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BuildKind {
    Attention,
    Flat,
    /// HNSW on the MIPS→L2 reduction.
    Hnsw,
    /// Inner-product HNSW.
    HnswIp,
    /// IVF-Flat, spherical centroids.
    Ivf,
    /// IVF-Flat, inner-product centroids.
    IvfIp,
    Vamana,
    RobustVamana,
}

impl BuildKind {
    /// The kind's name on the command line.
    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// True when the index depends on the training queries.
    fn uses_queries(self) -> bool {
        matches!(self, BuildKind::Attention | BuildKind::RobustVamana)
    }
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Dump directory (DESIGN.md §4 layout).
    #[arg(long)]
    pub dump: PathBuf,
    /// Model layer numbers (default: all layers of the dump).
    #[arg(long, value_delimiter = ',')]
    pub layers: Vec<usize>,
    /// Query heads (default: all).
    #[arg(long, value_delimiter = ',')]
    pub heads: Vec<usize>,
    /// Index kind.
    #[arg(long, value_enum, default_value_t = BuildKind::Attention)]
    pub kind: BuildKind,
    /// Bundle directory to write (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Train each head's index on its own prefill queries only (default: pool its GQA group).
    #[arg(long)]
    pub no_pool: bool,
    /// Use at most this many training queries per index (evenly strided; 0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_train: usize,
    /// AttentionIndex: training-query top-kq.
    #[arg(long, default_value_t = 100)]
    pub kq: usize,
    /// AttentionIndex: out-degree bound.
    #[arg(long, default_value_t = 32)]
    pub max_degree: usize,
    /// Seed of the baseline builds (IVF k-means, Vamana), as `qkindex bench --seed`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Build parameters of the baseline kinds (as in `qkindex bench`).
    #[command(flatten)]
    pub baseline: BaselineArgs,
}

pub fn run(args: BuildArgs, devices: &Devices) -> Result<()> {
    let dump =
        Dump::open(&args.dump).with_context(|| format!("opening dump {}", args.dump.display()))?;
    let m = dump.manifest.clone();
    let layers = if args.layers.is_empty() {
        m.layers.clone()
    } else {
        args.layers.clone()
    };
    let heads: Vec<usize> = if args.heads.is_empty() {
        (0..m.n_q_heads).collect()
    } else {
        args.heads.clone()
    };
    if let Some(h) = heads.iter().find(|&&h| h >= m.n_q_heads) {
        bail!(
            "query head {h} out of range (the dump has {} query heads)",
            m.n_q_heads
        );
    }
    let params = AttentionParams {
        kq: args.kq,
        max_degree: args.max_degree,
        ..AttentionParams::default()
    };
    params.validate()?;
    let (d, group) = (m.head_dim, m.n_q_heads / m.n_kv_heads);
    let pool = !args.no_pool;
    let started = Instant::now();
    let mut bundle = BundleWriter::new(&args.out)?;
    for &layer in &layers {
        let q_all = dump.read(layer, Part::Q)?;
        let k_all = dump.read(layer, Part::K)?;
        let mut key_refs = HashMap::new();
        // Built once per KV head when the index does not depend on the query head.
        let mut shared: HashMap<usize, AnyIndex> = HashMap::new();
        for &h in &heads {
            let kv = m.kv_head_of(h);
            let (keys, key_ref) = match key_refs.entry(kv) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let keys = Arc::new(KeyStore::from_f16(
                        k_all.head(kv).iter().map(|&x| f16::from_f32(x)).collect(),
                        d,
                    )?);
                    let r = bundle.write_keys(layer, kv, &keys)?;
                    e.insert((keys, r))
                }
            };
            let (keys, key_ref) = (&*keys, &*key_ref);
            let t = Instant::now();
            let per_kv = pool || !args.kind.uses_queries();
            let index = match shared.get(&kv) {
                Some(index) if per_kv => index.clone(),
                _ => {
                    let train = if args.kind.uses_queries() {
                        training_queries(&q_all, h, kv, group, pool, args.max_train)
                    } else {
                        Vec::new()
                    };
                    match args.kind {
                        BuildKind::Flat => AnyIndex::Flat(FlatIndex::new(keys.clone())),
                        BuildKind::Attention => AnyIndex::Attention(AttentionIndex::build(
                            keys.clone(),
                            &train,
                            &params,
                            devices.knn(),
                        )?),
                        baseline => {
                            let input = HeadInput {
                                keys,
                                keys_f32: k_all.head(kv),
                                train: &train,
                                layer,
                                head: h,
                            };
                            build_baseline(
                                &baseline.name(),
                                &input,
                                &args.baseline,
                                args.seed,
                                devices.knn(),
                            )?
                            .index
                        }
                    }
                }
            };
            bundle.write_index(layer, h, kv, index.as_persist() as &dyn Persist, key_ref)?;
            if per_kv {
                shared.insert(kv, index);
            }
            eprintln!(
                "layer {layer} head {h} (kv {kv}): {} keys, {} index written in {:.2}s",
                keys.len(),
                args.kind.name(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    let meta = serde_json::json!({
        "dump": args.dump.display().to_string(),
        "model": m.model,
        "kind": args.kind.name(),
        "pooled_training_queries": pool,
        "max_train": args.max_train,
        "attention_params": params,
        "baseline_params": args.baseline,
        "seed": args.seed,
    });
    let dir = bundle.finish(meta)?;
    eprintln!(
        "wrote bundle {} in {:.1}s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
