//! Forward compatibility: every format version keeps a fixture under `tests/fixtures/v{N}/` (at
//! the repository root) with recorded search results; each must still open (mapped, verified)
//! and give those results.
//!
//! Fixtures of the current version are written once by
//! `QKINDEX_WRITE_FIXTURES=1 cargo test -p qkindex --test io_fixtures -- --ignored`
//! (it refuses to overwrite an existing version's directory).

use half::f16;
use qkindex::io::bundle::{Bundle, BundleWriter};
use qkindex::io::{self, LoadOptions, FORMAT_VERSION};
use qkindex::synth::ood;
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, KeyStore, SearchParams,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(serde::Serialize, serde::Deserialize)]
struct Recorded {
    /// File (or `bundle:LAYER:HEAD` for an index of the `bundle` directory).
    target: String,
    dim: usize,
    k: usize,
    ef: usize,
    /// Row-major queries.
    queries: Vec<f32>,
    ids: Vec<Vec<u32>>,
    scores: Vec<Vec<f32>>,
}

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn run(
    index: &dyn AnnIndex,
    queries: &[f32],
    dim: usize,
    k: usize,
    ef: usize,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let mut scratch = index.new_scratch();
    let (mut ids, mut scores) = (Vec::new(), Vec::new());
    for q in queries.chunks_exact(dim) {
        let out = index
            .search(q, k, &SearchParams::with_ef(ef), &mut scratch)
            .expect("search");
        ids.push(out.ids);
        scores.push(out.scores);
    }
    (ids, scores)
}

#[test]
fn every_fixture_version_opens_and_gives_recorded_results() {
    let root = fixtures_root();
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/fixtures exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    versions.sort();
    assert!(
        versions
            .iter()
            .any(|p| p.ends_with(format!("v{FORMAT_VERSION}"))),
        "no fixture for the current format version {FORMAT_VERSION}"
    );
    let mut checked = 0;
    for dir in versions {
        let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
        let recorded: Vec<Recorded> = serde_json::from_str(&text).expect("expected.json parses");
        let bundle = Bundle::open(dir.join("bundle"), &LoadOptions::default()).expect("bundle");
        for r in &recorded {
            let loaded;
            let index: &dyn AnnIndex = if let Some(rest) = r.target.strip_prefix("bundle:") {
                let (l, h) = rest.split_once(':').expect("bundle:L:H");
                bundle
                    .get(l.parse().expect("layer"), h.parse().expect("head"))
                    .expect("index in bundle")
            } else {
                let path = dir.join(&r.target);
                io::verify(&path).expect("verify");
                loaded = io::load(&path, &LoadOptions::default()).expect("load");
                assert!(loaded.key_store().is_mapped());
                &loaded
            };
            let (ids, scores) = run(index, &r.queries, r.dim, r.k, r.ef);
            assert_eq!(ids, r.ids, "{} {}", dir.display(), r.target);
            for (got, want) in scores.iter().flatten().zip(r.scores.iter().flatten()) {
                // Scores may differ in the last bits between SIMD kernels.
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{}: score {got} vs recorded {want}",
                    r.target
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "checked {checked} recorded targets");
}

#[test]
#[ignore = "writes the fixtures of the current format version (once)"]
fn write_current_version_fixtures() {
    if std::env::var_os("QKINDEX_WRITE_FIXTURES").is_none() {
        eprintln!("set QKINDEX_WRITE_FIXTURES=1 to write fixtures");
        return;
    }
    let dir = fixtures_root().join(format!("v{FORMAT_VERSION}"));
    assert!(
        !dir.exists(),
        "{} exists: fixtures are never rewritten",
        dir.display()
    );
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (n, m, dim, k, ef) = (300, 8, 16, 10, 32);
    let data = ood(n, m, dim, 11);
    let k16 = Arc::new(
        KeyStore::from_f16(data.keys.iter().map(|&x| f16::from_f32(x)).collect(), dim)
            .expect("keys"),
    );
    let k32 = Arc::new(KeyStore::from_f32(data.keys.clone(), dim).expect("keys"));
    // Int8 keys exist from version 2.
    let k8 = Arc::new(KeyStore::quantize_i8(&data.keys, dim).expect("keys"));
    // The v1 fixtures were written when top pruning was the default.
    let params = AttentionParams {
        prune: qkindex::attention::Prune::Top,
        ..AttentionParams::default()
    };
    let a16 =
        AttentionIndex::build(k16.clone(), &data.train_queries, &params, &CpuKnn).expect("build");
    let a32 = AttentionIndex::build(k32, &data.train_queries, &params, &CpuKnn).expect("build");
    let a8 = AttentionIndex::build(k8, &data.train_queries, &params, &CpuKnn).expect("build");
    let flat = FlatIndex::new(k16);
    a16.save(dir.join("attention-f16.qki")).expect("save");
    a32.save(dir.join("attention-f32.qki")).expect("save");
    a8.save(dir.join("attention-i8.qki")).expect("save");
    flat.save(dir.join("flat-f16.qki")).expect("save");
    let mut b = BundleWriter::new(dir.join("bundle")).expect("bundle");
    let r = b.write_keys(9, 0, a16.keys()).expect("keys");
    b.write_index(9, 0, 0, &a16, &r).expect("index");
    b.write_index(9, 1, 0, &flat, &r).expect("index");
    b.finish(serde_json::json!({"fixture": format!("v{FORMAT_VERSION}")}))
        .expect("finish");

    let q = data.test_queries;
    let mut recorded = Vec::new();
    let targets: [(&str, &dyn AnnIndex); 6] = [
        ("attention-f16.qki", &a16),
        ("attention-f32.qki", &a32),
        ("attention-i8.qki", &a8),
        ("flat-f16.qki", &flat),
        ("bundle:9:0", &a16),
        ("bundle:9:1", &flat),
    ];
    for (target, index) in targets {
        let (ids, scores) = run(index, &q, dim, k, ef);
        recorded.push(Recorded {
            target: target.into(),
            dim,
            k,
            ef,
            queries: q.clone(),
            ids,
            scores,
        });
    }
    std::fs::write(
        dir.join("expected.json"),
        serde_json::to_string(&recorded).expect("json"),
    )
    .expect("write");
}
