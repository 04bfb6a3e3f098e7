//! `retopk`: one ReTopK selector per query head (reuse the sets of similar past queries),
//! primed with the head's last prefill queries; its exact path is the rest index (a scan, or
//! with `retopk_index` the index of `index`, seeded with the recalled sets).

use qkindex::{
    AnnIndex, KeyStore, ReTopK, ReTopKParams, Scratch, SearchOutput, SearchParams, StepPath,
};

use super::index::build_rest;
use super::{HeadPrefill, Selection, Selector};
use crate::retrieval::ids::Pos;
use crate::retrieval::rest::RestIndex;
use crate::retrieval::stats::{ReTopKCounts, RetrievalStats};
use qkindex_model::ModelError;

/// ReTopK over one KV head's rest.
#[derive(Debug)]
pub struct ReTopKSelector {
    rest: RestIndex,
    /// One per query head of the group.
    heads: Vec<ReTopK>,
    params: SearchParams,
    scratch: Scratch,
    found: SearchOutput,
    /// Since the last [`Selector::fold_stats`].
    counts: ReTopKCounts,
}

impl ReTopKSelector {
    pub fn build(prefill: &HeadPrefill<'_>) -> Result<Self, ModelError> {
        let cfg = prefill.cfg;
        let spec = if cfg.retopk_index {
            cfg.index.clone()
        } else {
            qkindex::IndexSpec::Flat(qkindex::FlatParams::default())
        };
        let rest = build_rest(prefill, &spec)?;
        let keys = rest.keys().ok_or_else(|| {
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
        let (n, hd) = (prefill.split.n, prefill.head_dim);
        let first = n.saturating_sub(params.c);
        let mut heads = Vec::with_capacity(prefill.group);
        for j in 0..prefill.group {
            let mut rt = ReTopK::new(params.clone(), hd)?;
            let mut queries = Vec::with_capacity(params.c * hd);
            let mut visible = Vec::with_capacity(params.c);
            for p in first..n {
                queries.extend_from_slice(prefill.query(j, p)?);
                visible.push(prefill.split.rest_upto(Pos(p)));
            }
            rt.prime(&queries, &visible, keys)?;
            heads.push(rt);
        }
        Ok(ReTopKSelector {
            scratch: Scratch::new(rest.len()),
            rest,
            heads,
            params: cfg.search_params(),
            found: SearchOutput::default(),
            counts: ReTopKCounts::default(),
        })
    }
}

/// The keys and the exact path of a rest index that serves ids `0..len()` as they are.
fn exact_path(rest: &RestIndex) -> Result<(&KeyStore, &dyn AnnIndex), ModelError> {
    let frozen = || qkindex::Error::invalid_param("index", "frozen", "no ReTopK exact path");
    Ok((
        rest.keys().ok_or_else(frozen)?,
        rest.as_ann().ok_or_else(frozen)?,
    ))
}

impl Selector for ReTopKSelector {
    fn upkeep(&mut self, key: &[f32], guide: &[f32]) -> Result<(), ModelError> {
        Ok(self.rest.insert(key, guide, &mut self.scratch)?)
    }

    fn select(&mut self, j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        let (keys, exact) = exact_path(&self.rest)?;
        let rt = &mut self.heads[j];
        let step = rt.step(
            query,
            keys,
            exact,
            &self.params,
            &mut self.scratch,
            &mut self.found,
        )?;
        let c = &mut self.counts;
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
        out.fill(
            &self.found.ids,
            step.search.distance_computations + step.similarity_computations,
        );
        if step.path.is_exact() {
            c.exact_distance_computations += step.search.distance_computations;
            if !rt.last_seeds().is_empty() && matches!(self.rest, RestIndex::Attention(_)) {
                out.seeded = Some(step.search);
            }
        }
        Ok(())
    }

    fn fold_stats(&mut self, stats: &mut RetrievalStats) {
        let counts = std::mem::take(&mut self.counts);
        stats
            .retopk
            .get_or_insert_with(Default::default)
            .add(&counts);
    }

    fn index(&self) -> Option<&RestIndex> {
        Some(&self.rest)
    }
}
