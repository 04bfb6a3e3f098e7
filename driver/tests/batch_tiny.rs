//! Decoding several sequences at once (`step_batch`) on tiny models with seeded random weights,
//! so it runs everywhere (no model file; `batch.rs` covers the real model): each sequence's
//! logits at every step are the ones it gets decoded alone, bit for bit.
//!
//! Unlike `batch.rs` (three prompts of one length), the six lanes here have prompts of
//! different lengths, so they sit at different positions, window starts and cache states:
//! - a Llama-shaped model (every layer global) and a Gemma-3-shaped one (five sliding-window
//!   layers of 32 keys, then a global one), where one lane's decode steps cross the window's
//!   start (position 32: attention stops reaching position 0) and another's cross the slide of
//!   the local layers' window-sized cache block (`KvCache::write_rows` at position 2,079);
//! - f32 weights (the f32 matvecs) and weights in Q8_0 and Q4_1 blocks (the integer matvecs of
//!   `qdot::matvec_many`, whose kernels take up to 4 activations a call: 6 lanes = 4 + 2, and
//!   the Llama-shaped model also 5 = 4 + 1);
//! - f32 and f16 KV caches (`Llama::set_kv_dtype`, the CLI's `--kv-cache f16`);
//! - the policies `full` and `index-topk`.

use half::f16;
use qkindex::CpuKnn;
use qkindex_driver::decode::{prefill, step_batch, Decoder, Prefill};
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind};
use qkindex_model::quant::GgmlType;
use qkindex_model::{argmax, Config, HostTensor, KvDtype, Llama, Timings, Weights};

/// Greedy steps per lane.
const STEPS: usize = 10;

/// Six lanes of different lengths (B = 6 > 4, the integer kernels' activations per call).
const LLAMA_LANES: [usize; 6] = [37, 64, 100, 129, 150, 171];

/// Window of the Gemma-shaped model's local layers.
const WINDOW: usize = 32;

/// The Gemma-shaped model's lanes: 27 crosses the window's start during its steps (27..37),
/// 2,074 the slide of the local layers' cache block (`WINDOW − 1 + PREFILL_CHUNK` = 2,079 rows,
/// full at position 2,079); the others sit past the window start at different offsets.
const GEMMA_LANES: [usize; 6] = [27, 37, 64, 129, 171, 2074];

/// Llama (SmolLM2) shape, small: two global layers, GQA 4 : 2.
fn tiny_llama() -> Config {
    Config {
        n_layers: 2,
        dim: 64,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        ffn_dim: 128,
        vocab_size: 97,
        context_length: 512,
        ..Config::smollm2_135m()
    }
}

/// Gemma 3 shape, small: layers 0–4 local (window 32), layer 5 global; head dim ≠ dim / heads.
fn tiny_gemma() -> Config {
    Config {
        n_layers: 6,
        dim: 64,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 48,
        ffn_dim: 128,
        vocab_size: 97,
        context_length: 4096,
        sliding_window: WINDOW,
        ..Config::gemma3_270m()
    }
}

/// A matrix of `rows` rows as ggml blocks of `ty` (Q8_0 or Q4_1), quantized like llama.cpp's
/// reference quantizers (`quantize_row_q8_0_ref`, `quantize_row_q4_1_ref`).
fn quantize(t: &HostTensor, rows: usize, ty: GgmlType) -> HostTensor {
    let v = t.to_f32();
    let mut bytes = Vec::new();
    for b in v.chunks_exact(32) {
        match ty {
            GgmlType::Q8_0 => {
                let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                let d = amax / 127.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                bytes.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                bytes.extend(b.iter().map(|x| (x * id).round() as i8 as u8));
            }
            GgmlType::Q4_1 => {
                let min = b.iter().copied().fold(f32::INFINITY, f32::min);
                let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                bytes.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                bytes.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |x: f32| ((x - min) * id).round().clamp(0.0, 15.0) as u8;
                bytes.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
            }
            _ => unreachable!("Q8_0 or Q4_1"),
        }
    }
    let cols = v.len() / rows;
    let q = HostTensor::from_ggml(ty, rows, cols, &bytes).expect("whole blocks");
    assert!(matches!(q, HostTensor::Blocks(_)), "{ty:?} stays in blocks");
    // The blocks hold the values (a wrong layout would be far off).
    let back = q.to_f32();
    let worst = v.iter().zip(back.iter()).map(|(a, b)| (a - b).abs());
    assert!(worst.fold(0f32, f32::max) < 0.02, "{ty:?} round trip");
    q
}

/// Seeded random weights of `cfg`'s shape; with `ty`, every matrix (the projections, the MLP
/// and the tied embedding / LM head) in blocks of that type.
fn model(cfg: &Config, ty: Option<GgmlType>, kv: KvDtype) -> Llama {
    let mut w = Weights::random(cfg, 5);
    if let Some(ty) = ty {
        let (q, kv_dim, d, f) = (cfg.q_dim(), cfg.kv_dim(), cfg.dim, cfg.ffn_dim);
        w.embed = quantize(&w.embed, cfg.vocab_size, ty);
        for b in &mut w.blocks {
            b.attn.wq = quantize(&b.attn.wq, q, ty);
            b.attn.wk = quantize(&b.attn.wk, kv_dim, ty);
            b.attn.wv = quantize(&b.attn.wv, kv_dim, ty);
            b.attn.wo = quantize(&b.attn.wo, d, ty);
            b.mlp.gate = quantize(&b.mlp.gate, f, ty);
            b.mlp.up = quantize(&b.mlp.up, f, ty);
            b.mlp.down = quantize(&b.mlp.down, d, ty);
        }
    }
    let mut llama = Llama::new(cfg.clone(), w);
    llama.set_kv_dtype(kv);
    llama
}

/// A prompt of `n` token ids (seeded by its length, so lanes differ).
fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = qkindex::synth::Rng::new(1000 + n as u64);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

fn policies() -> [PolicyConfig; 2] {
    let index_topk = PolicyConfig {
        sink: 4,
        window: 16,
        k: 8,
        index: "attention".parse().expect("spec"),
        ..PolicyConfig::new(PolicyKind::IndexTopk)
    };
    [PolicyConfig::new(PolicyKind::Full), index_topk]
}

/// Decodes every lane `STEPS` greedy steps alone, then all together with `step_batch`, and
/// checks that each lane's logits at each step are the same bits. Returns the decoders of the
/// batch (for the caller's checks of where the lanes went).
fn alone_and_together<'m>(
    llama: &'m Llama,
    pre: &[Prefill],
    cfg: &PolicyConfig,
    label: &str,
) -> Vec<Decoder<'m>> {
    let decoder =
        |p: &Prefill| Decoder::new(llama, p, cfg, STEPS, &CpuKnn, |_, _| {}).expect("decoder");
    let first = |p: &Prefill| argmax(&p.last_logits, |_| false);
    let mut alone = Vec::new();
    for p in pre {
        let mut d = decoder(p);
        let mut t = first(p);
        let mut logits = Vec::new();
        for _ in 0..STEPS {
            let l = d.step(t).expect("step");
            t = argmax(&l, |_| false);
            logits.push(l);
        }
        alone.push(logits);
    }
    // The lanes differ (a batch that gave one lane another's row would be seen).
    for w in alone.windows(2) {
        assert_ne!(w[0][0], w[1][0], "{label}: two lanes with the same logits");
    }
    let mut decoders: Vec<Decoder<'_>> = pre.iter().map(decoder).collect();
    let mut tokens: Vec<u32> = pre.iter().map(first).collect();
    let mut tm = Timings::default();
    for s in 0..STEPS {
        let logits = step_batch(&mut decoders, &tokens, &mut tm).expect("batch step");
        assert_eq!(logits.len(), pre.len());
        for (i, (got, want)) in logits.iter().zip(alone.iter().map(|a| &a[s])).enumerate() {
            let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
            let worst = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Every logit the same bits: the batch's products compute each row as the
            // single-row ones do (same dot products in the same order), and everything else
            // runs per lane on the code of a lone step.
            assert!(
                differ == 0 && got.len() == want.len(),
                "{label}: lane {i} (prompt {}) step {s}: {differ} of {} logits differ, by up \
                 to {worst}",
                pre[i].cache.len(),
                want.len()
            );
            tokens[i] = argmax(got, |_| false);
        }
    }
    let heads = llama.cfg.global_layers().len() * llama.cfg.n_heads;
    for (d, p) in decoders.iter().zip(pre) {
        assert_eq!(d.len(), p.cache.len() + STEPS, "{label}");
        // index-topk selected at every step of every global layer and query head, and where
        // the prompt is longer than sink + window + k, fewer keys than all.
        if let Some(st) = d.stats() {
            assert_eq!(st.selections, (STEPS * heads) as u64, "{label}");
            if p.cache.len() > cfg.sink + cfg.window + cfg.k {
                assert!(
                    st.keys_attended < st.selections * p.cache.len() as u64,
                    "{label}"
                );
            }
        }
    }
    decoders
}

/// Weights (f32, or matrices in blocks of a type) and KV cache type of one model.
type Variant = (Option<GgmlType>, KvDtype);

/// Every weight type with every cache type.
const ALL: [Variant; 6] = [
    (None, KvDtype::F32),
    (None, KvDtype::F16),
    (Some(GgmlType::Q8_0), KvDtype::F32),
    (Some(GgmlType::Q8_0), KvDtype::F16),
    (Some(GgmlType::Q4_1), KvDtype::F32),
    (Some(GgmlType::Q4_1), KvDtype::F16),
];

/// Each weight type once, each cache type at least once (the cache type changes attention, the
/// weights the products; the Gemma-shaped runs' index builds over the long lane cost about 1 s
/// a variant).
const EACH: [Variant; 3] = [
    (None, KvDtype::F32),
    (Some(GgmlType::Q8_0), KvDtype::F16),
    (Some(GgmlType::Q4_1), KvDtype::F32),
];

/// Every lane, every policy, on `cfg` with each of `variants`; `check` sees the prefills and
/// the batch's decoders after each run.
fn run(
    cfg: &Config,
    lanes: &[usize],
    variants: &[Variant],
    check: impl Fn(&str, &[Prefill], &[Decoder<'_>]),
) {
    for &(ty, kv) in variants {
        let llama = model(cfg, ty, kv);
        let pre: Vec<Prefill> = lanes
            .iter()
            .map(|&n| {
                let ids = prompt(n, cfg.vocab_size);
                prefill(&llama, &ids, n + STEPS, true).expect("prefill")
            })
            .collect();
        assert!(pre.iter().all(|p| p.cache.dtype() == kv));
        for policy in policies() {
            let label = format!("{:?} weights {ty:?}, kv {kv}, {:?}", cfg.arch, policy.kind);
            let decoders = alone_and_together(&llama, &pre, &policy, &label);
            check(&label, &pre, &decoders);
        }
    }
}

#[test]
fn a_batch_of_lanes_at_different_positions_decodes_each_as_alone() {
    // 6 lanes: kernel calls of 4 + 2 activations; 5: of 4 + 1.
    for b in [6, 5] {
        run(&tiny_llama(), &LLAMA_LANES[..b], &ALL, |_, _, _| {});
    }
}

#[test]
fn a_batch_across_sliding_window_seams_decodes_each_as_alone() {
    let cfg = tiny_gemma();
    assert_eq!(cfg.global_layers(), [5]);
    // Lane 0's steps cross the window's start, lane 5's the slide of the local layers' block.
    assert!(GEMMA_LANES[0] < WINDOW && WINDOW < GEMMA_LANES[0] + STEPS);
    run(&cfg, &GEMMA_LANES, &EACH, |label, pre, decoders| {
        let slid = |c: &qkindex_model::KvCache| c.first_position(0);
        assert_eq!(
            slid(&pre[5].cache),
            0,
            "{label}: the prefill fits the block"
        );
        assert!(
            slid(decoders[5].cache()) > 0,
            "{label}: the decode steps slid the local layers' block"
        );
        assert!(
            decoders[..5].iter().all(|d| slid(d.cache()) == 0),
            "{label}"
        );
        assert_eq!(
            decoders[5].cache().first_position(5),
            0,
            "{label}: global layer"
        );
    });
}
