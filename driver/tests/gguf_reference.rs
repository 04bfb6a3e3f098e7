//! The driver's dequantizers against values computed independently by the `gguf` Python package
//! on the real Gemma 3 270M file (`scripts/gguf-reference.py` wrote
//! `tests/fixtures/gemma3-dequant.json`): Q5_0, Q4_K, Q6_K (new for Gemma 3), Q8_0 and F32.
//!
//! Without the model (`bash scripts/get-model.sh --model gemma3-270m`) the test prints `SKIP`
//! and passes, except under CI (`CI` set), where the model is fetched first and its absence fails.

mod common;

use std::path::Path;

use qkindex_model::gguf::GgufFile;

#[derive(serde::Deserialize)]
struct Fixture {
    tensors: Vec<Reference>,
}

#[derive(serde::Deserialize)]
struct Reference {
    name: String,
    #[serde(rename = "type")]
    ty: String,
    n: usize,
    head: Vec<f64>,
    stride: usize,
    sampled: Vec<f64>,
    sum: f64,
    sum_sq: f64,
}

#[test]
fn dequantized_tensors_equal_the_gguf_package() {
    let Some(model) = common::gemma3_model() else {
        return;
    };
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3-dequant.json"),
    )
    .expect("fixture");
    let fixture: Fixture = serde_json::from_str(&text).expect("fixture JSON");
    let g = GgufFile::open(&model).expect("open the GGUF file");
    let mut types = Vec::new();
    for r in &fixture.tensors {
        let info = g.tensor(&r.name).expect("tensor in file");
        assert_eq!(info.ggml_type.name(), r.ty, "{}", r.name);
        let dims = info.dims.clone();
        let x = g.dequantize(&r.name, &dims).expect("dequantize");
        assert_eq!(x.len(), r.n, "{}", r.name);
        // Both sides compute each weight in f32 from the same f16/integer fields, but numpy may
        // multiply in another order (ggml's C order is ours): allow one f32 rounding.
        let close =
            |got: f32, want: f64| (f64::from(got) - want).abs() <= 2e-7 * want.abs().max(1e-3);
        for (i, (&got, &want)) in x.iter().zip(&r.head).enumerate() {
            assert!(close(got, want), "{}[{i}]: {got} vs {want}", r.name);
        }
        for (j, &want) in r.sampled.iter().enumerate() {
            let i = j * r.stride;
            assert!(close(x[i], want), "{}[{i}]: {} vs {want}", r.name, x[i]);
        }
        let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
        let sum_sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let tol = 1e-6 * (1.0 + r.sum_sq);
        assert!(
            (sum - r.sum).abs() <= tol,
            "{}: sum {sum} vs {}",
            r.name,
            r.sum
        );
        assert!(
            (sum_sq - r.sum_sq).abs() <= tol,
            "{}: sum_sq {sum_sq} vs {}",
            r.name,
            r.sum_sq
        );
        types.push(r.ty.clone());
    }
    for ty in ["Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"] {
        assert!(types.iter().any(|t| t == ty), "fixture covers {ty}");
    }
}
