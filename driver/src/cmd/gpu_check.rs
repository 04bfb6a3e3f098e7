//! `qkindex gpu-check`: the CUDA backend of the model against the CPU backend, and its speed, on a
//! GPU machine (run by `scripts/gpu-driver-check.sh` from a prebuilt binary).
//!
//! - Parity: the last-position logits of a 64-token prefill (relative error = max |Δ| / max |x|)
//!   and 64 greedy decode steps on each backend (tokens identical?).
//! - Speed: prefill tokens/s at the context length, decode ms/token with `full` attention and
//!   with `index-topk` (indexes built from the prefill's queries with the GPU kNN), and the
//!   overlap of the GPU's static-window attention with the CPU's index search.
//! - The attention kernels alone at the same shapes (CUDA events), for comparison with PyTorch's
//!   scaled-dot-product attention (`scripts/gpu_torch_sdpa.py`, same run).
//!
//! The model is the real SmolLM2 file where it exists, else a seeded random-weight model of its
//! shape (the same code paths).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use qkindex_driver::decode::{prefill, Decoder};
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind};
use qkindex_model::{
    argmax, find_default_model, Config, CudaBackend, Heads, Llama, Model, ModelDevice, Timings,
    Weights,
};
use serde_json::json;

#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// Output directory (gpu-driver.json).
    #[arg(long)]
    pub out: PathBuf,
    /// Context of the speed runs [default: 8192 − 64, or 2048 with --quick].
    #[arg(long)]
    pub context: Option<usize>,
    /// Decode steps timed per policy.
    #[arg(long, default_value_t = 32)]
    pub steps: usize,
    /// Shorter runs (2K context, 16 steps): about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the random-weight model (used when the model file is absent).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The same model twice: one on the CPU, one on the GPU.
fn models(seed: u64) -> anyhow::Result<(Llama, Llama, String)> {
    if let Some(path) = find_default_model() {
        let cpu = Model::load(&path, None, ModelDevice::Cpu)?.llama;
        let cuda = ModelDevice::Cuda(Box::new(CudaBackend::new(0)?));
        let gpu = Model::load(&path, None, cuda)?.llama;
        return Ok((cpu, gpu, format!("real model {}", path.display())));
    }
    let cfg = Config::smollm2_135m();
    let cpu = Llama::new(cfg.clone(), Weights::random(&cfg, seed));
    let mut gpu = Llama::new(cfg.clone(), Weights::random(&cfg, seed));
    gpu.set_device(ModelDevice::Cuda(Box::new(CudaBackend::new(0)?)));
    Ok((
        cpu,
        gpu,
        format!("seeded random weights of SmolLM2-135M's shape (seed {seed}; model file absent)"),
    ))
}

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = qkindex::synth::Rng::new(seed);
    (0..n)
        .map(|_| ((rng.normal().abs() * 1e6) as usize % vocab) as u32)
        .collect()
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let scale = a
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (diff / scale) as f64
}

/// Greedy continuation of `prompt` for `steps` tokens.
fn greedy(m: &Llama, prompt: &[u32], steps: usize) -> anyhow::Result<Vec<u32>> {
    let mut cache = m.new_cache(prompt.len() + steps)?;
    let mut tm = Timings::default();
    let h = m.forward(prompt, &mut cache, None, &mut tm)?;
    let mut next = argmax(&m.last_logits(&h, &mut tm)?, |_| false);
    let mut out = vec![next];
    for _ in 1..steps {
        let h = m.forward(&[next], &mut cache, None, &mut tm)?;
        next = argmax(&m.last_logits(&h, &mut tm)?, |_| false);
        out.push(next);
    }
    Ok(out)
}

pub fn run(args: GpuCheckArgs, devices: &Devices) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let (cpu, gpu, source) = models(args.seed).context("opening the GPU backend")?;
    let backend = gpu.device_name();
    println!("{backend}; {source}");
    let c = cpu.cfg.clone();

    // Parity.
    let prompt = tokens(64, c.vocab_size, 11);
    let mut tm = Timings::default();
    let mut cc = cpu.new_cache(64)?;
    let hc = cpu.forward(&prompt, &mut cc, None, &mut tm)?;
    let lc = cpu.last_logits(&hc, &mut tm)?;
    let mut gc = gpu.new_cache(64)?;
    let hg = gpu.forward(&prompt, &mut gc, None, &mut tm)?;
    let lg = gpu.last_logits(&hg, &mut tm)?;
    let logits_rel_err = rel_err(&lc, &lg);
    let hidden_rel_err = rel_err(&hc, &hg);
    let (tc, tg) = (greedy(&cpu, &prompt, 64)?, greedy(&gpu, &prompt, 64)?);
    let same = tc.iter().zip(&tg).take_while(|(a, b)| a == b).count();
    println!("parity: logits rel err {logits_rel_err:.2e}, hidden {hidden_rel_err:.2e}; greedy tokens identical for {same}/64 steps");

    // Speed.
    let context = args.context.unwrap_or(if args.quick {
        2048
    } else {
        c.context_length - 64
    });
    let steps = if args.quick {
        args.steps.min(16)
    } else {
        args.steps
    };
    if context + steps > c.context_length {
        bail!("--context + steps exceeds the model's {}", c.context_length);
    }
    let ids = tokens(context + steps, c.vocab_size, 12);
    let _ = prefill(&gpu, &ids[..256], 256 + 1, false)?; // warm-up (module, allocator, weights)
    let t = Instant::now();
    let pre = prefill(&gpu, &ids[..context], context + steps, true)?;
    let prefill_s = t.elapsed().as_secs_f64();
    println!(
        "prefill {context} tokens: {prefill_s:.3} s ({:.0} tok/s)",
        context as f64 / prefill_s
    );
    let mut decode = Vec::new();
    for kind in [PolicyKind::Full, PolicyKind::IndexTopk] {
        let cfg = PolicyConfig {
            measure: false,
            ..PolicyConfig::new(kind)
        };
        let t_build = Instant::now();
        let mut dec = Decoder::new(&gpu, &pre, &cfg, steps, devices.knn(), |_, _| {})?;
        let build_s = t_build.elapsed().as_secs_f64();
        let before = gpu_stats(&gpu);
        let t = Instant::now();
        for &tok in &ids[context..context + steps] {
            dec.step(tok)?;
        }
        let ms = 1e3 * t.elapsed().as_secs_f64() / steps as f64;
        let after = gpu_stats(&gpu);
        let lat = dec.latency();
        println!(
            "decode {}: {ms:.2} ms/token (index builds {build_s:.1} s)",
            kind.name()
        );
        decode.push(json!({
            "policy": kind.name(), "ms_per_token": ms, "latency_ms": lat, "index_build_s": build_s,
            "split": split(&before, &after, steps),
        }));
    }

    // The attention kernels alone, at the model's shapes.
    let (nh, nk, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
    let heads = Heads {
        n_heads: nh,
        n_kv_heads: nk,
        head_dim: hd,
    };
    let cb = CudaBackend::new(0)?;
    let mut rng = qkindex::synth::Rng::new(5);
    let mut rand = |n: usize| (0..n).map(|_| rng.normal()).collect::<Vec<f32>>();
    let (k, v) = (rand(nk * context * hd), rand(nk * context * hd));
    let qp = rand(context * nh * hd);
    let qd = rand(nh * hd);
    let mut prefill_ms = Vec::new();
    let mut decode_ms = Vec::new();
    for _ in 0..5 {
        prefill_ms.push(cb.attention_only(&qp, &k, &v, context, context, heads)?.1);
        decode_ms.push(cb.attention_only(&qd, &k, &v, 1, context, heads)?.1);
    }
    let med = |mut x: Vec<f64>| {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    // The indexed attention kernel (rows read by id) against the CPU's softmax over those rows.
    let per_head = 100.min(context);
    let ids: Vec<u32> = (0..nh)
        .flat_map(|h| (0..per_head).map(move |j| ((j * 7919 + h * 104_729) % context) as u32))
        .collect();
    let got = cb.attention_ids(&qd, &k, &v, context, &ids, heads)?;
    let want = indexed_reference(&qd, &k, &v, context, &ids, (nh, nk, hd));
    let ids_rel_err = rel_err(&want, &got);
    println!("indexed attention kernel: rel err {ids_rel_err:.2e}");
    let attention = json!({
        "heads": nh, "kv_heads": nk, "head_dim": hd, "keys": context,
        "prefill_causal_ms": med(prefill_ms), "decode_one_query_ms": med(decode_ms),
        "indexed_ids_per_head": per_head, "indexed_rel_err": ids_rel_err,
    });
    println!("attention kernels: {attention}");

    let report = json!({
        "backend": backend,
        "model": source,
        "parity": {
            "prompt_tokens": 64,
            "logits_rel_err": logits_rel_err,
            "hidden_rel_err": hidden_rel_err,
            "greedy_steps_identical": same,
            "greedy_steps": 64,
            "pass": logits_rel_err <= 1e-2 && same == 64,
        },
        "prefill": {"tokens": context, "seconds": prefill_s, "tokens_per_s": context as f64 / prefill_s},
        "decode": decode,
        "attention_kernels": attention,
    });
    std::fs::write(
        args.out.join("gpu-driver.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    if !(logits_rel_err <= 1e-2 && same == 64) {
        bail!("CUDA backend differs from the CPU backend (see gpu-driver.json)");
    }
    if ids_rel_err > 1e-4 {
        bail!("the indexed attention kernel differs from the CPU (see gpu-driver.json)");
    }
    Ok(())
}

/// Softmax attention of one query per head over the rows `ids` of its KV head (f64).
fn indexed_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keys: usize,
    ids: &[u32],
    (nh, nk, hd): (usize, usize, usize),
) -> Vec<f32> {
    let per = ids.len() / nh;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; nh * hd];
    for h in 0..nh {
        let g = h / (nh / nk);
        let qh = &q[h * hd..(h + 1) * hd];
        let rows = &ids[h * per..(h + 1) * per];
        let s: Vec<f64> = rows
            .iter()
            .map(|&p| {
                let kr = &k[(g * keys + p as usize) * hd..][..hd];
                scale
                    * qh.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for (&p, &si) in rows.iter().zip(&s) {
            let w = (si - m).exp() / z;
            let vr = &v[(g * keys + p as usize) * hd..][..hd];
            for (o, x) in out[h * hd..(h + 1) * hd].iter_mut().zip(vr) {
                *o += (w * *x as f64) as f32;
            }
        }
    }
    out
}

fn gpu_stats(m: &Llama) -> serde_json::Value {
    m.device_stats()
}

/// Per-token averages of the split-step counters between two snapshots.
fn split(before: &serde_json::Value, after: &serde_json::Value, steps: usize) -> serde_json::Value {
    let d = |k: &str| {
        (after[k].as_f64().unwrap_or(0.0) - before[k].as_f64().unwrap_or(0.0)) / steps.max(1) as f64
    };
    json!({
        "gpu_static_ms": d("gpu_static_ms"),
        "cpu_search_ms": d("cpu_before_wait_ms"),
        "wait_ms": d("wait_ms"),
        "policy_ms": d("policy_ms"),
        "forward_ms": d("forward_ms"),
    })
}
