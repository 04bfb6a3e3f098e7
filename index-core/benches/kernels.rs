//! Inner-product kernels: throughput in bytes of keys read per second, next to the machine's
//! memory bandwidth measured the same way (a plain streaming sum over the same number of bytes).
//!
//! Two sizes: keys that fit in L2 (the hot part of a graph search) and keys far larger than the
//! last-level cache (a flat scan of a long context), for f32 and f16 keys.
//!
//! `cargo bench -p qkindex --bench kernels`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use qkindex::metric::{kernels, Kernels};
use std::hint::black_box;

const DIM: usize = 128;

fn data(n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = qkindex::synth::Rng::new(1);
    let q: Vec<f32> = (0..DIM).map(|_| rng.normal()).collect();
    let keys: Vec<f32> = (0..n * DIM).map(|_| rng.normal()).collect();
    (q, keys)
}

fn bench_kernels(c: &mut Criterion) {
    let best: &Kernels = kernels();
    let scalar = Kernels::scalar();
    // 1,024 rows of d = 128: 512 KiB (f32) — L2-resident; 262,144 rows: 128 MiB (f32).
    for &rows in &[1024usize, 262_144] {
        let (q, keys32) = data(rows);
        let keys16: Vec<f16> = keys32.iter().map(|&x| f16::from_f32(x)).collect();
        let mut out = vec![0.0f32; rows];
        let mut group = c.benchmark_group(format!("scan_{rows}_rows_d{DIM}"));
        group.throughput(Throughput::Bytes((rows * DIM * 4) as u64));
        group.bench_function(BenchmarkId::new("range_f32", best.isa), |b| {
            b.iter(|| (best.range_f32)(black_box(&q), black_box(&keys32), DIM, &mut out))
        });
        group.bench_function(BenchmarkId::new("range_f32", "scalar"), |b| {
            b.iter(|| (scalar.range_f32)(black_box(&q), black_box(&keys32), DIM, &mut out))
        });
        // Memory bandwidth reference: a sum with 16 independent accumulators, which the
        // compiler vectorises, so it is limited by loads rather than by an add chain.
        group.bench_function("memory_sum_f32", |b| {
            b.iter(|| {
                let mut acc = [0.0f32; 16];
                for chunk in black_box(&keys32).chunks_exact(16) {
                    for (a, &x) in acc.iter_mut().zip(chunk) {
                        *a += x;
                    }
                }
                acc.iter().sum::<f32>()
            })
        });
        group.throughput(Throughput::Bytes((rows * DIM * 2) as u64));
        group.bench_function(BenchmarkId::new("range_f16", best.isa), |b| {
            b.iter(|| (best.range_f16)(black_box(&q), black_box(&keys16), DIM, &mut out))
        });
        group.bench_function(BenchmarkId::new("range_f16", "scalar"), |b| {
            b.iter(|| (scalar.range_f16)(black_box(&q), black_box(&keys16), DIM, &mut out))
        });
        // Random rows, as a graph search reads them (gather with prefetch).
        let mut rng = qkindex::synth::Rng::new(2);
        let ids: Vec<u32> = (0..1024).map(|_| rng.below(rows) as u32).collect();
        let mut gathered = vec![0.0f32; ids.len()];
        group.throughput(Throughput::Bytes((ids.len() * DIM * 2) as u64));
        group.bench_function(BenchmarkId::new("gather_f16_1024_ids", best.isa), |b| {
            b.iter(|| {
                (best.gather_f16)(black_box(&q), &keys16, DIM, black_box(&ids), &mut gathered)
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(2));
    targets = bench_kernels
}
criterion_main!(benches);
