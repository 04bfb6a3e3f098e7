//! ReTopK against a brute-force reimplementation of the paper's selector, its exact-path
//! triggers (similarity below τ, refresh steps, empty cache), the cache bound, seeded fallback
//! into an `AttentionIndex`, and input errors.

use proptest::prelude::*;
use qkindex::synth::{ood, Rng};
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, Dtype, Error, FlatIndex, KeyStore, ReTopK,
    ReTopKParams, Scratch, SearchOutput, SearchParams, StepPath,
};
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

/// The selector as the paper states it, written for clarity: f64 cosines, a `BTreeSet` union,
/// a full sort. Scores come from the store's scorer, so they are bit-identical to ReTopK's.
struct Reference {
    p: ReTopKParams,
    cache: VecDeque<(Vec<f64>, Vec<u32>)>,
    steps: u64,
}

struct RefStep {
    path: StepPath,
    ids: Vec<u32>,
    scores: Vec<f32>,
    candidates: usize,
    best: f64,
}

fn unit(q: &[f32]) -> Vec<f64> {
    let norm = q.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    q.iter().map(|&x| f64::from(x) / norm).collect()
}

/// The `k` best of `ids` by score (ties: smaller id first).
fn best_k(q: &[f32], keys: &KeyStore, ids: impl Iterator<Item = u32>, k: usize) -> RefStep {
    let scorer = keys.scorer();
    let mut all: Vec<(f32, u32)> = ids.map(|i| (scorer.score(q, i), i)).collect();
    let candidates = all.len();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    all.truncate(k);
    RefStep {
        path: StepPath::Reuse,
        ids: all.iter().map(|x| x.1).collect(),
        scores: all.iter().map(|x| x.0).collect(),
        candidates,
        best: f64::NEG_INFINITY,
    }
}

impl Reference {
    fn new(p: ReTopKParams) -> Self {
        Reference {
            p,
            cache: VecDeque::new(),
            steps: 0,
        }
    }

    fn step(&mut self, q: &[f32], keys: &KeyStore) -> RefStep {
        let n = keys.len();
        let k = self.p.k.min(n);
        let u = unit(q);
        let mut sims: Vec<(f64, usize)> = self
            .cache
            .iter()
            .enumerate()
            .map(|(i, (c, _))| (c.iter().zip(&u).map(|(a, b)| a * b).sum(), i))
            .collect();
        sims.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        let best = sims.first().map_or(f64::NEG_INFINITY, |s| s.0);
        self.steps += 1;
        let path = if self.cache.is_empty() {
            StepPath::EmptyCache
        } else if self.steps.is_multiple_of(self.p.refresh as u64) {
            StepPath::Refresh
        } else if best < f64::from(self.p.tau) {
            StepPath::LowSimilarity
        } else {
            StepPath::Reuse
        };
        let mut r = if path == StepPath::Reuse {
            let mut cand = BTreeSet::new();
            for &(_, i) in sims.iter().take(self.p.r) {
                cand.extend(
                    self.cache[i]
                        .1
                        .iter()
                        .copied()
                        .filter(|&id| (id as usize) < n),
                );
            }
            cand.extend(n.saturating_sub(self.p.w) as u32..n as u32);
            best_k(q, keys, cand.into_iter(), k)
        } else {
            best_k(q, keys, 0..n as u32, k)
        };
        r.path = path;
        r.best = best;
        self.cache.push_back((u, r.ids.clone()));
        if self.cache.len() > self.p.c {
            self.cache.pop_front();
        }
        r
    }
}

/// A decode-like query stream: each query is either a small perturbation of the previous one
/// (similar, so reused) or a fresh test query (dissimilar, so exact).
fn query_stream(base: &[f32], dim: usize, steps: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let m = base.len() / dim;
    let mut out: Vec<Vec<f32>> = Vec::new();
    for _ in 0..steps {
        let q = match out.last() {
            Some(prev) if rng.uniform() < 0.6 => {
                let norm = prev.iter().map(|x| x * x).sum::<f32>().sqrt() / (dim as f32).sqrt();
                prev.iter()
                    .map(|&x| x + 0.15 * norm * rng.normal())
                    .collect()
            }
            _ => {
                let i = rng.below(m);
                base[i * dim..(i + 1) * dim].to_vec()
            }
        };
        out.push(q);
    }
    out
}

fn store(data: &[f32], dim: usize, dtype: Dtype) -> KeyStore {
    let mut s = KeyStore::empty(dtype, dim).expect("store");
    for row in data.chunks_exact(dim) {
        s.push(row).expect("push");
    }
    s
}

#[test]
fn steps_match_the_brute_force_selector_while_keys_are_appended() {
    let dim = 32;
    for (dtype, seed) in [(Dtype::F32, 3u64), (Dtype::F16, 4)] {
        let data = ood(600, 80, dim, seed);
        let params = ReTopKParams {
            c: 6,
            r: 2,
            w: 5,
            tau: 0.9,
            refresh: 7,
            k: 20,
            seed_fallback: true,
        };
        let mut rt = ReTopK::new(params.clone(), dim).expect("new");
        let mut reference = Reference::new(params);
        let mut keys = Arc::new(store(&data.keys, dim, dtype));
        let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
        let stream = query_stream(&data.test_queries, dim, 120, seed);
        let mut reused = 0;
        for (t, q) in stream.iter().enumerate() {
            // A decode step appends its key first (ids stay row numbers).
            Arc::make_mut(&mut keys)
                .push(&data.heldout_keys[(t % 80) * dim..(t % 80 + 1) * dim])
                .expect("push");
            let flat = FlatIndex::new(keys.clone());
            let got = rt
                .step(
                    q,
                    &keys,
                    &flat,
                    &SearchParams::default(),
                    &mut scratch,
                    &mut out,
                )
                .expect("step");
            let want = reference.step(q, &keys);
            assert_eq!(got.path, want.path, "{dtype} step {t}");
            assert_eq!(out.ids, want.ids, "{dtype} step {t} ({:?})", got.path);
            assert_eq!(out.scores, want.scores, "{dtype} step {t}");
            assert_eq!(got.search, out.stats);
            if got.path == StepPath::Reuse {
                reused += 1;
                assert_eq!(got.candidates, want.candidates, "{dtype} step {t}");
                assert_eq!(got.search.distance_computations, want.candidates as u64);
            } else {
                assert_eq!(got.candidates, keys.len(), "{dtype} step {t}");
            }
            if t > 0 {
                assert!(
                    (f64::from(got.best_similarity) - want.best).abs() < 1e-5,
                    "{dtype} step {t}: {} vs {}",
                    got.best_similarity,
                    want.best
                );
            }
            assert_eq!(got.similarity_computations, t.min(6) as u64);
        }
        // Both paths were exercised, or the comparison proves little.
        assert!((30..100).contains(&reused), "{dtype}: {reused} reuse steps");
    }
}

#[test]
fn exact_path_fires_below_tau_and_on_refresh_steps_with_the_flat_top_k() {
    let dim = 64;
    let data = ood(400, 1, dim, 5);
    let keys = Arc::new(KeyStore::from_f32(data.keys, dim).expect("keys"));
    let flat = FlatIndex::new(keys.clone());
    let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
    let exact = |q: &[f32], k: usize| {
        flat.search(q, k, &SearchParams::default(), &mut Scratch::default())
            .expect("flat")
    };

    // Independent Gaussian queries in 64 dimensions: cosines near 0, always below τ.
    let mut rng = Rng::new(9);
    let params = ReTopKParams {
        k: 30,
        ..ReTopKParams::default()
    };
    let mut rt = ReTopK::new(params, dim).expect("new");
    for t in 0..40 {
        let q: Vec<f32> = (0..dim).map(|_| rng.normal()).collect();
        let s = rt
            .step(
                &q,
                &keys,
                &flat,
                &SearchParams::default(),
                &mut scratch,
                &mut out,
            )
            .expect("step");
        let want = if t == 0 {
            StepPath::EmptyCache
        } else {
            StepPath::LowSimilarity
        };
        assert_eq!(s.path, want, "step {t}");
        assert!(s.best_similarity < 0.85);
        let e = exact(&q, 30);
        assert_eq!((&out.ids, &out.scores), (&e.ids, &e.scores), "step {t}");
        assert_eq!(s.candidates, 400);
    }

    // One query repeated: reuse everywhere except on steps 5, 10, 15, … (refresh) and step 1.
    let params = ReTopKParams {
        refresh: 5,
        k: 25,
        ..ReTopKParams::default()
    };
    let mut rt = ReTopK::new(params, dim).expect("new");
    let q: Vec<f32> = (0..dim).map(|_| rng.normal()).collect();
    let e = exact(&q, 25);
    for step in 1..=23u64 {
        let s = rt
            .step(
                &q,
                &keys,
                &flat,
                &SearchParams::default(),
                &mut scratch,
                &mut out,
            )
            .expect("step");
        let want = match step {
            1 => StepPath::EmptyCache,
            s if s % 5 == 0 => StepPath::Refresh,
            _ => StepPath::Reuse,
        };
        assert_eq!(s.path, want, "step {step}");
        assert_eq!(rt.steps(), step);
        assert_eq!(out.ids, e.ids, "step {step}");
        assert_eq!(out.scores, e.scores, "step {step}");
        if want == StepPath::Reuse {
            assert!(s.best_similarity > 0.9999);
            assert!(s.candidates < 400, "reuse scores a subset");
        } else {
            assert_eq!(s.candidates, 400);
        }
    }

    // Priming counts no step: the first refresh is still the 5th step.
    let mut rt = ReTopK::new(
        ReTopKParams {
            refresh: 5,
            k: 25,
            ..ReTopKParams::default()
        },
        dim,
    )
    .expect("new");
    rt.prime(&q, &[400], &keys).expect("prime");
    let paths: Vec<StepPath> = (0..6)
        .map(|_| {
            rt.step(
                &q,
                &keys,
                &flat,
                &SearchParams::default(),
                &mut scratch,
                &mut out,
            )
            .expect("step")
            .path
        })
        .collect();
    use StepPath::{Refresh, Reuse};
    assert_eq!(paths, vec![Reuse, Reuse, Reuse, Reuse, Refresh, Reuse]);
}

#[test]
fn k_is_capped_at_the_number_of_keys() {
    let dim = 8;
    let data = ood(12, 3, dim, 6);
    let keys = Arc::new(KeyStore::from_f32(data.keys, dim).expect("keys"));
    let flat = FlatIndex::new(keys.clone());
    let mut rt = ReTopK::new(ReTopKParams::default(), dim).expect("new");
    let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
    for q in data.test_queries.chunks_exact(dim) {
        rt.step(
            q,
            &keys,
            &flat,
            &SearchParams::default(),
            &mut scratch,
            &mut out,
        )
        .expect("step");
        assert_eq!(out.ids.len(), 12);
        let mut ids = out.ids.clone();
        ids.sort_unstable();
        assert_eq!(ids, (0..12).collect::<Vec<u32>>());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Each step and each primed query adds one pair; the cache holds the last `c`.
    #[test]
    fn cache_never_grows_past_c(
        c in 1usize..12,
        r_frac in 0.0f64..1.0,
        primed in 0usize..20,
        steps in 0usize..40,
        tau in -1.0f32..1.0,
        seed in 0u64..1000,
    ) {
        let dim = 8;
        let r = 1 + ((c - 1) as f64 * r_frac) as usize;
        let data = ood(60, 60, dim, seed);
        let keys = Arc::new(KeyStore::from_f32(data.keys, dim).expect("keys"));
        let flat = FlatIndex::new(keys.clone());
        let params = ReTopKParams { c, r, w: 3, tau, refresh: 10, k: 7, seed_fallback: true };
        let mut rt = ReTopK::new(params, dim).expect("new");
        let visible: Vec<usize> = (1..=primed).collect();
        rt.prime(&data.train_queries[..primed * dim], &visible, &keys).expect("prime");
        prop_assert_eq!(rt.cache_len(), primed.min(c));
        let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
        for (t, q) in data.test_queries.chunks_exact(dim).take(steps).enumerate() {
            let s = rt
                .step(q, &keys, &flat, &SearchParams::default(), &mut scratch, &mut out)
                .expect("step");
            prop_assert!(rt.cache_len() <= c);
            prop_assert_eq!(rt.cache_len(), (primed + t + 1).min(c));
            prop_assert_eq!(s.similarity_computations as usize, (primed + t).min(c));
            // Exact paths return k ids; a reuse step can only return its candidates, which
            // are few when the primed queries saw few keys.
            prop_assert!(out.ids.len() <= 7);
            if s.path.is_exact() {
                prop_assert_eq!(out.ids.len(), 7);
            } else {
                prop_assert!(out.ids.len() >= 3, "the window alone holds 3 keys");
            }
            prop_assert!(out.scores.windows(2).all(|w| w[0] >= w[1]));
        }
        prop_assert_eq!(rt.steps(), steps as u64);
    }
}

/// Checks a result: ids in range, no duplicates, scores descending and equal to `q · key`.
fn check_result(out: &SearchOutput, q: &[f32], keys: &KeyStore, k: usize) {
    assert_eq!(out.ids.len(), k);
    assert!(out.ids.iter().all(|&i| (i as usize) < keys.len()));
    let distinct: BTreeSet<u32> = out.ids.iter().copied().collect();
    assert_eq!(distinct.len(), k, "duplicate ids {:?}", out.ids);
    assert!(out.scores.windows(2).all(|w| w[0] >= w[1]));
    let scorer = keys.scorer();
    for (&i, &s) in out.ids.iter().zip(&out.scores) {
        assert_eq!(scorer.score(q, i), s);
    }
}

#[test]
fn seeded_fallback_hands_the_recalled_sets_to_an_attention_index() {
    let (n, dim, k) = (2000, 32, 20);
    let data = ood(n, 60, dim, 11);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let index = AttentionIndex::build(
        keys.clone(),
        &data.train_queries,
        &AttentionParams::default(),
        &CpuKnn,
    )
    .expect("build");
    let flat = FlatIndex::new(keys.clone());
    // refresh = 1: every step after the first takes the exact path (Refresh).
    let params = |seed_fallback| ReTopKParams {
        refresh: 1,
        k,
        seed_fallback,
        ..ReTopKParams::default()
    };
    let search = SearchParams::with_ef(k);
    let queries = &data.test_queries;
    let mut runs = Vec::new();
    for seed_fallback in [true, false] {
        let mut rt = ReTopK::new(params(seed_fallback), dim).expect("new");
        let (mut scratch, mut out) = (index.new_scratch(), SearchOutput::default());
        let (mut dc, mut recall, mut previous) = (0u64, 0.0, Vec::<u32>::new());
        for (t, q) in queries.chunks_exact(dim).enumerate() {
            let s = rt
                .step(q, &keys, &index, &search, &mut scratch, &mut out)
                .expect("step");
            let want = if t == 0 {
                StepPath::EmptyCache
            } else {
                StepPath::Refresh
            };
            assert_eq!(s.path, want);
            check_result(&out, q, &keys, k);
            let seeds = rt.last_seeds();
            if seed_fallback && t > 0 {
                // The union of the R = 4 most similar cached sets: distinct ids that earlier
                // steps chose, at least one whole set (k ids), at most R sets.
                let distinct: BTreeSet<u32> = seeds.iter().copied().collect();
                assert_eq!(distinct.len(), seeds.len());
                assert!((k..=4 * k).contains(&seeds.len()), "{} seeds", seeds.len());
                assert!(seeds.iter().all(|s| previous.contains(s)));
                // Every seed is scored once, on top of the index's own entry points.
                assert!(s.search.distance_computations >= seeds.len() as u64);
            } else {
                assert!(seeds.is_empty());
            }
            assert_eq!(s.candidates as u64, s.search.distance_computations);
            dc += s.search.distance_computations;
            let e = flat
                .search(q, k, &SearchParams::default(), &mut Scratch::default())
                .expect("flat");
            recall += ReTopK::overlap(&out.ids, &e.ids);
            previous.extend_from_slice(&out.ids);
        }
        runs.push((dc, recall / 60.0));
    }
    // Seeds change the search (here the recalled sets are mediocre entry points, so no
    // direction of change is asserted; the next test pins what seeds must achieve).
    assert_ne!(
        runs[0].0, runs[1].0,
        "seeded and unseeded searches computed the same"
    );
    assert!(runs[0].1 > 0.9 && runs[1].1 > 0.9, "recall {runs:?}");
}

#[test]
fn seeds_holding_the_exact_top_k_make_a_narrow_graph_search_exact() {
    // A weak graph (small degree, few training neighbours) searched with ef = k misses keys;
    // primed with the query's own exact top-k, a refresh step seeds the search with it, and a
    // beam that starts from the k best keys can only return them.
    let (n, dim, k) = (2000, 32, 20);
    let data = ood(n, 40, dim, 13);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let weak = AttentionParams {
        kq: 10,
        max_degree: 4,
        ..AttentionParams::default()
    };
    let index =
        AttentionIndex::build(keys.clone(), &data.train_queries, &weak, &CpuKnn).expect("build");
    let flat = FlatIndex::new(keys.clone());
    let search = SearchParams::with_ef(k);
    let (mut scratch, mut out) = (index.new_scratch(), SearchOutput::default());
    let mut missed_unseeded = 0;
    for q in data.test_queries.chunks_exact(dim) {
        let e = flat
            .search(q, k, &SearchParams::default(), &mut Scratch::default())
            .expect("flat");
        let plain = index.search(q, k, &search, &mut scratch).expect("search");
        missed_unseeded += usize::from(plain.ids != e.ids);
        for seed_fallback in [true, false] {
            let params = ReTopKParams {
                refresh: 1,
                k,
                seed_fallback,
                ..ReTopKParams::default()
            };
            let mut rt = ReTopK::new(params, dim).expect("new");
            rt.prime(q, &[n], &keys).expect("prime");
            let s = rt
                .step(q, &keys, &index, &search, &mut scratch, &mut out)
                .expect("step");
            assert_eq!(s.path, StepPath::Refresh);
            check_result(&out, q, &keys, k);
            if seed_fallback {
                assert_eq!(out.ids, e.ids);
                let mut seeds = rt.last_seeds().to_vec();
                seeds.sort_unstable();
                let mut want = e.ids.clone();
                want.sort_unstable();
                assert_eq!(seeds, want);
            } else {
                assert_eq!(out.ids, plain.ids, "no seeds: the plain search");
            }
        }
    }
    // Otherwise the seeded equality above would prove nothing.
    assert!(
        missed_unseeded >= 5,
        "the weak graph missed on {missed_unseeded} of 40"
    );
}

#[test]
fn caller_seeds_are_kept_and_bad_inputs_are_errors_that_change_nothing() {
    let dim = 16;
    let data = ood(200, 4, dim, 12);
    let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    let flat = FlatIndex::new(keys.clone());
    let mut rt = ReTopK::new(
        ReTopKParams {
            k: 10,
            refresh: 2,
            ..ReTopKParams::default()
        },
        dim,
    )
    .expect("new");
    let (mut scratch, mut out) = (Scratch::default(), SearchOutput::default());
    let q = &data.test_queries[..dim];
    let caller = SearchParams::default();
    let seeds = [7, 3];
    rt.step_seeded(q, &keys, &flat, &caller, &seeds, &mut scratch, &mut out)
        .expect("step 1");
    assert_eq!(rt.last_seeds(), &[7, 3]);
    // Step 2 is a refresh: the caller's seeds, then the recalled set.
    rt.step_seeded(q, &keys, &flat, &caller, &seeds, &mut scratch, &mut out)
        .expect("step 2");
    assert_eq!(&rt.last_seeds()[..2], &[7, 3]);
    assert_eq!(rt.last_seeds().len(), 2 + 10);
    let before = (rt.cache_len(), rt.steps());

    let p = SearchParams::default();
    let mut nan = q.to_vec();
    nan[3] = f32::NAN;
    let other = Arc::new(KeyStore::from_f32(data.keys[..100 * dim].to_vec(), dim).expect("keys"));
    let other_flat = FlatIndex::new(other.clone());
    let narrow = Arc::new(KeyStore::from_f32(data.keys[..200 * 8].to_vec(), 8).expect("keys"));
    let narrow_flat = FlatIndex::new(narrow.clone());
    let empty = KeyStore::empty(Dtype::F32, dim).expect("empty");
    let cases: Vec<(&str, qkindex::Result<qkindex::StepStats>)> = vec![
        (
            "short query",
            rt.step(&q[1..], &keys, &flat, &p, &mut scratch, &mut out),
        ),
        (
            "NaN query",
            rt.step(&nan, &keys, &flat, &p, &mut scratch, &mut out),
        ),
        (
            "exact index of 100 keys",
            rt.step(q, &keys, &other_flat, &p, &mut scratch, &mut out),
        ),
        (
            "exact index of dim 8",
            rt.step(q, &keys, &narrow_flat, &p, &mut scratch, &mut out),
        ),
        (
            "keys of dim 8",
            rt.step(q, &narrow, &flat, &p, &mut scratch, &mut out),
        ),
        (
            "empty store",
            rt.step(q, &empty, &flat, &p, &mut scratch, &mut out),
        ),
    ];
    for (what, r) in cases {
        match (what, r) {
            (
                "short query",
                Err(Error::DimensionMismatch {
                    expected: 16,
                    got: 15,
                    ..
                }),
            ) => {}
            ("NaN query", Err(Error::NonFinite { row: 0, .. })) => {}
            (
                "exact index of 100 keys",
                Err(Error::DimensionMismatch {
                    expected: 200,
                    got: 100,
                    ..
                }),
            ) => {}
            (
                "exact index of dim 8",
                Err(Error::DimensionMismatch {
                    expected: 16,
                    got: 8,
                    ..
                }),
            ) => {}
            (
                "keys of dim 8",
                Err(Error::DimensionMismatch {
                    expected: 16,
                    got: 8,
                    ..
                }),
            ) => {}
            ("empty store", Err(Error::Empty { .. })) => {}
            (what, other) => panic!("{what}: unexpected {other:?}"),
        }
    }
    // An error of the exact index itself (here ef < k) propagates too.
    let index = AttentionIndex::build(
        keys.clone(),
        &data.train_queries,
        &AttentionParams::default(),
        &CpuKnn,
    )
    .expect("build");
    let step3 = rt.step(
        q,
        &keys,
        &index,
        &SearchParams::with_ef(5),
        &mut scratch,
        &mut out,
    );
    // Step 3 would be a reuse step (cosine 1); step 4 is a refresh and reaches the index.
    assert_eq!(step3.expect("step 3").path, StepPath::Reuse);
    let before3 = (rt.cache_len(), rt.steps());
    assert_eq!(before3, (before.0 + 1, before.1 + 1));
    assert!(matches!(
        rt.step(
            q,
            &keys,
            &index,
            &SearchParams::with_ef(5),
            &mut scratch,
            &mut out
        ),
        Err(Error::InvalidParam { name: "ef", .. })
    ));
    assert_eq!(
        (rt.cache_len(), rt.steps()),
        before3,
        "a failed step changes nothing"
    );

    // prime
    let two = &data.test_queries[..2 * dim];
    assert!(matches!(
        rt.prime(two, &[5], &keys),
        Err(Error::DimensionMismatch { .. })
    ));
    assert!(matches!(
        rt.prime(two, &[5, 201], &keys),
        Err(Error::InvalidParam {
            name: "visible",
            ..
        })
    ));
    let mut bad = two.to_vec();
    bad[dim + 1] = f32::INFINITY;
    assert!(matches!(
        rt.prime(&bad, &[5, 6], &keys),
        Err(Error::NonFinite { row: 1, .. })
    ));
    assert!(matches!(
        rt.prime(&two[..16], &[5, 6], &narrow),
        Err(Error::DimensionMismatch { .. })
    ));
    assert_eq!((rt.cache_len(), rt.steps()), before3);

    // construction
    assert!(matches!(
        ReTopK::new(ReTopKParams::default(), 0),
        Err(Error::InvalidParam { name: "dim", .. })
    ));
    assert!(matches!(
        ReTopK::new(
            ReTopKParams {
                r: 40,
                ..ReTopKParams::default()
            },
            dim
        ),
        Err(Error::InvalidParam { name: "r", .. })
    ));
}
