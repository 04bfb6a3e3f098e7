//! `qkindex bench` runs the baseline kinds (IVF, Vamana, RobustVamana) on the committed real
//! subset (`data/smollm2-8k-subset`) and labels their rows as docs/DESIGN.md §4 says; a budget that
//! covers every key (nprobe = nlist, ef = n) gives recall 1.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn bench_runs_ivf_vamana_and_robust_vamana() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dump = root.join("data/smollm2-8k-subset");
    let out = std::env::temp_dir().join(format!("qkindex-bench-baselines-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_qkindex"))
        .args(["bench", "--dump"])
        .arg(&dump)
        .args([
            "--layers",
            "9",
            "--heads",
            "1",
            "--kinds",
            "ivf,vamana,robust-vamana",
            "--ef",
            "100,8128",
            "--nprobe",
            "8,361,1000",
            "--max-train",
            "2000",
            "--repeat",
            "1",
            // One timed pass: recall is what this test checks (latency passes would search
            // each query ~16 times more, at ef = n, in the dev profile).
            "--latency-samples",
            "0",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("run qkindex bench");
    assert!(status.success(), "qkindex bench failed: {status}");
    let text = std::fs::read_to_string(out.join("bench.json")).expect("bench.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    let rows = json["rows"].as_array().expect("rows");
    let n = 8128.0;
    let find = |index: &str, variant: &str, queries: &str, key: &str, value: u64| {
        rows.iter()
            .find(|r| {
                r["index"] == index
                    && r["variant"] == variant
                    && r["queries"] == queries
                    && r["params"][key] == value
            })
            .unwrap_or_else(|| panic!("no row {index}/{variant}/{queries}/{key}={value}"))
    };
    for q in ["q2k", "k2k"] {
        // nlist = round(4·√8128) = 361; nprobe 1000 is above it and not measured.
        let full = find("ivf", "", q, "nprobe", 361);
        assert_eq!(full["recall"], 1.0, "ivf {q} nprobe = nlist");
        let scanned = full["scanned"].as_f64().expect("scanned");
        assert!((scanned - (n + 361.0) / n).abs() < 1e-9, "{scanned}");
        let part = find("ivf", "", q, "nprobe", 8);
        let s = part["scanned"].as_f64().expect("scanned");
        assert!(s > 361.0 / n && s < 0.5, "ivf {q} nprobe 8 scanned {s}");
        for variant in ["", "robust"] {
            let exact = find("vamana", variant, q, "ef", 8128);
            assert_eq!(exact["recall"], 1.0, "vamana {variant} {q} ef = n");
            let r = find("vamana", variant, q, "ef", 100)["recall"]
                .as_f64()
                .expect("recall");
            assert!(r > 0.8, "vamana {variant} {q} ef 100 recall {r}");
        }
    }
    assert!(!rows
        .iter()
        .any(|r| r["index"] == "ivf" && r["params"]["nprobe"] == 1000));
    let _ = std::fs::remove_dir_all(&out);
}
