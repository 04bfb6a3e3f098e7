//! `CpuKnn` against an f64 brute force: plain and causal, f32 and f16 stores, padding, errors.

use half::f16;
use qkindex::metric::scalar::dot_f64;
use qkindex::synth::Rng;
use qkindex::{CpuKnn, Error, KeyStore, KnnBackend, KnnOptions, KnnResult};

/// Scores of one query against the visible keys, best first (f64, ties by id).
fn brute(q: &[f32], keys: &[f32], d: usize, visible: usize) -> Vec<(f64, u32)> {
    let mut s: Vec<(f64, u32)> = (0..visible)
        .map(|j| (dot_f64(q, &keys[j * d..(j + 1) * d]), j as u32))
        .collect();
    s.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    s
}

fn random(n: usize, rng: &mut Rng, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * scale).collect()
}

/// Checks one result row against the brute-force ranking of the `visible` keys.
fn check_row(r: &KnnResult, i: usize, q: &[f32], keys: &[f32], d: usize, visible: usize) {
    let k = r.k;
    let want = brute(q, keys, d, visible);
    let expect_len = k.min(visible);
    let ids = r.row(i);
    let scores = r.row_scores(i);
    assert_eq!(ids.len(), expect_len, "row {i}: length");
    assert_eq!(scores.len(), expect_len, "row {i}: score length");
    // Padding of short rows.
    let full_ids = &r.ids[i * k..(i + 1) * k];
    let full_scores = &r.scores[i * k..(i + 1) * k];
    for j in expect_len..k {
        assert_eq!(full_ids[j], KnnResult::PAD, "row {i}: pad id at {j}");
        assert_eq!(
            full_scores[j],
            f32::NEG_INFINITY,
            "row {i}: pad score at {j}"
        );
    }
    // Descending, no duplicates, all visible.
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "row {i}: scores not descending {scores:?}"
    );
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "row {i}: duplicate ids");
    assert!(
        ids.iter().all(|&id| (id as usize) < visible),
        "row {i}: id not visible"
    );
    // Reported scores are the inner products of the reported ids.
    for (&id, &s) in ids.iter().zip(scores) {
        let exact = dot_f64(q, &keys[id as usize * d..(id as usize + 1) * d]);
        let mag: f64 = q
            .iter()
            .zip(&keys[id as usize * d..(id as usize + 1) * d])
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        assert!(
            (s as f64 - exact).abs() <= 1e-4 * mag + 1e-5,
            "row {i}: score {s} of id {id} vs exact {exact}"
        );
    }
    // Rank by rank, the scores equal the brute-force ones (this tolerates near-ties swapping
    // ids); and where no two of the top `k + 1` brute-force scores are within 1e-5, the ids
    // must be exactly the brute-force ids.
    let tol = |w: f64| 1e-5 * (1.0 + w.abs());
    for (rank, (&s, w)) in scores.iter().zip(&want).enumerate() {
        assert!(
            (s as f64 - w.0).abs() <= tol(w.0),
            "row {i}: rank {rank}: got id {} score {s}, want id {} score {}",
            ids[rank],
            w.1,
            w.0
        );
    }
    let head = &want[..(expect_len + 1).min(want.len())];
    let near_tie = head.windows(2).any(|p| p[0].0 - p[1].0 <= tol(p[0].0));
    if !near_tie {
        let want_ids: Vec<u32> = want[..expect_len].iter().map(|x| x.1).collect();
        assert_eq!(ids, want_ids.as_slice(), "row {i}: ids");
    }
}

fn run_case(m: usize, n: usize, d: usize, k: usize, causal: bool, f16_keys: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let q = random(m * d, &mut rng, 1.0);
    let raw = random(n * d, &mut rng, 1.0);
    let (store, keys) = if f16_keys {
        let h: Vec<f16> = raw.iter().map(|&x| f16::from_f32(x)).collect();
        let exact: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
        (KeyStore::from_f16(h, d).expect("f16 store"), exact)
    } else {
        (KeyStore::from_f32(raw.clone(), d).expect("f32 store"), raw)
    };
    let r = CpuKnn
        .topk(&q, &store, k, &KnnOptions::causal(causal))
        .expect("knn");
    assert_eq!(r.k, k);
    assert_eq!(r.rows(), m);
    assert_eq!(r.ids.len(), m * k);
    assert_eq!(r.scores.len(), m * k);
    for i in 0..m {
        let visible = if causal { (i + 1).min(n) } else { n };
        check_row(&r, i, &q[i * d..(i + 1) * d], &keys, d, visible);
    }
}

#[test]
fn plain_matches_brute_force() {
    for (seed, &k) in [1usize, 7, 100].iter().enumerate() {
        run_case(150, 700, 19, k, false, false, seed as u64);
    }
}

#[test]
fn causal_matches_brute_force_with_padding() {
    // m > n too: rows past the last key see every key. 300 rows span three query tiles.
    for (seed, &k) in [1usize, 7, 100].iter().enumerate() {
        run_case(300, 250, 16, k, true, false, 10 + seed as u64);
    }
}

#[test]
fn crosses_key_tiles() {
    // n > 4096 keys: several key tiles per query tile, plain and causal.
    run_case(40, 5000, 8, 7, false, false, 21);
    run_case(140, 5000, 8, 100, true, false, 22);
}

#[test]
fn f16_store_matches_brute_force_on_converted_keys() {
    for (seed, &k) in [1usize, 7, 100].iter().enumerate() {
        run_case(130, 400, 33, k, false, true, 30 + seed as u64);
        run_case(130, 400, 33, k, true, true, 40 + seed as u64);
    }
}

#[test]
fn k_equal_n_returns_every_key() {
    run_case(20, 37, 5, 37, false, false, 50);
    run_case(20, 37, 5, 37, true, false, 51);
}

#[test]
fn causal_pad_rows_are_exactly_the_short_ones() {
    let d = 4;
    let mut rng = Rng::new(60);
    let store = KeyStore::from_f32(random(20 * d, &mut rng, 1.0), d).expect("store");
    let q = random(10 * d, &mut rng, 1.0);
    let r = CpuKnn
        .topk(&q, &store, 5, &KnnOptions::causal(true))
        .expect("knn");
    for i in 0..10 {
        assert_eq!(r.row(i).len(), (i + 1).min(5), "row {i}");
        let pads = r.ids[i * 5..(i + 1) * 5]
            .iter()
            .filter(|&&x| x == KnnResult::PAD)
            .count();
        assert_eq!(pads, 5 - (i + 1).min(5), "row {i}");
    }
    // Row 0 sees only key 0.
    assert_eq!(r.row(0), &[0]);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let d = 4;
    let store = KeyStore::from_f32(vec![1.0; 3 * d], d).expect("store");
    let opts = KnnOptions::default();
    let q = [0.5f32; 4];
    assert!(matches!(
        CpuKnn.topk(&q, &store, 0, &opts),
        Err(Error::InvalidParam { name: "k", .. })
    ));
    assert!(matches!(
        CpuKnn.topk(&q, &store, 4, &opts),
        Err(Error::InvalidParam { name: "k", .. })
    ));
    assert!(matches!(
        CpuKnn.topk(&[], &store, 1, &opts),
        Err(Error::Empty { .. })
    ));
    assert!(matches!(
        CpuKnn.topk(&[1.0; 5], &store, 1, &opts),
        Err(Error::DimensionMismatch { .. })
    ));
    let mut nan = vec![0.0f32; 2 * d];
    nan[d + 2] = f32::NAN;
    assert!(matches!(
        CpuKnn.topk(&nan, &store, 1, &opts),
        Err(Error::NonFinite { row: 1, .. })
    ));
    let mut inf = vec![0.0f32; d];
    inf[0] = f32::NEG_INFINITY;
    assert!(matches!(
        CpuKnn.topk(&inf, &store, 1, &KnnOptions::causal(true)),
        Err(Error::NonFinite { row: 0, .. })
    ));
}

#[test]
fn exact_ties_are_deterministic_and_complete() {
    // All keys identical: every score ties; the result must still be k distinct valid ids.
    let d = 3;
    let store = KeyStore::from_f32(vec![1.0; 50 * d], d).expect("store");
    let q = vec![1.0f32; 4 * d];
    let a = CpuKnn
        .topk(&q, &store, 10, &KnnOptions::default())
        .expect("knn");
    let b = CpuKnn
        .topk(&q, &store, 10, &KnnOptions::default())
        .expect("knn");
    assert_eq!(a, b);
    for i in 0..4 {
        let mut ids = a.row(i).to_vec();
        assert_eq!(ids.len(), 10);
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 10);
        assert!(a.row_scores(i).iter().all(|&s| s == 3.0));
    }
}
