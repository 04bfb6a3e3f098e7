//! Times a decode step's int8 scans searched per query against the same scans searched as
//! blocks (`AnnIndex::search_rows`: one pass over a KV head's codes for its query heads), in one
//! binary and interleaved: `groups` indexes of `n` keys of dimension `d` (`flat:codes=i8`, the
//! structure the decode default keeps where the scan check measures it faster than the graph),
//! each searched by `heads` queries per step through `search_many_into`, as
//! `index-topk` searches a layer's KV heads one after another.
//!
//! ```text
//! cargo run --release -p qkindex --example scan_rows -- 56 32768 128 6 15
//! ```
//! Arguments: KV heads (all layers' groups), keys per head, dimension, query heads per KV head,
//! repetitions (defaults: Qwen2.5-1.5B's 56 groups of 6 at 32K keys, 15). Keys and queries
//! are the synthetic OOD generator's. Prints the median milliseconds per step of each path,
//! their ratio, and checks that both return the same ids.

use qkindex::search::{IndexKind, SearchOutput};
use qkindex::{
    search_many_into, AnnIndex, CpuKnn, IndexSpec, KeyStore, ManyOutput, ManyScratch, Scratch,
    SearchParams,
};
use std::sync::Arc;
use std::time::Instant;

/// An index searched one query at a time: it forwards `search_seeded` only, so
/// `search_many_into` makes one task per query (the path before `search_rows`).
struct PerQuery<'a>(&'a dyn AnnIndex);

impl AnnIndex for PerQuery<'_> {
    fn kind(&self) -> IndexKind {
        self.0.kind()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn dim(&self) -> usize {
        self.0.dim()
    }
    fn memory_bytes(&self) -> usize {
        self.0.memory_bytes()
    }
    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> qkindex::Result<()> {
        self.0.search_seeded(query, k, params, seeds, scratch, out)
    }
}

fn arg(args: &[String], i: usize, default: usize) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(match args.get(i) {
        Some(s) => s.parse()?,
        None => default,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let groups = arg(&args, 0, 56)?;
    let n = arg(&args, 1, 32_768)?;
    let d = arg(&args, 2, 128)?;
    let heads = arg(&args, 3, 6)?;
    let reps = arg(&args, 4, 15)?.max(1);
    let spec: IndexSpec = "flat:codes=i8".parse()?;
    let mut indexes = Vec::with_capacity(groups);
    let mut queries = Vec::with_capacity(groups);
    for g in 0..groups {
        let data = qkindex::synth::ood(n, heads, d, 1000 + g as u64);
        let keys = Arc::new(KeyStore::from_f32(data.keys, d)?);
        indexes.push(spec.build(keys, &[], &CpuKnn)?);
        queries.push(data.test_queries);
    }
    let batched = indexes.first().is_some_and(|i| i.batches());
    println!(
        "{groups} KV heads of {n} keys, d {d}, {heads} query heads each; the scan batches on this \
         CPU: {batched}; {} threads",
        rayon::current_num_threads()
    );
    let (k, params, scratch) = (100, SearchParams::default(), ManyScratch::default());
    let mut outs: Vec<Vec<ManyOutput>> = vec![Vec::new(); groups];
    let step = |per_query: bool, outs: &mut [Vec<ManyOutput>]| -> qkindex::Result<f64> {
        let t = Instant::now();
        for ((index, block), out) in indexes.iter().zip(&queries).zip(outs.iter_mut()) {
            let wrapped = PerQuery(index);
            let index: &dyn AnnIndex = if per_query { &wrapped } else { index };
            search_many_into(
                &[index],
                &[&block[..]],
                &qkindex::many::no_seeds,
                k,
                &|_, _| params,
                &scratch,
                out,
            )?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    let mut check = vec![Vec::new(); groups];
    step(true, &mut check)?;
    step(false, &mut outs)?;
    let same = check.iter().zip(&outs).all(|(a, b)| {
        a[0].outputs
            .iter()
            .zip(&b[0].outputs)
            .all(|(x, y)| x.ids == y.ids)
    });
    let (mut one, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        one.push(step(true, &mut check)?);
        rows.push(step(false, &mut outs)?);
    }
    let (one, rows) = (median(one), median(rows));
    println!(
        "ms per step (median of {reps}): per query {one:.2}, as blocks {rows:.2}: {:.2}x; same ids: {same}",
        one / rows
    );
    Ok(())
}
