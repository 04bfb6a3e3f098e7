//! CPU exact top-k: `faer` matrix products over tiles of queries × keys, a bounded heap per
//! query row, rayon over query tiles.

use super::{
    check_among, check_knn_args, check_visible, map_positions, KnnBackend, KnnOptions, KnnResult,
};
use crate::error::{Error, Result};
use crate::scratch::TopK;
use crate::store::KeyStore;
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Query rows per tile (one rayon task each).
const QUERY_TILE: usize = 128;
/// Key rows per matrix product; a tile of scores is `QUERY_TILE × KEY_TILE` f32 (512 KiB, so
/// that it stays in L2 between the product that writes it and the selection that reads it).
const KEY_TILE: usize = 1024;

/// The reference exact-kNN backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuKnn;

impl KnnBackend for CpuKnn {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn topk(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> Result<KnnResult> {
        check_knn_args(queries, keys, k)?;
        let keys32 = keys.f32_rows();
        topk_rows(queries, &KeyRows::All(&keys32), keys.dim(), k, options)
    }

    /// Gathers each tile of 1,024 of the `ids` rows (converted to f32) into a buffer that stays
    /// in cache for its matrix product, instead of copying every row out first.
    fn topk_among(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        ids: &[u32],
        k: usize,
        options: &KnnOptions,
    ) -> Result<KnnResult> {
        check_among(queries, keys, ids, k)?;
        let mut found = topk_rows(
            queries,
            &KeyRows::Among { keys, ids },
            keys.dim(),
            k,
            options,
        )?;
        map_positions(&mut found, ids);
        Ok(found)
    }
}

/// The key rows a top-k scores, in order: every row of an f32 matrix, or the rows `ids` of a
/// store (results are then positions in `ids`).
enum KeyRows<'a> {
    All(&'a [f32]),
    Among { keys: &'a KeyStore, ids: &'a [u32] },
}

impl KeyRows<'_> {
    fn len(&self, d: usize) -> usize {
        match self {
            KeyRows::All(rows) => rows.len() / d.max(1),
            KeyRows::Among { ids, .. } => ids.len(),
        }
    }

    /// Rows `k0..k0 + kb` as `kb × d` f32: borrowed, or gathered into `buf`.
    fn tile<'b>(&'b self, k0: usize, kb: usize, d: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
        match self {
            KeyRows::All(rows) => &rows[k0 * d..(k0 + kb) * d],
            KeyRows::Among { keys, ids } => {
                buf.resize(kb * d, 0.0);
                for (row, &id) in buf.chunks_exact_mut(d).zip(&ids[k0..k0 + kb]) {
                    keys.row_into(id, row);
                }
                &buf[..kb * d]
            }
        }
    }
}

/// The exact top-`k` of every query over `rows` (tiles of up to [`QUERY_TILE`] queries, twice
/// that over gathered rows, × [`KEY_TILE`] keys, rayon over query tiles); ids are positions in `rows`. The caller checked the queries
/// and `k`.
fn topk_rows(
    queries: &[f32],
    rows: &KeyRows<'_>,
    d: usize,
    k: usize,
    options: &KnnOptions,
) -> Result<KnnResult> {
    let m = queries.len() / d;
    check_visible(options, m)?;
    let n = rows.len(d);
    let mut ids = vec![KnnResult::PAD; m * k];
    let mut scores = vec![f32::NEG_INFINITY; m * k];
    // Gathered rows are read once per query tile: up to twice the queries per tile there (a
    // pooled kNN's cluster is one tile), in as many equal tiles as needed.
    let most = match rows {
        KeyRows::All(_) => QUERY_TILE,
        KeyRows::Among { .. } => 2 * QUERY_TILE,
    };
    let qt = m.div_ceil(m.div_ceil(most).max(1)).max(1);
    ids.par_chunks_mut(qt * k)
        .zip(scores.par_chunks_mut(qt * k))
        .enumerate()
        .try_for_each_init(
            || {
                let tile = vec![0.0f32; qt * KEY_TILE];
                (
                    tile,
                    Vec::<f32>::new(),
                    Vec::<TopK>::new(),
                    Vec::<u32>::new(),
                    Vec::<f32>::new(),
                )
            },
            |(tile, gathered, heaps, row_ids, row_scores), (t, (ids_out, scores_out))| {
                options.cancel.check("exact top-k")?;
                let q0 = t * qt;
                let qb = ids_out.len() / k;
                let q = &queries[q0 * d..(q0 + qb) * d];
                heaps.resize_with(qb, TopK::default);
                for h in heaps.iter_mut() {
                    h.reset(k);
                }
                // Keys query q0 + r sees: 0..visible[q0 + r], or causal 0..=q0 + r, so none
                // past the tile's last row.
                let sees = |r: usize| match &options.visible {
                    Some(v) => (v[q0 + r] as usize).min(n),
                    None if options.causal => n.min(q0 + r + 1),
                    None => n,
                };
                let key_end = (0..qb).map(sees).max().unwrap_or(0);
                // Last key tile first: scores tend to rise towards a query's own position
                // (recent keys), so the thresholds rise early and fewer scores are kept.
                for k0 in (0..key_end).step_by(KEY_TILE).rev() {
                    let kb = KEY_TILE.min(key_end - k0);
                    let lhs = MatRef::from_row_major_slice(q, qb, d);
                    let rhs = MatRef::from_row_major_slice(rows.tile(k0, kb, d, gathered), kb, d);
                    let dst = MatMut::from_row_major_slice_mut(&mut tile[..qb * kb], qb, kb);
                    matmul(dst, Accum::Replace, lhs, rhs.transpose(), 1.0f32, Par::Seq);
                    for (r, heap) in heaps.iter_mut().enumerate() {
                        let row = &tile[r * kb..(r + 1) * kb];
                        let limit = sees(r).saturating_sub(k0).min(kb);
                        heap.push_block(&row[..limit], k0 as u32);
                    }
                }
                for (r, heap) in heaps.iter_mut().enumerate() {
                    let (i, s) = (&mut *row_ids, &mut *row_scores);
                    i.clear();
                    s.clear();
                    heap.drain_sorted(i, s);
                    ids_out[r * k..r * k + i.len()].copy_from_slice(i);
                    scores_out[r * k..r * k + s.len()].copy_from_slice(s);
                }
                Ok::<(), Error>(())
            },
        )?;
    Ok(KnnResult { k, ids, scores })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::scalar::dot_f64;

    fn brute(q: &[f32], keys: &[f32], d: usize, k: usize, causal_row: Option<usize>) -> Vec<u32> {
        let n = keys.len() / d;
        let visible = causal_row.map_or(n, |r| (r + 1).min(n));
        let mut s: Vec<(f64, u32)> = (0..visible)
            .map(|j| (dot_f64(q, &keys[j * d..(j + 1) * d]), j as u32))
            .collect();
        s.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        s.truncate(k);
        s.into_iter().map(|x| x.1).collect()
    }

    /// `m` queries and `n` keys of `d` standard normal values (seeded), and the keys' store.
    fn normal_case(m: usize, n: usize, d: usize, seed: u64) -> (Vec<f32>, Vec<f32>, KeyStore) {
        let mut rng = crate::synth::Rng::new(seed);
        let q: Vec<f32> = (0..m * d).map(|_| rng.normal()).collect();
        let kv: Vec<f32> = (0..n * d).map(|_| rng.normal()).collect();
        let store = KeyStore::from_f32(kv.clone(), d).expect("store");
        (q, kv, store)
    }

    #[test]
    fn matches_brute_force_plain_and_causal() {
        let (m, n, d, k) = (300, 5000, 24, 17);
        let (q, kv, store) = normal_case(m, n, d, 3);
        for causal in [false, true] {
            let r = CpuKnn
                .topk(&q, &store, k, &KnnOptions::causal(causal))
                .expect("knn");
            assert_eq!(r.rows(), m);
            for i in 0..m {
                let want = brute(&q[i * d..(i + 1) * d], &kv, d, k, causal.then_some(i));
                assert_eq!(r.row(i), &want[..], "row {i} causal {causal}");
                let sc = r.row_scores(i);
                assert!(sc.windows(2).all(|w| w[0] >= w[1]));
            }
        }
    }

    /// Per-row visible counts mask like causal rows, at any offset and in any order.
    #[test]
    fn visible_counts_mask_each_row() {
        let (m, n, d, k) = (150, 700, 8, 9);
        let (q, kv, store) = normal_case(m, n, d, 4);
        // Two pooled "heads" of 75 positions each over keys that start at position 20;
        // rows 0..20 of each see nothing, the last row sees more keys than exist.
        let mut visible: Vec<u32> = (0..m)
            .map(|i| ((i % 75) as u32).saturating_sub(20))
            .collect();
        visible[m - 1] = n as u32 + 5;
        let options = KnnOptions {
            visible: Some(visible.clone().into()),
            ..Default::default()
        };
        let r = CpuKnn.topk(&q, &store, k, &options).expect("knn");
        for i in 0..m {
            let sees = (visible[i] as usize).min(n);
            let want = brute(&q[i * d..(i + 1) * d], &kv, d, k, sees.checked_sub(1));
            let want = if sees == 0 { Vec::new() } else { want };
            assert_eq!(r.row(i), &want[..], "row {i} sees {sees}");
        }
        let short = KnnOptions {
            visible: Some(vec![1; m - 1].into()),
            ..Default::default()
        };
        assert!(matches!(
            CpuKnn.topk(&q, &store, k, &short),
            Err(Error::DimensionMismatch { .. })
        ));
    }

    /// The top-k among some keys is the top-k of those keys' rows, with key ids, on the CPU's
    /// tiled gather and on the trait's default (gather, then `topk`) alike; positions mask.
    #[test]
    fn topk_among_scores_only_the_given_keys() {
        struct ViaGather(CpuKnn);
        impl KnnBackend for ViaGather {
            fn name(&self) -> String {
                "default".into()
            }
            fn topk(
                &self,
                q: &[f32],
                keys: &KeyStore,
                k: usize,
                o: &KnnOptions,
            ) -> Result<KnnResult> {
                self.0.topk(q, keys, k, o)
            }
        }
        let (m, n, d, k) = (70, 3000, 16, 12);
        let (q, kv, _) = normal_case(m, n, d, 8);
        let store = KeyStore::from_f32_as(kv.clone(), d, crate::Dtype::F16).expect("f16");
        let half = store.to_f32();
        // Every third key from 7, ascending, and more than one key tile of them.
        let ids: Vec<u32> = (7..n as u32).step_by(3).collect();
        let sub: Vec<f32> = ids
            .iter()
            .flat_map(|&i| half[i as usize * d..][..d].iter().copied())
            .collect();
        let visible: Vec<u32> = (0..m as u32).map(|i| i * 17).collect();
        for options in [
            KnnOptions::default(),
            KnnOptions {
                visible: Some(visible.clone().into()),
                ..Default::default()
            },
        ] {
            let tiled = CpuKnn
                .topk_among(&q, &store, &ids, k, &options)
                .expect("among");
            let default = ViaGather(CpuKnn)
                .topk_among(&q, &store, &ids, k, &options)
                .expect("default");
            assert_eq!(tiled, default);
            for i in 0..m {
                let sees = options
                    .visible
                    .as_ref()
                    .map_or(ids.len(), |v| v[i] as usize);
                let want: Vec<u32> = brute(
                    &q[i * d..(i + 1) * d],
                    &sub[..sees.min(ids.len()) * d],
                    d,
                    k,
                    None,
                )
                .into_iter()
                .map(|p| ids[p as usize])
                .collect();
                assert_eq!(tiled.row(i), &want[..], "row {i}");
            }
        }
        let c = KnnOptions::default();
        assert!(matches!(
            CpuKnn.topk_among(&q, &store, &[1, n as u32], 1, &c),
            Err(Error::InvalidParam { name: "ids", .. })
        ));
        assert!(matches!(
            CpuKnn.topk_among(&q, &store, &[1, 2], 3, &c),
            Err(Error::InvalidParam { name: "k", .. })
        ));
    }

    #[test]
    fn bad_arguments_are_errors() {
        let store = KeyStore::from_f32(vec![1.0; 8], 4).expect("store");
        assert!(CpuKnn.topk(&[], &store, 1, &KnnOptions::default()).is_err());
        assert!(CpuKnn
            .topk(&[1.0; 5], &store, 1, &KnnOptions::default())
            .is_err());
        assert!(CpuKnn
            .topk(&[1.0; 4], &store, 3, &KnnOptions::default())
            .is_err());
        assert!(CpuKnn
            .topk(&[f32::NAN; 4], &store, 1, &KnnOptions::default())
            .is_err());
    }
}
