//! Structural invariants of the built `AttentionIndex` graph, build errors, and a property test
//! that builds never panic on small random inputs.

use proptest::prelude::*;
use qkindex::attention::{off_at_zero, EntryRule, Projection, Prune, TrainKnn};
use qkindex::synth::{ood, Rng};
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, Dtype, Error, FlatIndex, KeyStore,
    KnnBackend, KnnOptions, SearchOutput, SearchParams,
};
use std::sync::Arc;

/// Checks every structural invariant of a built index over `n` keys.
fn check_invariants(index: &AttentionIndex, n: usize, params: &AttentionParams, what: &str) {
    let g = index.graph().expect("graph");
    assert_eq!(g.len(), n, "{what}: one node per key");
    assert_eq!(index.len(), n, "{what}: len");
    assert!(
        g.max_degree() <= params.max_degree,
        "{what}: max out-degree {} > {}",
        g.max_degree(),
        params.max_degree
    );
    for v in 0..n as u32 {
        let nb = g.neighbors(v);
        assert!(nb.len() <= params.max_degree, "{what}: degree of {v}");
        assert!(!nb.contains(&v), "{what}: self loop at {v}");
        assert!(
            nb.iter().all(|&w| (w as usize) < n),
            "{what}: id out of range in list of {v}: {nb:?}"
        );
        let mut s = nb.to_vec();
        s.sort_unstable();
        s.dedup();
        assert_eq!(
            s.len(),
            nb.len(),
            "{what}: duplicate edge in list of {v}: {nb:?}"
        );
    }
    let entries = index.entries();
    assert!(!entries.is_empty(), "{what}: no entry point");
    assert!(
        entries.iter().all(|&e| (e as usize) < n),
        "{what}: entry out of range {entries:?}"
    );
    let mut e = entries.to_vec();
    e.sort_unstable();
    e.dedup();
    assert_eq!(
        e.len(),
        entries.len(),
        "{what}: duplicate entries {entries:?}"
    );
    let reach = g.reachable(entries);
    let lost: Vec<usize> = (0..n).filter(|&v| !reach[v]).collect();
    assert!(
        lost.is_empty(),
        "{what}: {} keys unreachable: {lost:?}",
        lost.len()
    );
    let stats = index.build_stats();
    assert_eq!(stats.edges, g.edges(), "{what}: stats.edges");
    assert_eq!(stats.kq, params.kq.min(n), "{what}: stats.kq");
    assert_eq!(index.params(), params, "{what}: params kept");
}

/// With every key reachable, a search with `ef = n` is exact.
fn check_exact_at_full_ef(index: &AttentionIndex, queries: &[f32], dim: usize, what: &str) {
    let n = index.len();
    let flat = FlatIndex::new(index.keys().clone());
    let mut s = index.new_scratch();
    for (i, q) in queries.chunks_exact(dim).take(5).enumerate() {
        let k = n.min(10);
        let got = index
            .search(q, k, &SearchParams::with_ef(n), &mut s)
            .expect("search");
        let want = flat
            .search(q, k, &SearchParams::default(), &mut s)
            .expect("flat");
        assert_eq!(
            got.scores, want.scores,
            "{what}: query {i} not exact at ef = n"
        );
    }
}

fn build(keys: &Arc<KeyStore>, train: &[f32], params: &AttentionParams) -> AttentionIndex {
    AttentionIndex::build(keys.clone(), train, params, &CpuKnn).expect("build")
}

#[test]
fn synth_graphs_hold_invariants() {
    let (n, dim) = (2000, 32);
    let data = ood(n, 20, dim, 9);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let cases = [
        ("default", AttentionParams::default(), &data.train_queries),
        (
            "roargraph_recipe",
            AttentionParams::roargraph_recipe(),
            &data.train_queries,
        ),
        // Key-graph ablation: the keys themselves as training queries.
        ("key graph", AttentionParams::default(), &data.keys),
        (
            "causal",
            AttentionParams {
                causal: true,
                ..AttentionParams::default()
            },
            &data.train_queries,
        ),
    ];
    for (what, params, train) in cases {
        let index = build(&keys, train, &params);
        check_invariants(&index, n, &params, what);
        check_exact_at_full_ef(&index, &data.test_queries, dim, what);
        assert_eq!(index.build_stats().train_queries, n, "{what}");
        assert_eq!(index.build_stats().knn_backend, "cpu", "{what}");
    }
    // The cheaper builds of issue 27: thinned training queries, capped pruning candidates, a
    // coarse-IVF kNN. They keep every invariant; thinning reads ceil(ratio · n) queries.
    let cheap = [
        ("thinned", 0.5, 0, 0, n.div_ceil(2)),
        ("capped candidates", 0.0, 48, 0, n),
        ("coarse knn", 0.0, 0, 8, n),
        ("all three", 0.3, 64, 4, (0.3 * n as f64).ceil() as usize),
    ];
    for (what, queries_per_key, prune_candidates, knn_probe, train_queries) in cheap {
        let params = AttentionParams {
            queries_per_key,
            prune_candidates,
            knn: TrainKnn::from_field("knn_probe", knn_probe).expect("a kNN field"),
            ..AttentionParams::default()
        };
        let index = build(&keys, &data.train_queries, &params);
        check_invariants(&index, n, &params, what);
        check_exact_at_full_ef(&index, &data.test_queries, dim, what);
        assert_eq!(index.build_stats().train_queries, train_queries, "{what}");
        assert_eq!(index.build_stats().knn_backend, "cpu", "{what}");
        eprintln!(
            "{what}: edges {}, max degree {}, entries {:?}, linked {}",
            index.edges(),
            index.graph().expect("graph").max_degree(),
            index.entries(),
            index.build_stats().linked_unreachable
        );
    }
}

/// `unlisted_keys` counts the keys in no training query's exact top-`kq` list (the keys that
/// get no query-side edges), here a good share of them.
#[test]
fn unlisted_keys_are_the_keys_in_no_exact_list() {
    let (n, dim) = (1500, 16);
    let data = ood(n, 10, dim, 21);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let params = AttentionParams {
        kq: 20,
        ..AttentionParams::default()
    };
    let index = build(&keys, &data.train_queries, &params);
    let lists = CpuKnn
        .topk(
            &data.train_queries,
            &keys,
            params.kq,
            &KnnOptions::default(),
        )
        .expect("knn");
    let mut listed = vec![false; n];
    for r in 0..lists.rows() {
        for &id in lists.row(r) {
            listed[id as usize] = true;
        }
    }
    let unlisted = listed.iter().filter(|&&l| !l).count();
    assert!(
        unlisted > n / 10 && unlisted < n,
        "unlisted {unlisted} of {n}"
    );
    assert_eq!(index.build_stats().unlisted_keys, unlisted);
}

/// Causal builds from visible key counts (issue 27): counts of one query per key position
/// build the graph plain `causal` builds; pooled queries of three "heads" over keys that start
/// after 16 sinks, thinned or not, keep every invariant; thinning causal queries without their
/// counts, or a count per query missing, are typed errors.
#[test]
fn causal_builds_from_visible_counts() {
    let (n, dim, sinks, group) = (600, 16, 16, 3);
    let data = ood(n + sinks, 20, dim, 12);
    let keys = Arc::new(KeyStore::from_f32(data.keys[sinks * dim..].to_vec(), dim).expect("keys"));
    let causal = AttentionParams {
        causal: true,
        ..AttentionParams::default()
    };
    let cancel = qkindex::Cancel::new();
    let own: Vec<u32> = (1..=n as u32).collect();
    let train = &data.train_queries[..n * dim];
    let plain = build(&keys, train, &causal);
    let counted =
        AttentionIndex::build_visible(keys.clone(), train, &own, &causal, &CpuKnn, &cancel)
            .expect("build");
    let (a, b) = (
        plain.graph().expect("graph"),
        counted.graph().expect("graph"),
    );
    assert!((0..n as u32).all(|v| a.neighbors(v) == b.neighbors(v)));
    assert_eq!(plain.entries(), counted.entries());

    // Head-major pooled queries at positions 0..n + sinks.
    let positions = n + sinks;
    let pooled: Vec<f32> = (0..group)
        .flat_map(|_| data.train_queries[..positions * dim].iter().copied())
        .collect();
    let visible: Vec<u32> = (0..group)
        .flat_map(|_| (0..positions).map(|t| (t + 1).saturating_sub(sinks).min(n) as u32))
        .collect();
    for (what, queries_per_key) in [("pooled", 0.0), ("pooled, thinned", 1.0)] {
        let params = AttentionParams {
            queries_per_key,
            ..causal.clone()
        };
        let index = AttentionIndex::build_visible(
            keys.clone(),
            &pooled,
            &visible,
            &params,
            &CpuKnn,
            &cancel,
        )
        .expect("build");
        check_invariants(&index, n, &params, what);
        check_exact_at_full_ef(&index, &data.test_queries, dim, what);
        let rows = if queries_per_key > 0.0 {
            n
        } else {
            group * positions
        };
        assert_eq!(index.build_stats().train_queries, rows, "{what}");
    }
    // Unmasking far-looking lists applies to causal lists only.
    let unmask_alone = AttentionParams {
        global_full: Some(0.5),
        ..AttentionParams::default()
    };
    assert!(matches!(
        AttentionIndex::build(keys.clone(), &pooled, &unmask_alone, &CpuKnn),
        Err(Error::InvalidParam {
            name: "global_full",
            ..
        })
    ));
    let thinned = AttentionParams {
        queries_per_key: 1.0,
        ..causal.clone()
    };
    assert!(matches!(
        AttentionIndex::build(keys.clone(), &pooled, &thinned, &CpuKnn),
        Err(Error::InvalidParam {
            name: "queries_per_key",
            ..
        })
    ));
    assert!(matches!(
        AttentionIndex::build_visible(
            keys.clone(),
            &pooled,
            &visible[1..],
            &causal,
            &CpuKnn,
            &cancel
        ),
        Err(Error::DimensionMismatch { .. })
    ));
}

/// The graph kNN (`knn_graph`, issue 27) below 512 · ef keys is the exact kNN: the same
/// graph as the default build, bit for bit (its graph path is tested beside the code).
#[test]
fn graph_knn_below_its_key_floor_builds_the_exact_graph() {
    let (n, dim, m) = (1200, 16, 18_000);
    let data = ood(m, 20, dim, 5);
    let keys = Arc::new(KeyStore::from_f32(data.keys[..n * dim].to_vec(), dim).expect("keys"));
    let params = AttentionParams {
        knn: TrainKnn::Graph { ef: 128 },
        ..AttentionParams::default()
    };
    let index = build(&keys, &data.train_queries, &params);
    check_invariants(&index, n, &params, "graph knn");
    assert_eq!(index.build_stats().train_queries, m);
    let exact = build(&keys, &data.train_queries, &AttentionParams::default());
    assert_eq!(index.graph().expect("graph"), exact.graph().expect("graph"));
    assert_eq!(index.entries(), exact.entries());
    // An absurd ef is no overflow: the key floor saturates and the kNN stays exact.
    let huge = AttentionParams {
        knn: TrainKnn::Graph { ef: usize::MAX },
        ..AttentionParams::default()
    };
    let index = build(&keys, &data.train_queries, &huge);
    assert_eq!(index.graph().expect("graph"), exact.graph().expect("graph"));
}

/// The pooled kNN (`knn_pool`, issue 27): pools of a quarter of the keys or more are the exact
/// kNN (the same graph bit for bit); smaller pools build a graph that holds the invariants
/// from every training query's list, and a search at `ef = n` is still the exact top-k.
#[test]
fn pooled_knn_builds_the_exact_graph_or_a_valid_one() {
    let (n, dim) = (3000, 16);
    let data = ood(n, 8, dim, 13);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let exact = build(&keys, &data.train_queries, &AttentionParams::default());
    let wide = AttentionParams {
        knn: TrainKnn::Pool { size: n / 4 },
        ..AttentionParams::default()
    };
    let index = build(&keys, &data.train_queries, &wide);
    assert_eq!(index.graph().expect("graph"), exact.graph().expect("graph"));
    assert_eq!(index.entries(), exact.entries());
    let pooled = AttentionParams {
        knn: TrainKnn::Pool { size: 300 },
        ..AttentionParams::default()
    };
    let index = build(&keys, &data.train_queries, &pooled);
    check_invariants(&index, n, &pooled, "pooled knn");
    assert_eq!(index.build_stats().train_queries, n);
    assert_ne!(index.graph().expect("graph"), exact.graph().expect("graph"));
    let scorer = keys.scorer();
    let mut scratch = index.new_scratch();
    for q in data.test_queries.chunks_exact(dim) {
        let out = index
            .search(q, 10, &SearchParams::with_ef(n), &mut scratch)
            .expect("search");
        let mut all: Vec<(f32, u32)> = (0..n as u32).map(|i| (scorer.score(q, i), i)).collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let want: Vec<u32> = all[..10].iter().map(|x| x.1).collect();
        assert_eq!(out.ids, want);
    }
}

#[test]
fn default_recent_entry_is_the_last_key() {
    let data = ood(500, 4, 16, 3);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), 16).expect("keys"));
    let index = build(&keys, &data.train_queries, &AttentionParams::default());
    assert!(index.entries().contains(&499), "{:?}", index.entries());
}

#[test]
fn build_errors_are_typed() {
    let dim = 8;
    let data = ood(100, 4, dim, 1);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let train = &data.train_queries;
    let p = AttentionParams::default();
    let b = |keys: &Arc<KeyStore>, train: &[f32], p: &AttentionParams| {
        AttentionIndex::build(keys.clone(), train, p, &CpuKnn).expect_err("expected an error")
    };

    let empty = Arc::new(KeyStore::empty(Dtype::F32, dim).expect("empty store"));
    assert!(matches!(b(&empty, train, &p), Error::Empty { .. }));
    assert!(matches!(b(&keys, &[], &p), Error::Empty { .. }));
    assert!(matches!(
        b(&keys, &train[..train.len() - 3], &p),
        Error::DimensionMismatch { .. }
    ));
    let mut nan = train.clone();
    nan[5 * dim + 1] = f32::NAN;
    assert!(matches!(
        b(&keys, &nan, &p),
        Error::NonFinite { row: 5, .. }
    ));
    let bad = |f: fn(&mut AttentionParams)| {
        let mut q = AttentionParams::default();
        f(&mut q);
        q
    };
    for (name, params) in [
        ("kq", bad(|p| p.kq = 0)),
        ("max_degree", bad(|p| p.max_degree = 0)),
        ("entry_count", bad(|p| p.entry_count = 0)),
        ("build_ef", bad(|p| p.build_ef = 0)),
        (
            "window",
            bad(|p| p.projection = Projection::Rank { window: 0 }),
        ),
    ] {
        match b(&keys, train, &params) {
            Error::InvalidParam { name: got, .. } => assert_eq!(got, name),
            other => panic!("{name}: expected InvalidParam, got {other:?}"),
        }
    }
}

#[test]
fn tiny_inputs_build_with_kq_above_n() {
    for n in [1usize, 2, 3, 5] {
        for dim in [1usize, 3, 8] {
            let mut rng = Rng::new((n * 100 + dim) as u64);
            let kv: Vec<f32> = (0..n * dim).map(|_| rng.normal()).collect();
            let train: Vec<f32> = (0..7 * dim).map(|_| rng.normal()).collect();
            let keys = Arc::new(KeyStore::from_f32(kv, dim).expect("keys"));
            for params in [
                AttentionParams::default(),
                AttentionParams::roargraph_recipe(),
            ] {
                assert!(params.kq > n);
                let what = format!("n={n} dim={dim} {:?}", params.projection);
                let index = build(&keys, &train, &params);
                check_invariants(&index, n, &params, &what);
                check_exact_at_full_ef(&index, &train, dim, &what);
            }
        }
    }
}

#[test]
fn identical_keys_build_a_connected_graph() {
    let (n, dim) = (200, 4);
    let keys = Arc::new(KeyStore::from_f32(vec![0.5; n * dim], dim).expect("keys"));
    let train = vec![1.0f32; 50 * dim];
    for params in [
        AttentionParams::default(),
        AttentionParams::roargraph_recipe(),
    ] {
        let index = build(&keys, &train, &params);
        check_invariants(&index, n, &params, "identical keys");
    }
}

fn params_strategy() -> impl Strategy<Value = AttentionParams> {
    (
        (1usize..=120, 1usize..=40),
        prop_oneof![
            Just(Projection::Pivot),
            (1usize..=6).prop_map(|window| Projection::Rank { window })
        ],
        prop_oneof![
            Just(Prune::Top),
            Just(Prune::Occlusion),
            Just(Prune::OcclusionFill)
        ],
        prop_oneof![Just(EntryRule::Hub), Just(EntryRule::L2Medoid)],
        (1usize..=4, 0usize..=3, 0usize..=3),
        (1usize..=64, any::<bool>()),
    )
        .prop_map(
            |(
                (kq, max_degree),
                projection,
                prune,
                entry,
                (ec, recent, seq),
                (build_ef, causal),
            )| {
                AttentionParams {
                    kq,
                    max_degree,
                    projection,
                    prune,
                    entry,
                    entry_count: ec,
                    recent_entries: recent,
                    sequence_edges: seq,
                    build_ef,
                    default_ef: 16,
                    causal,
                    ..AttentionParams::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_builds_never_panic_and_hold_invariants(
        n in prop_oneof![1usize..=6, 50usize..=300],
        dim in 1usize..=24,
        m in 1usize..=300,
        seed in any::<u64>(),
        preset in 0u8..3,
        random_params in params_strategy(),
    ) {
        let mut rng = Rng::new(seed);
        let kv: Vec<f32> = (0..n * dim).map(|_| rng.normal()).collect();
        let train: Vec<f32> = (0..m * dim).map(|_| rng.normal() * 2.0 + 0.5).collect();
        let keys = Arc::new(KeyStore::from_f32(kv, dim).expect("keys"));
        let params = match preset {
            0 => AttentionParams::default(),
            1 => AttentionParams::roargraph_recipe(),
            _ => random_params,
        };
        let what = format!("n={n} dim={dim} m={m} seed={seed} {params:?}");
        match AttentionIndex::build(keys, &train, &params, &CpuKnn) {
            Ok(index) => {
                check_invariants(&index, n, &params, &what);
                check_exact_at_full_ef(&index, &train, dim, &what);
            }
            Err(e) => {
                // Valid parameters always build: the connectivity repair keeps every key
                // reachable for any degree bound.
                prop_assert!(false, "{what}: build failed: {e}");
            }
        }
    }
}

/// The connectivity pass once overwrote an edge of a full reachable list without keeping its
/// target reachable, and the build then failed with "max_degree = 16: too small to keep key 7
/// reachable" (sequence_edges = 0; max_degree 8: 22 of 400 seeds). It now splices the key in
/// (r → w becomes r → key → w), which cuts nothing off for any degree bound ≥ 1.
#[test]
fn connectivity_repair_keeps_every_key_reachable() {
    let (n, dim, m) = (200, 8, 200);
    let mut rng = Rng::new(83);
    let kv: Vec<f32> = (0..n * dim).map(|_| rng.normal()).collect();
    let train: Vec<f32> = (0..m * dim).map(|_| rng.normal()).collect();
    let keys = Arc::new(KeyStore::from_f32(kv, dim).expect("keys"));
    let params = AttentionParams {
        kq: 64,
        max_degree: 16,
        sequence_edges: 0,
        recent_entries: 0,
        build_ef: 32,
        ..AttentionParams::default()
    };
    let index = AttentionIndex::build(keys, &train, &params, &CpuKnn)
        .expect("a degree bound of 16 can keep 200 keys connected");
    check_invariants(&index, n, &params, "seed 83");
}

/// Tiny degree bounds without sequence edges, causal and not, over many seeds: every build
/// succeeds and keeps every key reachable (a proptest case once failed at n = 57, d = 3,
/// max_degree = 2, causal, L2 medoid entry).
#[test]
fn tiny_degree_bounds_always_build_connected_graphs() {
    for seed in 0..60u64 {
        for &(n, dim) in &[(57usize, 3usize), (150, 6)] {
            let mut rng = Rng::new(seed);
            let kv: Vec<f32> = (0..n * dim).map(|_| rng.normal()).collect();
            let train: Vec<f32> = (0..n * dim).map(|_| rng.normal() * 2.0 + 0.5).collect();
            let keys = Arc::new(KeyStore::from_f32(kv, dim).expect("keys"));
            for max_degree in [1, 2, 3, 8] {
                for causal in [false, true] {
                    for entry in [EntryRule::Hub, EntryRule::L2Medoid] {
                        let params = AttentionParams {
                            kq: 10,
                            max_degree,
                            sequence_edges: 0,
                            recent_entries: 0,
                            causal,
                            entry,
                            build_ef: 16,
                            ..AttentionParams::default()
                        };
                        let what = format!(
                            "seed {seed} n {n} degree {max_degree} causal {causal} {entry:?}"
                        );
                        let index = AttentionIndex::build(keys.clone(), &train, &params, &CpuKnn)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        check_invariants(&index, n, &params, &what);
                    }
                }
            }
        }
    }
}

/// `global_full` (issue 27): causal lists that look far back are replaced by full ones; the
/// build keeps every invariant, reports how many it unmasked, and unmasks none at share 0+
/// when no query sees past the window.
#[test]
fn far_looking_causal_lists_are_unmasked() {
    let (n, dim) = (1600, 16);
    let data = ood(n, 20, dim, 21);
    let keys = Arc::new(KeyStore::from_f32(data.keys[..n * dim].to_vec(), dim).expect("keys"));
    let train = &data.train_queries[..n * dim];
    let causal = AttentionParams {
        causal: true,
        ..AttentionParams::default()
    };
    let mut unmasked = Vec::new();
    for share in [0.0, 0.5, 1.0] {
        let params = AttentionParams {
            global_full: off_at_zero(share),
            ..causal.clone()
        };
        let index = AttentionIndex::build(keys.clone(), train, &params, &CpuKnn).expect("build");
        let what = format!("global_full {share}");
        check_invariants(&index, n, &params, &what);
        check_exact_at_full_ef(&index, &data.test_queries, dim, &what);
        unmasked.push(index.build_stats().unmasked_lists);
    }
    // Share 1: every query past the window with one far key; these OOD queries have many.
    assert_eq!(unmasked[0], 0);
    assert!(unmasked[1] <= unmasked[2], "{unmasked:?}");
    assert!(unmasked[2] > (n - 1024) / 2, "{unmasked:?}");
    assert!(unmasked[2] < n - 1024 + 1, "{unmasked:?}");
}

/// `far_check` (issue 27): a pooled causal group with enough unmasked lists also builds the
/// full-list graph and keeps the one whose worst head scans less for recall 0.95 on held-out
/// recent queries, reporting both; below its share no second build runs; without
/// `global_full`, or out of 0..=1, it is a typed error.
#[test]
fn far_check_keeps_the_graph_its_check_prefers() {
    let (n, dim, group) = (1600, 16, 2);
    let data = ood(n, 20, dim, 21);
    let keys = Arc::new(KeyStore::from_f32(data.keys[..n * dim].to_vec(), dim).expect("keys"));
    let pooled: Vec<f32> = (0..group)
        .flat_map(|_| data.train_queries[..n * dim].iter().copied())
        .collect();
    let visible: Vec<u32> = (0..group).flat_map(|_| 1..=n as u32).collect();
    let cancel = qkindex::Cancel::new();
    let params = AttentionParams {
        causal: true,
        queries_per_key: 0.5,
        // Every list past the near window with a key before it is unmasked.
        global_full: Some(1.0),
        far_check: Some(0.01),
        ..AttentionParams::default()
    };
    let build = |params: &AttentionParams| {
        AttentionIndex::build_visible(keys.clone(), &pooled, &visible, params, &CpuKnn, &cancel)
    };
    let index = build(&params).expect("build");
    check_invariants(&index, n, &params, "far check");
    check_exact_at_full_ef(&index, &data.test_queries, dim, "far check");
    assert_eq!(
        index.params(),
        &params,
        "the kept graph keeps the asked parameters"
    );
    let stats = index.build_stats();
    let check = stats.far_check.clone().expect("the check ran");
    assert_eq!(check.heads, group);
    // Every 4th pooled row trains; each head has more than 64 held-out recent rows.
    assert_eq!(check.queries, group * 64);
    assert!(
        params.far_check.is_some_and(|s| check.far_share >= s) && check.far_share <= 1.0,
        "{check:?}"
    );
    for s in [check.causal_scanned, check.full_scanned] {
        assert!(s > 0.0 && s <= 1.0, "{check:?}");
    }
    assert_eq!(check.kept_full, check.full_scanned < check.causal_scanned);
    // The kept graph's lists: the full graph unmasks none.
    assert_eq!(stats.unmasked_lists == 0, check.kept_full, "{stats:?}");
    assert!(stats.total_s >= check.seconds);

    // Above the observed share: one build, no check.
    let rare = AttentionParams {
        far_check: Some((check.far_share * 1.5).min(1.0)),
        ..params.clone()
    };
    if check.far_share < 1.0 {
        let index = build(&rare).expect("build");
        assert_eq!(index.build_stats().far_check, None);
        assert!(index.build_stats().unmasked_lists > 0);
    }
    for (far_check, global_full) in [(0.1, 0.0), (1.5, 0.5), (f64::NAN, 0.5)] {
        let bad = AttentionParams {
            far_check: off_at_zero(far_check),
            global_full: off_at_zero(global_full),
            ..params.clone()
        };
        assert!(
            matches!(
                build(&bad),
                Err(Error::InvalidParam {
                    name: "far_check",
                    ..
                })
            ),
            "far_check {far_check}, global_full {global_full}"
        );
    }
}

/// `prune_check` (issue 50): the build makes both rules' graphs from the same lists and keeps
/// the one whose worst head scans less on held-out recent queries; the kept graph is, bit for
/// bit, the plain build with the kept rule, and its params name that rule (the other in
/// `prune_check`); asking for the rule `prune` already names is a typed error.
#[test]
fn prune_check_keeps_the_rule_its_check_prefers() {
    let (n, dim, group) = (1600, 16, 2);
    let data = ood(n, 20, dim, 33);
    let keys = Arc::new(KeyStore::from_f32(data.keys[..n * dim].to_vec(), dim).expect("keys"));
    let pooled: Vec<f32> = (0..group)
        .flat_map(|_| data.train_queries[..n * dim].iter().copied())
        .collect();
    let visible: Vec<u32> = (0..group).flat_map(|_| 1..=n as u32).collect();
    let cancel = qkindex::Cancel::new();
    let build = |params: &AttentionParams| {
        AttentionIndex::build_visible(keys.clone(), &pooled, &visible, params, &CpuKnn, &cancel)
    };
    for (asked, other) in [
        (Prune::OcclusionFill, Prune::Top),
        (Prune::Top, Prune::Occlusion),
    ] {
        let params = AttentionParams {
            causal: true,
            queries_per_key: 0.5,
            prune: asked,
            prune_check: Some(other),
            ..AttentionParams::default()
        };
        let index = build(&params).expect("build");
        let what = format!("prune check {asked} / {other}");
        check_invariants(&index, n, index.params(), &what);
        check_exact_at_full_ef(&index, &data.test_queries, dim, &what);
        let check = index
            .build_stats()
            .prune_check
            .clone()
            .expect("the check ran");
        assert_eq!((check.asked, check.other), (asked, other), "{what}");
        assert_eq!(
            (check.heads, check.queries),
            (group, group * 64),
            "{check:?}"
        );
        assert_eq!(check.kept_other, check.other_scanned < check.asked_scanned);
        for s in [check.asked_scanned, check.other_scanned] {
            assert!(s > 0.0 && s <= 1.0, "{check:?}");
        }
        let kept = check.kept();
        let dropped = if check.kept_other { asked } else { other };
        assert_eq!(index.params().prune, kept, "{what}");
        assert_eq!(index.params().prune_check, Some(dropped), "{what}");
        let plain = build(&AttentionParams {
            prune: kept,
            prune_check: None,
            ..params.clone()
        })
        .expect("plain build");
        assert_eq!(
            index.graph().expect("graph"),
            plain.graph().expect("graph"),
            "{what}"
        );
        assert_eq!(index.entries(), plain.entries(), "{what}");
        assert!(index.build_stats().total_s >= check.seconds);
    }
    let same = AttentionParams {
        prune_check: Some(AttentionParams::default().prune),
        ..AttentionParams::default()
    };
    assert!(matches!(
        AttentionIndex::build(keys.clone(), &pooled, &same, &CpuKnn),
        Err(Error::InvalidParam {
            name: "prune_check",
            ..
        })
    ));
}

/// `auto_ef` (issue 23): the build measures the `ef` its held-out recent queries need for the
/// target recall on every head, raises `default_ef` to it (never lowers it), and the file keeps
/// it; a higher target never asks for less; out of 0..=1 it is a typed error.
#[test]
fn auto_ef_raises_the_default_ef_to_what_recent_queries_need() {
    // Two query heads pooled head-major; the last 300 positions of each see every key (the
    // decode driver's window rows), as decode queries do.
    let (n, dim, group, window) = (1600, 16, 2, 300);
    let data = ood(n + window, 20, dim, 23);
    let keys = Arc::new(KeyStore::from_f32(data.keys[..n * dim].to_vec(), dim).expect("keys"));
    let rows = n + window;
    let pooled: Vec<f32> = (0..group)
        .flat_map(|_| data.train_queries[..rows * dim].iter().copied())
        .collect();
    let visible: Vec<u32> = (0..group)
        .flat_map(|_| (1..=rows as u32).map(|t| t.min(n as u32)))
        .collect();
    let cancel = qkindex::Cancel::new();
    let build = |auto_ef: f64, default_ef: usize| {
        let params = AttentionParams {
            causal: true,
            queries_per_key: 0.5,
            auto_ef: off_at_zero(auto_ef),
            default_ef,
            ..AttentionParams::default()
        };
        AttentionIndex::build_visible(keys.clone(), &pooled, &visible, &params, &CpuKnn, &cancel)
    };
    let plain = build(0.0, 32).expect("build");
    assert_eq!(plain.build_stats().auto_ef, None);
    assert_eq!(plain.params().default_ef, 32);

    let mut needed = Vec::new();
    for target in [0.5, 0.99, 0.997, 0.999] {
        let index = build(target, 32).expect("build");
        let a = index.build_stats().auto_ef.clone().expect("calibrated");
        assert_eq!((a.heads, a.queries), (group, group * 64), "{a:?}");
        assert_eq!(a.target, target);
        assert_eq!(a.ef_before, 32);
        assert_eq!(a.ef_after, a.needed.max(32), "{a:?}");
        assert_eq!(index.params().default_ef, a.ef_after);
        // Per query head: what each head needed, never below the given default; the group's
        // ef is the worst head's, and a search naming its head runs at that head's ef.
        assert_eq!(a.head_ef.len(), group, "{a:?}");
        assert_eq!(index.params().head_ef, a.head_ef);
        assert!(a.head_ef.iter().all(|&e| e >= 32), "{a:?}");
        assert_eq!(a.head_ef.iter().copied().max(), Some(a.ef_after), "{a:?}");
        for (h, &ef) in a.head_ef.iter().enumerate() {
            assert_eq!(index.default_ef(Some(h)), ef);
        }
        assert_eq!(index.default_ef(Some(group)), a.ef_after);
        assert_eq!(index.default_ef(None), a.ef_after);
        assert!(a.recall_after >= a.recall_before, "{a:?}");
        if a.reached {
            assert!(a.recall_after >= target, "{a:?}");
        }
        // The same graph as without the calibration: only the default ef moved.
        assert_eq!(*index.graph().expect("csr"), *plain.graph().expect("csr"));
        needed.push(a.needed);

        // Searches without an ef run at the calibrated one, also after a save and load.
        let dir = std::env::temp_dir().join(format!("qkindex-auto-ef-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(format!("t{target}.qki"));
        index.save(&path).expect("save");
        let loaded = qkindex::io::load(&path, &qkindex::io::LoadOptions::default()).expect("load");
        let _ = std::fs::remove_dir_all(&dir);
        let q = &data.test_queries[..dim];
        let mut scratch = qkindex::Scratch::new(n);
        let (mut by_default, mut at_ef) = Default::default();
        let explicit = SearchParams::with_ef(a.ef_after);
        loaded
            .search_into(
                q,
                10,
                &SearchParams::default(),
                &mut scratch,
                &mut by_default,
            )
            .expect("search");
        index
            .search_into(q, 10, &explicit, &mut scratch, &mut at_ef)
            .expect("search");
        assert_eq!(by_default, at_ef, "target {target}");
        let last = a.head_ef.len() - 1;
        let named = SearchParams {
            head: Some(last),
            ..SearchParams::default()
        };
        let at_head_ef = SearchParams::with_ef(a.head_ef[last]);
        let (mut by_head, mut at_head) = (SearchOutput::default(), SearchOutput::default());
        loaded
            .search_into(q, 10, &named, &mut scratch, &mut by_head)
            .expect("search");
        index
            .search_into(q, 10, &at_head_ef, &mut scratch, &mut at_head)
            .expect("search");
        assert_eq!(by_head, at_head, "target {target}, head {last}");
    }
    assert!(needed.windows(2).all(|w| w[0] <= w[1]), "{needed:?}");
    // A default above what is needed stays.
    let index = build(0.5, 1000).expect("build");
    assert_eq!(index.params().default_ef, 1000);

    // Counts that do not match the queries are an error, not a panic (a non-causal build
    // reads them only here).
    let params = AttentionParams {
        auto_ef: Some(0.95),
        ..AttentionParams::default()
    };
    let short = &visible[..visible.len() - 1];
    let built =
        AttentionIndex::build_visible(keys.clone(), &pooled, short, &params, &CpuKnn, &cancel);
    assert!(
        matches!(built, Err(Error::DimensionMismatch { .. })),
        "{built:?}"
    );
    for bad in [1.5, -0.1, f64::NAN] {
        assert!(
            matches!(
                build(bad, 128),
                Err(Error::InvalidParam {
                    name: "auto_ef",
                    ..
                })
            ),
            "auto_ef {bad}"
        );
    }
}
