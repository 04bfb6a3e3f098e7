//! Decoding several sequences at once on the real model (`step_batch`): each sequence's logits
//! are the ones it gets decoded alone, under `full` and under retrieval attention, and a batch
//! whose parts do not match is an error. Fails in CI without the model, skips elsewhere.

use std::path::Path;

use qkindex::CpuKnn;
use qkindex_driver::decode::{prefill, step_batch, Decoder, Prefill};
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind};
use qkindex_model::{argmax, find_default_model, Model, ModelDevice, Timings};

#[path = "../../tests/support/skip.rs"]
mod skip;

fn model() -> Option<Model> {
    let Some(path) = find_default_model() else {
        skip::skip_unless_ci("no model in models/ (run scripts/get-model.sh)");
        return None;
    };
    // The quantized weights, as the CLI runs them: the batch's integer matvecs must give each
    // row what it gets alone.
    Some(Model::load(&path, None, ModelDevice::Cpu).expect("the default model loads"))
}

/// Three prompts of `n` tokens: consecutive stretches of the bundled text.
fn prefills(m: &Model, n: usize) -> Vec<Prefill> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/texts/licenses.txt"),
    )
    .expect("bundled text");
    let ids = m.tokenizer.encode(&text).expect("tokenizes");
    ids.chunks_exact(n)
        .take(3)
        .map(|p| prefill(&m.llama, p, n, true).expect("prefill"))
        .collect()
}

#[test]
fn a_batch_decodes_each_sequence_as_it_decodes_alone() {
    let Some(m) = model() else { return };
    let pre = prefills(&m, 300);
    let steps = 6;
    let index_topk = PolicyConfig {
        sink: 16,
        window: 64,
        k: 20,
        index: "attention".parse().expect("spec"),
        ..PolicyConfig::new(PolicyKind::IndexTopk)
    };
    for cfg in [PolicyConfig::new(PolicyKind::Full), index_topk] {
        let decoder = |p: &Prefill| {
            Decoder::new(&m.llama, p, &cfg, steps, &CpuKnn, |_, _| {}).expect("decoder")
        };
        // Alone: greedy steps of each sequence.
        let mut alone = Vec::new();
        for p in &pre {
            let mut d = decoder(p);
            let mut t = argmax(&p.last_logits, |_| false);
            let mut logits = Vec::new();
            for _ in 0..steps {
                let l = d.step(t).expect("step");
                t = argmax(&l, |_| false);
                logits.push(l);
            }
            alone.push(logits);
        }
        // Together.
        let mut decoders: Vec<Decoder<'_>> = pre.iter().map(decoder).collect();
        let mut tokens: Vec<u32> = pre
            .iter()
            .map(|p| argmax(&p.last_logits, |_| false))
            .collect();
        let mut tm = Timings::default();
        for s in 0..steps {
            let logits = step_batch(&mut decoders, &tokens, &mut tm).expect("batch step");
            let want_step = alone.iter().map(|seq| &seq[s]);
            assert_eq!(logits.len(), 3);
            for (i, (l, want)) in logits.iter().zip(want_step).enumerate() {
                // Bit for bit: each row of a batch's products is the one it gets alone.
                let differ = l.iter().zip(want).filter(|(a, b)| a != b).count();
                assert_eq!(
                    differ, 0,
                    "{:?}: sequence {i} step {s}: {differ} logits differ",
                    cfg.kind
                );
                tokens[i] = argmax(l, |_| false);
                assert_eq!(tokens[i], argmax(want, |_| false));
            }
        }
        for d in &decoders {
            assert_eq!(d.len(), 300 + steps);
        }
        assert!(tm.matmul.as_nanos() > 0);
    }
}

#[test]
fn a_batch_whose_parts_do_not_match_is_an_error() {
    let Some(m) = model() else { return };
    let pre = prefills(&m, 40);
    let full = PolicyConfig::new(PolicyKind::Full);
    let mut decoders: Vec<Decoder<'_>> = pre
        .iter()
        .map(|p| Decoder::new(&m.llama, p, &full, 2, &CpuKnn, |_, _| {}).expect("decoder"))
        .collect();
    let mut tm = Timings::default();
    // Two tokens for three sequences.
    let err = step_batch(&mut decoders, &[1, 2], &mut tm).expect_err("mismatch");
    assert!(err.to_string().contains("batch"), "{err}");
    // A token outside the vocabulary.
    let err = step_batch(&mut decoders, &[1, 2, u32::MAX], &mut tm).expect_err("bad id");
    assert!(err.to_string().contains("vocabulary"), "{err}");
    // Nothing was written: the caches still hold their prompts.
    assert!(decoders.iter().all(|d| d.len() == 40));
    assert!(step_batch(&mut [], &[], &mut tm).expect("empty").is_empty());
}
