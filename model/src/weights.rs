//! The model's weights: the token embedding (also the output head), one [`Block`] per layer, the
//! final norm. Matrices stay in their GGUF blocks where `qdot.rs` has an integer kernel for their
//! type ([`HostTensor`]); norms and other types are dequantized to f32 once at load.
//! `QKINDEX_F32_WEIGHTS=1` dequantizes everything (the f32 path, for comparisons).
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of
//! `attn_q` / `attn_k` within each head so that its interleaved RoPE (pairs `2i, 2i+1`) computes
//! what Hugging Face's rotate-half RoPE (pairs `i, i + d/2`) computes. We undo that permutation at
//! load ([`unpermute_rows`](crate::arch::unpermute_rows), chosen by the layer's `QkRowOrder`) and apply rotate-half RoPE, so
//! captured q and k are in the Hugging Face layout of the reference dumps.

use rayon::prelude::*;

use super::arch::{Architecture, NormPlacement, QkNorm};
use super::block::{Attention, Block, Mlp, QkvBias};
use super::config::Config;
use super::error::Result;
use super::gguf::GgufFile;
use super::qtensor::HostTensor;

/// All weights of a model, tensors of type `T` ([`HostTensor`] on the host, row-major
/// `out × in` for `Linear` weights as in PyTorch).
#[derive(Debug)]
pub struct Weights<T = HostTensor> {
    /// `vocab × dim`; also the output head unless the file has its own.
    pub embed: T,
    pub blocks: Vec<Block<T>>,
    pub out_norm: T,
    /// The output head (`vocab × dim`) where the file has one (`output.weight`: untied, as
    /// Qwen2.5-1.5B); `None`: the embedding is the head (tied).
    pub output: Option<T>,
}

impl<T> Weights<T> {
    /// The output head: [`Weights::output`], or the embedding when the head is tied.
    pub fn head(&self) -> &T {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}

impl Weights {
    /// Reads every tensor of `cfg`'s model from `g` (in parallel over layers), matrices in their
    /// blocks unless `QKINDEX_F32_WEIGHTS` is set.
    pub fn from_gguf(g: &GgufFile, cfg: &Config) -> Result<Self> {
        let keep_blocks = std::env::var_os("QKINDEX_F32_WEIGHTS").is_none_or(|v| v == "0");
        Self::read(g, cfg, keep_blocks)
    }

    /// Reads every tensor of `cfg`'s model from `g`: matrices in their blocks where they have an
    /// integer kernel and `keep_blocks`, the rest as f32.
    pub fn read(g: &GgufFile, cfg: &Config, keep_blocks: bool) -> Result<Self> {
        let d = cfg.dim as u64;
        let embed = g.host_tensor(
            "token_embd.weight",
            &[d, cfg.vocab_size as u64],
            keep_blocks,
        )?;
        let output = match g.tensor("output.weight") {
            Ok(_) => {
                Some(g.host_tensor("output.weight", &[d, cfg.vocab_size as u64], keep_blocks)?)
            }
            Err(_) => None,
        };
        let out_norm = HostTensor::F32(g.dequantize("output_norm.weight", &[d])?);
        let blocks = (0..cfg.n_layers)
            .into_par_iter()
            .map(|i| Block::load(g, cfg, i, keep_blocks))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed,
            blocks,
            out_norm,
            output,
        })
    }

    /// Seeded random weights of `cfg`'s shape (normal, std 0.02 for matrices and 1 + 0.1·normal
    /// for norms): a model that runs every code path of a real one, for backend parity checks
    /// where the model file is absent.
    pub fn random(cfg: &Config, seed: u64) -> Self {
        let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
        let (d, f) = (cfg.dim, cfg.ffn_dim);
        let mat = |len: usize, s: u64| {
            let mut rng = qkindex::synth::Rng::new(seed ^ s.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            HostTensor::F32((0..len).map(|_| 0.02 * rng.normal()).collect())
        };
        let norm = |len: usize, s: u64| {
            let mut rng = qkindex::synth::Rng::new(seed ^ s.wrapping_mul(0xD1B5_4A32_D192_ED03));
            HostTensor::F32((0..len).map(|_| 1.0 + 0.1 * rng.normal()).collect())
        };
        let blocks = (0..cfg.n_layers)
            .into_par_iter()
            .map(|i| {
                let b = 16 * (i as u64 + 1);
                let spec = cfg.layer(i);
                let (qk, post) = (
                    spec.qk_norm == QkNorm::PerHead,
                    spec.norms == NormPlacement::PrePost,
                );
                let bias = |len: usize, s: u64| {
                    let mut rng =
                        qkindex::synth::Rng::new(seed ^ s.wrapping_mul(0xA24B_AED4_963E_E407));
                    HostTensor::F32((0..len).map(|_| 0.1 * rng.normal()).collect())
                };
                let hd = cfg.head_dim;
                Block {
                    spec,
                    post_attn_norm: post.then(|| norm(d, b + 9)),
                    post_ffn_norm: post.then(|| norm(d, b + 10)),
                    attn_norm: norm(d, b),
                    attn: Attention {
                        wq: mat(q * d, b + 1),
                        wk: mat(kv * d, b + 2),
                        wv: mat(kv * d, b + 3),
                        wo: mat(d * q, b + 4),
                        q_norm: qk.then(|| norm(hd, b + 11)),
                        k_norm: qk.then(|| norm(hd, b + 12)),
                        bias: spec.qkv_bias.then(|| QkvBias {
                            q: bias(q, b + 13),
                            k: bias(kv, b + 14),
                            v: bias(kv, b + 15),
                        }),
                    },
                    ffn_norm: norm(d, b + 5),
                    mlp: Mlp {
                        gate: mat(f * d, b + 6),
                        up: mat(f * d, b + 7),
                        down: mat(d * f, b + 8),
                    },
                }
            })
            .collect();
        Weights {
            embed: mat(cfg.vocab_size * d, 1),
            blocks,
            out_norm: norm(d, 2),
            // Qwen2's files have their own head; the others tie it.
            output: (cfg.arch == Architecture::Qwen2).then(|| mat(cfg.vocab_size * d, 3)),
        }
    }
}

impl<T> Weights<T> {
    /// The same weights with `f` applied to each tensor (e.g. an upload to a device).
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&T) -> std::result::Result<U, E>,
    ) -> std::result::Result<Weights<U>, E> {
        Ok(Weights {
            embed: f(&self.embed)?,
            blocks: self
                .blocks
                .iter()
                .map(|b| b.try_map(&mut f))
                .collect::<std::result::Result<_, E>>()?,
            out_norm: f(&self.out_norm)?,
            output: match &self.output {
                Some(o) => Some(f(o)?),
                None => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::unpermute_rows;

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
        assert_eq!(a.blocks[1].attn.wk.len(), 3 * 64 * 576);
        assert_eq!(a.blocks[1].mlp.down.len(), 576 * 1536);
        let wq = |w: &Weights, l: usize| w.blocks[l].attn.wq.to_f32().into_owned();
        assert_eq!(wq(&a, 0), wq(&b, 0));
        assert_ne!(wq(&a, 0), wq(&c, 0));
        assert_ne!(wq(&a, 0), wq(&a, 1));
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
