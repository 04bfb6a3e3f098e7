//! Array inputs and outputs.
//!
//! Inputs are numpy arrays or anything `numpy.asarray` / `numpy.from_dlpack` turns into one
//! (CPU torch tensors through `__array__` or DLPack, buffers), without importing torch.
//! Floats must be float16, bfloat16 or float32: float64 raises `TypeError` naming the argument
//! and the dtype, because a silent cast would hide a precision loss. bfloat16 (torch tensors,
//! `ml_dtypes.bfloat16` arrays) is read as its 16-bit patterns and widened to f32, which is
//! exact (a bfloat16 is the top half of an f32). Tensors that need a gradient are read through
//! `detach()`. Tensors outside host memory (CUDA, through `.cpu()` or DLPack) are copied to it
//! once, in their own dtype, after the dtype check (qkindex indexes and scans host memory; its
//! kNN backend's API takes host slices, so a `device="cuda"` kNN uploads them from there); a
//! tensor that cannot be copied (`meta`) raises `TypeError` naming `.cpu()`.
//! Any strides are accepted; a copy is made only when the input is not C-contiguous (or must
//! become owned, as keys do, or f32, as float16 and bfloat16 queries do).

use crate::errors::{type_error, value_error};
use half::{bf16, f16};
use numpy::{
    dtype, Element, PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::borrow::Cow;

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `numpy` module, imported once.
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// A shape as Python prints it: `(2, 64)`.
pub fn shape_str(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `obj` as a numpy array: itself when it is one, else through `numpy.asarray` (`__array__`,
/// buffer protocol) or `numpy.from_dlpack` (objects that only speak DLPack).
pub fn ndarray<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Ok(a.clone());
    }
    let py = obj.py();
    let obj = &host_tensor(obj, name)?;
    // numpy has no bfloat16: a torch bfloat16 tensor is read as its bit patterns (int16), and
    // `float_array` widens them exactly.
    if let Ok(dt) = obj.getattr(intern!(py, "dtype")) {
        if dt.str()? == "torch.bfloat16" {
            let bits = || -> PyResult<Bound<'py, PyAny>> {
                let int16 = py
                    .import(intern!(py, "torch"))?
                    .getattr(intern!(py, "int16"))?;
                let bits = obj.call_method1(intern!(py, "view"), (int16,))?;
                let arr = numpy(py)?.call_method1(intern!(py, "asarray"), (bits,))?;
                arr.call_method1(intern!(py, "view"), (intern!(py, "uint16"),))
            };
            let arr = bits().map_err(|e| {
                type_error(format!(
                    "{name}: cannot read a {} of dtype torch.bfloat16 as its bit patterns \
                     (CPU torch tensors only): {e}",
                    type_name(obj)
                ))
            })?;
            return Ok(arr.cast_into::<PyUntypedArray>()?);
        }
    }
    let np = numpy(py)?;
    let dlpack_only =
        !obj.hasattr(intern!(py, "__array__"))? && obj.hasattr(intern!(py, "__dlpack__"))?;
    let converted = if dlpack_only {
        np.call_method1(intern!(py, "from_dlpack"), (obj,))
    } else {
        np.call_method1(intern!(py, "asarray"), (obj,))
    };
    let converted = converted.map_err(|e| {
        type_error(format!(
            "{name}: cannot read a {} as a numpy array (CPU tensors and arrays only): {e}",
            type_name(obj)
        ))
    })?;
    Ok(converted.cast_into::<PyUntypedArray>()?)
}

/// `obj` itself, or `obj.detach()` for a torch tensor that requires a gradient (reading does
/// not change it); a tensor outside host memory is copied to it once (`obj.cpu()`, else
/// `numpy.from_dlpack(obj, device="cpu")`), and one that cannot be raises `TypeError` naming
/// `.cpu()`.
fn host_tensor<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let obj = if obj
        .getattr(intern!(py, "requires_grad"))
        .and_then(|g| g.is_truthy())
        .unwrap_or(false)
    {
        obj.call_method0(intern!(py, "detach"))?
    } else {
        obj.clone()
    };
    // torch's `device` has a `type` ("cpu", "cuda", "mps", "meta"); other libraries' differ.
    let Some(dev) = obj.getattr(intern!(py, "device")).ok().filter(|d| {
        d.getattr(intern!(py, "type"))
            .is_ok_and(|t| !t.str().is_ok_and(|t| t == "cpu"))
    }) else {
        return Ok(obj);
    };
    let copied = if obj.hasattr(intern!(py, "cpu"))? {
        obj.call_method0(intern!(py, "cpu"))
    } else {
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item(intern!(py, "device"), intern!(py, "cpu"))?;
        numpy(py)?.call_method(intern!(py, "from_dlpack"), (&obj,), Some(&kwargs))
    };
    copied.map_err(|e| {
        type_error(format!(
            "{name}: a tensor on {} could not be copied to host memory ({e}): pass tensor.cpu()",
            dev.str()
                .map(|s| s.to_string())
                .unwrap_or_else(|_| "?".into())
        ))
    })
}

/// The Python type name of `obj` (for messages).
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A float16, bfloat16 (as bit patterns) or float32 input, borrowed read-only.
pub enum FloatArray<'py> {
    F16(PyReadonlyArrayDyn<'py, f16>),
    Bf16(PyReadonlyArrayDyn<'py, u16>),
    F32(PyReadonlyArrayDyn<'py, f32>),
}

/// Which shapes an argument accepts.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// 2-D `[n, d]` only.
    Matrix,
    /// 1-D `[d]` (one row) or 2-D `[b, d]`.
    Vectors,
    /// 3-D `[n, b, d]`: `n` blocks of `b` rows, read as `n · b` rows.
    Stacked,
}

/// Rows of an input: `rows × dim` row-major values, borrowed when the input allowed it.
#[derive(Debug)]
pub struct Rows<'a, T: Clone> {
    pub data: Cow<'a, [T]>,
    pub rows: usize,
    pub dim: usize,
    /// The input was 1-D (one row): results are 1-D too.
    pub one_d: bool,
}

/// Reads `obj` as a float16, bfloat16 or float32 array; other dtypes raise `TypeError`.
pub fn float_array<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<FloatArray<'py>> {
    let py = obj.py();
    // A torch bfloat16 tensor arrives as uint16 bit patterns; say so by its dtype first.
    let torch_bf16 = obj
        .getattr(intern!(py, "dtype"))
        .and_then(|d| d.str().map(|s| s == "torch.bfloat16"))
        .unwrap_or(false);
    // A torch tensor's dtype is checked before `ndarray` copies one off a GPU.
    if let Ok(dt) = obj.getattr(intern!(py, "dtype")) {
        let dt = dt.str()?.to_string();
        if let Some(torch_dt) = dt.strip_prefix("torch.") {
            if !matches!(torch_dt, "float16" | "bfloat16" | "float32") {
                return Err(not_float(name, torch_dt));
            }
        }
    }
    let arr = ndarray(obj, name)?;
    let dt = arr.dtype();
    // `ml_dtypes.bfloat16` (what JAX and others hand numpy) is a 2-byte user dtype of that name.
    let ml_bf16 = dt.itemsize() == 2 && dt.getattr(intern!(py, "name"))?.str()? == "bfloat16";
    if torch_bf16 || ml_bf16 {
        let bits = if ml_bf16 {
            arr.call_method1(intern!(py, "view"), (intern!(py, "uint16"),))?
        } else {
            arr.into_any()
        };
        return Ok(FloatArray::Bf16(
            bits.cast::<PyArrayDyn<u16>>()?.try_readonly()?,
        ));
    }
    if dt.is_equiv_to(&dtype::<f32>(py)) {
        Ok(FloatArray::F32(
            arr.cast::<PyArrayDyn<f32>>()?.try_readonly()?,
        ))
    } else if dt.is_equiv_to(&dtype::<f16>(py)) {
        Ok(FloatArray::F16(
            arr.cast::<PyArrayDyn<f16>>()?.try_readonly()?,
        ))
    } else {
        Err(not_float(name, &dt.str()?.to_string()))
    }
}

/// `TypeError`: `name` has the dtype `got`, not float16, bfloat16 or float32.
fn not_float(name: &str, got: &str) -> PyErr {
    type_error(format!(
        "{name}: expected float16, bfloat16 or float32, got {got} (no silent casts: convert it, \
         e.g. .astype(numpy.float32) or .float())"
    ))
}

/// Checks the shape of an input against `shape` and the expected row length `dim`.
fn check_shape(
    name: &str,
    got: &[usize],
    shape: Shape,
    dim: Option<usize>,
) -> PyResult<(usize, usize, bool)> {
    let want = match (shape, dim) {
        (Shape::Matrix, Some(d)) => format!("[n, {d}]"),
        (Shape::Matrix, None) => "[n, d] (2-D)".to_string(),
        (Shape::Vectors, Some(d)) => format!("[b, {d}] or [{d}]"),
        (Shape::Vectors, None) => "[b, d] or [d]".to_string(),
        (Shape::Stacked, Some(d)) => format!("[n, b, {d}]"),
        (Shape::Stacked, None) => "[n, b, d] (3-D)".to_string(),
    };
    let bad = || {
        value_error(format!(
            "{name}: expected shape {want}, got {}",
            shape_str(got)
        ))
    };
    let (rows, cols, one_d) = match (shape, got) {
        (Shape::Vectors, [d]) => (1, *d, true),
        (Shape::Stacked, [n, b, d]) => (n * b, *d, false),
        (Shape::Matrix | Shape::Vectors, [n, d]) => (*n, *d, false),
        _ => return Err(bad()),
    };
    if cols == 0 || dim.is_some_and(|d| d != cols) {
        return Err(bad());
    }
    Ok((rows, cols, one_d))
}

/// The rows of a key matrix, owned, with their dimension: at least one row, every value finite.
fn key_rows<T: Element + Copy>(
    a: &PyReadonlyArrayDyn<'_, T>,
    name: &str,
    dim: Option<usize>,
    finite: fn(T) -> bool,
) -> PyResult<(Vec<T>, usize)> {
    let r = rows_of(a, name, Shape::Matrix, dim)?;
    if r.rows == 0 {
        return Err(value_error(format!(
            "{name}: expected at least one row, got shape (0, d)"
        )));
    }
    check_finite(name, &r.data, r.dim, finite)?;
    Ok((r.data.into_owned(), r.dim))
}

/// The rows of a borrowed array: the buffer itself when C-contiguous, else a copy in logical
/// (row-major) order.
fn rows_of<'a, T: Element + Clone>(
    a: &'a PyReadonlyArrayDyn<'_, T>,
    name: &str,
    shape: Shape,
    dim: Option<usize>,
) -> PyResult<Rows<'a, T>> {
    let (rows, dim, one_d) = check_shape(name, a.shape(), shape, dim)?;
    let data = match a.as_slice() {
        Ok(s) if a.is_c_contiguous() => Cow::Borrowed(s),
        _ => Cow::Owned(a.as_array().iter().cloned().collect()),
    };
    Ok(Rows {
        data,
        rows,
        dim,
        one_d,
    })
}

impl FloatArray<'_> {
    /// The array's shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            FloatArray::F32(a) => a.shape(),
            FloatArray::F16(a) => a.shape(),
            FloatArray::Bf16(a) => a.shape(),
        }
    }

    /// The rows as f32 (float16 input is converted), finite-checked.
    pub fn rows_f32(
        &self,
        name: &str,
        shape: Shape,
        dim: Option<usize>,
    ) -> PyResult<Rows<'_, f32>> {
        let r = match self {
            FloatArray::F32(a) => rows_of(a, name, shape, dim)?,
            FloatArray::F16(a) => widened(rows_of(a, name, shape, dim)?, f16::to_f32),
            FloatArray::Bf16(a) => widened(rows_of(a, name, shape, dim)?, bf16_to_f32),
        };
        check_finite(name, &r.data, r.dim, f32::is_finite)?;
        Ok(r)
    }

    /// One vector `[d]` as f32 (finite-checked); a 2-D array is an error, whose message adds
    /// `hint` after the expected shape.
    pub fn one_row(&self, name: &str, dim: usize, hint: &str) -> PyResult<Cow<'_, [f32]>> {
        let r = self.rows_f32(name, Shape::Vectors, Some(dim))?;
        if !r.one_d {
            return Err(value_error(format!(
                "{name}: expected shape ({dim},){hint}, got ({}, {dim})",
                r.rows
            )));
        }
        Ok(r.data)
    }

    /// Keys as an owned store in the input's element type (float16 stays float16).
    pub fn key_store(&self, name: &str, dim: Option<usize>) -> PyResult<qkindex::KeyStore> {
        let store = match self {
            FloatArray::F32(a) => {
                let (values, dim) = key_rows(a, name, dim, f32::is_finite)?;
                qkindex::KeyStore::from_f32(values, dim)
            }
            FloatArray::F16(a) => {
                let (values, dim) = key_rows(a, name, dim, f16::is_finite)?;
                qkindex::KeyStore::from_f16(values, dim)
            }
            // No bfloat16 store: widened to f32 (exact), so products are those of the f32 copy.
            FloatArray::Bf16(_) => {
                let r = self.rows_f32(name, Shape::Matrix, dim)?;
                if r.rows == 0 {
                    return Err(value_error(format!(
                        "{name}: expected at least one row, got shape (0, d)"
                    )));
                }
                qkindex::KeyStore::from_f32(r.data.into_owned(), r.dim)
            }
        };
        store.map_err(crate::errors::to_py)
    }
}

/// `r` with every value widened to f32 by `widen`.
fn widened<T: Copy>(r: Rows<'_, T>, widen: fn(T) -> f32) -> Rows<'static, f32> {
    Rows {
        data: Cow::Owned(r.data.iter().map(|&x| widen(x)).collect()),
        rows: r.rows,
        dim: r.dim,
        one_d: r.one_d,
    }
}

/// A bfloat16 bit pattern as f32: the pattern is the f32's top half, so this is exact.
fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// `ValueError` naming the first row of `data` (`dim` columns) that holds NaN or infinity.
pub fn check_finite<T: Copy>(
    name: &str,
    data: &[T],
    dim: usize,
    finite: fn(T) -> bool,
) -> PyResult<()> {
    match data.iter().position(|&x| !finite(x)) {
        Some(i) => Err(value_error(format!(
            "{name}: non-finite value (NaN or infinity) in row {}",
            i / dim.max(1)
        ))),
        None => Ok(()),
    }
}

/// Reads an integer array (ids) as int64; other integer types are widened, floats raise
/// `TypeError`.
pub fn id_array<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, i64>> {
    let py = obj.py();
    let arr = ndarray(obj, name)?;
    let dt = arr.dtype();
    if dt.is_equiv_to(&dtype::<i64>(py)) {
        return Ok(arr.cast::<PyArrayDyn<i64>>()?.try_readonly()?);
    }
    if matches!(dt.kind(), b'i' | b'u') {
        let wide = arr.call_method1(intern!(py, "astype"), ("int64",))?;
        return Ok(wide.cast::<PyArrayDyn<i64>>()?.try_readonly()?);
    }
    Err(type_error(format!(
        "{name}: expected an integer array of ids, got {}",
        dt.str()?
    )))
}

/// A 1-D (`one_d`) or `rows × cols` numpy array that takes ownership of `data`.
pub fn to_numpy<'py, T: Element>(
    py: Python<'py>,
    data: Vec<T>,
    rows: usize,
    cols: usize,
    one_d: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let a = PyArray1::from_vec(py, data);
    if one_d {
        Ok(a.into_any())
    } else {
        Ok(a.reshape([rows, cols])?.into_any())
    }
}

/// Converts a `u32` id with [`qkindex::KnnResult::PAD`] padding to the Python convention (−1).
pub fn py_id(id: u32) -> i64 {
    if id == qkindex::KnnResult::PAD {
        -1
    } else {
        i64::from(id)
    }
}

/// A non-negative count from a Python int, as `ValueError` naming the argument otherwise.
/// `k` of a search over `n` keys: at least 1 and at most `n`.
pub fn neighbours(k: i64, n: usize) -> PyResult<usize> {
    let k = count("k", k, 1)?;
    if k > n {
        return Err(value_error(format!(
            "k: must be at most the number of keys ({n}), got {k}"
        )));
    }
    Ok(k)
}

pub fn count(name: &str, value: i64, min: i64) -> PyResult<usize> {
    if value < min {
        return Err(value_error(format!(
            "{name}: must be at least {min}, got {value}"
        )));
    }
    usize::try_from(value).map_err(|_| value_error(format!("{name}: {value} is too large")))
}
