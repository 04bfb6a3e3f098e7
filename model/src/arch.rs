//! The architecture seam: what a model family chooses per layer, read by [`Block`] and
//! [`Attention`] (and by the loaders) so that the forward pass is written once.
//!
//! Each choice is an enum whose variants are the families this driver runs: Llama (SmolLM2),
//! Gemma 3 and Qwen2 (Qwen2.5); `block.rs` has a `match` arm per variant.
//!
//! Qwen2 is Llama with a bias on the q, k and v projections ([`LayerSpec::qkv_bias`]), its q/k
//! rows stored in rotate-half order (llama.cpp's converter permutes only `llama` files), and its
//! own output head where the file has one (`output.weight`; tied to the embedding otherwise).
//!
//! Gemma 3 facts that its GGUF metadata does not hold (llama.cpp hard-codes them too): layer `l`
//! is global iff `l % 6 == 5`, the others attend a sliding window of
//! `gemma3.attention.sliding_window` keys (the query's own included); RoPE base
//! `gemma3.rope.freq_base` (1e6) on global layers and [`GEMMA3_LOCAL_ROPE_BASE`] on local ones.
//! The converter stored every RMSNorm weight as `1 + w`, so the norms are applied as stored.
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

/// RoPE base of Gemma 3's local (sliding-window) layers.
pub const GEMMA3_LOCAL_ROPE_BASE: f64 = 10_000.0;
/// Every `GEMMA3_GLOBAL_EVERY`-th layer of Gemma 3 (`l % 6 == 5`) attends globally.
pub const GEMMA3_GLOBAL_EVERY: usize = 6;

/// A model family (`general.architecture` in GGUF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama (SmolLM2): pre-norm blocks, SwiGLU, one RoPE base, global attention in every layer.
    Llama,
    /// Gemma 3: pre- and post-norms, per-head q/k RMSNorm, GeGLU, scaled embeddings, five local
    /// (sliding-window) layers per global one, each kind with its RoPE base.
    Gemma3,
    /// Qwen2 (Qwen2.5): Llama's block with biases on the q, k and v projections, q/k rows in
    /// rotate-half order, global attention in every layer.
    Qwen2,
}

impl Architecture {
    /// The family of a GGUF file's `general.architecture`.
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "gemma3" => Ok(Architecture::Gemma3),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(ModelError::Architecture(other.to_string())),
        }
    }

    /// The family's GGUF name, also the prefix of its metadata keys (`llama.block_count`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Gemma3 => "gemma3",
            Architecture::Qwen2 => "qwen2",
        }
    }

    /// Whether every layer attends every earlier position (no sliding window anywhere).
    pub fn all_global(self) -> bool {
        matches!(self, Architecture::Llama | Architecture::Qwen2)
    }

    /// What layer `layer` of a model with RoPE base `rope_base` and linear position scale
    /// `linear` (the file's base after any NTK scaling, and 1 unless linear scaling is on; both
    /// apply to the layers with the file's base only) and sliding window `window` (keys,
    /// Gemma 3) does.
    pub fn layer(self, layer: usize, (rope_base, linear): (f64, f64), window: usize) -> LayerSpec {
        match self {
            Architecture::Llama | Architecture::Qwen2 => {
                let qwen = self == Architecture::Qwen2;
                LayerSpec {
                    norms: NormPlacement::Pre,
                    qk_norm: QkNorm::None,
                    qkv_bias: qwen,
                    activation: Activation::SwiGlu,
                    rope: RopeSpec {
                        base: rope_base,
                        linear,
                        rows: if qwen {
                            QkRowOrder::AsStored
                        } else {
                            QkRowOrder::LlamaCppPermuted
                        },
                    },
                    attention: AttentionKind::Global,
                }
            }
            Architecture::Gemma3 => {
                let global = layer % GEMMA3_GLOBAL_EVERY == GEMMA3_GLOBAL_EVERY - 1;
                LayerSpec {
                    norms: NormPlacement::PrePost,
                    qk_norm: QkNorm::PerHead,
                    qkv_bias: false,
                    activation: Activation::GeGlu,
                    rope: RopeSpec {
                        base: if global {
                            rope_base
                        } else {
                            GEMMA3_LOCAL_ROPE_BASE
                        },
                        linear: if global { linear } else { 1.0 },
                        rows: QkRowOrder::AsStored,
                    },
                    attention: if global {
                        AttentionKind::Global
                    } else {
                        AttentionKind::SlidingWindow(window)
                    },
                }
            }
        }
    }

    /// How token embeddings are scaled before the first layer.
    pub fn embed_scale(self) -> EmbedScale {
        match self {
            Architecture::Llama | Architecture::Qwen2 => EmbedScale::None,
            Architecture::Gemma3 => EmbedScale::SqrtDim,
        }
    }
}

/// The choices of one transformer layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    pub norms: NormPlacement,
    pub qk_norm: QkNorm,
    /// Biases added to the q, k and v projections (Qwen2: `attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    pub activation: Activation,
    pub rope: RopeSpec,
    pub attention: AttentionKind,
}

/// Where the block's RMSNorms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention and before the MLP, on the residual stream's copy (Llama).
    Pre,
    /// [`NormPlacement::Pre`] and a further RMSNorm on the attention and MLP outputs before
    /// each residual add (Gemma 3: `post_attention_norm`, `post_ffw_norm`).
    PrePost,
}

/// Normalization of queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// None (Llama).
    None,
    /// An RMSNorm over each head's `head_dim` values, one weight shared by the heads
    /// (Gemma 3: `attn_q_norm`, `attn_k_norm`).
    PerHead,
}

/// The MLP's gated activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (Llama).
    SwiGlu,
    /// `gelu_tanh(gate) · up` (Gemma 3).
    GeGlu,
}

/// Rotary embedding of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// `theta` of the frequencies `theta^(-2i / head_dim)`. Gemma 3: 1e4 on local layers, 1e6
    /// on global ones.
    pub base: f64,
    /// Positions are divided by this before rotating (linear scaling, position interpolation;
    /// 1 as trained).
    pub linear: f64,
    /// How the file stores the q/k rows (the rotation itself is always rotate-half).
    pub rows: QkRowOrder,
}

/// Row order of the q/k projections in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkRowOrder {
    /// llama.cpp's permutation for interleaved RoPE, undone at load ([`gguf_row_of`]).
    LlamaCppPermuted,
    /// Rotate-half (NEOX) order already (Gemma 3, Qwen2).
    AsStored,
}

/// Which keys a layer's queries attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier position; decode policies (retrieval attention) apply here.
    Global,
    /// The last `w` positions, the query's own included (Gemma 3's local layers, `w` = 512):
    /// exact attention over the window, nothing to retrieve.
    SlidingWindow(usize),
}

impl AttentionKind {
    /// The window of a sliding-window layer; `None` for a global one.
    pub fn window(self) -> Option<usize> {
        match self {
            AttentionKind::Global => None,
            AttentionKind::SlidingWindow(w) => Some(w),
        }
    }
}

/// Scale of the token embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedScale {
    /// Used as stored (Llama).
    None,
    /// Multiplied by `sqrt(dim)` (Gemma 3).
    SqrtDim,
}

/// The GGUF row that holds Hugging Face row `row` under llama.cpp's q/k row permutation: in
/// each head of `head_dim` rows, GGUF row `2i + j` (`j ∈ {0, 1}`) is Hugging Face row
/// `j · head_dim/2 + i`.
pub fn gguf_row_of(row: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (h, r) = (row / head_dim, row % head_dim);
    h * head_dim + 2 * (r % half) + r / half
}

/// Undoes llama.cpp's q/k row permutation ([`gguf_row_of`]). `w` is row-major
/// `(n_heads · head_dim) × cols`.
pub fn unpermute_rows(w: &[f32], n_heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    (0..n_heads * head_dim)
        .flat_map(|r| {
            let src = gguf_row_of(r, head_dim) * cols;
            w[src..src + cols].iter().copied()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_fills_every_layer_alike() {
        let a = Architecture::from_gguf_name("llama").expect("llama");
        assert_eq!(a.gguf_name(), "llama");
        assert!(matches!(
            Architecture::from_gguf_name("mistral"),
            Err(ModelError::Architecture(name)) if name == "mistral"
        ));
        let l0 = a.layer(0, (1e5, 1.0), 0);
        assert_eq!(l0, a.layer(29, (1e5, 1.0), 0));
        assert_eq!(l0.rope.base, 1e5);
        assert_eq!(l0.attention, AttentionKind::Global);
        assert_eq!(a.embed_scale(), EmbedScale::None);
        assert!(a.all_global());
    }

    #[test]
    fn gemma3_has_five_local_layers_per_global_one_each_with_its_base() {
        let a = Architecture::from_gguf_name("gemma3").expect("gemma3");
        assert_eq!(a.gguf_name(), "gemma3");
        let global: Vec<usize> = (0..18)
            .filter(|&l| a.layer(l, (1e6, 1.0), 512).attention == AttentionKind::Global)
            .collect();
        assert_eq!(global, [5, 11, 17]);
        let (local, glob) = (a.layer(0, (1e6, 4.0), 512), a.layer(5, (1e6, 4.0), 512));
        assert_eq!(local.attention.window(), Some(512));
        assert_eq!(glob.attention.window(), None);
        assert_eq!(local.rope.base, GEMMA3_LOCAL_ROPE_BASE);
        assert_eq!(glob.rope.base, 1e6);
        // Linear scaling stretches the global layers only.
        assert_eq!((local.rope.linear, glob.rope.linear), (1.0, 4.0));
        assert_eq!(glob.norms, NormPlacement::PrePost);
        assert_eq!(glob.qk_norm, QkNorm::PerHead);
        assert_eq!(glob.activation, Activation::GeGlu);
        assert_eq!(glob.rope.rows, QkRowOrder::AsStored);
        assert_eq!(a.embed_scale(), EmbedScale::SqrtDim);
        assert!(!a.all_global());
    }
}
