//! The one search interface every index kind implements.
//!
//! An index answers top-k maximum-inner-product queries: `search` returns the ids of the keys
//! with the largest `q · key`, best first, with their scores, and [`SearchStats`] saying what the
//! search computed. Query knobs travel in [`SearchParams`] per call (never `&mut self`), so one
//! index serves concurrent searches; per-thread buffers live in a [`Scratch`]. Extra entry
//! points of graph searches (seeds) travel beside the params ([`AnnIndex::search_seeded`]).

use crate::error::{Error, Result};
use crate::scratch::Scratch;
use rayon::prelude::*;
use std::ops::AddAssign;

/// Which kind of index answered. An [`crate::IndexSpec`] names a kind with its build
/// parameters (`hnsw-ip:m=32`); the kind is the family its presets belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    Attention,
    Flat,
    Hnsw,
    Ivf,
    Vamana,
}

impl IndexKind {
    /// The name used in reports and on the command line (the kind's default
    /// [`crate::IndexSpec`]).
    pub const fn name(self) -> &'static str {
        match self {
            IndexKind::Attention => "attention",
            IndexKind::Flat => "flat",
            IndexKind::Hnsw => "hnsw",
            IndexKind::Ivf => "ivf",
            IndexKind::Vamana => "vamana",
        }
    }
}

/// Per-call search parameters. Kinds read the fields that apply to them and reject values
/// that make no sense for them (for example `ef < k`) with [`Error::InvalidParam`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchParams {
    /// Candidate list size of graph searches (`ef ≥ k`); `None` takes the index default.
    pub ef: Option<usize>,
    /// Lists probed by IVF; `None` takes the index default.
    pub nprobe: Option<usize>,
    /// Beam width of graph searches: only the best `beam` items of the `ef` list are expanded
    /// (`1 ≤ beam`; `None` or `beam ≥ ef`: all of them). A width below `k` walks like a search
    /// with a list of `beam` items, the result still being the best `k` keys it scored: the
    /// settings below `ef = k` on a recall curve.
    pub beam: Option<usize>,
    /// Graph searches stop once their best `k` have not changed for this many expansions in a
    /// row, counted once the list holds `k` keys (`≥ 1`; `None`: no early stop, the search ends
    /// when the list of `ef` is expanded, which stays the cap). A query whose top-k settles
    /// early stops early, one that keeps finding better keys runs on: the cost follows the
    /// query instead of the worst query's `ef` (measured: docs/bench/stop-rules/).
    pub patience: Option<Patience>,
    /// The query head the query comes from, as its index among the query heads whose queries
    /// the index was built from (a GQA group's, in their pooled order). An index that measured
    /// an `ef` per query head (`auto-ef`) searches at that head's when `ef` is `None`; others
    /// ignore it.
    pub head: Option<usize>,
}

/// When a graph search stops early ([`SearchParams::patience`]): after a number of expansions
/// in a row without a change of the best `k`, given as a count or as a share of the search's
/// `ef`. With a share, a search given a long list (a hard head's `auto-ef`) also gets the
/// patience to use it: at `ef` 256 a fixed 32 stops the walks that 256 was measured for
/// (recall 0.984 where the list alone reaches 0.998 on SmolLM2's heads), a quarter (64) keeps
/// 0.994 at 0.78× the keys (docs/bench/stop-rules/).
///
/// Text: `32` (expansions) or `25%` (of `ef`, rounded up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// This many expansions (at least 1).
    Expansions(usize),
    /// This percentage of the search's `ef` (at least 1), rounded up.
    PercentOfEf(u32),
}

impl Patience {
    /// The expansions without a change a search with a list of `ef` waits for.
    pub fn expansions(self, ef: usize) -> usize {
        match self {
            Patience::Expansions(n) => n,
            Patience::PercentOfEf(p) => (ef * p as usize).div_ceil(100).max(1),
        }
    }

    /// Errors on a patience of 0 (of either form).
    pub fn validate(self) -> Result<()> {
        match self {
            Patience::Expansions(0) | Patience::PercentOfEf(0) => Err(Error::invalid_param(
                "patience",
                self,
                "must be at least 1 (an expansion or 1 % of ef)",
            )),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Patience {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Patience::Expansions(n) => write!(f, "{n}"),
            Patience::PercentOfEf(p) => write!(f, "{p}%"),
        }
    }
}

impl std::str::FromStr for Patience {
    type Err = Error;

    /// `32` or `25%`; 0 of either is refused.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let bad = || {
            Error::invalid_param(
                "patience",
                s,
                "expected a number of expansions (32) or a percentage of ef (25%)",
            )
        };
        let p = match t.strip_suffix('%') {
            Some(pct) => Patience::PercentOfEf(pct.trim().parse().map_err(|_| bad())?),
            None => Patience::Expansions(t.parse().map_err(|_| bad())?),
        };
        p.validate()?;
        Ok(p)
    }
}

impl serde::Serialize for Patience {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl SearchParams {
    /// Parameters with only `ef` set.
    pub fn with_ef(ef: usize) -> Self {
        SearchParams {
            ef: Some(ef),
            ..Default::default()
        }
    }

    /// Parameters with only `nprobe` set.
    pub fn with_nprobe(nprobe: usize) -> Self {
        SearchParams {
            nprobe: Some(nprobe),
            ..Default::default()
        }
    }
}

/// What one search computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SearchStats {
    /// Full-precision inner products of the query with any stored vector (keys, centroids,
    /// training queries, upper graph layers). `scanned = distance_computations / n`.
    pub distance_computations: u64,
    /// Graph nodes expanded (0 for non-graph kinds).
    pub hops: u64,
    /// Inner products estimated from key codes (a graph traversal on int8 codes, issue 26),
    /// not counted in `distance_computations`: each reads a quarter of an f32 row's bytes.
    pub code_estimates: u64,
}

impl AddAssign for SearchStats {
    fn add_assign(&mut self, rhs: Self) {
        self.distance_computations += rhs.distance_computations;
        self.hops += rhs.hops;
        self.code_estimates += rhs.code_estimates;
    }
}

/// Result of one search: ids and scores best first (equal lengths, at most k), and stats.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SearchOutput {
    pub ids: Vec<u32>,
    pub scores: Vec<f32>,
    pub stats: SearchStats,
}

impl SearchOutput {
    /// Empties the output, keeping its allocations.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.scores.clear();
        self.stats = SearchStats::default();
    }
}

/// A top-k maximum-inner-product index over the keys of one head.
pub trait AnnIndex: Send + Sync {
    /// The kind of this index.
    fn kind(&self) -> IndexKind;

    /// Number of indexed keys.
    fn len(&self) -> usize;

    /// True when no key is indexed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dimension of keys and queries.
    fn dim(&self) -> usize;

    /// Bytes of the index structure (graph, lists, centroids, copies of keys it owns), not
    /// counting the shared [`crate::KeyStore`] it searches.
    fn memory_bytes(&self) -> usize;

    /// Searches the `k` keys with the largest `query · key` and writes them into `out` (cleared
    /// first), best first, starting graph searches also from `seeds` (key ids, for example keys
    /// recalled by ReTopK or retrieved at the previous decode step): graph kinds add them to
    /// their entry points (ids out of range are ignored); kinds without entry points (flat, IVF)
    /// ignore them. Reuses `scratch` and `out`; allocates nothing once they have grown.
    ///
    /// Errors: a query of the wrong dimension or with non-finite values, `k == 0`, `k > n`,
    /// and parameters the kind rejects.
    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()>;

    /// [`AnnIndex::search_seeded`] without seeds.
    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()> {
        self.search_seeded(query, k, params, &[], scratch, out)
    }

    /// [`AnnIndex::search_into`] returning a fresh output.
    fn search(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        scratch: &mut Scratch,
    ) -> Result<SearchOutput> {
        let mut out = SearchOutput::default();
        self.search_into(query, k, params, scratch, &mut out)?;
        Ok(out)
    }

    /// Whether [`AnnIndex::search_rows`] shares work across the rows of a block (the int8
    /// scan reads its codes once per block, not once per query): [`crate::search_many_into`]
    /// then gives each thread a run of an index's queries instead of one query per task.
    fn batches(&self) -> bool {
        false
    }

    /// [`AnnIndex::search_seeded`] of every query of `queries` (whole rows of
    /// [`AnnIndex::dim`]) into `outs` (one per row), row `r` with `params(r)` and `seeds(r)`:
    /// the results and stats of one search per row, which is what this default runs
    /// ([`search_each_row`]); an index that [`AnnIndex::batches`] shares the work.
    ///
    /// Errors: as [`AnnIndex::search_seeded`], and a block that is not `outs.len()` whole rows.
    fn search_rows<'s>(
        &self,
        queries: &[f32],
        k: usize,
        params: &dyn Fn(usize) -> SearchParams,
        seeds: &dyn Fn(usize) -> &'s [u32],
        scratch: &mut Scratch,
        outs: &mut [SearchOutput],
    ) -> Result<()> {
        search_each_row(self, queries, k, params, seeds, scratch, outs)
    }

    /// A scratch sized for this index.
    fn new_scratch(&self) -> Scratch {
        Scratch::new(self.len())
    }
}

/// The default [`AnnIndex::search_rows`]: one [`AnnIndex::search_seeded`] per row.
pub fn search_each_row<'s, I: AnnIndex + ?Sized>(
    index: &I,
    queries: &[f32],
    k: usize,
    params: &dyn Fn(usize) -> SearchParams,
    seeds: &dyn Fn(usize) -> &'s [u32],
    scratch: &mut Scratch,
    outs: &mut [SearchOutput],
) -> Result<()> {
    let dim = index.dim();
    check_rows(queries, dim, outs.len())?;
    for (r, (query, out)) in queries.chunks_exact(dim).zip(outs).enumerate() {
        index.search_seeded(query, k, &params(r), seeds(r), scratch, out)?;
    }
    Ok(())
}

/// Checks that `queries` is `rows` whole rows of `dim` values.
pub fn check_rows(queries: &[f32], dim: usize, rows: usize) -> Result<()> {
    if dim == 0 || queries.len() != rows * dim {
        return Err(Error::DimensionMismatch {
            what: "query block (one whole row per output)",
            expected: rows * dim,
            got: queries.len(),
        });
    }
    Ok(())
}

/// Checks the arguments every search shares: query dimension, finiteness, and `0 < k ≤ n`.
pub fn check_query(query: &[f32], dim: usize, k: usize, n: usize) -> Result<()> {
    if query.len() != dim {
        return Err(Error::DimensionMismatch {
            what: "query",
            expected: dim,
            got: query.len(),
        });
    }
    if query.iter().any(|x| !x.is_finite()) {
        return Err(Error::NonFinite {
            what: "query",
            row: 0,
        });
    }
    if k == 0 {
        return Err(Error::invalid_param("k", k, "must be at least 1"));
    }
    if k > n {
        return Err(Error::invalid_param(
            "k",
            k,
            format!("larger than the number of keys ({n})"),
        ));
    }
    Ok(())
}

/// Searches one query per index in parallel (rayon), as a decode step does for the heads of
/// a layer: `results[i]` answers `queries[i]` on `indexes[i]`.
pub fn search_batch(
    indexes: &[&dyn AnnIndex],
    queries: &[&[f32]],
    k: usize,
    params: &SearchParams,
) -> Result<Vec<SearchOutput>> {
    if indexes.len() != queries.len() {
        return Err(Error::DimensionMismatch {
            what: "queries (one per index)",
            expected: indexes.len(),
            got: queries.len(),
        });
    }
    indexes
        .par_iter()
        .zip(queries.par_iter())
        .map_init(
            || Scratch::new(0),
            |scratch, (index, query)| index.search(query, k, params, scratch),
        )
        .collect()
}
