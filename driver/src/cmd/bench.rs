//! `qkindex bench`: recall benchmark on a dump.

use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Dump directory (DESIGN.md §4 layout).
    #[arg(long)]
    pub dump: std::path::PathBuf,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("bench on {} is not built yet", args.dump.display())
}
