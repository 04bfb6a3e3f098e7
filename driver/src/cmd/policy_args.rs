//! Attention-policy arguments shared by `eval`, `passkey` and `demo`.

use clap::Args;
use qkindex::attention::Prune;
use qkindex::ReTopKParams;
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind, RestKind};

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
    /// Element type of the index's copy of the keys (exact-topk always scans f32).
    #[arg(long, value_enum, default_value_t = StoreType::F16)]
    pub store: StoreType,
    /// Left-out keys sampled per step and query head to estimate the softmax share of the keys
    /// top-k retrieval drops (0: plain top-k attention).
    #[arg(long, default_value_t = 0)]
    pub tail_samples: usize,
    /// Graph searches also start from this many keys the query head retrieved at the previous
    /// step (0: only the index's entry points).
    #[arg(long, default_value_t = 0)]
    pub step_seeds: usize,
    /// Skip the per-step scoring of every key (no mass and recall figures).
    #[arg(long)]
    pub no_measure: bool,
    /// Edge pruning of the AttentionIndex that `index-topk` builds.
    #[arg(long, value_enum, default_value_t = PruneArg::OcclusionFill)]
    pub prune: PruneArg,
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
            index: self.index,
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
            store: match self.store {
                StoreType::F16 => qkindex::Dtype::F16,
                StoreType::F32 => qkindex::Dtype::F32,
            },
            tail_samples: self.tail_samples,
            step_seeds: self.step_seeds,
            prune: self.prune.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StoreType {
    F16,
    F32,
}

/// [`Prune`] on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PruneArg {
    /// The best-ranked candidates (the library default).
    Top,
    /// Inner-product occlusion only.
    Occlusion,
    /// Occlusion, then the free slots filled with the best-ranked dropped candidates.
    OcclusionFill,
}

impl From<PruneArg> for Prune {
    fn from(p: PruneArg) -> Prune {
        match p {
            PruneArg::Top => Prune::Top,
            PruneArg::Occlusion => Prune::Occlusion,
            PruneArg::OcclusionFill => Prune::OcclusionFill,
        }
    }
}

/// The name on the command line (`top`, `occlusion`, `occlusion-fill`), as build-cache keys
/// spell it.
impl std::fmt::Display for PruneArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::ValueEnum;
        match self.to_possible_value() {
            Some(v) => f.write_str(v.get_name()),
            None => write!(f, "{self:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_names_are_the_command_line_names() {
        // Build-cache keys embed these names: `top` must stay `top`.
        assert_eq!(PruneArg::Top.to_string(), "top");
        assert_eq!(PruneArg::Occlusion.to_string(), "occlusion");
        assert_eq!(PruneArg::OcclusionFill.to_string(), "occlusion-fill");
        assert_eq!(Prune::from(PruneArg::OcclusionFill), Prune::OcclusionFill);
    }
}
