//! `HnswIndex`: hierarchical navigable small-world graphs (Malkov & Yashunin), the key–key
//! baseline (DESIGN.md §1).
//!
//! | file | job |
//! |---|---|
//! | `params.rs` | build parameters ([`HnswParams`]) |
//! | `build.rs` | levels, batched parallel insertion, the neighbour-selection heuristic |
//! | `upper.rs` | the levels above 0 in one compact CSR ([`UpperLevels`]), owned or mapped |
//! | `mod.rs` | the index and its search |
//!
//! Two modes ([`HnswParams::l2_reduction`]): HNSW built on the MIPS→L2 reduction (keys get
//! `sqrt(R² − |k|²)`, queries 0; the standard way to run a metric index on inner products), and
//! plain inner-product HNSW as hnswlib `space='ip'` and faiss build it. Under the reduction the
//! L2 ranking of a query equals its ranking by `q · k`, so both modes search the same way: on the
//! shared, unaugmented [`KeyStore`], by inner product.
//!
//! Search: greedy descent from the entry point through the levels above 0, then best-first beam
//! search ([`crate::graph::beam_search`]) on level 0 with `ef ≥ k` from where the descent ended
//! (plus caller-supplied seeds). `distance_computations` counts every inner product, the upper
//! levels' included; it is at most `n + `[`HnswIndex::search_overhead`].

mod build;
mod file;
mod params;
mod upper;

pub use build::BuildStats;
pub use params::{HnswParams, MAX_M};
pub use upper::{UpperLevel, UpperLevels};

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::graph::{beam_search, BeamSettings, Csr};
use crate::scratch::{Scored, Scratch};
use crate::search::{check_query, AnnIndex, IndexKind, SearchOutput, SearchParams, SearchStats};
use crate::store::KeyStore;
use std::sync::Arc;

/// HNSW over one head's keys.
#[derive(Clone, Debug)]
pub struct HnswIndex {
    keys: Arc<KeyStore>,
    /// Level 0: every key, lists of at most `2m` ids.
    level0: Csr,
    /// Levels `1..=L`, compact (lists of at most `m` ids).
    upper: UpperLevels,
    entry: u32,
    /// Keys present above level 0 (bounds the descent's inner products).
    upper_nodes: usize,
    params: HnswParams,
    stats: BuildStats,
}

impl HnswIndex {
    /// Builds HNSW over `keys` (in parallel on the rayon pool; the result does not depend on
    /// the number of threads).
    ///
    /// Errors: empty keys, bad params.
    pub fn build(keys: Arc<KeyStore>, params: &HnswParams) -> Result<Self> {
        build::build(keys, params, &Cancel::new())
    }

    /// [`HnswIndex::build`] that stops with [`Error::Cancelled`] once `cancel` is set (checked
    /// between insertion batches).
    pub fn build_with(keys: Arc<KeyStore>, params: &HnswParams, cancel: &Cancel) -> Result<Self> {
        build::build(keys, params, cancel)
    }

    /// Assembles an index from parts (used by loaders); validates sizes and the entry point.
    pub fn from_parts(
        keys: Arc<KeyStore>,
        level0: Csr,
        upper: UpperLevels,
        entry: u32,
        params: &HnswParams,
    ) -> Result<Self> {
        params.validate()?;
        let n = keys.len();
        if level0.len() != n {
            return Err(Error::DimensionMismatch {
                what: "HNSW level-0 nodes (one per key)",
                expected: n,
                got: level0.len(),
            });
        }
        if entry as usize >= n {
            return Err(Error::invalid_param(
                "entry",
                entry,
                "must be an id below n",
            ));
        }
        // Every key above level 0 is a node of level 1 (O(1): no scan).
        let upper_nodes = upper.nodes_above_0();
        Ok(HnswIndex {
            keys,
            level0,
            upper,
            entry,
            upper_nodes,
            params: params.clone(),
            stats: BuildStats::default(),
        })
    }

    /// The shared keys.
    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// Level 0 adjacency.
    pub fn level0(&self) -> &Csr {
        &self.level0
    }

    /// Levels `1..=max_level`.
    pub fn upper(&self) -> &UpperLevels {
        &self.upper
    }

    /// Where every search starts (a key of the highest level).
    pub fn entry(&self) -> u32 {
        self.entry
    }

    /// Build parameters.
    pub fn params(&self) -> &HnswParams {
        &self.params
    }

    /// What the build did and how long each phase took.
    pub fn build_stats(&self) -> &BuildStats {
        &self.stats
    }

    /// Inner products a search may compute beyond `n`: the upper levels' keys (the descent
    /// scores each at most once) plus 1 (level 0 re-scores the key the descent ended on).
    pub fn search_overhead(&self) -> u64 {
        self.upper_nodes as u64 + 1
    }
}

impl AnnIndex for HnswIndex {
    fn kind(&self) -> IndexKind {
        IndexKind::Hnsw
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn dim(&self) -> usize {
        self.keys.dim()
    }

    fn memory_bytes(&self) -> usize {
        self.level0.bytes() + self.upper.bytes()
    }

    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()> {
        check_query(query, self.keys.dim(), k, self.keys.len())?;
        let settings = BeamSettings::for_search(params, k, self.params.default_ef)?;
        let scorer = self.keys.scorer();
        let mut stats = SearchStats {
            distance_computations: 1,
            hops: 0,
            ..Default::default()
        };
        let mut cur = Scored {
            score: scorer.score(query, self.entry),
            id: self.entry,
        };
        scratch.visited.reset(self.keys.len());
        scratch.visited.insert(self.entry);
        let n = self.keys.len() as u32;
        for level in self.upper.iter().rev() {
            cur = build::greedy(&level, n, &scorer, query, cur, scratch, &mut stats);
        }
        beam_search(
            &self.level0,
            &scorer,
            query,
            &[&[cur.id], seeds],
            &settings,
            scratch,
            out,
        );
        out.stats += stats;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat::FlatIndex;
    use crate::synth::ood;

    fn keys(n: usize, dim: usize, seed: u64) -> (Arc<KeyStore>, Vec<f32>) {
        let d = ood(n, 16, dim, seed);
        (
            Arc::new(KeyStore::from_f32(d.keys, dim).expect("keys")),
            d.test_queries,
        )
    }

    #[test]
    fn structure_respects_the_list_bounds() {
        let (keys, _) = keys(1500, 16, 3);
        for p in [HnswParams::default(), HnswParams::inner_product()] {
            let idx = HnswIndex::build(keys.clone(), &p).expect("build");
            let n = keys.len();
            assert!(idx.level0().max_degree() <= 2 * p.m);
            for (l, g) in idx.upper().iter().enumerate() {
                assert!(g.max_degree() <= p.m, "level {}", l + 1);
                assert!(!g.neighbors(idx.entry()).is_empty() || g.edges() == 0);
            }
            let lists = |v: u32| {
                std::iter::once(idx.level0().neighbors(v))
                    .chain(idx.upper().iter().map(move |g| g.neighbors(v)))
            };
            for v in 0..n as u32 {
                for nb in lists(v) {
                    assert!(!nb.contains(&v), "self loop at {v}");
                    let mut s = nb.to_vec();
                    s.sort_unstable();
                    s.dedup();
                    assert_eq!(s.len(), nb.len(), "duplicate in list of {v}");
                }
            }
            let s = idx.build_stats();
            assert_eq!(s.max_level, idx.upper().len());
            assert_eq!(s.nodes_per_level[0], n);
            assert_eq!(s.edges_level0, idx.level0().edges());
            assert!(s.nodes_per_level.windows(2).all(|w| w[0] >= w[1]));
            assert!(s.unreachable <= n && s.stranded <= n);
            // Keys of level l ≥ 1 are the only ones with lists there.
            for (l, g) in idx.upper().iter().enumerate() {
                let with_links = (0..n as u32)
                    .filter(|&v| !g.neighbors(v).is_empty())
                    .count();
                assert!(with_links <= s.nodes_per_level[l + 1]);
                assert_eq!(g.nodes().len(), s.nodes_per_level[l + 1]);
            }
            assert_eq!(idx.upper().edges(), s.edges_upper);
            assert_eq!(
                idx.search_overhead(),
                s.nodes_per_level.get(1).copied().unwrap_or(0) as u64 + 1
            );
        }
    }

    #[test]
    fn build_does_not_depend_on_the_thread_count() {
        let (keys, _) = keys(1200, 16, 9);
        let build_on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool")
                .install(|| HnswIndex::build(keys.clone(), &HnswParams::default()))
                .expect("build")
        };
        let a = build_on(1);
        let b = build_on(3);
        assert_eq!(a.level0(), b.level0());
        assert_eq!(a.upper(), b.upper());
        assert_eq!(a.entry(), b.entry());
    }

    #[test]
    fn l2_reduced_graph_reaches_every_key_and_search_is_exact_at_full_ef() {
        let (keys, queries) = keys(1000, 16, 4);
        let idx = HnswIndex::build(keys.clone(), &HnswParams::default()).expect("build");
        assert_eq!(idx.build_stats().unreachable, 0);
        let flat = FlatIndex::new(keys.clone());
        let mut s = idx.new_scratch();
        for q in queries.chunks_exact(16).take(5) {
            let got = idx
                .search(q, 20, &SearchParams::with_ef(1000), &mut s)
                .expect("search");
            let want = flat
                .search(q, 20, &SearchParams::default(), &mut s)
                .expect("flat");
            assert_eq!(got.ids, want.ids);
            assert!(got.stats.distance_computations <= 1000 + idx.search_overhead());
        }
    }

    #[test]
    fn single_key_and_errors() {
        let one = Arc::new(KeyStore::from_f32(vec![1.0, 2.0], 2).expect("keys"));
        let idx = HnswIndex::build(one, &HnswParams::default()).expect("build");
        let out = idx
            .search(
                &[1.0, 1.0],
                1,
                &SearchParams::default(),
                &mut Scratch::default(),
            )
            .expect("search");
        assert_eq!(out.ids, vec![0]);
        assert_eq!(out.scores, vec![3.0]);
        let empty = Arc::new(KeyStore::empty(crate::Dtype::F32, 4).expect("empty"));
        assert!(matches!(
            HnswIndex::build(empty, &HnswParams::default()),
            Err(Error::Empty { .. })
        ));
        let (keys, _) = keys(50, 8, 1);
        let bad = HnswParams {
            m: 1,
            ..Default::default()
        };
        assert!(matches!(
            HnswIndex::build(keys.clone(), &bad),
            Err(Error::InvalidParam { name: "m", .. })
        ));
        let cancel = Cancel::new();
        cancel.cancel();
        assert!(matches!(
            HnswIndex::build_with(keys, &HnswParams::default(), &cancel),
            Err(Error::Cancelled { .. })
        ));
    }
}
