//! `qkindex tasks`: a RULER-style long-context suite (needle retrieval with one or several
//! keys and values, variable tracking, common-words extraction, passkey) under attention
//! policies. Per (task, length, trial) the context is prefilled once with exact attention;
//! then each policy (each retrieving one once per `--budgets` entry) decodes the question one
//! token per step and generates the answer greedily, as `passkey` does.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | arguments, the run loop, the per-run accumulation |
//! | `gen.rs` | the task generators (prompt text and expected strings) |
//! | `score.rs` | `string_match_all`, means and 95 % intervals |
//! | `report.rs` | `tasks.json`, the Markdown tables |

mod gen;
mod report;
mod score;
mod words;

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qkindex::synth::Rng;
use qkindex_driver::decode::{prefill_with, Latency};
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind};

use super::longctx::{ask, Haystack};
use super::model_args::ModelArgs;
use super::policy_args::PolicyArgs;
pub use gen::Task;
use report::{Cell, Report, TrialRecord};

#[derive(Debug, Args)]
pub struct TasksArgs {
    /// Tasks, comma-separated: niah-single, niah-multikey, niah-multivalue, niah-multiquery,
    /// vt, cwe, passkey.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "niah-single,niah-multikey,niah-multivalue,niah-multiquery,vt,cwe,passkey"
    )]
    pub tasks: Vec<Task>,
    /// Prompt lengths in tokens (context and question; the answer comes on top).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192")]
    pub lengths: Vec<usize>,
    /// Trials per (task, length); trial t of n puts its needle at depth (t + 0.5) / n.
    #[arg(long, default_value_t = 4)]
    pub trials: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The text the needles hide in: Paul Graham's essays (`pg-essays`, NIAH's haystack,
    /// fetched by scripts/get-text.sh when missing), the bundled license texts (`essay`, the
    /// default before issue 44: about 20K Gemma 3 tokens, cycled past that) or repeated filler
    /// sentences (`repeat`).
    #[arg(long, value_enum, default_value = "pg-essays")]
    pub haystack: Haystack,
    /// Keys retrieved per query head beyond the static set; each retrieving policy runs once
    /// per budget (`full` and `static` once).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub budgets: Vec<usize>,
    /// Feed the question one token per decode step under the policy (as `passkey` does), so
    /// that every token that must find the needle does so under the policy. By default the
    /// question is part of the prefill (exact attention) and only the answer is decoded under
    /// the policy, as sparse-decoding evaluations run, and as SnapKV needs (it chooses its keys
    /// with the prompt's last queries, which are then the question's).
    #[arg(long)]
    pub question_under_policy: bool,
    /// Write tasks.json, tasks.md and tasks.png/.svg here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One policy at one budget.
struct RunSpec {
    label: String,
    budget: Option<usize>,
    cfg: PolicyConfig,
}

/// The runs of `kinds`: retrieving ones once per budget (`k` and ReTopK's `k` set to it).
fn run_specs(policy: &PolicyArgs, kinds: &[PolicyKind], budgets: &[usize]) -> Vec<RunSpec> {
    let mut out = Vec::new();
    for &kind in kinds {
        if kind.retrieves() {
            for &b in budgets {
                let mut cfg = policy.config(kind);
                cfg.k = b;
                cfg.retopk.k = b;
                out.push(RunSpec {
                    label: format!("{}@{b}", kind.name()),
                    budget: Some(b),
                    cfg,
                });
            }
        } else {
            out.push(RunSpec {
                label: kind.name().to_string(),
                budget: None,
                cfg: policy.config(kind),
            });
        }
    }
    out
}

/// The report of `cells` (`complete`: every (task, length) of `args` is in it).
fn make_report(
    args: &TasksArgs,
    model: &str,
    specs: &[RunSpec],
    cells: Vec<Cell>,
    complete: bool,
) -> Report {
    Report {
        schema: "qkindex-tasks/1",
        model: model.to_string(),
        complete,
        haystack: args.haystack,
        lengths: args.lengths.clone(),
        tasks: args.tasks.iter().map(|t| t.name()).collect(),
        budgets: args.budgets.clone(),
        trials: args.trials,
        seed: args.seed,
        answer_tokens: args
            .tasks
            .iter()
            .map(|t| (t.name(), t.answer_tokens()))
            .collect(),
        question_under_policy: args.question_under_policy,
        config: args.policy.config(PolicyKind::Full),
        runs: specs.iter().map(|s| s.label.clone()).collect(),
        cells,
    }
}

/// Writes `tasks.json` and `tasks.md` into `dir`, each through a temporary file renamed over
/// the old one, so that a run stopped while writing never leaves a torn file.
fn save(report: &Report, md: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(report)?;
    for (name, text) in [("tasks.json", json.as_str()), ("tasks.md", md)] {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Sums over one run's trials.
#[derive(Default)]
struct Acc {
    trials: Vec<TrialRecord>,
    keys_scored: f64,
    keys_attended: f64,
    ms_per_token: f64,
    latency: Latency,
    build_s: f64,
}

pub fn run(args: TasksArgs, devices: &Devices) -> anyhow::Result<()> {
    if args.tasks.is_empty() || args.lengths.is_empty() || args.trials == 0 {
        anyhow::bail!("--tasks, --lengths and --trials must not be empty or 0");
    }
    if args.budgets.is_empty() || args.budgets.contains(&0) {
        anyhow::bail!("--budgets must be positive key counts (e.g. 100,1000)");
    }
    let kinds = args.policy.kinds();
    let specs = run_specs(&args.policy, &kinds, &args.budgets);
    for &length in &args.lengths {
        for s in &specs {
            s.cfg
                .check(length)
                .with_context(|| format!("length {length} under {}", s.label))?;
        }
    }
    let most = args
        .tasks
        .iter()
        .map(|t| t.answer_tokens())
        .max()
        .unwrap_or(0);
    let m = args.model.load(devices)?;
    let longest = args.lengths.iter().max().map_or(0, |&l| l + most);
    let m = args.model.fit(m, longest)?;
    let ctx_len = m.llama.cfg.context_length;
    for &length in &args.lengths {
        if length + most > ctx_len {
            anyhow::bail!(
                "length {length} + {most} answer tokens exceed the model's context of {ctx_len} \
                 (--rope-scaling linear:F or ntk:F raises it F times)"
            );
        }
    }
    let needs_q = kinds.iter().any(|k| k.needs_prefill_queries());
    let count = |s: &str| Ok(m.tokenizer.encode(s)?.len());
    let mut rng = Rng::new(args.seed);
    let total = args.lengths.len() * args.tasks.len() * args.trials;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(ProgressStyle::with_template(
        "{msg} {bar:30} {pos}/{len} trials [{elapsed}<{eta}]",
    )?);
    let mut cells = Vec::new();
    for &length in &args.lengths {
        for &task in &args.tasks {
            let mut accs: Vec<Acc> = specs.iter().map(|_| Acc::default()).collect();
            for t in 0..args.trials {
                bar.set_message(format!("{} @ {length}", task.name()));
                let depth = (t as f64 + 0.5) / args.trials as f64;
                let sample = gen::generate(task, args.haystack, length, depth, &mut rng, &count)
                    .with_context(|| format!("{} at length {length}", task.name()))?;
                let mut context = m.tokenizer.encode(&sample.context)?;
                let mut question = m.tokenizer.encode(&sample.question)?;
                if !args.question_under_policy {
                    context.append(&mut question);
                }
                let answer_tokens = task.answer_tokens();
                let positions = context.len() + question.len() + answer_tokens;
                if positions > ctx_len {
                    anyhow::bail!(
                        "{} at length {length}: {positions} positions exceed the model's {ctx_len}",
                        task.name()
                    );
                }
                let n = context.len();
                let pre = prefill_with(&m.llama, &context, n, needs_q, |d| {
                    bar.set_message(format!("{} @ {length}: prefill {d}/{n}", task.name()))
                })?;
                bar.set_message(format!("{} @ {length}", task.name()));
                for (spec, acc) in specs.iter().zip(&mut accs) {
                    let (text, dec) =
                        ask(&m, &pre, &spec.cfg, &question, answer_tokens, devices.knn())
                            .with_context(|| format!("{} under {}", task.name(), spec.label))?;
                    let steps = (question.len() + answer_tokens - 1) as f64;
                    let (scored, attended, build_s) = match dec.stats() {
                        Some(st) if st.selections > 0 => (
                            st.distance_computations as f64 / st.selections as f64,
                            st.keys_attended as f64 / st.selections as f64,
                            st.build_s,
                        ),
                        // Full attention scores and attends every key of the cache.
                        _ => {
                            let all = context.len() as f64 + (steps + 1.0) / 2.0;
                            (all, all, 0.0)
                        }
                    };
                    acc.keys_scored += scored;
                    acc.keys_attended += attended;
                    acc.ms_per_token += dec.latency().total;
                    acc.latency = acc.latency.plus(&dec.latency());
                    acc.build_s += build_s;
                    let score = score::string_match_all(&text, &sample.expected);
                    // One line per answer (the bar is hidden when stderr is not a terminal).
                    bar.suspend(|| {
                        eprintln!(
                            "{} @ {length} trial {t} depth {depth:.2} {:<16} score {score:>5.1} {:?}",
                            task.name(),
                            spec.label,
                            text.trim()
                        )
                    });
                    acc.trials.push(TrialRecord {
                        trial: t,
                        prompt_tokens: context.len() + question.len(),
                        depth: sample.depth,
                        expected: sample.expected.clone(),
                        generated: text,
                        score,
                    });
                }
                bar.inc(1);
            }
            for (spec, acc) in specs.iter().zip(accs) {
                let n = acc.trials.len().max(1) as f64;
                let scores: Vec<f64> = acc.trials.iter().map(|r| r.score).collect();
                cells.push(Cell {
                    task: task.name(),
                    length,
                    policy: spec.cfg.kind.name(),
                    budget: spec.budget,
                    label: spec.label.clone(),
                    score: score::summarize(&scores),
                    keys_scored: acc.keys_scored / n,
                    keys_attended: acc.keys_attended / n,
                    ms_per_token: acc.ms_per_token / n,
                    latency_ms: acc.latency.scaled(1.0 / n),
                    build_s: acc.build_s / n,
                    trials: acc.trials,
                });
            }
            // A long run keeps what it has measured: the finished (task, length) cells are
            // written after each one, marked incomplete, so a stopped run loses one cell at most.
            if let Some(dir) = &args.out {
                let partial = make_report(&args, &m.name, &specs, cells.clone(), false);
                let md = partial.markdown();
                bar.suspend(|| save(&partial, &md, dir))?;
            }
        }
    }
    bar.finish_and_clear();
    let report = make_report(&args, &m.name, &specs, cells, true);
    let md = report.markdown();
    print!("{md}");
    if let Some(dir) = &args.out {
        save(&report, &md, dir)?;
        let plotted = crate::plots::write_tasks(&report.curves(), dir)?;
        eprintln!(
            "wrote {} and {}",
            dir.join("tasks.json").display(),
            dir.join("tasks.md").display()
        );
        for p in plotted {
            eprintln!("wrote {}", p.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        policy: PolicyArgs,
    }

    #[test]
    fn retrieving_policies_run_once_per_budget() {
        let cli = Cli::parse_from(["x", "--policy", "full,static,exact-topk,retopk"]);
        let kinds = cli.policy.kinds();
        let specs = run_specs(&cli.policy, &kinds, &[100, 1000]);
        let labels: Vec<&str> = specs.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "full",
                "static",
                "exact-topk@100",
                "exact-topk@1000",
                "retopk@100",
                "retopk@1000"
            ]
        );
        assert_eq!((specs[3].cfg.k, specs[3].cfg.retopk.k), (1000, 1000));
        assert_eq!(specs[1].budget, None);
    }
}
