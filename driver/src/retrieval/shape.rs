//! The attention shape a retrieval policy serves (the lowest floor of `retrieval/` with `ids.rs`:
//! selectors, builds and the step all take it).

use qkindex_model::Config;

/// The attention shape a [`Retrieval`](super::Retrieval) serves.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl Shape {
    pub fn of(c: &Config) -> Self {
        Shape {
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        }
    }
}
