//! Research probes: searches that only a report uses, run behind a [`StepObserver`] so that the
//! timed step never pays for them. An observer sees each KV head's selections after the select
//! phase of every layer step ([`Retrieval::set_observer`](super::Retrieval::set_observer)); its
//! time counts as measurement, excluded from the latencies.
//!
//! [`SeededProbe`] is the one `qkindex eval` installs: ReTopK's exact-path searches that
//! started from recalled seeds (`--policy retopk --retopk-index`, an AttentionIndex) are run
//! again without the seeds, at the same `ef` and at each of [`WIDER_EF`] times it, filling the
//! `seeded_*`, `unseeded_*` and `wider` fields of [`ReTopKCounts`].

use qkindex::{Scratch, SearchOutput, SearchParams};

use super::ids::{Pos, RestId, Split};
use super::policy::PolicyConfig;
use super::selector::{Selection, Selector};
use super::stats::{measure, ReTopKCounts, RetrievalStats, WiderRun};
use qkindex_model::ModelError;

/// `ef` factors of the unseeded comparison searches beyond the seeded search's own `ef`.
pub const WIDER_EF: [f64; 3] = [1.25, 1.5, 2.0];

/// Sees the selections of every decode step, outside the timed step.
pub trait StepObserver: Send {
    /// After the select phase of one (layer, KV head); may add to `stats`.
    fn on_select(
        &mut self,
        event: &SelectEvent<'_>,
        stats: &mut RetrievalStats,
    ) -> Result<(), ModelError>;
}

/// The selections of one (layer, KV head) at one step, with what is needed to redo them.
#[derive(Debug)]
pub struct SelectEvent<'a> {
    pub cfg: &'a PolicyConfig,
    pub layer: usize,
    pub kv_head: usize,
    pub split: Split,
    pub head_dim: usize,
    /// Score scale (`1/√head_dim`).
    pub scale: f32,
    /// The KV head's keys: `split.n × head_dim`, row-major.
    pub keys: &'a [f32],
    /// The queries of the group's query heads: `group × head_dim`.
    pub queries: &'a [f32],
    /// The selector after this step's upkeep and selections.
    pub selector: &'a dyn Selector,
    /// Per query head of the group: its selection, and the selection's positions.
    pub selections: &'a [Selection],
    pub selected: &'a [Vec<Pos>],
}

impl SelectEvent<'_> {
    /// Query head `j`'s query.
    pub fn query(&self, j: usize) -> &[f32] {
        &self.queries[j * self.head_dim..(j + 1) * self.head_dim]
    }
}

/// ReTopK's seeded fallbacks searched again without seeds (see the module doc).
#[derive(Debug, Default)]
pub struct SeededProbe {
    scratch: Scratch,
    out: SearchOutput,
}

impl SeededProbe {
    /// The positions of the last search.
    fn found(&self, split: Split) -> Vec<Pos> {
        self.out
            .ids
            .iter()
            .map(|&id| split.pos(RestId(id)))
            .collect()
    }
}

impl StepObserver for SeededProbe {
    fn on_select(
        &mut self,
        event: &SelectEvent<'_>,
        stats: &mut RetrievalStats,
    ) -> Result<(), ModelError> {
        // Seeded searches happen on the kinds that serve rest ids as they are (attention).
        let Some(index) = event.selector.index().and_then(|r| r.as_ann()) else {
            return Ok(());
        };
        let (cfg, split) = (event.cfg, event.split);
        let (params, kk) = (cfg.search_params(), cfg.k);
        let k_search = kk.min(index.len());
        let base_ef = params.ef.unwrap_or(kk.max(128));
        // This KV head's sums, added to the totals once (as the step folds its counters).
        let mut c = ReTopKCounts::default();
        for (j, sel) in event.selections.iter().enumerate() {
            let Some(seeded) = sel.seeded else {
                continue;
            };
            c.seeded_selections += 1;
            c.seeded_distance_computations += seeded.distance_computations;
            c.seeded_hops += seeded.hops;
            let qh = event.query(j);
            index.search_into(qh, k_search, &params, &mut self.scratch, &mut self.out)?;
            c.unseeded_distance_computations += self.out.stats.distance_computations;
            c.unseeded_hops += self.out.stats.hops;
            let mut found = vec![self.found(split)];
            c.wider.resize(WIDER_EF.len(), WiderRun::default());
            for (w, f) in c.wider.iter_mut().zip(WIDER_EF) {
                let ef = (base_ef as f64 * f).round() as usize;
                let wide = SearchParams {
                    ef: Some(ef),
                    ..params
                };
                index.search_into(qh, k_search, &wide, &mut self.scratch, &mut self.out)?;
                w.ef = ef;
                w.distance_computations += self.out.stats.distance_computations;
                w.hops += self.out.stats.hops;
                found.push(self.found(split));
            }
            if cfg.measure {
                let recall =
                    |sel: &[Pos]| measure(qh, event.keys, split, sel, kk, event.scale).recall;
                c.seeded_recall_sum += recall(&event.selected[j]);
                c.unseeded_recall_sum += recall(&found[0]);
                for (w, ids) in c.wider.iter_mut().zip(&found[1..]) {
                    w.recall_sum += recall(ids);
                }
            }
        }
        if c.seeded_selections > 0 {
            stats.retopk.get_or_insert_with(Default::default).add(&c);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::retrieval::{PolicyKind, Retrieval, Shape};
    use qkindex_model::{DecodeAttention, DecodeStep};

    const SHAPE: Shape = Shape {
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
    };

    /// Counts the events it sees.
    #[derive(Debug)]
    struct Count(Arc<AtomicUsize>);

    impl StepObserver for Count {
        fn on_select(
            &mut self,
            _: &SelectEvent<'_>,
            _: &mut RetrievalStats,
        ) -> Result<(), ModelError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    /// ReTopK with its exact path into an AttentionIndex over synthetic keys: the outputs of
    /// `steps` decode steps and the statistics, with `observer` installed.
    fn decode(observer: Option<Box<dyn StepObserver>>, steps: usize) -> (Vec<f32>, RetrievalStats) {
        let (n0, hd) = (300, SHAPE.head_dim);
        let cap = n0 + steps;
        let mut rng = qkindex::synth::Rng::new(7);
        let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.normal()).collect() };
        let kv = SHAPE.n_kv_heads * cap * hd;
        let (k, v) = (values(kv), values(kv));
        let width = SHAPE.n_heads * hd;
        let prefill_q: Vec<Vec<f32>> = (0..SHAPE.n_layers).map(|_| values(n0 * width)).collect();
        let decode_q = values(steps * SHAPE.n_layers * width);
        // The decode default without its scan check: on 300 keys the int8 scan would win, and
        // the probe reports on graph searches.
        let qkindex::IndexSpec::Attention(graph) = qkindex::IndexSpec::decode_default() else {
            unreachable!("the decode default is an attention index")
        };
        let cfg = PolicyConfig {
            sink: 16,
            window: 64,
            k: 24,
            retopk_index: true,
            index: qkindex::IndexSpec::Attention(qkindex::AttentionParams {
                scan_check: false,
                ..graph
            }),
            ..PolicyConfig::new(PolicyKind::Retopk)
        };
        let keys_of = |_: usize, g: usize| k[g * cap * hd..(g * cap + n0) * hd].to_vec();
        let knn = &qkindex::CpuKnn;
        let mut r =
            Retrieval::new(cfg, SHAPE, &keys_of, n0, &prefill_q, knn, |_, _| {}).expect("policy");
        if let Some(o) = observer {
            r.set_observer(o);
        }
        let mut outputs = Vec::new();
        for (t, q) in decode_q.chunks_exact(SHAPE.n_layers * width).enumerate() {
            for (layer, q) in q.chunks_exact(width).enumerate() {
                let mut out = vec![0f32; width];
                let step = DecodeStep {
                    layer,
                    pos: n0 + t,
                    q,
                    k: &k,
                    v: &v,
                    capacity: cap,
                };
                r.attend(step, &mut out).expect("attend");
                outputs.extend(out);
            }
        }
        (outputs, r.stats)
    }

    #[test]
    fn probes_see_every_head_and_change_nothing_they_do_not_report() {
        let steps = 8;
        let (plain_out, plain) = decode(None, steps);
        let (probed_out, probed) = decode(Some(Box::new(SeededProbe::default())), steps);
        assert_eq!(plain_out, probed_out, "the probe changed the step's output");
        assert_eq!(plain.distance_computations, probed.distance_computations);
        assert_eq!(plain.recall_sum, probed.recall_sum);
        let (a, b) = (
            plain.retopk.expect("retopk counts"),
            probed.retopk.expect("retopk counts"),
        );
        assert_eq!(
            (a.reuse, a.low_similarity, a.refresh),
            (b.reuse, b.low_similarity, b.refresh)
        );
        assert_eq!(a.exact_distance_computations, b.exact_distance_computations);
        // Without the probe its fields stay empty; with it every seeded fallback is searched
        // again without seeds, at the same ef and at the wider ones.
        assert_eq!((a.seeded_selections, a.unseeded_hops), (0, 0));
        assert!(a.wider.is_empty());
        assert!(b.seeded_selections > 0, "{b:?}");
        assert!(b.unseeded_distance_computations > 0 && b.unseeded_recall_sum > 0.0);
        let efs: Vec<usize> = b.wider.iter().map(|w| w.ef).collect();
        assert_eq!(efs, [160, 192, 256]);
        // An observer sees each (layer, KV head) once per step.
        let seen = Arc::new(AtomicUsize::new(0));
        decode(Some(Box::new(Count(seen.clone()))), steps);
        assert_eq!(
            seen.load(Ordering::Relaxed),
            steps * SHAPE.n_layers * SHAPE.n_kv_heads
        );
    }
}
