//! Diagnostic: the top logits of the first answer token of a chat prompt under several weight
//! and activation paths (issue 64, item 0).
//!   cargo run -p qkindex-model --example first_logits -- MODEL "question"
use std::path::Path;

use qkindex_model::gguf::GgufFile;
use qkindex_model::{
    chat_prompt, Config, HostTensor, Llama, ModelTokenizer, Timings, Weights, DEFAULT_SYSTEM,
};

fn top(tok: &ModelTokenizer, l: &[f32], k: usize) -> String {
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
    order[..k]
        .iter()
        .map(|&i| {
            format!(
                "{:?} {:.3}",
                tok.decode(&[i as u32]).unwrap_or_default(),
                l[i]
            )
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let g = GgufFile::open(Path::new(&args[1]))?;
    let cfg = Config::from_gguf(&g)?;
    let tok = ModelTokenizer::from_gguf(&g)?;
    let ids = tok.encode(&chat_prompt(&args[2], Some(DEFAULT_SYSTEM)))?;
    let run = |w: Weights, name: &str| -> Result<(), Box<dyn std::error::Error>> {
        let l = Llama::new(cfg.clone(), w);
        let mut tm = Timings::default();
        let mut cache = l.new_cache(ids.len() + 1)?;
        // Prefill all but the last token, then the last as a decode step (as generate does).
        l.forward(&ids[..ids.len() - 1], &mut cache, None, &mut tm)?;
        let h = l.forward(&ids[ids.len() - 1..], &mut cache, None, &mut tm)?;
        let lg = l.last_logits(&h, &mut tm)?;
        println!("{name:>34}: {}", top(&tok, &lg, 5));
        Ok(())
    };
    let f32w = || Weights::read(&g, &cfg, false);
    let int8 = || Weights::read(&g, &cfg, true);
    run(f32w()?, "f32 everywhere")?;
    run(int8()?, "int8 activations everywhere")?;
    let mut w = int8()?;
    w.embed = HostTensor::F32(w.embed.to_f32().into_owned());
    run(w, "int8 layers, f32 LM head")?;
    let mut w = f32w()?;
    let q = int8()?;
    w.embed = q.embed;
    run(w, "f32 layers, int8 LM head")?;
    for layer in 0..cfg.n_layers {
        let mut w = f32w()?;
        let mut q = int8()?;
        std::mem::swap(&mut w.blocks[layer], &mut q.blocks[layer]);
        run(w, &format!("f32 but layer {layer} int8"))?;
    }
    Ok(())
}
