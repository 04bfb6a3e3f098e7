//! [`CudaKnn::run`]: queries in chunks over two streams. While the compute stream scores chunk
//! c, the copy stream uploads its queries and brings back chunk c − 1's lists ([`Pending`]).

use super::fused::{launch_fused, launch_init, Chunk};
use super::gemm::run_gemm_select;
use super::host::{pad_keys, pad_queries, rescore, unscale};
use super::{CudaKnn, Gpu, KernelPath, Timings};
use crate::kernels::{FUSED_BM, FUSED_BN, MAX_K};
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

        let (kd, up0, up1) = gpu.upload(&kh, "uploading keys")?;
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
            match path {
                KernelPath::Fused => launch_fused(&gpu, &job, (&mut best_s, &mut best_i))?,
                _ => {
                    let key_tile = self.key_tile(&gpu, chunk, n)?;
                    if tile.as_ref().is_none_or(|(_, cols)| *cols != key_tile) {
                        let buf =
                            gpu.zeros::<f32>(chunk * key_tile, "allocating the score tile")?;
                        tile = Some((buf, key_tile));
                    }
                    let Some((buf, _)) = tile.as_mut() else {
                        unreachable!("the tile was just allocated")
                    };
                    t.gemm_ms +=
                        run_gemm_select(&gpu, &job, (buf, key_tile), (&mut best_s, &mut best_i))?;
                }
            }
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
