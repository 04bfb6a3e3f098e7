//! `qkindex bench`: recall benchmark of index kinds on a dump (docs/DESIGN.md §4, §5).
//!
//! Per (layer, query head): build each index kind from the head's prefill queries (pooled over
//! its GQA group by default) and its KV head's keys, search every decode query (q2k) and every
//! decode/held-out key (k2k) over the parameter sweep, single-threaded, and compare with the
//! exact top-k. Writes `bench.json`, `bench.csv` and `report.md` into `--out`.

mod cache;
pub(crate) mod kinds;

use crate::report::{self, BenchReport, Row};
use crate::training::DumpInput;
use anyhow::{bail, Context, Result};
use clap::Args;
use kinds::Built;
use qkindex::dump::Part;
use qkindex::eval;
use qkindex::{AnnIndex, FlatIndex, KeyStore, SearchOutput, SearchParams};
use qkindex_driver::devices::Devices;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub input: DumpInput,
    /// Index specs, comma-separated: a kind and its build parameters (`attention`,
    /// `attention:prune=top,kq=200`, `roargraph-recipe`, `key-graph`, `hnsw`, `hnsw-ip:m=32`,
    /// `flat`, `ivf`, `ivf-ip`, `ivf:nlist=256`, `vamana`, `robust-vamana`, ...; a `key=value`
    /// item belongs to the spec before it), or `all` (attention, roargraph-recipe, hnsw,
    /// hnsw-ip, flat, ivf, vamana, robust-vamana).
    #[arg(long, default_value = "all")]
    pub kinds: Vec<String>,
    /// Neighbours per query (recall@k); a list measures each (e.g. 10,100,1000).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    pub k: Vec<usize>,
    /// Query sets: q2k (decode queries), k2k (decode or held-out keys as queries).
    #[arg(long, value_delimiter = ',', default_value = "q2k,k2k")]
    pub queries: Vec<String>,
    /// `ef` sweep of graph indexes (for k = 100; scaled by k / 100 for other k). Values below k
    /// search a list of k with that beam width (only the best `value` items are expanded).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,72,80,90,100,110,120,128,144,160,192,224,256,320,400,512,640,800,1024"
    )]
    pub ef: Vec<usize>,
    /// `nprobe` sweep of IVF indexes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,6,8,12,16,24,32,48,64,96,128"
    )]
    pub nprobe: Vec<usize>,
    /// Measure exactly the `--ef` / `--nprobe` settings. By default each head's sweep is
    /// extended (cheaper settings below the cheapest, costlier above the costliest, about 20 %
    /// a step) until it brackets every recall target of the report (0.90, 0.95, 0.99): a
    /// setting below the target and one reaching it, so that "scanned at recall R" is what R
    /// needs, not the sweep's floor. The report flags the heads where it could not.
    #[arg(long)]
    pub no_bracket: bool,
    /// Bracket only the report's recall targets up to this one (0.90, 0.95 or 0.99, the
    /// default): at 128K a hard head's sweep can spend hours widening `ef` towards 0.99 when
    /// the question is 0.95. The report's higher targets are then what the grid reached.
    #[arg(long, default_value_t = 0.99)]
    pub bracket_up_to: f64,
    /// Timed passes over each query set (QPS from the median pass).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Passes after the QPS passes until at least this many single searches are timed one by
    /// one (for p50/p99 latency; 0: none).
    #[arg(long, default_value_t = 1000)]
    pub latency_samples: usize,
    /// Scanned budget of the per-layer and Q→K/K→K gap plots (fraction of keys).
    #[arg(long, default_value_t = 0.10)]
    pub budget: f64,
    /// Element type of the stored keys every kind searches (f16, f32, or i8: int8 codes
    /// normalised per dimension, one scale per key); the exact top-k is always computed on the dump's f32 keys.
    #[arg(long, default_value_t = qkindex::Dtype::F16)]
    pub store: qkindex::Dtype,
    /// Output directory.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Clock of QPS and latencies: wall (elapsed time) or thread-cpu (CPU time of the searching
    /// thread: steadier on a shared machine, as time spent descheduled does not count).
    #[arg(long, value_enum, default_value_t = ClockKind::Wall)]
    pub clock: ClockKind,
    /// Keep built indexes in this directory and reuse them in later runs with the same dump,
    /// heads, kinds and build parameters (index files plus JSON side files). Searches then run
    /// on the files read into huge pages (`LoadOptions::resident`); without a cache they run
    /// on the indexes as built.
    #[arg(long)]
    pub cache: Option<PathBuf>,
}

/// Settings a head's sweep may add, per index, k and query set, to bracket the recall targets
/// (beyond what the kinds' own limits allow: the steps are about 20 %, so this is a factor of
/// more than 10^4 either way from the grid's ends).
const MAX_EXTENSIONS: usize = 48;

/// One query set of a head: row-major queries and their exact top-k.
struct QuerySet {
    name: &'static str,
    queries: Vec<f32>,
    exact: Vec<SearchOutput>,
    /// Softmax weights of each query over all keys (for mass and output cosine).
    weights: Vec<Vec<f64>>,
}

pub fn run(args: BenchArgs, devices: &Devices) -> Result<()> {
    let targets: Vec<f64> = report::TARGETS
        .into_iter()
        .filter(|&t| t <= args.bracket_up_to + 1e-9)
        .collect();
    if targets.is_empty() || args.bracket_up_to > 1.0 {
        bail!(
            "--bracket-up-to {} is below every recall target of the report ({:?}) or above 1",
            args.bracket_up_to,
            report::TARGETS
        );
    }
    let (dump, layers, heads) = args.input.open()?;
    let m = dump.manifest.clone();
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if args.k.is_empty() || args.k.contains(&0) {
        bail!("--k needs values of at least 1");
    }
    let k_max = args.k.iter().copied().max().unwrap_or(1);
    let kinds = kinds::expand(&args.kinds)?;
    for q in &args.queries {
        if q != "q2k" && q != "k2k" {
            bail!("unknown query set {q:?} (expected q2k or k2k)");
        }
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let d = m.head_dim;
    let group = m.n_q_heads / m.n_kv_heads;
    let mut rows: Vec<Row> = Vec::new();
    let started = Instant::now();
    let mut n_keys = None;

    // Pooled training queries are the whole GQA group's, so every query head of a group gets
    // the same index: build it once per (layer, KV head, spec) and search it with each head's
    // queries (its rows carry the one build's times).
    let pooled = !args.input.no_pool && group > 1;
    for &layer in &layers {
        let mut built_for: HashMap<(usize, usize), Built> = HashMap::new();
        let q_all = dump.read(layer, Part::Q)?;
        let k_all = dump.read(layer, Part::K)?;
        let qdec = dump.read(layer, Part::QDec)?;
        let kdec = if dump.has(layer, Part::KDec) {
            Some(dump.read(layer, Part::KDec)?)
        } else {
            None
        };
        let v_all = if dump.has(layer, Part::V) {
            Some(dump.read(layer, Part::V)?)
        } else {
            None
        };
        for &h in &heads {
            let kv = m.kv_head_of(h);
            let keys_f32 = k_all.head(kv);
            let keys = Arc::new(KeyStore::from_f32_as(keys_f32.to_vec(), d, args.store)?);
            let n = keys.len();
            n_keys = Some(n);
            if k_max > n {
                bail!("--k {k_max} is larger than the number of keys ({n})");
            }
            let train = args.input.training_queries(&q_all, h, kv, group);
            // The truth of every store type: the dump's keys in f32 (so that f16 and int8 runs
            // are scored against the same top-k).
            let flat = FlatIndex::new(Arc::new(KeyStore::from_f32(keys_f32.to_vec(), d)?));
            let values = v_all.as_ref().map(|v| v.head(kv));
            let mut sets = Vec::new();
            for name in &args.queries {
                let queries = match name.as_str() {
                    "q2k" => qdec.head(h).to_vec(),
                    _ => match &kdec {
                        Some(kd) => kd.head(kv).to_vec(),
                        None => continue,
                    },
                };
                sets.push(exact_set(
                    if name == "q2k" { "q2k" } else { "k2k" },
                    queries,
                    &flat,
                    keys_f32,
                    d,
                    k_max,
                )?);
            }
            let input = kinds::HeadInput {
                keys: &keys,
                train: &train.rows,
                visible: &train.visible,
                layer,
                head: h,
            };
            for (s, spec) in kinds.iter().enumerate() {
                let slot = (if pooled { kv } else { h }, s);
                let built = match built_for.entry(slot) {
                    Entry::Occupied(e) => {
                        eprintln!(
                            "layer {layer} head {h} {spec}: the index of KV head {kv} (pooled queries), built once for its group"
                        );
                        e.into_mut()
                    }
                    Entry::Vacant(e) => e.insert(build_or_load(&args, spec, &input, n, devices)?),
                };
                let bytes_per_key = built.index.memory_bytes() as f64 / n as f64;
                for (&k, set) in args.k.iter().flat_map(|k| sets.iter().map(move |s| (k, s))) {
                    // Popped from the end: the grid's settings in their order, then extensions.
                    let mut todo = built.sweep.params(&args, k);
                    todo.reverse();
                    let mut measured: Vec<(SearchParams, f64)> = Vec::new();
                    let mut extensions = 0;
                    while let Some(params) = todo.pop() {
                        // A pooled index knows its query heads by their place in the group
                        // (per-head `ef`, per-head routes to the int8 scan): name it.
                        let params = SearchParams {
                            head: pooled.then_some(h % group),
                            ..params
                        };
                        let mut row =
                            measure(built.index.as_dyn(), set, &params, k, &args, values, d)?;
                        row.bytes_per_key = Some(bytes_per_key);
                        row.index = built.index_name.clone();
                        row.variant = built.variant.clone();
                        row.layer = layer;
                        row.head = h;
                        row.build_s = built.build_s.clone();
                        eprintln!(
                            "  {:<10} {:<17} L{layer:02} h{h} {} k={k:<4} {:<12} recall {:.4} scanned {:.4} qps {:>9.0}",
                            row.index, row.variant, row.queries, report::params_str(&row.params), row.recall, row.scanned.unwrap_or(f64::NAN), row.qps
                        );
                        measured.push((params, row.recall));
                        rows.push(row);
                        if todo.is_empty() && !args.no_bracket && extensions < MAX_EXTENSIONS {
                            todo = built.sweep.extend(&measured, &targets, k, n);
                            extensions += todo.len();
                            for p in &todo {
                                let p = report::params_str(&report::params_json(p));
                                eprintln!("  L{layer:02} h{h} {} k={k}: bracketing the recall targets, adding {p}", set.name);
                            }
                        }
                    }
                }
                if !pooled {
                    built_for.remove(&slot);
                }
            }
        }
    }
    let clock = match args.clock {
        ClockKind::Wall => "wall",
        ClockKind::ThreadCpu => "thread-cpu",
    };
    let mut report = BenchReport::new(
        &args.input.dump,
        args.k[0],
        clock,
        rows,
        started.elapsed().as_secs_f64(),
    );
    report.head_dim = Some(d);
    report.n_keys = n_keys;
    report.write(&args.out, args.budget)?;
    report::print_summary(&report);
    eprintln!(
        "wrote {}/bench.json, bench.csv, report.md, plots/ in {:.1}s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The index `spec` over one head's keys: from the `--cache` entry when one loads, else built
/// (and stored there, then measured as reloaded).
fn build_or_load(
    args: &BenchArgs,
    spec: &qkindex::IndexSpec,
    input: &kinds::HeadInput<'_>,
    n: usize,
    devices: &Devices,
) -> Result<Built> {
    let (layer, h) = (input.layer, input.head);
    let entry = args
        .cache
        .as_deref()
        .map(|dir| cache::Entry::new(dir, args, spec, layer, h, n));
    if let Some(built) = entry.as_ref().and_then(cache::Entry::load) {
        eprintln!("layer {layer} head {h} {spec}: loaded from the build cache");
        return Ok(built);
    }
    let built = kinds::build(spec, input, devices.knn())?;
    Ok(match &entry {
        Some(entry) => {
            entry.store(&built)?;
            entry.load().unwrap_or(built)
        }
        None => built,
    })
}

fn exact_set(
    name: &'static str,
    queries: Vec<f32>,
    flat: &FlatIndex,
    keys: &[f32],
    d: usize,
    k: usize,
) -> Result<QuerySet> {
    let mut scratch = flat.new_scratch();
    let mut exact = Vec::new();
    let mut weights = Vec::new();
    for q in queries.chunks_exact(d) {
        exact.push(flat.search(q, k, &SearchParams::default(), &mut scratch)?);
        weights.push(eval::softmax_weights(q, keys, d));
    }
    Ok(QuerySet {
        name,
        queries,
        exact,
        weights,
    })
}

#[allow(clippy::too_many_arguments)]
fn measure(
    index: &dyn AnnIndex,
    set: &QuerySet,
    params: &SearchParams,
    k: usize,
    args: &BenchArgs,
    values: Option<&[f32]>,
    d: usize,
) -> Result<Row> {
    let nq = set.exact.len();
    let mut scratch = index.new_scratch();
    let mut outs: Vec<SearchOutput> = vec![SearchOutput::default(); nq];
    // QPS passes read the clock once per pass: a read of the thread CPU clock is a system call
    // (0.6 µs on the virtual machines here), which per query would weigh on the fastest
    // indexes most. Latency passes, after them, time every search.
    let clock = Clock(args.clock);
    let mut pass_times = Vec::with_capacity(args.repeat);
    for _ in 0..args.repeat {
        let pass = clock.now();
        for (q, out) in set.queries.chunks_exact(d).zip(outs.iter_mut()) {
            index.search_into(q, k, params, &mut scratch, out)?;
        }
        pass_times.push(clock.since(pass));
    }
    let latency_passes = args.latency_samples.div_ceil(nq.max(1));
    let mut latencies = Vec::with_capacity(latency_passes * nq);
    for _ in 0..latency_passes {
        for (q, out) in set.queries.chunks_exact(d).zip(outs.iter_mut()) {
            let t = clock.now();
            index.search_into(q, k, params, &mut scratch, out)?;
            latencies.push(clock.since(t) * 1e6);
        }
    }
    let n = index.len() as f64;
    let (mut recall, mut dc, mut mass_ratio, mut cosine) = (0.0, 0.0, 0.0, 0.0);
    let mut estimates = 0.0;
    for ((out, exact), w) in outs.iter().zip(&set.exact).zip(&set.weights) {
        // The exact lists hold the largest k of the run; their first k are the exact top-k.
        let exact = &exact.ids[..k.min(exact.ids.len())];
        recall += eval::recall(&out.ids, exact);
        dc += out.stats.distance_computations as f64;
        estimates += out.stats.code_estimates as f64;
        mass_ratio += eval::mass(w, &out.ids) / eval::mass(w, exact);
        if let Some(v) = values {
            cosine += eval::output_cosine(w, &out.ids, v, d);
        }
    }
    let nqf = nq as f64;
    Ok(Row {
        index: String::new(),
        variant: String::new(),
        implementation: "qkindex".into(),
        k,
        layer: 0,
        head: 0,
        queries: set.name.into(),
        params: report::params_json(params),
        recall: recall / nqf,
        scanned: Some(dc / nqf / n),
        distance_computations: Some(dc / nqf),
        code_estimates: (estimates > 0.0).then(|| estimates / nqf),
        qps: nqf / report::median(&mut pass_times),
        latency_us: report::percentiles(&mut latencies),
        build_s: serde_json::Value::Null,
        bytes_per_key: None,
        mass_ratio: Some(mass_ratio / nqf),
        output_cosine: values.map(|_| cosine / nqf),
    })
}

/// Which clock times searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockKind {
    Wall,
    ThreadCpu,
}

/// A point in time of either clock.
#[derive(Clone, Copy)]
enum Tick {
    Wall(Instant),
    Cpu(cpu_time::ThreadTime),
}

#[derive(Clone, Copy)]
struct Clock(ClockKind);

impl Clock {
    fn now(self) -> Tick {
        match self.0 {
            ClockKind::Wall => Tick::Wall(Instant::now()),
            ClockKind::ThreadCpu => Tick::Cpu(cpu_time::ThreadTime::now()),
        }
    }

    /// Seconds since `t`.
    fn since(self, t: Tick) -> f64 {
        match t {
            Tick::Wall(i) => i.elapsed().as_secs_f64(),
            Tick::Cpu(c) => c.elapsed().as_secs_f64(),
        }
    }
}
