//! The architecture seam: what a model family chooses per layer, read by [`Block`] and
//! [`Attention`] (and by the loaders) so that the forward pass is written once.
//!
//! Each choice is an enum whose variants are the families this driver runs. Today that is Llama
//! (SmolLM2) only; Gemma 3 will add its variants here (marked "Gemma 3:" below) together with the
//! kernels they need, and a `match` in `block.rs` gains an arm per variant.
//!
//! RoPE: every family rotates with Hugging Face's rotate-half (NEOX) layout, pairs `(i, i + d/2)`
//! (`ops::Rope::apply`, `kernels/llama.cu` `rope`). What differs is how the file stores the q/k
//! projection rows: llama.cpp permutes Llama's rows for ggml's interleaved RoPE (pairs
//! `(2i, 2i+1)`), which [`QkRowOrder::LlamaCppPermuted`] undoes at load; Gemma 3's GGUF uses NEOX
//! RoPE and keeps the rows as they are.
//!
//! [`Block`]: super::block::Block
//! [`Attention`]: super::block::Attention

use super::error::{ModelError, Result};

/// A model family (`general.architecture` in GGUF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama (SmolLM2): pre-norm blocks, SwiGLU, one RoPE base, global attention in every layer.
    Llama,
}

impl Architecture {
    /// The family of a GGUF file's `general.architecture`.
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Architecture::Llama),
            other => Err(ModelError::Architecture(other.to_string())),
        }
    }

    /// The family's GGUF name, also the prefix of its metadata keys (`llama.block_count`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
        }
    }

    /// What layer `layer` of a model with RoPE base `rope_base` does.
    pub fn layer(self, _layer: usize, rope_base: f64) -> LayerSpec {
        match self {
            Architecture::Llama => LayerSpec {
                norms: NormPlacement::Pre,
                qk_norm: QkNorm::None,
                activation: Activation::SwiGlu,
                rope: RopeSpec {
                    base: rope_base,
                    rows: QkRowOrder::LlamaCppPermuted,
                },
                attention: AttentionKind::Global,
            },
        }
    }

    /// How token embeddings are scaled before the first layer.
    pub fn embed_scale(self) -> EmbedScale {
        match self {
            Architecture::Llama => EmbedScale::None,
        }
    }
}

/// The choices of one transformer layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    pub norms: NormPlacement,
    pub qk_norm: QkNorm,
    pub activation: Activation,
    pub rope: RopeSpec,
    pub attention: AttentionKind,
}

/// Where the block's RMSNorms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention and before the MLP, on the residual stream's copy (Llama).
    /// Gemma 3: `PrePost`, a further RMSNorm on the attention and MLP outputs before each
    /// residual add.
    Pre,
}

/// Normalization of queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// None (Llama). Gemma 3: `PerHead`, an RMSNorm over each head's `head_dim` values.
    None,
}

/// The MLP's gated activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (Llama). Gemma 3: `GeGlu`, `gelu_tanh(gate) · up`.
    SwiGlu,
}

/// Rotary embedding of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// `theta` of the frequencies `theta^(-2i / head_dim)`. Gemma 3: 1e4 on local layers, 1e6
    /// on global ones.
    pub base: f64,
    /// How the file stores the q/k rows (the rotation itself is always rotate-half).
    pub rows: QkRowOrder,
}

/// Row order of the q/k projections in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkRowOrder {
    /// llama.cpp's permutation for interleaved RoPE, undone at load (`weights::unpermute_rows`).
    /// Gemma 3: `AsStored` (NEOX order already).
    LlamaCppPermuted,
}

/// Which keys a layer's queries attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier position; decode policies (retrieval attention) apply here.
    /// Gemma 3: `SlidingWindow(512)` on local layers, where there is nothing to retrieve.
    Global,
}

/// Scale of the token embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedScale {
    /// Used as stored (Llama). Gemma 3: `SqrtDim`, multiplied by `sqrt(dim)`.
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_is_the_only_family_and_fills_every_layer_alike() {
        let a = Architecture::from_gguf_name("llama").expect("llama");
        assert_eq!(a.gguf_name(), "llama");
        assert!(matches!(
            Architecture::from_gguf_name("gemma3"),
            Err(ModelError::Architecture(name)) if name == "gemma3"
        ));
        let l0 = a.layer(0, 1e5);
        assert_eq!(l0, a.layer(29, 1e5));
        assert_eq!(l0.rope.base, 1e5);
        assert_eq!(l0.attention, AttentionKind::Global);
        assert_eq!(a.embed_scale(), EmbedScale::None);
    }
}
