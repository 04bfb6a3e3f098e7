//! HNSW on real attention keys: the committed subset `data/smollm2-8k-subset` (SmolLM2-135M,
//! layers 9 and 23, KV head 0, 8,128 keys, 64 decode keys as K→K queries).
//!
//! Checks what the baseline is for: in-distribution (K→K) queries find their top-100 with a
//! small part of the keys on the L2-reduced graph, every key stays reachable there, and plain
//! inner-product HNSW strands keys (no incoming level-0 edge), as hnswlib and faiss do.

use qkindex::dump::{Dump, Part};
use qkindex::{AnnIndex, FlatIndex, HnswIndex, HnswParams, KeyStore, SearchParams};
use std::path::Path;
use std::sync::Arc;

#[path = "../../tests/support/skip.rs"]
mod skip;

const K: usize = 100;
// Measured at ef = 128 (M 16, ef_construction 200): layer 9 L2 reduction recall 0.9505 at
// 0.1107 scanned, inner product 0.9888 at 0.1582 with 72 keys stranded; layer 23 L2 reduction
// 0.9823 at 0.0742, inner product 0.9938 at 0.0917 with 564 stranded.

/// Mean recall@K and scanned fraction at `ef` over the K→K queries.
fn measure(
    index: &HnswIndex,
    flat: &FlatIndex,
    queries: &[f32],
    dim: usize,
    ef: usize,
) -> (f64, f64) {
    let mut s = index.new_scratch();
    let (mut recall, mut dc, mut m) = (0.0, 0u64, 0usize);
    for q in queries.chunks_exact(dim) {
        let got = index
            .search(q, K, &SearchParams::with_ef(ef), &mut s)
            .expect("search");
        let want = flat
            .search(q, K, &SearchParams::default(), &mut s)
            .expect("flat");
        recall += qkindex::eval::recall(&got.ids, &want.ids);
        dc += got.stats.distance_computations;
        m += 1;
    }
    (recall / m as f64, dc as f64 / m as f64 / index.len() as f64)
}

#[test]
fn hnsw_on_real_keys() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/smollm2-8k-subset");
    if !dir.join("manifest.json").is_file() {
        skip::skip_unless_ci(&format!("{} not found", dir.display()));
        return;
    }
    let dump = Dump::open(&dir).expect("dump");
    let dim = dump.manifest.head_dim;
    for layer in [9, 23] {
        let keys = dump.read(layer, Part::K).expect("keys");
        let kdec = dump.read(layer, Part::KDec).expect("kdec");
        let store = Arc::new(KeyStore::from_f32(keys.head(0).to_vec(), dim).expect("store"));
        let flat = FlatIndex::new(store.clone());
        let l2 = HnswIndex::build(store.clone(), &HnswParams::default()).expect("build");
        let ip = HnswIndex::build(store.clone(), &HnswParams::inner_product()).expect("build ip");
        let (r_l2, sc_l2) = measure(&l2, &flat, kdec.head(0), dim, 128);
        let (r_ip, sc_ip) = measure(&ip, &flat, kdec.head(0), dim, 128);
        let (s2, si) = (l2.build_stats(), ip.build_stats());
        println!(
            "layer {layer}: l2 reduction recall@{K} {r_l2:.4} scanned {sc_l2:.4} (stranded {}, unreachable {}); inner product recall {r_ip:.4} scanned {sc_ip:.4} (stranded {}, unreachable {})",
            s2.stranded, s2.unreachable, si.stranded, si.unreachable
        );
        assert_eq!(
            s2.unreachable, 0,
            "layer {layer}: L2-reduced graph loses keys"
        );
        assert!(
            si.stranded > 0,
            "layer {layer}: inner-product HNSW strands no key"
        );
        assert!(r_l2 >= 0.93, "layer {layer}: K→K recall {r_l2}");
        assert!(sc_l2 <= 0.15, "layer {layer}: K→K scanned {sc_l2}");
    }
}
