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
mod tests {
    use super::*;
    use crate::ops::Rope;
    use crate::LayerCapture;

    /// A Gemma-3-shaped model small enough for a unit test: six layers (the last global), a
    /// window of 8 keys, head dim ≠ dim / heads.
    fn tiny_gemma() -> Llama {
        let cfg = Config {
            n_layers: 6,
            dim: 32,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 24,
            ffn_dim: 64,
            vocab_size: 50,
            context_length: 64,
            sliding_window: 8,
            ..Config::gemma3_270m()
        };
        let w = Weights::random(&cfg, 11);
        Llama::new(cfg, w)
    }

    #[test]
    fn gemma3_layers_get_two_rope_tables_and_one_global_layer() {
        let m = tiny_gemma();
        assert_eq!(m.ropes().tables().len(), 2);
        assert_eq!(m.cfg.global_layers(), [5]);
        assert_eq!(
            (0..6).map(|l| m.ropes().of_layer(l)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 0, 1]
        );
    }

    #[test]
    fn gemma3_prefill_in_chunks_and_decode_steps_equal_one_prefill() {
        let m = tiny_gemma();
        let tokens: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 50).collect();
        let mut tm = Timings::default();
        let mut cache = m.new_cache(40).expect("cache");
        let whole = m
            .forward(&tokens, &mut cache, None, &mut tm)
            .expect("prefill");
        assert!(whole.iter().all(|v| v.is_finite()));
        // 25 + 15 rows (the window spans the seam), then 30 rows and ten one-token steps.
        let mut c2 = m.new_cache(40).expect("cache");
        let mut chunked = m.forward(&tokens[..25], &mut c2, None, &mut tm).expect("a");
        chunked.extend(m.forward(&tokens[25..], &mut c2, None, &mut tm).expect("b"));
        let mut c3 = m.new_cache(40).expect("cache");
        let mut stepped = m.forward(&tokens[..30], &mut c3, None, &mut tm).expect("c");
        for &t in &tokens[30..] {
            stepped.extend(m.forward(&[t], &mut c3, None, &mut tm).expect("step"));
        }
        for (i, ((a, b), c)) in whole.iter().zip(&chunked).zip(&stepped).enumerate() {
            assert!((a - b).abs() < 1e-4, "chunked, value {i}: {a} vs {b}");
            assert!((a - c).abs() < 1e-4, "stepped, value {i}: {a} vs {c}");
        }
        // The windows are windows: through five local layers (window 8) position 39 sees
        // positions 4.. only, so the global layer's key at 39 ignores token 0, while its
        // attention (and so the output) does not.
        let run = |toks: &[u32]| {
            let mut k5 = Vec::new();
            let mut cb = |c: LayerCapture<'_>| {
                if c.layer == 5 {
                    k5 = c.k[39 * 24..].to_vec();
                }
            };
            let mut c = m.new_cache(40).expect("cache");
            let h = m
                .forward(toks, &mut c, Some(&mut cb), &mut Timings::default())
                .expect("forward");
            (k5, h[39 * 32..].to_vec())
        };
        let mut other = tokens.clone();
        other[0] = 1;
        let ((k_a, h_a), (k_b, h_b)) = (run(&tokens), run(&other));
        assert_eq!(
            k_a, k_b,
            "layer 5's key at 39 depends on positions 4.. only"
        );
        assert_ne!(h_a, h_b, "the global layer attends position 0");
        let mut near = tokens.clone();
        near[10] = 1;
        assert_ne!(
            run(&near).0,
            k_a,
            "position 10 is inside the receptive field"
        );
    }

    #[test]
    fn local_layers_keeping_only_their_window_compute_the_same() {
        let m = tiny_gemma();
        let tokens: Vec<u32> = (0..60).map(|i| (i * 11 + 5) % 50).collect();
        let mut tm = Timings::default();
        let mut full = KvCache::zeroed(6, 1, 60, 24);
        let want = m.forward(&tokens, &mut full, None, &mut tm).expect("full");
        // Window 8, calls of at most 5 rows: local blocks of 12 rows slide many times, in
        // calls of 5, 3, 1 rows and one-token steps.
        let windows: Vec<Option<usize>> =
            (0..6).map(|l| m.cfg.layer(l).attention.window()).collect();
        let mut win = KvCache::windowed(&windows, 1, 60, 24, 5);
        assert!(win.is_windowed());
        assert_eq!((win.layer_rows(0), win.layer_rows(5)), (12, 60));
        let mut got = Vec::new();
        let mut at = 0;
        for n in [5, 3, 1, 5, 5, 4, 2]
            .into_iter()
            .chain(std::iter::repeat(1))
        {
            if at == tokens.len() {
                break;
            }
            let end = (at + n).min(tokens.len());
            got.extend(
                m.forward(&tokens[at..end], &mut win, None, &mut tm)
                    .expect("windowed"),
            );
            at = end;
        }
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert!((a - b).abs() < 1e-4, "value {i}: {a} vs {b}");
        }
        // The local layer holds its last positions; the global one all of them (equal up to
        // rounding: calls of other sizes take other matmul kernels).
        let close = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4)
        };
        assert!(win.first_position(0) > 0);
        assert_eq!(win.keys(0, 0, 24).len(), (60 - win.first_position(0)) * 24);
        let tail = &full.keys(0, 0, 24)[win.first_position(0) * 24..];
        assert!(close(win.keys(0, 0, 24), tail));
        assert!(close(win.keys(5, 0, 24), full.keys(5, 0, 24)));
        // A copy with more room keeps the windowed blocks.
        let grown = win.with_capacity(64, 24);
        assert_eq!(grown.layer_rows(0), 12);
        assert_eq!(grown.keys(0, 0, 24), win.keys(0, 0, 24));
        assert_eq!(grown.keys(5, 0, 24), win.keys(5, 0, 24));
    }

    #[test]
    fn an_f16_cache_copy_follows_every_write_and_attends_close_to_f32() {
        use half::f16;
        let mut m = tiny_gemma();
        let tokens: Vec<u32> = (0..60).map(|i| (i * 7 + 3) % 50).collect();
        let mut tm = Timings::default();
        assert_eq!(m.new_cache(60).expect("cache").dtype(), KvDtype::F32);
        assert!(m.new_cache(60).expect("cache").layer_f16(0).is_none());
        m.set_kv_dtype(KvDtype::F16);
        assert_eq!(m.new_cache(60).expect("cache").dtype(), KvDtype::F16);
        // Local layers keeping a window of 8 in blocks of 12 rows (calls of at most 5): they
        // slide many times.
        let windows: Vec<Option<usize>> =
            (0..6).map(|l| m.cfg.layer(l).attention.window()).collect();
        let mut c32 = KvCache::windowed(&windows, 1, 60, 24, 5);
        let mut c16 = KvCache::windowed(&windows, 1, 60, 24, 5).with_f16_copy();
        assert_eq!((c32.dtype(), c16.dtype()), (KvDtype::F32, KvDtype::F16));
        let (mut want, mut got) = (Vec::new(), Vec::new());
        let calls = (0..4)
            .map(|i| (5 * i, 5 * i + 5))
            .chain((20..60).map(|i| (i, i + 1)));
        for (a, b) in calls {
            want = m
                .forward(&tokens[a..b], &mut c32, None, &mut tm)
                .expect("f32");
            got = m
                .forward(&tokens[a..b], &mut c16, None, &mut tm)
                .expect("f16");
        }
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst > 0.0 && worst < 2e-2, "worst {worst}");
        // The copy holds the f32 cache's keys and values rounded, for every layer, the slid
        // local ones included, and keeps doing so in a copy with more room.
        let check = |c: &KvCache| {
            for l in 0..m.cfg.n_layers {
                let (k, v) = c.layer(l);
                let (k16, v16) = c.layer_f16(l).expect("f16 copy");
                let rows = (c.len() - c.first_position(l)) * m.cfg.head_dim;
                assert!(c.first_position(l) > 0 || l == 5);
                for (x, h) in k[..rows].iter().zip(&k16[..rows]) {
                    assert_eq!(f16::from_f32(*x), *h, "layer {l}");
                }
                for (x, h) in v[..rows].iter().zip(&v16[..rows]) {
                    assert_eq!(f16::from_f32(*x), *h, "layer {l}");
                }
            }
        };
        check(&c16);
        let grown = c16.with_capacity(64, m.cfg.head_dim);
        assert_eq!(grown.dtype(), KvDtype::F16);
        check(&grown);
    }

    #[test]
    fn linear_scaling_divides_the_global_layers_positions_only() {
        let g = Config::gemma3_270m()
            .with_rope_scaling(RopeScaling::Linear(4.0))
            .expect("linear");
        assert_eq!(g.context_length, 4 * 32_768);
        assert_eq!((g.layer(5).rope.base, g.layer(5).rope.linear), (1e6, 4.0));
        assert_eq!(g.layer(0).rope.linear, 1.0);
        // Position 4p of the scaled table rotates like position p of the trained one.
        let (hd, n) = (8, 12);
        let scaled = Rope::scaled(hd, 1e6, 4.0, 4 * n);
        let trained = Rope::new(hd, 1e6, n);
        let half = hd / 2;
        for p in 0..n {
            for i in 0..half {
                let (a, b) = (
                    scaled.tables().0[4 * p * half + i],
                    trained.tables().0[p * half + i],
                );
                assert!((a - b).abs() < 1e-6, "cos at position {p}, pair {i}");
            }
        }
        // A second scaling replaces the first: back to the file's base and context.
        let back = Config::gemma3_270m()
            .with_rope_scale(4.0)
            .and_then(|c| c.with_rope_scaling(RopeScaling::Linear(2.0)))
            .expect("rescale");
        assert_eq!(back.rope_theta, 1e6);
        assert_eq!(back.context_length, 2 * 32_768);
        assert_eq!(back.trained_context(), 32_768);
        // Two tables still: the local layers' and the scaled global one.
        let m = tiny_gemma()
            .with_rope_scaling(RopeScaling::Linear(2.0))
            .expect("linear");
        assert_eq!(m.ropes().tables().len(), 2);
        assert_eq!(m.cfg.context_length, 128);
    }
}
