//! The decode step of one layer, in phases: upkeep (keys leaving the window enter the
//! selector) → select (per query head) → observe (probes, untimed, only when installed) →
//! attend (static part + selected keys + sampled tail) → merge ([`Partial::merge`]) →
//! measure (untimed, `measure`) → fold (per-head counters into [`RetrievalStats`]). The state
//! the phases work on is built at the end of the prefill (`build.rs`).

use std::time::{Duration, Instant};

use qkindex::KnnBackend;
use rayon::prelude::*;

use super::build;
use super::guides::Guides;
use super::ids::{Pos, Split};
use super::policy::PolicyConfig;
use super::probes::{SelectEvent, StepObserver};
use super::selector::{self, HeadPrefill, Selection, Selector};
use super::shape::Shape;
use super::softmax::Partial;
use super::stats::{measure, Measured, RetrievalStats};
use super::tail::{self, tail_part, TailScratch};
use qkindex_model::{DecodeAttention, DecodeStep, ModelError, StaticPartFn, StaticParts};

/// The decode hook of a policy other than `full`: per layer and KV head, a selector and the
/// window's bookkeeping.
pub struct Retrieval {
    cfg: PolicyConfig,
    shape: Shape,
    layers: Vec<Layer>,
    /// The last layer the policy serves: its call ends a step.
    last_served: usize,
    pub stats: RetrievalStats,
    observer: Option<Box<dyn StepObserver>>,
}

/// One layer's state: [`build::Layer`] of this step's heads.
type Layer = build::Layer<Head>;

/// One KV head of one layer.
pub(super) struct Head {
    selector: Box<dyn Selector>,
    /// The first rest position not yet handed to the selector.
    next: usize,
    /// Guides of the keys from `next` on (only when the selector wants them).
    guides: Option<Guides>,
    /// Per query head of the group: this step's selection, and its positions.
    selections: Vec<Selection>,
    selected: Vec<Vec<Pos>>,
    scores: Vec<f32>,
    tail: TailScratch,
    /// Keys sampled by the tail estimate this step.
    tail_keys: u64,
    /// Selector inner products this step.
    dc: u64,
    measured: Measured,
}

impl Head {
    /// The state of one (layer, KV head) after its prefill: its selector, built.
    pub(super) fn build(prefill: &HeadPrefill<'_>) -> Result<Head, ModelError> {
        let selector = selector::build(prefill)?;
        let guides = match selector.wants_guides() {
            true => Some(Guides::from_prefill(prefill)?),
            false => None,
        };
        Ok(Head {
            selector,
            next: prefill.split.end,
            guides,
            selections: vec![Selection::default(); prefill.group],
            selected: vec![Vec::new(); prefill.group],
            scores: Vec::new(),
            tail: TailScratch::default(),
            tail_keys: 0,
            dc: 0,
            measured: Measured::default(),
        })
    }
}

impl Retrieval {
    /// State for decoding after a prefill of `n` positions: `keys_of(layer, g)` gives at least
    /// the first `n` keys of that layer and KV head (row-major), `prefill_q[layer]` the queries
    /// (row-major `n × (n_heads · head_dim)`; may be empty for policies without an index);
    /// `knn` runs the exact kNN of index builds. `progress` is called after each (layer, KV
    /// head) build; the builds run in parallel ([`build::build_layers`]).
    pub fn new(
        cfg: PolicyConfig,
        shape: Shape,
        keys_of: &(dyn Fn(usize, usize) -> Vec<f32> + Sync),
        n: usize,
        prefill_q: &[Vec<f32>],
        knn: &dyn KnnBackend,
        progress: impl FnMut(usize, usize) + Send,
    ) -> Result<Self, ModelError> {
        let t0 = Instant::now();
        cfg.check(n)?;
        let layers = build::build_layers(
            &cfg,
            shape,
            keys_of,
            n,
            prefill_q,
            knn,
            Head::build,
            progress,
        )?;
        let last_served = (0..shape.n_layers)
            .rev()
            .find(|&l| !cfg.is_local(l))
            .ok_or_else(|| {
                qkindex::Error::invalid_param(
                    "local_layers",
                    shape.n_layers,
                    "hold every layer: there is nothing for the policy to serve",
                )
            })?;
        Ok(Retrieval {
            stats: RetrievalStats::new(shape.n_layers, t0.elapsed().as_secs_f64()),
            cfg,
            shape,
            layers,
            last_served,
            observer: None,
        })
    }

    /// Bytes the policy's indexes hold, summed over layers and KV heads, and the keys under
    /// them: `(structure, keys' bytes, keys)` ([`super::RestIndex::memory`]).
    pub fn index_memory(&self) -> (usize, usize, usize) {
        let mut total = (0, 0, 0);
        for layer in &self.layers {
            if let Layer::Split(heads) = layer {
                for h in heads {
                    if let Some(ix) = h.selector.index() {
                        let (s, k) = ix.memory();
                        total = (total.0 + s, total.1 + k, total.2 + ix.len());
                    }
                }
            }
        }
        total
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// Keys under the selector of `layer`, KV head `g` (0 without one).
    pub fn rest_len(&self, layer: usize, g: usize) -> usize {
        match &self.layers[layer] {
            Layer::Dense(_) | Layer::Local => 0,
            Layer::Split(heads) => heads[g].selector.n_keys(),
        }
    }

    /// Installs `observer`: it sees every selection from the next step on, outside the timed
    /// step (its time counts as measurement).
    pub fn set_observer(&mut self, observer: Box<dyn StepObserver>) {
        self.observer = Some(observer);
    }
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
    fn attend(&mut self, step: DecodeStep<'_>, out: &mut [f32]) -> Result<(), ModelError> {
        self.attend_with(step, None, out)
    }

    fn static_set(&self, layer: usize, pos: usize) -> Option<(usize, usize)> {
        if self.cfg.is_dense(layer) || self.cfg.is_local(layer) {
            return None;
        }
        let split = Split::at(pos + 1, self.cfg.sink, self.cfg.window);
        Some((self.cfg.sink, split.end))
    }

    fn attend_split(
        &mut self,
        step: DecodeStep<'_>,
        static_part: &mut StaticPartFn<'_>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.attend_with(step, Some(static_part), out)
    }
}

/// The inputs of one layer's step (see [`DecodeAttention::attend`] for their layout).
#[derive(Clone, Copy)]
struct StepInput<'a> {
    layer: usize,
    pos: usize,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// Values per KV head block of `k` and `v` (`capacity × head_dim`).
    block: usize,
    hd: usize,
    group: usize,
    split: Split,
    scale: f32,
}

impl<'a> StepInput<'a> {
    /// KV head `g`'s keys `0..n`.
    fn keys(&self, g: usize) -> &'a [f32] {
        &self.k[g * self.block..g * self.block + self.split.n * self.hd]
    }
    fn values(&self, g: usize) -> &'a [f32] {
        &self.v[g * self.block..g * self.block + self.split.n * self.hd]
    }
    /// The query of query head `j` of KV head `g`'s group.
    fn query(&self, g: usize, j: usize) -> &'a [f32] {
        &self.q[(g * self.group + j) * self.hd..][..self.hd]
    }
}

impl Retrieval {
    /// The decode step of one layer. With `static_part`, the part over the static positions
    /// (sink and window) comes from it — computed elsewhere while this searches — instead of
    /// being attended here; everything else is the same.
    fn attend_with(
        &mut self,
        step: DecodeStep<'_>,
        static_part: Option<&mut StaticPartFn<'_>>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let DecodeStep {
            layer,
            pos,
            q,
            k,
            v,
            capacity,
        } = step;
        let hd = self.shape.head_dim;
        let input = StepInput {
            layer,
            pos,
            q,
            k,
            v,
            block: capacity * hd,
            hd,
            group: self.shape.n_heads / self.shape.n_kv_heads,
            split: Split::at(pos + 1, self.cfg.sink, self.cfg.window),
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let stats = &mut self.stats;
        match &mut self.layers[layer] {
            Layer::Dense(scores) => dense_step(scores, &input, stats, out),
            Layer::Local => {
                return Err(qkindex::Error::invalid_param(
                    "layer",
                    layer,
                    "attends a sliding window, which the model computes itself",
                )
                .into())
            }
            Layer::Split(heads) => {
                let observer = self.observer.as_deref_mut();
                split_step(heads, &input, &self.cfg, stats, observer, static_part, out)?;
            }
        }
        if layer == self.last_served {
            self.stats.end_step();
        }
        Ok(())
    }
}

/// Adds the time `f` takes to `total`.
fn timed<T>(total: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    *total += t.elapsed();
    r
}

/// A dense layer: every query head attends all `n` keys.
fn dense_step(
    scores: &mut [Vec<f32>],
    input: &StepInput<'_>,
    stats: &mut RetrievalStats,
    out: &mut [f32],
) {
    let hd = input.hd;
    timed(&mut stats.attention, || {
        scores
            .par_iter_mut()
            .zip(out.par_chunks_mut(input.group * hd))
            .enumerate()
            .for_each(|(g, (scores, og))| {
                let (kh, vh) = (input.keys(g), input.values(g));
                for (j, oj) in og.chunks_exact_mut(hd).enumerate() {
                    let qh = input.query(g, j);
                    let all = Partial::over(qh, kh, vh, 0..input.split.n, input.scale, scores);
                    Partial::merge(&[all], oj);
                }
            })
    });
    let n_heads = (scores.len() * input.group) as u64;
    stats.keys_attended += input.split.n as u64 * n_heads;
    stats.selections += n_heads;
}

/// A layer with a static set and selections: the phases, timed as the latencies report them
/// (observers and the measurement count as measurement time).
fn split_step(
    heads: &mut [Head],
    input: &StepInput<'_>,
    cfg: &PolicyConfig,
    stats: &mut RetrievalStats,
    observer: Option<&mut (dyn StepObserver + 'static)>,
    static_part: Option<&mut StaticPartFn<'_>>,
    out: &mut [f32],
) -> Result<(), ModelError> {
    timed(&mut stats.search, || {
        heads
            .par_iter_mut()
            .enumerate()
            .try_for_each(|(g, st)| -> Result<(), ModelError> {
                st.upkeep(input, g)?;
                st.select(input, g)
            })
    })?;
    if let Some(observer) = observer {
        let t = Instant::now();
        observe(heads, input, cfg, observer, stats)?;
        stats.measure += t.elapsed();
    }
    // The static part computed elsewhere (it ran while this searched); the wait counts as
    // attention time.
    timed(&mut stats.attention, || -> Result<(), ModelError> {
        let given = match static_part {
            Some(f) => Some(checked_parts(f()?, heads.len() * input.group, input.hd)?),
            None => None,
        };
        heads
            .par_iter_mut()
            .zip(out.par_chunks_mut(input.group * input.hd))
            .enumerate()
            .for_each(|(g, (st, og))| st.attend(input, g, given.as_ref(), cfg.tail_samples, og));
        Ok(())
    })?;
    if cfg.measure {
        timed(&mut stats.measure, || {
            heads
                .par_iter_mut()
                .enumerate()
                .for_each(|(g, st)| st.measure(input, g, cfg.k))
        });
    }
    let counts_recall = !input.split.rest().is_empty() && cfg.kind.retrieves();
    for st in heads.iter_mut() {
        let m = st.fold(input, stats);
        if counts_recall {
            stats.add_step_recall(m);
        }
    }
    Ok(())
}

/// Shows each KV head's selections to `observer`.
fn observe(
    heads: &[Head],
    input: &StepInput<'_>,
    cfg: &PolicyConfig,
    observer: &mut dyn StepObserver,
    stats: &mut RetrievalStats,
) -> Result<(), ModelError> {
    let width = input.group * input.hd;
    for (g, st) in heads.iter().enumerate() {
        let event = SelectEvent {
            cfg,
            layer: input.layer,
            kv_head: g,
            split: input.split,
            head_dim: input.hd,
            scale: input.scale,
            keys: input.keys(g),
            queries: &input.q[g * width..(g + 1) * width],
            selector: st.selector.as_ref(),
            selections: &st.selections,
            selected: &st.selected,
        };
        observer.on_select(&event, stats)?;
    }
    Ok(())
}

/// Query head `h`'s part in `parts`.
fn given_part(parts: &StaticParts, h: usize, hd: usize) -> Partial {
    Partial {
        max: parts.max[h],
        sum: parts.sum[h],
        o: parts.o[h * hd..(h + 1) * hd].to_vec(),
    }
}

/// `parts` when it holds `n_heads` heads of `hd` values.
fn checked_parts(parts: StaticParts, n_heads: usize, hd: usize) -> Result<StaticParts, ModelError> {
    if parts.max.len() != n_heads || parts.sum.len() != n_heads || parts.o.len() != n_heads * hd {
        return Err(ModelError::Policy(qkindex::Error::invalid_param(
            "static parts",
            format!("{} heads", parts.max.len()),
            format!("expected {n_heads} heads of {hd} values"),
        )));
    }
    Ok(parts)
}

impl Head {
    /// Upkeep: the keys that left the window since the last step enter the selector, in
    /// order, each with its guide.
    fn upkeep(&mut self, input: &StepInput<'_>, g: usize) -> Result<(), ModelError> {
        let (kh, hd) = (input.keys(g), input.hd);
        if let Some(guides) = self.guides.as_mut() {
            guides.cover(self.next, input.split);
        }
        while self.next < input.split.end {
            let p = self.next;
            let guide = self.guides.as_mut().map(Guides::pop).unwrap_or_default();
            self.selector.upkeep(&kh[p * hd..(p + 1) * hd], &guide)?;
            self.next += 1;
        }
        Ok(())
    }

    /// Select: one selection per query head of the group (in one call, which `index-topk`
    /// runs in parallel), and its positions.
    fn select(&mut self, input: &StepInput<'_>, g: usize) -> Result<(), ModelError> {
        let width = input.group * input.hd;
        let queries = &input.q[g * width..(g + 1) * width];
        self.selector.select_group(queries, &mut self.selections)?;
        for (sel, selected) in self.selections.iter().zip(&mut self.selected) {
            self.dc += sel.distance_computations;
            selected.clear();
            selected.extend(sel.ids.iter().map(|&id| input.split.pos(id)));
        }
        Ok(())
    }

    /// Attend and merge, per query head: the static part (or the one given), the selected
    /// keys and the sampled tail, merged into `og` (`group × head_dim`).
    fn attend(
        &mut self,
        input: &StepInput<'_>,
        g: usize,
        given: Option<&StaticParts>,
        tail_m: usize,
        og: &mut [f32],
    ) {
        let (kh, vh, hd, split) = (input.keys(g), input.values(g), input.hd, input.split);
        for j in 0..input.group {
            let (qh, h) = (input.query(g, j), g * input.group + j);
            let s = self.static_part(input, g, j, given.map(|p| given_part(p, h, hd)));
            let selected = &self.selected[j];
            let positions = selected.iter().map(|p| p.0);
            let r = Partial::over(qh, kh, vh, positions, input.scale, &mut self.scores);
            let seed = ((input.pos as u64) << 24) ^ ((input.layer as u64) << 12) ^ h as u64;
            let t = tail_part(
                qh,
                kh,
                vh,
                split.rest(),
                selected,
                tail_m,
                seed,
                input.scale,
                &mut self.scores,
                &mut self.tail,
            );
            self.tail_keys += tail::sampled(&self.tail) as u64;
            Partial::merge(&[s, r, t], &mut og[j * hd..(j + 1) * hd]);
        }
    }

    /// Query head `j`'s part over the static positions (`given`, or attended here). The
    /// window's scores guide its keys' insertion: each keeps the query with the largest
    /// `q·k / |q|`.
    fn static_part(
        &mut self,
        input: &StepInput<'_>,
        g: usize,
        j: usize,
        given: Option<Partial>,
    ) -> Partial {
        let (qh, kh, split) = (input.query(g, j), input.keys(g), input.split);
        let guides = self.guides.as_mut().filter(|gd| !gd.is_empty());
        let part = match given {
            Some(part) => {
                if guides.is_some() {
                    Partial::scores_over(qh, kh, split.statics(), input.scale, &mut self.scores);
                }
                part
            }
            None => {
                let vh = input.values(g);
                Partial::over(qh, kh, vh, split.statics(), input.scale, &mut self.scores)
            }
        };
        if let Some(guides) = guides {
            // scores[sink + i] is the window key of guide slot i.
            guides.update(qh, &self.scores[split.sink..]);
        }
        part
    }

    /// Measure (untimed): mass and recall of each query head's selection against every key.
    fn measure(&mut self, input: &StepInput<'_>, g: usize, kk: usize) {
        let kh = input.keys(g);
        for j in 0..input.group {
            let m = measure(
                input.query(g, j),
                kh,
                input.split,
                &self.selected[j],
                kk,
                input.scale,
            );
            self.measured += m;
        }
    }

    /// Fold: this step's counters into `stats`; returns the measurements it added.
    fn fold(&mut self, input: &StepInput<'_>, stats: &mut RetrievalStats) -> Measured {
        stats.distance_computations += std::mem::take(&mut self.dc);
        self.selector.fold_stats(stats);
        for sel in &self.selected {
            stats.keys_attended += (input.split.static_len() + sel.len()) as u64;
        }
        stats.keys_attended += std::mem::take(&mut self.tail_keys);
        stats.selections += input.group as u64;
        let m = std::mem::take(&mut self.measured);
        stats.add_measured(input.layer, m);
        m
    }
}
