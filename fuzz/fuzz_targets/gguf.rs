//! Fuzzes the model crate's GGUF reader and what loading a model does with its contents: arbitrary
//! bytes must give a model's parts or a typed error, never a panic or a giant allocation (the
//! hyperparameters are bounded before anything is sized by them, tensor data by the file).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use qkindex_model::gguf::GgufFile;
use qkindex_model::{Config, ModelTokenizer, Weights};

fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(Path::new("fuzz.gguf"), data.to_vec()) else {
        return;
    };
    // Every tensor of a readable type dequantizes or fails cleanly.
    for t in g.tensors() {
        let _ = g.dequantize(&t.name, &t.dims);
    }
    let Ok(cfg) = Config::from_gguf(&g) else {
        return;
    };
    let _ = ModelTokenizer::from_gguf(&g);
    let _ = Weights::from_gguf(&g, &cfg);
});
