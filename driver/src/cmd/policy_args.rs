//! Attention-policy arguments shared by `eval`, `passkey` and `demo`.

use clap::Args;
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind, RestKind};

#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Attention policies, comma-separated (`full` is always run as the reference).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "full,static,exact-topk,index-topk"
    )]
    pub policy: Vec<PolicyKind>,
    /// Keys retrieved per query head from outside the static set.
    #[arg(long, default_value_t = 100)]
    pub k: usize,
    /// Attention sinks: the first positions, always attended.
    #[arg(long, default_value_t = 128)]
    pub sink: usize,
    /// Recent window: the last positions, always attended.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Index kind of `index-topk` (attention and flat insert keys that leave the window; the
    /// others keep their prefill index and scan later keys exactly).
    #[arg(long, value_enum, default_value_t = RestKind::Attention)]
    pub index: RestKind,
    /// Graph search list size [default: the index default, at least k].
    #[arg(long)]
    pub ef: Option<usize>,
    /// IVF lists probed [default: the index default].
    #[arg(long)]
    pub nprobe: Option<usize>,
    /// Skip the per-step scoring of every key (no mass and recall figures).
    #[arg(long)]
    pub no_measure: bool,
}

impl PolicyArgs {
    /// The policies to run, `full` first and once.
    pub fn kinds(&self) -> Vec<PolicyKind> {
        let mut v = vec![PolicyKind::Full];
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
            index: self.index,
            ef: self.ef,
            nprobe: self.nprobe,
            measure: !self.no_measure,
        }
    }
}
