//! `IndexSpec`: the one vocabulary of index kinds. Strings parse to the params they name, the
//! canonical form round-trips, errors name the bad key, and every preset builds its kind.

use proptest::prelude::*;
use qkindex::attention::{off_at_zero, Codes, EntryRule, Projection, Prune, TrainKnn, TrainOn};
use qkindex::io::AnyIndex;
use qkindex::ivf::Assignment;
use qkindex::spec::scan_check::choose;
use qkindex::spec::BuiltIndex;
use qkindex::synth::ood;
use qkindex::{
    AnnIndex, AttentionParams, CpuKnn, Error, FlatParams, HnswParams, IndexKind, IndexSpec,
    IvfParams, KeyStore, VamanaParams,
};
use std::sync::Arc;

fn parse(s: &str) -> IndexSpec {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn parse_err(s: &str) -> (&'static str, String, String) {
    match s.parse::<IndexSpec>() {
        Err(Error::InvalidParam {
            name,
            value,
            reason,
        }) => (name, value, reason),
        other => panic!("{s}: expected InvalidParam, got {other:?}"),
    }
}

#[test]
fn strings_name_the_params() {
    assert_eq!(
        parse("attention"),
        IndexSpec::Attention(AttentionParams::default())
    );
    assert_eq!(
        parse("attention:kq=100,degree=32,prune=occlusion-fill"),
        IndexSpec::Attention(AttentionParams {
            kq: 100,
            max_degree: 32,
            prune: Prune::OcclusionFill,
            ..AttentionParams::default()
        })
    );
    assert_eq!(
        parse("ivf:nlist=361"),
        IndexSpec::Ivf(IvfParams {
            nlist: Some(361),
            ..IvfParams::default()
        })
    );
    assert_eq!(
        parse("hnsw-ip:m=16"),
        IndexSpec::Hnsw(HnswParams::inner_product())
    );
    assert_eq!(
        parse("hnsw:ef_construction=100"),
        IndexSpec::Hnsw(HnswParams {
            ef_construction: 100,
            ..HnswParams::default()
        }),
        "`_` spells `-`"
    );
    assert_eq!(
        parse("ivf-ip"),
        IndexSpec::Ivf(IvfParams {
            assignment: Assignment::InnerProduct,
            ..IvfParams::default()
        })
    );
    assert_eq!(
        parse("robust-vamana"),
        IndexSpec::Vamana(VamanaParams::robust())
    );
    assert_eq!(
        parse("vamana:r=32, l=64 ,alpha=1.5"),
        IndexSpec::Vamana(VamanaParams {
            r: 32,
            l: 64,
            alpha: 1.5,
            ..VamanaParams::default()
        })
    );
    assert_eq!(
        parse("roargraph-recipe"),
        IndexSpec::Attention(AttentionParams::roargraph_recipe())
    );
    assert_eq!(
        parse("key-graph"),
        IndexSpec::Attention(AttentionParams::key_graph())
    );
    assert_eq!(
        parse("attention:recent-queries=512,window=4,causal=true"),
        IndexSpec::Attention(AttentionParams {
            entry: EntryRule::RecentHub { queries: 512 },
            projection: Projection::Rank { window: 4 },
            causal: true,
            ..AttentionParams::default()
        })
    );
    // Keys apply in their fixed order, whatever order the string gives them in.
    assert_eq!(
        parse("roargraph-recipe:window=6,projection=rank"),
        parse("roargraph-recipe:projection=rank,window=6")
    );
    assert_eq!(
        parse("ivf:nlist=auto"),
        IndexSpec::Ivf(IvfParams::default())
    );
    assert_eq!(
        parse("attention:knn-probe=24,queries-per-key=1.5,prune-cands=128"),
        IndexSpec::Attention(AttentionParams {
            queries_per_key: 1.5,
            prune_candidates: 128,
            knn: TrainKnn::Probe { lists: 24 },
            ..AttentionParams::default()
        })
    );
    assert_eq!(
        parse("attention:prune-check=top,causal=true").to_string(),
        "attention:causal=true,prune-check=top"
    );
    assert_eq!(parse("attention:prune-check=none"), parse("attention"));
    assert_eq!(
        parse("attention:global-full=0.2,causal=true,queries-per-key=1.25").to_string(),
        "attention:causal=true,queries-per-key=1.25,global-full=0.2"
    );
    assert_eq!(
        parse("attention:far-check=0.04,global-full=0.1,causal=true,queries-per-key=1.25")
            .to_string(),
        "attention:causal=true,queries-per-key=1.25,global-full=0.1,far-check=0.04"
    );
    assert_eq!(
        parse("attention:auto-ef=0.95,causal=true").to_string(),
        "attention:causal=true,auto-ef=0.95"
    );
    assert_eq!(
        parse("attention:knn-graph=160,queries-per-key=1").to_string(),
        "attention:queries-per-key=1,knn-graph=160"
    );
    assert_eq!(
        parse("attention:knn-pool=16000,prune-cands=128").to_string(),
        "attention:prune-cands=128,knn-pool=16000"
    );
    assert_eq!(
        parse("attention:queries-per-key=1.5,prune-cands=128,knn-probe=24").to_string(),
        "attention:queries-per-key=1.5,prune-cands=128,knn-probe=24"
    );
}

#[test]
fn build_cost_keys_reject_what_they_cannot_do() {
    for (spec, key) in [
        ("attention:queries-per-key=-1", "queries-per-key"),
        ("attention:queries-per-key=NaN", "queries-per-key"),
        ("attention:queries-per-key=inf", "queries-per-key"),
        ("attention:causal=true,knn-probe=8", "knn-probe"),
        ("attention:knn-probe=-2", "knn-probe"),
        ("attention:causal=true,knn-graph=64", "knn-graph"),
        ("attention:knn-probe=8,knn-graph=64", "knn-graph"),
        ("attention:causal=true,knn-pool=16000", "knn-pool"),
        ("attention:knn-graph=64,knn-pool=16000", "knn-pool"),
        ("attention:knn-probe=8,knn-pool=16000", "knn-pool"),
        ("attention:kq=100,knn-pool=99", "knn-pool"),
        ("attention:prune-check=occlusion-fill", "prune-check"),
        ("attention:prune-check=best", "prune-check"),
        ("attention:knn-pool=lots", "knn-pool"),
        ("attention:prune-cands=many", "prune-cands"),
        ("attention:causal=true,far-check=0.04", "far-check"),
        ("attention:auto-ef=1.5", "auto-ef"),
        ("attention:auto-ef=-0.5", "auto-ef"),
        ("attention:auto-ef=high", "auto-ef"),
        (
            "attention:causal=true,global-full=0.1,far-check=2",
            "far-check",
        ),
        (
            "attention:causal=true,global-full=0.1,far-check=-0.1",
            "far-check",
        ),
    ] {
        match spec.parse::<IndexSpec>() {
            Err(Error::InvalidParam { name, .. }) => assert_eq!(name, key, "{spec}"),
            other => panic!("{spec}: expected an InvalidParam error, got {other:?}"),
        }
    }
}

#[test]
fn display_is_the_canonical_form() {
    for name in IndexSpec::preset_names() {
        let spec = parse(name);
        assert_eq!(spec.to_string(), name, "a preset prints as its name");
        assert_eq!(spec.name(), name);
    }
    assert_eq!(parse("ivf:nlist=361").to_string(), "ivf:nlist=361");
    assert_eq!(parse("hnsw-ip:m=16").to_string(), "hnsw-ip");
    assert_eq!(parse("hnsw-ip:m=32").to_string(), "hnsw-ip:m=32");
    assert_eq!(
        parse("attention:prune=top,kq=200").to_string(),
        match AttentionParams::default().prune {
            Prune::Top => "attention:kq=200",
            _ => "attention:kq=200,prune=top",
        }
    );
    // The preset needing the fewest keys: these are RoarGraph's parameters.
    assert_eq!(
        parse(
            "attention:projection=pivot,prune=occlusion,degree=35,entry=l2-medoid,\
             recent-entries=0,sequence-edges=0,build-ef=500"
        )
        .to_string(),
        "roargraph-recipe"
    );
    assert_eq!(
        parse("roargraph-recipe:degree=40").to_string(),
        "roargraph-recipe:degree=40"
    );
}

#[test]
fn labels_and_properties() {
    let cases = [
        ("attention", IndexKind::Attention, "", true, true),
        (
            "roargraph-recipe",
            IndexKind::Attention,
            "roargraph-recipe",
            true,
            true,
        ),
        ("key-graph", IndexKind::Attention, "key-graph", false, true),
        ("flat", IndexKind::Flat, "", false, true),
        ("hnsw", IndexKind::Hnsw, "", false, false),
        ("hnsw-ip:m=32", IndexKind::Hnsw, "ip:m=32", false, false),
        ("ivf:nlist=361", IndexKind::Ivf, "nlist=361", false, false),
        ("ivf-ip", IndexKind::Ivf, "ip", false, false),
        ("vamana", IndexKind::Vamana, "", false, false),
        ("robust-vamana", IndexKind::Vamana, "robust", true, false),
    ];
    for (s, kind, variant, queries, inserts) in cases {
        let spec = parse(s);
        assert_eq!(spec.kind(), kind, "{s}");
        assert_eq!(spec.variant(), variant, "{s}");
        assert_eq!(spec.needs_queries(), queries, "{s}");
        assert_eq!(spec.inserts(), inserts, "{s}");
    }
}

#[test]
fn errors_name_the_bad_key_and_list_the_valid_ones() {
    let (name, value, reason) = parse_err("foo");
    assert_eq!((name, value.as_str()), ("kind", "foo"));
    assert!(
        reason.contains("attention") && reason.contains("robust-vamana"),
        "{reason}"
    );

    let (name, value, reason) = parse_err("attention:fanout=4");
    assert_eq!((name, value.as_str()), ("key", "fanout"));
    assert!(
        reason.contains("kq") && reason.contains("degree"),
        "{reason}"
    );

    let (name, value, _) = parse_err("attention:degree=x");
    assert_eq!((name, value.as_str()), ("degree", "x"));
    // Range checks of the params, named by the key that sets the field.
    let (name, value, _) = parse_err("attention:degree=0");
    assert_eq!((name, value.as_str()), ("degree", "0"));
    assert_eq!(parse_err("attention:build-ef=0").0, "build-ef");
    assert_eq!(parse_err("attention:prune=fill").0, "prune");
    assert_eq!(parse_err("attention:kq=1,kq=2").0, "kq");
    assert_eq!(parse_err("attention:kq").0, "key");
    assert_eq!(parse_err("attention:").0, "key");
    assert_eq!(parse_err("attention:causal=yes").0, "causal");
    assert_eq!(
        parse_err("attention:entry=hub,recent-queries=8").0,
        "recent-queries"
    );
    assert_eq!(parse_err("roargraph-recipe:window=4").0, "window");
    let (name, _, reason) = parse_err("flat:m=1");
    assert_eq!(name, "key");
    assert!(
        reason.contains("codes") && reason.contains("rerank"),
        "{reason}"
    );
    // Scans on codes: no adjacency to inline codes into, and no re-rank without codes.
    for bad in [
        "flat:codes=i8-inline",
        "ivf:codes=i8-inline",
        "flat:codes=i2",
        "attention:codes=i4",
    ] {
        assert_eq!(parse_err(bad).0, "codes", "{bad}");
    }
    for bad in ["flat:rerank=200", "ivf:rerank=200"] {
        assert_eq!(parse_err(bad).0, "rerank", "{bad}");
    }
    assert_eq!(
        parse("flat:codes=i8,rerank=150"),
        IndexSpec::Flat(FlatParams {
            codes: Codes::I8,
            rerank: 150
        })
    );
    assert_eq!(parse("ivf:codes=i8").to_string(), "ivf:codes=i8");
    assert_eq!(parse("flat:codes=i4").to_string(), "flat:codes=i4");
    assert_eq!(
        parse("attention:codes=i8-inline").to_string(),
        "attention:codes=i8-inline"
    );
    assert_eq!(parse_err("hnsw:m=1").0, "m");
    assert_eq!(parse_err("ivf:nlist=0").0, "nlist");
    assert_eq!(parse_err("vamana:alpha=0.5").0, "alpha");
    assert_eq!(
        parse_err("robust-vamana:stitch-reserve=64").0,
        "stitch-reserve"
    );
}

#[test]
fn serde_reads_and_writes_the_string() {
    let spec = parse("ivf:nlist=361");
    let json = serde_json::to_string(&spec).expect("serializes");
    assert_eq!(json, "\"ivf:nlist=361\"");
    let back: IndexSpec = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, spec);
    assert!(serde_json::from_str::<IndexSpec>("\"ivf:bad=1\"").is_err());
}

#[test]
fn every_preset_builds_its_kind_with_its_phases() {
    let dim = 16;
    let data = ood(400, 20, dim, 9);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    for name in IndexSpec::preset_names() {
        let spec = parse(name);
        let built = spec
            .build_with(
                keys.clone(),
                &data.train_queries,
                &CpuKnn,
                &qkindex::Cancel::new(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(built.index.kind(), spec.kind(), "{name}");
        assert_eq!(built.index.len(), 400, "{name}");
        let phases: Vec<&str> = built.phases.iter().map(|p| p.0).collect();
        let want: &[&str] = match spec.kind() {
            IndexKind::Attention => &["total", "knn", "projection", "connectivity"],
            IndexKind::Flat => &["total"],
            IndexKind::Hnsw => &["total", "prepare", "insert", "finalize"],
            IndexKind::Ivf => &["total", "kmeans", "assign"],
            IndexKind::Vamana => &["total", "pass1", "pass2", "knn", "stitch", "connectivity"],
        };
        assert_eq!(phases, want, "{name}");
        if let Some(a) = built.index.as_attention() {
            let trained_on = if name == "key-graph" {
                400
            } else {
                data.train_queries.len() / dim
            };
            assert_eq!(a.build_stats().train_queries, trained_on, "{name}");
        }
    }
    // RobustVamana reads the training queries; the key graph does not need any.
    assert!(matches!(
        parse("robust-vamana").build(keys.clone(), &[], &CpuKnn),
        Err(Error::DimensionMismatch { .. } | Error::InvalidParam { .. } | Error::Empty { .. })
    ));
    let kg = parse("key-graph")
        .build(keys.clone(), &[], &CpuKnn)
        .expect("key graph");
    let kg = kg.as_attention().expect("attention");
    assert_eq!(kg.params().train_on, TrainOn::Keys);
    let cancel = qkindex::Cancel::new();
    cancel.cancel();
    for name in IndexSpec::preset_names() {
        assert!(
            matches!(
                parse(name).build_with(keys.clone(), &data.train_queries, &CpuKnn, &cancel),
                Err(Error::Cancelled { .. })
            ),
            "{name}: a cancelled build stops"
        );
    }
}

fn attention_params() -> impl Strategy<Value = AttentionParams> {
    (
        (1usize..500, 1usize..64),
        prop_oneof![
            Just(Projection::Pivot),
            (1usize..16).prop_map(|window| Projection::Rank { window })
        ],
        prop_oneof![
            Just(Prune::Top),
            Just(Prune::Occlusion),
            Just(Prune::OcclusionFill)
        ],
        prop_oneof![
            Just(EntryRule::Hub),
            Just(EntryRule::L2Medoid),
            (0usize..2000).prop_map(|queries| EntryRule::RecentHub { queries })
        ],
        (1usize..8, 0usize..4, 0usize..4),
        (
            1usize..600,
            1usize..300,
            any::<bool>(),
            prop_oneof![Just(0.0), 0.01f64..1.0],
            prop_oneof![Just(0.0), 0.01f64..1.0],
        ),
        (
            prop_oneof![Just(TrainOn::Queries), Just(TrainOn::Keys)],
            prop_oneof![Just(0.0), 0.01f64..=1.0],
        ),
        (
            prop_oneof![Just(0.0), 0.01f64..8.0],
            0usize..400,
            prop_oneof![Just(0usize), 1usize..128],
            prop_oneof![Just(0usize), 1usize..512],
            prop_oneof![Just(0usize), 1usize..40_000],
        ),
    )
        .prop_map(
            |(sizes, projection, prune, entry, counts, search, (train_on, auto_ef), cost)| {
                let mut p = AttentionParams {
                    projection,
                    prune,
                    entry,
                    train_on,
                    auto_ef: off_at_zero(auto_ef),
                    ..AttentionParams::default()
                };
                (p.kq, p.max_degree) = sizes;
                (p.entry_count, p.recent_entries, p.sequence_edges) = counts;
                let (global_full, far_check);
                (p.build_ef, p.default_ef, p.causal, global_full, far_check) = search;
                let (probe, graph, pool);
                (p.queries_per_key, p.prune_candidates, probe, graph, pool) = cost;
                // One approximate kNN at a time, the first one drawn (a pool holds at least kq
                // keys); thinned or approximate kNN lists have no causal mode (validation
                // errors); only causal lists are unmasked.
                p.knn = match (probe, graph, pool) {
                    (0, 0, 0) => TrainKnn::Exact,
                    (0, 0, size) => TrainKnn::Pool {
                        size: size.max(p.kq),
                    },
                    (0, ef, _) => TrainKnn::Graph { ef },
                    (lists, _, _) => TrainKnn::Probe { lists },
                };
                p.causal &= p.queries_per_key == 0.0 && p.knn == TrainKnn::Exact;
                if p.causal {
                    p.global_full = off_at_zero(global_full);
                }
                // The far check is triggered by the unmasked lists.
                if p.global_full.is_some() {
                    p.far_check = off_at_zero(far_check);
                }
                p
            },
        )
}

fn spec_strategy() -> impl Strategy<Value = IndexSpec> {
    prop_oneof![
        attention_params().prop_map(IndexSpec::Attention),
        Just(IndexSpec::Flat(FlatParams::default())),
        Just(IndexSpec::Flat(FlatParams {
            codes: Codes::I8,
            rerank: 150
        })),
        (
            2usize..64,
            1usize..400,
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
            1usize..300
        )
            .prop_map(
                |(m, ef_construction, l2_reduction, keep_pruned, seed, de)| {
                    IndexSpec::Hnsw(HnswParams {
                        m,
                        ef_construction,
                        l2_reduction,
                        keep_pruned,
                        seed,
                        default_ef: de,
                    })
                }
            ),
        (
            prop::option::of(1usize..5000),
            0usize..30,
            any::<bool>(),
            1usize..1000,
            any::<u64>(),
            1usize..200,
            prop::option::of(0usize..300),
        )
            .prop_map(|(nlist, iters, spherical, mtpl, seed, nprobe, codes)| {
                IndexSpec::Ivf(IvfParams {
                    codes: if codes.is_some() {
                        Codes::I8
                    } else {
                        Codes::None
                    },
                    rerank: codes.unwrap_or(0),
                    nlist,
                    iters,
                    assignment: if spherical {
                        Assignment::Spherical
                    } else {
                        Assignment::InnerProduct
                    },
                    max_train_per_list: mtpl,
                    seed,
                    default_nprobe: nprobe,
                })
            }),
        (
            (1usize..128, 1usize..300, 1.0f32..3.0),
            (any::<bool>(), 2usize..64, 0usize..128),
            (any::<u64>(), 1e-4f64..=1.0, 1usize..300)
        )
            .prop_map(|((r, l, alpha), (robust, t, reserve), (seed, frac, de))| {
                IndexSpec::Vamana(VamanaParams {
                    r,
                    l,
                    alpha,
                    robust,
                    stitch_t: t,
                    stitch_reserve: reserve % r,
                    seed,
                    max_batch_fraction: frac,
                    default_ef: de,
                })
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Display → FromStr gives the spec back, and the canonical form is a fixed point.
    #[test]
    fn display_round_trips(spec in spec_strategy()) {
        let text = spec.to_string();
        let back: IndexSpec = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(&back, &spec, "{}", text);
        prop_assert_eq!(back.to_string(), text);
        let json = serde_json::to_string(&spec).expect("serializes");
        prop_assert_eq!(serde_json::from_str::<IndexSpec>(&json).expect("deserializes"), spec);
    }
}

#[test]
fn decode_default_is_its_string() {
    let spec = IndexSpec::decode_default();
    assert_eq!(spec.to_string(), qkindex::spec::DECODE_DEFAULT);
    assert_eq!(parse(qkindex::spec::DECODE_DEFAULT), spec);
}

/// `spec` built causally (query row `i` sees keys `0..=i`) over `n` synthetic OOD keys of 16
/// dimensions from `seed`, with the data it was built from.
fn causal_build(spec: &IndexSpec, n: usize, seed: u64) -> (qkindex::synth::SynthData, BuiltIndex) {
    let data = ood(n, n, 16, seed);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), 16).expect("keys"));
    let visible: Vec<u32> = (1..=n as u32).collect();
    let built = spec
        .build_visible(
            keys,
            &data.train_queries,
            Some(&visible),
            &CpuKnn,
            &qkindex::Cancel::new(),
        )
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    (data, built)
}

/// The decode default chooses its kNN by the number of keys: with its threshold lowered to fit
/// a small test, a build over more keys than it keeps the pooled kNN (no causal lists) in the
/// index's parameters, and one over fewer keeps the causal exact kNN; both search.
#[test]
fn the_decode_default_chooses_its_knn_by_length() {
    let (dim, n) = (16, 600);
    let IndexSpec::Attention(default) = IndexSpec::decode_default() else {
        panic!("the decode default is an attention index");
    };
    assert_eq!(default.pool_above, 32768);
    for (threshold, pooled) in [(n - 1, true), (n, false)] {
        // The scan check off: this test reads the graph's parameters (the check's own test
        // is `the_scan_check_keeps_what_it_measured_faster`).
        let spec = IndexSpec::Attention(AttentionParams {
            pool_above: threshold,
            scan_check: false,
            ..default.clone()
        });
        let (data, built) = causal_build(&spec, n, 5);
        let index = built.index.as_attention().expect("attention");
        let p = index.params();
        assert_eq!(p.pool_above, threshold);
        if pooled {
            assert_eq!(
                p.knn,
                TrainKnn::Pool {
                    size: qkindex::attention::LONG_POOL
                }
            );
            assert!(!p.causal && p.global_full.is_none() && p.far_check.is_none());
        } else {
            assert_eq!(p.knn, TrainKnn::Exact);
            assert!(p.causal && p.global_full.is_some() && p.far_check.is_some());
        }
        assert!(index.build_stats().auto_ef.is_some(), "auto-ef ran");
        let q = &data.test_queries[..dim];
        let out = built
            .index
            .search(q, 10, &Default::default(), &mut built.index.new_scratch())
            .expect("search");
        assert_eq!(out.ids.len(), 10);
        // The built index's spec names the kNN it used.
        let text = IndexSpec::Attention(p.clone()).to_string();
        assert_eq!(text.contains("knn-pool=8000"), pooled, "{text}");
        let IndexSpec::Attention(back) = parse(&text) else {
            panic!("{text}");
        };
        assert_eq!(
            (back.knn, back.causal, back.pool_above),
            (p.knn, p.causal, threshold)
        );
    }
}

/// `scan-check`: the build times its calibrated graph against the int8 scan of the same keys
/// on the held-out queries and returns the one it measured faster at the recall target; the
/// figures say which, and a replaced graph's build figures come back beside the scan. Without
/// `auto-ef` (no recall target, no `ef` to time the graph at) the key is refused.
#[test]
fn the_scan_check_keeps_what_it_measured_faster() {
    let (dim, n) = (16, 400);
    let spec = parse("attention:causal=true,auto-ef=0.95,scan-check=true");
    let IndexSpec::Attention(p) = &spec else {
        panic!("attention");
    };
    assert!(p.scan_check);
    let (data, built) = causal_build(&spec, n, 9);
    let (check, kept_scan) = match (&built.index, &built.replaced_graph) {
        (AnyIndex::Flat(f), Some(graph)) => {
            assert_eq!(f.len(), n, "the scan holds the graph's keys");
            assert_eq!(f.params().codes, Codes::I8);
            (graph.scan_check.clone().expect("checked"), true)
        }
        (AnyIndex::Attention(a), None) => {
            (a.build_stats().scan_check.clone().expect("checked"), false)
        }
        (index, replaced) => panic!(
            "kind {:?} with a replaced graph: {}",
            index.kind(),
            replaced.is_some()
        ),
    };
    assert!(check.queries > 0, "{check}");
    assert!(check.graph_us > 0.0 && check.scan_us > 0.0, "{check}");
    for r in [check.graph_recall, check.scan_recall] {
        assert!((0.0..=1.0).contains(&r), "{check}");
    }
    // The group keeps the scan when it is faster over all the check queries at the target;
    // else each query head takes the scan where it was faster for it (the graph routes it).
    assert_eq!(
        check.scan_wins,
        check.scan_us < check.graph_us && check.scan_recall >= 0.95,
        "{check}"
    );
    let per_head = choose(
        &check.head_graph_us,
        &check.head_scan_us,
        &check.head_scan_recall,
        0.95,
    );
    match check.scan_wins {
        true => assert!(check.head_scan.iter().all(|&s| s), "{check}"),
        false => assert_eq!(check.head_scan, per_head, "{check}"),
    }
    assert!(!check.head_scan.is_empty(), "{check}");
    assert_eq!(kept_scan, check.scan_wins, "{check}");
    if let AnyIndex::Attention(a) = &built.index {
        let routed = check.head_scan.contains(&true);
        assert_eq!(a.params().head_scan.contains(&true), routed, "{check}");
    }
    // Whichever was kept answers a search.
    let q = &data.test_queries[..dim];
    let out = built
        .index
        .search(q, 10, &Default::default(), &mut built.index.new_scratch())
        .expect("search");
    assert_eq!(out.ids.len(), 10);
    // The spec text round-trips the key; without auto-ef it is refused.
    assert!(spec.to_string().contains("scan-check=true"), "{spec}");
    // With the far check: its second graph (full lists) is built without the scan check, and
    // the build's check runs once, on the graph kept.
    let spec =
        parse("attention:causal=true,global-full=0.9,far-check=0.01,auto-ef=0.95,scan-check=true");
    let (_, built) = causal_build(&spec, 1500, 11);
    let stats = match (&built.index, &built.replaced_graph) {
        (AnyIndex::Attention(a), None) => a.build_stats().clone(),
        (AnyIndex::Flat(_), Some(graph)) => graph.clone(),
        (index, _) => panic!("kind {:?}", index.kind()),
    };
    assert!(stats.far_check.is_some(), "the far check ran");
    assert!(stats.scan_check.is_some(), "the scan check ran");
    let (name, _, why) = parse_err("attention:scan-check=true");
    assert_eq!(name, "scan-check");
    assert!(why.contains("auto"), "{why}");
}
