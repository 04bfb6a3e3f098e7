//! Model configuration from GGUF metadata and the f32 weights, dequantized once at load.
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of
//! `attn_q` / `attn_k` within each head so that its interleaved RoPE (pairs `2i, 2i+1`) computes
//! what Hugging Face's rotate-half RoPE (pairs `i, i + d/2`) computes. We undo that permutation at
//! load ([`unpermute_rows`]) and apply rotate-half RoPE, so captured q and k are in the Hugging Face
//! layout of the reference dumps.

use rayon::prelude::*;

use super::error::{ModelError, Result};
use super::gguf::GgufFile;

/// Hyperparameters of a Llama-family model (`llama.*` GGUF metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub n_layers: usize,
    /// Hidden size (`embedding_length`).
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_theta: f64,
    pub rms_eps: f32,
}

impl Config {
    /// Reads the configuration of a `general.architecture = "llama"` file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g.meta_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Architecture(arch.to_string()));
        }
        let u = |k: &str| -> Result<usize> { Ok(g.meta_u64(&format!("llama.{k}"))? as usize) };
        let dim = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = u("attention.head_count_kv").unwrap_or(n_heads);
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => g.meta_array("tokenizer.ggml.tokens")?.len(),
        };
        let bad = |key: &str, reason: &str| ModelError::Metadata {
            key: key.into(),
            reason: reason.into(),
        };
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(
                "llama.attention.head_count_kv",
                "must divide the number of query heads",
            ));
        }
        if dim % n_heads != 0 || (dim / n_heads) % 2 != 0 {
            return Err(bad(
                "llama.embedding_length",
                "must be n_heads × an even head dim",
            ));
        }
        let head_dim = dim / n_heads;
        if let Ok(rope_dims) = u("rope.dimension_count") {
            if rope_dims != head_dim {
                return Err(bad(
                    "llama.rope.dimension_count",
                    "partial RoPE is not supported",
                ));
            }
        }
        let cfg = Self {
            n_layers: u("block_count")?,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: u("feed_forward_length")?,
            vocab_size,
            context_length: u("context_length")?,
            rope_theta: g.meta_f64("llama.rope.freq_base").unwrap_or(10000.0),
            rms_eps: g.meta_f64("llama.attention.layer_norm_rms_epsilon")? as f32,
        };
        if cfg.n_layers == 0 || cfg.ffn_dim == 0 || cfg.vocab_size == 0 || cfg.context_length == 0 {
            return Err(bad("llama.*", "a dimension is zero"));
        }
        Ok(cfg)
    }
}

/// One transformer block's weights, f32 row-major `out × in` (PyTorch `Linear` layout).
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// `(n_heads · head_dim) × dim`, rows in Hugging Face order.
    pub wq: Vec<f32>,
    /// `(n_kv_heads · head_dim) × dim`, rows in Hugging Face order.
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    pub w_down: Vec<f32>,
}

/// All weights of the model.
#[derive(Debug)]
pub struct Weights {
    /// `vocab × dim`; also the output head (tied).
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Vec<f32>,
}

/// Undoes llama.cpp's q/k row permutation: in each head of `head_dim` rows, GGUF row `2i + j`
/// (`j ∈ {0, 1}`) is Hugging Face row `j · head_dim/2 + i`. `w` is row-major
/// `(n_heads · head_dim) × cols`.
pub fn unpermute_rows(w: &[f32], n_heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let src = (h * head_dim + 2 * i + j) * cols;
                let dst = (h * head_dim + j * half + i) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

impl Weights {
    /// Dequantizes every tensor of `cfg`'s model from `g` (in parallel over tensors).
    pub fn from_gguf(g: &GgufFile, cfg: &Config) -> Result<Self> {
        let (d, f, hd) = (cfg.dim as u64, cfg.ffn_dim as u64, cfg.head_dim as u64);
        let q = cfg.n_heads as u64 * hd;
        let kv = cfg.n_kv_heads as u64 * hd;
        let embed = g.dequantize("token_embd.weight", &[d, cfg.vocab_size as u64])?;
        if let Ok(t) = g.tensor("output.weight") {
            // Untied output heads exist in other Llama GGUFs; this driver ties them.
            return Err(ModelError::Tensor {
                tensor: t.name.clone(),
                reason: "untied output head is not supported".into(),
            });
        }
        let out_norm = g.dequantize("output_norm.weight", &[d])?;
        let layers = (0..cfg.n_layers)
            .into_par_iter()
            .map(|i| {
                let t = |name: &str, dims: &[u64]| g.dequantize(&format!("blk.{i}.{name}"), dims);
                Ok(LayerWeights {
                    attn_norm: t("attn_norm.weight", &[d])?,
                    wq: unpermute_rows(
                        &t("attn_q.weight", &[d, q])?,
                        cfg.n_heads,
                        cfg.head_dim,
                        cfg.dim,
                    ),
                    wk: unpermute_rows(
                        &t("attn_k.weight", &[d, kv])?,
                        cfg.n_kv_heads,
                        cfg.head_dim,
                        cfg.dim,
                    ),
                    wv: t("attn_v.weight", &[d, kv])?,
                    wo: t("attn_output.weight", &[q, d])?,
                    ffn_norm: t("ffn_norm.weight", &[d])?,
                    w_gate: t("ffn_gate.weight", &[d, f])?,
                    w_up: t("ffn_up.weight", &[d, f])?,
                    w_down: t("ffn_down.weight", &[f, d])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed,
            layers,
            out_norm,
        })
    }
}

impl Config {
    /// SmolLM2-135M's shape (the bundled model), for models with seeded random weights.
    pub fn smollm2_135m() -> Self {
        Config {
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

impl Weights {
    /// Seeded random weights of `cfg`'s shape (normal, std 0.02 for matrices and 1 + 0.1·normal
    /// for norms): a model that runs every code path of a real one, for backend parity checks
    /// where the model file is absent.
    pub fn random(cfg: &Config, seed: u64) -> Self {
        let q = cfg.n_heads * cfg.head_dim;
        let kv = cfg.n_kv_heads * cfg.head_dim;
        let (d, f) = (cfg.dim, cfg.ffn_dim);
        let mat = |len: usize, s: u64| -> Vec<f32> {
            let mut rng = qkindex::synth::Rng::new(seed ^ s.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            (0..len).map(|_| 0.02 * rng.normal()).collect()
        };
        let norm = |len: usize, s: u64| -> Vec<f32> {
            let mut rng = qkindex::synth::Rng::new(seed ^ s.wrapping_mul(0xD1B5_4A32_D192_ED03));
            (0..len).map(|_| 1.0 + 0.1 * rng.normal()).collect()
        };
        let layers = (0..cfg.n_layers)
            .into_par_iter()
            .map(|i| {
                let b = 16 * (i as u64 + 1);
                LayerWeights {
                    attn_norm: norm(d, b),
                    wq: mat(q * d, b + 1),
                    wk: mat(kv * d, b + 2),
                    wv: mat(kv * d, b + 3),
                    wo: mat(d * q, b + 4),
                    ffn_norm: norm(d, b + 5),
                    w_gate: mat(f * d, b + 6),
                    w_up: mat(f * d, b + 7),
                    w_down: mat(d * f, b + 8),
                }
            })
            .collect();
        Weights {
            embed: mat(cfg.vocab_size * d, 1),
            layers,
            out_norm: norm(d, 2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_weights_have_the_shape_and_are_seeded() {
        let cfg = Config {
            n_layers: 2,
            vocab_size: 100,
            ..Config::smollm2_135m()
        };
        let a = Weights::random(&cfg, 7);
        let b = Weights::random(&cfg, 7);
        let c = Weights::random(&cfg, 8);
        assert_eq!(a.embed.len(), 100 * 576);
        assert_eq!(a.layers[1].wk.len(), 3 * 64 * 576);
        assert_eq!(a.layers[1].w_down.len(), 576 * 1536);
        assert_eq!(a.layers[0].wq, b.layers[0].wq);
        assert_ne!(a.layers[0].wq, c.layers[0].wq);
        assert_ne!(a.layers[0].wq, a.layers[1].wq);
    }

    /// llama.cpp's `permute` (HF → GGUF): reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).
    fn permute(w: &[f32], n_heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
        let half = head_dim / 2;
        let mut out = vec![0f32; w.len()];
        for h in 0..n_heads {
            for j in 0..2 {
                for i in 0..half {
                    let src = (h * head_dim + j * half + i) * cols;
                    let dst = (h * head_dim + 2 * i + j) * cols;
                    out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (nh, hd, cols) = (3, 8, 5);
        let w: Vec<f32> = (0..nh * hd * cols).map(|v| v as f32).collect();
        assert_eq!(unpermute_rows(&permute(&w, nh, hd, cols), nh, hd, cols), w);
        // head_dim 4, one column: GGUF rows [a, b, c, d] are HF rows [a, c, b, d].
        assert_eq!(
            unpermute_rows(&[0.0, 1.0, 2.0, 3.0], 1, 4, 1),
            vec![0.0, 2.0, 1.0, 3.0]
        );
    }

    #[test]
    fn interleaved_rope_on_gguf_rows_equals_rotate_half_on_hf_rows() {
        // The reason for the permutation: ggml's interleaved RoPE of x·W_gguf equals a permutation
        // of HF rotate-half RoPE of x·W_hf. Check it on one head at one position.
        let (hd, cols, pos, theta) = (8usize, 3usize, 7.0f64, 10000.0f64);
        let w: Vec<f32> = (0..hd * cols).map(|v| (v as f32 * 0.7).sin()).collect();
        let x = [0.3f32, -1.2, 0.8];
        let proj = |w: &[f32]| -> Vec<f32> {
            (0..hd)
                .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
                .collect()
        };
        let ang = |i: usize| pos * theta.powf(-(2.0 * i as f64) / hd as f64);
        let hf = proj(&w);
        let gg = proj(&permute(&w, 1, hd, cols));
        for i in 0..hd / 2 {
            let (c, s) = (ang(i).cos() as f32, ang(i).sin() as f32);
            // rotate-half on HF rows
            let hf0 = hf[i] * c - hf[i + hd / 2] * s;
            let hf1 = hf[i + hd / 2] * c + hf[i] * s;
            // interleaved on GGUF rows
            let gg0 = gg[2 * i] * c - gg[2 * i + 1] * s;
            let gg1 = gg[2 * i + 1] * c + gg[2 * i] * s;
            assert!((hf0 - gg0).abs() < 1e-6 && (hf1 - gg1).abs() < 1e-6);
        }
    }
}
