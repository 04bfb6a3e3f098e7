//! `--device`: where exact kNN for index builds runs. `auto` logs its choice and, without a usable
//! GPU, builds on the CPU and says why; `cuda` without a GPU is a clear error, never a crash; on a
//! machine with a GPU both build and report `cuda:0`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(device: &str, out: &std::path::Path) -> Output {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    Command::new(env!("CARGO_BIN_EXE_qkindex"))
        .args(["--device", device, "bench", "--dump"])
        .arg(root.join("data/smollm2-8k-subset"))
        .args([
            "--layers",
            "9",
            "--heads",
            "0",
            "--kinds",
            "attention",
            "--queries",
            "q2k",
        ])
        .args([
            "--ef",
            "128",
            "--max-train",
            "1500",
            "--repeat",
            "1",
            "--latency-samples",
            "0",
        ])
        .arg("--out")
        .arg(out)
        .output()
        .expect("run qkindex bench")
}

#[test]
fn auto_builds_and_logs_its_choice_cuda_fails_cleanly_without_a_gpu() {
    let tmp = std::env::temp_dir().join(format!("qkindex-device-{}", std::process::id()));
    let auto = bench("auto", &tmp.join("auto"));
    let log = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "auto failed:\n{log}");
    let line = log
        .lines()
        .find(|l| l.starts_with("exact kNN for index builds: "))
        .unwrap_or_else(|| panic!("no backend line in:\n{log}"));
    println!("{line}");
    let has_gpu = line.contains("cuda:");
    if !has_gpu {
        assert!(line.contains("cpu (auto: no usable GPU: "), "{line}");
    }
    let cuda = bench("cuda", &tmp.join("cuda"));
    let log = String::from_utf8_lossy(&cuda.stderr);
    if has_gpu {
        assert!(cuda.status.success(), "cuda failed:\n{log}");
    } else {
        assert!(!cuda.status.success(), "cuda without a GPU succeeded");
        assert!(log.contains("no usable GPU"), "unclear error:\n{log}");
        assert!(!log.contains("panicked"), "crashed:\n{log}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
