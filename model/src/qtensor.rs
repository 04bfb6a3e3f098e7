//! The host tensors of the CPU model: f32 values, or a weight matrix kept in its GGUF blocks
//! ([`QMatrix`]) and multiplied in place by the integer kernels of `qdot.rs` (decode steps) or
//! dequantized a tile at a time for the GEMMs of a prefill.
//!
//! Keeping the blocks is what makes a decode step cheap: Gemma 3 270M's tied 262,144 × 640 head
//! is 671 MB as f32 and 178 MB as its `Q8_0` blocks, and a decode step reads all of it.

use std::borrow::Cow;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use super::error::{ModelError, Result};
use super::qdot::{self, Q8Act};
use super::quant::{dequantize_into, GgmlType};

/// A weight matrix in ggml blocks: `rows` rows (output features) of `cols` weights (input
/// features), each row whole blocks of `ty`, row-major. Made only by [`QMatrix::new`], which
/// checks that this CPU has an integer kernel for `ty` and that the bytes are whole rows of
/// whole blocks: the products below can then always be computed (a matrix without a kernel
/// used to leave its output unwritten in a release build, where the check was a
/// `debug_assert`).
#[derive(Debug, Clone)]
pub struct QMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// `rows × row_bytes()` bytes.
    data: Vec<u8>,
}

impl QMatrix {
    /// `rows × cols` weights of type `ty` in `data` (row-major ggml blocks). Errors
    /// ([`ModelError::Tensor`] naming `name`): no integer kernel for `ty` on this CPU, `cols`
    /// not a whole number of blocks (nor a multiple of 32, the activations' block), or `data`
    /// not `rows` rows of them.
    pub fn new(name: &str, ty: GgmlType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        let bad = |reason: String| ModelError::Tensor {
            tensor: name.to_string(),
            reason,
        };
        if !qdot::has_kernel(ty) {
            return Err(bad(format!(
                "no integer matvec kernel for {ty:?} on this CPU (kernels: Q8_0, Q4_1, Q5_0,                  Q4_K, Q6_K)"
            )));
        }
        let row_bytes = ty
            .bytes_for(cols as u64)
            .filter(|_| cols.is_multiple_of(32))
            .ok_or_else(|| bad(format!("{cols} columns are not whole {ty:?} blocks")))?;
        let want = (row_bytes as usize).checked_mul(rows);
        if want != Some(data.len()) || rows == 0 || cols == 0 {
            return Err(bad(format!(
                "{} bytes for {rows} rows of {cols} {ty:?} weights ({row_bytes} bytes a row)",
                data.len()
            )));
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// The ggml type of the blocks.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The blocks, `rows × row_bytes()` bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// Rows `r0..r1` as f32, into `out` (`(r1 − r0) × cols`).
    pub fn dequantize_rows(&self, r0: usize, r1: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let src = &self.data[r0 * rb..r1 * rb];
        out.par_chunks_mut(self.cols)
            .zip(src.par_chunks(rb))
            .for_each(|(o, s)| {
                // Lengths and type were checked when the matrix was made.
                let ok = dequantize_into(self.ty, s, o);
                debug_assert!(ok);
            });
    }
}

/// A tensor of the CPU model.
#[derive(Debug, Clone)]
pub enum HostTensor {
    /// Plain values (norms; matrices of types without an integer kernel; random test weights).
    F32(Vec<f32>),
    /// A matrix in its GGUF blocks.
    Blocks(QMatrix),
}

impl HostTensor {
    /// A matrix of `rows × cols` weights of type `ty` from its GGUF bytes (`src`), kept in blocks
    /// when `qdot` has a kernel for the type and rows are whole blocks, dequantized otherwise.
    /// `None` when the type is unsupported or `src` has the wrong size.
    pub fn from_ggml(ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Option<Self> {
        let n = rows.checked_mul(cols)?;
        if ty.bytes_for(n as u64)? != src.len() as u64 {
            return None;
        }
        if let Ok(q) = QMatrix::new("", ty, rows, cols, src.to_vec()) {
            return Some(HostTensor::Blocks(q));
        }
        let mut out = vec![0f32; n];
        dequantize_into(ty, src, &mut out).then_some(HostTensor::F32(out))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HostTensor::F32(v) => v.len(),
            HostTensor::Blocks(q) => q.rows * q.cols,
        }
    }

    /// Whether the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 (borrowed for [`HostTensor::F32`], dequantized otherwise).
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        match self {
            HostTensor::F32(v) => Cow::Borrowed(v),
            HostTensor::Blocks(q) => {
                let mut out = vec![0f32; q.rows * q.cols];
                q.dequantize_rows(0, q.rows, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Row `r` of a matrix of rows of `out.len()` values, into `out` (an embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let dim = out.len();
        match self {
            HostTensor::F32(v) => out.copy_from_slice(&v[r * dim..(r + 1) * dim]),
            HostTensor::Blocks(q) => {
                let rb = q.row_bytes();
                let ok = dequantize_into(q.ty, &q.data[r * rb..(r + 1) * rb], out);
                debug_assert!(ok);
            }
        }
    }

    /// The same matrix (`rows` rows) with its rows reordered: row `i` of the result is row
    /// `from(i)` of `self`.
    pub fn permute_rows(&self, rows: usize, from: impl Fn(usize) -> usize) -> Self {
        fn gather<T: Copy>(v: &[T], rows: usize, from: impl Fn(usize) -> usize) -> Vec<T> {
            let len = v.len() / rows.max(1);
            (0..rows)
                .flat_map(|i| v[from(i) * len..(from(i) + 1) * len].iter().copied())
                .collect()
        }
        match self {
            HostTensor::F32(v) => HostTensor::F32(gather(v, rows, from)),
            HostTensor::Blocks(q) => HostTensor::Blocks(QMatrix {
                data: gather(&q.data, rows, from),
                ..q.clone()
            }),
        }
    }
}

/// Output rows per dequantized tile of a prefill GEMM: about 4 MiB of f32 per tile.
fn tile_rows(cols: usize) -> usize {
    ((1 << 20) / cols.max(1)).max(64)
}

/// `y = x · wᵀ` for a matrix in blocks: `x` row-major `n × cols`, `y` row-major `n × rows`.
/// One row (a decode step), or any number with `matvecs` (a decode step of several
/// sequences), quantizes each row of `x` into `q8` and runs the integer kernels, reading `w`
/// once for all rows (each row's result is the one it gets alone); otherwise the rows multiply
/// dequantized tiles of `w` with faer (the prefill's GEMMs). Errors when `x` or `y` is not
/// `n` rows of the matrix's sides.
pub fn linear_blocks(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    q8: &mut Vec<Q8Act>,
    y: &mut [f32],
    matvecs: bool,
) -> Result<()> {
    if x.len() != n * w.cols || y.len() != n * w.rows {
        return Err(ModelError::DeviceState(format!(
            "a linear layer of {} x {} got {} inputs and {} outputs for {n} rows",
            w.rows,
            w.cols,
            x.len(),
            y.len()
        )));
    }
    if n == 1 || matvecs {
        q8.resize_with(n, Q8Act::default);
        for (a, xr) in q8.iter_mut().zip(x.chunks_exact(w.cols)) {
            a.quantize(xr);
        }
        // `QMatrix::new` checked the kernel, so this cannot fail; if it did, say so.
        if !qdot::matvec_many(w.ty, &w.data, w.row_bytes(), &q8[..n], y) {
            return Err(ModelError::DeviceState(format!(
                "no integer kernel for {:?}",
                w.ty
            )));
        }
        return Ok(());
    }
    let tile = tile_rows(w.cols).min(w.rows);
    let mut buf = vec![0f32; tile * w.cols];
    let xm = MatRef::from_row_major_slice(x, n, w.cols);
    let mut ym = MatMut::from_row_major_slice_mut(y, n, w.rows);
    for r0 in (0..w.rows).step_by(tile) {
        let r1 = (r0 + tile).min(w.rows);
        let wt = &mut buf[..(r1 - r0) * w.cols];
        w.dequantize_rows(r0, r1, wt);
        let wm = MatRef::from_row_major_slice(wt, r1 - r0, w.cols).transpose();
        let out = ym.as_mut().subcols_mut(r0, r1 - r0);
        matmul(out, Accum::Replace, xm, wm, 1.0f32, Par::rayon(0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// A `rows × 64` Q8_0 matrix whose weight (r, c) is `(r + 1) · 0.5 · ((c % 7) − 3)`.
    fn q8_matrix(rows: usize) -> (Vec<u8>, Vec<f32>) {
        let (mut bytes, mut vals) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for _blk in 0..2 {
                let d = (r + 1) as f32 * 0.5;
                bytes.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                for c in 0..32 {
                    let q = (c % 7) as i8 - 3;
                    bytes.push(q as u8);
                    vals.push(d * f32::from(q));
                }
            }
        }
        (bytes, vals)
    }

    /// Issue 64, item 2: a matrix in blocks is only made where it can be multiplied. Before,
    /// `QMatrix { ty: F16, .. }` could be built by hand (its fields were public) and
    /// `linear_blocks` then left `y` unwritten in a release build (the kernel check was a
    /// `debug_assert`); now such a matrix is an error at construction, and so is a product of
    /// the wrong shape.
    #[test]
    fn a_matrix_without_a_kernel_or_of_the_wrong_size_is_an_error() {
        let (bytes, _) = q8_matrix(3);
        let q = QMatrix::new("w", GgmlType::Q8_0, 3, 64, bytes.clone()).expect("Q8_0 3 x 64");
        assert_eq!(
            (q.ty(), q.rows(), q.cols(), q.data().len()),
            (GgmlType::Q8_0, 3, 64, 204)
        );
        for (ty, rows, cols, len, what) in [
            (GgmlType::F16, 3, 64, 3 * 64 * 2, "no integer matvec kernel"),
            (GgmlType::F32, 3, 64, 3 * 64 * 4, "no integer matvec kernel"),
            (GgmlType::Q8_0, 3, 48, 3 * 51, "not whole"),
            (GgmlType::Q8_0, 3, 64, bytes.len() - 1, "bytes for 3 rows"),
            (GgmlType::Q8_0, 4, 64, bytes.len(), "bytes for 4 rows"),
            (GgmlType::Q8_0, 0, 64, 0, "bytes for 0 rows"),
        ] {
            let err = QMatrix::new("blk.0.w", ty, rows, cols, vec![0u8; len])
                .expect_err("refused")
                .to_string();
            assert!(
                err.contains("blk.0.w") && err.contains(what),
                "{ty:?}: {err}"
            );
        }
        // A tensor of a type without a kernel is dequantized, never kept in blocks.
        let f16s: Vec<u8> = (0..64)
            .flat_map(|i| f16::from_f32(i as f32).to_le_bytes())
            .collect();
        let t = HostTensor::from_ggml(GgmlType::F16, 1, 64, &f16s).expect("f16");
        assert!(matches!(t, HostTensor::F32(_)));
        // A product whose sides do not match the matrix is an error, not a partial write.
        let (mut x, mut y) = (vec![1f32; 64], vec![f32::NAN; 2]);
        let err = linear_blocks(&q, &x, 1, &mut Vec::new(), &mut y, true).expect_err("y short");
        assert!(err.to_string().contains("3 x 64"), "{err}");
        x.pop();
        let mut y = vec![f32::NAN; 3];
        assert!(linear_blocks(&q, &x, 1, &mut Vec::new(), &mut y, true).is_err());
        x.push(1.0);
        linear_blocks(&q, &x, 1, &mut Vec::new(), &mut y, true).expect("fits");
        assert!(y.iter().all(|v| v.is_finite()), "every row written: {y:?}");
    }

    #[test]
    fn blocks_multiply_like_their_values() {
        let rows = 70;
        let (bytes, vals) = q8_matrix(rows);
        let t = HostTensor::from_ggml(GgmlType::Q8_0, rows, 64, &bytes).expect("tensor");
        let HostTensor::Blocks(w) = &t else {
            panic!("Q8_0 stays in blocks");
        };
        assert_eq!(t.to_f32().as_ref(), vals.as_slice());
        let mut row = vec![0f32; 64];
        t.row_into(5, &mut row);
        assert_eq!(row, &vals[5 * 64..6 * 64]);
        for (n, matvecs) in [(1usize, false), (3, false), (3, true)] {
            let x: Vec<f32> = (0..n * 64)
                .map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0)
                .collect();
            let mut y = vec![0f32; n * rows];
            linear_blocks(w, &x, n, &mut Vec::new(), &mut y, matvecs).expect("linear");
            for i in 0..n {
                for r in 0..rows {
                    let xr = &x[i * 64..(i + 1) * 64];
                    let wr = &vals[r * 64..(r + 1) * 64];
                    let want: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                    let mag: f32 = xr.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum();
                    let got = y[i * rows + r];
                    // Matvecs go through 8-bit activations: error below 1 % of Σ|x·w|.
                    assert!((got - want).abs() <= 1e-2 * mag, "{n} {r}: {got} vs {want}");
                }
            }
        }
        let p = t.permute_rows(rows, |i| rows - 1 - i).to_f32().into_owned();
        assert_eq!(p[..64], vals[(rows - 1) * 64..]);
        assert!(HostTensor::from_ggml(GgmlType::Q8_0, rows, 64, &bytes[1..]).is_none());
        // F16 has no kernel: dequantized.
        let h: Vec<u8> = [1.0f32, 2.0]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        let f = HostTensor::from_ggml(GgmlType::F16, 1, 2, &h).expect("f16");
        assert!(matches!(f, HostTensor::F32(ref v) if v == &[1.0, 2.0]));
    }
}
