//! GPU top-k against the CPU reference on random data: the three kernel paths, causal and not, k
//! from 1 to the running lists' 1,024 and beyond (radix: any k ≤ n), dimensions that need
//! padding; the radix path equal to the CPU bit for bit (ties included) where f16 is exact. Where no GPU is usable each test prints why
//! and checks that the reason is reported as `Unavailable` (the CPU path is tested in index-core).

use qkindex::{CpuKnn, KeyStore, KnnBackend, KnnOptions};
use qkindex_gpu::{compare, CudaKnn, CudaKnnOptions, GpuError, KernelPath};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "../../tests/support/skip.rs"]
mod skip;

fn gpu(path: KernelPath, rescore: bool) -> Option<CudaKnn> {
    match CudaKnn::new(0) {
        Ok(g) => Some(g.with_options(CudaKnnOptions {
            path,
            rescore,
            query_chunk: 192, // several chunks even on small inputs
        })),
        Err(e) => {
            assert!(
                matches!(e, GpuError::Unavailable(_)),
                "not a clean skip: {e}"
            );
            skip::skip(&e.to_string());
            None
        }
    }
}

fn random(rows: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..rows * d)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect()
}

fn check(path: KernelPath, m: usize, n: usize, d: usize, k: usize, causal: bool) {
    let Some(g) = gpu(path, true) else { return };
    if path == KernelPath::Gemm && !g.has_cublas() {
        skip::skip("cuBLAS is not on the library path");
        return;
    }
    let q = random(m, d, 1);
    let keys = KeyStore::from_f32(random(n, d, 2), d).expect("keys");
    let opts = KnnOptions::causal(causal);
    let cpu = CpuKnn.topk(&q, &keys, k, &opts).expect("cpu");
    let (got, t) = g.run(&q, &keys, k, &opts).expect("gpu");
    let c = compare(&q, &keys, &got, &cpu);
    println!("{path:?} m={m} n={n} d={d} k={k} causal={causal}: {c:?} {t:?}");
    assert!(c.ok(), "{c:?}");
    assert!(c.recall > 0.99, "{c:?}");
}

#[test]
fn fused_matches_cpu() {
    check(KernelPath::Fused, 500, 3000, 64, 100, false);
    check(KernelPath::Fused, 300, 2000, 40, 1, false);
    check(KernelPath::Fused, 256, 5000, 128, 1024, false);
}

#[test]
fn fused_causal_matches_cpu() {
    check(KernelPath::Fused, 700, 700, 64, 100, true);
}

#[test]
fn gemm_matches_cpu() {
    check(KernelPath::Gemm, 500, 3000, 64, 100, false);
    check(KernelPath::Gemm, 200, 4000, 200, 1024, false);
    check(KernelPath::Gemm, 600, 600, 128, 10, true);
}

#[test]
fn radix_matches_cpu() {
    check(KernelPath::Radix, 50, 3000, 64, 2000, false);
    check(KernelPath::Radix, 40, 5000, 200, 4096, false);
    check(KernelPath::Radix, 300, 300, 64, 300, true); // k = n, causal rows padded
    check(KernelPath::Radix, 70, 4000, 128, 1, false);
}

#[test]
fn auto_takes_any_k() {
    // A pooled kNN's pools (`attention:knn-pool=16000`): few rows, k far over 1,024.
    check(KernelPath::Auto, 20, 20_000, 128, 16_000, false);
    check(KernelPath::Auto, 64, 3000, 64, 100, false);
}

/// Multiples of 1/8 in [−1, 1]: exact in f16, and every inner product of 64 of them (a multiple
/// of 1/64 below 64) is exact in f32 on both sides, so the GPU's scores are the CPU's and the
/// radix path must give the CPU's lists exactly, including which of many tied keys are kept.
#[test]
fn radix_equals_cpu_exactly_where_f16_is_exact() {
    let Some(g) = gpu(KernelPath::Radix, false) else {
        return;
    };
    if !g.has_cublas() {
        skip::skip("cuBLAS is not on the library path");
        return;
    }
    let eighths = |rows: usize, seed: u64| -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..rows * 64)
            .map(|_| rng.random_range(-8i32..=8) as f32 / 8.0)
            .collect()
    };
    let q = eighths(30, 7);
    let keys = KeyStore::from_f32(eighths(6000, 8), 64).expect("keys");
    for (k, causal) in [(1, false), (1500, false), (5000, false), (2000, true)] {
        let opts = KnnOptions::causal(causal);
        let cpu = CpuKnn.topk(&q, &keys, k, &opts).expect("cpu");
        let (got, _) = g.run(&q, &keys, k, &opts).expect("gpu");
        assert_eq!(got.ids, cpu.ids, "k {k} causal {causal}: ids");
        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.scores), bits(&cpu.scores), "k {k}: scores");
    }
}

#[test]
fn scores_without_rescoring_are_close_to_exact() {
    let Some(g) = gpu(KernelPath::Auto, false) else {
        return;
    };
    let q = random(64, 64, 3);
    let keys = KeyStore::from_f32(random(1000, 64, 4), 64).expect("keys");
    let (got, _) = g.run(&q, &keys, 10, &KnnOptions::default()).expect("gpu");
    let scorer = keys.scorer();
    for i in 0..64 {
        for (&id, &s) in got.row(i).iter().zip(got.row_scores(i)) {
            let exact = scorer.score(&q[i * 64..(i + 1) * 64], id);
            assert!((s - exact).abs() < 2e-2, "row {i} id {id}: {s} vs {exact}");
        }
    }
}

#[test]
fn bad_input_is_an_error_not_a_crash() {
    let Some(g) = gpu(KernelPath::Auto, true) else {
        return;
    };
    let keys = KeyStore::from_f32(random(100, 16, 5), 16).expect("keys");
    let opts = KnnOptions::default();
    assert!(g.topk(&random(2, 16, 6), &keys, 0, &opts).is_err());
    assert!(g.topk(&random(2, 16, 6), &keys, 101, &opts).is_err());
    assert!(g.topk(&[f32::NAN; 16], &keys, 5, &opts).is_err());
    assert!(g.topk(&random(2, 15, 6)[..30], &keys, 5, &opts).is_err());
}
