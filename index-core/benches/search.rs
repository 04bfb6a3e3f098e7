//! Beam search of `AttentionIndex` at a fixed recall, against the exact scan of the same keys.
//!
//! Setup builds the index on the crate's synthetic OOD generator (n = 32,768, d = 128) and picks
//! the smallest `ef` of a sweep whose mean recall@100 over the test queries reaches 0.95; it prints
//! that `ef`, the recall and the fraction scanned. The benchmark then times one search per query
//! (single thread), so "time per iteration" is latency per query.
//!
//! `cargo bench -p qkindex --bench search`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, KeyStore, SearchOutput,
    SearchParams,
};
use std::hint::black_box;
use std::sync::Arc;

const N: usize = 32_768;
const M: usize = 200;
const DIM: usize = 128;
const K: usize = 100;

fn bench_search(c: &mut Criterion) {
    let data = qkindex::synth::ood(N, M, DIM, 11);
    let keys16: Vec<half::f16> = data.keys.iter().map(|&x| half::f16::from_f32(x)).collect();
    let keys = Arc::new(KeyStore::from_f16(keys16, DIM).expect("keys"));
    let index = AttentionIndex::build(
        keys.clone(),
        &data.train_queries,
        &AttentionParams::default(),
        &CpuKnn,
    )
    .expect("build");
    let flat = FlatIndex::new(keys);
    let queries: Vec<&[f32]> = data.test_queries.chunks_exact(DIM).collect();
    let mut scratch = index.new_scratch();
    let exact: Vec<SearchOutput> = queries
        .iter()
        .map(|q| {
            flat.search(q, K, &SearchParams::default(), &mut scratch)
                .expect("flat")
        })
        .collect();
    let mut chosen = None;
    for ef in [100, 128, 160, 192, 256, 320, 400, 512, 640, 800, 1024] {
        let params = SearchParams::with_ef(ef);
        let (mut recall, mut dc) = (0.0, 0.0);
        for (q, e) in queries.iter().zip(&exact) {
            let out = index.search(q, K, &params, &mut scratch).expect("search");
            recall += qkindex::eval::recall(&out.ids, &e.ids);
            dc += out.stats.distance_computations as f64;
        }
        let m = queries.len() as f64;
        if recall / m >= 0.95 {
            eprintln!(
                "attention: ef {ef} gives recall@{K} {:.4} scanning {:.4} of {N} keys",
                recall / m,
                dc / m / N as f64
            );
            chosen = Some(params);
            break;
        }
    }
    let Some(params) = chosen else {
        eprintln!("attention: no ef of the sweep reaches recall 0.95; nothing to time");
        return;
    };
    let mut group = c.benchmark_group(format!("search_n{N}_d{DIM}_k{K}"));
    group.throughput(Throughput::Elements(queries.len() as u64));
    let mut out = SearchOutput::default();
    group.bench_function("attention_recall_0.95", |b| {
        b.iter(|| {
            for q in &queries {
                index
                    .search_into(black_box(q), K, &params, &mut scratch, &mut out)
                    .expect("search");
            }
        })
    });
    group.bench_function("flat", |b| {
        b.iter(|| {
            for q in &queries {
                flat.search_into(
                    black_box(q),
                    K,
                    &SearchParams::default(),
                    &mut scratch,
                    &mut out,
                )
                .expect("search");
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_search
}
criterion_main!(benches);
