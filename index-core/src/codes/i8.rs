//! Int8 codes in interleaved groups: 4 dimensions of [`GROUP`] keys per 64-byte line, estimated
//! with one `vpdpbusd` per line ([`crate::metric::int8::I8Kernels::group_q8`],
//! [`crate::metric::int8::I8Kernels::scan_q8`]).

use super::{GroupCode, Line};
use crate::metric::int8::{i8_kernels, QuantQuery, GROUP};

/// The int8 group code: each key's int8 code as it is, biased by 128 (`code ^ 0x80`), so an
/// empty slot (byte `0x80`) holds code 0.
#[derive(Clone, Copy, Debug)]
pub(crate) struct I8;

/// A line of empty slots: code 0 (byte `0x80`) in every dimension.
pub(crate) const EMPTY_LINE: Line = Line([0x80; 64]);
const _: () = assert!(4 * GROUP == 64, "a line holds 4 dimensions of a group");

impl GroupCode for I8 {
    const DIMS_PER_LINE: usize = 4;
    const EMPTY: Line = EMPTY_LINE;

    fn write_code(lines: &mut [Line], slot: usize, code: &[i8], scale: f32) -> f32 {
        for (i, &c) in code.iter().enumerate() {
            lines[i / 4].0[4 * slot + i % 4] = (c as u8) ^ 0x80;
        }
        scale
    }

    fn scan(quant: &QuantQuery, bytes: &[u8], code_lines: usize, out: &mut [f32]) {
        (i8_kernels().scan_q8)(quant, bytes, code_lines, out)
    }
}
