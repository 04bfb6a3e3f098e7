//! [`CudaKnn`]: exact batched top-k on an NVIDIA GPU.
//!
//! Two paths, chosen per call ([`KernelPath`]):
//! - **fused** (`fused_score_topk`): each block scores 64 queries against all keys with
//!   tensor-core `mma.sync` and filters the scores in registers against each row's running k-th
//!   score, so the `m × n` score matrix never goes through memory. Needs `dim ≤ 128`.
//! - **gemm**: cuBLAS `GemmEx` (f16 inputs, f32 accumulate and output) writes a tile of scores,
//!   `topk_select_tile` filters it and merges into the running lists. Any dimension.
//!
//! Queries run in chunks on two streams: while the GPU computes chunk c, the next chunk's queries
//! are uploaded and the previous chunk's lists come back. Tiles are sized from free device memory.

use crate::kernels::{self, FUSED_BM, FUSED_BN, FUSED_THREADS, MAX_K, SELECT_ROWS_PER_BLOCK};
use crate::{GpuError, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg,
};
use half::f16;
use qkindex::knn::check_knn_args;
use qkindex::store::KeysRef;
use qkindex::{KeyStore, KnnBackend, KnnOptions, KnnResult};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Which kernels compute the top-k.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelPath {
    /// Fused when the dimension allows it (≤ 128), else GEMM.
    Auto,
    /// Scores and selection in one kernel.
    Fused,
    /// cuBLAS GEMM tiles, then selection.
    Gemm,
}

/// Options of [`CudaKnn`].
#[derive(Clone, Debug)]
pub struct CudaKnnOptions {
    pub path: KernelPath,
    /// Rescore the chosen ids exactly in f32 on the host and re-sort them (default true). Without
    /// it the scores are the GPU's f16-input products.
    pub rescore: bool,
    /// Queries per chunk (0: chosen from the problem and free memory).
    pub query_chunk: usize,
}

impl Default for CudaKnnOptions {
    fn default() -> Self {
        CudaKnnOptions {
            path: KernelPath::Auto,
            rescore: true,
            query_chunk: 0,
        }
    }
}

/// Where the time of one [`CudaKnn::run`] went, in milliseconds. GPU intervals are CUDA events.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// The path that ran (`fused` or `gemm`).
    pub path: String,
    /// Host conversion of queries and keys to padded f16.
    pub prepare_ms: f64,
    /// Host-to-device copies (copy stream).
    pub upload_ms: f64,
    /// Kernels only: the sum over chunks of the compute stream's busy intervals.
    pub kernel_ms: f64,
    /// Of `kernel_ms`, the cuBLAS GEMMs (gemm path only).
    pub gemm_ms: f64,
    /// Device-to-host copies of the results.
    pub download_ms: f64,
    /// Exact f32 rescoring and re-sorting on the host.
    pub rescore_ms: f64,
    /// The whole call, host clock.
    pub wall_ms: f64,
    pub chunks: usize,
}

/// Opens CUDA device `ordinal` for this crate's kernels (compute capability 8.0 or newer). Fails
/// with [`GpuError::Unavailable`] and the reason where there is no usable GPU.
pub fn open_device(ordinal: usize) -> Result<(Arc<CudaContext>, (i32, i32))> {
    // SAFETY: probes whether the driver library loads; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::Unavailable(
            "the CUDA driver library (libcuda.so) is not installed".to_string(),
        ));
    }
    let count = CudaContext::device_count()
        .map_err(|e| GpuError::Unavailable(format!("the CUDA driver reports {e:?}")))?;
    if ordinal >= count.max(0) as usize {
        return Err(GpuError::Unavailable(format!(
            "device cuda:{ordinal} requested, {count} CUDA device(s) present"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::cuda("opening the device", e))?;
    let capability = ctx
        .compute_capability()
        .map_err(|e| GpuError::cuda("reading the compute capability", e))?;
    if capability.0 < 8 {
        return Err(GpuError::Unavailable(format!(
            "compute capability {}.{}: the kernels need 8.0 or newer (mma.sync m16n8k16)",
            capability.0, capability.1
        )));
    }
    Ok((ctx, capability))
}

/// Exact top-k by inner product on one CUDA device. Implements [`KnnBackend`].
pub struct CudaKnn {
    name: String,
    device_name: String,
    options: CudaKnnOptions,
    gpu: Mutex<Gpu>,
}

impl std::fmt::Debug for CudaKnn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKnn")
            .field("name", &self.name)
            .field("device", &self.device_name)
            .field("options", &self.options)
            .finish()
    }
}

struct Gpu {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    blas: Option<CudaBlas>,
    init: CudaFunction,
    select: CudaFunction,
    fused: CudaFunction,
    /// Dynamic shared memory a block may opt into.
    smem_optin: usize,
}

impl CudaKnn {
    /// Opens device `ordinal`, compiles the kernels with NVRTC and loads them. Fails with
    /// [`GpuError::Unavailable`] (and the reason) where there is no usable GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        let (ctx, capability) = open_device(ordinal)?;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".to_string());
        let ptx = kernels::compile_topk(capability)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| GpuError::cuda("loading kernels/topk.cu", e))?;
        let load = |name: &'static str| {
            module
                .load_function(name)
                .map_err(|e| GpuError::cuda("loading a kernel", (name, e)))
        };
        let (init, select, fused) = (
            load("topk_init")?,
            load("topk_select_tile")?,
            load("fused_score_topk")?,
        );
        let smem_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| GpuError::cuda("reading the shared-memory limit", e))?
            .max(0) as usize;
        let compute = ctx
            .new_stream()
            .map_err(|e| GpuError::cuda("creating a stream", e))?;
        let copy = ctx
            .new_stream()
            .map_err(|e| GpuError::cuda("creating a stream", e))?;
        // cuBLAS is only needed by the GEMM path; without it the fused path still runs.
        // SAFETY: probes whether the cuBLAS library loads; no symbol is called.
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            Some(CudaBlas::new(compute.clone()).map_err(|e| GpuError::cuda("cuBLAS init", e))?)
        } else {
            None
        };
        Ok(CudaKnn {
            name: format!("cuda:{ordinal}"),
            device_name,
            options: CudaKnnOptions::default(),
            gpu: Mutex::new(Gpu {
                ctx,
                compute,
                copy,
                blas,
                init,
                select,
                fused,
                smem_optin,
            }),
        })
    }

    /// The same backend with other options.
    pub fn with_options(mut self, options: CudaKnnOptions) -> Self {
        self.options = options;
        self
    }

    /// Changes the options (kept: the device, the compiled kernels, cuBLAS).
    pub fn set_options(&mut self, options: CudaKnnOptions) {
        self.options = options;
    }

    /// The GPU's name as the driver reports it (for example "NVIDIA H200").
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Whether cuBLAS was found (the GEMM path needs it).
    pub fn has_cublas(&self) -> bool {
        self.lock().map(|g| g.blas.is_some()).unwrap_or(false)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Gpu>> {
        self.gpu
            .lock()
            .map_err(|_| GpuError::Unavailable("a previous GPU call panicked".to_string()))
    }

    /// Exact top-`k` of each query (row-major `m × dim` f32) with the time split.
    pub fn run(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> Result<(KnnResult, Timings)> {
        let wall = Instant::now();
        let m = check_knn_args(queries, keys, k)?;
        if k > MAX_K {
            return Err(GpuError::Input(format!(
                "k = {k} exceeds the GPU kernels' limit of {MAX_K}; use device=cpu"
            )));
        }
        let d = keys.dim();
        let n = keys.len();
        let dp = d.next_multiple_of(16);
        let gpu = self.lock()?;
        let path = self.resolve_path(&gpu, dp)?;
        let mut t = Timings {
            path: format!("{path:?}").to_lowercase(),
            ..Default::default()
        };

        let started = Instant::now();
        let (kh, key_scale) = pad_keys(keys, dp, FUSED_BN);
        let chunk = self.query_chunk(&gpu, path, m, n, dp, k)?;
        t.prepare_ms = ms(started);

        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let ev = |s: &Arc<CudaStream>| {
            s.record_event(timed)
                .map_err(|e| GpuError::cuda("recording an event", e))
        };
        let up0 = ev(&gpu.copy)?;
        let kd = gpu
            .copy
            .clone_htod(&kh)
            .map_err(|e| GpuError::cuda("uploading keys", e))?;
        let up1 = ev(&gpu.copy)?;
        t.upload_ms += elapsed(&up0, &up1)?;
        drop(kh);

        let mut ids = vec![KnnResult::PAD; m * k];
        let mut scores = vec![f32::NEG_INFINITY; m * k];
        let mut query_scales = vec![1.0f32; m];
        // Score tile of the GEMM path, reused by every chunk.
        let mut tile: Option<(CudaSlice<f32>, usize)> = None;
        let mut pending: Option<Pending> = None;
        let mut q0 = 0;
        while q0 < m {
            options.cancel.check("GPU exact top-k")?;
            let rows = chunk.min(m - q0);
            let started = Instant::now();
            let (qh, scales) = pad_queries(&queries[q0 * d..(q0 + rows) * d], d, dp, FUSED_BM);
            query_scales[q0..q0 + rows].copy_from_slice(&scales);
            t.prepare_ms += ms(started);

            let e0 = ev(&gpu.copy)?;
            let qd = gpu
                .copy
                .clone_htod(&qh)
                .map_err(|e| GpuError::cuda("uploading queries", e))?;
            let e1 = ev(&gpu.copy)?;
            gpu.compute
                .wait(&e1)
                .map_err(|e| GpuError::cuda("ordering streams", e))?;
            let mut best_s = gpu
                .compute
                .alloc_zeros::<f32>(rows * k)
                .map_err(|e| GpuError::cuda("allocating result lists", e))?;
            let mut best_i = gpu
                .compute
                .alloc_zeros::<u32>(rows * k)
                .map_err(|e| GpuError::cuda("allocating result lists", e))?;
            let c0 = ev(&gpu.compute)?;
            launch_init(&gpu, &mut best_s, &mut best_i)?;
            match path {
                KernelPath::Fused => launch_fused(
                    &gpu,
                    &qd,
                    &kd,
                    (rows, n, dp, q0),
                    options.causal,
                    k,
                    (&mut best_s, &mut best_i),
                )?,
                _ => {
                    let key_tile = self.key_tile(&gpu, chunk, n)?;
                    if tile.as_ref().is_none_or(|(_, cols)| *cols != key_tile) {
                        let buf = gpu
                            .compute
                            .alloc_zeros::<f32>(chunk * key_tile)
                            .map_err(|e| GpuError::cuda("allocating the score tile", e))?;
                        tile = Some((buf, key_tile));
                    }
                    let Some((buf, _)) = tile.as_mut() else {
                        unreachable!("the tile was just allocated")
                    };
                    t.gemm_ms += run_gemm_select(
                        &gpu,
                        &qd,
                        &kd,
                        buf,
                        key_tile,
                        (rows, n, dp, q0),
                        options.causal,
                        k,
                        (&mut best_s, &mut best_i),
                    )?;
                }
            }
            let c1 = ev(&gpu.compute)?;
            t.upload_ms += elapsed(&e0, &e1)?;
            // The previous chunk comes back while this one computes.
            if let Some(p) = pending.take() {
                t.download_ms += p.download(&gpu, &mut ids, &mut scores)?;
            }
            t.kernel_ms += elapsed(&c0, &c1)?;
            pending = Some(Pending {
                q0,
                rows,
                k,
                best_s,
                best_i,
                _queries: qd,
            });
            t.chunks += 1;
            q0 += rows;
        }
        if let Some(p) = pending.take() {
            t.download_ms += p.download(&gpu, &mut ids, &mut scores)?;
        }
        drop(gpu);

        let started = Instant::now();
        if self.options.rescore {
            rescore(queries, keys, k, &mut ids, &mut scores);
        } else {
            unscale(&mut scores, k, &query_scales, key_scale);
        }
        t.rescore_ms = ms(started);
        t.wall_ms = ms(wall);
        Ok((KnnResult { k, ids, scores }, t))
    }

    fn resolve_path(&self, gpu: &Gpu, dp: usize) -> Result<KernelPath> {
        let fused_fits = dp <= 128 && kernels::fused_smem_bytes(dp) <= gpu.smem_optin;
        match self.options.path {
            KernelPath::Fused if !fused_fits => Err(GpuError::Input(format!(
                "the fused kernel needs dim ≤ 128 (padded {dp}); use the gemm path"
            ))),
            KernelPath::Gemm if gpu.blas.is_none() => Err(GpuError::Unavailable(
                "the GEMM path needs cuBLAS (libcublas.so.13), which is not on the library path"
                    .to_string(),
            )),
            KernelPath::Auto if fused_fits => Ok(KernelPath::Fused),
            KernelPath::Auto if gpu.blas.is_none() => Err(GpuError::Unavailable(format!(
                "dim {dp} needs the GEMM path, and cuBLAS (libcublas.so.13) is not on the \
                 library path"
            ))),
            KernelPath::Auto => Ok(KernelPath::Gemm),
            p => Ok(p),
        }
    }

    /// Queries per chunk: a quarter of the queries (so that copies overlap), at least 4,096 and
    /// at most 32,768, bounded by memory for the result lists.
    fn query_chunk(
        &self,
        gpu: &Gpu,
        path: KernelPath,
        m: usize,
        n: usize,
        dp: usize,
        k: usize,
    ) -> Result<usize> {
        if self.options.query_chunk > 0 {
            return Ok(self.options.query_chunk.next_multiple_of(FUSED_BM));
        }
        let (free, _) = gpu
            .ctx
            .mem_get_info()
            .map_err(|e| GpuError::cuda("reading free memory", e))?;
        let keys_bytes = n.next_multiple_of(FUSED_BN) * dp * 2;
        let budget = free.saturating_sub(keys_bytes) / 4;
        // Per query: its f16 row, its result lists, and (gemm) a row of the score tile.
        let tile_row = if path == KernelPath::Gemm {
            4 * n.min(65_536)
        } else {
            0
        };
        let per_query = 2 * dp + 8 * k + tile_row;
        let by_memory = (budget / per_query.max(1)).max(FUSED_BM);
        let target = m.div_ceil(4).clamp(4096, 32_768);
        Ok(target.min(by_memory).next_multiple_of(FUSED_BM))
    }

    /// Keys per GEMM tile: the score tile (chunk × tile f32) takes at most a quarter of free memory
    /// and 4 GiB.
    fn key_tile(&self, gpu: &Gpu, chunk: usize, n: usize) -> Result<usize> {
        let (free, _) = gpu
            .ctx
            .mem_get_info()
            .map_err(|e| GpuError::cuda("reading free memory", e))?;
        let budget = (free / 4).min(4 << 30);
        let cols = (budget / (4 * chunk)).max(256) / 256 * 256;
        Ok(cols.min(n.next_multiple_of(256)))
    }

    /// Measured tensor-core rate of cuBLAS f16 GEMM (f32 accumulate and output) on `size³`,
    /// in TFLOP/s: the median of `reps` timed runs after one warm-up.
    pub fn gemm_tflops(&self, size: usize, reps: usize) -> Result<f64> {
        let gpu = self.lock()?;
        let blas = gpu.blas.as_ref().ok_or_else(|| {
            GpuError::Unavailable("cuBLAS (libcublas.so.13) is not on the library path".into())
        })?;
        let host: Vec<u16> = (0..size * size)
            .map(|i| f16::from_f32(((i * 7919 % 2003) as f32 / 2003.0) - 0.5).to_bits())
            .collect();
        let a = gpu
            .compute
            .clone_htod(&host)
            .map_err(|e| GpuError::cuda("uploading", e))?;
        let mut c = gpu
            .compute
            .alloc_zeros::<f32>(size * size)
            .map_err(|e| GpuError::cuda("allocating", e))?;
        let mut times = Vec::with_capacity(reps);
        for rep in 0..=reps {
            let ms = gemm_f16_f32(&gpu, blas, (size, size, size), &a, 0, &a, 0, &mut c, size)?;
            if rep > 0 {
                times.push(ms);
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        Ok(2.0 * (size as f64).powi(3) / (median * 1e-3) / 1e12)
    }
}

impl KnnBackend for CudaKnn {
    fn name(&self) -> String {
        format!("{} ({})", self.name, self.device_name)
    }

    fn topk(
        &self,
        queries: &[f32],
        keys: &KeyStore,
        k: usize,
        options: &KnnOptions,
    ) -> qkindex::Result<KnnResult> {
        Ok(self.run(queries, keys, k, options)?.0)
    }
}

/// A chunk whose result lists are still on the device.
struct Pending {
    q0: usize,
    rows: usize,
    k: usize,
    best_s: CudaSlice<f32>,
    best_i: CudaSlice<u32>,
    /// Kept alive until the chunk's kernels are done with it.
    _queries: CudaSlice<u16>,
}

impl Pending {
    /// Copies the lists into the output rows; returns the copy time (ms).
    fn download(self, gpu: &Gpu, ids: &mut [u32], scores: &mut [f32]) -> Result<f64> {
        let range = self.q0 * self.k..(self.q0 + self.rows) * self.k;
        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let e0 = gpu
            .copy
            .record_event(timed)
            .map_err(|e| GpuError::cuda("recording an event", e))?;
        gpu.copy
            .memcpy_dtoh(&self.best_i, &mut ids[range.clone()])
            .map_err(|e| GpuError::cuda("downloading ids", e))?;
        gpu.copy
            .memcpy_dtoh(&self.best_s, &mut scores[range])
            .map_err(|e| GpuError::cuda("downloading scores", e))?;
        let e1 = gpu
            .copy
            .record_event(timed)
            .map_err(|e| GpuError::cuda("recording an event", e))?;
        elapsed(&e0, &e1)
    }
}

fn launch_init(gpu: &Gpu, best_s: &mut CudaSlice<f32>, best_i: &mut CudaSlice<u32>) -> Result<()> {
    let count = best_s.len() as i64;
    let cfg = LaunchConfig {
        grid_dim: ((best_s.len().div_ceil(256)).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.compute.launch_builder(&gpu.init);
    b.arg(best_s).arg(best_i).arg(&count);
    // SAFETY: `topk_init(float*, unsigned*, long long)`: both lists hold `count` elements.
    unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching topk_init", e))?;
    Ok(())
}

/// `shape` = (rows in the chunk, keys, padded dim, global index of the chunk's first query).
fn launch_fused(
    gpu: &Gpu,
    q: &CudaSlice<u16>,
    keys: &CudaSlice<u16>,
    shape: (usize, usize, usize, usize),
    causal: bool,
    k: usize,
    best: (&mut CudaSlice<f32>, &mut CudaSlice<u32>),
) -> Result<()> {
    let (rows, n, dp, row0) = shape;
    let smem = kernels::fused_smem_bytes(dp);
    gpu.fused
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| GpuError::cuda("setting the fused kernel's shared memory", e))?;
    let (m_i, n_i, dp_i, row0_i) = (rows as i32, n as i32, dp as i32, row0 as i32);
    let (causal_i, k_i) = (causal as i32, k as i32);
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(FUSED_BM) as u32, 1, 1),
        block_dim: (FUSED_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut b = gpu.compute.launch_builder(&gpu.fused);
    b.arg(q)
        .arg(keys)
        .arg(&m_i)
        .arg(&n_i)
        .arg(&dp_i)
        .arg(&row0_i)
        .arg(&causal_i)
        .arg(&k_i)
        .arg(best.0)
        .arg(best.1);
    // SAFETY: `fused_score_topk(q, keys, m, n, dp, row0, causal, k, best_s, best_i)`: q holds
    // rows padded to a multiple of 64 × dp halves, keys n padded to 64 × dp, lists rows × k.
    unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching fused_score_topk", e))?;
    Ok(())
}

/// GEMM tiles over the keys, each followed by the selection kernel. Returns the GEMM time (ms).
#[allow(clippy::too_many_arguments)]
fn run_gemm_select(
    gpu: &Gpu,
    q: &CudaSlice<u16>,
    keys: &CudaSlice<u16>,
    tile: &mut CudaSlice<f32>,
    key_tile: usize,
    shape: (usize, usize, usize, usize),
    causal: bool,
    k: usize,
    best: (&mut CudaSlice<f32>, &mut CudaSlice<u32>),
) -> Result<f64> {
    let (rows, n, dp, row0) = shape;
    let blas = gpu
        .blas
        .as_ref()
        .ok_or_else(|| GpuError::Unavailable("cuBLAS is not loaded".to_string()))?;
    let key_end = if causal { n.min(row0 + rows) } else { n };
    let mut gemm_ms = 0.0;
    let mut k0 = 0;
    while k0 < key_end {
        let cols = key_tile.min(key_end - k0);
        gemm_ms += gemm_f16_f32(gpu, blas, (cols, rows, dp), keys, k0 * dp, q, 0, tile, cols)?;
        let (ld, rows_i, cols_i) = (cols as i64, rows as i32, cols as i32);
        let (row0_i, col0_i, causal_i, k_i) = (row0 as i32, k0 as i32, causal as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(SELECT_ROWS_PER_BLOCK), 1, 1),
            block_dim: (SELECT_ROWS_PER_BLOCK * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = gpu.compute.launch_builder(&gpu.select);
        b.arg(&*tile)
            .arg(&ld)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&row0_i)
            .arg(&col0_i)
            .arg(&causal_i)
            .arg(&k_i)
            .arg(&mut *best.0)
            .arg(&mut *best.1);
        // SAFETY: `topk_select_tile(scores, ld, rows, cols, row0, col0, causal, k, best_s,
        // best_i)`: the tile holds rows × ld f32 (ld = cols), the lists rows × k.
        unsafe { b.launch(cfg) }.map_err(|e| GpuError::cuda("launching topk_select_tile", e))?;
        k0 += cols;
    }
    Ok(gemm_ms)
}

/// Column-major C (`m × n`, leading dimension `ldc`) = Aᵀ·B where A holds `m` rows of `k` halves
/// (row-major, i.e. column-major `k × m`) from element `a_off`, and B `n` rows of `k` halves from
/// `b_off`. In row-major terms: C (as `n × m`) = B·Aᵀ, the scores of B's rows against A's rows.
/// Returns the GEMM's time (CUDA events, ms).
#[allow(clippy::too_many_arguments)]
fn gemm_f16_f32(
    gpu: &Gpu,
    blas: &CudaBlas,
    (m, n, k): (usize, usize, usize),
    a: &CudaSlice<u16>,
    a_off: usize,
    b: &CudaSlice<u16>,
    b_off: usize,
    c: &mut CudaSlice<f32>,
    ldc: usize,
) -> Result<f64> {
    use cudarc::cublas::sys::cudaDataType;
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let e0 = gpu
        .compute
        .record_event(timed)
        .map_err(|e| GpuError::cuda("recording an event", e))?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    {
        let (ap, _ra) = a.device_ptr(&gpu.compute);
        let (bp, _rb) = b.device_ptr(&gpu.compute);
        let (cp, _rc) = c.device_ptr_mut(&gpu.compute);
        let ap = ap + (a_off * 2) as u64;
        let bp = bp + (b_off * 2) as u64;
        // SAFETY: A holds ≥ a_off + m·k halves, B ≥ b_off + n·k, C ≥ ldc·n floats (checked by
        // the callers' tile sizes); alpha and beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                ap as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                k as i32,
                bp as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                k as i32,
                (&beta as *const f32).cast(),
                cp as *mut std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                ldc as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(|e| GpuError::cuda("cublasGemmEx", e))?;
    }
    let e1 = gpu
        .compute
        .record_event(timed)
        .map_err(|e| GpuError::cuda("recording an event", e))?;
    elapsed(&e0, &e1)
}

fn elapsed(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(|e| GpuError::cuda("reading an event", e))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Largest magnitude sent to the GPU: f16's maximum is 65,504; scores accumulate in f32.
const F16_SAFE: f32 = 60_000.0;

/// Keys as padded f16 bits: `n` rounded up to `row_multiple` rows × `dp` columns, zeros beyond.
/// Keys beyond the f16 range are all scaled by one positive factor (returned), which keeps every
/// query's ranking.
pub(crate) fn pad_keys(keys: &KeyStore, dp: usize, row_multiple: usize) -> (Vec<u16>, f32) {
    let (n, d) = (keys.len(), keys.dim());
    let rows = n.next_multiple_of(row_multiple);
    let mut out = vec![0u16; rows * dp];
    let scale = match keys.rows() {
        KeysRef::F16(_) => 1.0,
        KeysRef::F32(x) => {
            let max = x
                .par_iter()
                .fold(|| 0.0f32, |a, v| a.max(v.abs()))
                .reduce(|| 0.0, f32::max);
            if max > F16_SAFE {
                F16_SAFE / max
            } else {
                1.0
            }
        }
    };
    out.par_chunks_mut(dp)
        .take(n)
        .enumerate()
        .for_each(|(i, row)| match keys.rows() {
            KeysRef::F16(x) => {
                for (o, v) in row.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *o = v.to_bits();
                }
            }
            KeysRef::F32(x) => {
                for (o, v) in row.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *o = f16::from_f32(v * scale).to_bits();
                }
            }
        });
    (out, scale)
}

/// Queries as padded f16 bits (rows rounded up to `row_multiple`), each row scaled into the f16
/// range if it leaves it (a positive factor per query keeps its ranking); returns the factors.
pub(crate) fn pad_queries(
    q: &[f32],
    d: usize,
    dp: usize,
    row_multiple: usize,
) -> (Vec<u16>, Vec<f32>) {
    let m = q.len() / d;
    let mut out = vec![0u16; m.next_multiple_of(row_multiple) * dp];
    let mut scales = vec![1.0f32; m];
    out.par_chunks_mut(dp)
        .zip(scales.par_iter_mut())
        .zip(q.par_chunks(d))
        .for_each(|((row, s), x)| {
            let max = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            if max > F16_SAFE {
                *s = F16_SAFE / max;
            }
            for (o, v) in row.iter_mut().zip(x) {
                *o = f16::from_f32(v * *s).to_bits();
            }
        });
    (out, scales)
}

/// Replaces the GPU's scores by exact f32 products and re-sorts each row, best first (ties by id).
pub(crate) fn rescore(queries: &[f32], keys: &KeyStore, k: usize, ids: &mut [u32], s: &mut [f32]) {
    let d = keys.dim();
    let scorer = keys.scorer();
    ids.par_chunks_mut(k)
        .zip(s.par_chunks_mut(k))
        .zip(queries.par_chunks(d))
        .for_each_init(Vec::new, |pairs, ((row_ids, row_s), q)| {
            pairs.clear();
            for &id in row_ids.iter().filter(|&&id| id != KnnResult::PAD) {
                pairs.push((scorer.score(q, id), id));
            }
            pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (j, (o_id, o_s)) in row_ids.iter_mut().zip(row_s.iter_mut()).enumerate() {
                match pairs.get(j) {
                    Some(&(sc, id)) => {
                        *o_id = id;
                        *o_s = sc;
                    }
                    None => {
                        *o_id = KnnResult::PAD;
                        *o_s = f32::NEG_INFINITY;
                    }
                }
            }
        });
}

/// Undoes the range scaling of [`pad_queries`] and [`pad_keys`] on GPU scores.
fn unscale(scores: &mut [f32], k: usize, query_scales: &[f32], key_scale: f32) {
    scores
        .par_chunks_mut(k)
        .zip(query_scales.par_iter())
        .for_each(|(row, &qs)| {
            let f = 1.0 / (qs * key_scale);
            if f != 1.0 {
                for v in row.iter_mut().filter(|v| v.is_finite()) {
                    *v *= f;
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_keeps_inner_products_and_scales_out_of_range_rows() {
        let keys = KeyStore::from_f32(vec![1.0, -2.0, 3.0, 0.5, 0.25, -0.125], 3).expect("keys");
        let (kh, ks) = pad_keys(&keys, 16, 64);
        assert_eq!(kh.len(), 64 * 16);
        assert_eq!(ks, 1.0);
        assert_eq!(f16::from_bits(kh[16 + 2]).to_f32(), -0.125);
        assert!(kh[3..16].iter().all(|&b| b == 0));
        let (qh, qs) = pad_queries(&[1e6, 2.0, -3.0, 1.0, 2.0, 3.0], 3, 16, 64);
        assert_eq!(qh.len(), 64 * 16);
        assert!(qs[0] < 1.0 && qs[1] == 1.0);
        let big = f16::from_bits(qh[0]).to_f32();
        assert!(big.is_finite() && big <= 65_504.0);
    }

    #[test]
    fn rescore_sorts_by_exact_scores_and_keeps_padding() {
        let keys = KeyStore::from_f32(vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 2).expect("keys");
        let q = [1.0f32, 2.0];
        let mut ids = vec![0, 2, 1, KnnResult::PAD];
        let mut s = vec![0.0; 4];
        rescore(&q, &keys, 4, &mut ids, &mut s);
        assert_eq!(ids, vec![2, 1, 0, KnnResult::PAD]);
        assert_eq!(s[..3], [3.0, 2.0, 1.0]);
        assert_eq!(s[3], f32::NEG_INFINITY);
    }
}
