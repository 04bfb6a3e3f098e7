//! A small GGUF writer (v3, alignment 32), for tests and tools that need small model files.

use super::{MetaValue, DEFAULT_ALIGNMENT, MAGIC};

/// A tensor for [`write_gguf`]: name, dims (fastest first), ggml type id and raw data bytes.
pub type RawTensor<'a> = (&'a str, &'a [u64], u32, &'a [u8]);

/// Serializes a GGUF v3 file (alignment 32). Meant for tests and tools that need small model files.
pub fn write_gguf(metadata: &[(&str, MetaValue)], tensors: &[RawTensor<'_>]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn value(out: &mut Vec<u8>, v: &MetaValue) {
        match v {
            MetaValue::U8(x) => out.push(*x),
            MetaValue::I8(x) => out.push(*x as u8),
            MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::Bool(x) => out.push(u8::from(*x)),
            MetaValue::Str(s) => string(out, s),
            MetaValue::Array(items) => {
                let elem = items.first().map_or(4, MetaValue::type_id);
                out.extend_from_slice(&elem.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    value(out, item);
                }
            }
            MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    let align = DEFAULT_ALIGNMENT as usize;
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut out, k);
        out.extend_from_slice(&v.type_id().to_le_bytes());
        value(&mut out, v);
    }
    let mut offset = 0usize;
    for (name, dims, ty, data) in tensors {
        string(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in *dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += data.len().div_ceil(align) * align;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(align) * align, 0);
    }
    out
}
