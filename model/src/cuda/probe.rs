//! The attention kernels on their own, outside a forward pass: for timing them against other
//! implementations and for checking the indexed kernel (`qkindex gpu-check`).

use qkindex_gpu::cudarc::driver::PushKernelArg;

use qkindex_gpu::runtime::{elapsed_ms, launch_config, record};

use super::kernels::{cuda, KvView};
use super::CudaBackend;
use crate::config::Heads;
use crate::error::Result;

impl CudaBackend {
    /// The attention kernels on their own (for timing against other implementations): causal
    /// attention of `n` queries at positions `pos0..` over a cache of `pos0 + n` keys, or, with
    /// `n = 1`, the split decode attention over all keys. Returns the output and the kernel time
    /// (CUDA events, ms). `q` is `n × (n_heads·hd)`; `k`, `v` are `n_kv` blocks of
    /// `keys × hd`.
    pub fn attention_only(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        keys: usize,
        heads: Heads,
    ) -> Result<(Vec<f32>, f64)> {
        let g = self.lock()?;
        let (n_heads, hd) = (heads.n_heads, heads.head_dim);
        let s = &g.dev.stream;
        let qd = s.clone_htod(q).map_err(cuda("upload"))?;
        let kd = s.clone_htod(k).map_err(cuda("upload"))?;
        let vd = s.clone_htod(v).map_err(cuda("upload"))?;
        let kv = KvView {
            k: &kd,
            v: &vd,
            capacity: keys,
        };
        let mut out = s
            .alloc_zeros::<f32>(n * n_heads * hd)
            .map_err(cuda("alloc"))?;
        let mut parts = g.dev.alloc_parts(n_heads, keys, hd)?;
        let e0 = record(s)?;
        if n == 1 {
            g.dev
                .decode_full(&qd, kv, keys, heads, &mut parts, &mut out)?;
        } else {
            g.dev.causal(&qd, kv, (n, keys - n), heads, &mut out)?;
        }
        let e1 = record(s)?;
        let ms = elapsed_ms(&e0, &e1)?;
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
        heads: Heads,
    ) -> Result<Vec<f32>> {
        let g = self.lock()?;
        let (n_heads, n_kv, hd) = (heads.n_heads, heads.n_kv_heads, heads.head_dim);
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
        unsafe { b.launch(launch_config((n_heads as u32, 1), 128, 0)) }
            .map_err(cuda("attention_partial_ids"))?;
        let mut out = s.alloc_zeros::<f32>(n_heads * hd).map_err(cuda("alloc"))?;
        g.dev.merge(&(pm, pl, po), 1, heads, &mut out)?;
        s.clone_dtoh(&out).map_err(cuda("download"))
    }
}
