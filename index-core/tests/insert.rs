//! Keys inserted after the build (decode): the grown `AttentionIndex` stays connected, keeps its
//! degree bound (2 · max_degree + 1), answers like an index rebuilt over all keys, and saves and loads.

use proptest::prelude::*;
use qkindex::attention::Prune;
use qkindex::synth::ood;
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, Error, FlatIndex, KeyStore, Scratch,
    SearchParams,
};
use std::sync::Arc;

const DIM: usize = 32;

/// The train query with the largest inner product with `key`: what a decode query that attended
/// to the key looks like.
fn best_query<'a>(train: &'a [f32], key: &[f32]) -> &'a [f32] {
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    train
        .chunks_exact(DIM)
        .max_by(|a, b| dot(a, key).total_cmp(&dot(b, key)))
        .unwrap_or(&train[..DIM])
}

fn mean_recall(
    index: &dyn AnnIndex,
    flat: &FlatIndex,
    queries: &[f32],
    k: usize,
    ef: usize,
) -> f64 {
    let mut scratch = Scratch::new(index.len());
    let mut total = 0.0;
    let mut count = 0;
    for q in queries.chunks_exact(DIM) {
        let found = index
            .search(q, k, &SearchParams::with_ef(ef), &mut scratch)
            .expect("valid test input");
        let exact = flat
            .search(q, k, &SearchParams::default(), &mut scratch)
            .expect("valid test input");
        total += qkindex::eval::recall(&found.ids, &exact.ids);
        count += 1;
    }
    total / count as f64
}

#[test]
fn grown_index_matches_a_rebuild() {
    let n = 3000;
    let n0 = 2000;
    let data = ood(n, 3000, DIM, 11);
    let params = AttentionParams::default();
    let base = Arc::new(
        KeyStore::from_f32(data.keys[..n0 * DIM].to_vec(), DIM).expect("valid test input"),
    );
    let mut grown = AttentionIndex::build(base, &data.train_queries, &params, &CpuKnn)
        .expect("valid test input");
    let mut scratch = Scratch::new(n);
    for (i, key) in data.keys.chunks_exact(DIM).enumerate().skip(n0) {
        let guide = best_query(&data.train_queries, key);
        let id = grown
            .insert(key, guide, &mut scratch)
            .expect("valid test input");
        assert_eq!(id as usize, i);
    }
    assert_eq!(grown.len(), n);

    let g = grown.graph().expect("graph");
    assert_eq!(g.len(), n);
    assert!(
        g.max_degree() <= 2 * params.max_degree + 1,
        "degree {}",
        g.max_degree()
    );
    let reached = g.reachable(grown.entries());
    assert!(
        reached.iter().all(|&r| r),
        "every key reachable after inserts"
    );
    assert!(
        grown.entries().contains(&(n as u32 - 1)),
        "the newest key is an entry"
    );

    let all = Arc::new(KeyStore::from_f32(data.keys.clone(), DIM).expect("valid test input"));
    let rebuilt = AttentionIndex::build(all.clone(), &data.train_queries, &params, &CpuKnn)
        .expect("valid test input");
    let flat = FlatIndex::new(all);
    let r_grown = mean_recall(&grown, &flat, &data.test_queries, 10, 64);
    let r_rebuilt = mean_recall(&rebuilt, &flat, &data.test_queries, 10, 64);
    eprintln!("recall@10 ef 64: grown {r_grown:.3}, rebuilt {r_rebuilt:.3}");
    assert!(
        r_grown >= r_rebuilt - 0.05,
        "grown {r_grown} vs rebuilt {r_rebuilt}"
    );

    // The grown index saves and loads like a built one.
    let dir = tempfile::tempdir().expect("valid test input");
    let path = dir.path().join("grown.qki");
    grown.save(&path).expect("valid test input");
    let loaded = qkindex::io::load(&path, &Default::default()).expect("valid test input");
    // The file holds the grown graph, every edge of it (`graph()` assembles the lists or fails;
    // it never hands the writer an empty graph).
    let saved = loaded.as_attention().expect("an attention index");
    assert_eq!(*saved.graph().expect("graph"), *g);
    assert_eq!(saved.edges(), grown.edges());
    assert!(grown.edges() >= n, "{} edges", grown.edges());
    let q = &data.test_queries[..DIM];
    let a = grown
        .search(q, 10, &SearchParams::with_ef(64), &mut scratch)
        .expect("valid test input");
    let b = loaded
        .search(q, 10, &SearchParams::with_ef(64), &mut scratch)
        .expect("valid test input");
    assert_eq!(a.ids, b.ids);
}

#[test]
fn insert_copies_a_shared_store_and_checks_input() {
    let data = ood(300, 300, DIM, 3);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), DIM).expect("valid test input"));
    let mut index = AttentionIndex::build(
        keys.clone(),
        &data.train_queries,
        &AttentionParams::default(),
        &CpuKnn,
    )
    .expect("valid test input");
    let mut flat = FlatIndex::new(keys.clone());
    let mut scratch = Scratch::new(301);
    let key = &data.heldout_keys[..DIM];
    assert_eq!(
        index
            .insert(key, &[], &mut scratch)
            .expect("valid test input"),
        300
    );
    assert_eq!(flat.insert(key).expect("valid test input"), 300);
    assert_eq!(keys.len(), 300, "the shared store is not changed");
    assert_eq!(index.len(), 301);

    let bad = index.insert(&key[..DIM - 1], &[], &mut scratch);
    assert!(
        matches!(bad, Err(Error::DimensionMismatch { .. })),
        "{bad:?}"
    );
    let mut nan = key.to_vec();
    nan[3] = f32::NAN;
    assert!(index.insert(&nan, &[], &mut scratch).is_err());
    assert!(index.insert(key, &key[..5], &mut scratch).is_err());
    assert!(index.insert(key, &nan, &mut scratch).is_err());
    assert!(flat.insert(&nan).is_err());
    assert_eq!(index.len(), 301, "failed inserts change nothing");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Any sequence of inserts keeps every key reachable and every edge in range.
    #[test]
    fn inserts_keep_the_graph_connected(
        n0 in 1usize..60,
        extra in 1usize..60,
        degree in 1usize..8,
        sequence in 0usize..2,
        prune in prop_oneof![
            Just(Prune::Top),
            Just(Prune::Occlusion),
            Just(Prune::OcclusionFill)
        ],
        seed in 0u64..1000,
    ) {
        let data = ood(n0 + extra, 40, 8, seed);
        let params = AttentionParams {
            max_degree: degree,
            sequence_edges: sequence,
            prune,
            kq: 10,
            ..AttentionParams::default()
        };
        let keys = Arc::new(KeyStore::from_f32(data.keys[..n0 * 8].to_vec(), 8).expect("valid test input"));
        let mut index = AttentionIndex::build(keys, &data.train_queries, &params, &CpuKnn).expect("valid test input");
        let mut scratch = Scratch::new(n0 + extra);
        for (i, key) in data.keys.chunks_exact(8).enumerate().skip(n0) {
            let g0 = i % (data.train_queries.len() / 8 - 1);
            let guides = &data.train_queries[g0 * 8..(g0 + 2) * 8];
            prop_assert_eq!(index.insert(key, guides, &mut scratch).expect("valid test input") as usize, i);
        }
        let g = index.graph().expect("graph");
        prop_assert!(g.validate().is_ok());
        prop_assert!(g.reachable(index.entries()).iter().all(|&r| r));
        if sequence == 1 {
            prop_assert!(g.max_degree() <= 2 * degree + 1);
        }
    }
}
