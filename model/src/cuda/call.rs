//! One forward call on the device: the device's state ([`Inner`]: the uploaded weights, the cache
//! mirrors, [`CudaStats`]), what the layer loop hands it ([`DeviceModel`]), and
//! [`CudaCall`], the [`Backend`] whose operations launch the kernels of `kernels.rs`.
//!
//! The host [`KvCache`] stays canonical: every call downloads the new keys and values into it
//! (policies and captures read it), and the device mirrors it, re-uploading when the host cache
//! is another one ([`KvCache::id`]) or was changed elsewhere.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qkindex_gpu::cudarc::driver::{CudaContext, CudaSlice};
use qkindex_gpu::runtime::{elapsed_ms, record};

use super::kernels::{cuda, Dev, KvView, Parts};
use crate::arch::Architecture;
use crate::backend::Backend;
use crate::cache::KvCache;
use crate::config::Config;
use crate::config::Heads;
use crate::error::{ModelError, Result};
use crate::hooks::{DecodeAttention, DecodeStep, StaticParts};
use crate::ops::Rope;
use crate::qtensor::HostTensor;
use crate::weights::Weights;

/// Device KV caches kept at once (distinct host caches, e.g. `full` and a policy side by side).
pub(super) const CACHES_KEPT: usize = 4;

/// Time split of decode steps on the CUDA backend (accumulated).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CudaStats {
    /// Decode steps with a retrieval policy (counted per layer).
    pub split_layer_steps: u64,
    /// GPU time of the static-part attention kernels (CUDA events), ms.
    pub gpu_static_ms: f64,
    /// Host time in the policy up to the moment it asked for the static parts (the search), ms.
    pub cpu_before_wait_ms: f64,
    /// Host time blocked waiting for the static parts, ms.
    pub wait_ms: f64,
    /// Host time of whole policy calls (search, wait, retrieved attention, merge), ms.
    pub policy_ms: f64,
    /// Forward calls and their host wall time, ms.
    pub forward_calls: u64,
    pub forward_ms: f64,
    /// Full uploads of a host cache to the device.
    pub cache_uploads: u64,
}

/// What the layer loop hands a device of its model: the configuration, the host weights (uploaded
/// on first use) and the RoPE tables. The backend names no model type: the loop passes itself
/// in as the closures of [`CudaBackend::forward`] and [`CudaBackend::logits`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceModel<'m> {
    pub cfg: &'m Config,
    pub weights: &'m Weights,
    pub ropes: &'m [Rope],
}

/// The model on the device: its weights and RoPE tables `(cos, sin)`.
pub(super) struct DeviceWeights {
    pub(super) weights: Weights<CudaSlice<f32>>,
    pub(super) ropes: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
}

/// The device copy of a host cache: per layer, keys and values as the host holds them.
pub(super) struct DevCache {
    pub(super) id: u64,
    pub(super) capacity: usize,
    pub(super) len: usize,
    pub(super) k: Vec<CudaSlice<f32>>,
    pub(super) v: Vec<CudaSlice<f32>>,
}

pub(super) struct Inner {
    pub(super) _ctx: Arc<CudaContext>,
    pub(super) dev: Dev,
    /// Uploaded on the first forward call (the model is known then).
    pub(super) w: Option<DeviceWeights>,
    pub(super) caches: Vec<DevCache>,
    pub(super) stats: CudaStats,
}

impl Inner {
    /// Uploads the model's weights and RoPE tables unless done already.
    /// Families with operations the device lacks are refused here, before anything runs.
    pub(super) fn upload_weights(&mut self, model: DeviceModel<'_>) -> Result<()> {
        if self.w.is_some() {
            return Ok(());
        }
        if model.cfg.arch != Architecture::Llama {
            return Err(ModelError::DeviceState(format!(
                "the {} architecture does not run on the CUDA backend yet (no kernels for Gemma 3's \
                 sliding-window attention, q/k norms, GeGLU and embedding scale, nor Qwen2's \
                 q/k/v biases); use --device cpu",
                model.cfg.arch.gguf_name()
            )));
        }
        let s = &self.dev.stream;
        let up = |x: &[f32]| s.clone_htod(x).map_err(cuda("uploading weights"));
        let weights = model.weights.try_map(|t: &HostTensor| up(&t.to_f32()))?;
        let ropes = model
            .ropes
            .iter()
            .map(|r| {
                let (cos, sin) = r.tables();
                Ok((up(cos)?, up(sin)?))
            })
            .collect::<Result<Vec<_>>>()?;
        self.w = Some(DeviceWeights { weights, ropes });
        Ok(())
    }

    /// The device mirror of `cache` (uploaded unless it already mirrors it), moved to the end of
    /// the list; returns its index.
    pub(super) fn mirror(&mut self, cache: &KvCache, n_layers: usize) -> Result<usize> {
        if let Some(i) = self.caches.iter().position(|d| d.id == cache.id()) {
            let d = &self.caches[i];
            if d.len == cache.len() && d.capacity == cache.capacity() {
                let d = self.caches.remove(i);
                self.caches.push(d);
                return Ok(self.caches.len() - 1);
            }
            self.caches.remove(i);
        }
        if self.caches.len() >= CACHES_KEPT {
            self.caches.remove(0);
        }
        let s = &self.dev.stream;
        let mut k = Vec::with_capacity(n_layers);
        let mut v = Vec::with_capacity(n_layers);
        for li in 0..n_layers {
            let (kh, vh) = cache.layer(li);
            k.push(s.clone_htod(kh).map_err(cuda("uploading the KV cache"))?);
            v.push(s.clone_htod(vh).map_err(cuda("uploading the KV cache"))?);
        }
        self.stats.cache_uploads += 1;
        self.caches.push(DevCache {
            id: cache.id(),
            capacity: cache.capacity(),
            len: cache.len(),
            k,
            v,
        });
        Ok(self.caches.len() - 1)
    }
}

/// The operations of one forward call on the device.
pub(crate) struct CudaCall<'a> {
    dev: &'a Dev,
    /// RoPE tables `(cos, sin)`, one per distinct base, as the layer loop numbers them.
    ropes: &'a [(CudaSlice<f32>, CudaSlice<f32>)],
    /// The mirror of the host cache (`None`: a call without one, the logits).
    cache: Option<&'a mut DevCache>,
    stats: &'a mut CudaStats,
    /// Decode steps: the part buffers and the host output, once per call, not per layer.
    parts: Option<Parts>,
    out: Vec<f32>,
    heads: Heads,
}

impl<'a> CudaCall<'a> {
    /// A call of `rows` tokens at positions `pos0..` (`rows = 1`: a decode step).
    pub(super) fn new(
        dev: &'a Dev,
        ropes: &'a [(CudaSlice<f32>, CudaSlice<f32>)],
        cache: Option<&'a mut DevCache>,
        stats: &'a mut CudaStats,
        (rows, pos0): (usize, usize),
        heads: Heads,
    ) -> Result<Self> {
        let decode = rows == 1 && cache.is_some();
        let parts = if decode {
            Some(dev.alloc_parts(heads.n_heads, pos0 + 1, heads.head_dim)?)
        } else {
            None
        };
        let out_len = if decode {
            heads.n_heads * heads.head_dim
        } else {
            0
        };
        let out = vec![0f32; out_len];
        Ok(CudaCall {
            dev,
            ropes,
            cache,
            stats,
            parts,
            out,
            heads,
        })
    }
}

/// The cache mirror of a call that has one.
fn cache_of<'c>(cache: &'c mut Option<&mut DevCache>) -> Result<&'c mut DevCache> {
    cache
        .as_deref_mut()
        .ok_or_else(|| ModelError::DeviceState("no KV cache in this call".to_string()))
}

impl Backend for CudaCall<'_> {
    type Buf = CudaSlice<f32>;
    type Tensor = CudaSlice<f32>;

    const TIMES_MATMUL: bool = false;

    fn alloc(&mut self, len: usize) -> Result<CudaSlice<f32>> {
        self.dev
            .stream
            .alloc_zeros::<f32>(len)
            .map_err(cuda("allocating activations"))
    }

    fn upload(&mut self, x: &[f32]) -> Result<CudaSlice<f32>> {
        self.dev
            .stream
            .clone_htod(x)
            .map_err(cuda("uploading hidden states"))
    }

    fn to_host<'x>(&mut self, x: &'x CudaSlice<f32>) -> Result<Cow<'x, [f32]>> {
        let host = self
            .dev
            .stream
            .clone_dtoh(x)
            .map_err(cuda("downloading queries"))?;
        Ok(Cow::Owned(host))
    }

    fn embed(
        &mut self,
        table: &CudaSlice<f32>,
        tokens: &[u32],
        dim: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let tok = self
            .dev
            .stream
            .clone_htod(tokens)
            .map_err(cuda("uploading tokens"))?;
        self.dev.embed(table, &tok, tokens.len(), dim, out)
    }

    fn rms_norm(
        &mut self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        (rows, dim): (usize, usize),
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.dev.rms_norm(x, w, rows, dim, eps, out)
    }

    fn rms_norm_in_place(
        &mut self,
        x: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        (rows, dim): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        self.dev.rms_norm_inplace(x, w, rows, dim, eps)
    }

    fn linear(
        &mut self,
        x: &CudaSlice<f32>,
        rows: usize,
        w: &CudaSlice<f32>,
        (out, inp): (usize, usize),
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.dev.linear(x, rows, w, out, inp, y)
    }

    fn rope(
        &mut self,
        x: &mut CudaSlice<f32>,
        (rows, heads, head_dim): (usize, usize, usize),
        pos0: usize,
        table: usize,
    ) -> Result<()> {
        let (cos, sin) = &self.ropes[table];
        self.dev
            .rope(x, (cos, sin), rows, heads, head_dim / 2, pos0)
    }

    fn swiglu(&mut self, gate: &mut CudaSlice<f32>, up: &CudaSlice<f32>) -> Result<()> {
        self.dev.elementwise(&self.dev.f.swiglu, gate, up, "swiglu")
    }

    fn geglu(&mut self, _: &mut CudaSlice<f32>, _: &CudaSlice<f32>) -> Result<()> {
        Err(not_on_cuda("GeGLU"))
    }

    fn scale(&mut self, _: &mut CudaSlice<f32>, _: f32) -> Result<()> {
        Err(not_on_cuda("the embedding scale"))
    }

    fn add_rows(
        &mut self,
        _: &mut CudaSlice<f32>,
        _: &CudaSlice<f32>,
        _: (usize, usize),
    ) -> Result<()> {
        Err(not_on_cuda("the q/k/v projection biases (Qwen2)"))
    }

    fn add(&mut self, x: &mut CudaSlice<f32>, h: &CudaSlice<f32>) -> Result<()> {
        self.dev.elementwise(&self.dev.f.add, x, h, "add_inplace")
    }

    fn append_kv<'x>(
        &mut self,
        layer: usize,
        k: &'x CudaSlice<f32>,
        v: &'x CudaSlice<f32>,
        cache: &mut KvCache,
        heads: Heads,
        pos0: usize,
    ) -> Result<(Cow<'x, [f32]>, Cow<'x, [f32]>)> {
        let (n_kv, hd) = (heads.n_kv_heads, heads.head_dim);
        let rows = k.len() / (n_kv * hd).max(1);
        let dc = cache_of(&mut self.cache)?;
        self.dev.kv_write(
            (k, v),
            (&mut dc.k[layer], &mut dc.v[layer]),
            rows,
            (n_kv, hd),
            cache.capacity(),
            pos0,
        )?;
        // The mirror holds the new rows now (every layer's, once the call completes).
        dc.len = pos0 + rows;
        // The host cache stays canonical: the new rows come back every call.
        let s = &self.dev.stream;
        let kh = s.clone_dtoh(k).map_err(cuda("downloading keys"))?;
        let vh = s.clone_dtoh(v).map_err(cuda("downloading values"))?;
        cache.write_rows(layer, pos0, &kh, &vh, heads);
        Ok((Cow::Owned(kh), Cow::Owned(vh)))
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &CudaSlice<f32>,
        cache: &KvCache,
        heads: Heads,
        (rows, pos0): (usize, usize),
        window: Option<usize>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if window.is_some() {
            return Err(not_on_cuda("sliding-window attention"));
        }
        let dc = cache_of(&mut self.cache)?;
        let kv = KvView {
            k: &dc.k[layer],
            v: &dc.v[layer],
            capacity: cache.capacity(),
        };
        if rows == 1 {
            let parts = decode_parts(&mut self.parts)?;
            self.dev.decode_full(q, kv, pos0 + 1, heads, parts, out)
        } else {
            self.dev.causal(q, kv, (rows, pos0), heads, out)
        }
    }

    fn policy_attention(
        &mut self,
        li: usize,
        q: &CudaSlice<f32>,
        q_host: &[f32],
        cache: &KvCache,
        pos0: usize,
        p: &mut dyn DecodeAttention,
        att: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let cap = cache.capacity();
        let heads = self.heads;
        let (n_heads, hd) = (heads.n_heads, heads.head_dim);
        let (kc, vc) = cache.layer(li);
        let step = DecodeStep {
            layer: li,
            pos: pos0,
            q: q_host,
            k: kc,
            v: vc,
            capacity: cap,
        };
        let (s, stats, out) = (&self.dev.stream, &mut *self.stats, &mut self.out);
        let tp = Instant::now();
        match p.static_set(li, pos0) {
            Some((sink, rest_end)) => {
                // GPU: the static part, queued now; CPU: the policy's search, at once.
                let dc = cache_of(&mut self.cache)?;
                let parts = decode_parts(&mut self.parts)?;
                let kv = KvView {
                    k: &dc.k[li],
                    v: &dc.v[li],
                    capacity: cap,
                };
                let e0 = record(s)?;
                let chunks =
                    self.dev
                        .range_parts(q, kv, (sink, rest_end, pos0 + 1), heads, parts)?;
                let e1 = record(s)?;
                let mut waited = (Duration::ZERO, Duration::ZERO);
                let mut supply = || -> Result<StaticParts> {
                    let asked = Instant::now();
                    waited.0 = asked - tp;
                    let m = s.clone_dtoh(&parts.0).map_err(cuda("downloading parts"))?;
                    let l = s.clone_dtoh(&parts.1).map_err(cuda("downloading parts"))?;
                    let o = s.clone_dtoh(&parts.2).map_err(cuda("downloading parts"))?;
                    waited.1 = asked.elapsed();
                    Ok(combine_parts(&m, &l, &o, n_heads, chunks, hd))
                };
                p.attend_split(step, &mut supply, out)?;
                stats.split_layer_steps += 1;
                stats.gpu_static_ms += elapsed_ms(&e0, &e1)?;
                stats.cpu_before_wait_ms += waited.0.as_secs_f64() * 1e3;
                stats.wait_ms += waited.1.as_secs_f64() * 1e3;
            }
            None => p.attend(step, out)?,
        }
        stats.policy_ms += tp.elapsed().as_secs_f64() * 1e3;
        s.memcpy_htod(out.as_slice(), att)
            .map_err(cuda("uploading attention"))
    }

    fn download(&mut self, x: CudaSlice<f32>) -> Result<Vec<f32>> {
        self.dev
            .stream
            .clone_dtoh(&x)
            .map_err(cuda("downloading hidden states"))
    }
}

/// The part buffers of a decode call (allocated when the call has one token).
/// The error of an operation that only the CPU backend has (Gemma 3's).
fn not_on_cuda(op: &str) -> ModelError {
    ModelError::DeviceState(format!(
        "{op} is not implemented on the CUDA backend: Gemma 3 runs on the CPU (--device cpu)"
    ))
}

fn decode_parts(parts: &mut Option<Parts>) -> Result<&mut Parts> {
    parts
        .as_mut()
        .ok_or_else(|| ModelError::DeviceState("decode part buffers missing".to_string()))
}

/// Merges `chunks` online-softmax parts per head (host arrays from the GPU) into one per head.
fn combine_parts(
    m: &[f32],
    l: &[f32],
    o: &[f32],
    n_heads: usize,
    chunks: usize,
    hd: usize,
) -> StaticParts {
    let mut out = StaticParts {
        max: vec![f32::NEG_INFINITY; n_heads],
        sum: vec![0.0; n_heads],
        o: vec![0.0; n_heads * hd],
    };
    for h in 0..n_heads {
        let range = h * chunks..(h + 1) * chunks;
        let max = m[range.clone()]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            continue;
        }
        out.max[h] = max;
        for c in range {
            if m[c] == f32::NEG_INFINITY {
                continue;
            }
            let w = (m[c] - max).exp();
            out.sum[h] += w * l[c];
            for (x, y) in out.o[h * hd..(h + 1) * hd]
                .iter_mut()
                .zip(&o[c * hd..(c + 1) * hd])
            {
                *x += w * y;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_chunk_parts_equal_one_part() {
        // Two heads, three chunks each (one empty), hd 2.
        let m = [
            1.0,
            f32::NEG_INFINITY,
            0.5,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
        ];
        let l = [2.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let o = [2.0, 4.0, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let p = combine_parts(&m, &l, &o, 2, 3, 2);
        let w = (0.5f32 - 1.0).exp();
        assert_eq!(p.max, vec![1.0, f32::NEG_INFINITY]);
        assert!((p.sum[0] - (2.0 + w)).abs() < 1e-6);
        assert!((p.o[0] - (2.0 + w)).abs() < 1e-6 && (p.o[1] - (4.0 - w)).abs() < 1e-6);
        assert_eq!(&p.o[2..], &[0.0, 0.0]);
        assert_eq!(p.sum[1], 0.0);
    }
}
