//! Times `search_many` over every query head of one layer of a dump, on 1 and on 2 threads
//! (issue 45): one `AttentionIndex` per KV head, searched by each query head of its group with
//! that head's decode queries, as a decode step searches a layer.
//!
//! ```text
//! cargo run --release -p qkindex --example search_many -- data/smollm2-8k-subset 9 15
//! ```
//! Arguments: dump directory, layer, repetitions (defaults: the bundled subset, its first layer,
//! 15). Two shapes are timed: one decode step per call (`b = 1`: one search per query head),
//! and every decode step of the dump per call (`b` = its decode steps). Calls on 1 and 2
//! threads alternate, so that both see the same load; the medians and their ratio are printed.

use qkindex::dump::{Dump, HeadInputs};
use qkindex::{
    search_many_into, AnnIndex, AttentionIndex, AttentionParams, CpuKnn, ManyOutput, ManyScratch,
    SearchParams,
};
use std::time::Instant;

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
    let reps: usize = match args.next() {
        Some(s) => s.parse()?,
        None => 15,
    };
    let (d, group) = (m.head_dim, m.n_q_heads / m.n_kv_heads);
    // One index per KV head (built from its group's prefill queries), each query head's
    // decode queries.
    let mut kv_indexes = Vec::new();
    let mut decode = Vec::new();
    for kv in 0..m.n_kv_heads {
        let HeadInputs { keys, train, .. } = dump.head_inputs(layer, kv * group)?;
        let index = AttentionIndex::build(keys, &train, &AttentionParams::default(), &CpuKnn)?;
        println!(
            "layer {layer} KV head {kv}: {} keys, built in {:.2}s",
            index.len(),
            index.build_stats().total_s
        );
        kv_indexes.push(index);
        for h in kv * group..(kv + 1) * group {
            decode.push(dump.head_inputs(layer, h)?.decode);
        }
    }
    let indexes: Vec<&dyn AnnIndex> = (0..m.n_q_heads)
        .map(|h| &kv_indexes[h / group] as &dyn AnnIndex)
        .collect();
    let steps = decode[0].len() / d;
    let (k, params) = (100, SearchParams::default());
    let pools = [
        rayon::ThreadPoolBuilder::new().num_threads(1).build()?,
        rayon::ThreadPoolBuilder::new().num_threads(2).build()?,
    ];
    println!(
        "{} query heads, {} searches per step, k = {k}, default ef; {reps} repetitions",
        m.n_q_heads,
        indexes.len()
    );
    for b in [1, steps] {
        let calls = steps / b;
        let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut results: [Vec<Vec<ManyOutput>>; 2] = [Vec::new(), Vec::new()];
        let scratch = ManyScratch::default();
        for rep in 0..reps {
            for c in 0..calls {
                let queries: Vec<&[f32]> =
                    decode.iter().map(|q| &q[c * b * d..][..b * d]).collect();
                for (slot, pool) in pools.iter().enumerate() {
                    let mut outs = Vec::new();
                    let t = Instant::now();
                    pool.install(|| {
                        search_many_into(
                            &indexes,
                            &queries,
                            &qkindex::many::no_seeds,
                            k,
                            &|_, _| params,
                            &scratch,
                            &mut outs,
                        )
                    })?;
                    times[slot].push(t.elapsed().as_secs_f64() * 1e3);
                    if rep == 0 {
                        results[slot].push(outs);
                    }
                }
            }
        }
        if results[0] != results[1] {
            return Err("1 and 2 threads gave different results".into());
        }
        let [one, two] = times.map(median);
        println!(
            "b = {b:>2} ({} searches per call): 1 thread {one:.3} ms/call, 2 threads {two:.3} \
             ms/call (medians of {} calls each): {:.2}x",
            indexes.len() * b,
            reps * calls,
            one / two
        );
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
