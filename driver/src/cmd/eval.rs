//! `qkindex eval`: what each attention policy does to the model's output. One prefill of
//! `context − 1` tokens (exact attention), then the continuation teacher-forced one token per
//! decode step through each policy: perplexity, top-1 agreement and KL divergence against
//! `full`, attention mass and recall, and the per-token latency split.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qkindex_driver::decode::{log_softmax, prefill_with, Decoder, Latency, Prefill};
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::{build_tally, PolicyConfig, PolicyKind, SeededProbe};
use qkindex_model::{argmax, Model};
use serde::Serialize;

use super::model_args::PolicyRunArgs;
use super::policy_args::PolicyArgs;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Text file (UTF-8) [default: the bundled license texts, or Paul Graham's essays
    /// (`scripts/get-text.sh`) when --context + --continuation exceed them].
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Tokens before the first scored token (prefilled with exact attention).
    #[arg(long, default_value_t = 7936)]
    pub context: usize,
    /// Tokens scored after the context, each predicted by a decode step under the policy.
    #[arg(long, default_value_t = 256)]
    pub continuation: usize,
    #[command(flatten)]
    pub run: PolicyRunArgs,
}

/// What one policy did to the continuation.
#[derive(Debug, Serialize)]
pub struct EvalResult {
    pub policy: String,
    pub config: PolicyConfig,
    pub context: usize,
    pub continuation: usize,
    /// What exact attention read keys and values in (`--kv-cache`).
    pub kv_cache: String,
    pub ppl: f64,
    /// Share of steps whose argmax equals `full`'s (None without the reference run).
    pub top1_agreement: Option<f64>,
    /// Mean KL(full ‖ policy) of the next-token distributions, nats.
    pub kl: Option<f64>,
    /// Mean softmax mass (of all keys) on the attended keys.
    pub mass: Option<f64>,
    /// `mass` over the mass with the rest's exact top-k instead of the retrieved keys.
    pub mass_ratio: Option<f64>,
    /// Mean recall@k of the retrieved keys against the rest's exact top-k.
    pub recall: Option<f64>,
    /// Mean recall over the first and last 100 steps (insertion stability).
    pub recall_first100: Option<f64>,
    pub recall_last100: Option<f64>,
    /// Selector inner products per query head and step, and as a share of the keys.
    pub distance_computations: Option<f64>,
    pub keys_attended: Option<f64>,
    pub latency_ms: Latency,
    /// Seconds of the prefill (shared by every policy) and of this policy's index builds: the
    /// two parts of the time to the first token.
    pub prefill_s: f64,
    pub build_s: f64,
    /// One-time selector inner products of the builds, as the selectors report them (SnapKV's
    /// vote; 0 for the others).
    pub build_distance_computations: Option<u64>,
    /// ReTopK: share of selections that reused cached sets, keys scored per reuse, and the
    /// counts behind them (retopk only).
    pub reuse_ratio: Option<f64>,
    pub mean_candidates: Option<f64>,
    pub retopk: Option<qkindex_driver::retrieval::ReTopKCounts>,
    /// Mean mass per layer (null for dense layers).
    pub mass_by_layer: Vec<Option<f64>>,
    /// Mean recall per step (measured runs with a rest).
    pub recall_by_step: Vec<f64>,
}

pub fn run(args: EvalArgs, devices: &Devices) -> anyhow::Result<()> {
    let m = args.run.model.load(devices)?;
    let (ctx, cont) = (args.context, args.continuation);
    let encode = |t: &str| Ok(m.tokenizer.encode(t)?);
    let ids = super::texts::command_tokens(args.text.as_deref(), ctx + cont, encode)?;
    if ctx < 2 || cont == 0 {
        anyhow::bail!("--context must be at least 2 and --continuation at least 1");
    }
    if ctx + cont > ids.len() {
        anyhow::bail!(
            "the text has {} tokens; --context {ctx} + --continuation {cont} needs {}",
            ids.len(),
            ctx + cont
        );
    }
    let m = args.run.model.fit(m, ctx + cont - 1)?;
    let max_pos = m.llama.cfg.context_length;
    if ctx + cont - 1 > max_pos {
        anyhow::bail!("--context + --continuation − 1 must be at most the model's {max_pos}");
    }
    let results = evaluate(&m, &ids[..ctx + cont], ctx, &args.run.policy, devices)?;
    print_table(&results);
    if let Some(path) = &args.run.json {
        let json = if results.len() == 1 {
            serde_json::to_string_pretty(&results[0])?
        } else {
            serde_json::to_string_pretty(&results)?
        };
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Scores `tokens[ctx..]` after a prefill of `tokens[..ctx − 1]`, under `full` and each policy
/// (index builds on `devices`).
pub fn evaluate(
    m: &Model,
    tokens: &[u32],
    ctx: usize,
    policies: &PolicyArgs,
    devices: &Devices,
) -> anyhow::Result<Vec<EvalResult>> {
    let kinds = policies.kinds();
    let needs_q = kinds.iter().any(|k| k.needs_prefill_queries());
    let cont = tokens.len() - ctx;
    eprintln!("prefill of {} tokens...", ctx - 1);
    let bar = super::progress::prefill_bar(ctx - 1);
    let pre = prefill_with(&m.llama, &tokens[..ctx - 1], ctx - 1, needs_q, |d| {
        bar.set_position(d as u64)
    })?;
    bar.finish_and_clear();
    eprintln!("prefill {:.1} s", pre.seconds);
    let mut reference: Vec<Vec<f64>> = Vec::new();
    let mut ref_top: Vec<u32> = Vec::new();
    let mut results = Vec::new();
    for kind in kinds {
        let cfg = policies.config(kind);
        let r = run_policy(
            m,
            &pre,
            devices,
            tokens,
            ctx,
            cont,
            &cfg,
            &mut reference,
            &mut ref_top,
        )?;
        eprintln!(
            "{:<11} ppl {:.4}  top-1 {}  kl {}  {:.2} ms/token",
            r.policy,
            r.ppl,
            opt(r.top1_agreement),
            opt(r.kl),
            r.latency_ms.total
        );
        if r.build_s > 0.0 {
            eprintln!("{}", super::ttft_line(r.prefill_s, r.build_s));
        }
        if let (Some(reuse), Some(c)) = (r.reuse_ratio, &r.retopk) {
            let per = |x: f64| x / c.seeded_selections.max(1) as f64;
            eprintln!(
                "            reuse {reuse:.3}, {:.0} keys scored per reuse",
                r.mean_candidates.unwrap_or(0.0)
            );
            if c.seeded_selections > 0 {
                eprintln!(
                    "            {} seeded fallbacks: seeded {:.0} inner products, {:.1} hops, recall {:.4}; unseeded same ef {:.0}, {:.1}, {:.4}",
                    c.seeded_selections,
                    per(c.seeded_distance_computations as f64),
                    per(c.seeded_hops as f64),
                    per(c.seeded_recall_sum),
                    per(c.unseeded_distance_computations as f64),
                    per(c.unseeded_hops as f64),
                    per(c.unseeded_recall_sum),
                );
                for w in &c.wider {
                    eprintln!(
                        "            unseeded ef {}: {:.0} inner products, {:.1} hops, recall {:.4}",
                        w.ef,
                        per(w.distance_computations as f64),
                        per(w.hops as f64),
                        per(w.recall_sum)
                    );
                }
            }
        }
        results.push(r);
    }
    Ok(results)
}

#[allow(clippy::too_many_arguments)]
fn run_policy(
    m: &Model,
    pre: &Prefill,
    devices: &Devices,
    tokens: &[u32],
    ctx: usize,
    cont: usize,
    cfg: &PolicyConfig,
    reference: &mut Vec<Vec<f64>>,
    ref_top: &mut Vec<u32>,
) -> anyhow::Result<EvalResult> {
    let builds = ProgressBar::new((m.llama.cfg.n_layers * m.llama.cfg.n_kv_heads) as u64);
    builds.set_style(ProgressStyle::with_template(
        "{msg} {bar:30} {pos}/{len} KV heads [{elapsed}]",
    )?);
    builds.set_message(format!("{}: building", cfg.kind.name()));
    let tally_before = build_tally();
    let mut dec = Decoder::new(&m.llama, pre, cfg, cont, devices.knn(), |done, _| {
        builds.set_position(done as u64)
    })?;
    builds.finish_and_clear();
    if let Some(line) = (build_tally() - tally_before).steps_line() {
        eprintln!("{}: {line}", cfg.kind.name());
    }
    // The seeded-fallback comparisons this report prints (retopk --retopk-index), untimed.
    if let Some(r) = dec.retrieval_mut() {
        r.set_observer(Box::new(SeededProbe::default()));
    }
    let bar = ProgressBar::new(cont as u64);
    bar.set_style(ProgressStyle::with_template(
        "{msg} {bar:30} {pos}/{len} tokens [{elapsed}<{eta}]",
    )?);
    bar.set_message(format!("{}: decoding", cfg.kind.name()));
    let is_ref = cfg.kind == PolicyKind::Full && reference.is_empty();
    let has_ref = is_ref || !reference.is_empty();
    let (mut nll, mut agree, mut kl) = (0f64, 0usize, 0f64);
    for t in 0..cont {
        let logits = dec.step(tokens[ctx - 1 + t])?;
        let lp = log_softmax(&logits);
        nll -= lp[tokens[ctx + t] as usize];
        let top = argmax(&logits, |_| false);
        if is_ref {
            reference.push(lp);
            ref_top.push(top);
            agree += 1;
        } else if has_ref {
            agree += usize::from(top == ref_top[t]);
            let p = &reference[t];
            kl += p
                .iter()
                .zip(&lp)
                .map(|(&a, &b)| a.exp() * (a - b))
                .sum::<f64>();
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let n = cont as f64;
    let stats = dec.stats();
    let window_mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let by_step = stats.map(|s| s.step_recall.clone()).unwrap_or_default();
    let per_sel = |x: u64| {
        stats
            .filter(|s| s.selections > 0)
            .map(|s| x as f64 / s.selections as f64)
    };
    Ok(EvalResult {
        policy: cfg.kind.name().to_string(),
        config: cfg.clone(),
        context: ctx,
        kv_cache: m.llama.kv_dtype().to_string(),
        continuation: cont,
        ppl: (nll / n).exp(),
        top1_agreement: has_ref.then(|| agree as f64 / n),
        kl: has_ref.then(|| kl / n),
        mass: stats.and_then(|s| s.mass()),
        mass_ratio: stats.and_then(|s| s.mass_ratio()),
        recall: stats
            .and_then(|s| s.recall())
            .filter(|_| cfg.kind != PolicyKind::Static),
        recall_first100: window_mean(&by_step[..by_step.len().min(100)]),
        recall_last100: window_mean(&by_step[by_step.len().saturating_sub(100)..]),
        distance_computations: stats.and_then(|s| per_sel(s.distance_computations)),
        keys_attended: stats.and_then(|s| per_sel(s.keys_attended)),
        latency_ms: dec.latency(),
        prefill_s: pre.seconds,
        build_s: stats.map_or(0.0, |s| s.build_s),
        build_distance_computations: stats.map(|s| s.build_distance_computations),
        reuse_ratio: stats
            .and_then(|s| s.retopk.as_ref())
            .map(|c| c.reuse_ratio()),
        mean_candidates: stats
            .and_then(|s| s.retopk.as_ref())
            .map(|c| c.reuse_candidates as f64 / c.reuse.max(1) as f64),
        retopk: stats.and_then(|s| s.retopk.clone()),
        mass_by_layer: stats.map(|s| s.mass_by_layer()).unwrap_or_default(),
        recall_by_step: by_step,
    })
}

/// A figure with four decimals, or a dash.
fn opt(x: Option<f64>) -> String {
    x.map_or("—".to_string(), |v| format!("{v:.4}"))
}

fn print_table(results: &[EvalResult]) {
    println!(
        "| policy | ppl | top-1 agreement | KL | mass | mass ratio | recall | keys attended | search ms | attention ms (global + local) | rest ms (matmul) | total ms | build s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let l = &r.latency_ms;
        println!(
            "| {} | {:.4} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} ({:.2} + {:.2}) | {:.2} ({:.2}) | {:.2} | {:.1} |",
            r.policy,
            r.ppl,
            opt(r.top1_agreement),
            r.kl.map_or("—".to_string(), |v| format!("{v:.5}")),
            opt(r.mass),
            opt(r.mass_ratio),
            opt(r.recall),
            r.keys_attended
                .map_or("all".to_string(), |v| format!("{v:.0}")),
            l.search,
            l.attention,
            l.attention_global,
            l.attention_local,
            l.rest,
            l.matmul,
            l.total,
            r.build_s
        );
    }
}
