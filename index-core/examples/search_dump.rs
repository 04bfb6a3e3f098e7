//! Builds an `AttentionIndex` for one query head of a dump and searches its decode queries.
//!
//! ```text
//! cargo run --release -p qkindex --example search_dump -- data/smollm2-8k-subset 9 0
//! ```
//! Arguments: dump directory, layer, query head (defaults: the bundled subset, its first layer,
//! head 0).

use qkindex::dump::{Dump, HeadInputs};
use qkindex::{eval, AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, SearchParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| "data/smollm2-8k-subset".to_string());
    let dump = Dump::open(&dir)?;
    let m = &dump.manifest;
    let layer = match args.next() {
        Some(s) => s.parse()?,
        None => m.layers[0],
    };
    let head: usize = match args.next() {
        Some(s) => s.parse()?,
        None => 0,
    };
    let d = m.head_dim;
    // The keys of the KV head, shared (Arc) by every index of its query heads, and the
    // training queries: the prefill queries of all query heads that read this KV head.
    let HeadInputs {
        keys,
        train,
        decode,
    } = dump.head_inputs(layer, head)?;
    let n_decode = decode.len() / d;
    let index = AttentionIndex::build(keys.clone(), &train, &AttentionParams::default(), &CpuKnn)?;
    let s = index.build_stats();
    println!(
        "layer {layer} head {head}: {} keys, built from {} training queries in {:.2}s (knn {:.2}s)",
        keys.len(),
        s.train_queries,
        s.total_s,
        s.knn_s
    );

    let flat = FlatIndex::new(keys);
    let mut scratch = index.new_scratch();
    for ef in [128, 256, 512] {
        let (mut recall, mut scanned) = (0.0, 0.0);
        for query in decode.chunks_exact(d) {
            let found = index.search(query, 100, &SearchParams::with_ef(ef), &mut scratch)?;
            let exact = flat.search(query, 100, &SearchParams::default(), &mut scratch)?;
            recall += eval::recall(&found.ids, &exact.ids);
            scanned += found.stats.distance_computations as f64 / index.len() as f64;
        }
        let nq = n_decode as f64;
        let us = micros_per_query(&index, &decode[..], d, &SearchParams::with_ef(ef))?;
        let flat_us = micros_per_query(&flat, &decode[..], d, &SearchParams::default())?;
        println!(
            "ef {ef:>4}: recall@100 {:.3}, scanned {:.3}, {us:.1} µs/query (flat scan {flat_us:.1} µs/query)",
            recall / nq,
            scanned / nq
        );
    }
    Ok(())
}

/// Mean single-thread search time (thread CPU time) over 20 passes of `queries`.
fn micros_per_query(
    index: &dyn AnnIndex,
    queries: &[f32],
    d: usize,
    params: &SearchParams,
) -> Result<f64, qkindex::Error> {
    let mut scratch = index.new_scratch();
    let mut out = qkindex::SearchOutput::default();
    let passes = 20;
    let t = thread_cpu_seconds();
    for _ in 0..passes {
        for query in queries.chunks_exact(d) {
            index.search_into(query, 100, params, &mut scratch, &mut out)?;
        }
    }
    Ok((thread_cpu_seconds() - t) * 1e6 / (passes * queries.len() / d) as f64)
}

/// CPU time of the calling thread (immune to time spent descheduled on a busy machine).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
