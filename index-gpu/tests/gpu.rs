//! GPU top-k against the CPU reference on random data: both kernel paths, causal and not, k from 1
//! to the 1,024 limit, dimensions that need padding. Where no GPU is usable each test prints why
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
