//! Policy configuration: which selector a decode step uses and its sizes (configuration only;
//! the selectors are built in [`super::selector::build`]).

use qkindex::{Patience, ReTopKParams, SearchParams};

use super::ids::Split;

/// How decode steps choose the keys they attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Every key (the reference).
    Full,
    /// The static set only: first `sink` + last `window` positions (StreamingLLM).
    Static,
    /// Static + the exact top-k of the rest (a scan).
    ExactTopk,
    /// Static + the top-k an index returns from the rest.
    IndexTopk,
    /// Static + the ReTopK selector over the rest (reuse the sets of similar past queries; the
    /// exact path is a scan, or `--retopk-exact index` the index of `--index`).
    Retopk,
    /// Static + Quest (Tang et al. 2024): pages of 16 rest keys ranked by an upper bound on
    /// q·k from each page's element-wise min and max; the keys of the top ⌊k/16⌋ pages.
    Quest,
    /// Static + InfLLM (Xiao et al. 2024): blocks of 128 rest keys, each represented by its 4
    /// keys most attended by the following queries; the keys of the top round(k/128) blocks
    /// (keys not yet in a full block are attended too).
    Infllm,
    /// Static + SnapKV (Li et al. 2024): per query head, the k rest keys the last 32 prompt
    /// queries attend most (avg-pooled, kernel 5), fixed at the end of the prefill; keys that
    /// leave the window are kept.
    Snapkv,
}

impl PolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Full => "full",
            PolicyKind::Static => "static",
            PolicyKind::ExactTopk => "exact-topk",
            PolicyKind::IndexTopk => "index-topk",
            PolicyKind::Retopk => "retopk",
            PolicyKind::Quest => "quest",
            PolicyKind::Infllm => "infllm",
            PolicyKind::Snapkv => "snapkv",
        }
    }

    /// True for the policies whose selectors build from the prefill's queries (the prefill
    /// must capture them): the indexes trained on them, ReTopK (primed with them), InfLLM
    /// (representative scores) and SnapKV (the observation window). `exact-topk` and `quest`
    /// read keys only.
    pub fn needs_prefill_queries(self) -> bool {
        matches!(
            self,
            PolicyKind::IndexTopk | PolicyKind::Retopk | PolicyKind::Infllm | PolicyKind::Snapkv
        )
    }

    /// True for the policies that select keys from the rest.
    pub fn retrieves(self) -> bool {
        !matches!(self, PolicyKind::Full | PolicyKind::Static)
    }
}

/// A policy and its sizes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PolicyConfig {
    pub kind: PolicyKind,
    /// Attention sinks: the first positions, always attended.
    pub sink: usize,
    /// Recent window: the last positions, always attended.
    pub window: usize,
    /// Keys retrieved from the rest per query head.
    pub k: usize,
    /// The index of `index-topk` (and of ReTopK's exact path with `retopk_index`).
    pub index: qkindex::IndexSpec,
    /// Graph search list size (`None`: the index default, raised to `k`).
    pub ef: Option<usize>,
    /// IVF lists probed (`None`: the index default).
    pub nprobe: Option<usize>,
    /// Also score every key each step (untimed) to report mass and recall.
    pub measure: bool,
    /// ReTopK's parameters (its `k` is the policy's `k`).
    pub retopk: ReTopKParams,
    /// ReTopK's exact path searches the index of `index` instead of scanning.
    pub retopk_index: bool,
    /// Layers that attend to every key (no index is built for them).
    pub dense_layers: Vec<usize>,
    /// Layers the model attends itself with a sliding window (Gemma 3's local layers): nothing
    /// to retrieve, so no selector is built and the policy is never called for them.
    /// [`Decoder::new`](crate::decode::Decoder::new) sets them from the model.
    pub local_layers: Vec<usize>,
    /// Element type of the index's key copy (`exact-topk` always scans f32).
    #[serde(serialize_with = "dtype_name")]
    pub store: qkindex::Dtype,
    /// Left-out keys of the rest sampled each step to estimate their share of the softmax
    /// ([`super::tail`]; 0: none, plain top-k attention).
    pub tail_samples: usize,
    /// Graph searches also start from this many of the keys the same query head retrieved at
    /// the previous step (consecutive decode queries are alike; 0: none).
    pub step_seeds: usize,
    /// Graph searches stop once their best `k` have not changed for this many expansions in a
    /// row, a count or a share of the head's `ef` (`None`: no early stop;
    /// [`SearchParams::patience`]).
    pub patience: Option<Patience>,
}

/// Seeds per query head from its previous step's top-k in the decode default: at ef 128 they
/// and [`DEFAULT_PATIENCE`] score 0.91-0.93x the keys at the same recall on the three models'
/// dumps (docs/DECODING.md §10, docs/bench/stop-rules/).
pub const DEFAULT_STEP_SEEDS: usize = 100;

/// Expansions without a change of the best k after which a graph search stops, in the decode
/// default: a quarter of the head's `ef` (32 at the default 128; 220 for a head whose auto-ef
/// asks 879, which a fixed 32 would cut short: docs/DECODING.md §10).
pub const DEFAULT_PATIENCE: Patience = Patience::PercentOfEf(25);

fn dtype_name<S: serde::Serializer>(d: &qkindex::Dtype, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.numpy_name())
}

impl PolicyConfig {
    /// Defaults of docs/DESIGN.md §2: sink 128, window 512, k 100, and the decode default index
    /// ([`qkindex::spec::DECODE_DEFAULT`], as the CLI's `--index`).
    pub fn new(kind: PolicyKind) -> Self {
        PolicyConfig {
            kind,
            sink: 128,
            window: 512,
            k: 100,
            index: qkindex::IndexSpec::decode_default(),
            ef: None,
            nprobe: None,
            measure: true,
            retopk: ReTopKParams::default(),
            retopk_index: false,
            dense_layers: Vec::new(),
            local_layers: Vec::new(),
            store: qkindex::Dtype::F16,
            tail_samples: 0,
            step_seeds: DEFAULT_STEP_SEEDS,
            patience: Some(DEFAULT_PATIENCE),
        }
    }

    /// The index searches' parameters: `ef` raised to `k`, `nprobe`, the patience, no seeds.
    pub fn search_params(&self) -> SearchParams {
        SearchParams {
            ef: self.ef.map(|ef| ef.max(self.k)),
            nprobe: self.nprobe,
            patience: self.patience,
            ..Default::default()
        }
    }

    /// Whether `layer` attends every key.
    pub fn is_dense(&self, layer: usize) -> bool {
        self.dense_layers.contains(&layer)
    }

    /// Whether the model attends `layer` with its own sliding window (no policy there).
    pub fn is_local(&self, layer: usize) -> bool {
        self.local_layers.contains(&layer)
    }

    /// Rejects sizes no decode after a prefill of `n` positions can serve: `k = 0`, and a
    /// retrieving policy whose rest would be empty.
    pub fn check(&self, n: usize) -> qkindex::Result<()> {
        if self.kind.retrieves() && Split::at(n, self.sink, self.window).rest().is_empty() {
            return Err(qkindex::Error::invalid_param(
                "context",
                n,
                format!(
                    "must exceed sink + window = {} for {}",
                    self.sink + self.window,
                    self.kind.name()
                ),
            ));
        }
        if self.k == 0 {
            return Err(qkindex::Error::invalid_param("k", 0, "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_builds_the_decode_default() {
        let cfg = PolicyConfig::new(PolicyKind::IndexTopk);
        assert_eq!(cfg.index, qkindex::IndexSpec::decode_default());
        assert_eq!(cfg.index.to_string(), qkindex::spec::DECODE_DEFAULT);
    }
}
