//! The first tokens of chat answers on the quantized path (8-bit activations in the integer
//! matvecs, what the CLI runs) against the exact f32 path, on the real SmolLM2 model (issue 64,
//! item 0). The f32 path's greedy answer is teacher-forced through both; at every step the
//! quantized path must pick the f32 token wherever the f32 path's margin (its first logit less its
//! second) exceeds [`NEAR_TIE`], and its logit of the f32 token must stay within [`NEAR_TIE`] of
//! the f32 one everywhere. A defect of ours (a block's scale, the head's type) moves logits by
//! far more; the rounding of 8-bit activations moves them by up to 0.55 here, which is what
//! flips "What is the capital of France?" (f32 margin 0.08 between "The" and "L"; see
//! docs/MODELS.md, "Chat answers and 8-bit activations").
//!
//! Without the model the test prints `SKIP` and passes, except under CI, where it fails.

use qkindex_model::{argmax, chat_prompt, find_default_model, Model, ModelDevice, Timings};

#[path = "../../tests/support/skip.rs"]
mod skip;

/// Logit differences the 8-bit activations may cause (measured at most 0.55 on these prompts).
const NEAR_TIE: f32 = 0.75;
/// Answer tokens checked per prompt.
const STEPS: usize = 8;

fn top2(l: &[f32]) -> (usize, f32) {
    let best = argmax(l, |_| false) as usize;
    let second = l
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    (best, l[best] - second)
}

#[test]
fn chat_answers_start_as_on_the_exact_path() {
    let Some(path) = find_default_model() else {
        skip::skip_unless_ci("no model in models/ (run scripts/get-model.sh)");
        return;
    };
    let q = Model::load(&path, None, ModelDevice::Cpu).expect("quantized model");
    let f = Model::load_f32(&path, ModelDevice::Cpu).expect("f32 model");
    let system = f.tokenizer.system_or_default();
    let mut tm = Timings::default();
    let (mut checked, mut ties) = (0, 0);
    for prompt in [
        "What is the capital of France?",
        "What is 2+2?",
        "Name the three primary colors.",
        "Write a haiku about the sea.",
        "How many legs does a spider have?",
    ] {
        let ids = f
            .tokenizer
            .encode(&chat_prompt(prompt, Some(system)))
            .expect("encode");
        let mut fc = f.llama.new_cache(ids.len() + STEPS).expect("cache");
        let mut qc = q.llama.new_cache(ids.len() + STEPS).expect("cache");
        // The prompt but its last token in one prefill, then one token per decode step (as
        // `generate` runs them).
        let n = ids.len() - 1;
        f.llama
            .forward(&ids[..n], &mut fc, None, &mut tm)
            .expect("prefill");
        q.llama
            .forward(&ids[..n], &mut qc, None, &mut tm)
            .expect("prefill");
        let mut next = ids[n];
        let mut answer = Vec::new();
        for step in 0..STEPS {
            let hf = f
                .llama
                .forward(&[next], &mut fc, None, &mut tm)
                .expect("step");
            let hq = q
                .llama
                .forward(&[next], &mut qc, None, &mut tm)
                .expect("step");
            let lf = f.llama.last_logits(&hf, &mut tm).expect("logits");
            let lq = q.llama.last_logits(&hq, &mut tm).expect("logits");
            let (want, margin) = top2(&lf);
            let drift = (lq[want] - lf[want]).abs();
            let got = argmax(&lq, |_| false) as usize;
            println!(
                "{prompt:?} step {step}: f32 {:?} by {margin:.3}, quantized {:?}, drift {drift:.3}",
                f.tokenizer.decode(&[want as u32]).unwrap_or_default(),
                q.tokenizer.decode(&[got as u32]).unwrap_or_default()
            );
            assert!(
                drift < NEAR_TIE,
                "{prompt:?} step {step}: logit drift {drift}"
            );
            if margin > NEAR_TIE {
                assert_eq!(
                    got, want,
                    "{prompt:?} step {step}: the quantized path picks another token"
                );
                checked += 1;
            } else {
                ties += 1;
            }
            answer.push(want as u32);
            next = want as u32;
        }
        println!(
            "{prompt:?} -> {:?}",
            f.tokenizer.decode(&answer).unwrap_or_default()
        );
    }
    println!("{checked} steps checked, {ties} near-ties");
    // 27 of the 40 steps were decisive when measured.
    assert!(checked >= 20, "too few decisive steps: {checked}");
}
