//! The Gemma 3 SentencePiece tokenizer against Google's `sentencepiece` library: the ids that
//! `scripts/spm-reference.py` computed with it (a ModelProto built from the GGUF vocabulary) for
//! three texts of `tests/fixtures/spm/` (license prose, mixed scripts and emoji with whitespace
//! runs and HTML, Python code with tabs), stored in `tests/fixtures/gemma3-spm.json`.
//!
//! Without the model (`bash scripts/get-model.sh --model gemma3-270m`) the test prints `SKIP`
//! and passes, except under CI (`CI` set), where its absence fails.

mod common;

use qkindex_model::gguf::GgufFile;
use qkindex_model::ModelTokenizer;

#[derive(serde::Deserialize)]
struct Fixture {
    bos: u32,
    texts: Vec<Text>,
}

#[derive(serde::Deserialize)]
struct Text {
    path: String,
    ids: Vec<u32>,
}

#[test]
fn gemma3_ids_equal_sentencepiece() {
    let root = common::root();
    let Some(model) = common::gemma3_model() else {
        return;
    };
    let fixture: Fixture = serde_json::from_str(
        &std::fs::read_to_string(root.join("driver/tests/fixtures/gemma3-spm.json"))
            .expect("fixture"),
    )
    .expect("fixture JSON");
    let g = GgufFile::open(&model).expect("open the GGUF file");
    let tok = ModelTokenizer::from_gguf(&g).expect("tokenizer");
    assert_eq!(tok.vocab_size, 262_144);
    for t in &fixture.texts {
        let text = std::fs::read_to_string(root.join(&t.path)).expect("text");
        let ids = tok.encode(&text).expect("encode");
        assert_eq!(ids.first(), Some(&fixture.bos), "{}: BOS first", t.path);
        let got = &ids[1..];
        if let Some(i) = got.iter().zip(&t.ids).position(|(a, b)| a != b) {
            panic!(
                "{}: first difference at token {i}: ours {:?}, sentencepiece {:?}",
                t.path,
                &got[i..(i + 8).min(got.len())],
                &t.ids[i..(i + 8).min(t.ids.len())]
            );
        }
        assert_eq!(got.len(), t.ids.len(), "{}: token count", t.path);
        assert_eq!(
            tok.decode(&ids).expect("decode"),
            text,
            "{}: decode round trip",
            t.path
        );
    }
}
