//! `qkindex`: the command-line front of qkindex (benchmarks, dumps, the decoding driver).
//! One file per subcommand under `cmd/`; what several subcommands share lives beside it
//! (`report.rs`, `plots/`, `training.rs`).

mod cmd;
mod plots;
mod report;
mod training;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "qkindex",
    version,
    about = "Attention-aware nearest-neighbour search over transformer keys",
    after_help = "Design, definitions and formats: docs/DESIGN.md and docs/FORMAT.md in the \
                  repository. An error prints its chain of causes; QKINDEX_DEBUG=1 prints \
                  anyhow's report instead, with the backtrace where RUST_BACKTRACE=1 is set."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where the model's forward passes and the exact kNN of index builds run: auto (a GPU if
    /// usable, else the CPU, with the reason logged), cpu, cuda or cuda:N.
    #[arg(long, global = true, default_value = "auto", value_parser = parse_device)]
    device: qkindex_gpu::Device,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// The end-to-end demo: prefill the bundled text, dump, build indexes, decode with retrieval
    /// attention and print what was measured.
    Demo(cmd::demo::DemoArgs),
    /// Decode attention of the policies on one layer of a dump (long synthetic caches).
    DecodeBench(cmd::decode_bench::DecodeBenchArgs),
    /// Perplexity, agreement with full attention, mass and latency of attention policies.
    Eval(cmd::eval::EvalArgs),
    /// Decode throughput of several sequences at once (each its own cache and indexes).
    Batch(cmd::batch::BatchArgs),
    /// Passkey retrieval (a number hidden in filler text) under attention policies.
    Passkey(cmd::passkey::PasskeyArgs),
    /// RULER-style long-context tasks (needles, variable tracking, common words) under policies.
    Tasks(cmd::tasks::TasksArgs),
    /// Recall benchmark of index kinds on a dump (recall, scanned fraction, QPS, build time).
    Bench(cmd::bench::BenchArgs),
    /// Merge bench.json files of one run (ours and peers') into one report with plots.
    Report(cmd::report::ReportArgs),
    /// Cost at a recall target against the number of keys, from bench runs of growing size.
    Scaling(cmd::scaling::ScalingArgs),
    /// The CUDA backend of the model against the CPU backend, and its speed (needs a GPU).
    GpuCheck(cmd::gpu_check::GpuCheckArgs),
    /// Greedy text generation with the model, streaming tokens.
    Generate(cmd::generate::GenerateArgs),
    /// Teacher-forced perplexity of a text file.
    Ppl(cmd::ppl::PplArgs),
    /// Run a prompt and greedy decode steps; write q/k/v of chosen layers as a dump (docs/DESIGN.md §4).
    Dump(cmd::dump::DumpArgs),
    /// Build indexes from a dump and write them as a bundle (keys once per KV head).
    Build(cmd::build::BuildArgs),
    /// Show the header, sections and parameters of an index file, key file or bundle.
    Inspect(cmd::inspect::InspectArgs),
    /// Fully check an index file, key file or bundle; non-zero exit with the reason on a fault.
    Verify(cmd::verify::VerifyArgs),
}

fn parse_device(s: &str) -> Result<qkindex_gpu::Device, String> {
    s.parse().map_err(|e: qkindex_gpu::GpuError| e.to_string())
}

/// Set (to anything but `0`) to print an error as anyhow formats it for developers, with the
/// backtrace where `RUST_BACKTRACE=1` is set, instead of only its chain of causes.
const DEBUG_ENV: &str = "QKINDEX_DEBUG";

/// Runs the command; an error prints as its chain of causes (`error: ...`, then `caused by: ...`,
/// each cause once), exit status 1. A user error is not a crash: no backtrace even where
/// `RUST_BACKTRACE=1` is set, unless `QKINDEX_DEBUG` asks for it.
fn main() -> std::process::ExitCode {
    match on_pool(run) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let debug = std::env::var_os(DEBUG_ENV).is_some_and(|v| v != "0");
            eprint!("{}", error_report(&e, debug));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The text printed for a failed command: the error, then each cause that adds something (a
/// cause whose text the line above already ends with is left out, so no line repeats); with
/// `debug`, anyhow's own report (every cause, and the backtrace when one was captured).
fn error_report(e: &anyhow::Error, debug: bool) -> String {
    if debug {
        return format!("Error: {e:?}\n");
    }
    let mut out = format!("error: {e}\n");
    let mut above = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !above.ends_with(&text) {
            out.push_str(&format!("caused by: {text}\n"));
        }
        above = text;
    }
    out
}

/// Stack of the pool's threads: the command runs on one of them, with the main thread's usual size.
const STACK_BYTES: usize = 8 << 20;

/// Runs `command` on a worker of a rayon pool of one thread per CPU (`RAYON_NUM_THREADS` where
/// set), the pool every parallel operation of the command then uses. The thread that runs the
/// command is one of the pool's, as llama.cpp's main thread is one of its pool's: a parallel
/// operation starts on it at once and the other workers steal parts of it, and an operation of
/// one part (a norm of one row, a decode step's small products) runs where it is, where from
/// outside the pool every operation would hand its work to a worker and wait for it to wake.
/// On Gemma 3 at 2K tokens (2 cores) that makes a decode step 15–22 % faster
/// (docs/bench/model-step/README.md, "The command on the pool"); helper threads that spin
/// between products instead (llama.cpp's way) were slower there, a third thread on two cores.
/// Falls back to running on this thread when no pool can be made.
fn on_pool<R: Send>(command: impl FnOnce() -> R + Send) -> R {
    match rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("qkindex-{i}"))
        .stack_size(STACK_BYTES)
        .build()
    {
        Ok(pool) => pool.install(command),
        Err(_) => command(),
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let devices = qkindex_driver::devices::Devices::from_flag(cli.device);
    match cli.command {
        Command::Demo(args) => cmd::demo::run(args, &devices),
        Command::Eval(args) => cmd::eval::run(args, &devices),
        Command::Batch(args) => cmd::batch::run(args, &devices),
        Command::DecodeBench(args) => cmd::decode_bench::run(args, &devices),
        Command::Passkey(args) => cmd::passkey::run(args, &devices),
        Command::Tasks(args) => cmd::tasks::run(args, &devices),
        Command::Bench(args) => cmd::bench::run(args, &devices),
        Command::Report(args) => cmd::report::run(args),
        Command::Scaling(args) => cmd::scaling::run(args),
        Command::Generate(args) => cmd::generate::run(args, &devices),
        Command::GpuCheck(args) => cmd::gpu_check::run(args, &devices),
        Command::Ppl(args) => cmd::ppl::run(args, &devices),
        Command::Dump(args) => cmd::dump::run(args, &devices),
        Command::Build(args) => cmd::build::run(args, &devices),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Verify(args) => cmd::verify::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::error_report;
    use anyhow::Context;

    #[test]
    fn the_report_is_the_chain_without_repeats() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let Err(e) = Err::<(), _>(io)
            .context("reading /x/manifest.json: No such file or directory")
            .context("opening the dump /x")
        else {
            unreachable!("an Err stays an Err")
        };
        assert_eq!(
            error_report(&e, false),
            "error: opening the dump /x\ncaused by: reading /x/manifest.json: No such file or directory\n"
        );
    }
}
