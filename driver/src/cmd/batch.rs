//! `qkindex batch`: decode throughput of several sequences at once, the serving shape. Each
//! sequence has its own prompt (consecutive stretches of one text), its own cache and its own
//! indexes; the batch decodes greedily in lockstep, one token per sequence per step
//! ([`step_batch`]: the projections, the MLP and the LM head on all sequences' rows at once,
//! RoPE, the caches, search and attention per sequence). For each policy and batch size: tokens
//! per second, milliseconds per batch step, and the memory per sequence and per key.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::ProgressBar;
use qkindex_driver::decode::{prefill_with, step_batch, Decoder, Prefill};
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::PolicyConfig;
use qkindex_model::{argmax, Model, Timings};
use serde::Serialize;

use super::model_args::PolicyRunArgs;

#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Text file (UTF-8) whose consecutive stretches are the prompts [default: the bundled
    /// license texts, or Paul Graham's essays (`scripts/get-text.sh`) when they are too short].
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Positions per sequence: a prompt of `context − new` tokens, then `new` decode steps.
    #[arg(long, default_value_t = 8192)]
    pub context: usize,
    /// Batch sizes (sequences decoded at once), comma-separated; the largest sets how many
    /// prompts are prefilled.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub batch: Vec<usize>,
    /// Decode steps per sequence.
    #[arg(long, default_value_t = 64)]
    pub new: usize,
    #[command(flatten)]
    pub run: PolicyRunArgs,
}

/// One policy at one batch size.
#[derive(Debug, Serialize)]
pub struct BatchRow {
    pub policy: String,
    pub config: PolicyConfig,
    pub batch: usize,
    pub context: usize,
    pub new: usize,
    /// What exact attention read keys and values in (`--kv-cache`).
    pub kv_cache: String,
    /// Tokens generated per second, all sequences together.
    pub tokens_per_s: f64,
    /// Milliseconds per batch step (one token of every sequence).
    pub ms_per_step: f64,
    /// The batch's split per step: the selectors' search and the attention (summed over the
    /// sequences) and the model's matrix products, milliseconds.
    pub search_ms: f64,
    pub attention_ms: f64,
    pub matmul_ms: f64,
    /// Seconds of the index builds of the batch's sequences.
    pub build_s: f64,
    /// Bytes per sequence: its KV cache (allocated for `context` positions), its indexes'
    /// structure (graph, lists, codes) and the keys they hold a copy of.
    pub cache_bytes_per_seq: f64,
    pub index_structure_bytes_per_seq: f64,
    pub index_keys_bytes_per_seq: f64,
    /// Bytes per position of the cache (all layers and KV heads), and per key under an index
    /// (one layer and KV head's key: its structure and its copy).
    pub cache_bytes_per_position: f64,
    pub index_bytes_per_key: Option<f64>,
    /// The process's peak resident memory so far (Linux: VmHWM), bytes.
    pub peak_rss_bytes: Option<u64>,
}

pub fn run(args: BatchArgs, devices: &Devices) -> anyhow::Result<()> {
    let bmax = args.batch.iter().copied().max().unwrap_or(0);
    if bmax == 0 || args.batch.contains(&0) {
        anyhow::bail!("--batch takes sizes of at least 1");
    }
    if args.new == 0 || args.context <= args.new + 1 {
        anyhow::bail!("--new must be at least 1 and --context larger than --new + 1");
    }
    let prompt = args.context - args.new;
    let m = args.run.model.load(devices)?;
    let encode = |t: &str| Ok(m.tokenizer.encode(t)?);
    let ids = super::texts::command_tokens(args.text.as_deref(), bmax * prompt, encode)?;
    if ids.len() < bmax * prompt {
        anyhow::bail!(
            "the text has {} tokens; {bmax} prompts of {prompt} need {}",
            ids.len(),
            bmax * prompt
        );
    }
    let m = args.run.model.fit(m, args.context)?;
    if args.context > m.llama.cfg.context_length {
        anyhow::bail!(
            "--context must be at most the model's {}",
            m.llama.cfg.context_length
        );
    }
    let kinds = args.run.policy.kinds();
    let needs_q = kinds.iter().any(|k| k.needs_prefill_queries());
    let mut prefills = Vec::with_capacity(bmax);
    for (i, p) in ids.chunks_exact(prompt).take(bmax).enumerate() {
        eprintln!("prefill {}/{bmax} of {prompt} tokens...", i + 1);
        let bar = super::progress::prefill_bar(prompt);
        let pre = prefill_with(&m.llama, p, prompt, needs_q, |d| bar.set_position(d as u64))?;
        bar.finish_and_clear();
        eprintln!("prefill {:.1} s", pre.seconds);
        prefills.push(pre);
    }
    let mut rows = Vec::new();
    for kind in kinds {
        // Throughput of the policy alone: no recall measurement (an exact scan per selection,
        // which `eval` times apart and leaves out of its latency).
        let cfg = PolicyConfig {
            measure: false,
            ..args.run.policy.config(kind)
        };
        for &b in &args.batch {
            let row = run_batch(&m, &prefills[..b], &cfg, &args, devices)?;
            eprintln!(
                "{:<11} B={b}: {:.2} tokens/s, {:.2} ms per step (search {:.2}, attention {:.2}, \
                 matmul {:.2}); per sequence: cache {:.1} MB, index {:.1} + {:.1} MB (structure \
                 + keys)",
                row.policy,
                row.tokens_per_s,
                row.ms_per_step,
                row.search_ms,
                row.attention_ms,
                row.matmul_ms,
                row.cache_bytes_per_seq / 1e6,
                row.index_structure_bytes_per_seq / 1e6,
                row.index_keys_bytes_per_seq / 1e6,
            );
            rows.push(row);
        }
    }
    print_table(&rows);
    if let Some(path) = &args.run.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Builds one decoder per prefill under `cfg` and decodes `args.new` greedy steps of all of
/// them at once.
fn run_batch(
    m: &Model,
    prefills: &[Prefill],
    cfg: &PolicyConfig,
    args: &BatchArgs,
    devices: &Devices,
) -> anyhow::Result<BatchRow> {
    let b = prefills.len();
    let t0 = Instant::now();
    let bar = ProgressBar::new((b * m.llama.cfg.n_layers * m.llama.cfg.n_kv_heads) as u64);
    bar.set_message(format!("{} B={b}: building", cfg.kind.name()));
    let mut decoders = Vec::with_capacity(b);
    for (i, pre) in prefills.iter().enumerate() {
        let base = (i * m.llama.cfg.n_layers * m.llama.cfg.n_kv_heads) as u64;
        decoders.push(Decoder::new(
            &m.llama,
            pre,
            cfg,
            args.new,
            devices.knn(),
            |done, _| bar.set_position(base + done as u64),
        )?);
    }
    bar.finish_and_clear();
    let build_s = t0.elapsed().as_secs_f64();
    let mut tokens: Vec<u32> = prefills
        .iter()
        .map(|p| argmax(&p.last_logits, |_| false))
        .collect();
    let search0: f64 = decoders.iter().map(search_s).sum();
    let attn0: f64 = decoders.iter().map(attention_s).sum();
    let mut tm = Timings::default();
    let bar = ProgressBar::new(args.new as u64);
    let t0 = Instant::now();
    for _ in 0..args.new {
        let logits = step_batch(&mut decoders, &tokens, &mut tm)?;
        for (t, l) in tokens.iter_mut().zip(&logits) {
            *t = argmax(l, |_| false);
        }
        bar.inc(1);
    }
    let wall = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let steps = args.new as f64;
    let per_step = |s: f64| 1e3 * s / steps;
    let search = decoders.iter().map(search_s).sum::<f64>() - search0;
    // A policy's global-layer attention is its own (the forward pass books its search there
    // too); `full`'s is the forward pass's.
    let global = match decoders[0].retrieval() {
        Some(_) => decoders.iter().map(attention_s).sum::<f64>() - attn0,
        None => tm.attention.as_secs_f64(),
    };
    let attention = global + tm.attention_local.as_secs_f64();
    let cache_bytes = decoders[0].cache().bytes() as f64;
    let capacity = decoders[0].cache().capacity() as f64;
    let (mut structure, mut keys, mut n_keys) = (0usize, 0usize, 0usize);
    for d in &decoders {
        if let Some(r) = d.retrieval() {
            let (s, k, n) = r.index_memory();
            (structure, keys, n_keys) = (structure + s, keys + k, n_keys + n);
        }
    }
    Ok(BatchRow {
        policy: cfg.kind.name().to_string(),
        config: cfg.clone(),
        batch: b,
        context: args.context,
        new: args.new,
        kv_cache: m.llama.kv_dtype().to_string(),
        tokens_per_s: b as f64 * steps / wall,
        ms_per_step: per_step(wall),
        search_ms: per_step(search),
        attention_ms: per_step(attention),
        matmul_ms: per_step(tm.matmul.as_secs_f64()),
        build_s,
        cache_bytes_per_seq: cache_bytes,
        index_structure_bytes_per_seq: structure as f64 / b as f64,
        index_keys_bytes_per_seq: keys as f64 / b as f64,
        cache_bytes_per_position: cache_bytes / capacity,
        index_bytes_per_key: (n_keys > 0).then(|| (structure + keys) as f64 / n_keys as f64),
        peak_rss_bytes: peak_rss(),
    })
}

fn search_s(d: &Decoder<'_>) -> f64 {
    d.stats().map_or(0.0, |s| s.search.as_secs_f64())
}

fn attention_s(d: &Decoder<'_>) -> f64 {
    d.stats().map_or(0.0, |s| s.attention.as_secs_f64())
}

/// The process's peak resident set (VmHWM of /proc/self/status), where the system has one.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn print_table(rows: &[BatchRow]) {
    println!(
        "| policy | B | tokens/s | ms/step | search | attention | matmul | cache MB/seq | index MB/seq | index B/key |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {} |",
            r.policy,
            r.batch,
            r.tokens_per_s,
            r.ms_per_step,
            r.search_ms,
            r.attention_ms,
            r.matmul_ms,
            r.cache_bytes_per_seq / 1e6,
            (r.index_structure_bytes_per_seq + r.index_keys_bytes_per_seq) / 1e6,
            r.index_bytes_per_key
                .map_or_else(|| "—".to_string(), |v| format!("{v:.0}")),
        );
    }
}
