//! GGUF files: a reader (header, metadata key/values, tensor table, and zero-copy access to tensor
//! bytes through a memory map) and a small writer for tests.
//!
//! Layout (GGUF v2/v3, little-endian): magic `GGUF`, `version: u32`, `n_tensors: u64`, `n_kv: u64`;
//! `n_kv` × (key string, `type: u32`, value); `n_tensors` × (name string, `n_dims: u32`,
//! `dims: [u64; n_dims]` fastest first, `ggml_type: u32`, `offset: u64`); padding to
//! `general.alignment` (default 32); the tensor data, each tensor at `data_start + offset`.
//! Strings are `len: u64` + UTF-8 bytes. Every length and offset is checked against the file size
//! before anything is allocated or sliced, so a truncated or crafted file is an error, not a panic.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`MetaValue`], the format's constants |
//! | `read.rs` | [`GgufFile`]: parsing with bounds checks, metadata getters, dequantized tensors |
//! | `write.rs` | [`write_gguf`]: small GGUF v3 files for tests and tools |

mod read;
mod write;

pub use read::{GgufFile, TensorInfo};
pub use write::{write_gguf, RawTensor};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    fn type_id(&self) -> u32 {
        match self {
            Self::U8(_) => 0,
            Self::I8(_) => 1,
            Self::U16(_) => 2,
            Self::I16(_) => 3,
            Self::U32(_) => 4,
            Self::I32(_) => 5,
            Self::F32(_) => 6,
            Self::Bool(_) => 7,
            Self::Str(_) => 8,
            Self::Array(_) => 9,
            Self::U64(_) => 10,
            Self::I64(_) => 11,
            Self::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(x) => Some(x.into()),
            Self::U16(x) => Some(x.into()),
            Self::U32(x) => Some(x.into()),
            Self::U64(x) => Some(x),
            Self::I8(x) => u64::try_from(x).ok(),
            Self::I16(x) => u64::try_from(x).ok(),
            Self::I32(x) => u64::try_from(x).ok(),
            Self::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(x) => Some(x.into()),
            Self::F64(x) => Some(x),
            _ => self.as_u64().map(|x| x as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}
