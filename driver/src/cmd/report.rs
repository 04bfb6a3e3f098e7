//! `qkindex report`: merges `bench.json` files measured in one run (ours and the peer script's,
//! `benches/peers.py`) and writes the combined JSON, CSV, markdown report and plots.

use crate::report::{self, BenchReport};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// `bench.json` files (schema qkindex-bench/1): the first gives dump, CPU and clock.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Scanned budget of the per-layer and Q→K/K→K gap plots (fraction of keys).
    #[arg(long, default_value_t = 0.10)]
    pub budget: f64,
}

pub fn run(args: ReportArgs) -> Result<()> {
    if !(args.budget > 0.0 && args.budget <= 1.0) {
        bail!("--budget must be in (0, 1], got {}", args.budget);
    }
    let mut inputs = args.inputs.iter();
    let Some(first) = inputs.next() else {
        bail!("no input files");
    };
    let mut merged = BenchReport::read(first)?;
    for path in inputs {
        merged.merge(BenchReport::read(path)?);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    merged.write(&args.out, args.budget)?;
    report::print_summary(&merged);
    eprintln!(
        "wrote {}/bench.json, bench.csv, report.md, plots/ ({} rows)",
        args.out.display(),
        merged.rows.len()
    );
    Ok(())
}
