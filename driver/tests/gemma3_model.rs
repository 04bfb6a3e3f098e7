//! Gemma 3 270M end to end on the CPU backend: the greedy continuation of a prompt, the next-token
//! distribution an independent numpy forward pass of the same GGUF file measured (issue 21:
//! "The capital of France is" → " the" first, " Paris" third at p ≈ 0.08), the perplexity of the
//! first 512 tokens of `tests/fixtures/spm/licenses-head.txt`, and a decode step equal to the
//! prefill. The whole of GPL-3 (12.41 in the reference) is in `docs/bench/gemma3/` (too slow for
//! a debug test).
//!
//! Without the model (`bash scripts/get-model.sh --model gemma3-270m`) the test prints `SKIP`
//! and passes, except under CI (`CI` set), where its absence fails.

mod common;

use qkindex_driver::decode::log_softmax;
use qkindex_model::{argmax, Model, ModelDevice, Timings};

/// Perplexity of the first 512 tokens (BOS included) of licenses-head.txt, measured by this
/// forward pass after it reproduced the reference's GPL-3 perplexity (see the module doc).
const PPL_512: f64 = 9.1491;

#[test]
fn gemma3_continues_scores_and_decodes_like_the_reference() {
    let root = common::root();
    let Some(path) = common::gemma3_model() else {
        return;
    };
    let m = Model::load(&path, None, ModelDevice::Cpu).expect("model");
    let (l, tok) = (&m.llama, &m.tokenizer);
    assert_eq!(l.cfg.global_layers(), [5, 11, 17]);
    let mut tm = Timings::default();
    let last = |text: &str, tm: &mut Timings| {
        let ids = tok.encode(text).expect("encode");
        let mut cache = l.new_cache(ids.len()).expect("cache");
        let h = l.forward(&ids, &mut cache, None, tm).expect("forward");
        l.last_logits(&h, tm).expect("logits")
    };

    let paris = last("The capital of France is the city of", &mut tm);
    let next = argmax(&paris, |_| false);
    assert_eq!(tok.decode(&[next]).expect("decode"), " Paris");

    let lp = log_softmax(&last("The capital of France is", &mut tm));
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    let word = |i: usize| tok.decode(&[i as u32]).expect("decode");
    assert_eq!(word(order[0]), " the");
    let rank = order
        .iter()
        .position(|&i| word(i) == " Paris")
        .expect("Paris");
    let p_paris = lp[order[rank]].exp();
    assert!(rank < 3, "\" Paris\" ranks {rank}");
    assert!((0.05..0.11).contains(&p_paris), "p(\" Paris\") = {p_paris}");

    let text = std::fs::read_to_string(root.join("driver/tests/fixtures/spm/licenses-head.txt"))
        .expect("text");
    let ids = &tok.encode(&text).expect("encode")[..512];
    let vocab = l.cfg.vocab_size;
    let dim = l.cfg.dim;
    // Negative log-likelihood of the next token after each row of `hidden` (rows from `r0`).
    let nll_of = |hidden: &[f32], r0: usize, tm: &mut Timings| -> (f64, Vec<f32>) {
        let mut nll = 0f64;
        let mut last = Vec::new();
        for (c, h) in hidden.chunks(64 * dim).enumerate() {
            let rows = l.logits(h, tm).expect("logits");
            for (i, row) in rows.chunks_exact(vocab).enumerate() {
                let r = r0 + c * 64 + i;
                if r + 1 < ids.len() {
                    nll -= log_softmax(row)[ids[r + 1] as usize];
                }
            }
            last = rows[rows.len() - vocab..].to_vec();
        }
        (nll, last)
    };
    // All 512 in one prefill, and 504 then 8 decode steps.
    let mut full = l.new_cache(512).expect("cache");
    let h = l
        .forward(ids, &mut full, None, &mut tm)
        .expect("prefill 512");
    let (nll, want) = nll_of(&h, 0, &mut tm);
    let ppl = (nll / 511.0).exp();
    println!("ppl of the first 512 tokens: {ppl:.4}");
    assert!(
        (ppl / PPL_512 - 1.0).abs() < 0.01,
        "ppl {ppl:.4}, expected {PPL_512:.4}"
    );
    let mut cache = l.new_cache(512).expect("cache");
    l.forward(&ids[..504], &mut cache, None, &mut tm)
        .expect("prefill 504");
    let mut got = Vec::new();
    for &t in &ids[504..] {
        got = l.forward(&[t], &mut cache, None, &mut tm).expect("step");
    }
    let got = l.logits(&got, &mut tm).expect("logits");
    let worst = want
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // A decode step's matvecs quantize their input to 8 bits per block of 32 (`qdot.rs`, as
    // llama.cpp does), the prefill's GEMMs do not: the logits differ by that rounding (0.48 at
    // most when measured for issue 51; the f32 path was held to 1e-2), and the
    // next token must not.
    assert!(worst < 1.0, "decode vs prefill logits differ by {worst}");
    assert_eq!(
        argmax(&got, |_| false),
        argmax(&want, |_| false),
        "decode and prefill pick the same next token"
    );
}

/// Issue 64, item 3: on the exact f32 path ([`Model::load_f32`]: no 8-bit activations) a decode
/// step's logits equal the prefill's to 1e-2, and the steps cross the sliding window's seam:
/// Gemma 3's local layers attend the last `sliding_window` (512) keys, so from position 512 on a
/// step drops keys that the steps before it kept. An off-by-one in the window of either path
/// shows here (the quantized test above allows 1.0, the activations' rounding, which would
/// hide it).
#[test]
fn gemma3_f32_decode_steps_equal_the_prefill_across_the_window_seam() {
    let root = common::root();
    let Some(path) = common::gemma3_model() else {
        return;
    };
    let m = Model::load_f32(&path, ModelDevice::Cpu).expect("model");
    let (l, tok) = (&m.llama, &m.tokenizer);
    let window = l.cfg.sliding_window;
    assert_eq!(window, 512);
    let text =
        std::fs::read_to_string(root.join("driver/assets/texts/licenses.txt")).expect("text");
    // Steps at positions window - 6 .. window + 6.
    let (n, steps) = (window + 6, 12);
    let ids = &tok.encode(&text).expect("encode")[..n];
    let mut tm = Timings::default();
    let mut full = l.new_cache(n).expect("cache");
    let h = l.forward(ids, &mut full, None, &mut tm).expect("prefill");
    let dim = l.cfg.dim;
    let want = l
        .logits(&h[(n - steps) * dim..], &mut tm)
        .expect("prefill logits");
    let mut cache = l.new_cache(n).expect("cache");
    l.forward(&ids[..n - steps], &mut cache, None, &mut tm)
        .expect("prefix");
    let vocab = l.cfg.vocab_size;
    for (s, &t) in ids[n - steps..].iter().enumerate() {
        let h = l.forward(&[t], &mut cache, None, &mut tm).expect("step");
        let got = l.logits(&h, &mut tm).expect("logits");
        let row = &want[s * vocab..(s + 1) * vocab];
        let worst = row
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let pos = n - steps + s;
        println!("position {pos}: decode vs prefill logits differ by {worst:.2e}");
        assert!(worst < 1e-2, "position {pos}: logits differ by {worst}");
    }
}
