//! What callers plug into a forward pass: a per-layer capture of q/k/v, and decode-attention
//! policies (retrieval attention) with the static-part split of the CUDA backend.

use super::error::Result;

/// The per-layer activations handed to a capture callback, for positions `pos0..pos0 + n`.
/// All row-major with one row per position: `q` is `n × (n_heads · head_dim)` (post-RoPE), `k` and
/// `v` are `n × (n_kv_heads · head_dim)` (k post-RoPE).
#[derive(Debug)]
pub struct LayerCapture<'a> {
    pub layer: usize,
    pub pos0: usize,
    pub n: usize,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// A capture callback; called once per layer and forward call.
pub type CaptureFn<'a> = dyn FnMut(LayerCapture<'_>) + 'a;

/// One layer's decode-step inputs, as a forward pass hands them to a [`DecodeAttention`]
/// policy: `q` is the `n_heads · head_dim` query of position `pos` (post-RoPE); `k`, `v` are the
/// layer's cache, `n_kv_heads` blocks of row-major `capacity × head_dim`, positions `0..=pos`
/// filled (the current token's key included).
#[derive(Debug, Clone, Copy)]
pub struct DecodeStep<'a> {
    pub layer: usize,
    pub pos: usize,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub capacity: usize,
}

/// Attention of a decode step computed by a policy (retrieval attention) instead of the exact
/// scan over the whole cache. Called once per layer for forward calls of one token.
pub trait DecodeAttention {
    /// Attends `step`'s query over its cache; writes `out` (`n_heads · head_dim`).
    fn attend(&mut self, step: DecodeStep<'_>, out: &mut [f32]) -> Result<()>;

    /// The positions of this layer's decode attention that another device may attend while the
    /// policy searches: `0..sink` and `rest_end..=pos`, as `(sink, rest_end)`. `None` (the
    /// default): the policy attends everything itself in [`DecodeAttention::attend`].
    fn static_set(&self, _layer: usize, _pos: usize) -> Option<(usize, usize)> {
        None
    }

    /// [`DecodeAttention::attend`] where the part over [`DecodeAttention::static_set`] comes from
    /// `static_part` (computed elsewhere, e.g. on a GPU). The policy calls it once, after its own
    /// search, so that both run at the same time.
    fn attend_split(
        &mut self,
        step: DecodeStep<'_>,
        _static_part: &mut StaticPartFn<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        self.attend(step, out)
    }
}

/// Online-softmax parts of every query head over a layer's static positions (DESIGN.md §2):
/// `max[h]`, `sum[h]` and the unnormalized `o[h · head_dim ..]`.
#[derive(Debug, Clone, Default)]
pub struct StaticParts {
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
    pub o: Vec<f32>,
}

/// Supplies the static parts of a decode step (blocking until they are ready).
pub type StaticPartFn<'a> = dyn FnMut() -> Result<StaticParts> + 'a;
