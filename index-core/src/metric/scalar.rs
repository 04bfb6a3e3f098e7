//! Portable reference kernels. Four independent accumulators keep the scalar code close in
//! rounding behaviour to the SIMD kernels (which also sum in several lanes).

use half::f16;

/// `a · b` for equal-length slices, `b` converted exactly to f32 before multiplying.
#[inline]
fn dot<T: Copy>(a: &[f32], b: &[T]) -> f32
where
    f32: From<T>,
{
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 4];
    let chunks = a.len() / 4;
    for c in 0..chunks {
        for l in 0..4 {
            acc[l] += a[4 * c + l] * f32::from(b[4 * c + l]);
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for i in 4 * chunks..a.len() {
        s += a[i] * f32::from(b[i]);
    }
    s
}

/// `out[i] = q · keys[ids[i]]` for row-major `keys` with `dim` columns.
#[inline]
fn gather<T: Copy>(q: &[f32], keys: &[T], dim: usize, ids: &[u32], out: &mut [f32])
where
    f32: From<T>,
{
    for (o, &id) in out.iter_mut().zip(ids) {
        let start = id as usize * dim;
        *o = dot(q, &keys[start..start + dim]);
    }
}

/// `out[i] = q · rows[i]` for consecutive row-major rows of `dim` columns.
#[inline]
fn range<T: Copy>(q: &[f32], rows: &[T], dim: usize, out: &mut [f32])
where
    f32: From<T>,
{
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        *o = dot(q, row);
    }
}

/// `a · b` for equal-length f32 slices.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

/// `a · b` with `b` in f16 (converted exactly to f32 before multiplying).
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    dot(a, b)
}

/// `out[i] = q · keys[ids[i]]` for row-major f32 `keys` with `dim` columns.
pub fn gather_f32(q: &[f32], keys: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) {
    gather(q, keys, dim, ids, out)
}

/// `out[i] = q · keys[ids[i]]` for row-major f16 `keys` with `dim` columns.
pub fn gather_f16(q: &[f32], keys: &[f16], dim: usize, ids: &[u32], out: &mut [f32]) {
    gather(q, keys, dim, ids, out)
}

/// `out[i] = q · rows[i]` for consecutive row-major f32 rows of `dim` columns.
pub fn range_f32(q: &[f32], rows: &[f32], dim: usize, out: &mut [f32]) {
    range(q, rows, dim, out)
}

/// `out[i] = q · rows[i]` for consecutive row-major f16 rows of `dim` columns.
pub fn range_f16(q: &[f32], rows: &[f16], dim: usize, out: &mut [f32]) {
    range(q, rows, dim, out)
}

/// Inner product in f64, the ground truth for property tests.
pub fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}
