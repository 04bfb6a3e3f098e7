//! `qkindex build`: builds indexes from a dump and writes them as a bundle (docs/DESIGN.md §4,
//! docs/FORMAT.md): one key file per (layer, KV head), one index file per (layer, query head).
//!
//! `--kind` is an index spec (`attention`, `hnsw-ip:m=32`, `ivf:nlist=361`, ...), built as
//! `qkindex bench --kinds` builds it, from training queries chosen as the bench chooses them
//! (the prefill queries of the head's GQA group, pooled, unless `--no-pool`). A kind that
//! does not read queries, or one trained on a pooled group, gives every query head of a group
//! the same index, so it is built once per KV head and written once per query head. IVF files
//! hold their own list-ordered copy of the keys (docs/FORMAT.md), the graph kinds reference the
//! bundle's key file.

use crate::training::DumpInput;
use anyhow::Result;
use clap::Args;
use half::f16;
use qkindex::dump::Part;
use qkindex::io::bundle::BundleWriter;
use qkindex::io::{AnyIndex, Persist};
use qkindex::{Cancel, IndexSpec, KeyStore};
use qkindex_driver::devices::Devices;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pub input: DumpInput,
    /// Index spec: a kind and its build parameters, as `qkindex bench --kinds` names them
    /// (`attention`, `attention:kq=200,degree=48`, `flat`, `hnsw`, `hnsw-ip`, `ivf`, `ivf-ip`,
    /// `vamana`, `robust-vamana`, ...).
    #[arg(long, default_value = "attention")]
    pub kind: IndexSpec,
    /// Bundle directory to write (created if missing).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: BuildArgs, devices: &Devices) -> Result<()> {
    let (dump, layers, heads) = args.input.open()?;
    let m = dump.manifest.clone();
    let spec = &args.kind;
    let (d, group) = (m.head_dim, m.n_q_heads / m.n_kv_heads);
    let pool = !args.input.no_pool;
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
            let per_kv = pool || !spec.needs_queries();
            let index = match shared.get(&kv) {
                Some(index) if per_kv => index.clone(),
                _ => {
                    let (train, visible) = if spec.needs_queries() {
                        let t = args.input.training_queries(&q_all, h, kv, group);
                        (t.rows, Some(t.visible))
                    } else {
                        (Vec::new(), None)
                    };
                    let knn = devices.knn();
                    spec.build_visible(
                        keys.clone(),
                        &train,
                        visible.as_deref(),
                        knn,
                        &Cancel::new(),
                    )?
                    .index
                }
            };
            bundle.write_index(layer, h, kv, index.as_persist() as &dyn Persist, key_ref)?;
            if per_kv {
                shared.insert(kv, index);
            }
            eprintln!(
                "layer {layer} head {h} (kv {kv}): {} keys, {spec} index written in {:.2}s",
                keys.len(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    let meta = serde_json::json!({
        "dump": args.input.dump.display().to_string(),
        "model": m.model,
        "kind": spec,
        "pooled_training_queries": pool,
        "max_train": args.input.max_train,
    });
    let dir = bundle.finish(meta)?;
    eprintln!(
        "wrote bundle {} in {:.1}s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
