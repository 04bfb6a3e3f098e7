//! Hyperparameters of a model from its GGUF metadata (`<arch>.*` keys).

use super::arch::{Architecture, LayerSpec};
use super::backend::Heads;
use super::error::{ModelError, Result};
use super::gguf::GgufFile;

/// Hyperparameters of a model of one [`Architecture`].
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Architecture,
    pub n_layers: usize,
    /// Hidden size (`embedding_length`).
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    /// The RoPE base of the file (`rope.freq_base`); [`Config::layer`] says which base each
    /// layer uses.
    pub rope_theta: f64,
    pub rms_eps: f32,
}

impl Config {
    /// Reads the configuration of a file whose `general.architecture` this driver runs.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = Architecture::from_gguf_name(g.meta_str("general.architecture")?)?;
        let prefix = arch.gguf_name();
        let key = |k: &str| format!("{prefix}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(g.meta_u64(&key(k))? as usize) };
        let dim = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = u("attention.head_count_kv").unwrap_or(n_heads);
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => g.meta_array("tokenizer.ggml.tokens")?.len(),
        };
        let bad = |k: &str, reason: &str| ModelError::Metadata {
            key: key(k),
            reason: reason.into(),
        };
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(
                "attention.head_count_kv",
                "must divide the number of query heads",
            ));
        }
        if dim % n_heads != 0 || (dim / n_heads) % 2 != 0 {
            return Err(bad(
                "embedding_length",
                "must be n_heads × an even head dim",
            ));
        }
        let head_dim = dim / n_heads;
        if let Ok(rope_dims) = u("rope.dimension_count") {
            if rope_dims != head_dim {
                return Err(bad("rope.dimension_count", "partial RoPE is not supported"));
            }
        }
        let cfg = Self {
            arch,
            n_layers: u("block_count")?,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: u("feed_forward_length")?,
            vocab_size,
            context_length: u("context_length")?,
            rope_theta: g.meta_f64(&key("rope.freq_base")).unwrap_or(10000.0),
            rms_eps: g.meta_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
        };
        if cfg.n_layers == 0 || cfg.ffn_dim == 0 || cfg.vocab_size == 0 || cfg.context_length == 0 {
            return Err(bad("*", "a dimension is zero"));
        }
        Ok(cfg)
    }

    /// What layer `layer` does (norms, activation, RoPE, attention kind).
    pub fn layer(&self, layer: usize) -> LayerSpec {
        self.arch.layer(layer, self.rope_theta)
    }

    /// Width of the queries of one position, `n_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the keys (and values) of one position, `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The attention heads of every layer.
    pub fn heads(&self) -> Heads {
        Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// SmolLM2-135M's shape (the bundled model), for models with seeded random weights.
    pub fn smollm2_135m() -> Self {
        Config {
            arch: Architecture::Llama,
            n_layers: 30,
            dim: 576,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            ffn_dim: 1536,
            vocab_size: 49_152,
            context_length: 8192,
            rope_theta: 100_000.0,
            rms_eps: 1e-5,
        }
    }
}
