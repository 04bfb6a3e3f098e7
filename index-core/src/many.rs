//! Searching many indexes in one call, as a serving engine does for the heads of a layer
//! (issue 45): index `i` answers its own batch of queries, every (index, query) pair is one
//! task on rayon's current thread pool, and each index's stats come back summed.
//!
//! ```text
//!  indexes [n]      queries [n][b_i × dim]      seeds(i, r) (optional)
//!       └───────────────┬──────────────────────────┘
//!                       ▼  Σ b_i tasks, spread over the pool's threads
//!            index_i.search_seeded(query_i,r, k, params, seeds(i, r))
//!                       ▼
//!  outs [n]: ManyOutput { outputs: [b_i] SearchOutput, stats: Σ_r stats }
//! ```
//!
//! The caller chooses the threads by running the call inside a pool
//! (`rayon::ThreadPoolBuilder::new().num_threads(t).build()?.install(|| search_many(..))`);
//! by default it is rayon's global pool (`RAYON_NUM_THREADS`, else one thread per CPU). Tasks
//! take their [`Scratch`] from a [`ManyScratch`], so a caller that keeps one (and its outputs)
//! across calls allocates nothing per query once they have grown.

use crate::error::{Error, Result};
use crate::scratch::Scratch;
use crate::search::{AnnIndex, SearchOutput, SearchParams, SearchStats};
use rayon::prelude::*;
use std::sync::Mutex;

/// What [`search_many`] returns for one index: one output per query, in the queries' order,
/// and their stats summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManyOutput {
    pub outputs: Vec<SearchOutput>,
    pub stats: SearchStats,
}

/// Scratches for the tasks of [`search_many_into`], reused across calls: a task takes one and
/// gives it back when it ends, so the pool holds about as many as there were threads.
#[derive(Debug, Default)]
pub struct ManyScratch {
    free: Mutex<Vec<Scratch>>,
}

/// A scratch taken from a [`ManyScratch`], given back when dropped.
struct Taken<'a> {
    pool: &'a ManyScratch,
    scratch: Scratch,
}

impl ManyScratch {
    /// An empty pool (a `const fn`, so that a `static` can hold one).
    pub const fn new() -> Self {
        ManyScratch {
            free: Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Taken<'_> {
        let scratch = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop()
            .unwrap_or_default();
        Taken {
            pool: self,
            scratch,
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let scratch = std::mem::take(&mut self.scratch);
        self.pool
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(scratch);
    }
}

/// No seeds for any query (the `seeds` argument of [`search_many_into`]).
pub fn no_seeds(_index: usize, _row: usize) -> &'static [u32] {
    &[]
}

/// Searches `queries[i]` (row-major `b_i × dim` of `indexes[i]`: any number of queries,
/// `b_i = 0` included) on `indexes[i]` for every `i`, in parallel over all (index, query)
/// pairs: `result[i].outputs[r]` answers row `r` of `queries[i]`, as
/// `indexes[i].search(row, k, params, ..)` would. Unset `params` fields take each index's own
/// default (its `ef`, `nprobe`).
///
/// Errors: `queries.len() != indexes.len()` or a query block that is not whole rows
/// ([`Error::DimensionMismatch`]), and the first error of any search (a non-finite query,
/// `k` larger than an index, parameters a kind rejects).
pub fn search_many(
    indexes: &[&dyn AnnIndex],
    queries: &[&[f32]],
    k: usize,
    params: &SearchParams,
) -> Result<Vec<ManyOutput>> {
    let mut outs = Vec::new();
    search_many_into(
        indexes,
        queries,
        &no_seeds,
        k,
        &|_, _| *params,
        &ManyScratch::default(),
        &mut outs,
    )?;
    Ok(outs)
}

/// [`search_many`] into reused outputs (`outs` is resized to `indexes.len()`, each entry's
/// `outputs` to its number of queries), with scratches from `scratch`, graph searches also
/// starting from `seeds(i, r)` (key ids of `indexes[i]` for its query `r`; see
/// [`AnnIndex::search_seeded`]; [`no_seeds`] for none), query `r` of `indexes[i]` searched with
/// `params(i, r)` (e.g. its query head, [`SearchParams::head`]; `&|_, _| params` for one set).
pub fn search_many_into<'s>(
    indexes: &[&dyn AnnIndex],
    queries: &[&[f32]],
    seeds: &(dyn Fn(usize, usize) -> &'s [u32] + Sync),
    k: usize,
    params: &(dyn Fn(usize, usize) -> SearchParams + Sync),
    scratch: &ManyScratch,
    outs: &mut Vec<ManyOutput>,
) -> Result<()> {
    if indexes.len() != queries.len() {
        return Err(Error::DimensionMismatch {
            what: "query blocks (one per index)",
            expected: indexes.len(),
            got: queries.len(),
        });
    }
    outs.resize_with(indexes.len(), ManyOutput::default);
    for ((index, block), out) in indexes.iter().zip(queries).zip(outs.iter_mut()) {
        let dim = index.dim();
        if dim == 0 || block.len() % dim != 0 {
            return Err(Error::DimensionMismatch {
                what: "query block (whole rows of the index's dimension)",
                expected: dim * (block.len() / dim.max(1) + 1),
                got: block.len(),
            });
        }
        out.outputs
            .resize_with(block.len() / dim, SearchOutput::default);
        out.stats = SearchStats::default();
    }
    // One task per query; an index that shares work across a block's rows (`batches`) gets
    // one run of rows per thread instead.
    let threads = rayon::current_num_threads().max(1);
    outs.par_iter_mut()
        .enumerate()
        .flat_map(|(i, out)| {
            let (index, block) = (indexes[i], queries[i]);
            let rows = out.outputs.len();
            let run = if index.batches() {
                rows.div_ceil(threads).max(1)
            } else {
                1
            };
            out.outputs
                .par_chunks_mut(run)
                .zip(block.par_chunks(run * index.dim()))
                .enumerate()
                .map(move |(c, (found, rows))| (i, c * run, index, rows, found))
        })
        .try_for_each_init(
            || scratch.take(),
            |taken, (i, r0, index, rows, found)| {
                let scratch = &mut taken.scratch;
                if let [one] = found {
                    return index.search_seeded(
                        rows,
                        k,
                        &params(i, r0),
                        seeds(i, r0),
                        scratch,
                        one,
                    );
                }
                let params = |r: usize| params(i, r0 + r);
                let seeds = |r: usize| seeds(i, r0 + r);
                index.search_rows(rows, k, &params, &seeds, scratch, found)
            },
        )?;
    for out in outs.iter_mut() {
        for found in &out.outputs {
            out.stats += found.stats;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttentionIndex, AttentionParams, CpuKnn, FlatIndex, KeyStore};
    use std::sync::Arc;

    const DIM: usize = 16;

    #[test]
    fn each_index_answers_its_own_queries_as_a_single_search_would() {
        let a = crate::synth::ood(600, 4, DIM, 3);
        let b = crate::synth::ood(400, 4, DIM, 5);
        let keys_a = Arc::new(KeyStore::from_f32(a.keys.clone(), DIM).expect("keys"));
        let keys_b = Arc::new(KeyStore::from_f32(b.keys.clone(), DIM).expect("keys"));
        let graph = AttentionIndex::build(
            keys_a.clone(),
            &a.train_queries,
            &AttentionParams::default(),
            &CpuKnn,
        )
        .expect("build");
        let flat = FlatIndex::new(keys_b);
        let indexes: [&dyn AnnIndex; 3] = [&graph, &flat, &graph];
        // Three, two and zero queries.
        let queries: [&[f32]; 3] = [&a.test_queries[..3 * DIM], &b.test_queries[..2 * DIM], &[]];
        let params = SearchParams::with_ef(40);
        let got = search_many(&indexes, &queries, 10, &params).expect("search_many");
        assert_eq!(got.len(), 3);
        for (i, (index, block)) in indexes.iter().zip(queries).enumerate() {
            assert_eq!(got[i].outputs.len(), block.len() / DIM, "index {i}");
            let mut sum = SearchStats::default();
            for (r, query) in block.chunks_exact(DIM).enumerate() {
                let want = index
                    .search(query, 10, &params, &mut index.new_scratch())
                    .expect("search");
                assert_eq!(got[i].outputs[r], want, "index {i} query {r}");
                sum += want.stats;
            }
            assert_eq!(got[i].stats, sum, "index {i}");
        }
        assert!(got[0].stats.distance_computations > 0);

        // Reused outputs and scratches give the same answers; seeds reach the searches (a
        // seed list of every key makes the graph score them all).
        let pool = ManyScratch::default();
        let mut outs = vec![ManyOutput::default(); 5];
        let all: Vec<u32> = (0..graph.len() as u32).collect();
        let seeds = |i: usize, _r: usize| if i == 0 { &all[..] } else { &[][..] };
        search_many_into(
            &indexes,
            &queries,
            &seeds,
            10,
            &|_, _| params,
            &pool,
            &mut outs,
        )
        .expect("seeded");
        assert_eq!(outs.len(), 3);
        assert_eq!(outs[1], got[1]);
        assert!(outs[0].stats.distance_computations >= 3 * graph.len() as u64);
        search_many_into(
            &indexes,
            &queries,
            &no_seeds,
            10,
            &|_, _| params,
            &pool,
            &mut outs,
        )
        .expect("again");
        assert_eq!(outs, got);
    }

    /// An int8 scan searched as a block (`batches`: one pass over its codes per thread's run
    /// of rows) answers every row as a single search would, with per-row `ef`, on 1 to 3
    /// threads (runs of every length, a lone row included), next to an index searched per row.
    #[test]
    fn a_batched_scan_answers_each_row_as_a_single_search() {
        let a = crate::synth::ood(900, 7, DIM, 7);
        let keys = Arc::new(KeyStore::from_f32(a.keys.clone(), DIM).expect("keys"));
        let params = "flat:codes=i8".parse::<crate::IndexSpec>().expect("spec");
        let scan = params
            .build(keys.clone(), &a.train_queries, &CpuKnn)
            .expect("scan");
        let exact = FlatIndex::new(keys);
        let rows = a.test_queries.len() / DIM;
        assert!(rows >= 7, "{rows} test queries");
        let block = &a.test_queries[..7 * DIM];
        let indexes: [&dyn AnnIndex; 2] = [&scan, &exact];
        let per_row = |_: usize, r: usize| SearchParams {
            ef: Some(12 + 3 * r),
            ..SearchParams::default()
        };
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            let mut outs = Vec::new();
            pool.install(|| {
                search_many_into(
                    &indexes,
                    &[block, block],
                    &no_seeds,
                    10,
                    &per_row,
                    &ManyScratch::default(),
                    &mut outs,
                )
            })
            .expect("search_many");
            for (i, index) in indexes.iter().enumerate() {
                let mut sum = SearchStats::default();
                for (r, query) in block.chunks_exact(DIM).enumerate() {
                    let want = index
                        .search(query, 10, &per_row(i, r), &mut index.new_scratch())
                        .expect("search");
                    assert_eq!(
                        outs[i].outputs[r], want,
                        "{threads} threads, index {i} row {r}"
                    );
                    sum += want.stats;
                }
                assert_eq!(outs[i].stats, sum, "{threads} threads, index {i}");
            }
        }
        // The block path ran wherever the CPU has the batched kernel.
        let batched = crate::metric::int8::i8_kernels().scan_q8_many.is_some();
        assert_eq!(scan.batches(), batched);
        assert!(!exact.batches());
    }

    #[test]
    fn bad_shapes_and_failing_searches_are_errors() {
        let a = crate::synth::ood(100, 4, DIM, 3);
        let flat = FlatIndex::new(Arc::new(KeyStore::from_f32(a.keys, DIM).expect("keys")));
        let indexes: [&dyn AnnIndex; 2] = [&flat, &flat];
        let q = &a.test_queries[..DIM];
        let p = SearchParams::default();
        assert!(matches!(
            search_many(&indexes, &[q], 5, &p),
            Err(Error::DimensionMismatch { .. })
        ));
        assert!(matches!(
            search_many(&indexes, &[q, &q[1..]], 5, &p),
            Err(Error::DimensionMismatch { .. })
        ));
        assert!(matches!(
            search_many(&indexes, &[q, q], 101, &p),
            Err(Error::InvalidParam { .. })
        ));
        let mut nan = q.to_vec();
        nan[3] = f32::NAN;
        assert!(matches!(
            search_many(&indexes, &[q, &nan], 5, &p),
            Err(Error::NonFinite { .. })
        ));
        assert!(search_many(&[], &[], 5, &p).expect("empty").is_empty());
    }
}
