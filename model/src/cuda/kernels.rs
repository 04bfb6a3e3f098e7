//! Launches of the kernels of `kernels/llama.cu` and of cuBLAS's SGEMM, one method of [`Dev`]
//! per operation; shapes and layouts are those the kernels document. Attention reads a layer's
//! cached keys and values through a [`KvView`] and takes its head counts as [`Heads`].

use std::sync::Arc;

use qkindex_gpu::cudarc::cublas::sys::cublasOperation_t;
use qkindex_gpu::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use qkindex_gpu::cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, PushKernelArg,
};
use qkindex_gpu::cudarc::nvrtc::Ptx;
use qkindex_gpu::runtime::{grid_1d, launch_config, load_kernels};
use qkindex_gpu::GpuError;

use crate::config::Heads;
use crate::error::{ModelError, Result};

/// Keys per block of the split decode attention (`attention_partial_range`).
pub(crate) const DECODE_CHUNK: usize = 256;
/// Maps a failed cudarc call `what` to the model's error (a typed [`GpuError::Cuda`]).
pub(crate) fn cuda(what: &'static str) -> impl Fn(DriverError) -> ModelError {
    move |e| GpuError::cuda(what, e).into()
}

/// The kernels of `kernels/llama.cu`, loaded once per device.
pub(super) struct Kernels {
    pub(super) embed: CudaFunction,
    pub(super) rms_norm: CudaFunction,
    pub(super) rope: CudaFunction,
    pub(super) swiglu: CudaFunction,
    pub(super) add: CudaFunction,
    pub(super) kv_write: CudaFunction,
    pub(super) causal: CudaFunction,
    pub(super) range: CudaFunction,
    pub(super) ids: CudaFunction,
    pub(super) merge: CudaFunction,
}

impl Kernels {
    /// Loads every kernel of the compiled `kernels/llama.cu` into `ctx`.
    pub(super) fn load(ctx: &Arc<CudaContext>, ptx: Ptx) -> Result<Self> {
        let [embed, rms_norm, rope, swiglu, add, kv_write, causal, range, ids, merge] =
            load_kernels(
                ctx,
                ptx,
                "kernels/llama.cu",
                [
                    "embed_gather",
                    "rms_norm",
                    "rope",
                    "swiglu",
                    "add_inplace",
                    "kv_write",
                    "attention_causal",
                    "attention_partial_range",
                    "attention_partial_ids",
                    "partial_merge",
                ],
            )?;
        Ok(Kernels {
            embed,
            rms_norm,
            rope,
            swiglu,
            add,
            kv_write,
            causal,
            range,
            ids,
            merge,
        })
    }
}

/// The stream, cuBLAS and the kernels: what every launch needs.
pub(super) struct Dev {
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    pub(super) f: Kernels,
}

/// A layer's cached keys and values on the device: `n_kv` blocks of `capacity × hd` each.
#[derive(Clone, Copy)]
pub(super) struct KvView<'a> {
    pub(super) k: &'a CudaSlice<f32>,
    pub(super) v: &'a CudaSlice<f32>,
    pub(super) capacity: usize,
}

/// Online-softmax part buffers on the device: max, sum and unnormalized output per (head, chunk).
pub(super) type Parts = (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>);

/// `heads` as the kernels' `int` arguments `(n_heads, n_kv, hd)`.
fn head_args(heads: Heads) -> (i32, i32, i32) {
    (
        heads.n_heads as i32,
        heads.n_kv_heads as i32,
        heads.head_dim as i32,
    )
}

impl Dev {
    /// `out[r] = table[tokens[r]]` for `n` rows of `dim`.
    pub(super) fn embed(
        &self,
        table: &CudaSlice<f32>,
        tokens: &CudaSlice<u32>,
        n: usize,
        dim: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (ni, d) = (n as i32, dim as i32);
        let mut b = self.stream.launch_builder(&self.f.embed);
        b.arg(table).arg(tokens).arg(&ni).arg(&d).arg(out);
        // SAFETY: embed_gather(table, tokens, n, dim, out): tokens < vocab (checked by
        // Llama::forward_with), out n × dim.
        unsafe { b.launch(launch_config((n as u32, 1), 256, 0)) }.map_err(cuda("embed_gather"))?;
        Ok(())
    }

    /// Writes `n` rows of keys and values (`n × (n_kv · hd)`) at positions `pos0..` of the
    /// caches (`n_kv` blocks of `capacity × hd`).
    pub(super) fn kv_write(
        &self,
        (k, v): (&CudaSlice<f32>, &CudaSlice<f32>),
        (k_cache, v_cache): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        n: usize,
        (n_kv, hd): (usize, usize),
        cap: usize,
        pos0: usize,
    ) -> Result<()> {
        let (ni, nk, hdi, capi, p0) = (n as i32, n_kv as i32, hd as i32, cap as i32, pos0 as i32);
        let mut b = self.stream.launch_builder(&self.f.kv_write);
        b.arg(k)
            .arg(v)
            .arg(k_cache)
            .arg(v_cache)
            .arg(&ni)
            .arg(&nk)
            .arg(&hdi)
            .arg(&capi)
            .arg(&p0);
        // SAFETY: kv_write(k, v, k_cache, v_cache, rows, n_kv, hd, capacity, pos0):
        // pos0 + rows ≤ capacity (checked by Llama::forward_with).
        unsafe { b.launch(launch_config((grid_1d(n * n_kv * hd, 256), 1), 256, 0)) }
            .map_err(cuda("kv_write"))?;
        Ok(())
    }

    /// `y (rows × out) = x (rows × in) · wᵀ` with `w` row-major `out × in`.
    pub(super) fn linear(
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
        unsafe { self.blas.gemm(cfg, w, x, y) }.map_err(|e| GpuError::cuda("cublasSgemm", e).into())
    }

    pub(super) fn rms_norm(
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
        unsafe { b.launch(launch_config((rows as u32, 1), 256, 0)) }.map_err(cuda("rms_norm"))?;
        Ok(())
    }

    /// `x = rms_norm(x) · w` in place (the kernel allows `out == x`).
    pub(super) fn rms_norm_inplace(
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
        unsafe { b.launch(launch_config((rows as u32, 1), 256, 0)) }.map_err(cuda("rms_norm"))?;
        Ok(())
    }

    /// Rotate-half RoPE in place with the tables `(cos, sin)` (each `max_pos × half`).
    pub(super) fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        (cos, sin): (&CudaSlice<f32>, &CudaSlice<f32>),
        rows: usize,
        heads: usize,
        half: usize,
        pos0: usize,
    ) -> Result<()> {
        let (r, h, hf, p) = (rows as i32, heads as i32, half as i32, pos0 as i32);
        let mut b = self.stream.launch_builder(&self.f.rope);
        b.arg(x).arg(cos).arg(sin).arg(&r).arg(&h).arg(&hf).arg(&p);
        // SAFETY: rope(x, cos, sin, rows, n_heads, half, pos0): x rows × heads·2·half; tables
        // cover positions < context length ≥ pos0 + rows (checked by the caller).
        unsafe {
            b.launch(launch_config(
                (grid_1d(rows * heads * half, 256), 1),
                256,
                0,
            ))
        }
        .map_err(cuda("rope"))?;
        Ok(())
    }

    pub(super) fn elementwise(
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
        unsafe { b.launch(launch_config((grid_1d(n as usize, 256), 1), 256, 0)) }
            .map_err(cuda(what))?;
        Ok(())
    }

    /// Causal attention of `n` query rows at positions `pos0..` over the cached `kv`.
    pub(super) fn causal(
        &self,
        q: &CudaSlice<f32>,
        kv: KvView<'_>,
        (n, pos0): (usize, usize),
        heads: Heads,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (nh, nk, hdi) = head_args(heads);
        let (ni, p0, cap) = (n as i32, pos0 as i32, kv.capacity as i32);
        let scale = 1.0f32 / (heads.head_dim as f32).sqrt();
        let mut b = self.stream.launch_builder(&self.f.causal);
        b.arg(q)
            .arg(kv.k)
            .arg(kv.v)
            .arg(out)
            .arg(&ni)
            .arg(&p0)
            .arg(&nh)
            .arg(&nk)
            .arg(&hdi)
            .arg(&cap)
            .arg(&scale);
        let group = heads.n_heads / heads.n_kv_heads;
        let blocks = (n * group).div_ceil(16) * heads.n_kv_heads;
        // SAFETY: attention_causal(q, k_cache, v_cache, out, n, pos0, n_heads, n_kv, hd, capacity,
        // scale): blocks of exactly 128 threads, each taking 16 stacked query rows of one KV head
        // (any grid is correct; this one gives every block one work item); hd ≤ 128, hd % 4 = 0,
        // buffers 16-byte aligned (cudarc allocations), cache rows 0..pos0 + n written.
        unsafe { b.launch(launch_config((grid_1d(blocks, 1), 1), 128, 0)) }
            .map_err(cuda("attention_causal"))?;
        Ok(())
    }

    /// Online-softmax parts of one decode query over positions `0..sink` and `rest_end..keys`
    /// of the cached `kv`, in chunks of [`DECODE_CHUNK`]; returns the chunk count per head.
    pub(super) fn range_parts(
        &self,
        q: &CudaSlice<f32>,
        kv: KvView<'_>,
        (sink, rest_end, keys): (usize, usize, usize),
        heads: Heads,
        parts: &mut Parts,
    ) -> Result<usize> {
        let set = sink.min(keys) + keys.saturating_sub(rest_end.max(sink.min(keys)));
        let chunks = set.div_ceil(DECODE_CHUNK).max(1);
        let (nh, nk, hdi) = head_args(heads);
        let cap = kv.capacity as i32;
        let (si, re, ki, ch) = (
            sink as i32,
            rest_end as i32,
            keys as i32,
            DECODE_CHUNK as i32,
        );
        let scale = 1.0f32 / (heads.head_dim as f32).sqrt();
        let mut b = self.stream.launch_builder(&self.f.range);
        b.arg(q)
            .arg(kv.k)
            .arg(kv.v)
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
        unsafe { b.launch(launch_config((heads.n_heads as u32, chunks as u32), 128, 0)) }
            .map_err(cuda("attention_partial_range"))?;
        Ok(chunks)
    }

    /// Merges `per_head` parts of each head into the normalized output (`n_heads × hd`).
    pub(super) fn merge(
        &self,
        (m, l, o): &Parts,
        per_head: usize,
        heads: Heads,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (nh, _, hdi) = head_args(heads);
        let ph = per_head as i32;
        let mut b = self.stream.launch_builder(&self.f.merge);
        b.arg(m).arg(l).arg(o).arg(&nh).arg(&ph).arg(&hdi).arg(out);
        // SAFETY: partial_merge(part_m, part_l, part_o, n_heads, parts_per_head, hd, out).
        unsafe { b.launch(launch_config((heads.n_heads as u32, 1), 128, 0)) }
            .map_err(cuda("partial_merge"))?;
        Ok(())
    }

    /// Part buffers (max, sum, o) for a decode query over up to `max_keys` keys.
    pub(super) fn alloc_parts(&self, n_heads: usize, max_keys: usize, hd: usize) -> Result<Parts> {
        let parts = n_heads * max_keys.div_ceil(DECODE_CHUNK).max(1);
        let s = &self.stream;
        Ok((
            s.alloc_zeros::<f32>(parts).map_err(cuda("alloc"))?,
            s.alloc_zeros::<f32>(parts).map_err(cuda("alloc"))?,
            s.alloc_zeros::<f32>(parts * hd).map_err(cuda("alloc"))?,
        ))
    }

    /// Full attention of one decode query over `keys` positions of the cached `kv`: split over
    /// key chunks, merged.
    pub(super) fn decode_full(
        &self,
        q: &CudaSlice<f32>,
        kv: KvView<'_>,
        keys: usize,
        heads: Heads,
        parts: &mut Parts,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        // All keys as the "sink": positions 0..keys.
        let chunks = self.range_parts(q, kv, (keys, keys, keys), heads, parts)?;
        self.merge(parts, chunks, heads, out)
    }
}
