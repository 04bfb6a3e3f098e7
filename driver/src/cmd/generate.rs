//! `qkindex generate`: greedy generation, streaming tokens to stdout.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use qkindex_driver::devices::Devices;
use qkindex_model::{argmax, chat_prompt, ModelError, Timings};

use super::model_args::ModelArgs;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Prompt text; control tokens such as `<|im_start|>` in it are parsed as such.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the chat template (system turn, user turn, assistant header).
    #[arg(long)]
    pub chat: bool,
    /// System turn for --chat [default: the template's default system turn].
    #[arg(long)]
    pub system: Option<String>,
    /// With --chat: no system turn at all.
    #[arg(long)]
    pub no_system: bool,
    /// Maximum number of new tokens.
    #[arg(long, default_value_t = 64)]
    pub max_new: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: GenerateArgs, devices: &Devices) -> anyhow::Result<()> {
    let m = args.model.load(devices)?;
    let text = if args.chat {
        let system = if args.no_system {
            None
        } else {
            Some(
                args.system
                    .as_deref()
                    .unwrap_or(m.tokenizer.system_or_default()),
            )
        };
        chat_prompt(&args.prompt, system)
    } else {
        args.prompt.clone()
    };
    let ids = m.tokenizer.encode(&text)?;
    if ids.is_empty() {
        anyhow::bail!("the prompt has no tokens");
    }
    let m = args.model.fit(m, ids.len() + args.max_new)?;
    let ctx = m.llama.cfg.context_length;
    if ids.len() > ctx {
        return Err(ModelError::ContextOverflow {
            got: ids.len(),
            max: ctx,
        }
        .into());
    }
    let max_new = args.max_new.min(ctx - ids.len());
    let mut cache = m.llama.new_cache(ids.len() + max_new)?;
    let mut tm = Timings::default();
    let t0 = Instant::now();
    let hidden = m.llama.forward(&ids, &mut cache, None, &mut tm)?;
    let mut logits = m.llama.last_logits(&hidden, &mut tm)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut stream = m.tokenizer.stream();
    let mut out = std::io::stdout().lock();
    let t1 = Instant::now();
    let mut n_new = 0;
    for step in 0..max_new {
        // Greedy; the end-of-turn token ends the answer, other control tokens are never chosen.
        let eos = m.tokenizer.eos_id;
        let next = argmax(&logits, |id| id != eos && m.tokenizer.is_control(id));
        if next == eos {
            break;
        }
        write!(out, "{}", stream.push(next)?)?;
        out.flush()?;
        n_new += 1;
        if step + 1 == max_new {
            break;
        }
        let hidden = m.llama.forward(&[next], &mut cache, None, &mut tm)?;
        logits = m.llama.last_logits(&hidden, &mut tm)?;
    }
    writeln!(out)?;
    let decode_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "prompt {} tokens in {:.2} s ({:.0} tok/s); {} new tokens, {:.1} ms/token",
        ids.len(),
        prefill_s,
        ids.len() as f64 / prefill_s,
        n_new,
        1e3 * decode_s / n_new.max(1) as f64
    );
    Ok(())
}
