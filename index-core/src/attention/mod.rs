//! `AttentionIndex`: the query-aware projected graph (DESIGN.md §1).
//!
//! | file | job |
//! |---|---|
//! | `params.rs` | build parameters, presets (ours, the RoarGraph recipe, the key–key graph) |
//! | `build.rs` | `AttentionIndex::build*`: the build's phases in order: bipartite kNN → projection → connectivity → far check, `ef` calibration (the checks and the graph kNN get the builder as a closure) |
//! | `coarse.rs` | approximate top-`kq` lists of the build through a coarse IVF ([`TrainKnn::Probe`]) |
//! | `graph_knn.rs` | approximate top-`kq` lists of the build searched in a graph built first ([`TrainKnn::Graph`]) |
//! | `pool_knn.rs` | approximate top-`kq` lists of the build from pools shared by clustered queries ([`TrainKnn::Pool`]) |
//! | `train_lists.rs` | thinning of the training queries, and causal lists unmasked ([`AttentionParams::global_full`]) |
//! | `projection.rs` | lists → each key's ranked candidates → pruned out-edges, sequence and reverse edges |
//! | `entries.rs` | the entry points a build chooses ([`EntryRule`], recent keys) |
//! | `prune_check.rs` | the prune check: the same lists pruned by two rules, one kept on held-out recent queries |
//! | `far_check.rs` | the far check: causal or full lists, chosen on held-out recent queries |
//! | `auto_ef.rs` | the `ef` a build measures its held-out recent queries need ([`AutoEf`]) |
//! | `file.rs` | the index's file sections |
//! | `insert.rs` | query-aware insertion of keys that arrive after the build (decode) |
//! | `by_length.rs` | the kNN chosen by the number of keys ([`AttentionParams::for_keys`], [`LONG_POOL`]) |
//! | `stats.rs` | the figures of a build and of its checks ([`BuildStats`], [`FarCheck`], [`PruneCheck`], [`AutoEf`], [`ScanCheck`]) |
//! | `mod.rs` | the index type and its search |
//!
//! Floors (`scripts/check-floors.py` fails on a file-level cycle): `stats.rs`, `params.rs` and
//! the list makers at the bottom; `mod.rs` (the index type) above them; the held-out checks,
//! `insert.rs` and `file.rs` above the index; `build.rs` on top.
//!
//! Pruning ([`crate::graph::prune()`]), reachability and the connectivity repair
//! ([`crate::graph::repair`]) come from [`crate::graph`], shared with the other graph kinds.
//!
//! The structure comes from the queries' side: keys that the same training queries rank close
//! together become neighbours, so a beam search driven by a new query walks through keys that
//! queries like it found. Search is best-first with a list of `ef ≥ k` from fixed entry points
//! (plus caller-supplied seeds, [`AnnIndex::search_seeded`]) and reports every inner product it
//! computes.

mod auto_ef;
mod build;
mod by_length;
mod coarse;
mod entries;
mod far_check;
mod file;
mod graph_knn;
mod insert;
mod params;
mod pool_knn;
mod projection;
mod prune_check;
mod stats;
mod train_lists;

pub use crate::codes::Codes;
pub use crate::graph::Prune;
pub use by_length::LONG_POOL;
pub use far_check::CHECK_K;
pub use params::{off_at_zero, AttentionParams, EntryRule, Projection, TrainKnn, TrainOn};
pub use pool_knn::PooledKnn;
pub use stats::{AutoEf, BuildStats, FarCheck, PruneCheck, ScanCheck};

use crate::codes::{KeyCodes, ScanCodes};
use crate::error::{Error, Result};
use crate::graph::codes::search_codes;
use crate::graph::inline::InlineCodes;
use crate::graph::{beam_search, BeamSettings, Csr, Neighbors};
use crate::scratch::Scratch;
use crate::search::{
    check_query, check_rows, search_each_row, AnnIndex, IndexKind, SearchOutput, SearchParams,
};
use crate::store::KeyStore;
use std::borrow::Cow;
use std::sync::Arc;

/// The query-aware graph index over one head's keys.
#[derive(Clone, Debug)]
pub struct AttentionIndex {
    keys: Arc<KeyStore>,
    graph: Adjacency,
    entries: Vec<u32>,
    /// `entries[..built_entries]` came with the build (or file); inserts add recent keys after.
    built_entries: usize,
    /// Keys of the build (or file); ids from here on were inserted.
    built_len: usize,
    params: AttentionParams,
    stats: BuildStats,
    /// Traversal codes of the keys when `params.codes` asks for them (issue 26).
    codes: Option<KeyCodes>,
    /// The neighbours' codes inline with the adjacency (`params.codes` = `i8-inline`).
    inline: Option<InlineCodes>,
    /// The int8 scan of the keys for the query heads routed to it (`params.head_scan`).
    scan: Option<ScanCodes>,
}

/// The out-edges: the CSR a build (or a file) produced, or editable lists once keys have been
/// inserted (the first insert converts).
#[derive(Clone, Debug)]
enum Adjacency {
    Frozen(Csr),
    Growing(Vec<Vec<u32>>),
}

/// Searches run on either form (one predictable branch per expanded node).
impl Neighbors for Adjacency {
    fn node_count(&self) -> usize {
        match self {
            Adjacency::Frozen(g) => g.len(),
            Adjacency::Growing(l) => l.len(),
        }
    }
    #[inline]
    fn neighbors_of(&self, v: u32) -> &[u32] {
        match self {
            Adjacency::Frozen(g) => g.neighbors(v),
            Adjacency::Growing(l) => l.neighbors_of(v),
        }
    }
}

impl AttentionIndex {
    /// Assembles an index from parts (used by loaders); validates ids and sizes.
    pub fn from_parts(
        keys: Arc<KeyStore>,
        graph: Csr,
        entries: Vec<u32>,
        params: &AttentionParams,
    ) -> Result<Self> {
        if graph.len() != keys.len() {
            return Err(Error::DimensionMismatch {
                what: "graph nodes (one per key)",
                expected: keys.len(),
                got: graph.len(),
            });
        }
        if entries.is_empty() || entries.iter().any(|&e| e as usize >= keys.len()) {
            return Err(Error::invalid_param(
                "entries",
                format!("{entries:?}"),
                "must be non-empty ids below n",
            ));
        }
        params.validate()?;
        let codes = match params.codes {
            Codes::None | Codes::I4 => None,
            Codes::I8 | Codes::I8Inline => Some(KeyCodes::new(&keys)),
        };
        let inline = match (&codes, params.codes) {
            (Some(codes), Codes::I8Inline) => Some(InlineCodes::new(&graph, codes)),
            _ => None,
        };
        let scan = scan_codes(&keys, &params.head_scan);
        Ok(AttentionIndex {
            codes,
            inline,
            scan,
            built_len: keys.len(),
            keys,
            graph: Adjacency::Frozen(graph),
            built_entries: entries.len(),
            entries,
            params: params.clone(),
            stats: BuildStats::default(),
        })
    }

    /// The shared keys.
    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// The adjacency as CSR (borrowed; assembled from the lists after inserts).
    ///
    /// Errors: after inserts, more edges than the CSR's `u32` offsets hold
    /// ([`Error::InvalidParam`] named `edges`).
    pub fn graph(&self) -> Result<Cow<'_, Csr>> {
        match &self.graph {
            Adjacency::Frozen(g) => Ok(Cow::Borrowed(g)),
            Adjacency::Growing(lists) => Csr::from_lists(lists).map(Cow::Owned),
        }
    }

    /// Number of edges (without assembling a CSR).
    pub fn edges(&self) -> usize {
        match &self.graph {
            Adjacency::Frozen(g) => g.edges(),
            Adjacency::Growing(lists) => lists.iter().map(Vec::len).sum(),
        }
    }

    /// Fixed entry points of every search.
    pub fn entries(&self) -> &[u32] {
        &self.entries
    }

    /// Build parameters.
    pub fn params(&self) -> &AttentionParams {
        &self.params
    }

    /// The `ef` of a search that sets none, for query head `head` ([`SearchParams::head`]):
    /// the head's measured one where the build measured one per head, else `default_ef`.
    pub fn default_ef(&self, head: Option<usize>) -> usize {
        head.and_then(|h| self.params.head_ef.get(h).copied())
            .unwrap_or(self.params.default_ef)
    }

    /// What the build did and how long each phase took.
    pub fn build_stats(&self) -> &BuildStats {
        &self.stats
    }

    /// The held-out recent rows of `rows` training queries that the build's checks measure
    /// on, per query head of the group (`visible`: each row's visible key count, as given to
    /// the build; `None`: every row sees every key).
    pub fn check_rows(&self, rows: usize, visible: Option<&[u32]>) -> Vec<Vec<usize>> {
        let n = self.len();
        let all;
        let visible = match visible {
            Some(v) if v.len() == rows => v,
            _ => {
                all = vec![n as u32; rows];
                &all
            }
        };
        far_check::check_rows(visible, self.params.queries_per_key, n)
    }

    /// Records the structure check the spec's build ran on this graph.
    pub(crate) fn record_scan_check(&mut self, check: ScanCheck) {
        self.stats.scan_check = Some(check);
    }

    /// Routes the searches of the query heads marked true in `heads` (the order of
    /// [`AttentionParams::head_ef`]; [`SearchParams::head`] names them) to an int8 scan of the
    /// keys with an exact re-rank of the best `k + k/4` estimates (the search of
    /// `flat:codes=i8`), and the others to the graph; an empty or all-false `heads` routes every
    /// head to the graph. The scan's codes are made here and kept in step with inserts. A file
    /// keeps the routes ([`AttentionParams::head_scan`]).
    pub fn route_heads_to_scan(&mut self, heads: Vec<bool>) {
        self.scan = scan_codes(&self.keys, &heads);
        self.params.head_scan = heads;
    }

    /// Whether searches of query head `head` scan the int8 codes (see
    /// [`AttentionIndex::route_heads_to_scan`]).
    pub fn head_scans(&self, head: Option<usize>) -> bool {
        self.scan.is_some()
            && head.is_some_and(|h| self.params.head_scan.get(h).copied().unwrap_or(false))
    }
}

/// Candidates a routed head's scan re-ranks, as `flat:codes=i8` does: `ef` when set, else
/// `k + k/4` (at least `k`).
fn scan_candidates(k: usize, params: &SearchParams) -> usize {
    params.ef.unwrap_or(k + k / 4).max(k)
}

/// The int8 scan codes of `keys` when some head is routed to them.
fn scan_codes(keys: &KeyStore, heads: &[bool]) -> Option<ScanCodes> {
    heads
        .contains(&true)
        .then(|| ScanCodes::new(keys, crate::codes::Width::I8))
}

impl AnnIndex for AttentionIndex {
    fn kind(&self) -> IndexKind {
        IndexKind::Attention
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn dim(&self) -> usize {
        self.keys.dim()
    }

    fn memory_bytes(&self) -> usize {
        let graph = match &self.graph {
            Adjacency::Frozen(g) => g.bytes(),
            Adjacency::Growing(lists) => lists
                .iter()
                .map(|l| std::mem::size_of::<Vec<u32>>() + l.capacity() * 4)
                .sum(),
        };
        graph
            + std::mem::size_of_val(self.entries.as_slice())
            + self.codes.as_ref().map_or(0, KeyCodes::bytes)
            + self.inline.as_ref().map_or(0, InlineCodes::bytes)
            + self.scan.as_ref().map_or(0, ScanCodes::bytes)
    }

    /// With query heads routed to the scan, the block's rows of those heads share one pass
    /// over the codes (as `flat:codes=i8` does for a group); the other rows walk.
    fn batches(&self) -> bool {
        self.scan.as_ref().is_some_and(ScanCodes::batches)
    }

    fn search_rows<'s>(
        &self,
        queries: &[f32],
        k: usize,
        params: &dyn Fn(usize) -> SearchParams,
        seeds: &dyn Fn(usize) -> &'s [u32],
        scratch: &mut Scratch,
        outs: &mut [SearchOutput],
    ) -> Result<()> {
        let Some(scan) = self.scan.as_ref().filter(|s| s.batches()) else {
            return search_each_row(self, queries, k, params, seeds, scratch, outs);
        };
        let (n, dim) = (self.keys.len(), self.keys.dim());
        check_rows(queries, dim, outs.len())?;
        let mut routed = Vec::new();
        for (r, (query, out)) in queries.chunks_exact(dim).zip(outs.iter_mut()).enumerate() {
            let p = params(r);
            if self.head_scans(p.head) {
                check_query(query, dim, k, n)?;
                routed.push(r);
            } else {
                self.search_seeded(query, k, &p, seeds(r), scratch, out)?;
            }
        }
        if routed.is_empty() {
            return Ok(());
        }
        let block: Vec<f32> = routed
            .iter()
            .flat_map(|&r| queries[r * dim..(r + 1) * dim].iter().copied())
            .collect();
        let mut block_outs: Vec<SearchOutput> = routed
            .iter()
            .map(|&r| std::mem::take(&mut outs[r]))
            .collect();
        let candidates = |i: usize| scan_candidates(k, &params(routed[i]));
        let scorer = self.keys.scorer();
        scan.search_rows(&scorer, &block, k, &candidates, scratch, &mut block_outs);
        for (&r, out) in routed.iter().zip(block_outs) {
            outs[r] = out;
        }
        Ok(())
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
        let settings = BeamSettings::for_search(params, k, self.default_ef(params.head))?;
        let scorer = self.keys.scorer();
        if let Some(scan) = self.scan.as_ref().filter(|_| self.head_scans(params.head)) {
            scan.search(&scorer, query, k, scan_candidates(k, params), scratch, out);
            return Ok(());
        }
        let entries: [&[u32]; 2] = [&self.entries, seeds];
        match &self.codes {
            Some(codes) => search_codes(
                &self.graph,
                codes,
                self.inline.as_ref(),
                &scorer,
                query,
                &entries,
                &settings,
                self.params.rerank,
                scratch,
                out,
            ),
            None => beam_search(
                &self.graph,
                &scorer,
                query,
                &entries,
                &settings,
                scratch,
                out,
            ),
        }
        Ok(())
    }
}
