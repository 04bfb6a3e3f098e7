//! `qkindex-driver` library: the Llama-family model (GGUF loading, tokenizer, CPU forward pass) that the `qkindex`
//! binary's subcommands use, and retrieval attention for its decode steps. Integration tests reach it here.

pub mod decode;
pub mod knn;
pub mod model;
pub mod retrieval;
