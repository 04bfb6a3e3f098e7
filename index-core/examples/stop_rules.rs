//! The decode-time stop rules of a graph search, on a dump's decode queries: for every query
//! head, the index the decode default builds from its GQA group's prefill queries (causal
//! lists, `auto-ef`), then its decode queries searched on a grid of `ef` (the cap) × patience
//! (stop once the best 100 have not changed for that many expansions) × seeds (the ids the same
//! head's previous decode query found, as extra entry points). Per head and setting: mean
//! recall@100 against the exact top-100 and mean inner products per search. Prints one CSV row
//! per (head, setting) on stdout; `scripts/stop_rules.py` summarises.
//!
//! ```text
//! cargo run --release -p qkindex --example stop_rules -- ../shared/data/smollm2-public-8k > rows.csv
//! ```
//! Arguments: dump directory, and optionally layers (comma-separated; default all), the spec
//! to build (default: the decode default), and the number of decode queries per head (default
//! all).

use qkindex::dump::{Dump, HeadInputs};
use qkindex::{eval, AnnIndex, Cancel, CpuKnn, FlatIndex, IndexSpec, SearchOutput, SearchParams};

/// `(ef, beam width)`: widths below k = 100 walk like a list of that many (the bench's settings
/// below `ef = k`), then the list sizes.
const EFS: [(usize, Option<usize>); 15] = [
    (100, Some(40)),
    (100, Some(60)),
    (100, Some(80)),
    (100, None),
    (128, None),
    (160, None),
    (200, None),
    (256, None),
    (320, None),
    (400, None),
    (512, None),
    (640, None),
    (800, None),
    (1024, None),
    (1400, None),
];
const PATIENCE: [Option<usize>; 7] = [
    None,
    Some(4),
    Some(8),
    Some(16),
    Some(32),
    Some(64),
    Some(128),
];
const SEEDS: [usize; 3] = [0, 16, 100];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dump = Dump::open(
        args.first()
            .map_or("data/smollm2-8k-subset", String::as_str),
    )?;
    let m = dump.manifest.clone();
    let layers: Vec<usize> = match args.get(1) {
        Some(s) if s != "all" => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        _ => m.layers.clone(),
    };
    let spec: IndexSpec = match args.get(2) {
        Some(s) if s != "default" => s.parse()?,
        _ => IndexSpec::decode_default(),
    };
    let max_queries: usize = args.get(3).map_or(Ok(usize::MAX), |s| s.parse())?;
    let d = m.head_dim;
    let group = m.n_q_heads / m.n_kv_heads;
    eprintln!("{}: layers {layers:?}, spec {spec}", m.model);
    println!("layer,head,ef,beam,patience,seeds,recall,dist,n");
    for &layer in &layers {
        for kv in 0..m.n_kv_heads {
            let first = kv * group;
            let HeadInputs { keys, train, .. } = dump.head_inputs(layer, first)?;
            let n = keys.len();
            let p = train.len() / d / group;
            let visible: Vec<u32> = (0..group)
                .flat_map(|_| (0..p).map(|t| (t + 1).min(n) as u32))
                .collect();
            let built = spec.build_visible(
                keys.clone(),
                &train,
                Some(&visible),
                &CpuKnn,
                &Cancel::new(),
            )?;
            let index = built.index;
            if let Some(c) = built.replaced_graph.and_then(|g| g.scan_check) {
                eprintln!("layer {layer} kv {kv}: {c}");
            }
            if let Some(a) = index.as_attention() {
                if let Some(c) = &a.build_stats().scan_check {
                    eprintln!("layer {layer} kv {kv}: {c}");
                }
                eprintln!(
                    "layer {layer} kv {kv}: {n} keys, build {:.1} s, head ef {:?}",
                    a.build_stats().total_s,
                    a.params().head_ef
                );
            }
            let flat = FlatIndex::new(keys.clone());
            let mut scratch = index.new_scratch();
            for j in 0..group {
                let head = first + j;
                let HeadInputs { decode, .. } = dump.head_inputs(layer, head)?;
                let queries: Vec<&[f32]> = decode.chunks_exact(d).take(max_queries).collect();
                let exact: Vec<Vec<u32>> = queries
                    .iter()
                    .map(|q| {
                        flat.search(q, 100, &SearchParams::default(), &mut scratch)
                            .map(|o| o.ids)
                    })
                    .collect::<Result<_, _>>()?;
                let mut out = SearchOutput::default();
                let mut prev: Vec<u32> = Vec::new();
                for &(ef, beam) in &EFS {
                    for &patience in &PATIENCE {
                        for &seeds in &SEEDS {
                            let params = SearchParams {
                                ef: Some(ef),
                                beam,
                                patience: patience.map(qkindex::Patience::Expansions),
                                head: Some(j),
                                ..Default::default()
                            };
                            let (mut recall, mut dist) = (0.0, 0u64);
                            prev.clear();
                            for (q, want) in queries.iter().zip(&exact) {
                                let s = &prev[..prev.len().min(seeds)];
                                index.search_seeded(q, 100, &params, s, &mut scratch, &mut out)?;
                                recall += eval::recall(&out.ids, want);
                                dist += out.stats.distance_computations;
                                prev.clone_from(&out.ids);
                            }
                            let nq = queries.len() as f64;
                            println!(
                                "{layer},{head},{ef},{},{},{seeds},{:.5},{:.1},{n}",
                                beam.unwrap_or(ef),
                                patience.map_or(0, |p| p),
                                recall / nq,
                                dist as f64 / nq
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
