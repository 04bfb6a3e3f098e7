//! The Llama-family forward pass on CPU, f32: token embedding (tied with the output head), per layer
//! RMSNorm → grouped-query attention with RoPE and a KV cache → residual → RMSNorm → SwiGLU MLP →
//! residual, then the final RMSNorm and the logits.
//!
//! Weights are dequantized once at load (`weights.rs`); q/k projection rows are already in the
//! Hugging Face rotate-half order there, so the q and k seen by [`LayerCapture`] are what a PyTorch
//! `LlamaAttention` hook sees after `apply_rotary_pos_emb`.

use std::time::{Duration, Instant};

use super::error::{ModelError, Result};
use super::ops::{self, AttnShape, Rope};
use super::weights::{Config, Weights};

/// Where time went in forward passes (accumulated across calls).
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    /// Linear layers: q/k/v/o projections, MLP, output head.
    pub matmul: Duration,
    /// Attention: scores, softmax, weighted values.
    pub attention: Duration,
    /// Everything else: norms, RoPE, SwiGLU, embedding, cache copies.
    pub other: Duration,
}

impl Timings {
    pub fn total(&self) -> Duration {
        self.matmul + self.attention + self.other
    }
}

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

/// Attention of a decode step computed by a policy (retrieval attention) instead of the exact
/// scan over the whole cache. Called once per layer for forward calls of one token.
pub trait DecodeAttention {
    /// `q`: the `n_heads · head_dim` query values of position `pos` (post-RoPE); `k`, `v`: the
    /// layer's cache, `n_kv_heads` blocks of row-major `capacity × head_dim`, positions `0..=pos`
    /// filled (the current token's key included). Writes `out` (`n_heads · head_dim`).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        layer: usize,
        pos: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        capacity: usize,
        out: &mut [f32],
    ) -> Result<()>;

    /// The positions of this layer's decode attention that another device may attend while the
    /// policy searches: `0..sink` and `rest_end..=pos`, as `(sink, rest_end)`. `None` (the
    /// default): the policy attends everything itself in [`DecodeAttention::attend`].
    fn static_set(&self, _layer: usize, _pos: usize) -> Option<(usize, usize)> {
        None
    }

    /// [`DecodeAttention::attend`] where the part over [`DecodeAttention::static_set`] comes from
    /// `static_part` (computed elsewhere, e.g. on a GPU). The policy calls it once, after its own
    /// search, so that both run at the same time.
    #[allow(clippy::too_many_arguments)]
    fn attend_split(
        &mut self,
        layer: usize,
        pos: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        capacity: usize,
        _static_part: &mut StaticPartFn<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        self.attend(layer, pos, q, k, v, capacity, out)
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

/// The KV cache of a sequence: per layer, `n_kv_heads` blocks of row-major `capacity × head_dim`
/// keys (post-RoPE) and values.
///
/// This host copy is the canonical cache on every backend (policies and captures read it); a GPU
/// backend mirrors it on the device and tells caches apart by [`KvCache::id`], which every new
/// cache and every clone gets afresh.
#[derive(Debug)]
pub struct KvCache {
    id: u64,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

fn next_cache_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Clone for KvCache {
    fn clone(&self) -> Self {
        KvCache {
            id: next_cache_id(),
            capacity: self.capacity,
            len: self.len,
            k: self.k.clone(),
            v: self.v.clone(),
        }
    }
}

impl KvCache {
    /// A cache of `n_layers` layers, `n_kv_heads` heads, room for `capacity` positions, empty.
    pub(crate) fn zeroed(n_layers: usize, n_kv_heads: usize, capacity: usize, hd: usize) -> Self {
        let per_layer = n_kv_heads * capacity * hd;
        KvCache {
            id: next_cache_id(),
            capacity,
            len: 0,
            k: (0..n_layers).map(|_| vec![0f32; per_layer]).collect(),
            v: (0..n_layers).map(|_| vec![0f32; per_layer]).collect(),
        }
    }

    /// Identity of this cache's contents (new for every cache and every clone).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Keys and values of `layer`, all heads (`n_kv_heads` blocks of `capacity × head_dim`).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    /// Mutable keys and values of `layer`.
    pub(crate) fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.k[layer], &mut self.v[layer])
    }

    /// Sets the number of filled positions (after a backend wrote them).
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// Number of positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys of `layer` and KV head `g` at positions `0..len()`, row-major.
    pub fn keys(&self, layer: usize, g: usize, head_dim: usize) -> &[f32] {
        let base = g * self.capacity * head_dim;
        &self.k[layer][base..base + self.len * head_dim]
    }

    /// Values of `layer` and KV head `g` at positions `0..len()`, row-major.
    pub fn values(&self, layer: usize, g: usize, head_dim: usize) -> &[f32] {
        let base = g * self.capacity * head_dim;
        &self.v[layer][base..base + self.len * head_dim]
    }

    /// A copy with room for `capacity` positions (at least `len()`).
    pub fn with_capacity(&self, capacity: usize, head_dim: usize) -> KvCache {
        let capacity = capacity.max(self.len);
        let regrow = |blocks: &Vec<Vec<f32>>| -> Vec<Vec<f32>> {
            blocks
                .iter()
                .map(|layer| {
                    let groups = layer.len() / (self.capacity * head_dim).max(1);
                    let mut out = vec![0f32; groups * capacity * head_dim];
                    for g in 0..groups {
                        let src = g * self.capacity * head_dim;
                        let dst = g * capacity * head_dim;
                        let len = self.len * head_dim;
                        out[dst..dst + len].copy_from_slice(&layer[src..src + len]);
                    }
                    out
                })
                .collect()
        };
        KvCache {
            id: next_cache_id(),
            capacity,
            len: self.len,
            k: regrow(&self.k),
            v: regrow(&self.v),
        }
    }
}

/// A loaded model: configuration, f32 weights and RoPE tables, and the backend that runs its
/// forward passes ([`Backend`]; the CPU code below when none is attached).
#[derive(Debug)]
pub struct Llama {
    pub cfg: Config,
    w: Weights,
    rope: Rope,
    backend: Option<Box<dyn Backend>>,
}

/// A device that runs [`Llama`]'s forward passes instead of the CPU code (the CUDA backend). It
/// gets the model (configuration, host weights, RoPE tables) with every call and keeps whatever
/// it uploaded; the host [`KvCache`] stays canonical.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// A short name for logs: "cuda:0 (NVIDIA H200)".
    fn name(&self) -> String;

    /// [`Llama::forward_with`] on this device.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        model: &Llama,
        tokens: &[u32],
        cache: &mut KvCache,
        capture: Option<&mut CaptureFn<'_>>,
        policy: Option<&mut dyn DecodeAttention>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>>;

    /// [`Llama::logits`] on this device.
    fn logits(&self, model: &Llama, hidden: &[f32], timings: &mut Timings) -> Result<Vec<f32>>;

    /// Counters of the backend (time split, uploads), as JSON.
    fn stats(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

impl Llama {
    pub fn new(cfg: Config, w: Weights) -> Self {
        let rope = Rope::new(cfg.head_dim, cfg.rope_theta, cfg.context_length);
        Self {
            cfg,
            w,
            rope,
            backend: None,
        }
    }

    /// Runs forward passes on `backend` from now on (`None`: the CPU).
    pub fn set_backend(&mut self, backend: Option<Box<dyn Backend>>) {
        self.backend = backend;
    }

    /// The backend's name, "cpu" without one.
    pub fn backend_name(&self) -> String {
        self.backend
            .as_ref()
            .map_or_else(|| "cpu".to_string(), |b| b.name())
    }

    /// The backend's counters (`null` on the CPU).
    pub fn backend_stats(&self) -> serde_json::Value {
        self.backend
            .as_ref()
            .map_or(serde_json::Value::Null, |b| b.stats())
    }

    /// The host weights (what a device backend uploads).
    pub fn weights(&self) -> &Weights {
        &self.w
    }

    /// RoPE tables: `cos`, `sin`, each `max_pos × head_dim/2`.
    pub fn rope_tables(&self) -> (&[f32], &[f32]) {
        self.rope.tables()
    }

    /// An empty cache for up to `capacity` positions (at most the context length).
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        if capacity > self.cfg.context_length {
            return Err(ModelError::ContextOverflow {
                got: capacity,
                max: self.cfg.context_length,
            });
        }
        Ok(KvCache::zeroed(
            self.cfg.n_layers,
            self.cfg.n_kv_heads,
            capacity,
            self.cfg.head_dim,
        ))
    }

    /// Runs `tokens` at positions `cache.len()..` (a prefill when many, a decode step when one),
    /// appends their keys/values to the cache, calls `capture` per layer, and returns the final
    /// normed hidden states, row-major `tokens.len() × dim` (feed them to [`Llama::logits`]).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        capture: Option<&mut CaptureFn<'_>>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        self.forward_with(tokens, cache, capture, None, timings)
    }

    /// [`Llama::forward`] where a one-token call (a decode step) takes its attention from
    /// `policy` when given (prefills always attend exactly).
    pub fn forward_with(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        capture: Option<&mut CaptureFn<'_>>,
        policy: Option<&mut dyn DecodeAttention>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        self.check_call(tokens, cache)?;
        match &self.backend {
            Some(b) => b.forward(self, tokens, cache, capture, policy, timings),
            None => self.forward_cpu(tokens, cache, capture, policy, timings),
        }
    }

    /// Rejects calls that overflow the cache or hold token ids beyond the vocabulary.
    fn check_call(&self, tokens: &[u32], cache: &KvCache) -> Result<()> {
        if cache.len + tokens.len() > cache.capacity {
            return Err(ModelError::ContextOverflow {
                got: cache.len + tokens.len(),
                max: cache.capacity,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(ModelError::TokenId {
                id: bad.into(),
                vocab: self.cfg.vocab_size,
            });
        }
        Ok(())
    }

    /// The CPU forward pass (the reference every backend is checked against).
    pub fn forward_cpu(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mut capture: Option<&mut CaptureFn<'_>>,
        mut policy: Option<&mut dyn DecodeAttention>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        self.check_call(tokens, cache)?;
        let c = &self.cfg;
        let n = tokens.len();
        let pos0 = cache.len;
        let (dim, hd) = (c.dim, c.head_dim);
        let q_dim = c.n_heads * hd;
        let kv_dim = c.n_kv_heads * hd;
        let mut t0 = Instant::now();
        let lap = |slot: &mut Duration, t0: &mut Instant| {
            let now = Instant::now();
            *slot += now - *t0;
            *t0 = now;
        };

        let mut x = vec![0f32; n * dim];
        for (row, &t) in x.chunks_exact_mut(dim).zip(tokens) {
            row.copy_from_slice(&self.w.embed[t as usize * dim..(t as usize + 1) * dim]);
        }
        let mut h = vec![0f32; n * dim];
        let mut q = vec![0f32; n * q_dim];
        let mut k = vec![0f32; n * kv_dim];
        let mut v = vec![0f32; n * kv_dim];
        let mut att = vec![0f32; n * q_dim];
        let mut gate = vec![0f32; n * c.ffn_dim];
        let mut up = vec![0f32; n * c.ffn_dim];
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            capacity: cache.capacity,
        };
        lap(&mut timings.other, &mut t0);

        for (li, l) in self.w.layers.iter().enumerate() {
            h.copy_from_slice(&x);
            ops::rms_norm(&mut h, &l.attn_norm, c.rms_eps);
            lap(&mut timings.other, &mut t0);
            ops::linear(&h, n, &l.wq, q_dim, dim, &mut q);
            ops::linear(&h, n, &l.wk, kv_dim, dim, &mut k);
            ops::linear(&h, n, &l.wv, kv_dim, dim, &mut v);
            lap(&mut timings.matmul, &mut t0);
            self.rope.apply(&mut q, c.n_heads, pos0);
            self.rope.apply(&mut k, c.n_kv_heads, pos0);
            let (kc, vc) = (&mut cache.k[li], &mut cache.v[li]);
            for r in 0..n {
                for g in 0..c.n_kv_heads {
                    let dst = (g * cache.capacity + pos0 + r) * hd;
                    let src = r * kv_dim + g * hd;
                    kc[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                    vc[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
                }
            }
            if let Some(cb) = capture.as_deref_mut() {
                cb(LayerCapture {
                    layer: li,
                    pos0,
                    n,
                    q: &q,
                    k: &k,
                    v: &v,
                });
            }
            lap(&mut timings.other, &mut t0);
            match policy.as_deref_mut() {
                Some(p) if n == 1 => p.attend(li, pos0, &q, kc, vc, cache.capacity, &mut att)?,
                _ => ops::attention(&q, kc, vc, shape, pos0, n, &mut att),
            }
            lap(&mut timings.attention, &mut t0);
            ops::linear(&att, n, &l.wo, dim, q_dim, &mut h);
            lap(&mut timings.matmul, &mut t0);
            for (xv, hv) in x.iter_mut().zip(&h) {
                *xv += hv;
            }
            h.copy_from_slice(&x);
            ops::rms_norm(&mut h, &l.ffn_norm, c.rms_eps);
            lap(&mut timings.other, &mut t0);
            ops::linear(&h, n, &l.w_gate, c.ffn_dim, dim, &mut gate);
            ops::linear(&h, n, &l.w_up, c.ffn_dim, dim, &mut up);
            lap(&mut timings.matmul, &mut t0);
            ops::swiglu(&mut gate, &up);
            lap(&mut timings.other, &mut t0);
            ops::linear(&gate, n, &l.w_down, dim, c.ffn_dim, &mut h);
            lap(&mut timings.matmul, &mut t0);
            for (xv, hv) in x.iter_mut().zip(&h) {
                *xv += hv;
            }
        }
        cache.len = pos0 + n;
        ops::rms_norm(&mut x, &self.w.out_norm, c.rms_eps);
        lap(&mut timings.other, &mut t0);
        Ok(x)
    }

    /// Logits of normed hidden rows (row-major `rows × dim`), row-major `rows × vocab_size`; the
    /// output head is the token embedding (tied weights).
    pub fn logits(&self, hidden: &[f32], timings: &mut Timings) -> Result<Vec<f32>> {
        match &self.backend {
            Some(b) => b.logits(self, hidden, timings),
            None => Ok(self.logits_cpu(hidden, timings)),
        }
    }

    /// [`Llama::logits`] on the CPU.
    pub fn logits_cpu(&self, hidden: &[f32], timings: &mut Timings) -> Vec<f32> {
        let t0 = Instant::now();
        let rows = hidden.len() / self.cfg.dim;
        let mut out = vec![0f32; rows * self.cfg.vocab_size];
        ops::linear(
            hidden,
            rows,
            &self.w.embed,
            self.cfg.vocab_size,
            self.cfg.dim,
            &mut out,
        );
        timings.matmul += t0.elapsed();
        out
    }

    /// Logits of the last row of `hidden` only.
    pub fn last_logits(&self, hidden: &[f32], timings: &mut Timings) -> Result<Vec<f32>> {
        let dim = self.cfg.dim;
        let start = hidden.len().saturating_sub(dim);
        self.logits(&hidden[start..], timings)
    }
}

/// Index of the largest logit, skipping ids for which `skip(id)` holds (e.g. control tokens).
/// Returns 0 when every id is skipped or `logits` is empty.
pub fn argmax(logits: &[f32], skip: impl Fn(u32) -> bool) -> u32 {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > best.1 && !skip(i as u32) {
            best = (i as u32, l);
        }
    }
    best.0
}
