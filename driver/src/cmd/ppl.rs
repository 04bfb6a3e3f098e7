//! `qkindex ppl`: teacher-forced perplexity of a text file, over non-overlapping windows.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use qkindex_driver::devices::Devices;
use qkindex_model::llama::PREFILL_CHUNK;
use qkindex_model::Timings;

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
    /// Score only the last N predictions of each window (all positions are still prefilled):
    /// the perplexity far into a long context, without the LM head over every position.
    #[arg(long, value_name = "N")]
    pub score_last: Option<usize>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Rows of logits computed at once (bounds memory to `ROWS × vocab` floats).
const ROWS: usize = 256;

pub fn run(args: PplArgs, devices: &Devices) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    let m = args.model.load(devices)?;
    let m = args.model.fit(m, args.context)?;
    let ctx = m.llama.cfg.context_length;
    if args.context < 2 || args.context > ctx {
        anyhow::bail!("--context {} must be in 2..={ctx}", args.context);
    }
    if args.score_last == Some(0) {
        anyhow::bail!("--score-last must be at least 1");
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
        let n_pred = window.len() - 1;
        let first = n_pred - args.score_last.unwrap_or(n_pred).min(n_pred);
        // Prefilled chunk by chunk (a bar over the positions), keeping the hidden states of
        // the scored positions only.
        let dim = m.llama.cfg.dim;
        let bar = super::progress::prefill_bar(window.len());
        let mut hidden = Vec::with_capacity((window.len() - first) * dim);
        for (ci, chunk) in window.chunks(PREFILL_CHUNK).enumerate() {
            let h = m.llama.forward(chunk, &mut cache, None, &mut tm)?;
            let p0 = ci * PREFILL_CHUNK;
            let keep = first.saturating_sub(p0).min(chunk.len());
            hidden.extend_from_slice(&h[keep * dim..]);
            bar.set_position(cache.len() as u64);
        }
        bar.finish_and_clear();
        // Row r of `hidden` is position first + r, predicting window[first + r + 1].
        for r0 in (0..n_pred - first).step_by(ROWS) {
            let r1 = (r0 + ROWS).min(n_pred - first);
            let logits = m.llama.logits(&hidden[r0 * dim..r1 * dim], &mut tm)?;
            for (r, row) in (r0..r1).zip(logits.chunks_exact(vocab)) {
                let target = window[first + r + 1] as usize;
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
            "window {wi}: {} tokens, {} scored, running ppl {:.4}",
            window.len(),
            n_pred - first,
            (nll / count as f64).exp()
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "ppl {:.4} over {count} predicted tokens (context {}{}, RoPE scaling {}), {:.1} s",
        (nll / count.max(1) as f64).exp(),
        args.context,
        args.score_last
            .map_or(String::new(), |n| format!(", the last {n} of each window")),
        m.llama.cfg.rope_scaling(),
        secs
    );
    Ok(())
}
