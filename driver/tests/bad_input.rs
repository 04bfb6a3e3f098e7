//! Bad input never panics: missing, truncated or mismatched model files, unsupported tensor types,
//! prompts longer than the context, and hostile files (tensor offsets past the end, absurd
//! shapes and hyperparameters, unknown types, flipped bytes anywhere) give a typed error naming
//! the problem, never a giant allocation. Uses a tiny Llama GGUF written here, so it always runs.
//! Also checks on that tiny model that one batched prefill equals token-by-token decoding.

use std::path::{Path, PathBuf};

use qkindex_model::gguf::{write_gguf, GgufFile, MetaValue};
use qkindex_model::{
    sha256_file, Config, Model, ModelDevice, ModelError, ModelTokenizer, Timings, Weights,
};

const DIM: u64 = 16;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const FFN: u64 = 32;
const LAYERS: usize = 2;
const CTX: u32 = 40;

/// GPT-2's byte → printable-char map, enough to build a byte-level vocabulary.
fn byte_token(b: u8) -> String {
    let printable = |x: u8| (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || x >= 0xAE;
    if printable(b) {
        return char::from(b).to_string();
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n)
        .map(String::from)
        .unwrap_or_default()
}

fn values(n: usize, seed: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i as f32 * seed).sin() * 0.5).to_le_bytes())
        .collect()
}

/// A tiny Llama GGUF; `bad_type` gives `blk.0.attn_q.weight` ggml type 13 (Q5_K, not read) instead.
fn tiny_gguf(bad_type: bool) -> Vec<u8> {
    tiny_gguf_with(bad_type, &[])
}

/// [`tiny_gguf`] with the metadata values of `overrides` in place of its own.
fn tiny_gguf_with(bad_type: bool, overrides: &[(&str, MetaValue)]) -> Vec<u8> {
    let mut tokens = vec![
        MetaValue::Str("<|endoftext|>".into()),
        MetaValue::Str("<|im_end|>".into()),
    ];
    tokens.extend((0..=255u8).map(|b| MetaValue::Str(byte_token(b))));
    tokens.push(MetaValue::Str("he".into()));
    let mut types = vec![MetaValue::I32(3), MetaValue::I32(3)];
    types.extend((0..257).map(|_| MetaValue::I32(1)));
    let vocab = tokens.len() as u64;
    let meta = vec![
        ("general.architecture", MetaValue::Str("llama".into())),
        ("general.name", MetaValue::Str("tiny".into())),
        ("llama.block_count", MetaValue::U32(LAYERS as u32)),
        ("llama.context_length", MetaValue::U32(CTX)),
        ("llama.embedding_length", MetaValue::U32(DIM as u32)),
        ("llama.feed_forward_length", MetaValue::U32(FFN as u32)),
        ("llama.attention.head_count", MetaValue::U32(HEADS as u32)),
        (
            "llama.attention.head_count_kv",
            MetaValue::U32(KV_HEADS as u32),
        ),
        ("llama.rope.freq_base", MetaValue::F32(10000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        ),
        ("tokenizer.ggml.model", MetaValue::Str("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::Str("smollm".into())),
        ("tokenizer.ggml.tokens", MetaValue::Array(tokens)),
        ("tokenizer.ggml.token_type", MetaValue::Array(types)),
        (
            "tokenizer.ggml.merges",
            MetaValue::Array(vec![MetaValue::Str("h e".into())]),
        ),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(1)),
    ];
    let meta: Vec<(&str, MetaValue)> = meta
        .into_iter()
        .map(|(k, v)| match overrides.iter().find(|(o, _)| *o == k) {
            Some((_, o)) => (k, o.clone()),
            None => (k, v),
        })
        .collect();
    let hd = DIM / HEADS;
    let ones: Vec<u8> = (0..DIM).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let mut owned: Vec<(String, Vec<u64>, u32, Vec<u8>)> = vec![
        (
            "token_embd.weight".into(),
            vec![DIM, vocab],
            0,
            values((DIM * vocab) as usize, 0.37),
        ),
        ("output_norm.weight".into(), vec![DIM], 0, ones.clone()),
    ];
    for l in 0..LAYERS {
        let s = 0.1 + l as f32 * 0.05;
        let mut push = |name: &str, dims: Vec<u64>, ty: u32, data: Vec<u8>| {
            owned.push((format!("blk.{l}.{name}"), dims, ty, data));
        };
        push("attn_norm.weight", vec![DIM], 0, ones.clone());
        if bad_type && l == 0 {
            // Q5_K: 256 weights in 176 bytes; DIM × DIM = 256.
            push("attn_q.weight", vec![DIM, HEADS * hd], 13, vec![0u8; 176]);
        } else {
            push(
                "attn_q.weight",
                vec![DIM, HEADS * hd],
                0,
                values((DIM * DIM) as usize, s),
            );
        }
        push(
            "attn_k.weight",
            vec![DIM, KV_HEADS * hd],
            0,
            values((DIM * KV_HEADS * hd) as usize, s + 0.01),
        );
        push(
            "attn_v.weight",
            vec![DIM, KV_HEADS * hd],
            0,
            values((DIM * KV_HEADS * hd) as usize, s + 0.02),
        );
        push(
            "attn_output.weight",
            vec![DIM, DIM],
            0,
            values((DIM * DIM) as usize, s + 0.03),
        );
        push("ffn_norm.weight", vec![DIM], 0, ones.clone());
        push(
            "ffn_gate.weight",
            vec![DIM, FFN],
            0,
            values((DIM * FFN) as usize, s + 0.04),
        );
        push(
            "ffn_up.weight",
            vec![DIM, FFN],
            0,
            values((DIM * FFN) as usize, s + 0.05),
        );
        push(
            "ffn_down.weight",
            vec![FFN, DIM],
            0,
            values((DIM * FFN) as usize, s + 0.06),
        );
    }
    let tensors: Vec<(&str, &[u64], u32, &[u8])> = owned
        .iter()
        .map(|(n, d, t, b)| (n.as_str(), d.as_slice(), *t, b.as_slice()))
        .collect();
    write_gguf(&meta, &tensors)
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkindex-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write tmp file");
    p
}

#[test]
fn tiny_model_loads_and_prefill_equals_decode() {
    let p = tmp("tiny.gguf", &tiny_gguf(false));
    let m = Model::load(&p, None, ModelDevice::Cpu).expect("tiny model loads");
    let ids = m.tokenizer.encode("hello <|im_end|> 42").expect("encode");
    assert!(ids.contains(&1));
    let mut tm = Timings::default();
    let mut c1 = m.llama.new_cache(ids.len()).expect("cache");
    let full = m
        .llama
        .forward(&ids, &mut c1, None, &mut tm)
        .expect("prefill");
    let mut c2 = m.llama.new_cache(ids.len()).expect("cache");
    let dim = m.llama.cfg.dim;
    for (i, &t) in ids.iter().enumerate() {
        let h = m
            .llama
            .forward(&[t], &mut c2, None, &mut tm)
            .expect("decode");
        for (a, b) in h.iter().zip(&full[i * dim..(i + 1) * dim]) {
            assert!((a - b).abs() < 1e-4, "position {i}: {a} vs {b}");
        }
    }
    let logits = m.llama.last_logits(&full, &mut tm).expect("logits");
    assert_eq!(logits.len(), m.llama.cfg.vocab_size);
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let p = tmp("tiny-ctx.gguf", &tiny_gguf(false));
    let m = Model::load(&p, None, ModelDevice::Cpu).expect("tiny model loads");
    assert!(matches!(
        m.llama.new_cache(CTX as usize + 1),
        Err(ModelError::ContextOverflow { .. })
    ));
    let mut cache = m.llama.new_cache(CTX as usize).expect("cache");
    let ids = vec![5u32; CTX as usize + 3];
    let r = m
        .llama
        .forward(&ids, &mut cache, None, &mut Timings::default());
    let e = r.expect_err("too long");
    assert!(
        matches!(e, ModelError::ContextOverflow { got: 43, max: 40 }),
        "{e}"
    );
    let r = m
        .llama
        .forward(&[100_000], &mut cache, None, &mut Timings::default());
    assert!(matches!(r, Err(ModelError::TokenId { .. })));
}

#[test]
fn missing_truncated_and_wrong_checksum() {
    let missing = Path::new("/nonexistent/model.gguf");
    let e = Model::load(missing, None, ModelDevice::Cpu).expect_err("missing");
    assert!(matches!(e, ModelError::ModelNotFound { .. }));
    assert!(e.to_string().contains("get-model.sh"), "{e}");

    let bytes = tiny_gguf(false);
    for cut in [0, 3, 20, 100, bytes.len() / 2, bytes.len() - 1] {
        let p = tmp(&format!("cut{cut}.gguf"), &bytes[..cut]);
        let e = Model::load(&p, None, ModelDevice::Cpu).expect_err("truncated");
        assert!(matches!(e, ModelError::Format { .. }), "cut {cut}: {e}");
    }

    let p = tmp("tiny-sha.gguf", &bytes);
    let good = sha256_file(&p).expect("sha");
    assert!(Model::load(&p, Some(&good), ModelDevice::Cpu).is_ok());
    let wrong = "0".repeat(64);
    let e = Model::load(&p, Some(&wrong), ModelDevice::Cpu).expect_err("checksum");
    assert!(matches!(e, ModelError::Checksum { .. }), "{e}");
}

#[test]
fn unsupported_tensor_type_is_named() {
    let p = tmp("tiny-q5k.gguf", &tiny_gguf(true));
    let e = Model::load(&p, None, ModelDevice::Cpu).expect_err("Q5_K");
    assert!(
        matches!(e, ModelError::UnsupportedType { type_id: 13, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("Q5_K"), "{e}");
}

/// What `Model::load` does after reading the file, on bytes in memory.
fn load_bytes(bytes: Vec<u8>) -> Result<(), ModelError> {
    let g = GgufFile::from_bytes(Path::new("mem.gguf"), bytes)?;
    let cfg = Config::from_gguf(&g)?;
    ModelTokenizer::from_gguf(&g)?;
    Weights::from_gguf(&g, &cfg)?;
    Ok(())
}

/// A GGUF v3 file of one F32 tensor `t` with `dims`, data `n_data` bytes, at `offset`.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, n_data: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes()); // tensors
    b.extend(0u64.to_le_bytes()); // metadata
    b.extend(1u64.to_le_bytes());
    b.push(b't');
    b.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend(d.to_le_bytes());
    }
    b.extend(ty.to_le_bytes());
    b.extend(offset.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + n_data, 0);
    b
}

#[test]
fn hostile_tensor_tables_are_format_errors() {
    let ok = GgufFile::from_bytes(Path::new("ok"), one_tensor(&[4, 2], 0, 0, 32));
    assert!(ok.is_ok(), "the well-formed file reads");
    let cases: [(&[u64], u32, u64, usize, &str); 6] = [
        (&[4, 2], 0, 1 << 50, 32, "past the end"),
        (&[4, 2], 0, 0, 31, "past the end"),
        (&[4, 2], 0, 3, 64, "aligned"),
        (&[1 << 30, 1 << 20], 0, 0, 32, "past the end"),
        (&[u64::MAX, 3], 0, 0, 32, "overflows"),
        (&[33], 8, 0, 64, "whole Q8_0 blocks"),
    ];
    for (dims, ty, offset, n, want) in cases {
        let e = GgufFile::from_bytes(Path::new("bad"), one_tensor(dims, ty, offset, n))
            .expect_err("hostile table");
        assert!(
            matches!(&e, ModelError::Format { reason, .. } if reason.contains(want)),
            "{dims:?} type {ty} offset {offset}: {e}"
        );
    }
    for n_dims in [0usize, 5] {
        let dims = vec![1u64; n_dims];
        let e =
            GgufFile::from_bytes(Path::new("bad"), one_tensor(&dims, 0, 0, 32)).expect_err("dims");
        assert!(e.to_string().contains("dimensions"), "{e}");
    }
    // An unknown type id reads (metadata tools list it) but does not dequantize.
    let g = GgufFile::from_bytes(Path::new("t"), one_tensor(&[4, 2], 77, 0, 32)).expect("reads");
    let e = g.dequantize("t", &[4, 2]).expect_err("unknown type");
    assert!(
        matches!(e, ModelError::UnsupportedType { type_id: 77, .. }),
        "{e}"
    );
}

#[test]
fn absurd_hyperparameters_are_metadata_errors_before_any_allocation() {
    let huge = |k: &'static str, v: u64| (k, MetaValue::U64(v));
    let cases = [
        (huge("llama.block_count", 1 << 40), "llama.block_count"),
        (
            huge("llama.embedding_length", 1 << 40),
            "llama.embedding_length",
        ),
        (
            huge("llama.context_length", 1 << 40),
            "llama.context_length",
        ),
        (
            huge("llama.feed_forward_length", 1 << 40),
            "llama.feed_forward_length",
        ),
        (
            huge("llama.attention.head_count", 0),
            "llama.attention.head_count_kv",
        ),
        (
            huge("llama.attention.head_count_kv", 3),
            "llama.attention.head_count_kv",
        ),
        (
            ("llama.rope.freq_base", MetaValue::F32(f32::NAN)),
            "llama.rope.freq_base",
        ),
        (
            ("general.architecture", MetaValue::Str("mamba".into())),
            "mamba",
        ),
    ];
    for ((key, value), want) in cases {
        let bytes = tiny_gguf_with(false, &[(key, value.clone())]);
        let e = load_bytes(bytes).expect_err("absurd value");
        assert!(e.to_string().contains(want), "{key} = {value:?}: {e}");
    }
}

#[test]
fn flipped_bytes_anywhere_never_panic() {
    let base = tiny_gguf(false);
    assert!(load_bytes(base.clone()).is_ok());
    // Every 7th byte of the file set to 0xFF in turn (header, metadata, tensor table, data).
    let mut errors = 0;
    for i in (0..base.len()).step_by(7) {
        let mut b = base.clone();
        b[i] = 0xFF;
        errors += usize::from(load_bytes(b).is_err());
    }
    assert!(errors > 0, "some flips are detected");
}
