//! Arguments shared by the subcommands that run the model: the model file ([`ModelArgs`]), and
//! with it the attention policies and a JSON output ([`PolicyRunArgs`], `eval` and `passkey`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use qkindex_driver::devices::Devices;
use qkindex_driver::model::{Model, KNOWN_MODELS};

use super::policy_args::PolicyArgs;

#[derive(Debug, Args)]
pub struct PolicyRunArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Write the results as JSON (`eval`: an object for one policy, an array for several).
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A model family fetched by scripts/get-model.sh (`smollm2-135m`, `gemma3-270m`: its file
    /// under models/, sha256-checked) or the path of a GGUF file [default: smollm2-135m].
    #[arg(long, value_name = "NAME|PATH")]
    pub model: Option<String>,
    /// Expected sha256 of the model file (checked before loading).
    #[arg(long)]
    pub sha256: Option<String>,
    /// NTK-aware RoPE scaling: base × F^(d/(d−2)) and a context F times the trained one (e.g.
    /// 4 for SmolLM2 at 32K). Gemma 3's local layers keep their base.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub rope_scale: f64,
}

impl ModelArgs {
    /// Loads the model onto `devices`' model device, reporting the time on stderr.
    pub fn load(&self, devices: &Devices) -> anyhow::Result<Model> {
        let t0 = Instant::now();
        let m = devices
            .model_device()
            .and_then(|device| {
                Model::load_default_or(self.model.as_deref(), self.sha256.as_deref(), device)
            })
            .and_then(|m| m.with_rope_scale(self.rope_scale))
            .context("loading the model")?;
        let scale = if self.rope_scale > 1.0 {
            format!(
                ", RoPE scale {} (context {})",
                self.rope_scale, m.llama.cfg.context_length
            )
        } else {
            String::new()
        };
        eprintln!(
            "loaded {} ({} layers{scale}) from {} in {:.2} s",
            describe(&m),
            m.llama.cfg.n_layers,
            m.path.display(),
            t0.elapsed().as_secs_f64()
        );
        Ok(m)
    }
}

/// The model as a user named it: its family (`--model NAME`, known by its file name; a GGUF
/// path otherwise), the file, the architecture, and the GGUF's own `general.name` (which for
/// SmolLM2 is a training-run label, not the model's name).
fn describe(m: &Model) -> String {
    let file = m.path.file_name().map_or_else(
        || m.path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let family = KNOWN_MODELS
        .iter()
        .find(|k| k.file == file)
        .map_or("a GGUF file", |k| k.name);
    format!(
        "{family}: {file} ({} architecture, GGUF name \"{}\")",
        m.llama.cfg.arch.gguf_name(),
        m.name
    )
}
