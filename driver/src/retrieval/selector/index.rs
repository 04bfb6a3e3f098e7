//! `index-topk`: the top-k that a [`RestIndex`] of any kind returns from the rest; keys that
//! leave the window are inserted (the AttentionIndex guided by the query that scored them
//! highest). With `step_seeds`, graph searches also start from the keys the same query head
//! retrieved at the previous step.

use qkindex::{IndexSpec, Scratch, SearchOutput, SearchParams};

use super::{HeadPrefill, Selection, Selector};
use crate::model::ModelError;
use crate::retrieval::rest::RestIndex;

/// Builds the rest index `spec` names over the prefill's rest, trained on the group's prefill
/// queries, in the policy's element type.
pub(super) fn build_rest(
    prefill: &HeadPrefill<'_>,
    spec: &IndexSpec,
) -> Result<RestIndex, ModelError> {
    let visible = prefill.visible();
    let rest = RestIndex::build(
        spec,
        prefill.rest_keys().to_vec(),
        prefill.head_dim,
        (prefill.queries()?, Some(&visible)),
        prefill.cfg.store,
        prefill.knn,
    )?;
    // A far check ran (a group that reads from the whole context), or the ef calibration raised
    // the default ef: say what they chose.
    if let RestIndex::Attention(a) = &rest {
        let stats = a.build_stats();
        if let Some(f) = &stats.far_check {
            eprintln!("layer {} KV head {}: {f}", prefill.layer, prefill.kv_head);
        }
        // Only the groups whose ef the calibration raised (at 8K most keep the default).
        if let Some(e) = stats.auto_ef.as_ref().filter(|e| e.ef_after != e.ef_before) {
            eprintln!("layer {} KV head {}: {e}", prefill.layer, prefill.kv_head);
        }
    }
    Ok(rest)
}

/// A rest index searched for each query.
#[derive(Debug)]
pub struct Index {
    rest: RestIndex,
    k: usize,
    params: SearchParams,
    scratch: Scratch,
    found: SearchOutput,
    /// Seeds taken from the previous step per search (0: none).
    step_seeds: usize,
    /// Per query head: the rest ids retrieved at the previous step (`step_seeds`).
    prev: Vec<Vec<u32>>,
    /// This step's seeds (a reused buffer: no allocation per search).
    seeds: Vec<u32>,
}

impl Index {
    pub fn build(prefill: &HeadPrefill<'_>, spec: &IndexSpec) -> Result<Self, ModelError> {
        let rest = build_rest(prefill, spec)?;
        Ok(Index {
            scratch: Scratch::new(rest.len()),
            rest,
            k: prefill.cfg.k,
            params: prefill.cfg.search_params(),
            found: SearchOutput::default(),
            step_seeds: prefill.cfg.step_seeds,
            prev: vec![Vec::new(); prefill.group],
            seeds: Vec::new(),
        })
    }
}

impl Selector for Index {
    fn upkeep(&mut self, key: &[f32], guide: &[f32]) -> Result<(), ModelError> {
        Ok(self.rest.insert(key, guide, &mut self.scratch)?)
    }

    fn select(&mut self, j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        if self.step_seeds > 0 {
            self.seeds.clear();
            self.seeds.extend(self.prev[j].iter().take(self.step_seeds));
            self.rest.search_seeded(
                query,
                self.k,
                &self.params,
                &self.seeds,
                &mut self.scratch,
                &mut self.found,
            )?;
            self.prev[j].clone_from(&self.found.ids);
        } else {
            self.rest.search(
                query,
                self.k,
                &self.params,
                &mut self.scratch,
                &mut self.found,
            )?;
        }
        out.fill(&self.found.ids, self.found.stats.distance_computations);
        Ok(())
    }

    fn index(&self) -> Option<&RestIndex> {
        Some(&self.rest)
    }
}
