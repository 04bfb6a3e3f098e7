//! Python exceptions: `qkindex.FormatError(ValueError)` for bad files and dumps, and the
//! mapping of every [`qkindex::Error`] variant to the built-in exception a Python user expects.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyFileNotFoundError, PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::PyErr;

create_exception!(
    qkindex,
    FormatError,
    PyValueError,
    "A file or dump directory whose content is not what its format says (bad manifest, \
     wrong shape or dtype of a tensor, corrupt bytes). A subclass of ValueError."
);

/// Maps a core error to a Python exception (user errors to `ValueError`, files to
/// `FormatError` / `OSError`).
///
/// The match is exhaustive on purpose: a new core variant must be given its Python type here.
pub fn to_py(e: qkindex::Error) -> PyErr {
    use qkindex::Error as E;
    let msg = e.to_string();
    match e {
        E::DimensionMismatch { .. } | E::InvalidParam { .. } | E::NonFinite { .. } => {
            PyValueError::new_err(msg)
        }
        E::Empty { .. } => PyValueError::new_err(msg),
        E::Format { .. } => FormatError::new_err(msg),
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        E::Io { .. } => PyOSError::new_err(msg),
        E::Cancelled { .. } => PyKeyboardInterrupt::new_err(msg),
        E::Backend { .. } => PyRuntimeError::new_err(msg),
    }
}

/// `ValueError` with a message.
pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// `TypeError` with a message.
pub fn type_error(msg: impl Into<String>) -> PyErr {
    PyTypeError::new_err(msg.into())
}
