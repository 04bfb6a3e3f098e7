//! Decoding under an attention policy: a prefill (exact attention, queries captured for index
//! builds), then one-token steps whose attention a [`Retrieval`] computes (or the exact scan for
//! `full`), with the per-token latency split into search / attention / rest.

use std::time::{Duration, Instant};

use crate::retrieval::{cache_keys, PolicyConfig, PolicyKind, Retrieval, RetrievalStats, Shape};
use qkindex_model::llama::PREFILL_CHUNK;
use qkindex_model::{CaptureFn, KvCache, LayerCapture, Llama, ModelError, Timings};

/// A prefilled sequence: its cache, its queries per layer (row-major
/// `n × (n_heads · head_dim)`, empty when not captured) and the logits of its last position.
#[derive(Debug, Clone)]
pub struct Prefill {
    pub cache: KvCache,
    pub q: Vec<Vec<f32>>,
    pub last_logits: Vec<f32>,
    pub seconds: f64,
}

/// Runs `tokens` from an empty cache with room for `capacity` positions; captures the queries
/// of every global layer when `capture_q` (sliding-window layers have no index to build).
pub fn prefill(
    llama: &Llama,
    tokens: &[u32],
    capacity: usize,
    capture_q: bool,
) -> Result<Prefill, ModelError> {
    prefill_with(llama, tokens, capacity, capture_q, |_| {})
}

/// [`prefill`] calling `progress(done)` with the positions prefilled so far after each call of
/// at most [`PREFILL_CHUNK`] tokens (a progress bar's ticks).
///
/// Memory: the hidden states of one chunk at a time (not `n × dim`), and the captured queries in
/// buffers of their final size (`n × n_heads × head_dim` floats per global layer, no doubling
/// while they grow).
pub fn prefill_with(
    llama: &Llama,
    tokens: &[u32],
    capacity: usize,
    capture_q: bool,
    mut progress: impl FnMut(usize),
) -> Result<Prefill, ModelError> {
    let t0 = Instant::now();
    let mut cache = llama.new_cache(capacity)?;
    let mut tm = Timings::default();
    let global: Vec<bool> = (0..llama.cfg.n_layers)
        .map(|l| llama.cfg.layer(l).attention.window().is_none())
        .collect();
    let mut q: Vec<Vec<f32>> = global
        .iter()
        .map(|&g| match g && capture_q {
            true => Vec::with_capacity(tokens.len() * llama.cfg.q_dim()),
            false => Vec::new(),
        })
        .collect();
    let mut cb = |c: LayerCapture<'_>| {
        if global[c.layer] {
            q[c.layer].extend_from_slice(c.q)
        }
    };
    // An empty prompt goes through once, for the forward pass's own error.
    let chunks: Vec<&[u32]> = match tokens.is_empty() {
        true => vec![tokens],
        false => tokens.chunks(PREFILL_CHUNK).collect(),
    };
    let mut hidden = Vec::new();
    for chunk in chunks {
        let capture: Option<&mut CaptureFn<'_>> = match capture_q {
            true => Some(&mut cb),
            false => None,
        };
        hidden = llama.forward(chunk, &mut cache, capture, &mut tm)?;
        progress(cache.len());
    }
    let last_logits = llama.last_logits(&hidden, &mut tm)?;
    Ok(Prefill {
        cache,
        q,
        last_logits,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Mean per-token latency of the decode steps, milliseconds, split the same way for every policy:
/// `total = search + attention + rest`, with `attention = attention_global + attention_local`
/// and `matmul` (the model's linear layers and LM head) part of `rest`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Latency {
    /// The selector's search (retrieval policies; 0 for `full`).
    pub search: f64,
    /// Attention of every layer: `attention_global + attention_local`.
    pub attention: f64,
    /// Attention of the global layers (a retrieval policy's attention over its selected keys).
    pub attention_global: f64,
    /// Attention of the sliding-window layers (Gemma 3's local layers; 0 for SmolLM2).
    pub attention_local: f64,
    /// The model's matrix products: projections, MLP, LM head (part of `rest`).
    pub matmul: f64,
    /// Everything but search and attention: matmuls, norms, RoPE, the policy's bookkeeping.
    pub rest: f64,
    /// Wall time of the step calls less the untimed measurement (recall against every key,
    /// observers): the latency a user sees.
    pub total: f64,
    /// Wall time of the step calls, measurement included: with `--no-measure` (no
    /// measurement) the same wall clock per token as a peer's timed loop
    /// (`benches/llama_cpp_peer.py`).
    pub wall: f64,
}

impl Latency {
    /// Every field of `self` plus `o`'s (to average over runs with [`Latency::scaled`]).
    pub fn plus(self, o: &Latency) -> Latency {
        Latency {
            search: self.search + o.search,
            attention: self.attention + o.attention,
            attention_global: self.attention_global + o.attention_global,
            attention_local: self.attention_local + o.attention_local,
            matmul: self.matmul + o.matmul,
            rest: self.rest + o.rest,
            total: self.total + o.total,
            wall: self.wall + o.wall,
        }
    }

    /// Every field times `f`.
    pub fn scaled(self, f: f64) -> Latency {
        Latency {
            search: self.search * f,
            attention: self.attention * f,
            attention_global: self.attention_global * f,
            attention_local: self.attention_local * f,
            matmul: self.matmul * f,
            rest: self.rest * f,
            total: self.total * f,
            wall: self.wall * f,
        }
    }
}

/// One sequence decoding under one policy.
#[derive(Debug)]
pub struct Decoder<'m> {
    llama: &'m Llama,
    cache: KvCache,
    retrieval: Option<Retrieval>,
    timings: Timings,
    wall: Duration,
    steps: u64,
}

impl<'m> Decoder<'m> {
    /// A decoder continuing `prefill` for up to `extra` more positions; builds the policy's
    /// indexes with their exact kNN on `knn` (`progress(done, total)` after each KV head).
    pub fn new(
        llama: &'m Llama,
        prefill: &Prefill,
        cfg: &PolicyConfig,
        extra: usize,
        knn: &dyn qkindex::KnnBackend,
        progress: impl FnMut(usize, usize) + Send,
    ) -> Result<Self, ModelError> {
        let capacity = (prefill.cache.len() + extra).min(llama.cfg.context_length);
        let cache = prefill.cache.with_capacity(capacity, llama.cfg.head_dim);
        Self::with_cache(llama, cache, &prefill.q, cfg, knn, progress)
    }

    /// [`Decoder::new`] on a cache it owns (a prefill's, with room for the decode steps:
    /// `KvCache::with_capacity`) and the prefill's queries `prefill_q` (as [`Prefill::q`];
    /// unread by `full`). A caller that needs the prefill's cache no more saves a copy of it
    /// (Gemma 3 at 131,072 positions: 0.8 GB).
    pub fn with_cache(
        llama: &'m Llama,
        cache: KvCache,
        prefill_q: &[Vec<f32>],
        cfg: &PolicyConfig,
        knn: &dyn qkindex::KnnBackend,
        mut progress: impl FnMut(usize, usize) + Send,
    ) -> Result<Self, ModelError> {
        let hd = llama.cfg.head_dim;
        let total = llama.cfg.n_layers * llama.cfg.n_kv_heads;
        let mut cfg = cfg.clone();
        cfg.local_layers = (0..llama.cfg.n_layers)
            .filter(|&l| llama.cfg.layer(l).attention.window().is_some())
            .collect();
        let retrieval = match cfg.kind {
            PolicyKind::Full => None,
            _ => Some(Retrieval::new(
                cfg,
                Shape::of(&llama.cfg),
                &cache_keys(&cache, hd),
                cache.len(),
                prefill_q,
                knn,
                {
                    let mut done = 0;
                    move |_, _| {
                        done += 1;
                        progress(done, total)
                    }
                },
            )?),
        };
        Ok(Decoder {
            llama,
            cache,
            retrieval,
            timings: Timings::default(),
            wall: Duration::ZERO,
            steps: 0,
        })
    }

    /// The cache: the prefill's positions, then those of the steps so far.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Feeds one token; returns the logits of the next.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, ModelError> {
        self.step_with(token, None)
    }

    /// [`Decoder::step`] that hands each layer's q/k/v of the token to `capture`.
    pub fn step_with(
        &mut self,
        token: u32,
        capture: Option<&mut CaptureFn<'_>>,
    ) -> Result<Vec<f32>, ModelError> {
        let t0 = Instant::now();
        let policy = self
            .retrieval
            .as_mut()
            .map(|r| r as &mut dyn qkindex_model::DecodeAttention);
        let hidden = self.llama.forward_with(
            &[token],
            &mut self.cache,
            capture,
            policy,
            &mut self.timings,
        )?;
        let logits = self.llama.last_logits(&hidden, &mut self.timings)?;
        self.wall += t0.elapsed();
        self.steps += 1;
        Ok(logits)
    }

    /// Positions in the cache.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The policy's state (None for `full`).
    pub fn retrieval(&self) -> Option<&Retrieval> {
        self.retrieval.as_ref()
    }

    /// The policy's state, to install an observer (None for `full`).
    pub fn retrieval_mut(&mut self) -> Option<&mut Retrieval> {
        self.retrieval.as_mut()
    }

    /// The policy's statistics (None for `full`).
    pub fn stats(&self) -> Option<&RetrievalStats> {
        self.retrieval.as_ref().map(|r| &r.stats)
    }

    /// Mean latency per step so far; the measurement pass of a policy is excluded.
    pub fn latency(&self) -> Latency {
        let per = |d: Duration| 1e3 * d.as_secs_f64() / self.steps.max(1) as f64;
        let (search, global, measure) = match &self.retrieval {
            Some(r) => (r.stats.search, r.stats.attention, r.stats.measure),
            None => (Duration::ZERO, self.timings.attention, Duration::ZERO),
        };
        let local = self.timings.attention_local;
        let total = self.wall.saturating_sub(measure);
        Latency {
            search: per(search),
            attention: per(global + local),
            attention_global: per(global),
            attention_local: per(local),
            matmul: per(self.timings.matmul),
            rest: per(total.saturating_sub(search + global + local)),
            total: per(total),
            wall: per(self.wall),
        }
    }
}

/// One decode step of several sequences at once ([`Llama::forward_batch`]): `tokens[i]` is
/// fed to `decoders[i]`; returns each one's logits of the next token, as [`Decoder::step`]
/// would. The decoders must share one model. The batch's time counts as a step of each
/// decoder (the latency each sequence sees); `timings` gets the batch's split.
pub fn step_batch(
    decoders: &mut [Decoder<'_>],
    tokens: &[u32],
    timings: &mut Timings,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let Some(first) = decoders.first() else {
        return Ok(Vec::new());
    };
    let llama = first.llama;
    if decoders.iter().any(|d| !std::ptr::eq(d.llama, llama)) {
        return Err(ModelError::InvalidParam {
            name: "batch",
            value: format!("{} decoders", decoders.len()),
            reason: "the decoders of a batch must share one model",
        });
    }
    let t0 = Instant::now();
    let (caches, policies): (Vec<_>, Vec<_>) = decoders
        .iter_mut()
        .map(|d| {
            let policy = d
                .retrieval
                .as_mut()
                .map(|r| r as &mut dyn qkindex_model::DecodeAttention);
            (&mut d.cache, policy)
        })
        .unzip();
    let hidden = llama.forward_batch(tokens, caches, policies, timings)?;
    let logits = llama.logits_batch(&hidden, timings)?;
    let wall = t0.elapsed();
    for d in decoders.iter_mut() {
        d.wall += wall;
        d.steps += 1;
    }
    Ok(logits
        .chunks_exact(llama.cfg.vocab_size)
        .map(<[f32]>::to_vec)
        .collect())
}

/// `log softmax` of logits, in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&l| l as f64 - lse).collect()
}
