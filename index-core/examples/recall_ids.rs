//! Recall and the exact ids found, per index kind, for one query head of a dump: the check that
//! two machines (x86 and aarch64 under emulation, `scripts/arm64.sh`) build and search alike.
//!
//! ```text
//! cargo run --release -p qkindex --example recall_ids -- data/smollm2-8k-subset 9 0 flat,hnsw,vamana,ivf,attention
//! ```
//! Arguments: dump directory, layer, query head, comma-separated [`IndexSpec`]s (defaults: the
//! bundled subset, its first layer, head 0, the five kinds above). Every build is seeded by the
//! spec's defaults. Prints one line per spec: the spec, recall@100 at ef 128 over the decode
//! queries, and an xxh3 hash of every id and score bit found, in order, so that two runs give
//! the same hash exactly when every query returned the same ids with the same scores.

use qkindex::dump::{Dump, HeadInputs};
use qkindex::{eval, AnnIndex, CpuKnn, FlatIndex, IndexSpec, SearchParams};

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
    let specs: Vec<IndexSpec> = args
        .next()
        .unwrap_or_else(|| "flat,hnsw,vamana,ivf,attention".to_string())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let d = m.head_dim;
    let HeadInputs {
        keys,
        train,
        decode,
    } = dump.head_inputs(layer, head)?;
    let n_decode = decode.len() / d;
    println!(
        "kernels {}, layer {layer} head {head}: {} keys, {} decode queries",
        qkindex::metric::kernels().isa,
        keys.len(),
        n_decode
    );

    let flat = FlatIndex::new(keys.clone());
    let params = SearchParams::with_ef(128);
    for spec in &specs {
        let index = spec.build(keys.clone(), &train, &CpuKnn)?;
        let mut scratch = index.new_scratch();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut recall = 0.0;
        for query in decode.chunks_exact(d) {
            let found = index.search(query, 100, &params, &mut scratch)?;
            let exact = flat.search(query, 100, &SearchParams::default(), &mut scratch)?;
            recall += eval::recall(&found.ids, &exact.ids);
            for (&id, &score) in found.ids.iter().zip(&found.scores) {
                hasher.update(&id.to_le_bytes());
                hasher.update(&score.to_bits().to_le_bytes());
            }
        }
        println!(
            "{spec}: recall@100 {:.4}, ids+scores xxh3 {:016x}",
            recall / n_decode as f64,
            hasher.digest()
        );
    }
    Ok(())
}
