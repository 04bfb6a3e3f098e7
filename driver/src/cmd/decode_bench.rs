//! `qkindex decode-bench`: the decode attention code of the policies on one layer of a dump,
//! without the model: the dump's prefill keys (and queries, for the index) form the cache, then
//! each decode query attends through the policy while a key enters per step (the dump's decode
//! keys, cycled). This is how long KV caches (a 128K-key synthetic dump) are measured; values
//! are seeded normals when the dump has none.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use qkindex::dump::{Dump, Part};
use qkindex::synth::Rng;
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::{PolicyKind, Retrieval, Shape};
use qkindex_model::{DecodeAttention, DecodeStep};
use serde::Serialize;

use super::policy_args::PolicyArgs;

#[derive(Debug, Args)]
pub struct DecodeBenchArgs {
    /// Dump directory (docs/DESIGN.md §4 layout).
    #[arg(long)]
    pub dump: PathBuf,
    /// Layer of the dump [default: its first].
    #[arg(long)]
    pub layer: Option<usize>,
    /// Decode steps (decode queries are cycled when the dump has fewer).
    #[arg(long, default_value_t = 256)]
    pub steps: usize,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct BenchResult {
    policy: String,
    n_keys: usize,
    steps: usize,
    /// Per step, all query heads: milliseconds.
    search_ms: f64,
    attention_ms: f64,
    recall: Option<f64>,
    mass: Option<f64>,
    mass_ratio: Option<f64>,
    distance_computations: f64,
    build_s: f64,
}

pub fn run(args: DecodeBenchArgs, devices: &Devices) -> anyhow::Result<()> {
    let dump = Dump::open(&args.dump)?;
    let m = dump.manifest.clone();
    let layer = args.layer.unwrap_or(m.layers[0]);
    if !m.layers.contains(&layer) {
        anyhow::bail!("layer {layer} is not in the dump (it has {:?})", m.layers);
    }
    if args.steps == 0 {
        anyhow::bail!("--steps must be at least 1");
    }
    let read = |p: Part| {
        dump.read(layer, p)
            .with_context(|| format!("reading {p:?}"))
    };
    let (q, k, qdec, kdec) = (
        read(Part::Q)?,
        read(Part::K)?,
        read(Part::QDec)?,
        read(Part::KDec)?,
    );
    let (hd, n, hq, hk) = (m.head_dim, k.rows, m.n_q_heads, m.n_kv_heads);
    if q.rows != n || qdec.rows == 0 || kdec.rows == 0 {
        anyhow::bail!(
            "the dump needs as many prefill queries as keys, and decode queries and keys"
        );
    }
    let cap = n + args.steps;
    let mut rng = Rng::new(7);
    // Cache blocks per KV head: `cap × hd` keys and values; the prefill rows filled.
    let mut kc = vec![0f32; hk * cap * hd];
    let mut vc = vec![0f32; hk * cap * hd];
    let v = dump
        .has(layer, Part::V)
        .then(|| read(Part::V))
        .transpose()?;
    for g in 0..hk {
        kc[g * cap * hd..][..n * hd].copy_from_slice(k.head(g));
        for (i, x) in vc[g * cap * hd..][..n * hd].iter_mut().enumerate() {
            *x = v.as_ref().map_or_else(|| rng.normal(), |v| v.head(g)[i]);
        }
    }
    // Prefill queries row-major `n × (hq · hd)` as the model captures them.
    let mut pq = vec![0f32; n * hq * hd];
    for h in 0..hq {
        for p in 0..n {
            pq[(p * hq + h) * hd..][..hd].copy_from_slice(&q.head(h)[p * hd..][..hd]);
        }
    }
    let shape = Shape {
        n_layers: 1,
        n_heads: hq,
        n_kv_heads: hk,
        head_dim: hd,
    };
    let mut results = Vec::new();
    for kind in args.policy.kinds() {
        if kind == PolicyKind::Full {
            continue;
        }
        let cfg = args.policy.config(kind);
        eprintln!("{}: building over {n} keys...", kind.name());
        let keys_of = |_: usize, g: usize| kc[g * cap * hd..][..n * hd].to_vec();
        let mut r = Retrieval::new(
            cfg,
            shape,
            &keys_of,
            n,
            std::slice::from_ref(&pq),
            devices.knn(),
            |_, _| {},
        )?;
        let (mut kc, mut vc) = (kc.clone(), vc.clone());
        let mut out = vec![0f32; hq * hd];
        let mut qrow = vec![0f32; hq * hd];
        let t0 = Instant::now();
        for t in 0..args.steps {
            let pos = n + t;
            for g in 0..hk {
                let src = &kdec.head(g)[(t % kdec.rows) * hd..][..hd];
                kc[(g * cap + pos) * hd..][..hd].copy_from_slice(src);
                for x in &mut vc[(g * cap + pos) * hd..][..hd] {
                    *x = rng.normal();
                }
            }
            for h in 0..hq {
                qrow[h * hd..][..hd].copy_from_slice(&qdec.head(h)[(t % qdec.rows) * hd..][..hd]);
            }
            let step = DecodeStep {
                layer: 0,
                pos,
                q: &qrow,
                k: &kc,
                v: &vc,
                capacity: cap,
            };
            r.attend(step, &mut out)?;
        }
        let wall = t0.elapsed();
        let s = &r.stats;
        let per = |d: std::time::Duration| 1e3 * d.as_secs_f64() / args.steps as f64;
        let res = BenchResult {
            policy: kind.name().into(),
            n_keys: n,
            steps: args.steps,
            search_ms: per(s.search),
            attention_ms: per(s.attention),
            recall: s.recall().filter(|_| kind != PolicyKind::Static),
            mass: s.mass(),
            mass_ratio: s.mass_ratio(),
            distance_computations: s.distance_computations as f64 / s.selections.max(1) as f64,
            build_s: s.build_s,
        };
        eprintln!(
            "{}: search {:.3} ms, attention {:.3} ms per step ({:.1} s wall incl. measurement)",
            res.policy,
            res.search_ms,
            res.attention_ms,
            wall.as_secs_f64()
        );
        results.push(res);
    }
    let opt = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{v:.4}"));
    println!("| policy | keys | search ms/step | attention ms/step | inner products/head | recall | mass | mass ratio | build s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.0} | {} | {} | {} | {:.1} |",
            r.policy,
            r.n_keys,
            r.search_ms,
            r.attention_ms,
            r.distance_computations,
            opt(r.recall),
            opt(r.mass),
            opt(r.mass_ratio),
            r.build_s
        );
    }
    if let (Some(e), Some(i)) = (
        results.iter().find(|r| r.policy == "exact-topk"),
        results.iter().find(|r| r.policy == "index-topk"),
    ) {
        println!(
            "search time exact-topk / index-topk: {:.2}×",
            e.search_ms / i.search_ms.max(1e-9)
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
