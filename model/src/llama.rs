//! The model: configuration, weights, RoPE tables and the device its forward passes run on. The
//! forward pass is the embedding, the layer loop over [`Block`]s and the final norm, written once
//! over [`Backend`]; the CPU runs it here, a CUDA device in `cuda/` (with its own upload of the
//! weights).
//!
//! Weights are read once at load (`weights.rs`: matrices in their GGUF blocks); q/k projection rows are already in the
//! Hugging Face rotate-half order there, so the q and k seen by [`LayerCapture`] are what a PyTorch
//! `LlamaAttention` hook sees after `apply_rotary_pos_emb`.
//!
//! [`Block`]: super::block::Block
//! [`LayerCapture`]: super::hooks::LayerCapture

use std::time::Instant;

use super::arch::EmbedScale;
use super::backend::{Backend, Part, Timer, Timings};
use super::block::{Activations, Lane, Pass, Step};
use super::cache::{KvCache, KvDtype};
use super::config::{Config, RopeScaling};
use super::cpu::CpuBackend;
use super::cuda::DeviceModel;
use super::device::ModelDevice;
use super::error::{ModelError, Result};
use super::hooks::{CaptureFn, DecodeAttention};
use super::rope::RopeTables;
use super::weights::Weights;

/// Rows of one forward call: longer prefills run in calls of this many tokens, which bounds the
/// activations (`rows × ffn_dim` floats and the like) whatever the prompt's length.
pub const PREFILL_CHUNK: usize = 2048;

/// A loaded model: configuration, weights and RoPE tables, and the device that runs its
/// forward passes ([`ModelDevice`]; the CPU unless set otherwise).
#[derive(Debug)]
pub struct Llama {
    pub cfg: Config,
    w: Weights,
    ropes: RopeTables,
    device: ModelDevice,
    kv_dtype: KvDtype,
}

impl Llama {
    /// A model of `cfg` with weights `w`, on the CPU.
    pub fn new(cfg: Config, w: Weights) -> Self {
        let ropes = RopeTables::new(&cfg);
        Self {
            cfg,
            w,
            ropes,
            device: ModelDevice::Cpu,
            kv_dtype: KvDtype::F32,
        }
    }

    /// The same model with its RoPE scaled ([`Config::with_rope_scaling`]); its RoPE tables
    /// are rebuilt for the longer context.
    pub fn with_rope_scaling(self, scaling: RopeScaling) -> Result<Self> {
        let cfg = self.cfg.clone().with_rope_scaling(scaling)?;
        let ropes = RopeTables::new(&cfg);
        Ok(Self { cfg, ropes, ..self })
    }

    /// Runs forward passes on `device` from now on.
    pub fn set_device(&mut self, device: ModelDevice) {
        self.device = device;
    }

    /// Has new caches keep their keys and values for exact attention in `dtype` on the CPU
    /// ([`KvDtype`]; the default is f32, a device backend keeps its own copy).
    pub fn set_kv_dtype(&mut self, dtype: KvDtype) {
        self.kv_dtype = dtype;
    }

    /// The type of new caches' exact attention ([`Llama::set_kv_dtype`]).
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// The device's name: "cpu", "cuda:0 (NVIDIA H200)".
    pub fn device_name(&self) -> String {
        self.device.name()
    }

    /// The device's counters (`null` on the CPU).
    pub fn device_stats(&self) -> serde_json::Value {
        self.device.stats()
    }

    /// The host weights (what a device backend uploads).
    pub fn weights(&self) -> &Weights {
        &self.w
    }

    /// The RoPE tables (what a device backend uploads).
    pub fn ropes(&self) -> &RopeTables {
        &self.ropes
    }

    /// What a device backend is handed of this model: configuration, weights, RoPE tables.
    fn device_model(&self) -> DeviceModel<'_> {
        DeviceModel {
            cfg: &self.cfg,
            weights: &self.w,
            ropes: self.ropes.tables(),
        }
    }

    /// An empty cache for up to `capacity` positions (at most the context length).
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        if capacity > self.cfg.context_length {
            return Err(ModelError::ContextOverflow {
                got: capacity,
                max: self.cfg.context_length,
            });
        }
        // On the CPU, sliding-window layers keep only their window (the prefill of 131,072
        // positions fits 8 GB, docs/bench/long/README.md); GPU backends mirror whole caches.
        let windows: Vec<Option<usize>> = match self.device {
            ModelDevice::Cpu => (0..self.cfg.n_layers)
                .map(|l| self.cfg.layer(l).attention.window())
                .collect(),
            ModelDevice::Cuda(_) => vec![None; self.cfg.n_layers],
        };
        let cache = KvCache::windowed(
            &windows,
            self.cfg.n_kv_heads,
            capacity,
            self.cfg.head_dim,
            PREFILL_CHUNK,
        );
        Ok(match (self.kv_dtype, &self.device) {
            (KvDtype::F16, ModelDevice::Cpu) => cache.with_f16_copy(),
            _ => cache,
        })
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
    /// `policy` when given (prefills always attend exactly). Calls of more than
    /// [`PREFILL_CHUNK`] tokens run as consecutive calls of at most that many.
    pub fn forward_with(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        capture: Option<&mut CaptureFn<'_>>,
        policy: Option<&mut dyn DecodeAttention>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        self.check_call(tokens, cache)?;
        if tokens.len() <= PREFILL_CHUNK {
            return self.forward_call(tokens, cache, capture, policy, timings);
        }
        // A long prefill in chunks: each is an ordinary forward call on the cache so far, so
        // activations stay bounded by PREFILL_CHUNK rows whatever the length.
        let mut capture = capture;
        let mut hidden = Vec::with_capacity(tokens.len() * self.cfg.dim);
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let cb = capture.as_deref_mut();
            hidden.extend(self.forward_call(chunk, cache, cb, None, timings)?);
        }
        Ok(hidden)
    }

    /// One forward call of a checked `tokens` on the model's device.
    fn forward_call(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        capture: Option<&mut CaptureFn<'_>>,
        policy: Option<&mut dyn DecodeAttention>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        let pass = Pass {
            tokens,
            cache,
            capture,
            policy: policy.map(|p| p as &mut dyn DecodeAttention),
            timings,
        };
        match &self.device {
            ModelDevice::Cpu => {
                let mut cpu = CpuBackend::new(self.ropes.tables());
                self.forward_on(&mut cpu, &self.w, pass)
            }
            ModelDevice::Cuda(cuda) => cuda.forward(self.device_model(), pass, |call, w, pass| {
                self.forward_on(call, w, pass)
            }),
        }
    }

    /// Rejects calls that overflow the cache or hold token ids beyond the vocabulary.
    fn check_call(&self, tokens: &[u32], cache: &KvCache) -> Result<()> {
        if cache.len() + tokens.len() > cache.capacity() {
            return Err(ModelError::ContextOverflow {
                got: cache.len() + tokens.len(),
                max: cache.capacity(),
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

    /// The forward pass on backend `b` with its copy `w` of the weights (a checked call).
    pub(crate) fn forward_on<B: Backend>(
        &self,
        b: &mut B,
        w: &Weights<B::Tensor>,
        pass: Pass<'_, '_>,
    ) -> Result<Vec<f32>> {
        let Pass {
            tokens,
            cache,
            capture,
            policy,
            timings,
        } = pass;
        let lane = Lane {
            cache,
            // A shorter-lived trait object for the layers (`&mut dyn` is invariant).
            policy: policy.map(|p| p as &mut dyn DecodeAttention),
            rows: tokens.len(),
        };
        self.forward_lanes_on(b, w, tokens, vec![lane], capture, timings)
    }

    /// The forward pass of `lanes` (their rows of `tokens` in order) on backend `b`.
    fn forward_lanes_on<B: Backend>(
        &self,
        b: &mut B,
        w: &Weights<B::Tensor>,
        tokens: &[u32],
        lanes: Vec<Lane<'_>>,
        capture: Option<&mut CaptureFn<'_>>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let rows = tokens.len();
        let mut timer = Timer::new(timings, B::TIMES_MATMUL);
        let mut a = Activations::new(b, c, rows)?;
        b.embed(&w.embed, tokens, c.dim, &mut a.x)?;
        match c.arch.embed_scale() {
            EmbedScale::None => {}
            EmbedScale::SqrtDim => b.scale(&mut a.x, (c.dim as f32).sqrt())?,
        }
        timer.lap(Part::Other);
        let mut s = Step {
            cfg: c,
            rows,
            lanes,
            capture,
            timer,
        };
        for (layer, block) in w.blocks.iter().enumerate() {
            block.forward(b, (layer, self.ropes.of_layer(layer)), &mut a, &mut s)?;
        }
        b.rms_norm_in_place(&mut a.x, &w.out_norm, (rows, c.dim), c.rms_eps)?;
        let hidden = b.download(a.x)?;
        for lane in s.lanes.iter_mut() {
            let len = lane.cache.len() + lane.rows;
            lane.cache.set_len(len);
        }
        s.timer.lap(Part::Other);
        Ok(hidden)
    }

    /// One decode step of several sequences at once: `tokens[i]` at position `caches[i].len()`
    /// of sequence `i`, its decode attention from `policies[i]` where given (exact otherwise).
    /// Returns the normed hidden rows, row-major `n × dim`, row `i` sequence `i`'s.
    ///
    /// On the CPU the projections, the MLP and the LM head run on all rows at once, reading
    /// each weight once for the batch; RoPE, the caches and attention run per sequence. Each
    /// row equals what [`Llama::forward_with`] gives that sequence alone. A device backend runs
    /// one call per sequence.
    pub fn forward_batch(
        &self,
        tokens: &[u32],
        caches: Vec<&mut KvCache>,
        policies: Vec<Option<&mut dyn DecodeAttention>>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        if caches.len() != tokens.len() || policies.len() != tokens.len() {
            return Err(ModelError::InvalidParam {
                name: "batch",
                value: format!(
                    "{} tokens, {} caches, {} policies",
                    tokens.len(),
                    caches.len(),
                    policies.len()
                ),
                reason: "one cache and one policy slot per token",
            });
        }
        for (t, cache) in tokens.iter().zip(&caches) {
            self.check_call(std::slice::from_ref(t), cache)?;
        }
        match &self.device {
            ModelDevice::Cpu => {
                let lanes = caches
                    .into_iter()
                    .zip(policies)
                    .map(|(cache, policy)| Lane {
                        cache,
                        policy: policy.map(|p| p as &mut dyn DecodeAttention),
                        rows: 1,
                    })
                    .collect();
                let mut cpu = CpuBackend::for_batch_step(self.ropes.tables());
                self.forward_lanes_on(&mut cpu, &self.w, tokens, lanes, None, timings)
            }
            ModelDevice::Cuda(_) => {
                let mut hidden = Vec::with_capacity(tokens.len() * self.cfg.dim);
                for ((t, cache), policy) in tokens.iter().zip(caches).zip(policies) {
                    let call = std::slice::from_ref(t);
                    hidden.extend(self.forward_call(call, cache, None, policy, timings)?);
                }
                Ok(hidden)
            }
        }
    }

    /// Logits of normed hidden rows (row-major `rows × dim`), row-major `rows × vocab_size`; the
    /// output head is the file's own ([`Weights::head`]) or the token embedding (tied weights).
    pub fn logits(&self, hidden: &[f32], timings: &mut Timings) -> Result<Vec<f32>> {
        self.logits_with(hidden, timings, false)
    }

    /// [`Llama::logits`] of the rows of a decode step of several sequences
    /// ([`Llama::forward_batch`]): each row's logits are the ones [`Llama::logits`] gives it
    /// alone (on the CPU, matvecs reading the head once for all rows).
    pub fn logits_batch(&self, hidden: &[f32], timings: &mut Timings) -> Result<Vec<f32>> {
        self.logits_with(hidden, timings, true)
    }

    /// [`Llama::logits`] (`batch`: of a batch's decode step, [`Llama::logits_batch`]).
    fn logits_with(&self, hidden: &[f32], timings: &mut Timings, batch: bool) -> Result<Vec<f32>> {
        match &self.device {
            ModelDevice::Cpu => {
                let tables = self.ropes.tables();
                let mut cpu = match batch {
                    true => CpuBackend::for_batch_step(tables),
                    false => CpuBackend::new(tables),
                };
                self.logits_on(&mut cpu, &self.w, hidden, timings)
            }
            ModelDevice::Cuda(cuda) => cuda.logits(self.device_model(), |call, w| {
                self.logits_on(call, w, hidden, timings)
            }),
        }
    }

    /// [`Llama::logits`] on backend `b`; its whole time counts as [`Timings::matmul`].
    pub(crate) fn logits_on<B: Backend>(
        &self,
        b: &mut B,
        w: &Weights<B::Tensor>,
        hidden: &[f32],
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        let t0 = Instant::now();
        let (dim, vocab) = (self.cfg.dim, self.cfg.vocab_size);
        let rows = hidden.len() / dim;
        let x = b.upload(hidden)?;
        let mut y = b.alloc(rows * vocab)?;
        b.linear(&x, rows, w.head(), (vocab, dim), &mut y)?;
        let out = b.download(y)?;
        timings.matmul += t0.elapsed();
        Ok(out)
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

#[cfg(test)]
mod tests;
