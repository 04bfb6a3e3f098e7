//! Attention-policy arguments shared by `eval`, `passkey` and `demo`.

use clap::Args;
use qkindex::{Dtype, IndexSpec, Patience, ReTopKParams};
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind, DEFAULT_PATIENCE, DEFAULT_STEP_SEEDS};

#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Attention policies, comma-separated (`full` also runs first as the reference unless
    /// `--no-reference`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "full,static,exact-topk,index-topk"
    )]
    pub policy: Vec<PolicyKind>,
    /// Do not run `full` as a reference (no agreement or KL figures).
    #[arg(long)]
    pub no_reference: bool,
    /// Keys retrieved per query head from outside the static set.
    #[arg(long, default_value_t = 100)]
    pub k: usize,
    /// Attention sinks: the first positions, always attended.
    #[arg(long, default_value_t = 128)]
    pub sink: usize,
    /// Recent window: the last positions, always attended.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// The index of `index-topk`, as an index spec: a kind and its build parameters
    /// (`attention`, `attention:prune=top`, `flat`, `hnsw`, `ivf:nlist=256`, `robust-vamana`,
    /// ...). Attention and flat insert keys that leave the window; the others keep their
    /// prefill index and scan later keys exactly. The default builds each index from the
    /// group's prefill queries' causal top-k lists, 1.25 queries per key, a query whose list
    /// lies mostly far back taking its full list (`global-full=0.1`), and a group where 4 % or
    /// more of the lists did so built with full lists too, keeping the graph its held-out recent
    /// queries need fewer keys in (`far-check=0.04`): at 8K on SmolLM2 its builds take less
    /// than the prefill, at recall@100 within 0.005 of all queries' lists
    /// (docs/bench/build-cost/pass4/, pass5/, pass6/). Each index's default `ef` is the one
    /// its held-out recent queries need for recall@100 0.95 on every head (`auto-ef=0.95`;
    /// at 8K mostly 128, on Gemma 3 at 32K 226-445: docs/bench/tasks/gemma3-32k-auto-ef/).
    #[arg(long, default_value = qkindex::spec::DECODE_DEFAULT)]
    pub index: IndexSpec,
    /// Graph search list size [default: the index default, at least k].
    #[arg(long)]
    pub ef: Option<usize>,
    /// IVF lists probed [default: the index default].
    #[arg(long)]
    pub nprobe: Option<usize>,
    /// ReTopK: cached (query, top-k set) pairs per query head.
    #[arg(long, default_value_t = 32)]
    pub retopk_c: usize,
    /// ReTopK: most similar cached queries whose sets are reused.
    #[arg(long, default_value_t = 4)]
    pub retopk_r: usize,
    /// ReTopK: latest keys of the rest always scored.
    #[arg(long, default_value_t = 32)]
    pub retopk_w: usize,
    /// ReTopK: least cosine similarity for reuse (0.90 is the paper's quality setting).
    #[arg(long, default_value_t = 0.85)]
    pub tau: f32,
    /// ReTopK: every this many steps the exact path runs regardless.
    #[arg(long, default_value_t = 128)]
    pub refresh: usize,
    /// ReTopK: the exact path searches the `--index` index (attention or flat) instead of
    /// scanning, seeded with the recalled sets.
    #[arg(long)]
    pub retopk_index: bool,
    /// ReTopK: do not seed the exact path's graph search with the recalled sets.
    #[arg(long)]
    pub no_seed: bool,
    /// Layers that attend to every key under every policy (none by default).
    #[arg(long, value_delimiter = ',')]
    pub dense_layers: Vec<usize>,
    /// Element type of the index's copy of the keys, f16, f32 or i8 (int8 codes normalised per dimension, one scale per key); exact-topk always scans f32.
    #[arg(long, default_value_t = Dtype::F16)]
    pub store: Dtype,
    /// Left-out keys sampled per step and query head to estimate the softmax share of the keys
    /// top-k retrieval drops (0: plain top-k attention).
    #[arg(long, default_value_t = 0)]
    pub tail_samples: usize,
    /// Graph searches also start from this many keys the query head retrieved at the previous
    /// step (0: only the index's entry points; the default and its measurements:
    /// docs/DECODING.md §10).
    #[arg(long, default_value_t = DEFAULT_STEP_SEEDS)]
    pub step_seeds: usize,
    /// Graph searches stop once their best k have not changed for this many expansions in a
    /// row, the list of `ef` being the cap: a count (`32`), a percentage of the head's `ef`
    /// (`25%`), or `0` for no early stop (docs/DECODING.md §10).
    #[arg(long, default_value_t = PatienceArg(Some(DEFAULT_PATIENCE)))]
    pub patience: PatienceArg,
    /// Skip the per-step scoring of every key (no mass and recall figures).
    #[arg(long)]
    pub no_measure: bool,
}

/// `--patience`: `0` (off), a count or a percentage of `ef` ([`Patience`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PatienceArg(pub Option<Patience>);

impl std::str::FromStr for PatienceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "0" {
            return Ok(PatienceArg(None));
        }
        s.parse()
            .map(|p| PatienceArg(Some(p)))
            .map_err(|e: qkindex::Error| e.to_string())
    }
}

impl std::fmt::Display for PatienceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{p}"),
            None => write!(f, "0"),
        }
    }
}

impl PolicyArgs {
    /// The policies to run, `full` first and once (unless `--no-reference`).
    pub fn kinds(&self) -> Vec<PolicyKind> {
        let mut v = if self.no_reference {
            Vec::new()
        } else {
            vec![PolicyKind::Full]
        };
        for &p in &self.policy {
            if !v.contains(&p) {
                v.push(p);
            }
        }
        v
    }

    pub fn config(&self, kind: PolicyKind) -> PolicyConfig {
        PolicyConfig {
            kind,
            sink: self.sink,
            window: self.window,
            k: self.k,
            index: self.index.clone(),
            ef: self.ef,
            nprobe: self.nprobe,
            measure: !self.no_measure,
            retopk: ReTopKParams {
                c: self.retopk_c,
                r: self.retopk_r,
                w: self.retopk_w,
                tau: self.tau,
                refresh: self.refresh,
                k: self.k,
                seed_fallback: !self.no_seed,
            },
            retopk_index: self.retopk_index,
            dense_layers: self.dense_layers.clone(),
            local_layers: Vec::new(),
            store: self.store,
            tail_samples: self.tail_samples,
            step_seeds: self.step_seeds,
            patience: self.patience.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        policy: PolicyArgs,
    }

    /// The CLI's `--index` default, `PolicyConfig::new` and `qkindex.hf` build one preset, and
    /// the CLI's search defaults (seeds, patience) are `PolicyConfig::new`'s.
    #[test]
    fn the_index_default_is_the_decode_default() {
        let cli = Cli::try_parse_from(["qkindex"]).expect("defaults parse");
        assert_eq!(cli.policy.index, IndexSpec::decode_default());
        let cfg = cli.policy.config(PolicyKind::IndexTopk);
        let new = PolicyConfig::new(PolicyKind::IndexTopk);
        assert_eq!(cfg.index, new.index);
        assert_eq!(
            (cfg.step_seeds, cfg.patience),
            (new.step_seeds, new.patience)
        );
        assert_eq!(
            cfg.search_params().patience,
            Some(Patience::PercentOfEf(25))
        );
        let fixed = Cli::try_parse_from(["qkindex", "--patience", "32"]).expect("parse");
        let fixed = fixed.policy.config(PolicyKind::IndexTopk).search_params();
        assert_eq!(fixed.patience, Some(Patience::Expansions(32)));
        assert!(Cli::try_parse_from(["qkindex", "--patience", "0%"]).is_err());
        assert!(Cli::try_parse_from(["qkindex", "--patience", "many"]).is_err());
        let off = Cli::try_parse_from(["qkindex", "--patience", "0", "--step-seeds", "0"])
            .expect("parse");
        let off = off.policy.config(PolicyKind::IndexTopk);
        assert_eq!((off.step_seeds, off.search_params().patience), (0, None));
    }
}
