//! A/B of the search walks of one `AttentionIndex` graph: the f16 walk, the walk on int8 codes
//! (`codes=i8`) and the walk on codes inline with the adjacency (`codes=i8-inline`), all on the
//! same graph and entry points, timed in interleaved rounds (medians of per-round times, so
//! that the load of a shared machine hits every walk alike).
//!
//! ```text
//! cargo run --release -p qkindex --example walk_ab -- ../shared/data/smollm2-public-8k 16 4 100 15
//! ```
//! Arguments: dump directory, layer, query head, ef, rounds, and optionally the variants to run
//! (comma-separated names: `none`, `i8`, `i8-inline`, `flat:i8`, `flat`).

use qkindex::attention::Codes;
use qkindex::dump::{Dump, HeadInputs};
use qkindex::{
    eval, AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, FlatParams, SearchParams,
};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let dump = Dump::open(arg(0, "data/smollm2-8k-subset"))?;
    let m = &dump.manifest;
    let layer: usize = arg(1, &m.layers[0].to_string()).parse()?;
    let head: usize = arg(2, "0").parse()?;
    let ef: usize = arg(3, "100").parse()?;
    let rounds: usize = arg(4, "15").parse()?;
    let d = m.head_dim;
    let HeadInputs {
        keys,
        train,
        decode,
    } = dump.head_inputs(layer, head)?;
    let base = AttentionIndex::build(keys.clone(), &train, &AttentionParams::default(), &CpuKnn)?;
    let graph = base.graph()?.into_owned();
    let mut variants: Vec<(&str, Box<dyn AnnIndex>)> = [Codes::None, Codes::I8, Codes::I8Inline]
        .into_iter()
        .map(|codes| {
            let params = AttentionParams {
                codes,
                ..base.params().clone()
            };
            let index = AttentionIndex::from_parts(
                keys.clone(),
                graph.clone(),
                base.entries().to_vec(),
                &params,
            )?;
            Ok((codes.name(), Box::new(index) as Box<dyn AnnIndex>))
        })
        .collect::<qkindex::Result<_>>()?;
    let scan = FlatParams {
        codes: Codes::I8,
        rerank: 0,
    };
    variants.push((
        "flat:i8",
        Box::new(FlatIndex::with_params(keys.clone(), &scan)?),
    ));
    variants.push(("flat", Box::new(FlatIndex::new(keys.clone()))));
    if let Some(only) = args.get(5) {
        let only: Vec<&str> = only.split(',').collect();
        variants.retain(|(name, _)| only.contains(name));
    }

    let flat = FlatIndex::new(keys.clone());
    let params = SearchParams::with_ef(ef);
    let queries: Vec<&[f32]> = decode.chunks_exact(d).collect();
    let mut scratch = base.new_scratch();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for (name, index) in &variants {
        let (mut recall, mut stats) = (0.0, qkindex::SearchStats::default());
        for &query in &queries {
            let found = index.search(query, 100, &params, &mut scratch)?;
            let exact = flat.search(query, 100, &SearchParams::default(), &mut scratch)?;
            recall += eval::recall(&found.ids, &exact.ids);
            stats += found.stats;
        }
        let nq = queries.len() as f64;
        println!(
            "{name:>10}: recall@100 {:.4}, hops {:.0}, exact {:.0}, estimates {:.0}, {} bytes/key",
            recall / nq,
            stats.hops as f64 / nq,
            stats.distance_computations as f64 / nq,
            stats.code_estimates as f64 / nq,
            index.memory_bytes() / index.len(),
        );
    }
    for _ in 0..rounds {
        for ((_, index), t) in variants.iter().zip(&mut times) {
            let start = Instant::now();
            for _ in 0..20 {
                for &query in &queries {
                    std::hint::black_box(index.search(query, 100, &params, &mut scratch)?);
                }
            }
            t.push(start.elapsed().as_secs_f64() * 1e6 / (20.0 * queries.len() as f64));
        }
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let first = times.first().map_or(f64::NAN, |t| median(&mut t.clone()));
    for ((name, _), t) in variants.iter().zip(&mut times) {
        let us = median(t);
        println!(
            "{name:>10}: {us:.2} µs/query (median of {rounds} rounds), {:.2}x the first",
            first / us
        );
    }
    Ok(())
}
