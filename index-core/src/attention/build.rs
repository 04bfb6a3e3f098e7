//! Construction of the query-aware graph.
//!
//! 1. Bipartite kNN ([`TrainKnn`]): each training query's exact top-`kq` keys
//!    ([`KnnBackend`]), or its best keys in a few lists of a coarse IVF ([`super::coarse`]), or
//!    its keys searched in a graph built first ([`super::graph_knn`]), or its best keys in a
//!    pool shared by similar queries ([`super::pool_knn`]); the
//!    keys themselves are the queries with [`TrainOn::Keys`]. `queries_per_key` thins the
//!    training queries first.
//! 2. Projection: per key, candidate neighbours from the lists it appears in, pruned to
//!    `max_degree`, then reverse edges where a key has room ([`super::projection`]); the entry
//!    points ([`super::entries`]).
//! 3. Connectivity ([`crate::graph::repair`]): every key not reachable from the entry points is
//!    searched for (with its own vector as the query) and linked from the best reachable key
//!    with room, so no key is lost.
//! 4. When asked for, on held-out recent training queries: the prune check (the same lists
//!    pruned by a second rule, [`super::prune_check`]), the far check ([`super::far_check`])
//!    and the `ef` calibration ([`super::auto_ef`]).

use super::auto_ef::calibrate;
use super::entries::entry_points;
use super::far_check::keep_better_lists;
use super::params::{AttentionParams, TrainKnn, TrainOn};
use super::pool_knn::{self, PooledKnn};
use super::projection::{project, Occurrences};
use super::prune_check::keep_better_rule;
use super::stats::BuildStats;
use super::train_lists::{far_rows, thin, unmask_rows};
use super::AttentionIndex;
use super::{coarse, graph_knn};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::graph::repair::{self, Repair, WhenFull};
use crate::graph::{beam_search, BeamSettings, Csr};
use crate::knn::{KnnBackend, KnnOptions, KnnResult};
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::KeyStore;
use std::sync::Arc;
use std::time::Instant;

impl AttentionIndex {
    /// Builds the index over `keys` from training queries (`m × dim` row-major f32; the
    /// prefill queries of the head, or of all query heads sharing the KV head), computing the
    /// exact top-`kq` with `knn`. With [`TrainOn::Keys`] the keys themselves are the training
    /// queries and `train_queries` is not read.
    ///
    /// `kq` larger than the number of keys is capped at the number of keys.
    ///
    /// Errors: dimension mismatch, empty or non-finite input, bad params.
    pub fn build(
        keys: Arc<KeyStore>,
        train_queries: &[f32],
        params: &AttentionParams,
        knn: &dyn KnnBackend,
    ) -> Result<Self> {
        build(keys, train_queries, None, params, knn, &Cancel::new())
    }

    /// [`AttentionIndex::build`] that stops with [`Error::Cancelled`] once `cancel` is set
    /// (checked between kNN tiles and build phases).
    pub fn build_with(
        keys: Arc<KeyStore>,
        train_queries: &[f32],
        params: &AttentionParams,
        knn: &dyn KnnBackend,
        cancel: &Cancel,
    ) -> Result<Self> {
        build(keys, train_queries, None, params, knn, cancel)
    }

    /// [`AttentionIndex::build_with`] where training query `i` could attend to keys
    /// `0..visible[i]` only (one count per query). With `params.causal` each query's top-`kq`
    /// comes from those keys alone (and `queries_per_key` may thin the queries); without it the
    /// counts are not read. A GQA group's queries pooled head-major over `p` positions, against
    /// keys that start at position `s`, have `visible[h·p + t] = t + 1 − s` (0 below `s`).
    ///
    /// Errors: those of [`AttentionIndex::build`]; a count per query missing or extra.
    pub fn build_visible(
        keys: Arc<KeyStore>,
        train_queries: &[f32],
        visible: &[u32],
        params: &AttentionParams,
        knn: &dyn KnnBackend,
        cancel: &Cancel,
    ) -> Result<Self> {
        build(keys, train_queries, Some(visible), params, knn, cancel)
    }
}

pub(super) fn build(
    keys: Arc<KeyStore>,
    train_queries: &[f32],
    visible: Option<&[u32]>,
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<AttentionIndex> {
    let start = Instant::now();
    // The kNN chosen by length (`pool_above`): the index keeps the parameters it was built with.
    let params = &*params.for_keys(keys.len());
    let mut index = match (params.prune_check, params.train_on) {
        (Some(other), TrainOn::Queries) => {
            let lists = train_lists(&keys, train_queries, visible, params, knn, cancel)?;
            let keys32 = lists.keys_f32(&keys);
            let graph = |p: &AttentionParams| {
                graph_from_lists(keys.clone(), &lists, &keys32, p, knn, cancel, start)
            };
            let asked = graph(params)?;
            let t = Instant::now();
            let other = graph(&AttentionParams {
                prune: other,
                prune_check: Some(params.prune),
                ..params.clone()
            })?;
            keep_better_rule(asked, other, t, train_queries, visible, knn, cancel)?
        }
        _ => build_once(keys, train_queries, visible, params, knn, cancel)?,
    };
    let stats = &index.stats;
    let far_share = stats.unmasked_lists as f64 / stats.train_queries.max(1) as f64;
    let far = visible.filter(|_| {
        params.train_on == TrainOn::Queries
            && params.far_check.is_some_and(|share| far_share >= share)
    });
    if let Some(visible) = far {
        let build_full =
            |keys, p: &AttentionParams| build_once(keys, train_queries, None, p, knn, cancel);
        keep_better_lists(
            &mut index,
            far_share,
            train_queries,
            visible,
            knn,
            cancel,
            build_full,
        )?;
    }
    if let (Some(target), TrainOn::Queries) = (params.auto_ef, params.train_on) {
        let measured = calibrate(&mut index, train_queries, visible, target, knn, cancel)?;
        index.stats.auto_ef = Some(measured);
    }
    index.stats.total_s = start.elapsed().as_secs_f64();
    Ok(index)
}

/// One build with the lists `params` ask for ([`build`] without the checks).
pub(super) fn build_once(
    keys: Arc<KeyStore>,
    train_queries: &[f32],
    visible: Option<&[u32]>,
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<AttentionIndex> {
    let start = Instant::now();
    let lists = train_lists(&keys, train_queries, visible, params, knn, cancel)?;
    let keys32 = lists.keys_f32(&keys);
    graph_from_lists(keys, &lists, &keys32, params, knn, cancel, start)
}

/// The bipartite kNN's result (phase 1 of a build), from which graphs are made.
pub(super) struct TrainLists {
    /// One top-`kq` list per (thinned) training query.
    lists: KnnResult,
    /// The keys as f32 when they were the training queries ([`TrainOn::Keys`]).
    key_queries: Option<Vec<f32>>,
    kq: usize,
    unmasked_lists: usize,
    pooled_knn: Option<PooledKnn>,
    knn_s: f64,
}

impl TrainLists {
    /// The keys as f32 rows (the projection's and pruning's inner products).
    pub(super) fn keys_f32(&self, keys: &KeyStore) -> Vec<f32> {
        self.key_queries.clone().unwrap_or_else(|| keys.to_f32())
    }
}

/// Phase 1: the validated params' training lists: thinning, the kNN [`TrainKnn`] asks for,
/// far-looking causal lists unmasked.
pub(super) fn train_lists(
    keys: &Arc<KeyStore>,
    train_queries: &[f32],
    visible: Option<&[u32]>,
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
) -> Result<TrainLists> {
    params.validate()?;
    let start = Instant::now();
    let n = keys.len();
    if n == 0 {
        return Err(Error::Empty { what: "keys" });
    }
    let kq = params.kq.min(n);
    let key_queries = (params.train_on == TrainOn::Keys).then(|| keys.to_f32());
    let queries = key_queries.as_deref().unwrap_or(train_queries);
    // Causal with per-row counts: checked against the rows before thinning, then thinned alike.
    let visible = match visible.filter(|_| params.causal && key_queries.is_none()) {
        Some(v) => {
            let m = queries.len() / keys.dim().max(1);
            if v.len() != m {
                return Err(Error::DimensionMismatch {
                    what: "visible key counts (one per training query)",
                    expected: m,
                    got: v.len(),
                });
            }
            Some(thin(v, 1, params.queries_per_key, n).into_owned().into())
        }
        None if params.causal && params.queries_per_key > 0.0 => {
            return Err(Error::invalid_param(
                "queries_per_key",
                params.queries_per_key,
                "cannot thin causal training queries without their visible key counts \
                 (row i must be position i)",
            ));
        }
        None => None,
    };
    let queries = thin(queries, keys.dim(), params.queries_per_key, n);
    let row_visible = visible.clone();
    let mut pooled_knn = None;
    let mut lists = match params.knn {
        TrainKnn::Pool { size } => {
            let (lists, stats) = pool_knn::pool_topk(&queries, keys, kq, size, knn, cancel)?;
            pooled_knn = stats;
            lists
        }
        TrainKnn::Exact => knn.topk(
            &queries,
            keys,
            kq,
            &KnnOptions {
                causal: params.causal,
                visible,
                cancel: cancel.clone(),
            },
        )?,
        TrainKnn::Graph { ef } => {
            let build_seed =
                |rows: &[f32], p: &AttentionParams| build(keys.clone(), rows, None, p, knn, cancel);
            graph_knn::graph_topk(keys, &queries, kq, ef, params, knn, cancel, &build_seed)?
        }
        TrainKnn::Probe { lists } => coarse::topk(&queries, keys, kq, lists, knn, cancel)?,
    };
    let mut unmasked_lists = 0;
    if let (Some(share), true) = (params.global_full, params.causal) {
        let rows = far_rows(&lists, row_visible.as_deref(), n, share);
        unmask_rows(&mut lists, &rows, &queries, keys, knn, cancel)?;
        unmasked_lists = rows.len();
    }
    cancel.check("AttentionIndex build")?;
    Ok(TrainLists {
        lists,
        key_queries,
        kq,
        unmasked_lists,
        pooled_knn,
        knn_s: start.elapsed().as_secs_f64(),
    })
}

/// Phases 2 and 3: the graph `params` (its projection, pruning, entries and connectivity)
/// make from `lists`, with `keys32` the keys as f32 ([`TrainLists::keys_f32`]); `start` is
/// when the build began (its `total_s`).
pub(super) fn graph_from_lists(
    keys: Arc<KeyStore>,
    train: &TrainLists,
    keys32: &[f32],
    params: &AttentionParams,
    knn: &dyn KnnBackend,
    cancel: &Cancel,
    start: Instant,
) -> Result<AttentionIndex> {
    let (n, dim, lists) = (keys.len(), keys.dim(), &train.lists);
    let t = Instant::now();
    let occurrences = Occurrences::new(lists, n);
    let unlisted_keys = (0..n as u32).filter(|&v| occurrences.count(v) == 0).count();
    let mut adj = project(lists, &occurrences, params, keys32, dim);
    let entries = entry_points(params, &occurrences, lists, keys32, dim);
    let projection_s = t.elapsed().as_secs_f64();
    cancel.check("AttentionIndex build")?;

    let t = Instant::now();
    let linked = connect(&mut adj, &entries, &keys, params, cancel)?;
    let connectivity_s = t.elapsed().as_secs_f64();

    let graph = Csr::from_lists(&adj)?;
    let stats = BuildStats {
        train_queries: lists.rows(),
        kq: train.kq,
        knn_s: train.knn_s,
        projection_s,
        connectivity_s,
        total_s: start.elapsed().as_secs_f64(),
        linked_unreachable: linked,
        unlisted_keys,
        unmasked_lists: train.unmasked_lists,
        prune_check: None,
        far_check: None,
        auto_ef: None,
        pooled_knn: train.pooled_knn.clone(),
        scan_check: None,
        edges: graph.edges(),
        knn_backend: knn.name(),
    };
    let mut index = AttentionIndex::from_parts(keys, graph, entries, params)?;
    index.stats = stats;
    Ok(index)
}

/// Links every key that the entry points cannot reach ([`repair::connect`]); returns how many
/// were linked.
///
/// A key `u` that is not reachable is searched for with its own vector as the query; the best
/// reachable result with a free slot (else any reachable key with one) gets the edge `r → u`,
/// and `u` gets edges to the results if it has none. When every reachable key is full, `u` is
/// spliced into the list of the best reachable result ([`WhenFull::Splice`]).
fn connect(
    adj: &mut [Vec<u32>],
    entries: &[u32],
    keys: &KeyStore,
    params: &AttentionParams,
    cancel: &Cancel,
) -> Result<usize> {
    let n = adj.len();
    let m = params.max_degree;
    let scorer = keys.scorer();
    let mut scratch = Scratch::new(n);
    let mut out = SearchOutput::default();
    let mut query = vec![0.0f32; keys.dim()];
    let ef = params.build_ef.min(n);
    let rule = Repair {
        entries,
        max_degree: m,
        any_with_room: true,
        when_full: WhenFull::Splice,
        own_edges: m.div_ceil(2),
        degree_name: "max_degree",
        what: "AttentionIndex build",
    };
    let near = |adj: &[Vec<u32>], _reached: &[bool], u: u32, found: &mut Vec<u32>| {
        keys.row_into(u, &mut query);
        let settings = BeamSettings::new(ef, ef);
        beam_search(
            adj,
            &scorer,
            &query,
            &[entries],
            &settings,
            &mut scratch,
            &mut out,
        );
        found.extend_from_slice(&out.ids);
    };
    repair::connect(adj, &rule, near, cancel)
}
