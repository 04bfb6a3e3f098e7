//! `qkindex dump`: runs a prompt through the model, then greedy decode steps, and writes the q/k/v of
//! chosen layers in the dump layout of docs/DESIGN.md §4 (float16 `.npy`, q and k post-RoPE in the
//! Hugging Face rotate-half layout), the same conventions as `../shared/data/smollm2-public-8k`:
//! `generated_ids[t]` is the argmax after position `n_prefill - 1 + t` (`n_decode + 1` of them) and
//! `decode_input_ids[t] = generated_ids[t]` is the token fed at position `n_prefill + t`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qkindex_driver::devices::Devices;
use qkindex_model::llama::PREFILL_CHUNK;
use qkindex_model::{argmax, LayerCapture, Model, ModelError, Timings};

use super::model_args::ModelArgs;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "ids"])))]
pub struct DumpArgs {
    /// Prompt text file; control tokens such as `<|im_start|>` in it are parsed as such.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Prompt token ids, a 1-D int32 or int64 .npy (e.g. a reference dump's prompt_ids.npy).
    #[arg(long)]
    pub ids: Option<PathBuf>,
    /// Use only the first N prompt tokens.
    #[arg(long)]
    pub prefix: Option<usize>,
    /// Model layers to dump, comma-separated [default: 2,9,16,23,29 where every layer is global
    /// (SmolLM2); the global layers otherwise (Gemma 3 270M: 5,11,17)].
    #[arg(long, value_delimiter = ',')]
    pub layers: Option<Vec<usize>>,
    /// Greedy decode steps after the prompt.
    #[arg(long, default_value_t = 64)]
    pub decode: usize,
    /// Let greedy decoding pick control tokens (the reference dumps suppress them).
    #[arg(long)]
    pub allow_control: bool,
    /// Text for the manifest's `source` field [default: the input file's path].
    #[arg(long)]
    pub source: Option<String>,
    /// Storage type of the q/k/v arrays (the reference dumps use f16).
    #[arg(long, value_enum, default_value_t = Dtype::F16)]
    pub dtype: Dtype,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The layers dumped by default from a model whose layers are all global (those of the
/// SmolLM2 reference dumps).
const SMOLLM2_LAYERS: [usize; 5] = [2, 9, 16, 23, 29];

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Dtype {
    F16,
    F32,
}

/// Captured activations of one layer (f32, written as `--dtype`), head-major: `q` is `n_q_heads × n_prefill × d`,
/// `k`/`v` `n_kv_heads × n_prefill × d`, and the `*dec` arrays the same with `n_decode` rows.
#[derive(Debug, Default)]
struct LayerDump {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qdec: Vec<f32>,
    kdec: Vec<f32>,
    vdec: Vec<f32>,
}

/// Copies `src` (row-major `n × (heads · d)`, rows at `row0..row0 + n`) into `dst`
/// (head-major `heads × total × d`).
fn scatter(dst: &mut [f32], src: &[f32], heads: usize, d: usize, total: usize, row0: usize) {
    let n = src.len() / (heads * d);
    for r in 0..n {
        for h in 0..heads {
            let s = &src[(r * heads + h) * d..(r * heads + h + 1) * d];
            let o = (h * total + row0 + r) * d;
            dst[o..o + d].copy_from_slice(s);
        }
    }
}

fn read_ids(path: &Path) -> anyhow::Result<Vec<u32>> {
    let a = qkindex::npy::read_i64(path)
        .with_context(|| format!("{}: expected a 1-D int32 or int64 .npy", path.display()))?;
    if a.shape.len() != 1 {
        anyhow::bail!(
            "{}: expected a 1-D array of token ids, found shape {:?}",
            path.display(),
            a.shape
        );
    }
    a.data
        .iter()
        .map(|&x| {
            u32::try_from(x)
                .map_err(|_| anyhow::anyhow!("{}: invalid token id {x}", path.display()))
        })
        .collect()
}

fn write_ids(path: &Path, ids: &[u32]) -> anyhow::Result<()> {
    let a: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
    qkindex::npy::write_i32(path, &[a.len()], &a)
        .with_context(|| format!("writing {}", path.display()))
}

pub fn run(args: DumpArgs, devices: &Devices) -> anyhow::Result<()> {
    let input_text = match &args.text {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let m = args.model.load(devices)?;
    let mut prompt = match (&input_text, &args.ids) {
        (Some(t), _) => m.tokenizer.encode(t)?,
        (None, Some(p)) => read_ids(p)?,
        (None, None) => anyhow::bail!("give --text or --ids"),
    };
    if let Some(n) = args.prefix {
        prompt.truncate(n);
    }
    if prompt.is_empty() {
        anyhow::bail!("the prompt has no tokens");
    }
    let m = args.model.fit(m, prompt.len() + args.decode)?;
    let cfg = m.llama.cfg.clone();
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(ModelError::TokenId {
            id: bad.into(),
            vocab: cfg.vocab_size,
        }
        .into());
    }
    let layers = match &args.layers {
        Some(l) => l.clone(),
        None if cfg.arch.all_global() => SMOLLM2_LAYERS
            .iter()
            .copied()
            .filter(|&l| l < cfg.n_layers)
            .collect(),
        None => cfg.global_layers(),
    };
    if let Some(&l) = layers.iter().find(|&&l| l >= cfg.n_layers) {
        anyhow::bail!(
            "--layers: layer {l} does not exist (the model has {})",
            cfg.n_layers
        );
    }
    let (n_prefill, n_decode) = (prompt.len(), args.decode);
    if n_prefill + n_decode > cfg.context_length {
        let e = ModelError::ContextOverflow {
            got: n_prefill + n_decode,
            max: cfg.context_length,
        };
        return Err(anyhow::Error::new(e).context(format!(
            "a prompt of {n_prefill} tokens plus {n_decode} decode steps does not fit (use --prefix or a smaller --decode)"
        )));
    }
    let prompt_text = match input_text {
        Some(t) if args.prefix.is_none() => t,
        _ => m.tokenizer.decode(&prompt)?,
    };
    let layers: Vec<usize> = {
        let mut l = layers;
        l.sort_unstable();
        l.dedup();
        l
    };
    let (hq, hkv, d) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    let mut dumps: BTreeMap<usize, LayerDump> = layers
        .iter()
        .map(|&l| {
            let ld = LayerDump {
                q: vec![0.0; hq * n_prefill * d],
                k: vec![0.0; hkv * n_prefill * d],
                v: vec![0.0; hkv * n_prefill * d],
                qdec: vec![0.0; hq * n_decode * d],
                kdec: vec![0.0; hkv * n_decode * d],
                vdec: vec![0.0; hkv * n_decode * d],
            };
            (l, ld)
        })
        .collect();

    // One tick per layer of each prefill call (chunks of PREFILL_CHUNK), then per decode step.
    let prefill_calls = n_prefill.div_ceil(PREFILL_CHUNK);
    let bar = ProgressBar::new((cfg.n_layers * prefill_calls + n_decode) as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} {elapsed_precise}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("prefill");
    let mut capture = |c: LayerCapture<'_>| {
        if let Some(ld) = dumps.get_mut(&c.layer) {
            if c.pos0 < n_prefill {
                scatter(&mut ld.q, c.q, hq, d, n_prefill, c.pos0);
                scatter(&mut ld.k, c.k, hkv, d, n_prefill, c.pos0);
                scatter(&mut ld.v, c.v, hkv, d, n_prefill, c.pos0);
            } else {
                let t = c.pos0 - n_prefill;
                scatter(&mut ld.qdec, c.q, hq, d, n_decode, t);
                scatter(&mut ld.kdec, c.k, hkv, d, n_decode, t);
                scatter(&mut ld.vdec, c.v, hkv, d, n_decode, t);
            }
        }
        if c.pos0 < n_prefill {
            bar.inc(1);
        }
    };

    let mut cache = m.llama.new_cache(n_prefill + n_decode)?;
    let skip = |id: u32| !args.allow_control && m.tokenizer.is_control(id);
    let mut tm_prefill = Timings::default();
    let t0 = Instant::now();
    let hidden = m
        .llama
        .forward(&prompt, &mut cache, Some(&mut capture), &mut tm_prefill)?;
    let logits = m.llama.last_logits(&hidden, &mut tm_prefill)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut generated = vec![argmax(&logits, skip)];
    bar.set_message("decode");
    let mut tm_decode = Timings::default();
    let t1 = Instant::now();
    for t in 0..n_decode {
        let hidden = m.llama.forward(
            &[generated[t]],
            &mut cache,
            Some(&mut capture),
            &mut tm_decode,
        )?;
        let logits = m.llama.last_logits(&hidden, &mut tm_decode)?;
        generated.push(argmax(&logits, skip));
        bar.inc(1);
    }
    let decode_s = t1.elapsed().as_secs_f64();
    bar.finish_and_clear();

    write_dump(
        &args,
        &m,
        &dumps,
        &prompt,
        &generated,
        &prompt_text,
        n_decode,
    )?;
    let ms = |x: std::time::Duration| x.as_secs_f64() * 1e3;
    eprintln!(
        "prefill: {n_prefill} tokens in {prefill_s:.2} s = {:.1} tok/s (matmul {:.0} ms, attention {:.0} ms, other {:.0} ms)",
        n_prefill as f64 / prefill_s,
        ms(tm_prefill.matmul),
        ms(tm_prefill.attention),
        ms(tm_prefill.other)
    );
    if n_decode > 0 {
        let per = |x: std::time::Duration| ms(x) / n_decode as f64;
        eprintln!(
            "decode: {n_decode} steps at positions {n_prefill}..{} = {:.2} ms/token (matmul {:.2}, attention {:.2}, other {:.2})",
            n_prefill + n_decode,
            1e3 * decode_s / n_decode as f64,
            per(tm_decode.matmul),
            per(tm_decode.attention),
            per(tm_decode.other)
        );
    }
    eprintln!(
        "generated: {:?}",
        m.tokenizer.decode(&generated).unwrap_or_default()
    );
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

fn write_dump(
    args: &DumpArgs,
    m: &Model,
    dumps: &BTreeMap<usize, LayerDump>,
    prompt: &[u32],
    generated: &[u32],
    prompt_text: &str,
    n_decode: usize,
) -> anyhow::Result<()> {
    let cfg = &m.llama.cfg;
    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (hq, hkv, d, n) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, prompt.len());
    for (&l, ld) in dumps {
        let files: [(&str, usize, usize, &[f32]); 6] = [
            ("q", hq, n, &ld.q),
            ("k", hkv, n, &ld.k),
            ("v", hkv, n, &ld.v),
            ("qdec", hq, n_decode, &ld.qdec),
            ("kdec", hkv, n_decode, &ld.kdec),
            ("vdec", hkv, n_decode, &ld.vdec),
        ];
        for (kind, heads, rows, data) in files {
            let p = out.join(format!("layer{l:02}.{kind}.npy"));
            let shape = [heads, rows, d];
            match args.dtype {
                Dtype::F16 => qkindex::npy::write_f16(&p, &shape, data),
                Dtype::F32 => qkindex::npy::write_f32(&p, &shape, data),
            }
            .with_context(|| format!("writing {}", p.display()))?;
        }
    }
    write_ids(&out.join("prompt_ids.npy"), prompt)?;
    write_ids(&out.join("decode_input_ids.npy"), &generated[..n_decode])?;
    write_ids(&out.join("generated_ids.npy"), generated)?;
    std::fs::write(out.join("prompt.txt"), prompt_text)?;
    let source = args.source.clone().unwrap_or_else(|| {
        args.text
            .as_ref()
            .or(args.ids.as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    });
    let file_name = m
        .path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let manifest = serde_json::json!({
        "format": "qkindex-dump/1",
        "model": format!("{} ({file_name})", m.name),
        "head_dim": d,
        "n_layers": cfg.n_layers,
        "n_q_heads": hq,
        "n_kv_heads": hkv,
        "layers": dumps.keys().collect::<Vec<_>>(),
        "n_prefill": n,
        "n_decode": n_decode,
        "rope_theta": cfg.rope_theta,
        "source": source,
    });
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(())
}
