//! Fuzzes the index-file loader: arbitrary bytes must give an index or a typed error, never a
//! panic, and a loaded index must search without panicking.
//!
//! The first input byte picks the mode: bit 0 reseals the checksums first (so mutations reach
//! the structural checks behind them), bit 1 opens without verification.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qkindex::io::{self, LoadOptions};
use qkindex::{AnnIndex, Error, SearchParams};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        io::format::reseal(&mut bytes);
    }
    let opts = LoadOptions {
        verify: mode & 2 == 0,
        ..LoadOptions::default()
    };
    match io::load_bytes(&bytes, "fuzz.qki", &opts) {
        Ok(index) => {
            let query = vec![0.25f32; index.dim()];
            let mut scratch = index.new_scratch();
            let k = index.len().min(10);
            let _ = index.search(&query, k, &SearchParams::with_ef(16), &mut scratch);
        }
        Err(Error::Format { .. }) | Err(Error::Io { .. }) => {}
        Err(other) => panic!("unexpected error kind: {other}"),
    }
});
