//! Arguments shared by the subcommands that run the model: the model file ([`ModelArgs`]), and
//! with it the attention policies and a JSON output ([`PolicyRunArgs`], `eval` and `passkey`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use qkindex_driver::devices::Devices;
use qkindex_model::cache::KvDtype;
use qkindex_model::config::{RopeScaling, MAX_DEFAULT_SCALING};
use qkindex_model::{Model, ModelError, KNOWN_MODELS};

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
    /// A model family fetched by scripts/get-model.sh (`smollm2-135m`, `gemma3-270m`, `qwen2.5-1.5b`: its file
    /// under models/, sha256-checked) or the path of a GGUF file [default: smollm2-135m].
    #[arg(long, value_name = "NAME|PATH")]
    pub model: Option<String>,
    /// Expected sha256 of the model file (checked before loading).
    #[arg(long)]
    pub sha256: Option<String>,
    /// NTK-aware RoPE scaling by F, the same as `--rope-scaling ntk:F`.
    #[arg(long, value_name = "F", conflicts_with = "rope_scaling")]
    pub rope_scale: Option<f64>,
    /// RoPE scaling for a context F times the trained one: `none`, `ntk:F` (base ×
    /// F^(d/(d−2))) or `linear:F` (positions / F). It applies to the layers with the file's base
    /// (all of SmolLM2's, Gemma 3's global ones). Default: none while the run fits the trained
    /// context, past it NTK by the smallest multiple of 1/4 that makes room, up to 4.25× (the
    /// stretch measured: 131,072 + 512 positions of Gemma 3; past that, name one;
    /// docs/bench/long/README.md).
    #[arg(long, value_name = "MODE", value_parser = parse_rope_scaling)]
    pub rope_scaling: Option<RopeScaling>,
    /// What exact attention reads keys and values in on the CPU: `f32`, or `f16` (a half-precision
    /// copy of the cache beside the f32 one that indexes and policies read: a decode step's
    /// exact attention streams half the bytes, as llama.cpp's default f16 cache; the cache takes
    /// 1.5× the memory).
    #[arg(long, value_name = "TYPE", default_value = "f32")]
    pub kv_cache: KvDtype,
}

fn parse_rope_scaling(s: &str) -> Result<RopeScaling, String> {
    s.parse().map_err(|e: ModelError| e.to_string())
}

impl ModelArgs {
    /// Loads the model onto `devices`' model device with the RoPE scaling named (none
    /// otherwise; [`ModelArgs::fit`] picks the default once the run's length is known),
    /// reporting the time on stderr.
    pub fn load(&self, devices: &Devices) -> anyhow::Result<Model> {
        let t0 = Instant::now();
        let m = devices
            .model_device()
            .and_then(|device| {
                Model::load_default_or(self.model.as_deref(), self.sha256.as_deref(), device)
            })
            .context("loading the model")?;
        let scaling = match (self.rope_scaling, self.rope_scale) {
            (Some(s), _) => s,
            (None, Some(f)) => RopeScaling::Ntk(f),
            (None, None) => RopeScaling::None,
        };
        let mut m = m
            .with_rope_scaling(scaling)
            .context("scaling the model's RoPE")?;
        m.llama.set_kv_dtype(self.kv_cache);
        let mut scale = match m.llama.cfg.rope_scaling() {
            RopeScaling::None => String::new(),
            s => format!(
                ", RoPE scaling {s} (context {})",
                m.llama.cfg.context_length
            ),
        };
        if self.kv_cache == KvDtype::F16 {
            scale.push_str(", f16 KV cache for exact attention");
        }
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

impl ModelArgs {
    /// `m` ready for runs of `positions` positions: where no RoPE scaling was named and they
    /// exceed the trained context, the default scaling for that length
    /// (`Config::default_rope_scaling`), said on stderr; `m` as it is otherwise.
    pub fn fit(&self, m: Model, positions: usize) -> anyhow::Result<Model> {
        let named = self.rope_scaling.is_some() || self.rope_scale.is_some();
        let scaling = m.llama.cfg.default_rope_scaling(positions);
        if named || scaling == RopeScaling::None {
            return Ok(m);
        }
        let trained = m.llama.cfg.trained_context();
        if scaling.factor() > MAX_DEFAULT_SCALING {
            anyhow::bail!(
                "{positions} positions are more than {MAX_DEFAULT_SCALING}× the model's trained \
                 context of {trained}: name a RoPE scaling to run that far (--rope-scaling \
                 {scaling}, or linear:F), knowing the model was not trained for it"
            );
        }
        let m = m
            .with_rope_scaling(scaling)
            .context("scaling the model's RoPE")?;
        eprintln!(
            "{positions} positions exceed the trained context of {trained}: RoPE scaling \
             {scaling} (context {}; --rope-scaling names another)",
            m.llama.cfg.context_length
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
