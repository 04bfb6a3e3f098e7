//! `qkindex-driver` library: the Llama-family model (GGUF loading, tokenizer, CPU forward pass) that the `qkindex`
//! binary's subcommands use. Integration tests reach it here.

pub mod model;
