//! The model's tokenizer, built from the GGUF vocabulary (`tokenizer.ggml.tokens`, `.merges`,
//! `.token_type`): byte-level BPE with the `tokenizers` crate (`tokenizer.ggml.model = "gpt2"`,
//! SmolLM2), or SentencePiece from tokens and scores ([`super::spm`], `"llama"`, Gemma 3).
//!
//! Pre-tokenizer for `tokenizer.ggml.pre = "smollm"` (llama.cpp `LLAMA_VOCAB_PRE_TYPE_SMOLLM`, the
//! Hugging Face `tokenizer.json` of SmolLM2): every digit split on its own, then the GPT-2 byte-level
//! regex without a prefix space. For `"qwen2"` (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`, Qwen2.5's
//! `tokenizer.json`): NFC normalization, then [`QWEN2_SPLIT`] (contractions, letters with one
//! leading non-letter, each digit alone, punctuation runs, newlines, whitespace), then byte-level
//! without its own regex. Control tokens (`token_type` 3, e.g. `<|im_start|>`) are special
//! added tokens, so they are recognised as such inside text; user-defined ones (`token_type` 4)
//! are added tokens too, as Hugging Face's tokenizer matches them.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::error::{ModelError, Result};
use super::gguf::{GgufFile, MetaValue};
use super::spm::SpmTokenizer;

/// `token_type` of control tokens in GGUF (`LLAMA_TOKEN_TYPE_CONTROL`).
const TOKEN_TYPE_CONTROL: u64 = 3;
/// `token_type` of user-defined tokens in GGUF (`LLAMA_TOKEN_TYPE_USER_DEFINED`).
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// Qwen2's pre-tokenizer split (its `tokenizer.json`, llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
pub const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The default system turn of SmolLM2-Instruct's chat template (`tokenizer.chat_template`).
pub const DEFAULT_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// Tokenizer plus the token facts the driver needs (control ids, end-of-turn id).
#[derive(Debug)]
pub struct ModelTokenizer {
    inner: Inner,
    /// `is_control[id]`: the token is a control token (suppressed in greedy dumps).
    pub is_control: Vec<bool>,
    /// `tokenizer.ggml.eos_token_id` (`<|im_end|>` for SmolLM2-Instruct).
    pub eos_id: u32,
    pub vocab_size: usize,
    /// The system turn the file's chat template writes when the conversation has none
    /// ([`default_system_of`]); `None` without a ChatML template that states one.
    pub default_system: Option<String>,
}

/// The default system turn a ChatML chat template (`tokenizer.chat_template`) writes: the
/// first literal `<|im_start|>system\n…<|im_end|>` in it (SmolLM2: "You are a helpful AI
/// assistant named SmolLM, …"; Qwen2.5: "You are Qwen, created by Alibaba Cloud. …").
pub fn default_system_of(template: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    let mut rest = template;
    while let Some(at) = rest.find(OPEN) {
        rest = &rest[at + OPEN.len()..];
        let body = rest
            .strip_prefix("\\n")
            .or_else(|| rest.strip_prefix('\n'))
            .unwrap_or(rest);
        if let Some(end) = body.find("<|im_end|>") {
            let text = &body[..end];
            // A literal, not a Jinja expression or the end of a string.
            if !text.is_empty() && !text.contains(['\'', '"', '{', '}', '<']) {
                return Some(text.to_string());
            }
        }
    }
    None
}

/// The segmentation behind a [`ModelTokenizer`].
#[derive(Debug)]
enum Inner {
    Bpe(Box<Tokenizer>),
    Spm(SpmTokenizer),
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

impl ModelTokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g.meta_str("tokenizer.ggml.model")?;
        if model != "gpt2" && model != "llama" {
            return Err(ModelError::Metadata {
                key: "tokenizer.ggml.model".into(),
                reason: format!(
                    "{model:?}: only byte-level BPE (gpt2) and SentencePiece (llama) are supported"
                ),
            });
        }
        let pre = g.meta_str("tokenizer.ggml.pre").unwrap_or("default");
        let strings = |key: &str| -> Result<Vec<String>> {
            g.meta_array(key)?
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| ModelError::Metadata {
                            key: key.into(),
                            reason: "holds a non-string".into(),
                        })
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<u64> = match g.meta_array("tokenizer.ggml.token_type") {
            Ok(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            Err(_) => vec![1; tokens.len()],
        };
        let eos_id = g.meta_u64("tokenizer.ggml.eos_token_id")? as u32;
        if model == "llama" {
            return Self::from_spm_gguf(g, tokens, types, eos_id);
        }
        let merges = strings("tokenizer.ggml.merges")?;
        let mut t = Self::build(&tokens, &merges, &types, eos_id, pre)?;
        t.default_system = g
            .meta_str("tokenizer.chat_template")
            .ok()
            .and_then(default_system_of);
        Ok(t)
    }

    /// The system turn of `--chat` without `--system`: the template's ([`Self::default_system`]),
    /// else SmolLM2's [`DEFAULT_SYSTEM`].
    pub fn system_or_default(&self) -> &str {
        self.default_system.as_deref().unwrap_or(DEFAULT_SYSTEM)
    }

    /// The SentencePiece tokenizer of a `llama`-model vocabulary (scores, no merges).
    fn from_spm_gguf(
        g: &GgufFile,
        tokens: Vec<String>,
        types: Vec<u64>,
        eos_id: u32,
    ) -> Result<Self> {
        let scores = g
            .meta_array("tokenizer.ggml.scores")?
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| ModelError::Metadata {
                        key: "tokenizer.ggml.scores".into(),
                        reason: "holds a non-number".into(),
                    })
            })
            .collect::<Result<Vec<f32>>>()?;
        let flag = |key: &str, default: bool| match g.meta(key) {
            Ok(MetaValue::Bool(b)) => *b,
            Ok(v) => v.as_u64().map_or(default, |x| x != 0),
            Err(_) => default,
        };
        let bos = if flag("tokenizer.ggml.add_bos_token", true) {
            Some(g.meta_u64("tokenizer.ggml.bos_token_id")? as u32)
        } else {
            None
        };
        let vocab_size = tokens.len();
        if eos_id as usize >= vocab_size {
            return Err(ModelError::TokenId {
                id: eos_id.into(),
                vocab: vocab_size,
            });
        }
        let is_control = types.iter().map(|&t| t == TOKEN_TYPE_CONTROL).collect();
        let spm = SpmTokenizer::new(
            tokens,
            scores,
            types,
            bos,
            flag("tokenizer.ggml.add_space_prefix", false),
        )?;
        Ok(Self {
            inner: Inner::Spm(spm),
            is_control,
            eos_id,
            vocab_size,
            default_system: None,
        })
    }

    /// Builds the tokenizer from a vocabulary (id = index), `"left right"` merges, GGUF token
    /// types and the pre-tokenizer name.
    pub fn build(
        tokens: &[String],
        merges: &[String],
        token_types: &[u64],
        eos_id: u32,
        pre: &str,
    ) -> Result<Self> {
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| tok_err(format!("merge {m:?} has no space")))
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut inner = Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        match pre {
            // SmolLM2 / StarCoder style: digits one by one, then the GPT-2 regex.
            "smollm" | "starcoder" | "refact" => {
                inner.with_pre_tokenizer(Some(Sequence::new(vec![
                    Digits::new(true).into(),
                    byte_level.into(),
                ])));
            }
            "default" | "gpt2" | "gpt-2" => {
                inner.with_pre_tokenizer(Some(byte_level));
            }
            "qwen2" => {
                let split = Split::new(
                    SplitPattern::Regex(QWEN2_SPLIT.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(tok_err)?;
                inner.with_normalizer(Some(NFC));
                inner.with_pre_tokenizer(Some(Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, false, false).into(),
                ])));
            }
            other => {
                return Err(ModelError::Metadata {
                    key: "tokenizer.ggml.pre".into(),
                    reason: format!("pre-tokenizer {other:?} is not supported"),
                })
            }
        }
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let is_control: Vec<bool> = (0..tokens.len())
            .map(|i| token_types.get(i) == Some(&TOKEN_TYPE_CONTROL))
            .collect();
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&is_control)
            .filter(|(_, &c)| c)
            .map(|(t, _)| AddedToken::from(t.clone(), true))
            .collect();
        inner.add_special_tokens(&specials);
        let user: Vec<AddedToken> = tokens
            .iter()
            .zip(token_types)
            .filter(|(_, &t)| t == TOKEN_TYPE_USER_DEFINED)
            .map(|(t, _)| AddedToken::from(t.clone(), false))
            .collect();
        inner.add_tokens(&user);
        if eos_id as usize >= tokens.len() {
            return Err(ModelError::TokenId {
                id: eos_id.into(),
                vocab: tokens.len(),
            });
        }
        Ok(Self {
            inner: Inner::Bpe(Box::new(inner)),
            is_control,
            eos_id,
            vocab_size: tokens.len(),
            default_system: None,
        })
    }

    /// Token ids of `text`; control-token strings in it (e.g. `<|im_start|>`) become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Bpe(t) => Ok(t.encode(text, false).map_err(tok_err)?.get_ids().to_vec()),
            Inner::Spm(t) => t.encode(text),
        }
    }

    /// Text of `ids`, control tokens included as their strings.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Inner::Bpe(t) => t.decode(ids, false).map_err(tok_err),
            Inner::Spm(t) => t.decode(ids),
        }
    }

    /// An incremental decoder that yields text as soon as it forms valid UTF-8 (for streaming).
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream {
            tok: self,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Whether `id` is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.is_control.get(id as usize).copied().unwrap_or(false)
    }
}

/// Streaming decoder state of [`ModelTokenizer::stream`]: decodes the ids seen so far and emits the
/// new suffix, holding back text that ends in an incomplete UTF-8 sequence.
#[derive(Debug)]
pub struct TokenStream<'a> {
    tok: &'a ModelTokenizer,
    ids: Vec<u32>,
    emitted: usize,
}

impl TokenStream<'_> {
    /// Adds `id` and returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() < self.emitted {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_owned();
        self.emitted = text.len();
        Ok(new)
    }
}

/// The chat-template rendering of one user turn, ready for the assistant's answer:
/// `<|im_start|>system\n{system}<|im_end|>\n` (when `system` is given), then
/// `<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n`.
pub fn chat_prompt(user: &str, system: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(sys) = system {
        s.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
    }
    s.push_str(&format!(
        "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default system turn is read from the template (SmolLM2's and Qwen2.5's, abridged);
    /// Jinja expressions and templates without one give none.
    #[test]
    fn the_default_system_turn_comes_from_the_template() {
        let smol = "{% for message in messages %}{% if loop.first and messages[0]['role'] != \
                    'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named \
                    SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}";
        assert_eq!(
            default_system_of(smol).as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        let qwen = "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == \
                    'system' %}{{- messages[0]['content'] }}{%- endif %}{%- else %}{%- if \
                    messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + \
                    messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- \
                    '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a \
                    helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}";
        assert_eq!(
            default_system_of(qwen).as_deref(),
            Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
        );
        assert_eq!(default_system_of("{{ messages }}"), None);
        assert_eq!(
            default_system_of("<|im_start|>system\n{{ x }}<|im_end|>"),
            None
        );
    }

    /// A tiny byte-level vocabulary: all 256 byte symbols, a few merges, two control tokens.
    fn tiny() -> ModelTokenizer {
        let bytes_to_unicode = |b: u8| -> char {
            // GPT-2's byte → printable char map.
            let printable = (b'!'..=b'~').contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            if printable {
                char::from(b)
            } else {
                let mut n = 0u32;
                for x in 0..=255u8 {
                    let p = (b'!'..=b'~').contains(&x)
                        || (0xA1..=0xAC).contains(&x)
                        || (0xAE..=0xFF).contains(&x);
                    if !p {
                        if x == b {
                            break;
                        }
                        n += 1;
                    }
                }
                char::from_u32(256 + n).unwrap_or('?')
            }
        };
        let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string()];
        for b in 0..=255u8 {
            tokens.push(bytes_to_unicode(b).to_string());
        }
        let merges: Vec<String> = vec!["h e".into(), "l l".into(), "he ll".into(), "Ġ w".into()];
        tokens.extend(["he", "ll", "hell", "Ġw"].map(String::from));
        let mut types = vec![1u64; tokens.len()];
        types[0] = 3;
        types[1] = 3;
        ModelTokenizer::build(&tokens, &merges, &types, 0, "smollm").expect("tiny tokenizer")
    }

    #[test]
    fn round_trip_and_specials() {
        let t = tiny();
        let text = "<|im_start|>hello world 123 é\n";
        let ids = t.encode(text).expect("encode");
        assert_eq!(ids[0], 1, "control token parsed as one id");
        assert!(
            ids.contains(&(t.vocab_size as u32 - 2)),
            "merge 'hell' used: {ids:?}"
        );
        assert_eq!(t.decode(&ids).expect("decode"), text);
        let mut s = t.stream();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&s.push(id).expect("push"));
        }
        assert_eq!(out, text);
        assert!(t.is_control(0) && !t.is_control(5) && !t.is_control(1 << 30));
    }

    #[test]
    fn digits_are_split() {
        let t = tiny();
        let ids = t.encode("12").expect("encode");
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn chat_prompt_layout() {
        assert_eq!(
            chat_prompt("Hi", None),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(chat_prompt("Hi", Some(DEFAULT_SYSTEM)).starts_with("<|im_start|>system\nYou are"));
    }
}
