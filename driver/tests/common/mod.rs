//! What the driver's Gemma 3 tests share: finding the model file.

use std::path::PathBuf;

#[path = "../../../tests/support/skip.rs"]
pub mod skip;

/// The repository root (the driver crate's parent).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `models/gemma-3-270m-q4_k_m.gguf`, or None after recording a skip (`tests/support/skip.rs`)
/// where it is missing. Under CI (`CI` set) a missing file fails the test instead: CI fetches it
/// first.
pub fn gemma3_model() -> Option<PathBuf> {
    let path = root().join("models/gemma-3-270m-q4_k_m.gguf");
    if path.is_file() {
        return Some(path);
    }
    skip::skip_unless_ci(&format!(
        "{} not found (scripts/get-model.sh --model gemma3-270m)",
        path.display()
    ));
    None
}

/// `texts/pg-essays.txt` (Paul Graham's essays, `scripts/get-text.sh`), or None after recording
/// a skip where it is missing; under CI a missing file fails the test (CI fetches it first).
// Each test crate compiles this module; only long_text.rs calls this.
#[allow(dead_code)]
pub fn pg_essays() -> Option<PathBuf> {
    let path = root().join("texts/pg-essays.txt");
    if path.is_file() {
        return Some(path);
    }
    skip::skip_unless_ci(&format!(
        "{} not found (scripts/get-text.sh)",
        path.display()
    ));
    None
}
