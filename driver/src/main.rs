//! `qkindex`: the command-line front of qkindex (benchmarks, dumps, the decoding driver).
//! One file per subcommand under `cmd/`.

mod cmd;
mod report;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "qkindex",
    version,
    about = "Attention-aware nearest-neighbour search over transformer keys"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Recall benchmark of index kinds on a dump (recall, scanned fraction, QPS, build time).
    Bench(cmd::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => cmd::bench::run(args),
    }
}
