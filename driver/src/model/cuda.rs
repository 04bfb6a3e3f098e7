//! The CUDA backend of [`Llama`]: the same forward pass as the CPU code in `llama.rs`, on a GPU.
//!
//! - Weights are uploaded once (f32, dequantized on the host at load) with the RoPE tables.
//! - Linear layers are cuBLAS SGEMMs; RMSNorm, RoPE, SwiGLU, the embedding gather, the residual
//!   adds, the KV-cache writes and attention are the kernels of `kernels/llama.cu` (NVRTC).
//! - The host [`KvCache`] stays canonical: every forward call downloads the new keys and values
//!   into it (policies and captures read it), and the device mirrors it, re-uploading when the
//!   host cache is another one ([`KvCache::id`]) or was changed elsewhere.
//! - A decode step with a retrieval policy: the GPU computes q/k/v and the attention over the
//!   policy's static positions (sink and window) as online-softmax parts, while the CPU searches
//!   the layer's indexes (the policy, rayon over heads); the policy then takes the GPU's parts
//!   ([`DecodeAttention::attend_split`]), attends the retrieved keys and merges exactly.
//!   [`CudaStats`] records how the two overlapped.

use super::error::{ModelError, Result};
use super::llama::{
    Backend, CaptureFn, DecodeAttention, KvCache, LayerCapture, Llama, StaticParts, Timings,
};
use qkindex_gpu::cudarc::cublas::sys::cublasOperation_t;
use qkindex_gpu::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use qkindex_gpu::cudarc::driver::sys::CUevent_flags;
use qkindex_gpu::cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use qkindex_gpu::GpuError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keys per block of the split decode attention (`attention_partial_range`).
const DECODE_CHUNK: usize = 256;
/// Device KV caches kept at once (distinct host caches, e.g. `full` and a policy side by side).
const CACHES_KEPT: usize = 4;

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

/// A [`Backend`] running on one CUDA device.
pub struct CudaBackend {
    name: String,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("name", &self.name)
            .finish()
    }
}

struct Kernels {
    embed: CudaFunction,
    rms_norm: CudaFunction,
    rope: CudaFunction,
    swiglu: CudaFunction,
    add: CudaFunction,
    kv_write: CudaFunction,
    causal: CudaFunction,
    range: CudaFunction,
    ids: CudaFunction,
    merge: CudaFunction,
}

struct LayerW {
    attn_norm: CudaSlice<f32>,
    wq: CudaSlice<f32>,
    wk: CudaSlice<f32>,
    wv: CudaSlice<f32>,
    wo: CudaSlice<f32>,
    ffn_norm: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    down: CudaSlice<f32>,
}

struct DeviceWeights {
    embed: CudaSlice<f32>,
    layers: Vec<LayerW>,
    out_norm: CudaSlice<f32>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
}

struct DevCache {
    id: u64,
    capacity: usize,
    len: usize,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
}

/// The stream, cuBLAS and the kernels: what every launch needs.
struct Dev {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    f: Kernels,
}

struct Inner {
    _ctx: Arc<CudaContext>,
    dev: Dev,
    /// Uploaded on the first forward call (the model is known then).
    w: Option<DeviceWeights>,
    caches: Vec<DevCache>,
    stats: CudaStats,
}

fn cuda(what: &'static str) -> impl Fn(qkindex_gpu::cudarc::driver::DriverError) -> ModelError {
    move |e| {
        gpu_err(GpuError::Cuda {
            what,
            reason: format!("{e:?}"),
        })
    }
}

fn gpu_err(e: GpuError) -> ModelError {
    ModelError::Device(e.to_string())
}

impl CudaBackend {
    /// Opens CUDA device `ordinal`, compiles `kernels/llama.cu` and prepares cuBLAS. Weights are
    /// uploaded at the first forward call.
    pub fn new(ordinal: usize) -> Result<Self> {
        let (ctx, capability) = qkindex_gpu::open_device(ordinal).map_err(gpu_err)?;
        let device = ctx.name().unwrap_or_else(|_| "unknown".to_string());
        let ptx = qkindex_gpu::kernels::compile_llama(capability).map_err(gpu_err)?;
        let module = ctx
            .load_module(ptx)
            .map_err(cuda("loading kernels/llama.cu"))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(cuda("loading a kernel of kernels/llama.cu"))
        };
        let f = Kernels {
            embed: load("embed_gather")?,
            rms_norm: load("rms_norm")?,
            rope: load("rope")?,
            swiglu: load("swiglu")?,
            add: load("add_inplace")?,
            kv_write: load("kv_write")?,
            causal: load("attention_causal")?,
            range: load("attention_partial_range")?,
            ids: load("attention_partial_ids")?,
            merge: load("partial_merge")?,
        };
        // SAFETY: probes whether the cuBLAS library loads; no symbol is called.
        if !unsafe { qkindex_gpu::cudarc::cublas::sys::is_culib_present() } {
            return Err(gpu_err(GpuError::Unavailable(
                "cuBLAS (libcublas.so.13) is not on the library path".to_string(),
            )));
        }
        let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| {
            gpu_err(GpuError::Cuda {
                what: "cuBLAS init",
                reason: format!("{e:?}"),
            })
        })?;
        Ok(CudaBackend {
            name: format!("cuda:{ordinal} ({device})"),
            inner: Mutex::new(Inner {
                _ctx: ctx,
                dev: Dev { stream, blas, f },
                w: None,
                caches: Vec::new(),
                stats: CudaStats::default(),
            }),
        })
    }

    /// The accumulated time split.
    pub fn stats(&self) -> CudaStats {
        self.inner
            .lock()
            .map(|g| g.stats.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| ModelError::Device("a previous GPU call panicked".to_string()))
    }

    /// The attention kernels on their own (for timing against other implementations): causal
    /// attention of `n` queries at positions `pos0..` over a cache of `pos0 + n` keys, or, with
    /// `n = 1`, the split decode attention over all keys. Returns the output and the kernel time
    /// (CUDA events, ms). `q` is `n × (n_heads·hd)`; `k`, `v` are `n_kv` blocks of
    /// `keys × hd`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_only(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        keys: usize,
        heads: (usize, usize, usize),
    ) -> Result<(Vec<f32>, f64)> {
        let g = self.lock()?;
        let (n_heads, n_kv, hd) = heads;
        let s = &g.dev.stream;
        let qd = s.clone_htod(q).map_err(cuda("upload"))?;
        let kd = s.clone_htod(k).map_err(cuda("upload"))?;
        let vd = s.clone_htod(v).map_err(cuda("upload"))?;
        let mut out = s
            .alloc_zeros::<f32>(n * n_heads * hd)
            .map_err(cuda("alloc"))?;
        let mut parts = g.dev.alloc_parts(n_heads, keys, hd)?;
        let e0 = event(s)?;
        if n == 1 {
            g.dev.decode_full(
                &qd,
                &kd,
                &vd,
                keys,
                keys,
                (n_heads, n_kv, hd),
                &mut parts,
                &mut out,
            )?;
        } else {
            g.dev.causal(
                &qd,
                &kd,
                &vd,
                n,
                keys - n,
                keys,
                (n_heads, n_kv, hd),
                &mut out,
            )?;
        }
        let e1 = event(s)?;
        let ms = elapsed(&e0, &e1)?;
        let host = s.clone_dtoh(&out).map_err(cuda("download"))?;
        Ok((host, ms))
    }

    /// Indexed attention of one decode query: per head, only the rows `ids[h]` of its KV head
    /// (no gathered copy). Returns the normalized output (`n_heads × hd`).
    pub fn attention_ids(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        keys: usize,
        ids: &[u32],
        heads: (usize, usize, usize),
    ) -> Result<Vec<f32>> {
        let g = self.lock()?;
        let (n_heads, n_kv, hd) = heads;
        let per_head = ids.len() / n_heads.max(1);
        let s = &g.dev.stream;
        let qd = s.clone_htod(q).map_err(cuda("upload"))?;
        let kd = s.clone_htod(k).map_err(cuda("upload"))?;
        let vd = s.clone_htod(v).map_err(cuda("upload"))?;
        let idd = s.clone_htod(ids).map_err(cuda("upload"))?;
        let mut pm = s.alloc_zeros::<f32>(n_heads).map_err(cuda("alloc"))?;
        let mut pl = s.alloc_zeros::<f32>(n_heads).map_err(cuda("alloc"))?;
        let mut po = s.alloc_zeros::<f32>(n_heads * hd).map_err(cuda("alloc"))?;
        let (nh, nk, hdi, cap) = (n_heads as i32, n_kv as i32, hd as i32, keys as i32);
        let (scale, per) = (1.0f32 / (hd as f32).sqrt(), per_head as i32);
        let mut b = s.launch_builder(&g.dev.f.ids);
        b.arg(&qd)
            .arg(&kd)
            .arg(&vd)
            .arg(&nh)
            .arg(&nk)
            .arg(&hdi)
            .arg(&cap)
            .arg(&scale)
            .arg(&idd)
            .arg(&per)
            .arg(&mut pm)
            .arg(&mut pl)
            .arg(&mut po);
        // SAFETY: attention_partial_ids(q, k_cache, v_cache, n_heads, n_kv, hd, capacity, scale,
        // ids, ids_per_head, part_m, part_l, part_o): buffers sized as documented in llama.cu.
        unsafe { b.launch(cfg1(n_heads as u32, 1, 128)) }.map_err(cuda("attention_partial_ids"))?;
        let mut out = s.alloc_zeros::<f32>(n_heads * hd).map_err(cuda("alloc"))?;
        g.dev.merge(&pm, &pl, &po, n_heads, 1, hd, &mut out)?;
        s.clone_dtoh(&out).map_err(cuda("download"))
    }
}

fn event(s: &Arc<CudaStream>) -> Result<CudaEvent> {
    s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda("recording an event"))
}

fn elapsed(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(cuda("reading an event"))
}

fn cfg1(grid_x: u32, grid_y: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_x.max(1), grid_y.max(1), 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn grid_for(n: usize, block: usize) -> u32 {
    n.div_ceil(block).clamp(1, 65_535) as u32
}

impl Inner {
    fn upload_weights(&mut self, model: &Llama) -> Result<()> {
        if self.w.is_some() {
            return Ok(());
        }
        let s = &self.dev.stream;
        let up = |x: &[f32]| s.clone_htod(x).map_err(cuda("uploading weights"));
        let w = model.weights();
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(LayerW {
                    attn_norm: up(&l.attn_norm)?,
                    wq: up(&l.wq)?,
                    wk: up(&l.wk)?,
                    wv: up(&l.wv)?,
                    wo: up(&l.wo)?,
                    ffn_norm: up(&l.ffn_norm)?,
                    gate: up(&l.w_gate)?,
                    up: up(&l.w_up)?,
                    down: up(&l.w_down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (cos, sin) = model.rope_tables();
        self.w = Some(DeviceWeights {
            embed: up(&w.embed)?,
            layers,
            out_norm: up(&w.out_norm)?,
            cos: up(cos)?,
            sin: up(sin)?,
        });
        Ok(())
    }

    /// The device mirror of `cache` (uploaded unless it already mirrors it), moved to the end of
    /// the list; returns its index.
    fn mirror(&mut self, cache: &KvCache, model: &Llama) -> Result<usize> {
        let c = &model.cfg;
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
        let mut k = Vec::with_capacity(c.n_layers);
        let mut v = Vec::with_capacity(c.n_layers);
        for li in 0..c.n_layers {
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

impl Dev {
    /// `y (rows × out) = x (rows × in) · wᵀ` with `w` row-major `out × in`.
    fn linear(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        w: &CudaSlice<f32>,
        out: usize,
        inp: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        // Column-major: yᵀ (out × rows) = op(w) · xᵀ with w read as (in × out), transposed.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: out as i32,
            n: rows as i32,
            k: inp as i32,
            alpha: 1.0f32,
            lda: inp as i32,
            ldb: inp as i32,
            beta: 0.0f32,
            ldc: out as i32,
        };
        // SAFETY: w holds out × in, x rows × in, y rows × out floats (allocated so by callers).
        unsafe { self.blas.gemm(cfg, w, x, y) }.map_err(|e| {
            gpu_err(GpuError::Cuda {
                what: "cublasSgemm",
                reason: format!("{e:?}"),
            })
        })
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (r, d) = (rows as i32, dim as i32);
        let mut b = self.stream.launch_builder(&self.f.rms_norm);
        b.arg(x).arg(w).arg(&r).arg(&d).arg(&eps).arg(out);
        // SAFETY: rms_norm(x, w, rows, dim, eps, out): x and out rows × dim, w dim.
        unsafe { b.launch(cfg1(rows as u32, 1, 256)) }.map_err(cuda("rms_norm"))?;
        Ok(())
    }

    /// `x = rms_norm(x) · w` in place (the kernel allows `out == x`).
    fn rms_norm_inplace(
        &self,
        x: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let (r, d) = (rows as i32, dim as i32);
        let mut b = self.stream.launch_builder(&self.f.rms_norm);
        // The same buffer as input and output: pass its pointer twice through a view.
        let view = x.slice(..);
        b.arg(&view).arg(w).arg(&r).arg(&d).arg(&eps).arg(&view);
        // SAFETY: rms_norm(x, w, rows, dim, eps, out) with out == x, which the kernel allows
        // (each block reads its row into registers/shared memory before writing it).
        unsafe { b.launch(cfg1(rows as u32, 1, 256)) }.map_err(cuda("rms_norm"))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        w: &DeviceWeights,
        rows: usize,
        heads: usize,
        half: usize,
        pos0: usize,
    ) -> Result<()> {
        let (r, h, hf, p) = (rows as i32, heads as i32, half as i32, pos0 as i32);
        let mut b = self.stream.launch_builder(&self.f.rope);
        b.arg(x)
            .arg(&w.cos)
            .arg(&w.sin)
            .arg(&r)
            .arg(&h)
            .arg(&hf)
            .arg(&p);
        // SAFETY: rope(x, cos, sin, rows, n_heads, half, pos0): x rows × heads·2·half; tables
        // cover positions < context length ≥ pos0 + rows (checked by the caller).
        unsafe { b.launch(cfg1(grid_for(rows * heads * half, 256), 1, 256)) }
            .map_err(cuda("rope"))?;
        Ok(())
    }

    fn elementwise(
        &self,
        f: &CudaFunction,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        what: &'static str,
    ) -> Result<()> {
        let n = x.len() as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&n);
        // SAFETY: swiglu(gate, up, n) / add_inplace(x, h, n): both buffers hold n floats.
        unsafe { b.launch(cfg1(grid_for(n as usize, 256), 1, 256)) }.map_err(cuda(what))?;
        Ok(())
    }

    /// Causal attention of `n` query rows at positions `pos0..` over `k`, `v` blocks of
    /// `capacity` rows.
    #[allow(clippy::too_many_arguments)]
    fn causal(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        n: usize,
        pos0: usize,
        capacity: usize,
        heads: (usize, usize, usize),
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (n_heads, n_kv, hd) = heads;
        let (ni, p0, nh, nk, hdi, cap) = (
            n as i32,
            pos0 as i32,
            n_heads as i32,
            n_kv as i32,
            hd as i32,
            capacity as i32,
        );
        let scale = 1.0f32 / (hd as f32).sqrt();
        let mut b = self.stream.launch_builder(&self.f.causal);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(out)
            .arg(&ni)
            .arg(&p0)
            .arg(&nh)
            .arg(&nk)
            .arg(&hdi)
            .arg(&cap)
            .arg(&scale);
        let group = n_heads / n_kv;
        let blocks = (n * group).div_ceil(16) * n_kv;
        // SAFETY: attention_causal(q, k_cache, v_cache, out, n, pos0, n_heads, n_kv, hd, capacity,
        // scale): blocks of exactly 128 threads, each taking 16 stacked query rows of one KV head
        // (any grid is correct; this one gives every block one work item); hd ≤ 128, hd % 4 = 0,
        // buffers 16-byte aligned (cudarc allocations), cache rows 0..pos0 + n written.
        unsafe { b.launch(cfg1(grid_for(blocks, 1), 1, 128)) }.map_err(cuda("attention_causal"))?;
        Ok(())
    }

    /// Online-softmax parts of one decode query over positions `0..sink` and `rest_end..keys`,
    /// in chunks of [`DECODE_CHUNK`]; returns the chunk count per head.
    #[allow(clippy::too_many_arguments)]
    fn range_parts(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        capacity: usize,
        (sink, rest_end, keys): (usize, usize, usize),
        heads: (usize, usize, usize),
        parts: &mut Parts,
    ) -> Result<usize> {
        let (n_heads, n_kv, hd) = heads;
        let set = sink.min(keys) + keys.saturating_sub(rest_end.max(sink.min(keys)));
        let chunks = set.div_ceil(DECODE_CHUNK).max(1);
        let (nh, nk, hdi, cap) = (n_heads as i32, n_kv as i32, hd as i32, capacity as i32);
        let (si, re, ki, ch) = (
            sink as i32,
            rest_end as i32,
            keys as i32,
            DECODE_CHUNK as i32,
        );
        let scale = 1.0f32 / (hd as f32).sqrt();
        let mut b = self.stream.launch_builder(&self.f.range);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(&nh)
            .arg(&nk)
            .arg(&hdi)
            .arg(&cap)
            .arg(&scale)
            .arg(&si)
            .arg(&re)
            .arg(&ki)
            .arg(&ch)
            .arg(&mut parts.0)
            .arg(&mut parts.1)
            .arg(&mut parts.2);
        // SAFETY: attention_partial_range(q, k_cache, v_cache, n_heads, n_kv, hd, capacity, scale,
        // sink, rest_end, n_keys, chunk, part_m, part_l, part_o); grid (n_heads, chunks); the
        // parts hold n_heads·chunks (·hd) floats (allocated by the caller for DECODE_CHUNK).
        unsafe { b.launch(cfg1(n_heads as u32, chunks as u32, 128)) }
            .map_err(cuda("attention_partial_range"))?;
        Ok(chunks)
    }

    #[allow(clippy::too_many_arguments)]
    fn merge(
        &self,
        m: &CudaSlice<f32>,
        l: &CudaSlice<f32>,
        o: &CudaSlice<f32>,
        n_heads: usize,
        per_head: usize,
        hd: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (nh, ph, hdi) = (n_heads as i32, per_head as i32, hd as i32);
        let mut b = self.stream.launch_builder(&self.f.merge);
        b.arg(m).arg(l).arg(o).arg(&nh).arg(&ph).arg(&hdi).arg(out);
        // SAFETY: partial_merge(part_m, part_l, part_o, n_heads, parts_per_head, hd, out).
        unsafe { b.launch(cfg1(n_heads as u32, 1, 128)) }.map_err(cuda("partial_merge"))?;
        Ok(())
    }

    /// Part buffers (max, sum, o) for a decode query over up to `max_keys` keys.
    fn alloc_parts(&self, n_heads: usize, max_keys: usize, hd: usize) -> Result<Parts> {
        let parts = n_heads * max_keys.div_ceil(DECODE_CHUNK).max(1);
        let s = &self.stream;
        Ok((
            s.alloc_zeros::<f32>(parts).map_err(cuda("alloc"))?,
            s.alloc_zeros::<f32>(parts).map_err(cuda("alloc"))?,
            s.alloc_zeros::<f32>(parts * hd).map_err(cuda("alloc"))?,
        ))
    }

    /// Full attention of one decode query over `keys` positions: split over key chunks, merged.
    #[allow(clippy::too_many_arguments)]
    fn decode_full(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        keys: usize,
        capacity: usize,
        heads: (usize, usize, usize),
        parts: &mut Parts,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (n_heads, _, hd) = heads;
        // All keys as the "sink": positions 0..keys.
        let chunks = self.range_parts(q, k, v, capacity, (keys, keys, keys), heads, parts)?;
        self.merge(&parts.0, &parts.1, &parts.2, n_heads, chunks, hd, out)
    }
}

/// The part buffers of a decode call (allocated when the call has one token).
fn decode_parts(parts: &mut Option<Parts>) -> Result<&mut Parts> {
    parts
        .as_mut()
        .ok_or_else(|| ModelError::Device("decode part buffers missing".to_string()))
}

/// Online-softmax part buffers on the device: max, sum and unnormalized output per (head, chunk).
type Parts = (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>);

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

impl Backend for CudaBackend {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::to_value(CudaBackend::stats(self)).unwrap_or_default()
    }

    fn forward(
        &self,
        model: &Llama,
        tokens: &[u32],
        cache: &mut KvCache,
        mut capture: Option<&mut CaptureFn<'_>>,
        mut policy: Option<&mut dyn DecodeAttention>,
        timings: &mut Timings,
    ) -> Result<Vec<f32>> {
        let wall = Instant::now();
        let mut guard = self.lock()?;
        guard.upload_weights(model)?;
        let ci = guard.mirror(cache, model)?;
        let Inner {
            dev: g,
            w,
            caches,
            stats,
            ..
        } = &mut *guard;
        let w = w
            .as_ref()
            .ok_or_else(|| ModelError::Device("weights not uploaded".into()))?;
        let c = &model.cfg;
        let (n, pos0) = (tokens.len(), cache.len());
        let (dim, hd) = (c.dim, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
        let heads = (c.n_heads, c.n_kv_heads, hd);
        let cap = cache.capacity();
        let s = g.stream.clone();
        let alloc = |len: usize| {
            s.alloc_zeros::<f32>(len)
                .map_err(cuda("allocating activations"))
        };
        let tok = s.clone_htod(tokens).map_err(cuda("uploading tokens"))?;
        let mut x = alloc(n * dim)?;
        let (mut h, mut q, mut k, mut v) = (
            alloc(n * dim)?,
            alloc(n * q_dim)?,
            alloc(n * kv_dim)?,
            alloc(n * kv_dim)?,
        );
        let (mut att, mut gate, mut up) = (
            alloc(n * q_dim)?,
            alloc(n * c.ffn_dim)?,
            alloc(n * c.ffn_dim)?,
        );
        {
            let (ni, d) = (n as i32, dim as i32);
            let mut b = s.launch_builder(&g.f.embed);
            b.arg(&w.embed).arg(&tok).arg(&ni).arg(&d).arg(&mut x);
            // SAFETY: embed_gather(table, tokens, n, dim, out): tokens < vocab (checked by
            // Llama::forward_with), out n × dim.
            unsafe { b.launch(cfg1(n as u32, 1, 256)) }.map_err(cuda("embed_gather"))?;
        }
        // Decode steps: the part buffers and the host output, once per call, not per layer.
        let mut parts = if n == 1 {
            Some(g.alloc_parts(c.n_heads, pos0 + 1, hd)?)
        } else {
            None
        };
        let mut out = vec![0f32; if n == 1 { q_dim } else { 0 }];
        let t_other = Instant::now();
        let mut attention = Duration::ZERO;
        for (li, lw) in w.layers.iter().enumerate() {
            g.rms_norm(&x, &lw.attn_norm, n, dim, c.rms_eps, &mut h)?;
            g.linear(&h, n, &lw.wq, q_dim, dim, &mut q)?;
            g.linear(&h, n, &lw.wk, kv_dim, dim, &mut k)?;
            g.linear(&h, n, &lw.wv, kv_dim, dim, &mut v)?;
            g.rope(&mut q, w, n, c.n_heads, hd / 2, pos0)?;
            g.rope(&mut k, w, n, c.n_kv_heads, hd / 2, pos0)?;
            {
                let dc = &mut caches[ci];
                let (ni, nk, hdi, capi, p0) = (
                    n as i32,
                    c.n_kv_heads as i32,
                    hd as i32,
                    cap as i32,
                    pos0 as i32,
                );
                let mut b = s.launch_builder(&g.f.kv_write);
                b.arg(&k)
                    .arg(&v)
                    .arg(&mut dc.k[li])
                    .arg(&mut dc.v[li])
                    .arg(&ni)
                    .arg(&nk)
                    .arg(&hdi)
                    .arg(&capi)
                    .arg(&p0);
                // SAFETY: kv_write(k, v, k_cache, v_cache, rows, n_kv, hd, capacity, pos0):
                // pos0 + rows ≤ capacity (checked by Llama::forward_with).
                unsafe { b.launch(cfg1(grid_for(n * kv_dim, 256), 1, 256)) }
                    .map_err(cuda("kv_write"))?;
            }
            // The host cache stays canonical: the new rows come back every call.
            let kh = s.clone_dtoh(&k).map_err(cuda("downloading keys"))?;
            let vh = s.clone_dtoh(&v).map_err(cuda("downloading values"))?;
            {
                let (kc, vc) = cache.layer_mut(li);
                for r in 0..n {
                    for gi in 0..c.n_kv_heads {
                        let dst = (gi * cap + pos0 + r) * hd;
                        let src = r * kv_dim + gi * hd;
                        kc[dst..dst + hd].copy_from_slice(&kh[src..src + hd]);
                        vc[dst..dst + hd].copy_from_slice(&vh[src..src + hd]);
                    }
                }
            }
            let use_policy = n == 1 && policy.is_some();
            let qh = if capture.is_some() || use_policy {
                s.clone_dtoh(&q).map_err(cuda("downloading queries"))?
            } else {
                Vec::new()
            };
            if let Some(cb) = capture.as_deref_mut() {
                cb(LayerCapture {
                    layer: li,
                    pos0,
                    n,
                    q: &qh,
                    k: &kh,
                    v: &vh,
                });
            }
            let ta = Instant::now();
            let dc = &caches[ci];
            match policy.as_deref_mut() {
                Some(p) if n == 1 => {
                    let (kc, vc) = cache.layer(li);
                    let tp = Instant::now();
                    match p.static_set(li, pos0) {
                        Some((sink, rest_end)) => {
                            // GPU: the static part, queued now; CPU: the policy's search, at once.
                            let parts = decode_parts(&mut parts)?;
                            let e0 = event(&s)?;
                            let chunks = g.range_parts(
                                &q,
                                &dc.k[li],
                                &dc.v[li],
                                cap,
                                (sink, rest_end, pos0 + 1),
                                heads,
                                parts,
                            )?;
                            let e1 = event(&s)?;
                            let mut waited = (Duration::ZERO, Duration::ZERO);
                            let mut supply = || -> Result<StaticParts> {
                                let asked = Instant::now();
                                waited.0 = asked - tp;
                                let m =
                                    s.clone_dtoh(&parts.0).map_err(cuda("downloading parts"))?;
                                let l =
                                    s.clone_dtoh(&parts.1).map_err(cuda("downloading parts"))?;
                                let o =
                                    s.clone_dtoh(&parts.2).map_err(cuda("downloading parts"))?;
                                waited.1 = asked.elapsed();
                                Ok(combine_parts(&m, &l, &o, c.n_heads, chunks, hd))
                            };
                            p.attend_split(li, pos0, &qh, kc, vc, cap, &mut supply, &mut out)?;
                            stats.split_layer_steps += 1;
                            stats.gpu_static_ms += elapsed(&e0, &e1)?;
                            stats.cpu_before_wait_ms += waited.0.as_secs_f64() * 1e3;
                            stats.wait_ms += waited.1.as_secs_f64() * 1e3;
                        }
                        None => p.attend(li, pos0, &qh, kc, vc, cap, &mut out)?,
                    }
                    stats.policy_ms += tp.elapsed().as_secs_f64() * 1e3;
                    s.memcpy_htod(&out, &mut att)
                        .map_err(cuda("uploading attention"))?;
                }
                _ if n == 1 => {
                    let parts = decode_parts(&mut parts)?;
                    g.decode_full(
                        &q,
                        &dc.k[li],
                        &dc.v[li],
                        pos0 + 1,
                        cap,
                        heads,
                        parts,
                        &mut att,
                    )?
                }
                _ => g.causal(&q, &dc.k[li], &dc.v[li], n, pos0, cap, heads, &mut att)?,
            }
            attention += ta.elapsed();
            g.linear(&att, n, &lw.wo, dim, q_dim, &mut h)?;
            g.elementwise(&g.f.add, &mut x, &h, "add_inplace")?;
            g.rms_norm(&x, &lw.ffn_norm, n, dim, c.rms_eps, &mut h)?;
            g.linear(&h, n, &lw.gate, c.ffn_dim, dim, &mut gate)?;
            g.linear(&h, n, &lw.up, c.ffn_dim, dim, &mut up)?;
            g.elementwise(&g.f.swiglu, &mut gate, &up, "swiglu")?;
            g.linear(&gate, n, &lw.down, dim, c.ffn_dim, &mut h)?;
            g.elementwise(&g.f.add, &mut x, &h, "add_inplace")?;
        }
        g.rms_norm_inplace(&mut x, &w.out_norm, n, dim, c.rms_eps)?;
        let hidden = s
            .clone_dtoh(&x)
            .map_err(cuda("downloading hidden states"))?;
        cache.set_len(pos0 + n);
        caches[ci].len = pos0 + n;
        // The GPU queue is synchronous at the download above: host intervals are real.
        timings.attention += attention;
        timings.other += t_other.elapsed().saturating_sub(attention);
        stats.forward_calls += 1;
        stats.forward_ms += wall.elapsed().as_secs_f64() * 1e3;
        Ok(hidden)
    }

    fn logits(&self, model: &Llama, hidden: &[f32], timings: &mut Timings) -> Result<Vec<f32>> {
        let t0 = Instant::now();
        let mut g = self.lock()?;
        g.upload_weights(model)?;
        let c = &model.cfg;
        let rows = hidden.len() / c.dim;
        let s = g.dev.stream.clone();
        let x = s
            .clone_htod(hidden)
            .map_err(cuda("uploading hidden states"))?;
        let mut y = s
            .alloc_zeros::<f32>(rows * c.vocab_size)
            .map_err(cuda("allocating logits"))?;
        let w =
            g.w.as_ref()
                .ok_or_else(|| ModelError::Device("weights not uploaded".into()))?;
        g.dev
            .linear(&x, rows, &w.embed, c.vocab_size, c.dim, &mut y)?;
        let out = s.clone_dtoh(&y).map_err(cuda("downloading logits"))?;
        timings.matmul += t0.elapsed();
        Ok(out)
    }
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

    #[test]
    fn without_a_gpu_new_is_a_clean_error() {
        match CudaBackend::new(0) {
            Ok(b) => println!("GPU present: {}", b.name()),
            Err(e) => {
                println!("skipped: {e}");
                assert!(e.to_string().contains("no usable GPU"), "{e}");
            }
        }
    }
}
