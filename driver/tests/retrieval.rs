//! Retrieval attention on the real model (skipped when `models/` has no model): a selection that
//! covers every key equals full attention, keys leaving the window enter the index, and bad
//! sizes are errors.

use std::path::Path;

use qkindex::CpuKnn;
use qkindex::IndexSpec;
use qkindex_driver::decode::{prefill, Decoder};
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind};
use qkindex_model::{find_default_model, Model, ModelDevice};

#[path = "../../tests/support/skip.rs"]
mod skip;

fn model() -> Option<Model> {
    let Some(path) = find_default_model() else {
        skip::skip_unless_ci("no model in models/ (run scripts/get-model.sh)");
        return None;
    };
    // f32 weights: the 8-bit activations of the integer matvecs turn 1e-6 differences of
    // attention output into logit differences of ~0.5 (`Model::load_f32`), and these tests
    // check the policies' attention, not the matvecs' rounding.
    Some(Model::load_f32(&path, ModelDevice::Cpu).expect("the default model loads"))
}

fn tokens(m: &Model, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/texts/licenses.txt"),
    )
    .expect("bundled text");
    let mut ids = m.tokenizer.encode(&text).expect("tokenizes");
    ids.truncate(n);
    ids
}

fn spec(s: &str) -> IndexSpec {
    s.parse().expect("a valid index spec")
}

fn config(kind: PolicyKind, index: &IndexSpec, k: usize) -> PolicyConfig {
    PolicyConfig {
        sink: 16,
        window: 64,
        k,
        index: index.clone(),
        ..PolicyConfig::new(kind)
    }
}

/// Logits of `steps` teacher-forced decode steps after a prefill of `n0` tokens.
fn decode(m: &Model, ids: &[u32], n0: usize, cfg: &PolicyConfig) -> (Vec<Vec<f32>>, Vec<usize>) {
    let pre = prefill(&m.llama, &ids[..n0], n0, true).expect("prefill");
    let mut dec =
        Decoder::new(&m.llama, &pre, cfg, ids.len() - n0, &CpuKnn, |_, _| {}).expect("decoder");
    let mut out = Vec::new();
    let mut rest = Vec::new();
    for &t in &ids[n0..] {
        out.push(dec.step(t).expect("step"));
        rest.push(dec.retrieval().map_or(0, |r| r.rest_len(0, 0)));
    }
    (out, rest)
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

#[test]
fn covering_selections_equal_full_attention() {
    let Some(m) = model() else { return };
    let ids = tokens(&m, 260);
    let n0 = 240;
    let (full, _) = decode(&m, &ids, n0, &PolicyConfig::new(PolicyKind::Full));
    // k above the rest's size: every key outside the static set is retrieved.
    for (kind, index) in [
        (PolicyKind::ExactTopk, spec("flat")),
        (PolicyKind::IndexTopk, spec("attention")),
        (PolicyKind::IndexTopk, spec("hnsw")),
        // The page/block selectors cover the rest at this k too (25 pages, 3 blocks), and
        // SnapKV keeps every key of a rest under k.
        (PolicyKind::Quest, spec("flat")),
        (PolicyKind::Infllm, spec("flat")),
        (PolicyKind::Snapkv, spec("flat")),
    ] {
        let (got, rest) = decode(&m, &ids, n0, &config(kind, &index, 400));
        let d = max_diff(&full, &got);
        assert!(d < 2e-3, "{kind:?}/{index}: logits differ by {d}");
        // Keys that leave the window enter the index: rest = n − sink − window after each step.
        for (i, &r) in rest.iter().enumerate() {
            assert_eq!(r, n0 + i + 1 - 16 - 64, "{kind:?}/{index} step {i}");
        }
    }
    // Seeding each search with the previous step's keys keeps a covering selection exact.
    let seeded = PolicyConfig {
        step_seeds: 400,
        ..config(PolicyKind::IndexTopk, &spec("attention"), 400)
    };
    let (got, _) = decode(&m, &ids, n0, &seeded);
    let d = max_diff(&full, &got);
    assert!(d < 2e-3, "step seeds: logits differ by {d}");
    // A static set covering everything is full attention too.
    let cover = PolicyConfig {
        sink: 16,
        window: 1000,
        ..PolicyConfig::new(PolicyKind::Static)
    };
    let (got, _) = decode(&m, &ids, n0, &cover);
    assert!(max_diff(&full, &got) < 2e-3);
    // A small selection is not.
    let (got, _) = decode(&m, &ids, n0, &config(PolicyKind::Static, &spec("flat"), 1));
    let small = max_diff(&full, &got);
    assert!(
        small > 1e-2,
        "static with a small window changes the output"
    );
    // A tail estimate with as many samples as left-out keys takes each of them once, at weight
    // 1: full attention again, from a selection of 8.
    for (kind, index) in [
        (PolicyKind::ExactTopk, spec("flat")),
        (PolicyKind::IndexTopk, spec("attention")),
    ] {
        let cfg = PolicyConfig {
            tail_samples: 400,
            ..config(kind, &index, 8)
        };
        let (got, _) = decode(&m, &ids, n0, &cfg);
        let d = max_diff(&full, &got);
        assert!(d < 2e-3, "{kind:?} + covering tail: logits differ by {d}");
        // A sampled tail (1 in 4 of the left-out keys) moves the top-8 output towards full.
        let top8 = max_diff(&full, &decode(&m, &ids, n0, &config(kind, &index, 8)).0);
        let sampled = PolicyConfig {
            tail_samples: 40,
            ..config(kind, &index, 8)
        };
        let est = max_diff(&full, &decode(&m, &ids, n0, &sampled).0);
        assert!(
            est < top8,
            "{kind:?}: tail estimate {est} vs plain top-8 {top8}"
        );
    }
}

#[test]
fn retopk_selects_valid_keys_and_reuses() {
    let Some(m) = model() else { return };
    let ids = tokens(&m, 300);
    let mut cfg = config(PolicyKind::Retopk, &spec("flat"), 32);
    cfg.retopk.c = 8;
    cfg.retopk.r = 2;
    cfg.retopk.w = 8;
    cfg.retopk.tau = 0.5;
    let pre = prefill(&m.llama, &ids[..240], 240, true).expect("prefill");
    let mut dec = Decoder::new(&m.llama, &pre, &cfg, 60, &CpuKnn, |_, _| {}).expect("decoder");
    for &t in &ids[240..] {
        let logits = dec.step(t).expect("step");
        assert!(logits.iter().all(|x| x.is_finite()));
    }
    let s = dec.stats().expect("stats");
    let c = s.retopk.as_ref().expect("retopk counts");
    assert_eq!(
        c.selections(),
        60 * m.llama.cfg.n_layers as u64 * m.llama.cfg.n_heads as u64
    );
    assert!(c.reuse > 0, "some steps reuse cached sets: {c:?}");
    assert!(
        s.recall().is_some_and(|r| r > 0.3),
        "recall {:?}",
        s.recall()
    );
}

#[test]
fn contexts_too_short_for_an_index_are_errors() {
    let Some(m) = model() else { return };
    let ids = tokens(&m, 60);
    let pre = prefill(&m.llama, &ids, 60, true).expect("prefill");
    let err = Decoder::new(
        &m.llama,
        &pre,
        &config(PolicyKind::IndexTopk, &spec("attention"), 10),
        4,
        &CpuKnn,
        |_, _| {},
    )
    .expect_err("60 tokens do not exceed sink + window = 80");
    assert!(err.to_string().contains("sink + window"), "{err}");
    let mut cfg = config(PolicyKind::ExactTopk, &spec("flat"), 0);
    cfg.window = 8;
    assert!(
        Decoder::new(&m.llama, &pre, &cfg, 4, &CpuKnn, |_, _| {}).is_err(),
        "k = 0"
    );
    // Without captured queries an index cannot be built.
    let bare = prefill(&m.llama, &ids, 60, false).expect("prefill");
    let mut cfg = config(PolicyKind::IndexTopk, &spec("attention"), 10);
    cfg.window = 8;
    assert!(Decoder::new(&m.llama, &bare, &cfg, 4, &CpuKnn, |_, _| {}).is_err());
}
