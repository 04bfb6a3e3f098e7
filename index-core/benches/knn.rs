//! Exact batched top-k (`CpuKnn`): m queries × n keys × d, reported as GFLOP/s (criterion's
//! "elements" are floating-point operations, 2·m·n·d per call), and the build phases of
//! `AttentionIndex` (kNN, projection, connectivity) on the same data.
//!
//! `cargo bench -p qkindex --bench knn`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qkindex::{AttentionIndex, AttentionParams, CpuKnn, KeyStore, KnnBackend, KnnOptions};
use std::hint::black_box;
use std::sync::Arc;

const DIM: usize = 128;

fn bench_knn(c: &mut Criterion) {
    let (m, n, k) = (2048usize, 16_384usize, 100usize);
    let data = qkindex::synth::ood(n, 1, DIM, 5);
    let keys16: Vec<half::f16> = data.keys.iter().map(|&x| half::f16::from_f32(x)).collect();
    let keys = Arc::new(KeyStore::from_f16(keys16, DIM).expect("keys"));
    let queries = &data.train_queries[..m * DIM];
    let mut group = c.benchmark_group(format!("exact_topk_m{m}_n{n}_d{DIM}_k{k}"));
    group.throughput(Throughput::Elements((2 * m * n * DIM) as u64));
    for causal in [false, true] {
        let name = if causal { "cpu_causal" } else { "cpu" };
        group.bench_function(name, |b| {
            b.iter(|| {
                CpuKnn
                    .topk(black_box(queries), &keys, k, &KnnOptions::causal(causal))
                    .expect("knn")
            })
        });
    }
    group.finish();

    // Build phases: the whole build is timed by criterion; the phase split of the last build is
    // printed from its BuildStats.
    let mut group = c.benchmark_group(format!("attention_build_n{n}_d{DIM}"));
    let mut last = None;
    group.bench_function("build", |b| {
        b.iter(|| {
            let idx = AttentionIndex::build(
                keys.clone(),
                &data.train_queries,
                &AttentionParams::default(),
                &CpuKnn,
            )
            .expect("build");
            last = Some(idx.build_stats().clone());
        })
    });
    group.finish();
    if let Some(s) = last {
        eprintln!(
            "attention build phases (last run): knn {:.3}s, projection {:.3}s, connectivity {:.3}s, total {:.3}s; {} edges",
            s.knn_s, s.projection_s, s.connectivity_s, s.total_s, s.edges
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_knn
}
criterion_main!(benches);
