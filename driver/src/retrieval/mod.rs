//! Retrieval attention for decode steps (DESIGN.md §2): per query head, a static set `S` (the
//! first `sink` positions and the last `window`) is attended exactly; a selector picks `Ω`, `k`
//! keys from the rest `R` (positions `sink..n − window`); the two parts are merged exactly
//! ([`softmax::Partial`]).
//!
//! | file | job |
//! |---|---|
//! | `softmax.rs` | partial attention over a set of positions; the exact merge |
//! | `rest.rs` | the index over one KV head's rest (any kind; insertion or an exact tail) |
//! | `mod.rs` | policies, per-head state, the decode hook, statistics |
//!
//! State is per layer and KV head: one index over that head's rest, shared by the query heads
//! that read it (built from all their prefill queries, as the benchmarks measure it). When a key
//! leaves the window it is inserted into the index, guided by the decode query of the group that
//! scored it highest while it was in the window (the query-aware insertion of
//! `qkindex::AttentionIndex::insert`).

pub mod rest;
pub mod softmax;
pub mod tail;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use qkindex::{ReTopK, ReTopKParams, Scratch, SearchOutput, SearchParams, StepPath};
use rayon::prelude::*;

use crate::model::{simd, Config, DecodeAttention, KvCache, ModelError, StaticPartFn};

/// The attention shape a [`Retrieval`] serves.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl Shape {
    pub fn of(c: &Config) -> Self {
        Shape {
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        }
    }
}

/// Keys of (layer, KV head) from a model's cache, as [`Retrieval::new`] takes them.
pub fn cache_keys(cache: &KvCache, head_dim: usize) -> impl Fn(usize, usize) -> Vec<f32> + '_ {
    move |layer, g| cache.keys(layer, g, head_dim).to_vec()
}
pub use rest::RestIndex;
use softmax::Partial;
use tail::{tail_part, TailScratch};

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
}

impl PolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Full => "full",
            PolicyKind::Static => "static",
            PolicyKind::ExactTopk => "exact-topk",
            PolicyKind::IndexTopk => "index-topk",
            PolicyKind::Retopk => "retopk",
        }
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
    /// Element type of the index's key copy (`exact-topk` always scans f32).
    #[serde(serialize_with = "dtype_name")]
    pub store: qkindex::Dtype,
    /// Left-out keys of the rest sampled each step to estimate their share of the softmax
    /// ([`tail`]; 0: none, plain top-k attention).
    pub tail_samples: usize,
    /// Graph searches also start from this many of the keys the same query head retrieved at
    /// the previous step (consecutive decode queries are alike; 0: none).
    pub step_seeds: usize,
}

fn dtype_name<S: serde::Serializer>(d: &qkindex::Dtype, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.numpy_name())
}

impl PolicyConfig {
    /// Defaults of DESIGN.md §2: sink 128, window 512, k 100, AttentionIndex.
    pub fn new(kind: PolicyKind) -> Self {
        PolicyConfig {
            kind,
            sink: 128,
            window: 512,
            k: 100,
            index: qkindex::IndexSpec::Attention(qkindex::AttentionParams::default()),
            ef: None,
            nprobe: None,
            measure: true,
            retopk: ReTopKParams::default(),
            retopk_index: false,
            dense_layers: Vec::new(),
            store: qkindex::Dtype::F16,
            tail_samples: 0,
            step_seeds: 0,
        }
    }

    fn rest_kind(&self) -> Option<qkindex::IndexSpec> {
        match self.kind {
            PolicyKind::Full | PolicyKind::Static => None,
            PolicyKind::ExactTopk => Some(qkindex::IndexSpec::Flat),
            PolicyKind::IndexTopk => Some(self.index.clone()),
            PolicyKind::Retopk if self.retopk_index => Some(self.index.clone()),
            PolicyKind::Retopk => Some(qkindex::IndexSpec::Flat),
        }
    }
}

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
    /// The untimed measurement pass (excluded from every latency).
    #[serde(skip)]
    pub measure: Duration,
    /// Index building after the prefill, seconds.
    pub build_s: f64,
    /// Selector inner products over all (step, layer, query head).
    pub distance_computations: u64,
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
}

/// What the ReTopK selector did, summed over (step, layer, query head).
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
    /// The unseeded search again with a larger `ef` (× [`WIDER_EF`]), to find the cost of the
    /// seeded search's recall without seeds.
    pub wider: Vec<WiderRun>,
}

/// `ef` factors of the unseeded comparison searches beyond the seeded search's own `ef`.
pub const WIDER_EF: [f64; 3] = [1.25, 1.5, 2.0];

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
    fn add(&mut self, o: &ReTopKCounts) {
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
}

/// A key beyond the sinks that is not in the index yet, with the best query seen for it.
#[derive(Clone, Debug)]
struct Guide {
    score: f32,
    query: Vec<f32>,
}

/// One KV head of one layer.
struct HeadState {
    rest: Option<RestIndex>,
    /// Keys at positions `sink + rest.len()..` (only tracked for AttentionIndex).
    guides: VecDeque<Guide>,
    scratch: Scratch,
    found: SearchOutput,
    /// Per query head of the group: the positions retrieved this step.
    selected: Vec<Vec<usize>>,
    scores: Vec<f32>,
    tail: TailScratch,
    /// Keys sampled by the tail estimate this step.
    tail_keys: u64,
    /// Per query head: the rest ids retrieved at the previous step (`step_seeds`).
    prev: Vec<Vec<u32>>,
    /// This step's seeds (`step_seeds`; a reused buffer).
    seeds: Vec<u32>,
    dc: u64,
    measure: Measured,
    /// ReTopK selectors, one per query head of the group (retopk only).
    selectors: Vec<ReTopK>,
    counts: ReTopKCounts,
    /// Per query head: positions found by the unseeded comparison searches on seeded exact
    /// steps (the same `ef`, then each of [`WIDER_EF`]).
    unseeded: Vec<Option<Vec<Vec<usize>>>>,
}

#[derive(Default, Clone, Copy)]
struct Measured {
    mass: f64,
    mass_ratio: f64,
    recall: f64,
    count: u64,
}

/// The decode hook of a policy other than `full`: per layer and KV head, the rest index and
/// its window bookkeeping.
pub struct Retrieval {
    cfg: PolicyConfig,
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    n_layers: usize,
    layers: Vec<Vec<HeadState>>,
    params: SearchParams,
    pub stats: RetrievalStats,
    step_recall: (f64, u64),
}

impl Retrieval {
    /// State for decoding after a prefill of `n` positions: `keys_of(layer, g)` gives at least
    /// the first `n` keys of that layer and KV head (row-major), `prefill_q[layer]` the queries (row-major `n_prefill × (n_heads · head_dim)`; may be empty for policies
    /// without an index). `progress` is called after each (layer, KV head) build.
    pub fn new(
        cfg: PolicyConfig,
        model: Shape,
        keys_of: &dyn Fn(usize, usize) -> Vec<f32>,
        n: usize,
        prefill_q: &[Vec<f32>],
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        let t0 = Instant::now();
        let (n_heads, n_kv, hd) = (model.n_heads, model.n_kv_heads, model.head_dim);
        let group = n_heads / n_kv;
        let rest_end = n.saturating_sub(cfg.window).max(cfg.sink.min(n));
        let kind = cfg.rest_kind();
        if kind.is_some() && rest_end <= cfg.sink {
            return Err(qkindex::Error::invalid_param(
                "context",
                n,
                format!(
                    "must exceed sink + window = {} for {}",
                    cfg.sink + cfg.window,
                    cfg.kind.name()
                ),
            )
            .into());
        }
        if cfg.k == 0 {
            return Err(qkindex::Error::invalid_param("k", 0, "must be at least 1").into());
        }
        let track_guides = matches!(kind, Some(qkindex::IndexSpec::Attention(_)));
        let width = n_heads * hd;
        let mut layers = Vec::with_capacity(model.n_layers);
        for layer in 0..model.n_layers {
            let mut heads = Vec::with_capacity(n_kv);
            for g in 0..n_kv {
                let keys_owned = keys_of(layer, g);
                let keys = &keys_owned[..n * hd];
                let dense = cfg.dense_layers.contains(&layer);
                let rest = match kind.as_ref().filter(|_| !dense) {
                    None => None,
                    Some(kind) => {
                        let q = prefill_q
                            .get(layer)
                            .filter(|q| q.len() == n * width)
                            .ok_or_else(|| {
                                qkindex::Error::invalid_param(
                                    "prefill queries",
                                    layer,
                                    "missing or of the wrong size for this layer",
                                )
                            })?;
                        let mut train = Vec::with_capacity(group * n * hd);
                        for j in 0..group {
                            let h = g * group + j;
                            for p in 0..n {
                                train.extend_from_slice(&q[p * width + h * hd..][..hd]);
                            }
                        }
                        let rest_keys = keys[cfg.sink * hd..rest_end * hd].to_vec();
                        let dtype = if cfg.kind == PolicyKind::ExactTopk {
                            qkindex::Dtype::F32
                        } else {
                            cfg.store
                        };
                        let knn = crate::knn::backend().map_err(qkindex::Error::from)?;
                        Some(RestIndex::build(kind, rest_keys, hd, &train, dtype, knn)?)
                    }
                };
                let mut guides = VecDeque::new();
                if track_guides && !dense {
                    // Each window key's guide: the prefill query (at or after it) of the group
                    // with the largest q·k/|q|; query norms computed once.
                    let q = &prefill_q[layer];
                    let span: Vec<(&[f32], f32)> = (rest_end..n)
                        .flat_map(|t| {
                            (0..group).map(move |j| &q[t * width + (g * group + j) * hd..][..hd])
                        })
                        .map(|qh| (qh, inv_norm(qh)))
                        .collect();
                    for p in rest_end..n {
                        let key = &keys[p * hd..(p + 1) * hd];
                        guides.push_back(best_guide(key, &span[(p - rest_end) * group..]));
                    }
                }
                let mut selectors = Vec::new();
                if cfg.kind == PolicyKind::Retopk && !dense {
                    let keys = rest.as_ref().and_then(RestIndex::keys).ok_or_else(|| {
                        qkindex::Error::invalid_param(
                            "index",
                            cfg.index.to_string(),
                            "the ReTopK exact path takes attention or flat",
                        )
                    })?;
                    let params = ReTopKParams {
                        k: cfg.k,
                        ..cfg.retopk.clone()
                    };
                    // Primed with the head's last prefill queries and their causal exact top-K.
                    let q = &prefill_q[layer];
                    let first = n.saturating_sub(params.c);
                    for j in 0..group {
                        let h = g * group + j;
                        let mut rt = ReTopK::new(params.clone(), hd)?;
                        let mut queries = Vec::with_capacity(params.c * hd);
                        let mut visible = Vec::with_capacity(params.c);
                        for p in first..n {
                            queries.extend_from_slice(&q[p * width + h * hd..][..hd]);
                            visible.push((p + 1).saturating_sub(cfg.sink).min(keys.len()));
                        }
                        rt.prime(&queries, &visible, keys)?;
                        selectors.push(rt);
                    }
                }
                heads.push(HeadState {
                    selectors,
                    counts: ReTopKCounts::default(),
                    unseeded: vec![None; group],
                    scratch: Scratch::new(rest.as_ref().map_or(0, RestIndex::len)),
                    rest,
                    guides,
                    found: SearchOutput::default(),
                    selected: vec![Vec::new(); group],
                    scores: Vec::new(),
                    tail: TailScratch::default(),
                    tail_keys: 0,
                    prev: vec![Vec::new(); group],
                    seeds: Vec::new(),
                    dc: 0,
                    measure: Measured::default(),
                });
                progress(layer, g);
            }
            layers.push(heads);
        }
        let params = SearchParams {
            ef: cfg.ef.map(|ef| ef.max(cfg.k)),
            nprobe: cfg.nprobe,
            ..Default::default()
        };
        Ok(Retrieval {
            stats: RetrievalStats {
                build_s: t0.elapsed().as_secs_f64(),
                layer_mass_sum: vec![0.0; model.n_layers],
                layer_measured: vec![0; model.n_layers],
                ..Default::default()
            },
            cfg,
            n_heads,
            n_kv,
            hd,
            n_layers: model.n_layers,
            layers,
            params,
            step_recall: (0.0, 0),
        })
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// Keys under the rest index of `layer`, KV head `g` (0 without one).
    pub fn rest_len(&self, layer: usize, g: usize) -> usize {
        self.layers[layer][g]
            .rest
            .as_ref()
            .map_or(0, RestIndex::len)
    }
}

/// The query (of those given with their inverse norms) with the largest `q·k / |q|`, and that
/// score.
fn best_guide(key: &[f32], queries: &[(&[f32], f32)]) -> Guide {
    let mut best = Guide {
        score: f32::NEG_INFINITY,
        query: Vec::new(),
    };
    for &(q, inv) in queries {
        let s = simd::dot(q, key) * inv;
        if s > best.score {
            best.score = s;
            best.query = q.to_vec();
        }
    }
    best
}

/// `1 / |q|` (finite for a zero query).
fn inv_norm(q: &[f32]) -> f32 {
    1.0 / simd::dot(q, q).sqrt().max(f32::MIN_POSITIVE)
}

impl std::fmt::Debug for Retrieval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retrieval")
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl DecodeAttention for Retrieval {
    fn attend(
        &mut self,
        layer: usize,
        pos: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        capacity: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.attend_with(layer, pos, q, k, v, capacity, None, out)
    }

    fn static_set(&self, layer: usize, pos: usize) -> Option<(usize, usize)> {
        if self.cfg.dense_layers.contains(&layer) {
            return None;
        }
        let n = pos + 1;
        let (sink, window) = (self.cfg.sink, self.cfg.window);
        Some((sink, n.saturating_sub(window).max(sink.min(n))))
    }

    fn attend_split(
        &mut self,
        layer: usize,
        pos: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        capacity: usize,
        static_part: &mut StaticPartFn<'_>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.attend_with(layer, pos, q, k, v, capacity, Some(static_part), out)
    }
}

impl Retrieval {
    /// The decode step of one layer. With `static_part`, the part over the static positions
    /// (sink and window) comes from it — computed elsewhere while this searches — instead of
    /// being attended here; everything else is the same.
    #[allow(clippy::too_many_arguments)]
    fn attend_with(
        &mut self,
        layer: usize,
        pos: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        capacity: usize,
        static_part: Option<&mut StaticPartFn<'_>>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let hd = self.hd;
        let group = self.n_heads / self.n_kv;
        let n = pos + 1;
        let (sink, window, kk) = (self.cfg.sink, self.cfg.window, self.cfg.k);
        let rest_end = n.saturating_sub(window).max(sink.min(n));
        let scale = 1.0 / (hd as f32).sqrt();
        let block = capacity * hd;
        if self.cfg.dense_layers.contains(&layer) {
            let t1 = Instant::now();
            let heads = &mut self.layers[layer];
            heads
                .par_iter_mut()
                .zip(out.par_chunks_mut(group * hd))
                .enumerate()
                .for_each(|(g, (st, og))| {
                    let kh = &k[g * block..g * block + n * hd];
                    let vh = &v[g * block..g * block + n * hd];
                    for (j, oj) in og.chunks_exact_mut(hd).enumerate() {
                        let qh = &q[(g * group + j) * hd..][..hd];
                        let all = Partial::over(qh, kh, vh, 0..n, scale, &mut st.scores);
                        Partial::merge(&[all], oj);
                    }
                });
            self.stats.attention += t1.elapsed();
            self.stats.keys_attended += (n * self.n_heads) as u64;
            self.stats.selections += self.n_heads as u64;
            self.end_layer(layer);
            return Ok(());
        }
        let params = &self.params;
        let step_seeds = self.cfg.step_seeds;
        let heads = &mut self.layers[layer];

        // Upkeep and selection.
        let t0 = Instant::now();
        heads
            .par_iter_mut()
            .enumerate()
            .try_for_each(|(g, st)| -> Result<(), ModelError> {
                let kh = &k[g * block..g * block + n * hd];
                let qg = &q[g * group * hd..(g + 1) * group * hd];
                let Some(rest) = st.rest.as_mut() else {
                    return Ok(());
                };
                let tracking = matches!(rest, RestIndex::Attention(_));
                if tracking {
                    // Every key beyond the rest gets a guide slot (filled in the attention pass).
                    while sink + rest.len() + st.guides.len() < n {
                        st.guides.push_back(Guide {
                            score: f32::NEG_INFINITY,
                            query: Vec::new(),
                        });
                    }
                }
                while sink + rest.len() < rest_end {
                    let p = sink + rest.len();
                    let guide = if tracking {
                        st.guides.pop_front().map(|g| g.query).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    rest.insert(&kh[p * hd..(p + 1) * hd], &guide, &mut st.scratch)?;
                }
                for (j, qh) in qg.chunks_exact(hd).enumerate() {
                    if let Some(rt) = st.selectors.get_mut(j) {
                        let keys = rest.keys().ok_or_else(|| {
                            qkindex::Error::invalid_param("index", "frozen", "no ReTopK exact path")
                        })?;
                        let exact = rest.as_ann().ok_or_else(|| {
                            qkindex::Error::invalid_param("index", "frozen", "no ReTopK exact path")
                        })?;
                        let step =
                            rt.step(qh, keys, exact, params, &mut st.scratch, &mut st.found)?;
                        let c = &mut st.counts;
                        c.similarity_computations += step.similarity_computations;
                        match step.path {
                            StepPath::Reuse => {
                                c.reuse += 1;
                                c.reuse_candidates += step.candidates as u64;
                            }
                            StepPath::LowSimilarity => c.low_similarity += 1,
                            StepPath::Refresh => c.refresh += 1,
                            StepPath::EmptyCache => c.empty_cache += 1,
                        }
                        st.dc += step.search.distance_computations + step.similarity_computations;
                        st.unseeded[j] = None;
                        if step.path.is_exact() {
                            c.exact_distance_computations += step.search.distance_computations;
                            if !rt.last_seeds().is_empty()
                                && matches!(rest, RestIndex::Attention(_))
                            {
                                // The same search without the recalled seeds (untimed below).
                                c.seeded_selections += 1;
                                c.seeded_distance_computations += step.search.distance_computations;
                                c.seeded_hops += step.search.hops;
                                st.unseeded[j] = Some(Vec::new());
                            }
                        }
                    } else if step_seeds > 0 {
                        // Reuse the seed buffer: no allocation per search.
                        st.seeds.clear();
                        st.seeds.extend(st.prev[j].iter().take(step_seeds));
                        rest.search_seeded(
                            qh,
                            kk,
                            params,
                            &st.seeds,
                            &mut st.scratch,
                            &mut st.found,
                        )?;
                        st.dc += st.found.stats.distance_computations;
                        st.prev[j].clone_from(&st.found.ids);
                    } else {
                        rest.search(qh, kk, params, &mut st.scratch, &mut st.found)?;
                        st.dc += st.found.stats.distance_computations;
                    }
                    st.selected[j].clear();
                    st.selected[j].extend(st.found.ids.iter().map(|&id| sink + id as usize));
                }
                Ok(())
            })?;
        self.stats.search += t0.elapsed();

        // ReTopK's seeded fallbacks, searched again without seeds (excluded from the timings).
        let t_cmp = Instant::now();
        let mut compared = false;
        for (g, st) in heads.iter_mut().enumerate() {
            let Some(rest) = st.rest.as_mut() else {
                continue;
            };
            for j in 0..group {
                if st.unseeded[j].is_none() {
                    continue;
                }
                compared = true;
                let qh = &q[(g * group + j) * hd..][..hd];
                let mut out = SearchOutput::default();
                rest.search(qh, kk, params, &mut st.scratch, &mut out)?;
                st.counts.unseeded_distance_computations += out.stats.distance_computations;
                st.counts.unseeded_hops += out.stats.hops;
                let mut found = vec![out.ids.iter().map(|&id| sink + id as usize).collect()];
                let base_ef = params.ef.unwrap_or(kk.max(128));
                st.counts.wider.resize(WIDER_EF.len(), WiderRun::default());
                for (w, f) in st.counts.wider.iter_mut().zip(WIDER_EF) {
                    let wide = SearchParams {
                        ef: Some((base_ef as f64 * f).round() as usize),
                        ..*params
                    };
                    rest.search(qh, kk, &wide, &mut st.scratch, &mut out)?;
                    w.ef = wide.ef.unwrap_or(base_ef);
                    w.distance_computations += out.stats.distance_computations;
                    w.hops += out.stats.hops;
                    found.push(out.ids.iter().map(|&id| sink + id as usize).collect());
                }
                st.unseeded[j] = Some(found);
            }
        }
        if compared {
            self.stats.measure += t_cmp.elapsed();
        }

        // The static part computed elsewhere (it ran while this searched); the wait counts as
        // attention time.
        let t1 = Instant::now();
        let given = match static_part {
            Some(f) => {
                let parts = f()?;
                let want = self.n_heads;
                if parts.max.len() != want || parts.sum.len() != want || parts.o.len() != want * hd
                {
                    return Err(ModelError::Policy(qkindex::Error::invalid_param(
                        "static parts",
                        format!("{} heads", parts.max.len()),
                        format!("expected {want} heads of {hd} values"),
                    )));
                }
                Some(parts)
            }
            None => None,
        };

        // Attention: static part + retrieved part, merged.
        let static_positions = move || (0..sink.min(n)).chain(rest_end..n);
        let tail_m = self.cfg.tail_samples;
        let given = given.as_ref();
        heads
            .par_iter_mut()
            .zip(out.par_chunks_mut(group * hd))
            .enumerate()
            .for_each(|(g, (st, og))| {
                let kh = &k[g * block..g * block + n * hd];
                let vh = &v[g * block..g * block + n * hd];
                let n_sink = sink.min(n);
                for j in 0..group {
                    let qh = &q[(g * group + j) * hd..][..hd];
                    let h = g * group + j;
                    let s = match given {
                        Some(parts) => {
                            if !st.guides.is_empty() {
                                // The guides below need the window's scores.
                                Partial::scores_over(
                                    qh,
                                    kh,
                                    static_positions(),
                                    scale,
                                    &mut st.scores,
                                );
                            }
                            Partial {
                                max: parts.max[h],
                                sum: parts.sum[h],
                                o: parts.o[h * hd..(h + 1) * hd].to_vec(),
                            }
                        }
                        None => {
                            Partial::over(qh, kh, vh, static_positions(), scale, &mut st.scores)
                        }
                    };
                    // The window's scores guide the insertion of its keys when they leave it:
                    // each keeps the query with the largest q·k/|q| (guides[i] is position
                    // rest_end + i, scores[n_sink + i] its scaled score).
                    if !st.guides.is_empty() {
                        let inv = inv_norm(qh);
                        for (guide, &sc) in st.guides.iter_mut().zip(&st.scores[n_sink..]) {
                            let c = sc * inv;
                            if c > guide.score {
                                guide.score = c;
                                guide.query.clear();
                                guide.query.extend_from_slice(qh);
                            }
                        }
                    }
                    let r = Partial::over(
                        qh,
                        kh,
                        vh,
                        st.selected[j].iter().copied(),
                        scale,
                        &mut st.scores,
                    );
                    let seed =
                        ((pos as u64) << 24) ^ ((layer as u64) << 12) ^ (g * group + j) as u64;
                    let t = tail_part(
                        qh,
                        kh,
                        vh,
                        sink.min(rest_end)..rest_end,
                        &st.selected[j],
                        tail_m,
                        seed,
                        scale,
                        &mut st.scores,
                        &mut st.tail,
                    );
                    st.tail_keys += tail::sampled(&st.tail) as u64;
                    Partial::merge(&[s, r, t], &mut og[j * hd..(j + 1) * hd]);
                }
            });
        self.stats.attention += t1.elapsed();

        // Measurement (untimed in the latencies).
        if self.cfg.measure {
            let t2 = Instant::now();
            heads.par_iter_mut().enumerate().for_each(|(g, st)| {
                let kh = &k[g * block..g * block + n * hd];
                for j in 0..group {
                    let qh = &q[(g * group + j) * hd..][..hd];
                    let m = measure(qh, kh, n, sink, rest_end, &st.selected[j], kk, scale);
                    if let Some(unseeded) = &st.unseeded[j] {
                        st.counts.seeded_recall_sum += m.recall;
                        for (i, ids) in unseeded.iter().enumerate() {
                            let u = measure(qh, kh, n, sink, rest_end, ids, kk, scale);
                            match i {
                                0 => st.counts.unseeded_recall_sum += u.recall,
                                _ => st.counts.wider[i - 1].recall_sum += u.recall,
                            }
                        }
                    }
                    st.measure.mass += m.mass;
                    st.measure.mass_ratio += m.mass_ratio;
                    st.measure.recall += m.recall;
                    st.measure.count += 1;
                }
            });
            self.stats.measure += t2.elapsed();
        }

        // Fold per-head counters into the totals.
        let has_rest = rest_end > sink;
        for st in heads.iter_mut() {
            self.stats.distance_computations += st.dc;
            st.dc = 0;
            if !st.selectors.is_empty() {
                let counts = std::mem::take(&mut st.counts);
                self.stats
                    .retopk
                    .get_or_insert_with(Default::default)
                    .add(&counts);
            }
            for sel in &st.selected {
                self.stats.keys_attended += (sink.min(n) + n - rest_end + sel.len()) as u64;
            }
            self.stats.keys_attended += std::mem::take(&mut st.tail_keys);
            self.stats.selections += group as u64;
            let m = std::mem::take(&mut st.measure);
            self.stats.mass_sum += m.mass;
            self.stats.mass_ratio_sum += m.mass_ratio;
            self.stats.recall_sum += m.recall;
            self.stats.measured += m.count;
            self.stats.layer_mass_sum[layer] += m.mass;
            self.stats.layer_measured[layer] += m.count;
            if has_rest && self.cfg.rest_kind().is_some() {
                self.step_recall.0 += m.recall;
                self.step_recall.1 += m.count;
            }
        }
        self.end_layer(layer);
        Ok(())
    }
}

impl Retrieval {
    /// After the last layer: one more step, and its mean recall.
    fn end_layer(&mut self, layer: usize) {
        if layer + 1 == self.n_layers {
            self.stats.steps += 1;
            if self.step_recall.1 > 0 {
                self.stats
                    .step_recall
                    .push(self.step_recall.0 / self.step_recall.1 as f64);
            }
            self.step_recall = (0.0, 0);
        }
    }
}

/// Mass, mass ratio and recall of one selection, from the scores of all `n` keys.
#[allow(clippy::too_many_arguments)]
fn measure(
    q: &[f32],
    k: &[f32],
    n: usize,
    sink: usize,
    rest_end: usize,
    selected: &[usize],
    kk: usize,
    scale: f32,
) -> Measured {
    let hd = q.len();
    let s: Vec<f32> = (0..n)
        .map(|p| scale * simd::dot(q, &k[p * hd..(p + 1) * hd]))
        .collect();
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = s.iter().map(|&x| ((x - max) as f64).exp()).collect();
    let z: f64 = w.iter().sum();
    let static_mass: f64 = (0..sink.min(n)).chain(rest_end..n).map(|p| w[p]).sum();
    let found: f64 = selected.iter().map(|&p| w[p]).sum();
    let mut rest: Vec<usize> = (sink.min(n)..rest_end).collect();
    let take = kk.min(rest.len());
    if take < rest.len() {
        // Afterwards the first `take` hold the largest scores.
        rest.select_nth_unstable_by(take, |&a, &b| s[b].total_cmp(&s[a]));
    }
    let best = &rest[..take];
    let exact_mass: f64 = best.iter().map(|&p| w[p]).sum();
    let hits = selected.iter().filter(|p| best.contains(p)).count();
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
