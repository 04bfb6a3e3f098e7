//! `qkindex bench --cache DIR` keeps built indexes: a second run loads them and measures the
//! same recall and scanned fraction, and a damaged cache file is rebuilt rather than trusted.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bench(dump: &Path, cache: &Path, out: &Path) -> String {
    let res = Command::new(env!("CARGO_BIN_EXE_qkindex"))
        .args(["bench", "--dump"])
        .arg(dump)
        .args([
            "--layers",
            "9",
            "--heads",
            "1",
            "--kinds",
            "attention,ivf",
            "--queries",
            "q2k",
            "--ef",
            "100,200",
            "--nprobe",
            "8",
            "--max-train",
            "2000",
            "--repeat",
            "1",
            "--latency-samples",
            "0",
            "--cache",
        ])
        .arg(cache)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run qkindex bench");
    let log = String::from_utf8_lossy(&res.stderr).into_owned();
    assert!(res.status.success(), "qkindex bench failed:\n{log}");
    log
}

/// (index, params, recall, scanned) of every row.
fn rows(out: &Path) -> Vec<(String, String, f64, f64)> {
    let text = std::fs::read_to_string(out.join("bench.json")).expect("bench.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["index"].as_str().expect("index").to_string(),
                r["params"].to_string(),
                r["recall"].as_f64().expect("recall"),
                r["scanned"].as_f64().expect("scanned"),
            )
        })
        .collect()
}

#[test]
fn cached_builds_are_reused_and_damaged_ones_rebuilt() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dump = root.join("data/smollm2-8k-subset");
    let tmp = std::env::temp_dir().join(format!("qkindex-bench-cache-{}", std::process::id()));
    let cache = tmp.join("cache");
    let first = bench(&dump, &cache, &tmp.join("a"));
    assert!(!first.contains("loaded from the build cache"), "{first}");
    let second = bench(&dump, &cache, &tmp.join("b"));
    assert_eq!(
        second.matches("loaded from the build cache").count(),
        2,
        "{second}"
    );
    assert_eq!(rows(&tmp.join("a")), rows(&tmp.join("b")));

    // Truncate the attention index: the next run must rebuild it, with the same results.
    let file = std::fs::read_dir(&cache)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.contains("attention") && name.ends_with(".qki")
        })
        .expect("cached attention index");
    let bytes = std::fs::read(&file).expect("read index");
    std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate index");
    let third = bench(&dump, &cache, &tmp.join("c"));
    assert!(third.contains("cache: rebuilding"), "{third}");
    assert_eq!(
        third.matches("loaded from the build cache").count(),
        1,
        "{third}"
    );
    assert_eq!(rows(&tmp.join("a")), rows(&tmp.join("c")));
    let _ = std::fs::remove_dir_all(&tmp);
}
