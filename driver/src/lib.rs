//! `qkindex-driver` library: the decode loop that runs the transformer of `qkindex-model` with
//! retrieval attention (the policies of `retrieval/`, plugged in through the model's
//! `DecodeAttention` hook), and the devices a run passes around. The `qkindex` binary's
//! subcommands use it; integration tests reach it here.

pub mod decode;
pub mod devices;
pub mod retrieval;
