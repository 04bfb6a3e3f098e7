//! What a user sees when a command fails (issue 49): the error and its causes once each, no
//! backtrace even with `RUST_BACKTRACE=1`; `demo` rejects sizes its retrieval cannot serve before
//! fetching or loading the model; `inspect` says that it did not verify the sections, and
//! `inspect --verify` / `verify` find a flipped byte. Needs no model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn qkindex(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qkindex"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("QKINDEX_DEBUG")
        .output()
        .expect("qkindex runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A failed run's stderr: no backtrace, and no line twice.
fn user_error(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    let err = text(&o.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        assert!(!lines[..i].contains(l), "line repeated: {l}\n{err}");
    }
    err
}

#[test]
fn a_missing_dump_is_one_error_chain_without_a_backtrace() {
    let o = qkindex(&[
        "bench",
        "--dump",
        "/nonexistent",
        "--out",
        "/nonexistent/out",
    ]);
    let err = user_error(&o);
    assert!(err.contains("/nonexistent"), "{err}");
    // The io error's text appears once, inside its cause line.
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn bench_rejects_a_bracket_below_every_target_before_reading_the_dump() {
    for bad in ["0.5", "1.5", "NaN"] {
        let o = qkindex(&[
            "bench",
            "--dump",
            "/nonexistent",
            "--out",
            "/nonexistent/out",
            "--bracket-up-to",
            bad,
        ]);
        let err = user_error(&o);
        assert!(err.contains("--bracket-up-to"), "{bad}: {err}");
        assert!(
            !err.contains("/nonexistent"),
            "{bad}: read the dump first: {err}"
        );
    }
}

#[test]
fn demo_rejects_a_context_without_a_rest_before_any_work() {
    let out = std::env::temp_dir().join(format!("qkindex-cli-errors-{}", std::process::id()));
    let o = qkindex(&[
        "demo",
        "--context",
        "2",
        "--new",
        "4",
        "--out",
        &out.to_string_lossy(),
    ]);
    let err = user_error(&o);
    assert_eq!(
        err.matches("must exceed sink + window = 640").count(),
        1,
        "{err}"
    );
    assert!(err.contains("--context 2"), "{err}");
    let stdout = text(&o.stdout);
    assert!(
        !stdout.contains("prefill"),
        "prefilled before failing: {stdout}"
    );
    assert!(!out.exists());
    let o = qkindex(&["demo", "--new", "0", "--out", &out.to_string_lossy()]);
    assert!(user_error(&o).contains("--new must be at least 1"));
}

fn flat_bundle(dir: &Path) -> PathBuf {
    let dump = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/smollm2-8k-subset");
    let _ = std::fs::remove_dir_all(dir);
    let o = Command::new(env!("CARGO_BIN_EXE_qkindex"))
        .args([
            "build", "--layers", "9", "--heads", "0", "--kind", "flat", "--dump",
        ])
        .arg(&dump)
        .arg("--out")
        .arg(dir)
        .output()
        .expect("build runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    dir.join("keys-L09-kv0.qki")
}

#[test]
fn inspect_says_it_did_not_verify_and_verify_finds_the_flipped_byte() {
    let dir = std::env::temp_dir().join(format!("qkindex-cli-errors-b{}", std::process::id()));
    let keys = flat_bundle(&dir);
    let mut bytes = std::fs::read(&keys).expect("read");
    bytes[5000] ^= 1; // inside the keys section
    std::fs::write(&keys, &bytes).expect("write");
    let path = keys.to_string_lossy().to_string();

    let o = qkindex(&["inspect", &path]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("NOT verified"), "{out}");
    assert!(out.contains("qkindex verify"), "{out}");

    let o = qkindex(&["inspect", "--json", &path]);
    assert!(o.status.success());
    let _: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout stays JSON");
    assert!(text(&o.stderr).contains("NOT verified"));

    let err = user_error(&qkindex(&["inspect", "--verify", &path]));
    assert!(err.contains("checksum mismatch"), "{err}");

    let o = qkindex(&["verify", &path]);
    assert!(!o.status.success());
    assert!(text(&o.stdout).contains("checksum mismatch"));

    // A flipped byte in the header is an error of inspect itself.
    bytes[5000] ^= 1;
    bytes[20] ^= 1;
    std::fs::write(&keys, &bytes).expect("write");
    let err = user_error(&qkindex(&["inspect", &path]));
    assert!(err.contains("header checksum mismatch"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn batch_rejects_empty_batches_and_steps_before_loading_the_model() {
    let err = user_error(&qkindex(&["batch", "--batch", "1,0"]));
    assert!(err.contains("--batch"), "{err}");
    let err = user_error(&qkindex(&["batch", "--new", "0"]));
    assert!(err.contains("--new"), "{err}");
    let err = user_error(&qkindex(&["batch", "--context", "10", "--new", "9"]));
    assert!(err.contains("--context"), "{err}");
    // An unknown KV cache type is a usage error naming the choices.
    let o = qkindex(&["eval", "--kv-cache", "f8"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("f32 or f16"),
        "{}",
        text(&o.stderr)
    );
}
