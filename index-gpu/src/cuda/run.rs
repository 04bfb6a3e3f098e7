//! [`CudaKnn::run`]: queries in chunks over two streams. While the compute stream scores chunk
//! c, the copy stream uploads its queries and brings back chunk c − 1's lists ([`Pending`]).

use super::fused::{launch_fused, launch_init, Chunk, Lists};
use super::gemm::run_gemm_select;
use super::host::{pad_keys, pad_queries, rescore, unscale};
use super::plan::{gemm_scratch, radix_scratch, reusable, spans};
use super::radix::run_radix_select;
use super::setup::candidates;
use super::timer::DeviceTimer;
use super::{CudaKnn, Gpu, KernelPath, Timings};
use crate::calibrate::{
    calibrate, path_name, CalibrationCache, CalibrationShape, CALIBRATION_REPS,
};
use crate::kernels::{FUSED_BM, FUSED_BN};
use crate::runtime::{elapsed_ms as elapsed, record};
use crate::{GpuError, Result};
use cudarc::driver::CudaSlice;
use qkindex::knn::check_knn_args;
use qkindex::{KeyStore, KnnOptions, KnnResult};
use std::time::Instant;

impl CudaKnn {
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
        let d = keys.dim();
        let n = keys.len();
        let dp = d.next_multiple_of(16);
        let gpu = self.lock()?;
        let (path, auto) = self.choose_path(&gpu, dp, k)?;
        let mut t = Timings {
            path: path_name(path).to_string(),
            auto,
            ..Default::default()
        };

        let started = Instant::now();
        let (kh, key_scale) = pad_keys(keys, dp, FUSED_BN);
        let chunk = self.query_chunk(&gpu, path, m, n, dp, k)?;
        t.prepare_ms = ms(started);

        let (kd, up0, up1) = gpu.upload(&kh, "uploading keys")?;
        t.upload_ms += elapsed(&up0, &up1)?;
        drop(kh);

        let mut ids = vec![KnnResult::PAD; m * k];
        let mut scores = vec![f32::NEG_INFINITY; m * k];
        let mut query_scales = vec![1.0f32; m];
        let mut scratch = Scratch::default();
        let mut pending: Option<Pending> = None;
        for (q0, rows) in spans(m, chunk) {
            options.cancel.check("GPU exact top-k")?;
            let started = Instant::now();
            let (qh, scales) = pad_queries(&queries[q0 * d..(q0 + rows) * d], d, dp, FUSED_BM);
            query_scales[q0..q0 + rows].copy_from_slice(&scales);
            t.prepare_ms += ms(started);

            let (qd, e0, e1) = gpu.upload(&qh, "uploading queries")?;
            gpu.compute
                .wait(&e1)
                .map_err(|e| GpuError::cuda("ordering streams", e))?;
            let mut best_s = gpu.zeros::<f32>(rows * k, "allocating result lists")?;
            let mut best_i = gpu.zeros::<u32>(rows * k, "allocating result lists")?;
            let c0 = record(&gpu.compute)?;
            launch_init(&gpu, &mut best_s, &mut best_i)?;
            let job = Chunk {
                q: &qd,
                keys: &kd,
                rows,
                n,
                dp,
                row0: q0,
                causal: options.causal,
                k,
            };
            t.gemm_ms += self.compute_chunk(
                &gpu,
                path,
                &job,
                chunk.min(m),
                &mut scratch,
                (&mut best_s, &mut best_i),
            )?;
            let c1 = record(&gpu.compute)?;
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
}

impl CudaKnn {
    /// The path of a call and, when `auto` measured the candidates, its summary. The measurement
    /// runs once per (device, padded dimension, k class) in the process
    /// ([`CalibrationCache::global`]).
    fn choose_path(&self, gpu: &Gpu, dp: usize, k: usize) -> Result<(KernelPath, Option<String>)> {
        let paths = candidates(self.options.path, Self::capabilities(gpu, dp), dp, k)?;
        if let [only] = paths[..] {
            return Ok((only, None));
        }
        let shape = CalibrationShape::for_call(dp, k);
        let device = format!("{} {}", self.name, self.device_name);
        let c = CalibrationCache::global().get_or_measure(&device, shape, || {
            let mut timer = DeviceTimer::new(self, gpu);
            calibrate(&paths, shape, &mut timer, CALIBRATION_REPS)
        })?;
        Ok((c.choice, Some(c.summary())))
    }

    /// Runs `path` on one chunk into its lists (initialised); `chunk_rows` is the most rows any
    /// chunk of the call has (buffers in `scratch` are sized for it and reused). Returns the
    /// GEMM time (ms; 0 for the fused path).
    pub(super) fn compute_chunk(
        &self,
        gpu: &Gpu,
        path: KernelPath,
        job: &Chunk<'_>,
        chunk_rows: usize,
        scratch: &mut Scratch,
        best: Lists<'_>,
    ) -> Result<f64> {
        match path {
            KernelPath::Fused => {
                launch_fused(gpu, job, best)?;
                Ok(0.0)
            }
            KernelPath::Gemm => {
                let key_tile = self.key_tile(gpu, chunk_rows, job.n)?;
                let tile = scratch.tile(gpu, gemm_scratch(chunk_rows, key_tile))?;
                run_gemm_select(gpu, job, (tile, key_tile), best)
            }
            KernelPath::Radix => {
                let (tile_len, slots) = radix_scratch(chunk_rows, job.n, job.k);
                let mut packed = match scratch.packed.take() {
                    Some(p) if reusable(Some(p.len()), slots) => p,
                    _ => gpu.zeros::<u64>(slots, "allocating packed keys")?,
                };
                let r = scratch
                    .tile(gpu, tile_len)
                    .and_then(|tile| run_radix_select(gpu, job, tile, &mut packed, best));
                scratch.packed = Some(packed);
                r
            }
            KernelPath::Auto => Err(GpuError::Input(
                "internal: the auto path must be resolved before running".to_string(),
            )),
        }
    }
}

/// Device buffers of the gemm and radix paths besides the lists, reused across chunks.
#[derive(Default)]
pub(super) struct Scratch {
    tile: Option<CudaSlice<f32>>,
    packed: Option<CudaSlice<u64>>,
}

impl Scratch {
    /// The score tile, (re)allocated to hold at least `len` f32.
    fn tile(&mut self, gpu: &Gpu, len: usize) -> Result<&mut CudaSlice<f32>> {
        if !reusable(self.tile.as_ref().map(|t| t.len()), len) {
            self.tile = None; // free the old one first
            self.tile = Some(gpu.zeros::<f32>(len, "allocating the score tile")?);
        }
        self.tile
            .as_mut()
            .ok_or_else(|| GpuError::Input("internal: no score tile".to_string()))
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
        let e0 = record(&gpu.copy)?;
        gpu.copy
            .memcpy_dtoh(&self.best_i, &mut ids[range.clone()])
            .map_err(|e| GpuError::cuda("downloading ids", e))?;
        gpu.copy
            .memcpy_dtoh(&self.best_s, &mut scores[range])
            .map_err(|e| GpuError::cuda("downloading scores", e))?;
        let e1 = record(&gpu.copy)?;
        elapsed(&e0, &e1)
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
