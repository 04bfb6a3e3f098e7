//! `qkindex demo`, the README's main job: fetch the model if it is missing, prefill the bundled
//! text, build an index per layer and KV head, then generate with `index-topk` (streaming the
//! text) while `full` runs the same tokens, dump two layers' prefill and decode q/k/v, and print
//! what was measured: recall, attention mass, the latency split and the agreement with `full`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qkindex_driver::decode::{prefill_with, Decoder, Prefill};
use qkindex_driver::devices::Devices;
use qkindex_driver::retrieval::{build_tally, BuildTally, PolicyConfig, PolicyKind};
use qkindex_model::{argmax, find_default_model, KvCache, LayerCapture, Model};

use super::model_args::ModelArgs;
use super::policy_args::PolicyArgs;
use super::progress::prefill_bar;
use super::ttft_line;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Prefill length in tokens (of the bundled license texts, or of Paul Graham's essays,
    /// fetched by `scripts/get-text.sh`, when it is longer than they are).
    #[arg(long, default_value_t = 8000)]
    pub context: usize,
    /// Tokens to generate with retrieval attention.
    #[arg(long, default_value_t = 48)]
    pub new: usize,
    /// Layers whose prefill q/k/v are dumped [default: 9,23 where the model has them as global
    /// layers (SmolLM2, Qwen2.5), else its last global layer (Gemma 3 270M: 17)].
    #[arg(long, value_delimiter = ',')]
    pub dump_layers: Option<Vec<usize>>,
    /// Output directory (the dump goes to OUT/dump).
    #[arg(long, default_value = "demo-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: DemoArgs, devices: &Devices) -> anyhow::Result<()> {
    let index_cfg = args.policy.config(PolicyKind::IndexTopk);
    // What needs no model is checked before the model is fetched or loaded; the rest before the
    // prefill: a bad size fails at once, with one message.
    check_sizes(&args, &index_cfg, args.context)?;
    if args.model.model.is_none() && find_default_model().is_none() {
        fetch_model()?;
    }
    let m = args.model.load(devices)?;
    // The bundled text, or the essays where it is too short.
    let encode = |t: &str| Ok(m.tokenizer.encode(t)?);
    let (ids, text_name) = super::texts::long_enough(args.context, encode)?;
    let ctx = args.context.min(ids.len());
    if ctx < args.context {
        // The text is shorter than asked: the demo runs on all of it, if that fits.
        check_sizes(&args, &index_cfg, ctx)
            .with_context(|| format!("{text_name} have {ctx} tokens"))?;
    }
    let m = args.model.fit(m, ctx + args.new)?;
    let cfg = &m.llama.cfg;
    if ctx + args.new > cfg.context_length {
        anyhow::bail!(
            "--context {ctx} + --new {} must fit the model's {} positions",
            args.new,
            cfg.context_length
        );
    }
    let dump_layers = args.dump_layers.clone().unwrap_or_else(|| {
        let global = |l: &usize| *l < cfg.n_layers && cfg.layer(*l).attention.window().is_none();
        let mut layers: Vec<usize> = [9, 23].into_iter().filter(global).collect();
        if layers.is_empty() {
            layers.extend(cfg.global_layers().last());
        }
        layers
    });
    if let Some(&l) = dump_layers.iter().find(|&&l| l >= cfg.n_layers) {
        anyhow::bail!(
            "--dump-layers: layer {l} does not exist ({} layers)",
            cfg.n_layers
        );
    }
    if let Some(&l) = dump_layers
        .iter()
        .find(|&&l| cfg.layer(l).attention.window().is_some())
    {
        anyhow::bail!(
            "--dump-layers: layer {l} is a sliding-window layer (no index, and its cache keeps \
             only its window); dump global layers: {:?}",
            cfg.global_layers()
        );
    }
    println!(
        "== prefill: {ctx} tokens of {text_name} ({} layers, {} query heads, {} KV heads)",
        cfg.n_layers, cfg.n_heads, cfg.n_kv_heads
    );
    let bar = prefill_bar(ctx);
    let pre = prefill_with(&m.llama, &ids[..ctx], ctx, true, |d| {
        bar.set_position(d as u64)
    })?;
    bar.finish_and_clear();
    println!(
        "   {:.1} s ({:.0} tokens/s)",
        pre.seconds,
        ctx as f64 / pre.seconds
    );

    // Sliding-window layers (Gemma 3's local ones) get no index.
    let served = (0..cfg.n_layers)
        .filter(|&l| cfg.layer(l).attention.window().is_none())
        .count();
    let total = served * cfg.n_kv_heads;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(ProgressStyle::with_template(
        "   {bar:30} {pos}/{len} indexes [{elapsed}<{eta}]",
    )?);
    println!(
        "== build: one {} index per global layer and KV head over the keys outside the static set \
         (sink {}, window {}), from the prefill queries",
        index_cfg.index, index_cfg.sink, index_cfg.window
    );
    let tally_before = build_tally();
    // The prefill's cache moves into the index-topk decoder (grown by the decode steps), and
    // `full` copies that: two caches, not three (at 131,072 positions each is 0.9 GB).
    let Prefill {
        cache: pre_cache,
        q: mut pre_q,
        last_logits,
        seconds: prefill_s,
    } = pre;
    let n = pre_cache.len();
    let cache = pre_cache.with_capacity(n + args.new, cfg.head_dim);
    drop(pre_cache);
    let mut fast = Decoder::with_cache(
        &m.llama,
        cache,
        &pre_q,
        &index_cfg,
        devices.knn(),
        |d, _| bar.set_position(d as u64),
    )?;
    bar.finish_and_clear();
    let build_s = fast.stats().map_or(0.0, |s| s.build_s);
    println!("   {total} indexes in {build_s:.1} s");
    let tally = build_tally() - tally_before;
    if let Some(line) = tally_line(tally) {
        println!("{line}");
    }
    if let Some(line) = tally.steps_line() {
        println!("   {line}");
    }
    println!("{}", ttft_line(prefill_s, build_s));
    // The builds are done: keep the queries of the dumped layers only (at 131,072 positions
    // each global layer's are 0.5 GiB).
    for (l, q) in pre_q.iter_mut().enumerate() {
        if !dump_layers.contains(&l) {
            *q = Vec::new();
        }
    }
    let full_cfg = args.policy.config(PolicyKind::Full);
    let mut full = Decoder::with_cache(
        &m.llama,
        fast.cache().clone(),
        &[],
        &full_cfg,
        devices.knn(),
        |_, _| {},
    )?;

    println!(
        "== decode: {} tokens, greedy, attention = static + top-{} from the index",
        args.new, index_cfg.k
    );
    let mut stream = m.tokenizer.stream();
    let mut out = std::io::stdout().lock();
    let mut logits = last_logits.clone();
    let mut full_logits = last_logits;
    let mut agree = 0usize;
    let eos = m.tokenizer.eos_id;
    let skip = |id: u32| m.tokenizer.is_control(id);
    let mut produced = 0usize;
    // Per dumped layer: the decode steps' q, k, v rows.
    let mut decoded: Vec<Rows> = vec![Default::default(); dump_layers.len()];
    for _ in 0..args.new {
        let next = argmax(&logits, skip);
        agree += usize::from(next == argmax(&full_logits, skip));
        produced += 1;
        if next == eos {
            break;
        }
        write!(out, "{}", stream.push(next)?)?;
        out.flush()?;
        let mut cb = |c: LayerCapture<'_>| {
            if let Some(i) = dump_layers.iter().position(|&l| l == c.layer) {
                let d = &mut decoded[i];
                d.0.extend_from_slice(c.q);
                d.1.extend_from_slice(c.k);
                d.2.extend_from_slice(c.v);
            }
        };
        logits = fast.step_with(next, Some(&mut cb))?;
        full_logits = full.step(next)?;
    }
    writeln!(out)?;
    drop(out);

    let dump_dir = args.out.join("dump");
    write_dump(
        &m,
        (full.cache(), n, &pre_q),
        &dump_layers,
        &decoded,
        (&dump_dir, text_name),
    )?;
    println!(
        "== dump: layers {:?}, {} prefill + {} decode rows → {} (`qkindex bench --dump`, `qkindex decode-bench --dump`, qkindex.load_dump)",
        dump_layers,
        ctx,
        decoded.first().map_or(0, |d| d.0.len() / (cfg.n_heads * cfg.head_dim)),
        dump_dir.display()
    );

    let s = fast.stats().context("index-topk keeps statistics")?;
    let (lf, lx) = (fast.latency(), full.latency());
    let pct = |x: Option<f64>| x.map_or("—".to_string(), |v| format!("{:.1}%", 100.0 * v));
    println!(
        "== measured over {produced} steps × {served} layers × {} query heads",
        cfg.n_heads
    );
    println!(
        "   recall@{} of the retrieved keys (vs the exact top-{} outside the static set): {}",
        index_cfg.k,
        index_cfg.k,
        pct(s.recall())
    );
    println!(
        "   softmax mass on the attended keys: {} (of the exact top-k selection's: {})",
        pct(s.mass()),
        pct(s.mass_ratio())
    );
    let per = s.distance_computations as f64 / s.selections.max(1) as f64;
    println!(
        "   index search: {per:.0} inner products per head and step ({} of the keys outside the static set)",
        pct(Some(per / n.saturating_sub(index_cfg.sink + index_cfg.window).max(1) as f64))
    );
    println!(
        "   top-1 agreement with full attention: {agree}/{produced} ({:.1}%)",
        100.0 * agree as f64 / produced.max(1) as f64
    );
    println!(
        "   ms per token   index-topk: search {:.2} + attention {:.2} + rest {:.2} = {:.2}   full: attention {:.2} + rest {:.2} = {:.2}",
        lf.search, lf.attention, lf.rest, lf.total, lx.attention, lx.rest, lx.total
    );
    println!(
        "   of which       index-topk: attention {:.2} global + {:.2} local, matmul {:.2}   full: attention {:.2} global + {:.2} local, matmul {:.2}",
        lf.attention_global, lf.attention_local, lf.matmul, lx.attention_global, lx.attention_local, lx.matmul
    );
    Ok(())
}

/// The sizes the demo's retrieval needs, for a prefill of `ctx` tokens: a rest between the sinks
/// and the window to retrieve from ([`PolicyConfig::check`], the check the decoder makes), `k`
/// and `--new` of at least 1.
fn check_sizes(args: &DemoArgs, index_cfg: &PolicyConfig, ctx: usize) -> anyhow::Result<()> {
    match index_cfg.check(ctx) {
        Ok(()) => {}
        Err(qkindex::Error::InvalidParam {
            name: "context",
            reason,
            ..
        }) => {
            anyhow::bail!(
                "--context {ctx}: {reason}: the demo retrieves from the keys between the first \
                 --sink {} and the last --window {} tokens; pass a longer --context or a smaller \
                 --sink/--window",
                index_cfg.sink,
                index_cfg.window
            )
        }
        Err(qkindex::Error::InvalidParam { name, reason, .. }) => {
            anyhow::bail!("--{name}: {reason}")
        }
        Err(e) => return Err(e.into()),
    }
    if args.new == 0 {
        anyhow::bail!("--new must be at least 1");
    }
    Ok(())
}

/// One line on the build-time checks of the `AttentionIndex` builds: how many printed a
/// `far check` or `auto ef` line above, and why the others did not (None without such builds).
fn tally_line(t: BuildTally) -> Option<String> {
    if t.attention == 0 {
        return None;
    }
    let n = t.attention;
    let far = if t.far_checked > 0 {
        format!(
            "far check ran on {} of {n} (enough of their training lists read far back; kept the \
             full-list graph on {}), the other {} read mostly recent keys and need no check",
            t.far_checked,
            t.far_kept_full,
            n - t.far_checked
        )
    } else {
        format!("far check ran on none of {n} (off, or no group read far back enough)")
    };
    let ef = if t.auto_ef_measured > 0 {
        format!(
            "auto ef measured on {}: raised the default ef on {} (printed above), the other {} \
             reach the target at the default ef",
            t.auto_ef_measured,
            t.auto_ef_raised,
            t.auto_ef_measured - t.auto_ef_raised
        )
    } else {
        "auto ef off".to_string()
    };
    let prune = if t.prune_checked > 0 {
        format!(
            "; prune check ran on {}: kept the checked rule's graph on {}, the asked rule's on {}",
            t.prune_checked,
            t.prune_kept_other,
            t.prune_checked - t.prune_kept_other
        )
    } else {
        String::new()
    };
    Some(format!("   build checks: {far}; {ef}{prune}"))
}

/// Runs `scripts/get-model.sh` of the repository this binary was built from.
fn fetch_model() -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/get-model.sh");
    if !script.is_file() {
        anyhow::bail!(
            "the model is missing and {} is not there; pass --model PATH",
            script.display()
        );
    }
    println!("== model missing: running {}", script.display());
    let status = std::process::Command::new("bash")
        .arg(&script)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        anyhow::bail!("{} failed ({status})", script.display());
    }
    Ok(())
}

/// Row-major q, k and v rows of decode steps (`n × (heads · head_dim)` each).
type Rows = (Vec<f32>, Vec<f32>, Vec<f32>);

/// `rows` (row-major `n × (heads · hd)`) as head-major `heads × n × hd`.
fn head_major(rows: &[f32], heads: usize, hd: usize) -> Vec<f32> {
    let n = rows.len() / (heads * hd).max(1);
    let mut out = vec![0f32; rows.len()];
    for h in 0..heads {
        for p in 0..n {
            out[(h * n + p) * hd..][..hd].copy_from_slice(&rows[(p * heads + h) * hd..][..hd]);
        }
    }
    out
}

/// Writes the prefill and decode q/k/v of `layers` in the dump layout (float16, head-major).
/// `prefill`: a cache whose first `n` positions are the prefill's (global layers: from
/// position 0), and the prefill's queries per layer.
fn write_dump(
    m: &Model,
    (cache, n, pre_q): (&KvCache, usize, &[Vec<f32>]),
    layers: &[usize],
    decoded: &[Rows],
    (dir, text_name): (&Path, &str),
) -> anyhow::Result<()> {
    let c = &m.llama.cfg;
    let hd = c.head_dim;
    let (hq, hk) = (c.n_heads, c.n_kv_heads);
    let n_dec = decoded.first().map_or(0, |d| d.0.len() / (hq * hd));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (&l, (qd, kd, vd)) in layers.iter().zip(decoded) {
        let blocks = |f: &dyn Fn(usize) -> Vec<f32>| -> Vec<f32> { (0..hk).flat_map(f).collect() };
        let k = blocks(&|g| cache.keys(l, g, hd)[..n * hd].to_vec());
        let v = blocks(&|g| cache.values(l, g, hd)[..n * hd].to_vec());
        let path = |part: &str| dir.join(format!("layer{l:02}.{part}.npy"));
        qkindex::npy::write_f16(&path("q"), &[hq, n, hd], &head_major(&pre_q[l], hq, hd))?;
        qkindex::npy::write_f16(&path("k"), &[hk, n, hd], &k)?;
        qkindex::npy::write_f16(&path("v"), &[hk, n, hd], &v)?;
        qkindex::npy::write_f16(&path("qdec"), &[hq, n_dec, hd], &head_major(qd, hq, hd))?;
        qkindex::npy::write_f16(&path("kdec"), &[hk, n_dec, hd], &head_major(kd, hk, hd))?;
        qkindex::npy::write_f16(&path("vdec"), &[hk, n_dec, hd], &head_major(vd, hk, hd))?;
    }
    let manifest = qkindex::dump::Manifest {
        format: "qkindex-dump/1".into(),
        model: m.name.clone(),
        head_dim: hd,
        n_layers: c.n_layers,
        n_q_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        layers: layers.to_vec(),
        n_prefill: n,
        n_decode: n_dec,
        rope_theta: c.rope_theta,
        source: format!("qkindex demo: {text_name}"),
    };
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(())
}
