//! `qkindex scaling`: how each index's cost at a recall target grows with the number of keys.
//!
//! Input: `bench.json` files of `qkindex bench` runs on synthetic dumps of growing size (one
//! file per (n, d); `benches/scaling.sh` makes them). Per (d, n, index): the fewest keys scanned
//! and the best single-thread QPS reaching mean recall@k ≥ the target, the QPS ratio to the exact
//! scan of the same run, and the build time. Writes `scaling.md`, `scaling.json` and
//! `plots/scaling_*.{png,svg}` into `--out`.

use crate::plots;
use crate::report::{median, BenchReport};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ScalingArgs {
    /// `bench.json` files, one per synthetic dump size.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Recall target.
    #[arg(long, default_value_t = 0.95)]
    pub target: f64,
    /// Neighbours (recall@k) to report.
    #[arg(long, default_value_t = 100)]
    pub k: usize,
    /// Query set.
    #[arg(long, default_value = "q2k")]
    pub queries: String,
}

/// One (d, n, index) point.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub d: usize,
    pub n: usize,
    pub index: String,
    /// Heads (usually one per synthetic dump) reaching the target, of those measured.
    pub reached: String,
    pub min_scanned: Option<f64>,
    pub best_qps: Option<f64>,
    pub qps_over_flat: Option<f64>,
    pub build_s: Option<f64>,
    pub bytes_per_key: Option<f64>,
}

pub fn run(args: ScalingArgs) -> Result<()> {
    let mut points = Vec::new();
    for path in &args.inputs {
        let r = BenchReport::read(path)?;
        let (Some(d), Some(n)) = (r.head_dim, r.n_keys) else {
            bail!(
                "{}: no head_dim / n_keys (not written by `qkindex bench`)",
                path.display()
            );
        };
        let flat: BTreeMap<(usize, usize), f64> = r
            .rows
            .iter()
            .filter(|x| x.index == "flat" && x.k == args.k && x.queries == args.queries)
            .map(|x| ((x.layer, x.head), x.qps))
            .collect();
        let mut by_index: BTreeMap<String, Vec<&crate::report::Summary>> = BTreeMap::new();
        for s in r.summary.iter().filter(|s| {
            s.k == args.k
                && s.queries == args.queries
                && (s.target - args.target).abs() < 1e-9
                && s.implementation == "qkindex"
        }) {
            let label = if s.variant.is_empty() {
                s.index.clone()
            } else {
                format!("{}/{}", s.index, s.variant)
            };
            by_index.entry(label).or_default().push(s);
        }
        if by_index.is_empty() {
            bail!(
                "{}: no summary at k = {}, {} and target {} (run bench with that k and query set)",
                path.display(),
                args.k,
                args.queries,
                args.target
            );
        }
        for (index, ss) in by_index {
            let reached: Vec<_> = ss.iter().filter(|s| s.best_qps.is_some()).collect();
            let med = |mut v: Vec<f64>| (!v.is_empty()).then(|| median(&mut v));
            let rows_of = |s: &crate::report::Summary| {
                r.rows.iter().find(|x| {
                    x.k == s.k
                        && x.index == s.index
                        && x.variant == s.variant
                        && x.layer == s.layer
                        && x.head == s.head
                        && x.queries == s.queries
                })
            };
            points.push(Point {
                d,
                n,
                index,
                reached: format!("{}/{}", reached.len(), ss.len()),
                min_scanned: med(reached
                    .iter()
                    .filter_map(|s| s.min_scanned.as_ref()?.scanned)
                    .collect()),
                best_qps: med(reached
                    .iter()
                    .filter_map(|s| Some(s.best_qps.as_ref()?.qps))
                    .collect()),
                qps_over_flat: med(reached
                    .iter()
                    .filter_map(|s| Some(s.best_qps.as_ref()?.qps / flat.get(&(s.layer, s.head))?))
                    .collect()),
                build_s: med(ss
                    .iter()
                    .filter_map(|s| rows_of(s)?.build_s.get("total")?.as_f64())
                    .collect()),
                bytes_per_key: med(ss
                    .iter()
                    .filter_map(|s| rows_of(s)?.bytes_per_key)
                    .collect()),
            });
        }
    }
    points.sort_by(|a, b| (a.d, &a.index, a.n).cmp(&(b.d, &b.index, b.n)));
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let md = markdown(&points, &args);
    std::fs::write(args.out.join("scaling.md"), &md)?;
    std::fs::write(
        args.out.join("scaling.json"),
        serde_json::to_string_pretty(&points)?,
    )?;
    let files = plots::write_scaling(&points, &args.out, args.target, args.k)?;
    print!("{md}");
    eprintln!(
        "wrote {}/scaling.md, scaling.json and {} plot files",
        args.out.display(),
        files.len()
    );
    Ok(())
}

fn markdown(points: &[Point], args: &ScalingArgs) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Cost at recall@{} ≥ {} ({}) against the number of keys\n",
        args.k, args.target, args.queries
    );
    let _ = writeln!(
        s,
        "| d | n | index | reached | min scanned | best QPS | QPS / flat | build s | bytes/key |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    let f = |v: Option<f64>, p: usize| v.map_or("—".to_string(), |x| format!("{x:.p$}"));
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.d,
            p.n,
            p.index,
            p.reached,
            f(p.min_scanned, 4),
            f(p.best_qps, 0),
            f(p.qps_over_flat, 2),
            f(p.build_s, 1),
            f(p.bytes_per_key, 1)
        );
    }
    // Growth of the QPS ratio from the smallest to the largest n, per (d, index).
    let _ = writeln!(
        s,
        "\n| d | index | QPS/flat at smallest n | at largest n | growth |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    let mut groups: BTreeMap<(usize, &str), Vec<&Point>> = BTreeMap::new();
    for p in points.iter().filter(|p| p.index != "flat") {
        groups.entry((p.d, p.index.as_str())).or_default().push(p);
    }
    for ((d, index), ps) in groups {
        let (Some(first), Some(last)) = (ps.first(), ps.last()) else {
            continue;
        };
        let growth = match (first.qps_over_flat, last.qps_over_flat) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.1}×", b / a),
            _ => "—".into(),
        };
        let _ = writeln!(
            s,
            "| {d} | {index} | {} (n={}) | {} (n={}) | {growth} |",
            f(first.qps_over_flat, 2),
            first.n,
            f(last.qps_over_flat, 2),
            last.n
        );
    }
    s
}
