//! `qkindex-driver` library: the model (GGUF loading, tokenizer, one forward pass over CPU or CUDA
//! operations) that the `qkindex` binary's subcommands use, the devices a run passes around, and
//! retrieval attention for its decode steps. Integration tests reach it here.

pub mod decode;
pub mod devices;
pub mod model;
pub mod retrieval;
