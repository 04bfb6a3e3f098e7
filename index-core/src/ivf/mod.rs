//! `IvfIndex`: the inverted-file baseline (faiss IVF-Flat with inner product).
//!
//! | file | job |
//! |---|---|
//! | `params.rs` | build parameters ([`IvfParams`]) |
//! | `codes.rs` | the lists on int8 or 4-bit codes (`codes=i8`, `codes=i4`) |
//! | `search.rs` | the search: centroids, then the probed lists (on the keys or their codes) |
//! | `mod.rs` | the index and its build |
//!
//! The keys are clustered into `nlist` lists by k-means (spherical by default, as faiss does
//! for inner product); each key goes to the list whose centroid has the largest inner product
//! with it. A search scores every centroid, takes the
//! `nprobe` best lists and scans them exactly. The index holds its own list-ordered copy of the
//! keys (same element type) with a position → id map, so each probed list is one streaming
//! scan of contiguous rows; it does not keep the caller's [`KeyStore`].
//!
//! `distance_computations` = `nlist` (centroids) + the keys of the probed lists, so it can
//! exceed `n` by at most `nlist` (the documented per-kind overhead). `hops` is 0.
//! `nprobe` larger than `nlist` is clamped to `nlist` (as faiss does): every list is scanned
//! and the result is exact.

mod codes;
mod file;
mod params;
mod search;

pub use crate::cluster::Assignment;
pub use codes::ListCodes;
pub use params::IvfParams;

use crate::cancel::Cancel;
use crate::cluster::{self, ArgmaxAssign, Assign, ClusteringParams, Init};
use crate::error::{Error, Result};
use crate::store::Buf;
use crate::store::KeyStore;
use std::sync::Arc;
use std::time::Instant;

/// What an IVF build did, and the wall time of each phase in seconds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BuildStats {
    pub nlist: usize,
    /// Keys k-means was trained on (all keys, or a strided sample).
    pub train_keys: usize,
    pub iters: usize,
    /// Empty clusters re-seeded during training.
    pub reseeded: usize,
    /// Smallest and largest list.
    pub min_list: usize,
    pub max_list: usize,
    /// faiss's imbalance factor `nlist · Σ size² / n²` (1 = perfectly even lists); the
    /// expected scan cost of a probe relative to even lists.
    pub imbalance: f64,
    pub kmeans_s: f64,
    pub assign_s: f64,
    pub total_s: f64,
}

/// Inverted-file index over one head's keys.
#[derive(Clone, Debug)]
pub struct IvfIndex {
    dim: usize,
    /// `nlist × dim` centroids, f32.
    centroids: KeyStore,
    /// The keys in list order (list 0 first), in the element type of the input keys.
    lists: Arc<KeyStore>,
    /// `ids[p]` is the original id of the key at list-order position `p` (`n` entries).
    /// Owned after a build, mapped after a load (as are the other arrays).
    ids: Buf<u32>,
    /// List `l` holds positions `offsets[l]..offsets[l + 1]` (`nlist + 1` entries).
    offsets: Buf<u32>,
    params: IvfParams,
    stats: BuildStats,
    /// The lists on int8 codes when `params.codes` asks for them (derived, never saved).
    codes: Option<ListCodes>,
}

impl IvfIndex {
    /// Builds the index over `keys`: k-means on (a sample of) the keys, then every key assigned
    /// to its list.
    ///
    /// Errors: empty keys, bad params.
    pub fn build(keys: &KeyStore, params: &IvfParams) -> Result<Self> {
        Self::build_with(keys, params, &Cancel::new())
    }

    /// [`IvfIndex::build`] that stops with [`Error::Cancelled`] once `cancel` is set (checked
    /// between k-means++ picks and Lloyd iterations).
    pub fn build_with(keys: &KeyStore, params: &IvfParams, cancel: &Cancel) -> Result<Self> {
        params.validate()?;
        let start = Instant::now();
        let n = keys.len();
        if n == 0 {
            return Err(Error::Empty { what: "keys" });
        }
        let dim = keys.dim();
        let nlist = params.nlist_for(n).min(n);
        let keys32 = keys.to_f32();
        let clustering = ClusteringParams {
            k: nlist,
            iters: params.iters,
            assignment: params.assignment,
            init: Init::PlusPlus,
            max_points_per_centroid: params.max_train_per_list,
            reseed_empty: true,
            seed: params.seed,
        };
        let trained = cluster::train(&keys32, dim, &clustering, &ArgmaxAssign, cancel)?;
        let kmeans_s = start.elapsed().as_secs_f64();
        cancel.check("IVF build")?;

        let t = Instant::now();
        let labels = ArgmaxAssign.assign(&keys32, &trained.centroids, dim)?;
        let mut offsets = vec![0u32; nlist + 1];
        for &l in &labels {
            offsets[l as usize + 1] += 1;
        }
        for l in 0..nlist {
            offsets[l + 1] += offsets[l];
        }
        let mut fill: Vec<u32> = offsets[..nlist].to_vec();
        let mut ids = vec![0u32; n];
        for (id, &l) in labels.iter().enumerate() {
            let slot = &mut fill[l as usize];
            ids[*slot as usize] = id as u32;
            *slot += 1;
        }
        // The rows of `ids`, in that order (int8 keeps its codes and scales).
        let lists = keys.gather(&ids)?;
        let centroids = KeyStore::from_f32(trained.centroids, dim)?;
        let sizes = offsets.windows(2).map(|w| (w[1] - w[0]) as usize);
        let sum_sq: f64 = sizes.clone().map(|s| (s * s) as f64).sum();
        let stats = BuildStats {
            nlist,
            train_keys: trained.points,
            iters: params.iters,
            reseeded: trained.reseeded,
            min_list: sizes.clone().min().unwrap_or(0),
            max_list: sizes.max().unwrap_or(0),
            imbalance: nlist as f64 * sum_sq / (n as f64 * n as f64),
            kmeans_s,
            assign_s: t.elapsed().as_secs_f64(),
            total_s: start.elapsed().as_secs_f64(),
        };
        let lists = Arc::new(lists);
        let codes = params
            .codes
            .scan_width()
            .map(|w| ListCodes::new(&lists, &offsets, w));
        Ok(IvfIndex {
            dim,
            centroids,
            lists,
            ids: Buf::Owned(ids),
            offsets: Buf::Owned(offsets),
            params: params.clone(),
            stats,
            codes,
        })
    }

    /// Assembles an index from parts (used by loaders): `centroids` (`nlist × dim` f32),
    /// `lists` (the `n` keys in list order), `ids` (`n` original ids in list order) and
    /// `offsets` (`nlist + 1` list boundaries into the positions). Checks the sizes and the
    /// two ends of `offsets` (O(1)); [`IvfIndex::validate`] scans the rest.
    pub fn from_parts(
        centroids: KeyStore,
        lists: Arc<KeyStore>,
        ids: Buf<u32>,
        offsets: Buf<u32>,
        params: &IvfParams,
    ) -> Result<Self> {
        params.validate()?;
        let (n, dim, nlist) = (lists.len(), lists.dim(), centroids.len());
        if centroids.dim() != dim {
            return Err(Error::DimensionMismatch {
                what: "IVF centroid dimension",
                expected: dim,
                got: centroids.dim(),
            });
        }
        if nlist == 0 || nlist > n {
            return Err(Error::invalid_param(
                "nlist",
                nlist,
                format!("must be in 1..={n} (the number of keys)"),
            ));
        }
        if ids.as_slice().len() != n {
            return Err(Error::DimensionMismatch {
                what: "IVF list ids (one per key)",
                expected: n,
                got: ids.as_slice().len(),
            });
        }
        let o = offsets.as_slice();
        if o.len() != nlist + 1 {
            return Err(Error::DimensionMismatch {
                what: "IVF list offsets (nlist + 1)",
                expected: nlist + 1,
                got: o.len(),
            });
        }
        if o.first() != Some(&0) || o.last().map(|&x| x as usize) != Some(n) {
            return Err(Error::invalid_param(
                "offsets",
                format!("{:?}..{:?}", o.first(), o.last()),
                format!("must start at 0 and end at n = {n}"),
            ));
        }
        let codes = params
            .codes
            .scan_width()
            .map(|w| ListCodes::new(&lists, o, w));
        Ok(IvfIndex {
            dim,
            centroids,
            lists,
            ids,
            offsets,
            params: params.clone(),
            stats: BuildStats::default(),
            codes,
        })
    }

    /// The full scan [`IvfIndex::from_parts`] skips: offsets never decrease, the ids are a
    /// permutation of `0..n`, every key and centroid is finite. Returns what is wrong.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(l) = self.offsets().windows(2).position(|w| w[0] > w[1]) {
            return Err(format!("list offsets decrease at list {l}"));
        }
        let n = self.ids.as_slice().len();
        let mut seen = vec![false; n];
        for (p, &id) in self.ids.as_slice().iter().enumerate() {
            match seen.get_mut(id as usize) {
                None => return Err(format!("key id {id} at position {p} is not below n = {n}")),
                Some(true) => return Err(format!("key id {id} appears twice (position {p})")),
                Some(s) => *s = true,
            }
        }
        if let Some(row) = self.lists.first_non_finite_row() {
            return Err(format!("list-order key row {row} holds NaN or infinity"));
        }
        if let Some(row) = self.centroids.first_non_finite_row() {
            return Err(format!("centroid {row} holds NaN or infinity"));
        }
        Ok(())
    }

    /// Number of lists.
    pub fn nlist(&self) -> usize {
        self.offsets.as_slice().len().saturating_sub(1)
    }

    /// The keys in list order (row `p` is key [`IvfIndex::list_ids`]`()[p]`).
    pub fn list_keys(&self) -> &Arc<KeyStore> {
        &self.lists
    }

    /// Original ids in list order (`n` entries).
    pub fn list_ids(&self) -> &[u32] {
        self.ids.as_slice()
    }

    /// List boundaries into the list-order positions (`nlist + 1` entries).
    pub fn offsets(&self) -> &[u32] {
        self.offsets.as_slice()
    }

    /// True when the arrays are borrowed from a file mapping.
    pub fn is_mapped(&self) -> bool {
        self.lists.is_mapped() && self.ids.is_mapped() && self.offsets.is_mapped()
    }

    /// The centroids (`nlist × dim`, f32).
    pub fn centroids(&self) -> &KeyStore {
        &self.centroids
    }

    /// Original ids of the keys of list `l`, in scan order.
    ///
    /// # Panics
    /// If `l >= nlist()`.
    pub fn list(&self, l: usize) -> &[u32] {
        let o = self.offsets.as_slice();
        match (o.get(l), o.get(l + 1)) {
            (Some(&s), Some(&e)) => self
                .ids
                .as_slice()
                .get(s as usize..e as usize)
                .unwrap_or(&[]),
            _ => panic!("list {l} out of range (nlist = {})", self.nlist()),
        }
    }

    /// Bytes held by the index: the list-ordered keys, the centroids, the id map and the list
    /// offsets (the caller's key store is not kept).
    pub fn bytes(&self) -> usize {
        self.lists.bytes()
            + self.centroids.bytes()
            + 4 * (self.ids.as_slice().len() + self.offsets.as_slice().len())
            + self.codes.as_ref().map_or(0, ListCodes::bytes)
    }

    /// [`IvfIndex::bytes`] per indexed key.
    pub fn bytes_per_key(&self) -> f64 {
        self.bytes() as f64 / self.ids.as_slice().len() as f64
    }

    /// Build parameters.
    pub fn params(&self) -> &IvfParams {
        &self.params
    }

    /// What the build did and how long each phase took.
    pub fn build_stats(&self) -> &BuildStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat::FlatIndex;
    use crate::scratch::Scratch;
    use crate::search::{AnnIndex, SearchParams};
    use std::sync::Arc;

    fn data(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::synth::Rng::new(seed);
        (0..n * dim).map(|_| rng.normal()).collect()
    }

    #[test]
    fn lists_partition_the_keys_and_keep_their_rows() {
        let dim = 8;
        let raw = data(1000, dim, 1);
        let keys = KeyStore::from_f32(raw.clone(), dim).expect("keys");
        let idx = IvfIndex::build(&keys, &IvfParams::default()).expect("build");
        assert_eq!(idx.nlist(), 126, "round(4·√1000)");
        let mut seen: Vec<u32> = (0..idx.nlist())
            .flat_map(|l| idx.list(l).to_vec())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<u32>>());
        let mut row = vec![0.0; dim];
        for (p, &id) in idx.list_ids().iter().enumerate() {
            idx.lists.row_into(p as u32, &mut row);
            assert_eq!(row, &raw[id as usize * dim..(id as usize + 1) * dim]);
        }
        let s = idx.build_stats();
        assert!(s.imbalance >= 1.0 && s.min_list <= s.max_list);
        assert_eq!(
            idx.bytes(),
            1000 * dim * 4 + 126 * dim * 4 + 4 * 1000 + 4 * 127
        );
    }

    #[test]
    fn codes_probing_every_list_with_every_candidate_is_exact() {
        let dim = 12;
        let keys = Arc::new(KeyStore::from_f32(data(500, dim, 4), dim).expect("keys"));
        let flat = FlatIndex::new(keys.clone());
        let p = IvfParams {
            codes: crate::codes::Codes::I8,
            ..Default::default()
        };
        assert_eq!(p.nlist_for(500), 22, "round(√500) with codes");
        let idx = IvfIndex::build(&keys, &p).expect("build");
        assert_eq!(idx.nlist(), 22);
        let codes = idx.codes.as_ref().expect("codes");
        assert!(idx.bytes() > codes.bytes());
        let mut scratch = Scratch::default();
        let queries = data(6, dim, 5);
        for q in queries.chunks_exact(dim) {
            let all = SearchParams {
                nprobe: Some(22),
                ef: Some(500),
                ..Default::default()
            };
            let got = idx.search(q, 10, &all, &mut scratch).expect("search");
            let want = flat
                .search(q, 10, &SearchParams::default(), &mut scratch)
                .expect("flat");
            assert_eq!(got.ids, want.ids);
            assert_eq!(got.scores, want.scores);
            assert_eq!(got.stats.code_estimates, 500);
            assert_eq!(got.stats.distance_computations, 22 + 500);
            // Two lists, 25 candidates: 25 exact products besides the centroids, best first.
            let few = SearchParams {
                nprobe: Some(2),
                ef: Some(25),
                ..Default::default()
            };
            let got = idx.search(q, 10, &few, &mut scratch).expect("search");
            assert_eq!(got.stats.distance_computations, 22 + 25);
            assert!(got.stats.code_estimates >= 25);
            assert!(got.scores.windows(2).all(|w| w[0] >= w[1]));
        }
        for bad in [
            IvfParams {
                codes: crate::codes::Codes::I8Inline,
                ..Default::default()
            },
            IvfParams {
                rerank: 50,
                ..Default::default()
            },
        ] {
            assert!(IvfIndex::build(&keys, &bad).is_err());
        }
    }

    #[test]
    fn build_is_deterministic_and_seed_dependent() {
        let keys = KeyStore::from_f32(data(800, 6, 2), 6).expect("keys");
        let p = IvfParams::default();
        let a = IvfIndex::build(&keys, &p).expect("a");
        let b = IvfIndex::build(&keys, &p).expect("b");
        assert_eq!(a.list_ids(), b.list_ids());
        assert_eq!(a.offsets(), b.offsets());
        let c = IvfIndex::build(&keys, &IvfParams { seed: 1, ..p }).expect("c");
        assert_ne!(a.offsets(), c.offsets());
    }

    #[test]
    fn probing_every_list_is_exact_and_counts_centroids() {
        let dim = 16;
        let raw = data(600, dim, 3);
        let keys = Arc::new(KeyStore::from_f32(raw.clone(), dim).expect("keys"));
        let flat = FlatIndex::new(keys.clone());
        for assignment in [Assignment::InnerProduct, Assignment::Spherical] {
            let idx = IvfIndex::build(
                &keys,
                &IvfParams {
                    nlist: Some(20),
                    assignment,
                    max_train_per_list: 10,
                    ..Default::default()
                },
            )
            .expect("build");
            assert_eq!(idx.build_stats().train_keys, 200, "strided training sample");
            let q = &data(1, dim, 4)[..];
            let mut s = idx.new_scratch();
            let exact = flat
                .search(q, 10, &SearchParams::default(), &mut s)
                .expect("flat");
            for nprobe in [20, 1000] {
                let got = idx
                    .search(q, 10, &SearchParams::with_nprobe(nprobe), &mut s)
                    .expect("ivf");
                assert_eq!(got.ids, exact.ids);
                assert_eq!(got.scores, exact.scores);
                assert_eq!(got.stats.distance_computations, 620);
            }
            let one = idx
                .search(q, 10, &SearchParams::with_nprobe(1), &mut s)
                .expect("nprobe 1");
            let l = (0..20)
                .find(|&l| idx.list(l).contains(&one.ids[0]))
                .expect("list");
            assert_eq!(
                one.stats.distance_computations,
                20 + idx.list(l).len() as u64
            );
            assert!(matches!(
                idx.search(q, 10, &SearchParams::with_nprobe(0), &mut s),
                Err(Error::InvalidParam { name: "nprobe", .. })
            ));
        }
    }

    #[test]
    fn bad_params_are_typed_errors() {
        let keys = KeyStore::from_f32(data(50, 4, 5), 4).expect("keys");
        for p in [
            IvfParams {
                nlist: Some(0),
                ..Default::default()
            },
            IvfParams {
                max_train_per_list: 0,
                ..Default::default()
            },
            IvfParams {
                default_nprobe: 0,
                ..Default::default()
            },
        ] {
            assert!(matches!(
                IvfIndex::build(&keys, &p),
                Err(Error::InvalidParam { .. })
            ));
        }
        let big = IvfIndex::build(
            &keys,
            &IvfParams {
                nlist: Some(500),
                ..Default::default()
            },
        )
        .expect("nlist capped at n");
        assert_eq!(big.nlist(), 50);
    }

    #[test]
    fn tiny_and_degenerate_inputs_build_and_search_exactly() {
        for (n, raw) in [
            (1usize, vec![0.5f32, -1.0]),
            (2, vec![1.0, 0.0, 0.0, 1.0]),
            (5, vec![1.0; 10]),
        ] {
            let keys = KeyStore::from_f32(raw, 2).expect("keys");
            for assignment in [Assignment::InnerProduct, Assignment::Spherical] {
                let p = IvfParams {
                    assignment,
                    ..Default::default()
                };
                let idx = IvfIndex::build(&keys, &p).expect("build");
                let out = idx
                    .search(
                        &[1.0, 1.0],
                        n,
                        &SearchParams::with_nprobe(n),
                        &mut idx.new_scratch(),
                    )
                    .expect("search");
                assert_eq!(out.ids.len(), n);
            }
        }
    }
}
