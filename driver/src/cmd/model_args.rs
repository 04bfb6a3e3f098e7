//! Arguments shared by the subcommands that run the model: the model file ([`ModelArgs`]), and
//! with it the attention policies and a JSON output ([`PolicyRunArgs`], `eval` and `passkey`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use qkindex_driver::devices::Devices;
use qkindex_driver::model::Model;

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
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q4_1.gguf, sha256-checked].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Expected sha256 of the model file (checked before loading).
    #[arg(long)]
    pub sha256: Option<String>,
}

impl ModelArgs {
    /// Loads the model onto `devices`' model device, reporting the time on stderr.
    pub fn load(&self, devices: &Devices) -> anyhow::Result<Model> {
        let t0 = Instant::now();
        let m = Model::load_default_or(self.model.as_deref(), self.sha256.as_deref(), devices)
            .context("loading the model")?;
        eprintln!(
            "loaded {} ({} layers) from {} in {:.2} s",
            m.name,
            m.llama.cfg.n_layers,
            m.path.display(),
            t0.elapsed().as_secs_f64()
        );
        Ok(m)
    }
}
