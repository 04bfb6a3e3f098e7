//! The crate's error type. Every public fallible function returns [`Result`].
//!
//! User errors (bad shapes, bad parameters, non-finite data, bad files) and environment errors
//! (I/O) are distinct variants with the fields a caller needs to act on them.

use std::path::PathBuf;

/// Errors returned by `qkindex`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A vector or matrix has the wrong dimension.
    #[error("dimension mismatch in {what}: expected {expected}, got {got}")]
    DimensionMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A parameter is out of its valid range.
    #[error("invalid parameter {name} = {value}: {reason}")]
    InvalidParam {
        name: &'static str,
        value: String,
        reason: String,
    },
    /// An input holds NaN or infinity.
    #[error("non-finite value in {what} at row {row}")]
    NonFinite { what: &'static str, row: usize },
    /// An input is empty where data is required.
    #[error("{what} is empty")]
    Empty { what: &'static str },
    /// A file exists but its content is not what the format says.
    #[error("bad file {path}: {section}: {reason}")]
    Format {
        path: PathBuf,
        section: String,
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An operation was stopped by its caller (for example a cancelled build).
    #[error("{what} was cancelled")]
    Cancelled { what: &'static str },
    /// A compute backend (for example a GPU) failed or is unavailable.
    #[error("backend {backend}: {reason}")]
    Backend { backend: String, reason: String },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Ok` when `value ≥ 1`, else [`Error::InvalidParam`] for `name`: "must be at least 1".
pub(crate) fn at_least_one(name: &'static str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(Error::invalid_param(name, value, "must be at least 1"));
    }
    Ok(())
}

impl Error {
    /// Shorthand for [`Error::InvalidParam`].
    pub fn invalid_param(
        name: &'static str,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        Error::InvalidParam {
            name,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Format`].
    pub fn format(
        path: impl Into<PathBuf>,
        section: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Format {
            path: path.into(),
            section: section.into(),
            reason: reason.into(),
        }
    }
}

/// Fails with [`Error::NonFinite`] on the first row of `data` (row-major, `dim` columns) holding
/// NaN or infinity.
pub fn check_finite(what: &'static str, data: &[f32], dim: usize) -> Result<()> {
    if dim == 0 {
        return Ok(());
    }
    match data.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::NonFinite { what, row: i / dim }),
        None => Ok(()),
    }
}
