//! `index-topk`: the top-k that a [`RestIndex`] of any kind returns from the rest; keys that
//! leave the window are inserted (the AttentionIndex guided by the query that scored them
//! highest). With `step_seeds`, graph searches also start from the keys the same query head
//! retrieved at the previous step.

use std::sync::atomic::{AtomicU64, Ordering};

use qkindex::{
    search_many_into, IndexSpec, ManyOutput, ManyScratch, Scratch, SearchOutput, SearchParams,
};

use super::{HeadPrefill, Selection, Selector};
use crate::retrieval::rest::RestIndex;
use qkindex_model::ModelError;

/// Builds the rest index `spec` names over the prefill's rest, trained on the group's prefill
/// queries, in the policy's element type.
pub(super) fn build_rest(
    prefill: &HeadPrefill<'_>,
    spec: &IndexSpec,
) -> Result<RestIndex, ModelError> {
    let visible = prefill.visible();
    let (rest, replaced) = RestIndex::build(
        spec,
        prefill.rest_keys().to_vec(),
        prefill.head_dim,
        (prefill.queries()?, Some(&visible)),
        prefill.cfg.store,
        prefill.knn,
    )?;
    // A far check ran (a group that reads from the whole context), or the ef calibration raised
    // the default ef, or the scan check kept the int8 scan: say what they chose.
    let stats = match (&rest, &replaced) {
        (_, Some(graph)) => Some(graph),
        (RestIndex::Attention(a), None) => Some(a.build_stats()),
        _ => None,
    };
    if let Some(stats) = stats {
        let t = &BUILD_TALLY;
        t.attention.fetch_add(1, Ordering::Relaxed);
        let us = |s: f64| (s * 1e6) as u64;
        let far_s = stats.far_check.as_ref().map_or(0.0, |f| f.seconds);
        let pool = stats.pooled_knn.as_ref();
        for (slot, s) in [
            (&t.total_us, stats.total_s),
            (&t.knn_us, stats.knn_s),
            (&t.pool_kmeans_us, pool.map_or(0.0, |p| p.kmeans_s)),
            (&t.pool_pools_us, pool.map_or(0.0, |p| p.pools_s)),
            (&t.pool_lists_us, pool.map_or(0.0, |p| p.lists_s)),
            (&t.projection_us, stats.projection_s),
            (&t.connectivity_us, stats.connectivity_s),
            (&t.far_check_us, far_s),
        ] {
            slot.fetch_add(us(s), Ordering::Relaxed);
        }
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
        if let Some(c) = &stats.scan_check {
            t.scan_checked.fetch_add(1, Ordering::Relaxed);
            if c.scan_wins {
                eprintln!("layer {} KV head {}: {c}", prefill.layer, prefill.kv_head);
                t.scan_kept.fetch_add(1, Ordering::Relaxed);
            } else if c.scan_heads() > 0 {
                eprintln!("layer {} KV head {}: {c}", prefill.layer, prefill.kv_head);
                t.scan_mixed.fetch_add(1, Ordering::Relaxed);
                t.scan_routed_heads
                    .fetch_add(c.scan_heads() as u64, Ordering::Relaxed);
            }
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
    /// Builds that ran the scan check, and of those, the ones that kept the int8 scan (for
    /// every query head), and the ones that kept the graph but routed some query heads to
    /// the scan, with the number of those heads.
    pub scan_checked: u64,
    pub scan_kept: u64,
    pub scan_mixed: u64,
    pub scan_routed_heads: u64,
    /// Microseconds of the builds' steps, summed over the builds (which run in parallel, so the
    /// sums exceed the wall time): the whole build (`BuildStats::total_s`), the kNN of the
    /// training lists and, with `knn-pool`, its parts (clustering the queries, each cluster's
    /// pool, each query's list from its pool), the projection (candidates and pruning, reverse
    /// edges, entry points), the connectivity repair, and the far check's second build and
    /// check. What `total` has beyond these is the `auto-ef` calibration and bookkeeping.
    pub total_us: u64,
    pub knn_us: u64,
    pub pool_kmeans_us: u64,
    pub pool_pools_us: u64,
    pub pool_lists_us: u64,
    pub projection_us: u64,
    pub connectivity_us: u64,
    pub far_check_us: u64,
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
            scan_checked: self.scan_checked - b.scan_checked,
            scan_kept: self.scan_kept - b.scan_kept,
            scan_mixed: self.scan_mixed - b.scan_mixed,
            scan_routed_heads: self.scan_routed_heads - b.scan_routed_heads,
            total_us: self.total_us - b.total_us,
            knn_us: self.knn_us - b.knn_us,
            pool_kmeans_us: self.pool_kmeans_us - b.pool_kmeans_us,
            pool_pools_us: self.pool_pools_us - b.pool_pools_us,
            pool_lists_us: self.pool_lists_us - b.pool_lists_us,
            projection_us: self.projection_us - b.projection_us,
            connectivity_us: self.connectivity_us - b.connectivity_us,
            far_check_us: self.far_check_us - b.far_check_us,
        }
    }
}

impl BuildTally {
    /// One line on where the builds' time went (None without `AttentionIndex` builds).
    pub fn steps_line(&self) -> Option<String> {
        if self.attention == 0 {
            return None;
        }
        let s = |us: u64| us as f64 / 1e6;
        let pool = match self.pool_kmeans_us + self.pool_pools_us + self.pool_lists_us {
            0 => String::new(),
            _ => format!(
                " (knn-pool: cluster {:.1} + pools {:.1} + lists {:.1})",
                s(self.pool_kmeans_us),
                s(self.pool_pools_us),
                s(self.pool_lists_us)
            ),
        };
        let parts = self.knn_us + self.projection_us + self.connectivity_us + self.far_check_us;
        let scan = match self.scan_checked {
            0 => String::new(),
            checked => format!(
                "; the scan check kept the int8 scan on {} of {checked} (the graph on the rest{})",
                self.scan_kept,
                match self.scan_mixed {
                    0 => String::new(),
                    mixed => format!(
                        ", {mixed} of them with {} query head{} routed to the scan",
                        self.scan_routed_heads,
                        if self.scan_routed_heads == 1 { "" } else { "s" }
                    ),
                }
            ),
        };
        Some(format!(
            "build steps, seconds summed over {} builds: knn {:.1}{pool} + projection and prune \
             {:.1} + connectivity repair {:.1} + far check {:.1} + auto-ef and the rest {:.1} = \
             {:.1}{scan}",
            self.attention,
            s(self.knn_us),
            s(self.projection_us),
            s(self.connectivity_us),
            s(self.far_check_us),
            s(self.total_us.saturating_sub(parts)),
            s(self.total_us)
        ))
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
    scan_checked: AtomicU64,
    scan_kept: AtomicU64,
    scan_mixed: AtomicU64,
    scan_routed_heads: AtomicU64,
    total_us: AtomicU64,
    knn_us: AtomicU64,
    pool_kmeans_us: AtomicU64,
    pool_pools_us: AtomicU64,
    pool_lists_us: AtomicU64,
    projection_us: AtomicU64,
    connectivity_us: AtomicU64,
    far_check_us: AtomicU64,
}

static BUILD_TALLY: AtomicTally = AtomicTally {
    attention: AtomicU64::new(0),
    far_checked: AtomicU64::new(0),
    far_kept_full: AtomicU64::new(0),
    auto_ef_measured: AtomicU64::new(0),
    auto_ef_raised: AtomicU64::new(0),
    prune_checked: AtomicU64::new(0),
    prune_kept_other: AtomicU64::new(0),
    scan_checked: AtomicU64::new(0),
    scan_kept: AtomicU64::new(0),
    scan_mixed: AtomicU64::new(0),
    scan_routed_heads: AtomicU64::new(0),
    total_us: AtomicU64::new(0),
    knn_us: AtomicU64::new(0),
    pool_kmeans_us: AtomicU64::new(0),
    pool_pools_us: AtomicU64::new(0),
    pool_lists_us: AtomicU64::new(0),
    projection_us: AtomicU64::new(0),
    connectivity_us: AtomicU64::new(0),
    far_check_us: AtomicU64::new(0),
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
        scan_checked: t.scan_checked.load(Ordering::Relaxed),
        scan_kept: t.scan_kept.load(Ordering::Relaxed),
        scan_mixed: t.scan_mixed.load(Ordering::Relaxed),
        scan_routed_heads: t.scan_routed_heads.load(Ordering::Relaxed),
        total_us: t.total_us.load(Ordering::Relaxed),
        knn_us: t.knn_us.load(Ordering::Relaxed),
        pool_kmeans_us: t.pool_kmeans_us.load(Ordering::Relaxed),
        pool_pools_us: t.pool_pools_us.load(Ordering::Relaxed),
        pool_lists_us: t.pool_lists_us.load(Ordering::Relaxed),
        projection_us: t.projection_us.load(Ordering::Relaxed),
        connectivity_us: t.connectivity_us.load(Ordering::Relaxed),
        far_check_us: t.far_check_us.load(Ordering::Relaxed),
    }
}

/// The keys a search scored: its inner products, and the estimates from int8 codes of a scan
/// or walk on codes (each reads a quarter of an f32 row, but a key scored is a key scored: an
/// int8 scan scores them all).
fn keys_scored(stats: &qkindex::SearchStats) -> u64 {
    stats.distance_computations + stats.code_estimates
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
        out.fill(&self.found.ids, keys_scored(&self.found.stats));
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
            out.fill(&found.ids, keys_scored(&found.stats));
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
