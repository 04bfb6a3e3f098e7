//! `qkindex ppl`: teacher-forced perplexity of a text file, over non-overlapping windows.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use qkindex_driver::devices::Devices;
use qkindex_driver::model::Timings;

use super::model_args::ModelArgs;

#[derive(Debug, Args)]
pub struct PplArgs {
    /// Text file (UTF-8); control tokens in it are parsed as such.
    #[arg(long)]
    pub text: PathBuf,
    /// Window length in tokens; each window is scored from an empty cache.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Score at most this many windows.
    #[arg(long)]
    pub max_windows: Option<usize>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Rows of logits computed at once (bounds memory to `ROWS × vocab` floats).
const ROWS: usize = 256;

pub fn run(args: PplArgs, devices: &Devices) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    let m = args.model.load(devices)?;
    let ctx = m.llama.cfg.context_length;
    if args.context < 2 || args.context > ctx {
        anyhow::bail!("--context {} must be in 2..={ctx}", args.context);
    }
    let ids = m.tokenizer.encode(&text)?;
    if ids.len() < 2 {
        anyhow::bail!("{} has fewer than 2 tokens", args.text.display());
    }
    let vocab = m.llama.cfg.vocab_size;
    let (mut nll, mut count) = (0f64, 0usize);
    let mut tm = Timings::default();
    let t0 = Instant::now();
    let windows = ids.chunks(args.context).filter(|w| w.len() >= 2);
    for (wi, window) in windows.enumerate() {
        if args.max_windows.is_some_and(|mw| wi >= mw) {
            break;
        }
        let mut cache = m.llama.new_cache(window.len())?;
        let hidden = m.llama.forward(window, &mut cache, None, &mut tm)?;
        let dim = m.llama.cfg.dim;
        let n_pred = window.len() - 1;
        for r0 in (0..n_pred).step_by(ROWS) {
            let r1 = (r0 + ROWS).min(n_pred);
            let logits = m.llama.logits(&hidden[r0 * dim..r1 * dim], &mut tm)?;
            for (r, row) in (r0..r1).zip(logits.chunks_exact(vocab)) {
                let target = window[r + 1] as usize;
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let lse = max as f64
                    + row
                        .iter()
                        .map(|&l| ((l - max) as f64).exp())
                        .sum::<f64>()
                        .ln();
                nll += lse - row[target] as f64;
                count += 1;
            }
        }
        eprintln!(
            "window {wi}: {} tokens, running ppl {:.4}",
            window.len(),
            (nll / count as f64).exp()
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "ppl {:.4} over {count} predicted tokens (context {}), {:.1} s",
        (nll / count.max(1) as f64).exp(),
        args.context,
        secs
    );
    Ok(())
}
