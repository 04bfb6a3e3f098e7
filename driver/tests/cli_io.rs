//! `qkindex build`, `inspect` and `verify` on the committed real subset (data/smollm2-8k-subset):
//! a flat bundle (fast to build) verifies, inspects, and after a flipped byte or a truncation
//! `verify` exits non-zero with one line naming the file and section.

use std::path::{Path, PathBuf};
use std::process::Command;

fn qkindex() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qkindex"))
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkindex-cli-io-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn verify(path: &Path) -> (bool, String) {
    let out = qkindex()
        .arg("verify")
        .arg(path)
        .output()
        .expect("run verify");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn build_inspect_verify_and_detect_damage() {
    let dump = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/smollm2-8k-subset");
    let bundle = out_dir("bundle");
    let status = qkindex()
        .args(["build", "--layers", "9", "--heads", "0,2", "--kind", "flat"])
        .arg("--dump")
        .arg(&dump)
        .arg("--out")
        .arg(&bundle)
        .status()
        .expect("run build");
    assert!(status.success());
    let mut names: Vec<String> = std::fs::read_dir(&bundle)
        .expect("bundle dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "index-L09-h0.qki",
            "index-L09-h2.qki",
            "keys-L09-kv0.qki",
            "manifest.json"
        ]
    );

    let (ok, line) = verify(&bundle);
    assert!(ok, "{line}");
    assert!(
        line.starts_with("ok: ") && line.contains("4 files"),
        "{line}"
    );

    let out = qkindex()
        .arg("inspect")
        .arg(bundle.join("keys-L09-kv0.qki"))
        .output()
        .expect("inspect");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("kind keys") && text.contains("n 8128") && text.contains("d 64"),
        "{text}"
    );

    // A flipped byte in the keys.
    let key_file = bundle.join("keys-L09-kv0.qki");
    let mut bytes = std::fs::read(&key_file).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&key_file, &bytes).expect("write");
    let (ok, line) = verify(&bundle);
    assert!(!ok);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains("keys-L09-kv0.qki") && line.contains("keys:"),
        "{line}"
    );

    // A truncated index file.
    let index_file = bundle.join("index-L09-h2.qki");
    let bytes = std::fs::read(&index_file).expect("read");
    std::fs::write(&index_file, &bytes[..bytes.len() - 3]).expect("write");
    let (ok, line) = verify(&index_file);
    assert!(!ok);
    assert!(
        line.starts_with("fault: ") && line.contains("index-L09-h2.qki"),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&bundle);
}
