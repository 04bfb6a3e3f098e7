//! The operations a device provides to the forward pass ([`Backend`]) and where the time of
//! forward passes goes ([`Timings`]). Where a model runs is `device.rs`'s [`ModelDevice`](crate::ModelDevice),
//! one floor up: a backend names no device and no model.
//!
//! `block.rs` writes the layer once over [`Backend`]; `cpu.rs` implements it with `ops.rs`, and
//! `cuda/` with the kernels of `kernels/llama.cu` and cuBLAS. Buffers are the device's own
//! (`Vec<f32>` on the CPU, device memory on a GPU), all f32 and row-major.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use super::cache::KvCache;
use super::config::Heads;
use super::error::Result;
use super::hooks::DecodeAttention;

/// The operations of one forward call (`rows` token rows at positions `pos0..`) on a device.
///
/// Shapes are passed explicitly; every buffer is row-major with one row per token. An
/// implementation may keep per-call state (the CUDA one holds the device mirror of the cache).
pub trait Backend {
    /// An activation buffer on the device.
    type Buf;
    /// A weight tensor on the device (`Linear` weights row-major `out × in`, norms `dim`).
    type Tensor;

    /// Whether host time around a linear layer is its run time ([`Part::Matmul`]); `false` for
    /// asynchronous devices, whose launches return at once: their time is counted in
    /// [`Part::Other`], where the queue is drained.
    const TIMES_MATMUL: bool;

    /// A zeroed buffer of `len` floats.
    fn alloc(&mut self, len: usize) -> Result<Self::Buf>;

    /// A buffer holding `x`.
    fn upload(&mut self, x: &[f32]) -> Result<Self::Buf>;

    /// `x` on the host (borrowed where it is there already).
    fn to_host<'x>(&mut self, x: &'x Self::Buf) -> Result<Cow<'x, [f32]>>;

    /// `out[r] = table[tokens[r]]` (`table`: `vocab × dim`; tokens checked by the caller).
    fn embed(
        &mut self,
        table: &Self::Tensor,
        tokens: &[u32],
        dim: usize,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// `out[r] = x[r] / rms(x[r]) · w` for `rows` rows of `dim`.
    fn rms_norm(
        &mut self,
        x: &Self::Buf,
        w: &Self::Tensor,
        rows_dim: (usize, usize),
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// [`Backend::rms_norm`] in place.
    fn rms_norm_in_place(
        &mut self,
        x: &mut Self::Buf,
        w: &Self::Tensor,
        rows_dim: (usize, usize),
        eps: f32,
    ) -> Result<()>;

    /// `y (rows × out) = x (rows × in) · wᵀ`, `w` row-major `out × in`.
    fn linear(
        &mut self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Tensor,
        out_in: (usize, usize),
        y: &mut Self::Buf,
    ) -> Result<()>;

    /// Rotate-half RoPE in place with table `table` (one per distinct base, see
    /// [`RopeTables`](super::rope::RopeTables)): `x` is `rows × (heads · head_dim)`, row `r` at
    /// position `pos0 + r`.
    fn rope(
        &mut self,
        x: &mut Self::Buf,
        rows_heads_dim: (usize, usize, usize),
        pos0: usize,
        table: usize,
    ) -> Result<()>;

    /// `gate = silu(gate) · up`, element-wise.
    fn swiglu(&mut self, gate: &mut Self::Buf, up: &Self::Buf) -> Result<()>;

    /// `gate = gelu_tanh(gate) · up`, element-wise (GeGLU).
    fn geglu(&mut self, gate: &mut Self::Buf, up: &Self::Buf) -> Result<()>;

    /// `x *= s`, element-wise.
    fn scale(&mut self, x: &mut Self::Buf, s: f32) -> Result<()>;

    /// `x[r] += bias` for each of `rows` rows of `dim` (`bias`: `dim` values): a projection's
    /// bias.
    fn add_rows(
        &mut self,
        x: &mut Self::Buf,
        bias: &Self::Tensor,
        rows_dim: (usize, usize),
    ) -> Result<()>;

    /// `x += h` (a residual connection).
    fn add(&mut self, x: &mut Self::Buf, h: &Self::Buf) -> Result<()>;

    /// Appends the keys and values of positions `pos0..` (`k`, `v`: `rows × (n_kv · hd)`) to
    /// `layer` of the cache, the device's and the canonical host `cache`; returns them on the
    /// host.
    #[allow(clippy::type_complexity)]
    fn append_kv<'x>(
        &mut self,
        layer: usize,
        k: &'x Self::Buf,
        v: &'x Self::Buf,
        cache: &mut KvCache,
        heads: Heads,
        pos0: usize,
    ) -> Result<(Cow<'x, [f32]>, Cow<'x, [f32]>)>;

    /// Causal attention of `rows` queries at positions `pos0..` over `layer`'s cached keys
    /// `0..pos0 + rows` (already appended): `out = softmax(q·kᵀ/√hd)·v` per query head. With
    /// `window = Some(w)` the query at `p` attends keys `p + 1 − w ..= p` only.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        layer: usize,
        q: &Self::Buf,
        cache: &KvCache,
        heads: Heads,
        rows_pos0: (usize, usize),
        window: Option<usize>,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// The attention of a decode step (one query at `pos`) computed by `policy` from the host
    /// query `q_host` and the host cache; a device may compute the policy's static part itself
    /// at the same time ([`DecodeAttention::attend_split`]). Writes `out`.
    #[allow(clippy::too_many_arguments)]
    fn policy_attention(
        &mut self,
        layer: usize,
        q: &Self::Buf,
        q_host: &[f32],
        cache: &KvCache,
        pos: usize,
        policy: &mut dyn DecodeAttention,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// Moves `x` to the host.
    fn download(&mut self, x: Self::Buf) -> Result<Vec<f32>>;
}

/// Where time went in forward passes (accumulated across calls).
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    /// Linear layers: q/k/v/o projections, MLP, output head.
    pub matmul: Duration,
    /// Attention of the global layers: scores, softmax, weighted values (a decode policy's whole
    /// step, its search included).
    pub attention: Duration,
    /// Attention of the sliding-window (local) layers.
    pub attention_local: Duration,
    /// Everything else: norms, RoPE, SwiGLU, embedding, cache copies.
    pub other: Duration,
}

impl Timings {
    pub fn total(&self) -> Duration {
        self.matmul + self.attention + self.attention_local + self.other
    }
}

/// A field of [`Timings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Matmul,
    Attention,
    AttentionLocal,
    Other,
}

/// Adds the host time since its last lap to a part of [`Timings`].
#[derive(Debug)]
pub struct Timer<'t> {
    timings: &'t mut Timings,
    last: Instant,
    times_matmul: bool,
}

impl<'t> Timer<'t> {
    /// A timer starting now; `times_matmul: false` counts [`Part::Matmul`] laps as
    /// [`Part::Other`] (see [`Backend::TIMES_MATMUL`]).
    pub fn new(timings: &'t mut Timings, times_matmul: bool) -> Self {
        Timer {
            timings,
            last: Instant::now(),
            times_matmul,
        }
    }

    /// Adds the time since the last lap to `part`.
    pub fn lap(&mut self, part: Part) {
        let now = Instant::now();
        let slot = match part {
            Part::Matmul if self.times_matmul => &mut self.timings.matmul,
            Part::Attention => &mut self.timings.attention,
            Part::AttentionLocal => &mut self.timings.attention_local,
            Part::Matmul | Part::Other => &mut self.timings.other,
        };
        *slot += now - self.last;
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_go_to_their_part_and_matmul_to_other_on_asynchronous_devices() {
        for times_matmul in [true, false] {
            let mut t = Timings::default();
            let mut timer = Timer::new(&mut t, times_matmul);
            for part in [
                Part::Matmul,
                Part::Attention,
                Part::AttentionLocal,
                Part::Other,
            ] {
                std::thread::sleep(Duration::from_millis(2));
                timer.lap(part);
            }
            assert!(t.attention >= Duration::from_millis(2));
            assert!(t.attention_local >= Duration::from_millis(2));
            if times_matmul {
                assert!(t.matmul >= Duration::from_millis(2));
                assert!(t.other >= Duration::from_millis(2));
            } else {
                assert_eq!(t.matmul, Duration::ZERO);
                assert!(t.other >= Duration::from_millis(4));
            }
        }
    }
}
