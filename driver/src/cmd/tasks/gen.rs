//! The task generators: each writes a prompt of about a target token length (the context, to be
//! prefilled, and the question, to be decoded) and the strings the answer must contain. The
//! definitions follow RULER (Hsieh et al. 2024); the texts, word list and sizes are ours.
//!
//! | task | context | expected |
//! |---|---|---|
//! | `niah-single` | one needle "One of the special magic numbers for {key} is: {7 digits}." at the depth | the number |
//! | `niah-multikey` | the needle and [`DISTRACTORS`] needles of other keys at random depths | the queried key's number |
//! | `niah-multivalue` | [`VALUES`] needles of one key (the first at the depth) | all its numbers |
//! | `niah-multiquery` | [`QUERIES`] needles of different keys (the first at the depth) | every queried key's number |
//! | `vt` | "VAR A = 12345." then [`HOPS`] "VAR B = VAR A." links, from the depth to the end | every variable of the chain |
//! | `cwe` | a numbered word list: [`COMMON`] words each `n/20` times, the others rarely | the common words |
//! | `passkey` | `qkindex passkey`'s prompt (its filler, whatever `--haystack`) | the 5-digit key |

use qkindex::synth::Rng;

use super::super::longctx::{fit, haystack_text, Haystack};
use super::super::passkey;
use super::words::WORDS;

/// The tasks of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    NiahSingle,
    NiahMultikey,
    NiahMultivalue,
    NiahMultiquery,
    Vt,
    Cwe,
    Passkey,
}

/// Distractor needles of `niah-multikey`.
pub const DISTRACTORS: usize = 3;
/// Values of the one key of `niah-multivalue`.
pub const VALUES: usize = 4;
/// Keys asked at once by `niah-multiquery`.
pub const QUERIES: usize = 4;
/// Links of the `vt` chain (variables: one more).
pub const HOPS: usize = 4;
/// Common words of `cwe`.
pub const COMMON: usize = 5;

impl Task {
    #[cfg(test)]
    pub const ALL: [Task; 7] = [
        Task::NiahSingle,
        Task::NiahMultikey,
        Task::NiahMultivalue,
        Task::NiahMultiquery,
        Task::Vt,
        Task::Cwe,
        Task::Passkey,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Task::NiahSingle => "niah-single",
            Task::NiahMultikey => "niah-multikey",
            Task::NiahMultivalue => "niah-multivalue",
            Task::NiahMultiquery => "niah-multiquery",
            Task::Vt => "vt",
            Task::Cwe => "cwe",
            Task::Passkey => "passkey",
        }
    }

    /// Tokens generated for the answer: the expected strings and their separators, a little
    /// more (digits are a token each with both models' tokenizers).
    pub fn answer_tokens(self) -> usize {
        match self {
            Task::NiahSingle | Task::NiahMultikey => 12,
            // Four values, each restated as "... for {key} is: {value}." (~20 tokens) by the
            // answer prefix's pattern.
            Task::NiahMultivalue | Task::NiahMultiquery => 80,
            Task::Vt => 32,
            Task::Cwe => 24,
            Task::Passkey => passkey::ANSWER_TOKENS,
        }
    }

    /// Whether the task places its needle at a depth (`cwe` has none).
    #[cfg(test)]
    pub fn has_depth(self) -> bool {
        self != Task::Cwe
    }
}

/// One prompt: the prefilled context, the decoded question, the strings the answer must hold.
#[derive(Clone, Debug)]
pub struct Sample {
    pub context: String,
    pub question: String,
    pub expected: Vec<String>,
    pub depth: Option<f64>,
}

const NIAH_HEAD: &str = "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the numbers afterwards.\n";
const VT_HEAD: &str =
    "Memorize and track the chain of variable assignments hidden in the following text.\n";
const CWE_HEAD: &str = "Below is a numbered list of words. Some of the words appear many times in the list, the others rarely. Memorize the ones that appear most often.\n";

/// Builds the sample of `task` at about `length` tokens (context and question together, as
/// `count` counts them), its needle at `depth` ∈ [0, 1]; keys, values and positions from `rng`.
pub fn generate(
    task: Task,
    haystack: Haystack,
    length: usize,
    depth: f64,
    rng: &mut Rng,
    count: &dyn Fn(&str) -> anyhow::Result<usize>,
) -> anyhow::Result<Sample> {
    let (head, inserts, question, expected) = match task {
        Task::Cwe => return cwe(length, rng, count),
        Task::Passkey => {
            let key = format!("{}", 10000 + rng.below(90000));
            let inserts = vec![(depth, passkey::passkey_needle(&key))];
            let question = passkey::QUESTION.to_string();
            let units = Haystack::Repeat.units()?;
            return assemble(
                passkey::HEAD,
                &units,
                inserts,
                question,
                vec![key],
                depth,
                length,
                count,
            );
        }
        Task::NiahSingle | Task::NiahMultikey => {
            let keys = distinct(
                rng,
                1 + if task == Task::NiahMultikey {
                    DISTRACTORS
                } else {
                    0
                },
                key,
            );
            let values: Vec<String> = keys.iter().map(|_| number(rng, 7)).collect();
            let mut inserts = vec![(depth, needle(&keys[0], &values[0]))];
            for (k, v) in keys.iter().zip(&values).skip(1) {
                inserts.push((rng.uniform() as f64, needle(k, v)));
            }
            let q = format!(
                "\nWhat is the special magic number for {0} mentioned in the provided text? The special magic number for {0} mentioned in the provided text is",
                keys[0]
            );
            (NIAH_HEAD.to_string(), inserts, q, vec![values[0].clone()])
        }
        Task::NiahMultivalue => {
            let k = key(rng);
            let values = distinct(rng, VALUES, |r| number(r, 7));
            let inserts = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    (
                        if i == 0 { depth } else { rng.uniform() as f64 },
                        needle(&k, v),
                    )
                })
                .collect();
            // "... are" made SmolLM2 list the essay's section numbers; restating the needle's
            // opening makes it recite needles, one value or more.
            let q = format!(
                "\nQuestion: What are all the special magic numbers for {k} mentioned in the provided text?\nAnswer: One of the special magic numbers for {k} is:"
            );
            (NIAH_HEAD.to_string(), inserts, q, values)
        }
        Task::NiahMultiquery => {
            let keys = distinct(rng, QUERIES, key);
            let values: Vec<String> = keys.iter().map(|_| number(rng, 7)).collect();
            let inserts = keys
                .iter()
                .zip(&values)
                .enumerate()
                .map(|(i, (k, v))| {
                    (
                        if i == 0 { depth } else { rng.uniform() as f64 },
                        needle(k, v),
                    )
                })
                .collect();
            let list = english_list(&keys);
            let q = format!(
                "\nQuestion: What are the special magic numbers for {list} mentioned in the provided text?\nAnswer: The special magic number for {} is:",
                keys[0]
            );
            (NIAH_HEAD.to_string(), inserts, q, values)
        }
        Task::Vt => {
            let vars = distinct(rng, HOPS + 1, |r| {
                (0..5)
                    .map(|_| (b'A' + r.below(26) as u8) as char)
                    .collect::<String>()
            });
            let value = number(rng, 5);
            let mut inserts = vec![(depth, format!("VAR {} = {value}.", vars[0]))];
            for i in 1..vars.len() {
                let d = depth + (1.0 - depth) * i as f64 / (vars.len() as f64);
                inserts.push((d, format!("VAR {} = VAR {}.", vars[i], vars[i - 1])));
            }
            let q = format!(
                "\nQuestion: Find all variables that are assigned the value {value} in the text.\nAnswer: The variables assigned the value {value} are: VAR"
            );
            (VT_HEAD.to_string(), inserts, q, vars)
        }
    };
    let units = haystack.units()?;
    assemble(
        &head, &units, inserts, question, expected, depth, length, count,
    )
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    head: &str,
    units: &[&str],
    inserts: Vec<(f64, String)>,
    question: String,
    expected: Vec<String>,
    depth: f64,
    length: usize,
    count: &dyn Fn(&str) -> anyhow::Result<usize>,
) -> anyhow::Result<Sample> {
    let q = count(&question)?;
    let total = |s: &str| Ok(count(s)? + q);
    let (_, context) = fit(
        length,
        |n| format!("{head}{}", haystack_text(units, n, &inserts)),
        &total,
    )?;
    Ok(Sample {
        context,
        question,
        expected,
        depth: Some(depth),
    })
}

/// `cwe`: a numbered list of `n` words (fitted to `length`) in which the [`COMMON`] expected
/// words appear `max(2, n / 20)` times each and the others are drawn uniformly from the rest of
/// [`WORDS`] (at long lengths they repeat too, far less often).
fn cwe(
    length: usize,
    rng: &mut Rng,
    count: &dyn Fn(&str) -> anyhow::Result<usize>,
) -> anyhow::Result<Sample> {
    let picked = distinct(rng, COMMON, |r| WORDS[r.below(WORDS.len())].to_string());
    let seed = rng.below(1 << 31) as u64;
    let others: Vec<&str> = WORDS
        .iter()
        .copied()
        .filter(|w| !picked.iter().any(|p| p == w))
        .collect();
    let build = |n: usize| {
        let mut r = Rng::new(seed);
        let each = (n / 20).max(2).min(n / (2 * COMMON)).max(1);
        let mut list: Vec<&str> = Vec::with_capacity(n);
        for w in &picked {
            list.extend(std::iter::repeat_n(w.as_str(), each));
        }
        while list.len() < n {
            list.push(others[r.below(others.len())]);
        }
        list.truncate(n);
        for i in (1..list.len()).rev() {
            list.swap(i, r.below(i + 1));
        }
        let mut s = CWE_HEAD.to_string();
        for (i, w) in list.iter().enumerate() {
            s.push_str(&format!("{}. {w}\n", i + 1));
        }
        s
    };
    let question = format!(
        "Question: What are the {COMMON} most common words in the above list? Answer: The {COMMON} words that appear most often in the list are:"
    );
    let q = count(&question)?;
    let total = |s: &str| Ok(count(s)? + q);
    let (_, context) = fit(length, build, &total)?;
    Ok(Sample {
        context,
        question,
        expected: picked,
        depth: None,
    })
}

fn needle(key: &str, value: &str) -> String {
    format!("One of the special magic numbers for {key} is: {value}.")
}

/// A key: two words of [`WORDS`] joined by a hyphen.
fn key(rng: &mut Rng) -> String {
    let a = WORDS[rng.below(WORDS.len())];
    let b = WORDS[rng.below(WORDS.len())];
    format!("{a}-{b}")
}

/// A `digits`-digit number without a leading zero.
fn number(rng: &mut Rng, digits: u32) -> String {
    let lo = 10usize.pow(digits - 1);
    format!("{}", lo + rng.below(9 * lo))
}

/// `n` distinct draws of `draw`.
fn distinct(rng: &mut Rng, n: usize, mut draw: impl FnMut(&mut Rng) -> String) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    while out.len() < n {
        let s = draw(rng);
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// "a, b, c and d".
fn english_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> anyhow::Result<usize> {
        Ok(s.split_whitespace().count())
    }

    fn sample(task: Task, haystack: Haystack, length: usize, seed: u64) -> Sample {
        generate(task, haystack, length, 0.4, &mut Rng::new(seed), &words).expect("present")
    }

    #[test]
    fn generators_are_deterministic_per_seed() {
        for task in Task::ALL {
            let a = sample(task, Haystack::Essay, 2000, 7);
            let b = sample(task, Haystack::Essay, 2000, 7);
            let c = sample(task, Haystack::Essay, 2000, 8);
            assert_eq!(
                (&a.context, &a.question, &a.expected),
                (&b.context, &b.question, &b.expected)
            );
            assert_ne!(a.expected, c.expected, "{task:?}");
        }
    }

    #[test]
    fn expected_strings_are_in_the_context_and_the_length_fits() {
        for task in Task::ALL {
            for haystack in [Haystack::Essay, Haystack::Repeat] {
                for length in [1024, 8192] {
                    let s = sample(task, haystack, length, 3);
                    assert!(!s.expected.is_empty());
                    for e in &s.expected {
                        assert!(s.context.contains(e.as_str()), "{task:?}: {e} missing");
                    }
                    let n =
                        words(&s.context).expect("present") + words(&s.question).expect("present");
                    assert!(
                        n <= length && n as f64 >= 0.95 * length as f64,
                        "{task:?} {haystack:?}: {n} words for {length}"
                    );
                    assert_eq!(s.depth.is_some(), task.has_depth());
                }
            }
        }
    }

    #[test]
    fn niah_needles_and_questions() {
        let s = sample(Task::NiahSingle, Haystack::Essay, 1024, 1);
        let v = &s.expected[0];
        assert_eq!(v.len(), 7);
        let needle_at = s.context.find(&format!(" is: {v}.")).expect("present");
        let frac = needle_at as f64 / s.context.len() as f64;
        assert!((frac - 0.4).abs() < 0.05, "needle at {frac}");
        assert!(s.question.ends_with("mentioned in the provided text is"));
        assert_eq!(s.context.matches("special magic numbers for").count(), 1);

        let s = sample(Task::NiahMultikey, Haystack::Essay, 1024, 1);
        assert_eq!(
            s.context
                .matches("One of the special magic numbers for")
                .count(),
            1 + DISTRACTORS
        );
        assert_eq!(s.expected.len(), 1);

        let s = sample(Task::NiahMultivalue, Haystack::Repeat, 1024, 1);
        assert_eq!(s.expected.len(), VALUES);
        let key = s
            .question
            .split("numbers for ")
            .nth(1)
            .expect("present")
            .split(' ')
            .next()
            .expect("present");
        assert_eq!(
            s.context.matches(&format!("numbers for {key} is:")).count(),
            VALUES
        );

        let s = sample(Task::NiahMultiquery, Haystack::Repeat, 1024, 1);
        assert_eq!(s.expected.len(), QUERIES);
        assert!(s.question.contains(" and ") && s.question.ends_with(" is:"));
    }

    #[test]
    fn vt_chain_is_in_order() {
        let s = sample(Task::Vt, Haystack::Essay, 2048, 5);
        assert_eq!(s.expected.len(), HOPS + 1);
        let body = &s.context[VT_HEAD.len()..];
        let mut last = 0;
        for w in s.expected.windows(2) {
            let at = body
                .find(&format!("VAR {} = VAR {}.", w[1], w[0]))
                .expect("present");
            assert!(at > last);
            last = at;
        }
        assert!(body.contains(&format!("VAR {} = ", s.expected[0])));
    }

    #[test]
    fn cwe_common_words_are_the_most_frequent() {
        let s = sample(Task::Cwe, Haystack::Essay, 4096, 2);
        let mut freq = std::collections::HashMap::new();
        for line in s.context.lines().skip(1) {
            let w = line.split_once(". ").expect("present").1;
            *freq.entry(w.to_string()).or_insert(0usize) += 1;
        }
        let least_common = s.expected.iter().map(|w| freq[w]).min().expect("present");
        let most_other = freq
            .iter()
            .filter(|(w, _)| !s.expected.contains(w))
            .map(|(_, &c)| c)
            .max()
            .expect("present");
        assert!(
            least_common >= 3 * most_other,
            "{least_common} vs {most_other}"
        );
    }

    #[test]
    fn too_short_a_length_is_an_error() {
        let err = generate(Task::Vt, Haystack::Essay, 40, 0.5, &mut Rng::new(0), &words)
            .expect_err("an error");
        assert!(err.to_string().contains("too small"), "{err}");
    }
}
