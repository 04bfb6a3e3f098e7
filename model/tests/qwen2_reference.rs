//! Qwen2.5-Coder-1.5B-Instruct (`qwen2`: q/k/v biases, an untied head, Qwen2's pre-tokenizer)
//! against an independent forward pass of the same GGUF file: `transformers` on the CPU in
//! float32 (`scripts/qwen-reference.py`, which wrote `tests/fixtures/qwen2/`). Token ids of texts
//! with code, digits, CJK and whitespace runs must be equal; the post-RoPE q/k of a prompt within
//! 1e-2 relative; the perplexity of 512 tokens within 1 %; the same top logits and greedy
//! continuation.
//!
//! Without the model (`bash scripts/get-model.sh --model qwen2.5-1.5b`) the test prints `SKIP`
//! and passes, except under CI (`CI` set), where its absence fails.

use std::path::{Path, PathBuf};

use qkindex_model::{argmax, KnownModel, LayerCapture, Model, ModelDevice, Timings};

#[path = "../../tests/support/skip.rs"]
mod skip;

fn fixture(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen2")
        .join(name);
    let text = std::fs::read_to_string(&p).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

fn model_path() -> Option<PathBuf> {
    let known = KnownModel::by_name("qwen2.5-1.5b").expect("known");
    match known.find() {
        Some(p) => Some(p),
        None => {
            skip::skip_unless_ci(
                "no Qwen2.5 model (run scripts/get-model.sh --model qwen2.5-1.5b)",
            );
            None
        }
    }
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn qwen2_matches_transformers() {
    let Some(path) = model_path() else { return };
    let m = Model::load(&path, None, ModelDevice::Cpu).expect("model loads");
    let (l, tok) = (&m.llama, &m.tokenizer);
    let cfg = &l.cfg;
    assert_eq!(
        (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim),
        (28, 12, 2, 128)
    );

    // Token ids.
    let t = fixture("tokenizer.json");
    for case in t["texts"].as_array().expect("texts") {
        let text = case["text"].as_str().expect("text");
        assert_eq!(
            tok.encode(text).expect("encode"),
            ids_of(&case["ids"]),
            "{text:?}"
        );
    }
    assert_eq!(
        tok.encode(t["chat"]["rendered"].as_str().expect("chat"))
            .expect("encode"),
        ids_of(&t["chat"]["ids"])
    );
    assert_eq!(
        tok.default_system.as_deref(),
        Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
    );

    // q/k after RoPE of layers 0, 14, 27 at the prompt's last 4 positions ([head][pos][dim]).
    let f = fixture("qk.json");
    let ids = ids_of(&f["ids"]);
    let positions: Vec<usize> = f["positions"]
        .as_array()
        .expect("positions")
        .iter()
        .map(|p| p.as_u64().expect("p") as usize)
        .collect();
    let want: Vec<(usize, Vec<f32>, Vec<f32>)> = f["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|e| {
            // [head][pos][dim] flattened in that order.
            let flat = |v: &serde_json::Value| -> Vec<f32> {
                let mut out = Vec::new();
                for head in v.as_array().expect("heads") {
                    for pos in head.as_array().expect("pos") {
                        out.extend(
                            pos.as_array()
                                .expect("dim")
                                .iter()
                                .map(|x| x.as_f64().expect("f") as f32),
                        );
                    }
                }
                out
            };
            (
                e["layer"].as_u64().expect("layer") as usize,
                flat(&e["q"]),
                flat(&e["k"]),
            )
        })
        .collect();
    let hd = cfg.head_dim;
    let mut got: Vec<(usize, Vec<f32>, Vec<f32>)> = Vec::new();
    let mut capture = |c: LayerCapture<'_>| {
        if !want.iter().any(|w| w.0 == c.layer) {
            return;
        }
        // Rows are positions (pos0..pos0 + n), each `heads · hd`; reorder to [head][pos][dim].
        let pick = |x: &[f32], heads: usize| -> Vec<f32> {
            let mut out = Vec::new();
            for h in 0..heads {
                for &p in &positions {
                    let r = p - c.pos0;
                    out.extend_from_slice(
                        &x[r * heads * hd + h * hd..r * heads * hd + (h + 1) * hd],
                    );
                }
            }
            out
        };
        got.push((c.layer, pick(c.q, cfg.n_heads), pick(c.k, cfg.n_kv_heads)));
    };
    let mut tm = Timings::default();
    let mut cache = l.new_cache(ids.len() + 16).expect("cache");
    let hidden = l
        .forward(&ids, &mut cache, Some(&mut capture), &mut tm)
        .expect("prefill");
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (num / den).sqrt()
    };
    for (layer, q, k) in &want {
        let (_, gq, gk) = got.iter().find(|g| g.0 == *layer).expect("captured");
        let (rq, rk) = (rel(gq, q), rel(gk, k));
        println!("layer {layer}: q relative error {rq:.2e}, k {rk:.2e}");
        assert!(rq < 1e-2 && rk < 1e-2, "layer {layer}: q {rq}, k {rk}");
    }

    // The next token's top logits, and the greedy continuation.
    let g = fixture("logits.json");
    let logits = l.last_logits(&hidden, &mut tm).expect("logits");
    let top: Vec<u32> = ids_of(&g["top5"]["ids"]);
    let want_logits: Vec<f32> = g["top5"]["logits"]
        .as_array()
        .expect("logits")
        .iter()
        .map(|x| x.as_f64().expect("f") as f32)
        .collect();
    for (&id, &w) in top.iter().zip(&want_logits) {
        let v = logits[id as usize];
        println!("token {id}: logit {v:.4} (reference {w:.4})");
        assert!(
            (v - w).abs() < 0.05 * w.abs().max(1.0),
            "token {id}: {v} vs {w}"
        );
    }
    let mut next = argmax(&logits, |_| false);
    let mut greedy = Vec::new();
    for _ in 0..16 {
        greedy.push(next);
        let h = l.forward(&[next], &mut cache, None, &mut tm).expect("step");
        next = argmax(&l.last_logits(&h, &mut tm).expect("logits"), |_| false);
    }
    println!("greedy: {:?}", tok.decode(&greedy).expect("decode"));
    assert_eq!(greedy, ids_of(&g["greedy"]["ids"]));

    // Perplexity of 512 tokens of the essays, in one prefill (as the reference: no BOS).
    let p = fixture("ppl.json");
    let ids = ids_of(&p["ids"]);
    let mut cache = l.new_cache(ids.len()).expect("cache");
    let hidden = l
        .forward(&ids, &mut cache, None, &mut tm)
        .expect("prefill 512");
    let (dim, vocab) = (cfg.dim, cfg.vocab_size);
    let mut nll = 0f64;
    for (c, h) in hidden.chunks(64 * dim).enumerate() {
        let rows = l.logits(h, &mut tm).expect("logits");
        for (i, row) in rows.chunks_exact(vocab).enumerate() {
            let r = c * 64 + i;
            if r + 1 < ids.len() {
                let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let lse = f64::from(max)
                    + row
                        .iter()
                        .map(|&x| f64::from(x - max).exp())
                        .sum::<f64>()
                        .ln();
                nll += lse - f64::from(row[ids[r + 1] as usize]);
            }
        }
    }
    let ppl = (nll / (ids.len() - 1) as f64).exp();
    let want_ppl = p["ppl"].as_f64().expect("ppl");
    println!("perplexity of 512 tokens: {ppl:.4} (reference {want_ppl:.4})");
    assert!(
        (ppl / want_ppl - 1.0).abs() < 0.01,
        "ppl {ppl} vs {want_ppl}"
    );
}
