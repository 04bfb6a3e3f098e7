//! What the decode steps did, and the untimed measurement of a selection's recall and mass
//! against every key ([`measure`]).

use std::time::Duration;

use super::ids::{Pos, Split};
use qkindex_model::simd;

/// What the decode steps did, accumulated.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RetrievalStats {
    /// Decode positions run (forward calls of one token).
    pub steps: u64,
    /// Index upkeep (inserting keys that left the window) and selection, all layers.
    #[serde(skip)]
    pub search: Duration,
    /// Partial attentions and merges, all layers.
    #[serde(skip)]
    pub attention: Duration,
    /// The untimed measurement pass and the observers (excluded from every latency).
    #[serde(skip)]
    pub measure: Duration,
    /// Index building after the prefill, seconds.
    pub build_s: f64,
    /// Selector inner products over all (step, layer, query head).
    pub distance_computations: u64,
    /// One-time selector inner products of the builds, reported by the selectors whose
    /// selection is fixed at the prefill (SnapKV's vote); not in `distance_computations`.
    pub build_distance_computations: u64,
    /// (step, layer, query head) selections.
    pub selections: u64,
    /// Keys attended over all selections (static + retrieved).
    pub keys_attended: u64,
    /// Sums over measured selections: softmax mass of the attended keys (of all keys); that
    /// mass over the mass with the exact top-k in place of the retrieved keys; recall@k of the
    /// retrieved keys against the rest's exact top-k.
    pub mass_sum: f64,
    pub mass_ratio_sum: f64,
    pub recall_sum: f64,
    pub measured: u64,
    /// Mean recall over layers and heads, per decode step (measured runs with a rest only).
    pub step_recall: Vec<f64>,
    /// Per layer: the sum of measured masses and their count.
    pub layer_mass_sum: Vec<f64>,
    pub layer_measured: Vec<u64>,
    /// ReTopK: selections by path, keys scored exactly on reuse, cached-query similarities.
    pub retopk: Option<ReTopKCounts>,
    /// The current step's recall sum and count over the layers run so far.
    #[serde(skip)]
    step: (f64, u64),
}

/// What the ReTopK selector did, summed over (step, layer, query head). The `seeded_*`,
/// `unseeded_*` and `wider` fields come from [`super::probes::SeededProbe`] and stay zero
/// unless it observes the steps.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReTopKCounts {
    pub reuse: u64,
    pub low_similarity: u64,
    pub refresh: u64,
    pub empty_cache: u64,
    /// Keys scored on reuse selections.
    pub reuse_candidates: u64,
    /// Inner products of exact-path selections (the scan, or the seeded index search).
    pub exact_distance_computations: u64,
    pub similarity_computations: u64,
    /// On exact-path selections into a graph index, the same search without the recalled seeds
    /// (run untimed): inner products and hops with and without seeds, and recall against the
    /// exact top-k of both (measured runs).
    pub seeded_selections: u64,
    pub seeded_distance_computations: u64,
    pub unseeded_distance_computations: u64,
    pub seeded_hops: u64,
    pub unseeded_hops: u64,
    pub seeded_recall_sum: f64,
    pub unseeded_recall_sum: f64,
    /// The unseeded search again with a larger `ef` (× [`super::probes::WIDER_EF`]), to find
    /// the cost of the seeded search's recall without seeds.
    pub wider: Vec<WiderRun>,
}

/// Sums over the seeded selections of one unseeded comparison search with a larger `ef`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WiderRun {
    pub ef: usize,
    pub distance_computations: u64,
    pub hops: u64,
    pub recall_sum: f64,
}

impl ReTopKCounts {
    pub fn selections(&self) -> u64 {
        self.reuse + self.low_similarity + self.refresh + self.empty_cache
    }
    /// Share of selections that reused cached sets.
    pub fn reuse_ratio(&self) -> f64 {
        self.reuse as f64 / self.selections().max(1) as f64
    }
    pub(super) fn add(&mut self, o: &ReTopKCounts) {
        self.reuse += o.reuse;
        self.low_similarity += o.low_similarity;
        self.refresh += o.refresh;
        self.empty_cache += o.empty_cache;
        self.reuse_candidates += o.reuse_candidates;
        self.exact_distance_computations += o.exact_distance_computations;
        self.similarity_computations += o.similarity_computations;
        self.seeded_selections += o.seeded_selections;
        self.seeded_distance_computations += o.seeded_distance_computations;
        self.unseeded_distance_computations += o.unseeded_distance_computations;
        self.seeded_hops += o.seeded_hops;
        self.unseeded_hops += o.unseeded_hops;
        self.seeded_recall_sum += o.seeded_recall_sum;
        self.unseeded_recall_sum += o.unseeded_recall_sum;
        if self.wider.len() < o.wider.len() {
            self.wider.resize(o.wider.len(), WiderRun::default());
        }
        for (a, b) in self.wider.iter_mut().zip(&o.wider) {
            a.ef = b.ef;
            a.distance_computations += b.distance_computations;
            a.hops += b.hops;
            a.recall_sum += b.recall_sum;
        }
    }
}

impl RetrievalStats {
    /// Empty totals for `n_layers` layers, after a build of `build_s` seconds.
    pub(super) fn new(n_layers: usize, build_s: f64) -> Self {
        RetrievalStats {
            build_s,
            layer_mass_sum: vec![0.0; n_layers],
            layer_measured: vec![0; n_layers],
            ..Default::default()
        }
    }
    pub fn mass(&self) -> Option<f64> {
        (self.measured > 0).then(|| self.mass_sum / self.measured as f64)
    }
    pub fn mass_ratio(&self) -> Option<f64> {
        (self.measured > 0).then(|| self.mass_ratio_sum / self.measured as f64)
    }
    pub fn recall(&self) -> Option<f64> {
        (self.measured > 0).then(|| self.recall_sum / self.measured as f64)
    }
    /// Mean mass per layer (None for layers not measured, e.g. dense ones).
    pub fn mass_by_layer(&self) -> Vec<Option<f64>> {
        self.layer_mass_sum
            .iter()
            .zip(&self.layer_measured)
            .map(|(&s, &c)| (c > 0).then(|| s / c as f64))
            .collect()
    }
    /// Counts `m` in the current step's mean recall.
    pub(super) fn add_step_recall(&mut self, m: Measured) {
        self.step.0 += m.recall;
        self.step.1 += m.count;
    }

    /// After the last layer: one more step, and its mean recall.
    pub(super) fn end_step(&mut self) {
        self.steps += 1;
        if self.step.1 > 0 {
            self.step_recall.push(self.step.0 / self.step.1 as f64);
        }
        self.step = (0.0, 0);
    }

    /// Adds the measurements of one (layer, KV head) step.
    pub(super) fn add_measured(&mut self, layer: usize, m: Measured) {
        self.mass_sum += m.mass;
        self.mass_ratio_sum += m.mass_ratio;
        self.recall_sum += m.recall;
        self.measured += m.count;
        self.layer_mass_sum[layer] += m.mass;
        self.layer_measured[layer] += m.count;
    }
}

/// Sums of [`measure`] results.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct Measured {
    pub mass: f64,
    pub mass_ratio: f64,
    pub recall: f64,
    pub count: u64,
}

impl std::ops::AddAssign for Measured {
    fn add_assign(&mut self, o: Measured) {
        self.mass += o.mass;
        self.mass_ratio += o.mass_ratio;
        self.recall += o.recall;
        self.count += o.count;
    }
}

/// Mass, mass ratio and recall of the `selected` positions of one query `q` against the
/// scores of all `split.n` keys `k` (row-major `n × head_dim`); `kk` is the policy's `k`.
pub(super) fn measure(
    q: &[f32],
    k: &[f32],
    split: Split,
    selected: &[Pos],
    kk: usize,
    scale: f32,
) -> Measured {
    let hd = q.len();
    let s: Vec<f32> = (0..split.n)
        .map(|p| scale * simd::dot(q, &k[p * hd..(p + 1) * hd]))
        .collect();
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = s.iter().map(|&x| ((x - max) as f64).exp()).collect();
    let z: f64 = w.iter().sum();
    let static_mass: f64 = split.statics().map(|p| w[p]).sum();
    let found: f64 = selected.iter().map(|p| w[p.0]).sum();
    let mut rest: Vec<usize> = split.rest().collect();
    let take = kk.min(rest.len());
    if take < rest.len() {
        // Afterwards the first `take` hold the largest scores.
        rest.select_nth_unstable_by(take, |&a, &b| s[b].total_cmp(&s[a]));
    }
    let best = &rest[..take];
    let exact_mass: f64 = best.iter().map(|&p| w[p]).sum();
    let hits = selected.iter().filter(|p| best.contains(&p.0)).count();
    Measured {
        mass: (static_mass + found) / z,
        mass_ratio: (static_mass + found) / (static_mass + exact_mass),
        recall: if take > 0 {
            hits as f64 / take as f64
        } else {
            1.0
        },
        count: 1,
    }
}
