//! `qkindex tasks` end to end on SmolLM2 (skipped when `models/` has no model, a failure under
//! CI): two tasks at ~1024 tokens, one trial, full / static / exact-topk at one budget; the JSON
//! has every cell and trial, `full` finds the needle, and bad arguments are clear errors.

use std::process::Command;

use qkindex_model::find_default_model;

#[path = "../../tests/support/skip.rs"]
mod skip;

fn qkindex(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_qkindex"))
        .args(args)
        .output()
        .expect("qkindex runs")
}

#[test]
fn tasks_on_smollm2_writes_the_report() {
    let Some(model) = find_default_model() else {
        skip::skip_unless_ci("no model in models/ (run scripts/get-model.sh)");
        return;
    };
    let out = std::env::temp_dir().join(format!("qkindex-tasks-test-{}", std::process::id()));
    let model = model.to_string_lossy().to_string();
    let o = qkindex(&[
        "tasks",
        "--model",
        &model,
        "--lengths",
        "1024",
        "--trials",
        "1",
        "--tasks",
        "niah-single,passkey",
        "--policy",
        "full,static,exact-topk",
        "--budgets",
        "32",
        "--sink",
        "16",
        "--window",
        "64",
        "--no-measure",
        "--out",
        out.to_str().expect("present"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "qkindex tasks failed: {stderr}");
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("| task | full | static | exact-topk@32 |"),
        "{md}"
    );
    for f in ["tasks.json", "tasks.md", "tasks.png", "tasks.svg"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tasks.json")).expect("present"))
            .expect("present");
    assert_eq!(json["schema"], "qkindex-tasks/1");
    assert_eq!(
        json["runs"],
        serde_json::json!(["full", "static", "exact-topk@32"])
    );
    let cells = json["cells"].as_array().expect("present");
    assert_eq!(cells.len(), 2 * 3);
    for c in cells {
        let trials = c["trials"].as_array().expect("present");
        assert_eq!(trials.len(), 1);
        let tokens = trials[0]["prompt_tokens"].as_u64().expect("present");
        assert!((980..=1024).contains(&tokens), "{tokens} prompt tokens");
        for key in ["keys_scored", "keys_attended", "ms_per_token", "build_s"] {
            assert!(c[key].as_f64().expect("present") >= 0.0, "{key}");
        }
        let s = &c["score"];
        assert!(s["lo"].as_f64().expect("present") <= s["mean"].as_f64().expect("present"));
        assert!(s["mean"].as_f64().expect("present") <= s["hi"].as_f64().expect("present"));
    }
    let cell = |task: &str, run: &str| {
        cells
            .iter()
            .find(|c| c["task"] == task && c["label"] == run)
            .unwrap_or_else(|| panic!("no cell {task} {run}"))
    };
    let full = cell("niah-single", "full");
    assert_eq!(full["score"]["mean"], 100.0, "{full}");
    let topk = cell("niah-single", "exact-topk@32");
    assert_eq!(topk["budget"], 32);
    let (scored, attended) = (
        topk["keys_scored"].as_f64().expect("present"),
        topk["keys_attended"].as_f64().expect("present"),
    );
    assert!(
        scored > 500.0 && (80.0..=120.0).contains(&attended),
        "{scored} {attended}"
    );
    assert!(
        cell("passkey", "static")["keys_attended"]
            .as_f64()
            .expect("present")
            <= 80.0
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn tasks_rejects_bad_arguments() {
    let o = qkindex(&["tasks", "--tasks", "niah-double"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("niah-double"));
    let o = qkindex(&["tasks", "--budgets", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--budgets"));
    // SmolLM2 (8,192 trained positions) at 100,000 would need a 16× RoPE stretch: asked for
    // by name, never applied by default (and refused before any prefill).
    let o = qkindex(&["tasks", "--lengths", "100000"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains("--rope-scaling"), "{err}");
}
