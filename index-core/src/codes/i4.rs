//! 4-bit codes in interleaved groups: the int8 codes rounded to 15 levels, 8 dimensions of
//! [`GROUP`](crate::metric::int8::GROUP) keys per 64-byte line (low and high nibbles),
//! estimated with two `vpdpbusd` per line ([`crate::metric::int8::I8Kernels::scan_q4`]). For
//! the scans only (`flat`, `ivf`): half the bytes of int8, coarser estimates.

use super::{GroupCode, Line};
use crate::metric::int8::{i8_kernels, QuantQuery};

/// The 4-bit group code: a key's int8 code `c` becomes `round(7c / 127)` (in `-7..=7`, stored
/// as `+ 8`) and its scale `127 / 7` times larger.
#[derive(Clone, Copy, Debug)]
pub(crate) struct I4;

impl GroupCode for I4 {
    const DIMS_PER_LINE: usize = 8;
    /// Code 0 (nibble 8) in every dimension.
    const EMPTY: Line = Line([0x88; 64]);

    fn write_code(lines: &mut [Line], slot: usize, code: &[i8], scale: f32) -> f32 {
        for (i, &c) in code.iter().enumerate() {
            let n = ((f32::from(c) * 7.0 / 127.0).round() as i32 + 8) as u8;
            let byte = &mut lines[i / 8].0[4 * slot + i % 4];
            if i % 8 < 4 {
                *byte = (*byte & 0xf0) | n;
            } else {
                *byte = (*byte & 0x0f) | (n << 4);
            }
        }
        scale * (127.0 / 7.0)
    }

    fn scan(quant: &QuantQuery, bytes: &[u8], code_lines: usize, out: &mut [f32]) {
        (i8_kernels().scan_q4)(quant, bytes, code_lines, out)
    }
}
