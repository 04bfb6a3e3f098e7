//! One transformer layer, written once over [`Backend`]: [`Attention`], [`Mlp`] and the
//! [`Block`] that joins them, each with `load` (its tensors from the GGUF file) and `forward`.
//! The layout follows candle-transformers' `models/llama.rs`; what differs between model families
//! is read from the layer's [`LayerSpec`] (`arch.rs`).
//!
//! Weights are generic over the tensor type `T`: [`HostTensor`] on the host (matrices in their
//! GGUF blocks or f32), device memory once a backend uploaded them ([`Block::try_map`]).

use super::arch::{
    gguf_row_of, Activation, AttentionKind, LayerSpec, NormPlacement, QkNorm, QkRowOrder,
};
use super::backend::{Backend, Part, Timer, Timings};
use super::cache::KvCache;
use super::config::Config;
use super::error::{ModelError, Result};
use super::gguf::GgufFile;
use super::hooks::{CaptureFn, DecodeAttention, LayerCapture};
use super::qtensor::HostTensor;

/// Grouped-query self-attention with RoPE: the four projections, row-major `out × in`.
#[derive(Debug)]
pub struct Attention<T> {
    /// `(n_heads · head_dim) × dim`, rows in rotate-half order.
    pub wq: T,
    /// `(n_kv_heads · head_dim) × dim`, rows in rotate-half order.
    pub wk: T,
    pub wv: T,
    pub wo: T,
    /// The per-head RMSNorm weights of q and k (`head_dim` each) where the layer has
    /// [`QkNorm::PerHead`].
    pub q_norm: Option<T>,
    pub k_norm: Option<T>,
    /// The projections' biases (`q_dim`, `kv_dim`, `kv_dim` values) where the layer has
    /// [`LayerSpec::qkv_bias`] (Qwen2), in the rows' order (q and k rotate-half, as `wq`, `wk`).
    pub bias: Option<QkvBias<T>>,
}

/// The biases of the q, k and v projections.
#[derive(Debug, Clone)]
pub struct QkvBias<T> {
    pub q: T,
    pub k: T,
    pub v: T,
}

/// The gated MLP: `down(act(gate(x)) · up(x))`.
#[derive(Debug)]
pub struct Mlp<T> {
    pub gate: T,
    pub up: T,
    pub down: T,
}

/// One transformer layer: norms, attention, MLP and what its family does ([`LayerSpec`]).
#[derive(Debug)]
pub struct Block<T> {
    pub spec: LayerSpec,
    pub attn_norm: T,
    pub attn: Attention<T>,
    pub ffn_norm: T,
    pub mlp: Mlp<T>,
    /// The norms of the attention and MLP outputs where the layer has
    /// [`NormPlacement::PrePost`].
    pub post_attn_norm: Option<T>,
    pub post_ffn_norm: Option<T>,
}

/// The weight `w` a layer's spec needs, or the error naming the tensor.
fn needed<'w, T>(w: &'w Option<T>, layer: usize, name: &str) -> Result<&'w T> {
    w.as_ref().ok_or_else(|| ModelError::Tensor {
        tensor: format!("blk.{layer}.{name}.weight"),
        reason: "absent, but the layer's architecture needs it".into(),
    })
}

/// Maps an optional tensor.
fn map_opt<T, U, E>(
    t: &Option<T>,
    f: &mut impl FnMut(&T) -> std::result::Result<U, E>,
) -> std::result::Result<Option<U>, E> {
    t.as_ref().map(f).transpose()
}

/// The activation buffers of one forward call (`rows` token rows), reused by every layer.
pub(crate) struct Activations<B: Backend> {
    /// The residual stream, `rows × dim`.
    pub x: B::Buf,
    /// Normed input of a sub-layer, then its output, `rows × dim`.
    pub h: B::Buf,
    pub q: B::Buf,
    pub k: B::Buf,
    pub v: B::Buf,
    /// Attention output before `wo`, `rows × (n_heads · head_dim)`.
    pub att: B::Buf,
    pub gate: B::Buf,
    pub up: B::Buf,
}

impl<B: Backend> Activations<B> {
    pub fn new(b: &mut B, cfg: &Config, rows: usize) -> Result<Self> {
        Ok(Activations {
            x: b.alloc(rows * cfg.dim)?,
            h: b.alloc(rows * cfg.dim)?,
            q: b.alloc(rows * cfg.q_dim())?,
            k: b.alloc(rows * cfg.kv_dim())?,
            v: b.alloc(rows * cfg.kv_dim())?,
            att: b.alloc(rows * cfg.q_dim())?,
            gate: b.alloc(rows * cfg.ffn_dim)?,
            up: b.alloc(rows * cfg.ffn_dim)?,
        })
    }
}

/// The inputs of one forward call: `tokens` at positions `cache.len()..`, the capture and the
/// decode policy of `Llama::forward_with`, and the timings its time is added to.
pub(crate) struct Pass<'a, 'c> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    pub capture: Option<&'a mut CaptureFn<'c>>,
    pub policy: Option<&'a mut dyn DecodeAttention>,
    pub timings: &'a mut Timings,
}

/// One sequence of a forward call: its next `rows` rows are its tokens at positions
/// `cache.len()..`.
pub(crate) struct Lane<'s> {
    pub cache: &'s mut KvCache,
    /// Computes the attention of one-token lanes (decode steps) on global layers.
    pub policy: Option<&'s mut dyn DecodeAttention>,
    pub rows: usize,
}

/// One forward call as the layers see it: `rows` tokens, the rows of one sequence (a prefill
/// or a decode step) or of several ([`Lane`]s, in order: a decode step of a batch). The
/// projections and the MLP run on all rows at once; RoPE, the cache and attention per lane.
pub(crate) struct Step<'s, 'c, 'l> {
    pub cfg: &'s Config,
    pub rows: usize,
    pub lanes: Vec<Lane<'l>>,
    /// Calls of one lane only.
    pub capture: Option<&'s mut CaptureFn<'c>>,
    pub timer: Timer<'s>,
}

/// The buffers of one lane's attention: its rows of q, k, v and of the output.
struct LaneBufs<'x, B: Backend> {
    q: &'x mut B::Buf,
    k: &'x mut B::Buf,
    v: &'x B::Buf,
    out: &'x mut B::Buf,
}

impl<T> Attention<T> {
    /// Projects `a.h` to q/k/v, applies RoPE (table `rope`), appends k/v to the cache, hands
    /// q/k/v to the capture, attends, and leaves the projected output in `a.h`.
    fn forward<B: Backend<Tensor = T>>(
        &self,
        b: &mut B,
        spec: &LayerSpec,
        (layer, rope): (usize, usize),
        a: &mut Activations<B>,
        s: &mut Step<'_, '_, '_>,
    ) -> Result<()> {
        let c = s.cfg;
        let (n, hd) = (s.rows, c.head_dim);
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
        b.linear(&a.h, n, &self.wq, (q_dim, c.dim), &mut a.q)?;
        b.linear(&a.h, n, &self.wk, (kv_dim, c.dim), &mut a.k)?;
        b.linear(&a.h, n, &self.wv, (kv_dim, c.dim), &mut a.v)?;
        if let Some(bias) = &self.bias {
            b.add_rows(&mut a.q, &bias.q, (n, q_dim))?;
            b.add_rows(&mut a.k, &bias.k, (n, kv_dim))?;
            b.add_rows(&mut a.v, &bias.v, (n, kv_dim))?;
        }
        s.timer.lap(Part::Matmul);
        match spec.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => {
                let eps = c.rms_eps;
                let qn = needed(&self.q_norm, layer, "attn_q_norm")?;
                let kn = needed(&self.k_norm, layer, "attn_k_norm")?;
                b.rms_norm_in_place(&mut a.q, qn, (n * c.n_heads, hd), eps)?;
                b.rms_norm_in_place(&mut a.k, kn, (n * c.n_kv_heads, hd), eps)?;
                s.timer.lap(Part::Other);
            }
        }
        if let [lane] = s.lanes.as_mut_slice() {
            let bufs = LaneBufs::<B> {
                q: &mut a.q,
                k: &mut a.k,
                v: &a.v,
                out: &mut a.att,
            };
            attend_lane(
                b,
                c,
                spec,
                (layer, rope),
                bufs,
                lane,
                &mut s.capture,
                &mut s.timer,
            )?;
        } else {
            // Several sequences: each lane's rows to and from buffers of their own (a decode
            // step's few rows; cheap copies on the CPU).
            let (q_all, k_all, v_all) = (b.to_host(&a.q)?, b.to_host(&a.k)?, b.to_host(&a.v)?);
            let (q_all, k_all, v_all) =
                (q_all.into_owned(), k_all.into_owned(), v_all.into_owned());
            let mut att = Vec::with_capacity(n * q_dim);
            let mut r0 = 0;
            for lane in s.lanes.iter_mut() {
                let r1 = r0 + lane.rows;
                let mut q = b.upload(&q_all[r0 * q_dim..r1 * q_dim])?;
                let mut k = b.upload(&k_all[r0 * kv_dim..r1 * kv_dim])?;
                let v = b.upload(&v_all[r0 * kv_dim..r1 * kv_dim])?;
                let mut out = b.alloc(lane.rows * q_dim)?;
                let bufs = LaneBufs::<B> {
                    q: &mut q,
                    k: &mut k,
                    v: &v,
                    out: &mut out,
                };
                attend_lane(
                    b,
                    c,
                    spec,
                    (layer, rope),
                    bufs,
                    lane,
                    &mut None,
                    &mut s.timer,
                )?;
                att.extend_from_slice(&b.download(out)?);
                r0 = r1;
            }
            a.att = b.upload(&att)?;
        }
        b.linear(&a.att, n, &self.wo, (c.dim, q_dim), &mut a.h)?;
        s.timer.lap(Part::Matmul);
        Ok(())
    }

    /// The same projections with `f` applied to each tensor (e.g. an upload).
    pub fn try_map<U, E>(
        &self,
        f: &mut impl FnMut(&T) -> std::result::Result<U, E>,
    ) -> std::result::Result<Attention<U>, E> {
        Ok(Attention {
            wq: f(&self.wq)?,
            wk: f(&self.wk)?,
            wv: f(&self.wv)?,
            wo: f(&self.wo)?,
            q_norm: map_opt(&self.q_norm, f)?,
            k_norm: map_opt(&self.k_norm, f)?,
            bias: match &self.bias {
                Some(b) => Some(QkvBias {
                    q: f(&b.q)?,
                    k: f(&b.k)?,
                    v: f(&b.v)?,
                }),
                None => None,
            },
        })
    }
}

/// RoPE, the cache append, the capture and the attention of one lane's rows (`bufs`): the
/// rest of [`Attention::forward`] after the projections.
#[allow(clippy::too_many_arguments)]
fn attend_lane<B: Backend>(
    b: &mut B,
    c: &Config,
    spec: &LayerSpec,
    (layer, rope): (usize, usize),
    bufs: LaneBufs<'_, B>,
    lane: &mut Lane<'_>,
    capture: &mut Option<&mut CaptureFn<'_>>,
    timer: &mut Timer<'_>,
) -> Result<()> {
    let LaneBufs { q, k, v, out } = bufs;
    let (n, pos0) = (lane.rows, lane.cache.len());
    let (hd, heads) = (c.head_dim, c.heads());
    b.rope(q, (n, c.n_heads, hd), pos0, rope)?;
    b.rope(k, (n, c.n_kv_heads, hd), pos0, rope)?;
    let (k_host, v_host) = b.append_kv(layer, k, v, lane.cache, heads, pos0)?;
    // Policies (retrieval attention) apply to global layers; a window has nothing to retrieve.
    let policy = match spec.attention {
        AttentionKind::Global => lane.policy.as_deref_mut().filter(|_| n == 1),
        AttentionKind::SlidingWindow(_) => None,
    };
    let q_host = if capture.is_some() || policy.is_some() {
        b.to_host(q)?
    } else {
        Default::default()
    };
    if let Some(cb) = capture.as_deref_mut() {
        cb(LayerCapture {
            layer,
            pos0,
            n,
            q: &q_host,
            k: &k_host,
            v: &v_host,
        });
    }
    timer.lap(Part::Other);
    match policy {
        Some(p) => b.policy_attention(layer, q, &q_host, lane.cache, pos0, p, out)?,
        None => {
            let window = spec.attention.window();
            // A layer that keeps only its window holds positions from `first` on: the
            // attention sees them from row 0 (positions only matter relative to each other).
            let rel = pos0 - lane.cache.first_position(layer);
            b.attention(layer, q, lane.cache, heads, (n, rel), window, out)?
        }
    }
    timer.lap(match spec.attention {
        AttentionKind::Global => Part::Attention,
        AttentionKind::SlidingWindow(_) => Part::AttentionLocal,
    });
    Ok(())
}

impl<T> Mlp<T> {
    /// `a.h = down(act(gate(a.h)) · up(a.h))`.
    fn forward<B: Backend<Tensor = T>>(
        &self,
        b: &mut B,
        spec: &LayerSpec,
        a: &mut Activations<B>,
        s: &mut Step<'_, '_, '_>,
    ) -> Result<()> {
        let (n, dim, ffn) = (s.rows, s.cfg.dim, s.cfg.ffn_dim);
        b.linear(&a.h, n, &self.gate, (ffn, dim), &mut a.gate)?;
        b.linear(&a.h, n, &self.up, (ffn, dim), &mut a.up)?;
        s.timer.lap(Part::Matmul);
        match spec.activation {
            Activation::SwiGlu => b.swiglu(&mut a.gate, &a.up)?,
            Activation::GeGlu => b.geglu(&mut a.gate, &a.up)?,
        }
        s.timer.lap(Part::Other);
        b.linear(&a.gate, n, &self.down, (dim, ffn), &mut a.h)?;
        s.timer.lap(Part::Matmul);
        Ok(())
    }

    /// The same MLP with `f` applied to each tensor.
    pub fn try_map<U, E>(
        &self,
        f: &mut impl FnMut(&T) -> std::result::Result<U, E>,
    ) -> std::result::Result<Mlp<U>, E> {
        Ok(Mlp {
            gate: f(&self.gate)?,
            up: f(&self.up)?,
            down: f(&self.down)?,
        })
    }
}

impl<T> Block<T> {
    /// One layer on the residual stream `a.x`: `x += attn(norm(x)); x += mlp(norm(x))`, with
    /// [`NormPlacement::PrePost`] `x += norm(attn(norm(x)))` and the same for the MLP.
    /// `layer` is the layer's number, `rope` its RoPE table.
    pub(crate) fn forward<B: Backend<Tensor = T>>(
        &self,
        b: &mut B,
        (layer, rope): (usize, usize),
        a: &mut Activations<B>,
        s: &mut Step<'_, '_, '_>,
    ) -> Result<()> {
        let (rows_dim, eps) = ((s.rows, s.cfg.dim), s.cfg.rms_eps);
        match self.spec.norms {
            NormPlacement::Pre => {
                b.rms_norm(&a.x, &self.attn_norm, rows_dim, eps, &mut a.h)?;
                s.timer.lap(Part::Other);
                self.attn.forward(b, &self.spec, (layer, rope), a, s)?;
                b.add(&mut a.x, &a.h)?;
                b.rms_norm(&a.x, &self.ffn_norm, rows_dim, eps, &mut a.h)?;
                s.timer.lap(Part::Other);
                self.mlp.forward(b, &self.spec, a, s)?;
                b.add(&mut a.x, &a.h)?;
            }
            NormPlacement::PrePost => {
                let post_attn = needed(&self.post_attn_norm, layer, "post_attention_norm")?;
                let post_ffn = needed(&self.post_ffn_norm, layer, "post_ffw_norm")?;
                b.rms_norm(&a.x, &self.attn_norm, rows_dim, eps, &mut a.h)?;
                s.timer.lap(Part::Other);
                self.attn.forward(b, &self.spec, (layer, rope), a, s)?;
                b.rms_norm_in_place(&mut a.h, post_attn, rows_dim, eps)?;
                b.add(&mut a.x, &a.h)?;
                b.rms_norm(&a.x, &self.ffn_norm, rows_dim, eps, &mut a.h)?;
                s.timer.lap(Part::Other);
                self.mlp.forward(b, &self.spec, a, s)?;
                b.rms_norm_in_place(&mut a.h, post_ffn, rows_dim, eps)?;
                b.add(&mut a.x, &a.h)?;
                s.timer.lap(Part::Other);
            }
        }
        Ok(())
    }

    /// The same layer with `f` applied to each tensor (e.g. an upload to a device).
    pub fn try_map<U, E>(
        &self,
        f: &mut impl FnMut(&T) -> std::result::Result<U, E>,
    ) -> std::result::Result<Block<U>, E> {
        Ok(Block {
            spec: self.spec,
            attn_norm: f(&self.attn_norm)?,
            attn: self.attn.try_map(f)?,
            ffn_norm: f(&self.ffn_norm)?,
            mlp: self.mlp.try_map(f)?,
            post_attn_norm: map_opt(&self.post_attn_norm, f)?,
            post_ffn_norm: map_opt(&self.post_ffn_norm, f)?,
        })
    }
}

impl Attention<HostTensor> {
    /// Layer `layer`'s projections from `g` (q/k rows brought to rotate-half order; matrices in
    /// their blocks where `keep_blocks`), and the q/k norms where `spec` has them.
    pub fn load(
        g: &GgufFile,
        cfg: &Config,
        (layer, keep_blocks): (usize, bool),
        spec: &LayerSpec,
    ) -> Result<Self> {
        let (d, q, kv) = (cfg.dim as u64, cfg.q_dim() as u64, cfg.kv_dim() as u64);
        let t = |name: &str, dims: &[u64]| {
            g.host_tensor(&format!("blk.{layer}.{name}"), dims, keep_blocks)
        };
        let rows = |w: HostTensor, heads: usize| match spec.rope.rows {
            QkRowOrder::LlamaCppPermuted => {
                w.permute_rows(heads * cfg.head_dim, |r| gguf_row_of(r, cfg.head_dim))
            }
            QkRowOrder::AsStored => w,
        };
        let hd = [cfg.head_dim as u64];
        let (q_norm, k_norm) = match spec.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead => (
                Some(t("attn_q_norm.weight", &hd)?),
                Some(t("attn_k_norm.weight", &hd)?),
            ),
        };
        let bias = if spec.qkv_bias {
            let v = |name: &str, len: u64| {
                g.dequantize(&format!("blk.{layer}.{name}"), &[len])
                    .map(HostTensor::F32)
            };
            // A bias is a column of the projection: its rows are permuted with the weights'.
            Some(QkvBias {
                q: rows(v("attn_q.bias", q)?, cfg.n_heads),
                k: rows(v("attn_k.bias", kv)?, cfg.n_kv_heads),
                v: v("attn_v.bias", kv)?,
            })
        } else {
            None
        };
        Ok(Attention {
            q_norm,
            k_norm,
            bias,
            wq: rows(t("attn_q.weight", &[d, q])?, cfg.n_heads),
            wk: rows(t("attn_k.weight", &[d, kv])?, cfg.n_kv_heads),
            wv: t("attn_v.weight", &[d, kv])?,
            wo: t("attn_output.weight", &[q, d])?,
        })
    }
}

impl Mlp<HostTensor> {
    /// Layer `layer`'s MLP from `g` (matrices in their blocks where `keep_blocks`).
    pub fn load(g: &GgufFile, cfg: &Config, layer: usize, keep_blocks: bool) -> Result<Self> {
        let (d, f) = (cfg.dim as u64, cfg.ffn_dim as u64);
        let t = |name: &str, dims: &[u64]| {
            g.host_tensor(&format!("blk.{layer}.{name}"), dims, keep_blocks)
        };
        Ok(Mlp {
            gate: t("ffn_gate.weight", &[d, f])?,
            up: t("ffn_up.weight", &[d, f])?,
            down: t("ffn_down.weight", &[f, d])?,
        })
    }
}

impl Block<HostTensor> {
    /// Layer `layer` from `g` (matrices in their blocks where `keep_blocks`).
    pub fn load(g: &GgufFile, cfg: &Config, layer: usize, keep_blocks: bool) -> Result<Self> {
        let spec = cfg.layer(layer);
        let t = |name: &str| {
            g.dequantize(&format!("blk.{layer}.{name}"), &[cfg.dim as u64])
                .map(HostTensor::F32)
        };
        let (post_attn_norm, post_ffn_norm) = match spec.norms {
            NormPlacement::Pre => (None, None),
            NormPlacement::PrePost => (
                Some(t("post_attention_norm.weight")?),
                Some(t("post_ffw_norm.weight")?),
            ),
        };
        Ok(Block {
            post_attn_norm,
            post_ffn_norm,
            attn_norm: t("attn_norm.weight")?,
            attn: Attention::load(g, cfg, (layer, keep_blocks), &spec)?,
            ffn_norm: t("ffn_norm.weight")?,
            mlp: Mlp::load(g, cfg, layer, keep_blocks)?,
            spec,
        })
    }
}
