//! `qkindex passkey`: a five-digit number hidden at a depth of filler text; the model is asked to
//! repeat it. The filler, key and filler are prefilled (exact attention); the question is then
//! fed one token per decode step through the policy and the answer generated greedily through
//! it, so every token that must find the key does so under the policy.

use anyhow::Context;
use clap::Args;
use qkindex::synth::Rng;
use qkindex_driver::decode::prefill;
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::PolicyKind;
use qkindex_model::Model;
use serde::Serialize;

use super::longctx::{ask, fit, haystack_text, Haystack};
use super::model_args::PolicyRunArgs;

pub const HEAD: &str = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.\n";
pub const QUESTION: &str = "\nWhat is the pass key? The pass key is";
/// Tokens generated for the answer.
pub const ANSWER_TOKENS: usize = 6;

#[derive(Debug, Args)]
pub struct PasskeyArgs {
    /// Prompt lengths in tokens (approximate: whole filler sentences).
    #[arg(long, value_delimiter = ',', default_value = "2048,4096,8000")]
    pub lengths: Vec<usize>,
    /// Depths of the key, percent of the filler.
    #[arg(long, value_delimiter = ',', default_value = "10,30,50,70,90")]
    pub depths: Vec<usize>,
    /// Trials (different keys) per length and depth.
    #[arg(long, default_value_t = 1)]
    pub trials: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub run: PolicyRunArgs,
}

#[derive(Debug, Serialize)]
struct Trial {
    length: usize,
    depth: usize,
    key: String,
    /// Per policy: (name, answer text, success).
    answers: Vec<(String, String, bool)>,
    /// Per policy that retrieves (measured runs): how well the selections of the question and
    /// answer steps matched the exact top-k of the rest.
    retrieval: Vec<TrialRetrieval>,
}

/// Means over one trial's (step, layer, query head) selections.
#[derive(Debug, Serialize)]
struct TrialRetrieval {
    policy: String,
    recall: f64,
    mass_ratio: f64,
    /// Selector inner products per selection, over the keys of the rest after the prefill.
    scanned: f64,
}

#[derive(Debug, Serialize)]
struct Summary {
    policy: String,
    successes: usize,
    trials: usize,
    rate: f64,
    /// Per length: (length, successes, trials).
    by_length: Vec<(usize, usize, usize)>,
    /// Means over the trials of [`TrialRetrieval`] (policies that retrieve, measured runs).
    recall: Option<f64>,
    mass_ratio: Option<f64>,
    scanned: Option<f64>,
}

pub fn run(args: PasskeyArgs, devices: &Devices) -> anyhow::Result<()> {
    let m = args.run.model.load(devices)?;
    // The longest prompt plus its answer: the default RoPE scaling past the trained context.
    let longest = args.lengths.iter().max().map_or(0, |&l| l + ANSWER_TOKENS);
    let m = args.run.model.fit(m, longest)?;
    if args.depths.iter().any(|&d| d > 100) {
        anyhow::bail!("--depths are percentages (0..=100)");
    }
    let kinds = args.run.policy.kinds();
    let needs_q = kinds.iter().any(|k| k.needs_prefill_queries());
    let mut rng = Rng::new(args.seed);
    let mut trials = Vec::new();
    for &length in &args.lengths {
        for &depth in &args.depths {
            for _ in 0..args.trials {
                let key = format!("{}", 10000 + rng.below(90000));
                let (context, question) = prompt(&m, length, depth, &key)?;
                let total = context.len() + question.len() + ANSWER_TOKENS;
                if total > m.llama.cfg.context_length {
                    anyhow::bail!(
                        "length {length}: {total} positions exceed the model's {}",
                        m.llama.cfg.context_length
                    );
                }
                let pre = prefill(&m.llama, &context, context.len(), needs_q)?;
                let mut answers = Vec::new();
                let mut retrieval = Vec::new();
                for &kind in &kinds {
                    let cfg = args.run.policy.config(kind);
                    let (text, dec) = ask(&m, &pre, &cfg, &question, ANSWER_TOKENS, devices.knn())?;
                    if let Some(r) = dec.retrieval() {
                        let st = &r.stats;
                        if let (Some(recall), Some(mass_ratio)) = (st.recall(), st.mass_ratio()) {
                            let rest = context
                                .len()
                                .saturating_sub(r.config().sink + r.config().window);
                            retrieval.push(TrialRetrieval {
                                policy: kind.name().to_string(),
                                recall,
                                mass_ratio,
                                scanned: st.distance_computations as f64
                                    / (st.selections.max(1) as f64 * rest.max(1) as f64),
                            });
                        }
                    }
                    let ok = text.contains(&key);
                    eprintln!(
                        "length {length} ({} tokens) depth {depth}% key {key} {:<11} {} {:?}",
                        context.len() + question.len(),
                        kind.name(),
                        if ok { "ok  " } else { "FAIL" },
                        text.trim()
                    );
                    answers.push((kind.name().to_string(), text, ok));
                }
                trials.push(Trial {
                    length,
                    depth,
                    key,
                    answers,
                    retrieval,
                });
            }
        }
    }
    let summaries: Vec<Summary> = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let by_length = args
                .lengths
                .iter()
                .map(|&len| {
                    let of_len: Vec<&Trial> = trials.iter().filter(|t| t.length == len).collect();
                    let ok = of_len.iter().filter(|t| t.answers[i].2).count();
                    (len, ok, of_len.len())
                })
                .collect();
            let successes = trials.iter().filter(|t| t.answers[i].2).count();
            let of_policy: Vec<&TrialRetrieval> = trials
                .iter()
                .flat_map(|t| t.retrieval.iter().filter(|r| r.policy == kind.name()))
                .collect();
            let mean = |f: fn(&TrialRetrieval) -> f64| {
                (!of_policy.is_empty())
                    .then(|| of_policy.iter().map(|r| f(r)).sum::<f64>() / of_policy.len() as f64)
            };
            Summary {
                policy: kind.name().to_string(),
                successes,
                trials: trials.len(),
                rate: successes as f64 / trials.len().max(1) as f64,
                by_length,
                recall: mean(|r| r.recall),
                mass_ratio: mean(|r| r.mass_ratio),
                scanned: mean(|r| r.scanned),
            }
        })
        .collect();
    print!("| policy |");
    for len in &args.lengths {
        print!(" {len} tokens |");
    }
    println!(" all | recall@k | mass ratio | scanned |");
    println!("|---|{}---|---|---|---|", "---|".repeat(args.lengths.len()));
    for s in &summaries {
        print!("| {} |", s.policy);
        for (_, ok, n) in &s.by_length {
            print!(" {ok}/{n} |");
        }
        print!(" {}/{} ({:.0}%) |", s.successes, s.trials, 100.0 * s.rate);
        let cell = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{x:.4}"));
        println!(
            " {} | {} | {} |",
            cell(s.recall),
            cell(s.mass_ratio),
            cell(s.scanned)
        );
    }
    if let Some(path) = &args.run.json {
        let json = serde_json::json!({
            "schema": "qkindex-passkey/1",
            "config": args.run.policy.config(PolicyKind::IndexTopk),
            "summary": summaries,
            "trials": trials,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The prefilled part (head, filler with the key sentence at `depth`%, filler) and the question,
/// as tokens; the filler is repeated to bring the whole to about `length` tokens.
fn prompt(
    m: &Model,
    length: usize,
    depth: usize,
    key: &str,
) -> anyhow::Result<(Vec<u32>, Vec<u32>)> {
    let question = m.tokenizer.encode(QUESTION)?;
    let needle = passkey_needle(key);
    let units = Haystack::Repeat.units()?;
    let depth = [(depth as f64 / 100.0, needle)];
    let count = |s: &str| Ok(m.tokenizer.encode(s)?.len() + question.len());
    let (_, text) = fit(
        length,
        |n| format!("{HEAD}{}", haystack_text(&units, n, &depth)),
        &count,
    )?;
    Ok((m.tokenizer.encode(&text)?, question))
}

/// The sentence that hides the pass key.
pub fn passkey_needle(key: &str) -> String {
    format!("The pass key is {key}. Remember it. {key} is the pass key. ")
}
