//! `index-topk`: the top-k that a [`RestIndex`] of any kind returns from the rest; keys that
//! leave the window are inserted (the AttentionIndex guided by the query that scored them
//! highest). With `step_seeds`, graph searches also start from the keys the same query head
//! retrieved at the previous step.

use std::sync::atomic::{AtomicU64, Ordering};

use qkindex::{
    search_many_into, IndexSpec, ManyOutput, ManyScratch, Scratch, SearchOutput, SearchParams,
};

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
        let t = &BUILD_TALLY;
        t.attention.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &stats.far_check {
            eprintln!("layer {} KV head {}: {f}", prefill.layer, prefill.kv_head);
            t.far_checked.fetch_add(1, Ordering::Relaxed);
            t.far_kept_full
                .fetch_add(u64::from(f.kept_full), Ordering::Relaxed);
        }
        if let Some(p) = &stats.prune_check {
            t.prune_checked.fetch_add(1, Ordering::Relaxed);
            t.prune_kept_other
                .fetch_add(u64::from(p.kept_other), Ordering::Relaxed);
        }
        if stats.auto_ef.is_some() {
            t.auto_ef_measured.fetch_add(1, Ordering::Relaxed);
        }
        // Only the groups whose ef the calibration raised (at 8K most keep the default).
        if let Some(e) = stats.auto_ef.as_ref().filter(|e| e.ef_after != e.ef_before) {
            eprintln!("layer {} KV head {}: {e}", prefill.layer, prefill.kv_head);
            t.auto_ef_raised.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(rest)
}

/// What the build-time checks of the `AttentionIndex` builds did, counted over the process
/// ([`build_tally`]), so that a command can say in one line after its builds why only some of
/// them printed a `far check` or `auto ef` line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildTally {
    /// `AttentionIndex` builds.
    pub attention: u64,
    /// Builds that ran the far check, and of those, the ones that kept the full-list graph.
    pub far_checked: u64,
    pub far_kept_full: u64,
    /// Builds that measured the `ef` (`auto-ef`), and of those, the ones that raised it.
    pub auto_ef_measured: u64,
    pub auto_ef_raised: u64,
    /// Builds that ran the prune check, and of those, the ones that kept the checked rule's
    /// graph (`prune-check`) over the asked one's.
    pub prune_checked: u64,
    pub prune_kept_other: u64,
}

impl std::ops::Sub for BuildTally {
    type Output = BuildTally;
    fn sub(self, b: BuildTally) -> BuildTally {
        BuildTally {
            attention: self.attention - b.attention,
            far_checked: self.far_checked - b.far_checked,
            far_kept_full: self.far_kept_full - b.far_kept_full,
            auto_ef_measured: self.auto_ef_measured - b.auto_ef_measured,
            auto_ef_raised: self.auto_ef_raised - b.auto_ef_raised,
            prune_checked: self.prune_checked - b.prune_checked,
            prune_kept_other: self.prune_kept_other - b.prune_kept_other,
        }
    }
}

struct AtomicTally {
    attention: AtomicU64,
    far_checked: AtomicU64,
    far_kept_full: AtomicU64,
    auto_ef_measured: AtomicU64,
    auto_ef_raised: AtomicU64,
    prune_checked: AtomicU64,
    prune_kept_other: AtomicU64,
}

static BUILD_TALLY: AtomicTally = AtomicTally {
    attention: AtomicU64::new(0),
    far_checked: AtomicU64::new(0),
    far_kept_full: AtomicU64::new(0),
    auto_ef_measured: AtomicU64::new(0),
    auto_ef_raised: AtomicU64::new(0),
    prune_checked: AtomicU64::new(0),
    prune_kept_other: AtomicU64::new(0),
};

/// The counts so far in this process; the difference of two snapshots covers the builds between
/// them.
pub fn build_tally() -> BuildTally {
    let t = &BUILD_TALLY;
    BuildTally {
        attention: t.attention.load(Ordering::Relaxed),
        far_checked: t.far_checked.load(Ordering::Relaxed),
        far_kept_full: t.far_kept_full.load(Ordering::Relaxed),
        auto_ef_measured: t.auto_ef_measured.load(Ordering::Relaxed),
        auto_ef_raised: t.auto_ef_raised.load(Ordering::Relaxed),
        prune_checked: t.prune_checked.load(Ordering::Relaxed),
        prune_kept_other: t.prune_kept_other.load(Ordering::Relaxed),
    }
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
    /// The group's searches in one call ([`Selector::select_group`]): their scratches and
    /// results, reused.
    many_scratch: ManyScratch,
    many: Vec<ManyOutput>,
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
            many_scratch: ManyScratch::default(),
            many: Vec::new(),
        })
    }
}

impl Selector for Index {
    fn upkeep(&mut self, key: &[f32], guide: &[f32]) -> Result<(), ModelError> {
        Ok(self.rest.insert(key, guide, &mut self.scratch)?)
    }

    fn select(&mut self, j: usize, query: &[f32], out: &mut Selection) -> Result<(), ModelError> {
        // The query head's own `ef` where the build measured one per head (`auto-ef`).
        self.params.head = Some(j);
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

    /// The group's queries searched in parallel in one [`search_many_into`] call (an index
    /// that serves its ids as they are: attention, flat); the frozen kinds, whose results merge
    /// an exact tail, select one query head after another.
    fn select_group(&mut self, queries: &[f32], outs: &mut [Selection]) -> Result<(), ModelError> {
        let k = self.k.min(self.rest.len());
        let Some(index) = self.rest.as_ann().filter(|_| k > 0) else {
            let hd = queries.len() / outs.len().max(1);
            for (j, (query, out)) in queries.chunks_exact(hd.max(1)).zip(outs).enumerate() {
                self.select(j, query, out)?;
            }
            return Ok(());
        };
        let (prev, step_seeds, base) = (&self.prev, self.step_seeds, self.params);
        let seeds = |_: usize, j: usize| -> &[u32] {
            prev.get(j)
                .map_or(&[][..], |p| &p[..p.len().min(step_seeds)])
        };
        search_many_into(
            &[index],
            &[queries],
            &seeds,
            k,
            // Each query head at its own `ef` where the build measured one per head.
            &|_, j| SearchParams {
                head: Some(j),
                ..base
            },
            &self.many_scratch,
            &mut self.many,
        )?;
        for (j, (found, out)) in self.many[0].outputs.iter().zip(outs).enumerate() {
            out.fill(&found.ids, found.stats.distance_computations);
            if step_seeds > 0 {
                self.prev[j].clone_from(&found.ids);
            }
        }
        Ok(())
    }

    fn index(&self) -> Option<&RestIndex> {
        Some(&self.rest)
    }
}
