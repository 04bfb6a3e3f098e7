//! The CPU [`Backend`]: the kernels of `ops.rs` on host vectors, the reference every device is
//! checked against. Linear layers whose weights are in GGUF blocks run the integer kernels of
//! `qdot.rs` for one row (decode) and dequantized tiles through faer for more (prefill).

use std::borrow::Cow;

use super::backend::Backend;
use super::cache::KvCache;
use super::config::Heads;
use super::error::{ModelError, Result};
use super::hooks::{DecodeAttention, DecodeStep};
use super::ops::{self, AttnShape, Rope};
use super::qdot::Q8Act;
use super::qtensor::{linear_blocks, HostTensor};

/// The CPU backend of one forward call, reading the model's RoPE tables.
#[derive(Debug)]
pub struct CpuBackend<'m> {
    pub ropes: &'m [Rope],
    /// The 8-bit activations of the current matrix-vector products (reused by every layer).
    q8: Vec<Q8Act>,
    /// Whether calls of several rows are matvecs (a decode step of several sequences) rather
    /// than GEMMs (a prefill).
    matvecs: bool,
}

impl<'m> CpuBackend<'m> {
    /// A backend for one forward call with the model's RoPE tables.
    pub fn new(ropes: &'m [Rope]) -> Self {
        CpuBackend {
            ropes,
            q8: Vec::new(),
            matvecs: false,
        }
    }

    /// A backend for a decode step of several sequences, one row each: its products are
    /// matvecs, each row's the one it gets alone.
    pub fn for_batch_step(ropes: &'m [Rope]) -> Self {
        CpuBackend {
            matvecs: true,
            ..Self::new(ropes)
        }
    }
}

impl Backend for CpuBackend<'_> {
    type Buf = Vec<f32>;
    type Tensor = HostTensor;

    const TIMES_MATMUL: bool = true;

    fn alloc(&mut self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0f32; len])
    }

    fn upload(&mut self, x: &[f32]) -> Result<Vec<f32>> {
        Ok(x.to_vec())
    }

    fn to_host<'x>(&mut self, x: &'x Vec<f32>) -> Result<Cow<'x, [f32]>> {
        Ok(Cow::Borrowed(x))
    }

    fn embed(
        &mut self,
        table: &HostTensor,
        tokens: &[u32],
        dim: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for (row, &t) in out.chunks_exact_mut(dim).zip(tokens) {
            table.row_into(t as usize, row);
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &Vec<f32>,
        w: &HostTensor,
        _: (usize, usize),
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        out.copy_from_slice(x);
        ops::rms_norm(out, &w.to_f32(), eps);
        Ok(())
    }

    fn rms_norm_in_place(
        &mut self,
        x: &mut Vec<f32>,
        w: &HostTensor,
        _: (usize, usize),
        eps: f32,
    ) -> Result<()> {
        ops::rms_norm(x, &w.to_f32(), eps);
        Ok(())
    }

    fn linear(
        &mut self,
        x: &Vec<f32>,
        rows: usize,
        w: &HostTensor,
        (out, inp): (usize, usize),
        y: &mut Vec<f32>,
    ) -> Result<()> {
        match w {
            HostTensor::F32(w) if self.matvecs => ops::linear_matvecs(x, rows, w, out, inp, y),
            HostTensor::F32(w) => ops::linear(x, rows, w, out, inp, y),
            HostTensor::Blocks(q) => linear_blocks(q, x, rows, &mut self.q8, y, self.matvecs)?,
        }
        Ok(())
    }

    fn rope(
        &mut self,
        x: &mut Vec<f32>,
        (_, heads, _): (usize, usize, usize),
        pos0: usize,
        table: usize,
    ) -> Result<()> {
        self.ropes[table].apply(x, heads, pos0);
        Ok(())
    }

    fn swiglu(&mut self, gate: &mut Vec<f32>, up: &Vec<f32>) -> Result<()> {
        ops::swiglu(gate, up);
        Ok(())
    }

    fn geglu(&mut self, gate: &mut Vec<f32>, up: &Vec<f32>) -> Result<()> {
        ops::geglu(gate, up);
        Ok(())
    }

    fn add_rows(
        &mut self,
        x: &mut Vec<f32>,
        bias: &HostTensor,
        (rows, dim): (usize, usize),
    ) -> Result<()> {
        let bias = bias.to_f32();
        if bias.len() != dim || x.len() != rows * dim {
            return Err(ModelError::DeviceState(format!(
                "a bias of {} values for {rows} rows of {dim}",
                bias.len()
            )));
        }
        for row in x.chunks_exact_mut(dim) {
            for (v, b) in row.iter_mut().zip(bias.iter()) {
                *v += b;
            }
        }
        Ok(())
    }

    fn scale(&mut self, x: &mut Vec<f32>, s: f32) -> Result<()> {
        ops::scale(x, s);
        Ok(())
    }

    fn add(&mut self, x: &mut Vec<f32>, h: &Vec<f32>) -> Result<()> {
        for (xv, hv) in x.iter_mut().zip(h) {
            *xv += hv;
        }
        Ok(())
    }

    fn append_kv<'x>(
        &mut self,
        layer: usize,
        k: &'x Vec<f32>,
        v: &'x Vec<f32>,
        cache: &mut KvCache,
        heads: Heads,
        pos0: usize,
    ) -> Result<(Cow<'x, [f32]>, Cow<'x, [f32]>)> {
        cache.write_rows(layer, pos0, k, v, heads);
        Ok((Cow::Borrowed(k), Cow::Borrowed(v)))
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &Vec<f32>,
        cache: &KvCache,
        heads: Heads,
        (rows, pos0): (usize, usize),
        window: Option<usize>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let shape = AttnShape {
            n_heads: heads.n_heads,
            n_kv_heads: heads.n_kv_heads,
            head_dim: heads.head_dim,
            capacity: cache.layer_rows(layer),
            window,
        };
        match cache.layer_f16(layer) {
            Some((kc, vc)) => ops::attention(q, kc, vc, shape, pos0, rows, out),
            None => {
                let (kc, vc) = cache.layer(layer);
                ops::attention(q, kc, vc, shape, pos0, rows, out)
            }
        }
        Ok(())
    }

    fn policy_attention(
        &mut self,
        layer: usize,
        _: &Vec<f32>,
        q_host: &[f32],
        cache: &KvCache,
        pos: usize,
        policy: &mut dyn DecodeAttention,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (kc, vc) = cache.layer(layer);
        let step = DecodeStep {
            layer,
            pos,
            q: q_host,
            k: kc,
            v: vc,
            capacity: cache.layer_rows(layer),
        };
        policy.attend(step, out)
    }

    fn download(&mut self, x: Vec<f32>) -> Result<Vec<f32>> {
        Ok(x)
    }
}
