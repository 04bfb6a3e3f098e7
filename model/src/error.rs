//! Typed errors of the model code. Every failure on user input or file bytes ends here, never in a
//! panic: the binary adds context with `anyhow` and prints the message.

use std::path::PathBuf;

/// Errors of loading a GGUF model, tokenizing and running the forward pass.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be opened, mapped or read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The model file is not where we looked; says how to get it.
    #[error("model file not found at {path}; run scripts/get-model.sh or pass --model PATH")]
    ModelNotFound { path: PathBuf },
    /// The file's sha256 is not the expected one (a partial download or another file).
    #[error("{path}: sha256 is {got}, expected {expected} (re-run scripts/get-model.sh)")]
    Checksum {
        path: PathBuf,
        expected: String,
        got: String,
    },
    /// The bytes are not a valid GGUF file (truncated, bad magic, out-of-bounds offsets...).
    #[error("{path}: not a valid GGUF file: {reason}")]
    Format { path: PathBuf, reason: String },
    /// A tensor uses a ggml type this crate cannot dequantize.
    #[error("tensor {tensor}: unsupported ggml type {type_name} (id {type_id}); supported: F32, F16, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K")]
    UnsupportedType {
        tensor: String,
        type_id: u32,
        type_name: &'static str,
    },
    /// A metadata key the model needs is absent or has the wrong type.
    #[error("metadata key {key}: {reason}")]
    Metadata { key: String, reason: String },
    /// A tensor is absent or has an unexpected shape.
    #[error("tensor {tensor}: {reason}")]
    Tensor { tensor: String, reason: String },
    /// The architecture is not one this forward pass implements.
    #[error("unsupported architecture {0:?} (supported: llama, gemma3)")]
    Architecture(String),
    /// Building or running the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The input does not fit the model's context.
    #[error("sequence of {got} tokens exceeds the context of {max} tokens")]
    ContextOverflow { got: usize, max: usize },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenId { id: i64, vocab: usize },
    /// A parameter out of its valid range.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidParam {
        name: &'static str,
        value: String,
        reason: &'static str,
    },
    /// A decode attention policy failed (its index rejected an input, ...).
    #[error("attention policy: {0}")]
    Policy(#[from] qkindex::Error),
    /// The GPU backend is unavailable or a GPU call failed (the error says which and why).
    #[error("GPU backend: {0}")]
    Device(#[from] qkindex_gpu::GpuError),
    /// The GPU backend refuses a call: a model or an operation it has no kernels for
    /// (`--device cpu` runs them), or a call its state cannot serve (the message says which).
    #[error("GPU backend: {0}")]
    DeviceState(String),
}

/// Shorthand for results of the model code.
pub type Result<T> = std::result::Result<T, ModelError>;
