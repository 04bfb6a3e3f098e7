//! What `qkindex tasks` writes: the report (`tasks.json`), its Markdown tables (`tasks.md`,
//! also printed) and the curves of its plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use qkindex_driver::decode::Latency;
use qkindex_driver::retrieval::PolicyConfig;
use serde::Serialize;

use super::super::longctx::Haystack;
use super::score::Score;
use crate::plots::TaskPanel;

/// One generated answer.
#[derive(Clone, Debug, Serialize)]
pub struct TrialRecord {
    pub trial: usize,
    /// Tokens of the context and the question.
    pub prompt_tokens: usize,
    /// Depth of the (first) needle, a fraction of the haystack (`cwe`: none).
    pub depth: Option<f64>,
    pub expected: Vec<String>,
    pub generated: String,
    /// `string_match_all` × 100.
    pub score: f64,
}

/// One (task, length, policy, budget).
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub task: &'static str,
    pub length: usize,
    pub policy: &'static str,
    /// Keys retrieved beyond the static set (retrieving policies).
    pub budget: Option<usize>,
    /// `policy` or `policy@budget`.
    pub label: String,
    pub score: Score,
    /// Means over the trials: selector inner products per (step, layer, query head) selection,
    /// keys attended per selection (`full`: every key of the cache), ms per decode step, index
    /// build seconds.
    pub keys_scored: f64,
    pub keys_attended: f64,
    pub ms_per_token: f64,
    /// The mean per-token latency split (the same fields for every policy).
    pub latency_ms: Latency,
    pub build_s: f64,
    pub trials: Vec<TrialRecord>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub model: String,
    /// False in the files a run writes while it is under way (and leaves when it is stopped):
    /// they hold the (task, length) cells finished so far.
    pub complete: bool,
    pub haystack: Haystack,
    pub lengths: Vec<usize>,
    pub tasks: Vec<&'static str>,
    pub budgets: Vec<usize>,
    /// Trials per (task, length).
    pub trials: usize,
    pub seed: u64,
    pub answer_tokens: BTreeMap<&'static str, usize>,
    /// The question was decoded under each policy (else prefilled with the context).
    pub question_under_policy: bool,
    /// The policy settings shared by every run (`kind` and `k` vary per run).
    pub config: PolicyConfig,
    /// The run labels, in order.
    pub runs: Vec<String>,
    pub cells: Vec<Cell>,
}

impl Report {
    fn cell(&self, task: &str, length: usize, run: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.task == task && c.length == length && c.label == run)
    }

    /// Per length and run, the means over the tasks of the score and of the costs.
    fn averages(&self, length: usize, run: &str) -> Option<(f64, f64, f64, f64)> {
        let of: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.length == length && c.label == run)
            .collect();
        if of.is_empty() {
            return None;
        }
        let n = of.len() as f64;
        let mean = |f: fn(&Cell) -> f64| of.iter().map(|c| f(c)).sum::<f64>() / n;
        Some((
            mean(|c| c.score.mean),
            mean(|c| c.keys_scored),
            mean(|c| c.keys_attended),
            mean(|c| c.ms_per_token),
        ))
    }

    /// Per length: a score table (rows tasks and their average, columns runs, each cell the
    /// mean score and its 95 % interval) and a cost table (rows runs).
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if !self.complete {
            let _ = writeln!(
                s,
                "\n**Partial: the run is under way or was stopped; {} of {} (task, length) \
                 cells are in.**",
                self.cells.len() / self.runs.len().max(1),
                self.tasks.len() * self.lengths.len()
            );
        }
        for &length in &self.lengths {
            let _ = writeln!(
                s,
                "\n### {length} tokens ({}, {} haystack, {} trials per task)\n",
                self.model,
                self.haystack.name(),
                self.trials
            );
            let _ = writeln!(s, "| task | {} |", self.runs.join(" | "));
            let _ = writeln!(s, "|---|{}", "---|".repeat(self.runs.len()));
            for task in &self.tasks {
                let _ = write!(s, "| {task} |");
                for run in &self.runs {
                    match self.cell(task, length, run) {
                        Some(c) => {
                            let _ = write!(
                                s,
                                " {:.1} [{:.0}, {:.0}] |",
                                c.score.mean, c.score.lo, c.score.hi
                            );
                        }
                        None => s.push_str(" — |"),
                    }
                }
                s.push('\n');
            }
            s.push_str("| **average** |");
            for run in &self.runs {
                match self.averages(length, run) {
                    Some((score, ..)) => {
                        let _ = write!(s, " **{score:.1}** |");
                    }
                    None => s.push_str(" — |"),
                }
            }
            s.push_str("\n\n| run | keys scored / selection | keys attended / selection | ms / token |\n|---|---|---|---|\n");
            for run in &self.runs {
                if let Some((_, scored, attended, ms)) = self.averages(length, run) {
                    let _ = writeln!(s, "| {run} | {scored:.0} | {attended:.0} | {ms:.2} |");
                }
            }
        }
        s.push_str(
            "\nScores: RULER's string_match_all × 100, mean over trials [Wilson's 95 % interval \
             on mean / 100 over the trials]. Costs are means over the tasks; `full` \
             scores and attends every key.\n",
        );
        s.push_str(if self.question_under_policy {
            "The question was decoded one token per step under each policy, then the answer.\n"
        } else {
            "The question was prefilled with the context (exact attention); only the answer was \
             decoded under each policy.\n"
        });
        s
    }

    /// The plot's panels: per length, the average score over the tasks against keys scored per
    /// selection for each retrieving policy through its budgets, and the policies without a
    /// budget as reference levels.
    pub fn curves(&self) -> Vec<TaskPanel> {
        self.lengths
            .iter()
            .map(|&length| {
                let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
                let mut refs = Vec::new();
                for run in &self.runs {
                    let Some(first) = self.cells.iter().find(|c| &c.label == run) else {
                        continue;
                    };
                    let Some((score, scored, ..)) = self.averages(length, run) else {
                        continue;
                    };
                    if first.budget.is_none() {
                        refs.push((run.clone(), score));
                        continue;
                    }
                    let policy = first.policy.to_string();
                    match lines.iter_mut().find(|(p, _)| *p == policy) {
                        Some((_, pts)) => pts.push((scored, score)),
                        None => lines.push((policy, vec![(scored, score)])),
                    }
                }
                for (_, pts) in &mut lines {
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                }
                TaskPanel {
                    length,
                    lines,
                    refs,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::score::summarize;
    use super::*;
    use qkindex_driver::retrieval::PolicyKind;

    fn cell(
        task: &'static str,
        policy: &'static str,
        budget: Option<usize>,
        s: f64,
        scored: f64,
    ) -> Cell {
        Cell {
            task,
            length: 1024,
            policy,
            budget,
            label: budget.map_or(policy.to_string(), |b| format!("{policy}@{b}")),
            score: summarize(&[s]),
            keys_scored: scored,
            keys_attended: scored,
            ms_per_token: 1.0,
            latency_ms: Latency::default(),
            build_s: 0.0,
            trials: Vec::new(),
        }
    }

    #[test]
    fn tables_and_curves() {
        let r = Report {
            schema: "qkindex-tasks/1",
            model: "m".into(),
            complete: true,
            haystack: Haystack::Essay,
            lengths: vec![1024],
            tasks: vec!["niah-single", "cwe"],
            budgets: vec![10, 100],
            trials: 1,
            seed: 0,
            answer_tokens: BTreeMap::new(),
            question_under_policy: false,
            config: PolicyConfig::new(PolicyKind::Full),
            runs: vec![
                "full".into(),
                "exact-topk@10".into(),
                "exact-topk@100".into(),
            ],
            cells: vec![
                cell("niah-single", "full", None, 100.0, 1000.0),
                cell("cwe", "full", None, 50.0, 1000.0),
                cell("niah-single", "exact-topk", Some(100), 100.0, 900.0),
                cell("cwe", "exact-topk", Some(100), 0.0, 900.0),
                cell("niah-single", "exact-topk", Some(10), 0.0, 900.0),
                cell("cwe", "exact-topk", Some(10), 0.0, 900.0),
            ],
        };
        let md = r.markdown();
        assert!(
            md.contains("| task | full | exact-topk@10 | exact-topk@100 |"),
            "{md}"
        );
        assert!(
            md.contains("| **average** | **75.0** | **0.0** | **50.0** |"),
            "{md}"
        );
        assert!(md.contains("| exact-topk@100 | 900 | 900 | 1.00 |"), "{md}");
        assert!(!md.contains("Partial"), "{md}");
        let partial = Report {
            complete: false,
            ..r.clone()
        };
        assert!(
            partial
                .markdown()
                .contains("**Partial: the run is under way or was stopped; 2 of 2 (task, length)"),
            "{}",
            partial.markdown()
        );
        // The files a run writes as it goes: replaced whole, the flag telling which they are.
        let dir = std::env::temp_dir().join(format!("qkindex-tasks-save-{}", std::process::id()));
        for (report, complete) in [(&partial, false), (&r, true)] {
            crate::cmd::tasks::save(report, &report.markdown(), &dir).expect("save");
            let json: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join("tasks.json")).expect("tasks.json"),
            )
            .expect("valid JSON");
            assert_eq!(json["complete"], complete);
            assert_eq!(json["cells"].as_array().map(Vec::len), Some(6));
            let md = std::fs::read_to_string(dir.join("tasks.md")).expect("tasks.md");
            assert_eq!(md.contains("Partial"), !complete);
        }
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2, "temporary files left: {names:?}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        let c = r.curves();
        assert_eq!(c[0].refs, vec![("full".to_string(), 75.0)]);
        assert_eq!(
            c[0].lines,
            vec![("exact-topk".to_string(), vec![(900.0, 0.0), (900.0, 50.0)])]
        );
    }
}
