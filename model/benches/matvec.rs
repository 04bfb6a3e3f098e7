//! The decode step's integer matvecs (`qdot::matvec`) on every weight type of the three model
//! files, each over 256 MiB of weights (more than any cache holds, as in a decode step, which
//! streams all of a model's matrices once), beside a plain read of as many bytes: GiB/s of
//! weights against the memory's own, i.e. how far each kernel is from its bandwidth floor.
//!
//! `cargo bench -p qkindex-model --bench matvec` (both threads, as a decode step uses them).
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qkindex_model::qdot::{self, Q8Act};
use qkindex_model::quant::GgmlType;
use rayon::prelude::*;
use std::hint::black_box;

const BYTES: usize = 256 << 20;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("matvec_256mib");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.sample_size(20);
    // The read floor: both threads summing f32 with independent accumulators.
    let mem: Vec<f32> = (0..BYTES / 4).map(|i| (i % 7) as f32).collect();
    g.bench_function("memory_read", |b| {
        b.iter(|| {
            let s: f32 = mem
                .par_chunks(1 << 16)
                .map(|c| {
                    let mut acc = [0f32; 16];
                    for v in c.chunks_exact(16) {
                        for (a, x) in acc.iter_mut().zip(v) {
                            *a += x;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
                .sum();
            black_box(s)
        })
    });
    drop(mem);
    // (type, columns): the columns of the matrices that hold the type in Gemma 3 270M (640,
    // 2048), SmolLM2-135M (576) and Qwen2.5-1.5B (1536, 8960).
    for (ty, cols) in [
        (GgmlType::Q8_0, 640),
        (GgmlType::Q5_0, 640),
        (GgmlType::Q4K, 2048),
        (GgmlType::Q6K, 2048),
        (GgmlType::Q4_1, 576),
        (GgmlType::Q4K, 1536),
        (GgmlType::Q6K, 1536),
        (GgmlType::Q6K, 8960),
    ] {
        let row_bytes = ty.bytes_for(cols as u64).expect("whole blocks") as usize;
        let rows = BYTES / row_bytes;
        let w = qdot::random_blocks(ty, rows, cols, 7);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let mut a = Q8Act::default();
        a.quantize(&x);
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.bench_function(format!("{ty:?}_x{cols}"), |b| {
            b.iter(|| {
                assert!(qdot::matvec(ty, &w, row_bytes, &a, &mut y));
                black_box(y[0])
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
