//! ggml tensor types and their dequantization to f32.
//!
//! Block layouts follow ggml (`ggml-common.h`); all scalars little-endian:
//! - `Q4_1`: 32 weights in 20 bytes: `d: f16`, `m: f16`, then 16 bytes of nibbles. Byte `j` holds
//!   weight `j` in its low nibble and weight `j + 16` in its high nibble; `x = q * d + m`.
//! - `Q8_0`: 32 weights in 34 bytes: `d: f16`, then 32 `i8`; `x = q * d`.
//! - `Q5_0`: 32 weights in 22 bytes: `d: f16`, `qh: u32` (bit `j` is the fifth bit of weight `j`),
//!   then 16 bytes of nibbles laid out as in `Q4_1`; `x = (q − 16) * d`.
//! - `Q4_K`: 256 weights in 144 bytes: `d: f16`, `dmin: f16`, 12 bytes of eight 6-bit
//!   (scale, min) pairs, 128 bytes of nibbles. Each 64 weights read 32 bytes: the low nibbles are
//!   the first 32 weights (pair `2i`), the high nibbles the next 32 (pair `2i + 1`);
//!   `x = d * scale * q − dmin * min`.
//! - `Q6_K`: 256 weights in 210 bytes: 128 bytes of low nibbles `ql`, 64 bytes of high bit pairs
//!   `qh`, 16 `i8` scales (one per 16 weights), `d: f16`; `x = d * scale * (q − 32)`.
//! - `F16` / `F32`: plain little-endian values.

use half::f16;

/// Weights per quantization block of the block types (`QK4_1`, `QK5_0`, `QK8_0`).
pub const QK: usize = 32;
/// Weights per super-block of the k-quants (`QK_K`).
pub const QK_K: usize = 256;

/// A ggml tensor type. Only the supported ones have variants; the rest keep their id (and a name for
/// error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4K,
    Q6K,
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
            6 => Self::Q5_0,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            14 => Self::Q6K,
            other => Self::Other(other),
        }
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q6K => 14,
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
            Self::Q5_0 => Some((QK, 2 + 4 + QK / 2)),
            Self::Q8_0 => Some((QK, 2 + QK)),
            Self::Q4K => Some((QK_K, 2 + 2 + 12 + QK_K / 2)),
            Self::Q6K => Some((QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2)),
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
        GgmlType::Q5_0 => {
            for (out, block) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(22)) {
                let d = f16_at(block, 0);
                let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                let (lo, hi) = out.split_at_mut(QK / 2);
                for (j, &q) in block[6..].iter().enumerate() {
                    let h0 = ((qh >> j) & 1) << 4;
                    let h1 = ((qh >> (j + 16)) & 1) << 4;
                    lo[j] = ((u32::from(q & 0x0F) | h0) as i32 - 16) as f32 * d;
                    hi[j] = ((u32::from(q >> 4) | h1) as i32 - 16) as f32 * d;
                }
            }
        }
        GgmlType::Q4K => {
            for (out, block) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(144)) {
                dequantize_q4k_block(block, out);
            }
        }
        GgmlType::Q6K => {
            for (out, block) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(210)) {
                dequantize_q6k_block(block, out);
            }
        }
        GgmlType::Other(_) => return false,
    }
    true
}

/// Scale and min `j` (0..8) of a `Q4_K` block's 12 packed bytes: pairs 0–3 are the low six bits
/// of bytes `j` and `j + 4`; pairs 4–7 take their low four bits from byte `j + 4` and their top
/// two from the spare bits of bytes `j − 4` and `j`.
fn q4k_scale_min(j: usize, packed: &[u8]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// One `Q4_K` super-block (144 bytes) into 256 weights.
fn dequantize_q4k_block(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let packed = &block[4..16];
    let qs = &block[16..144];
    for (i, (chunk, q)) in out
        .chunks_exact_mut(64)
        .zip(qs.chunks_exact(32))
        .enumerate()
    {
        let (s0, m0) = q4k_scale_min(2 * i, packed);
        let (s1, m1) = q4k_scale_min(2 * i + 1, packed);
        let (d0, d1) = (d * f32::from(s0), d * f32::from(s1));
        let (n0, n1) = (dmin * f32::from(m0), dmin * f32::from(m1));
        let (lo, hi) = chunk.split_at_mut(32);
        for (l, &b) in q.iter().enumerate() {
            lo[l] = d0 * f32::from(b & 0x0F) - n0;
            hi[l] = d1 * f32::from(b >> 4) - n1;
        }
    }
}

/// One `Q6_K` super-block (210 bytes) into 256 weights: each half of 128 weights reads 64 bytes of
/// `ql`, 32 of `qh` and 8 scales; within it, weight `l + 32·r` (r = 0..4) takes the low or high
/// nibble of `ql[l]` / `ql[l + 32]` and bit pair `r` of `qh[l]`.
fn dequantize_q6k_block(block: &[u8], out: &mut [f32]) {
    let (ql, rest) = block.split_at(QK_K / 2);
    let (qh, rest) = rest.split_at(QK_K / 4);
    let (scales, dbytes) = rest.split_at(QK_K / 16);
    let d = f16_at(dbytes, 0);
    for (half, chunk) in out.chunks_exact_mut(128).enumerate() {
        let ql = &ql[half * 64..half * 64 + 64];
        let qh = &qh[half * 32..half * 32 + 32];
        let sc = &scales[half * 8..half * 8 + 8];
        for l in 0..32 {
            let h = qh[l];
            let q = [
                (ql[l] & 0x0F) | ((h & 3) << 4),
                (ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4),
                (ql[l] >> 4) | (((h >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4),
            ];
            let is = l / 16;
            for (r, &qr) in q.iter().enumerate() {
                let scale = f32::from(sc[is + 2 * r] as i8);
                chunk[l + 32 * r] = d * scale * (i32::from(qr) - 32) as f32;
            }
        }
    }
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
        assert!(!dequantize_into(GgmlType::Other(2), &[0u8; 18], &mut out));
        assert!(!dequantize_into(GgmlType::Q4K, &[0u8; 144], &mut out));
        let mut odd = [0f32; 31];
        assert!(!dequantize_into(GgmlType::Q4_1, &[0u8; 20], &mut odd));
        assert_eq!(GgmlType::from_id(12), GgmlType::Q4K);
        assert_eq!(GgmlType::Q4K.name(), "Q4_K");
        assert_eq!(GgmlType::Q6K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::Q5_0.bytes_for(64), Some(44));
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
    }
}
