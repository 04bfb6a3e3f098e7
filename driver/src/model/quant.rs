//! ggml tensor types and their dequantization to f32.
//!
//! Block layouts follow ggml (`ggml-common.h`); all scalars little-endian:
//! - `Q4_1`: 32 weights in 20 bytes: `d: f16`, `m: f16`, then 16 bytes of nibbles. Byte `j` holds
//!   weight `j` in its low nibble and weight `j + 16` in its high nibble; `x = q * d + m`.
//! - `Q8_0`: 32 weights in 34 bytes: `d: f16`, then 32 `i8`; `x = q * d`.
//! - `F16` / `F32`: plain little-endian values.

use half::f16;

/// Weights per quantization block of the block types (`QK4_1`, `QK8_0`).
pub const QK: usize = 32;

/// A ggml tensor type. Only the supported ones have variants; the rest keep their id (and a name for
/// error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_1,
    Q8_0,
    /// Any other ggml type id (readable metadata, not dequantizable here).
    Other(u32),
}

impl GgmlType {
    /// The type for a ggml type id (`enum ggml_type`).
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            other => Self::Other(other),
        }
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::Other(id) => id,
        }
    }

    /// ggml's name of the type (for messages).
    pub fn name(self) -> &'static str {
        match self.id() {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            30 => "BF16",
            _ => "unknown",
        }
    }

    /// `(weights per block, bytes per block)` of a supported type; `None` for the others.
    pub fn block_layout(self) -> Option<(usize, usize)> {
        match self {
            Self::F32 => Some((1, 4)),
            Self::F16 => Some((1, 2)),
            Self::Q4_1 => Some((QK, 4 + QK / 2)),
            Self::Q8_0 => Some((QK, 2 + QK)),
            Self::Other(_) => None,
        }
    }

    /// Bytes that `n` weights take, or `None` when the type is unsupported, `n` is not a whole
    /// number of blocks, or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (per_block, block_bytes) = self.block_layout()?;
        let per_block = per_block as u64;
        if !n.is_multiple_of(per_block) {
            return None;
        }
        (n / per_block).checked_mul(block_bytes as u64)
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst`; `dst.len()` weights are decoded and
/// `src.len()` must be exactly their size. Returns `false` (writing nothing) when the type is
/// unsupported or the lengths disagree.
pub fn dequantize_into(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    if ty.bytes_for(dst.len() as u64) != Some(src.len() as u64) {
        return false;
    }
    match ty {
        GgmlType::F32 => {
            for (x, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (x, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *x = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_1 => {
            for (out, block) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(20)) {
                let d = f16_at(block, 0);
                let m = f16_at(block, 2);
                let (lo, hi) = out.split_at_mut(QK / 2);
                for (j, &q) in block[4..].iter().enumerate() {
                    lo[j] = f32::from(q & 0x0F) * d + m;
                    hi[j] = f32::from(q >> 4) * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (out, block) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(34)) {
                let d = f16_at(block, 0);
                for (x, &q) in out.iter_mut().zip(&block[2..]) {
                    *x = f32::from(q as i8) * d;
                }
            }
        }
        GgmlType::Other(_) => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_known_block() {
        // d = 0.5, m = -1: nibble q decodes to q / 2 - 1. Byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut block = Vec::new();
        block.extend_from_slice(&h(0.5));
        block.extend_from_slice(&h(-1.0));
        for j in 0..16u8 {
            block.push(((15 - j) << 4) | j);
        }
        let mut out = [0f32; 32];
        assert!(dequantize_into(GgmlType::Q4_1, &block, &mut out));
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0, "low nibble {j}");
            assert_eq!(out[j + 16], (15 - j) as f32 * 0.5 - 1.0, "high nibble {j}");
        }
    }

    #[test]
    fn q8_0_known_blocks() {
        let mut src = Vec::new();
        for d in [0.25f32, -2.0] {
            src.extend_from_slice(&h(d));
            for j in 0..32i32 {
                src.push(((j - 16) * 3) as i8 as u8);
            }
        }
        let mut out = [0f32; 64];
        assert!(dequantize_into(GgmlType::Q8_0, &src, &mut out));
        for j in 0..32 {
            assert_eq!(out[j], ((j as i32 - 16) * 3) as f32 * 0.25);
            assert_eq!(out[32 + j], ((j as i32 - 16) * 3) as f32 * -2.0);
        }
    }

    #[test]
    fn f16_and_f32() {
        let vals = [1.0f32, -0.5, 65504.0, 3.140625];
        let src: Vec<u8> = vals.iter().flat_map(|&x| h(x)).collect();
        let mut out = [0f32; 4];
        assert!(dequantize_into(GgmlType::F16, &src, &mut out));
        assert_eq!(out, vals);
        let src: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = [0f32; 4];
        assert!(dequantize_into(GgmlType::F32, &src, &mut out));
        assert_eq!(out, vals);
    }

    #[test]
    fn rejects_bad_lengths_and_types() {
        let mut out = [0f32; 32];
        assert!(!dequantize_into(GgmlType::Q4_1, &[0u8; 19], &mut out));
        assert!(!dequantize_into(GgmlType::Q8_0, &[0u8; 20], &mut out));
        assert!(!dequantize_into(GgmlType::Other(12), &[0u8; 144], &mut out));
        let mut odd = [0f32; 31];
        assert!(!dequantize_into(GgmlType::Q4_1, &[0u8; 20], &mut odd));
        assert_eq!(GgmlType::from_id(12).name(), "Q4_K");
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
    }
}
