//! SentencePiece-style tokenizer from a GGUF `llama` vocabulary (`tokenizer.ggml.model = "llama"`:
//! tokens with scores and types, no merges), as Gemma 3 ships it.
//!
//! Encoding follows llama.cpp's SPM tokenizer:
//! 1. *Partition.* User-defined tokens (GGUF type 4: runs of newlines, spaces, tabs, HTML tags) and
//!    control tokens (type 3, e.g. `<start_of_turn>`) are split out of the raw text first, longest
//!    token first, so they are never broken up.
//! 2. *Escape.* In every other fragment a space becomes U+2581 (`▁`); no space is prefixed unless
//!    `tokenizer.ggml.add_space_prefix` says so.
//! 3. *Merge.* Each character starts as one symbol; the adjacent pair whose concatenation is a
//!    vocabulary token with the highest score is merged (ties: leftmost), until no pair is a token.
//! 4. *Byte fallback.* A symbol that is not a token becomes its UTF-8 bytes' `<0xXX>` tokens.
//!
//! `BOS` is prepended when `tokenizer.ggml.add_bos_token` is true. The test
//! `driver/tests/spm_reference.rs` compares this against Google's `sentencepiece` library.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::error::{ModelError, Result};

/// GGUF token types (llama.cpp `llama_token_type`, the same numbers as SentencePiece's).
const TYPE_CONTROL: u64 = 3;
const TYPE_USER_DEFINED: u64 = 4;
const TYPE_BYTE: u64 = 6;

/// The whitespace marker of SentencePiece pieces.
const SPACE: char = '\u{2581}';

/// A SentencePiece vocabulary with scores, ready to encode and decode.
#[derive(Debug)]
pub struct SpmTokenizer {
    pieces: Vec<String>,
    scores: Vec<f32>,
    types: Vec<u64>,
    lookup: HashMap<String, u32>,
    /// `byte_ids[b]`: the `<0xXX>` token of byte `b`, if the vocabulary has it.
    byte_ids: Vec<Option<u32>>,
    /// Tokens split out before merging (user-defined and control), longest first.
    specials: Vec<u32>,
    bos: Option<u32>,
    add_space_prefix: bool,
}

/// A candidate merge of symbols `left` and its right neighbour, whose joined text has `size`
/// bytes and is the token of score `score`.
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Highest score first; among equal scores the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One symbol of the merge: a byte range of the fragment, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SpmTokenizer {
    /// Builds the tokenizer from the vocabulary (`pieces[id]`), scores and GGUF token types.
    /// `bos` is prepended by [`SpmTokenizer::encode`] when given.
    pub fn new(
        pieces: Vec<String>,
        scores: Vec<f32>,
        types: Vec<u64>,
        bos: Option<u32>,
        add_space_prefix: bool,
    ) -> Result<Self> {
        let n = pieces.len();
        if scores.len() != n || types.len() != n {
            return Err(ModelError::Tokenizer(format!(
                "{n} tokens but {} scores and {} types",
                scores.len(),
                types.len()
            )));
        }
        if let Some(b) = bos {
            if b as usize >= n {
                return Err(ModelError::TokenId {
                    id: b.into(),
                    vocab: n,
                });
            }
        }
        let mut lookup = HashMap::with_capacity(n);
        let mut byte_ids = vec![None; 256];
        let mut specials = Vec::new();
        for (id, (p, &ty)) in pieces.iter().zip(&types).enumerate() {
            let id = id as u32;
            lookup.insert(p.clone(), id);
            if ty == TYPE_BYTE {
                if let Some(b) = parse_byte_piece(p) {
                    byte_ids[b as usize] = Some(id);
                }
            }
            if (ty == TYPE_USER_DEFINED || ty == TYPE_CONTROL) && !p.is_empty() {
                specials.push(id);
            }
        }
        specials.sort_by_key(|&id| std::cmp::Reverse(pieces[id as usize].len()));
        Ok(Self {
            pieces,
            scores,
            types,
            lookup,
            byte_ids,
            specials,
            bos,
            add_space_prefix,
        })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// True for control tokens.
    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&TYPE_CONTROL)
    }

    /// Token ids of `text` (BOS first when configured).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        ids.extend(self.bos);
        let mut fragments = vec![Fragment::Text(0, text.len())];
        for &id in &self.specials {
            fragments = split_out(text, &fragments, &self.pieces[id as usize], id);
        }
        let mut escaped = String::new();
        let mut first = true;
        for f in fragments {
            match f {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(a, b) => {
                    escaped.clear();
                    if self.add_space_prefix && first {
                        escaped.push(SPACE);
                    }
                    escaped.extend(text[a..b].chars().map(|c| if c == ' ' { SPACE } else { c }));
                    self.encode_fragment(&escaped, &mut ids)?;
                }
            }
            first = false;
        }
        Ok(ids)
    }

    /// Merges one escaped fragment and appends its ids.
    fn encode_fragment(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut heap = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(text, &symbols, i - 1, i, &mut heap);
        }
        while let Some(b) = heap.pop() {
            let left = symbols[b.left];
            let Some(r) = left.next else { continue };
            // Stale: one side was merged since the pair was queued.
            if left.len == 0 || left.len + symbols[r].len != b.size {
                continue;
            }
            let right = symbols[r];
            symbols[b.left].len += right.len;
            symbols[b.left].next = right.next;
            symbols[r].len = 0;
            if let Some(n) = right.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = left.prev {
                self.push_bigram(text, &symbols, p, b.left, &mut heap);
            }
            if let Some(n) = right.next {
                self.push_bigram(text, &symbols, b.left, n, &mut heap);
            }
        }
        let mut at = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.lookup.get(piece) {
                Some(&id) => ids.push(id),
                None => {
                    for b in piece.bytes() {
                        let id = self.byte_ids[b as usize].ok_or_else(|| {
                            ModelError::Tokenizer(format!(
                                "byte 0x{b:02X} of {piece:?} has no <0x{b:02X}> token"
                            ))
                        })?;
                        ids.push(id);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    fn push_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        heap: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(&id) = self.lookup.get(joined) {
            heap.push(Bigram {
                score: self.scores[id as usize],
                left,
                size: joined.len(),
            });
        }
    }

    /// Text of `ids`: `▁` back to spaces, byte tokens to their bytes, control tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self.pieces.get(id as usize).ok_or(ModelError::TokenId {
                id: id.into(),
                vocab: self.pieces.len(),
            })?;
            match self.types[id as usize] {
                TYPE_CONTROL => {}
                TYPE_BYTE => bytes.extend(parse_byte_piece(piece)),
                _ => {
                    for c in piece.chars() {
                        let c = if c == SPACE { ' ' } else { c };
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// `<0xXX>` → the byte.
fn parse_byte_piece(p: &str) -> Option<u8> {
    let hex = p.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A piece of the text under partition: a byte range still to be merged, or a token split out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// Splits every occurrence of `needle` (the token `id`) out of the text fragments.
fn split_out(text: &str, fragments: &[Fragment], needle: &str, id: u32) -> Vec<Fragment> {
    let mut out = Vec::with_capacity(fragments.len());
    for &f in fragments {
        let Fragment::Text(a, b) = f else {
            out.push(f);
            continue;
        };
        let mut from = a;
        while let Some(off) = text[from..b].find(needle) {
            let at = from + off;
            if at > from {
                out.push(Fragment::Text(from, at));
            }
            out.push(Fragment::Token(id));
            from = at + needle.len();
        }
        if from < b {
            out.push(Fragment::Text(from, b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary where "ab" outscores "bc": "abc" must merge as "ab" + "c".
    fn tiny() -> SpmTokenizer {
        let mut pieces: Vec<String> = [
            "<pad>", "<bos>", "a", "b", "c", "ab", "bc", "▁", "▁a", "\n\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut scores = vec![0.0, 0.0, -1.0, -1.0, -1.0, -2.0, -3.0, -1.0, -1.5, 0.0];
        let mut types = vec![3, 3, 1, 1, 1, 1, 1, 1, 1, 4];
        for b in 0..=255u8 {
            pieces.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(TYPE_BYTE);
        }
        SpmTokenizer::new(pieces, scores, types, Some(1), false).expect("tiny vocabulary")
    }

    #[test]
    fn merges_by_score_then_leftmost() {
        let t = tiny();
        assert_eq!(t.encode("abc").expect("encode"), vec![1, 5, 4]);
        // "bcab": "bc" (−3) and "ab" (−2) overlap at no symbol: both merge, best first.
        assert_eq!(t.encode("bcab").expect("encode"), vec![1, 6, 5]);
    }

    #[test]
    fn spaces_user_defined_tokens_and_byte_fallback() {
        let t = tiny();
        // " a" → "▁a"; "\n\n" is split out whole; "é" (0xC3 0xA9) falls back to bytes.
        let ids = t.encode(" a\n\né").expect("encode");
        assert_eq!(ids, vec![1, 8, 9, 10 + 0xC3, 10 + 0xA9]);
        assert_eq!(t.decode(&ids).expect("decode"), " a\n\né");
    }

    #[test]
    fn control_tokens_in_text_are_parsed_and_dropped_on_decode() {
        let t = tiny();
        let ids = t.encode("a<bos>b").expect("encode");
        assert_eq!(ids, vec![1, 2, 1, 3]);
        assert_eq!(t.decode(&ids).expect("decode"), "ab");
        assert!(t.is_control(1));
    }

    #[test]
    fn bad_vocabularies_are_errors() {
        assert!(SpmTokenizer::new(vec!["a".into()], vec![], vec![1], None, false).is_err());
        assert!(SpmTokenizer::new(vec!["a".into()], vec![0.0], vec![1], Some(5), false).is_err());
        let t = SpmTokenizer::new(vec!["a".into()], vec![0.0], vec![1], None, false)
            .expect("one-token vocabulary");
        assert!(t.encode("b").is_err(), "no byte fallback token for 'b'");
        assert!(t.decode(&[7]).is_err());
    }
}
