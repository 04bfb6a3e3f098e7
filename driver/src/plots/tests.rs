//! Unit tests of the plots: aggregation of bench rows and the files written.

use super::aggregate::{curves, per_layer, recall_at_budget, Axis};
use super::write_all;
use crate::report::{BenchReport, Latency, Row};
use std::path::Path;

fn row(index: &str, queries: &str, layer: usize, ef: usize, recall: f64, scanned: f64) -> Row {
    Row {
        index: index.into(),
        variant: String::new(),
        implementation: "qkindex".into(),
        k: 100,
        layer,
        head: 0,
        queries: queries.into(),
        params: serde_json::json!({ "ef": ef }),
        recall,
        scanned: Some(scanned),
        distance_computations: Some(scanned * 1000.0),
        code_estimates: None,
        qps: 1000.0 / scanned,
        latency_us: Latency::default(),
        build_s: serde_json::Value::Null,
        bytes_per_key: None,
        mass_ratio: None,
        output_cosine: None,
    }
}

#[test]
fn curves_average_heads_per_setting_and_budget_picks_the_best_recall() {
    let a = row("attention", "q2k", 2, 100, 0.9, 0.05);
    let mut b = row("attention", "q2k", 2, 100, 0.8, 0.07);
    b.head = 1;
    let c = row("attention", "q2k", 9, 200, 0.99, 0.2);
    let rows = vec![&a, &b, &c];
    let s = curves(&rows, "q2k", Axis::Scanned);
    assert_eq!(s.len(), 1);
    let p = s[0].points[0];
    assert!((p.0 - 0.06).abs() < 1e-12 && (p.1 - 0.85).abs() < 1e-12);
    let (layers, series) = per_layer(&rows, 0.1);
    assert_eq!(layers, vec![2, 9]);
    // Layer 9's only head cannot stay within 10 %: no point.
    let want = [(0.0, 0.85)];
    assert_eq!(series[0].points.len(), 1);
    for (got, want) in series[0].points.iter().zip(want) {
        assert!((got.0 - want.0).abs() < 1e-12 && (got.1 - want.1).abs() < 1e-12);
    }
}

#[test]
fn recall_at_budget_interpolates_in_log_scanned() {
    let a = row("hnsw", "q2k", 2, 100, 0.8, 0.05);
    let b = row("hnsw", "q2k", 2, 200, 0.9, 0.2);
    let rows = [&a, &b];
    assert_eq!(recall_at_budget(rows.iter(), 0.01), None);
    let mid = recall_at_budget(rows.iter(), 0.1).expect("within");
    assert!((mid - 0.85).abs() < 1e-12, "{mid}");
    assert_eq!(recall_at_budget(rows.iter(), 0.5), Some(0.9));
}

#[test]
fn plots_are_written_as_png_and_svg() {
    let rows: Vec<Row> = [("q2k", 0.8), ("k2k", 0.95)]
        .iter()
        .flat_map(|&(q, r)| {
            [100, 200].map(|ef| {
                row(
                    "attention",
                    q,
                    9,
                    ef,
                    r * ef as f64 / 200.0,
                    ef as f64 / 2000.0,
                )
            })
        })
        .collect();
    let report = BenchReport::new(Path::new("dump"), 100, "wall", rows, 1.0);
    let dir = std::env::temp_dir().join(format!("qkindex-plots-{}", std::process::id()));
    let files = write_all(&report, &dir, 0.1).expect("plots");
    assert_eq!(files.len(), 8);
    for f in &files {
        let len = std::fs::metadata(f).expect("plot file").len();
        assert!(len > 1000, "{} is {len} bytes", f.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
