//! index-core's floors (issue 43): a top-level module may use only modules on lower floors, so
//! the crate has no import cycle and each concept has one home below its users.
//!
//! ```text
//!  9 io                                  load, verify, inspect, bundles
//!  8 spec                                IndexSpec, AnyIndex (the one registration of kinds)
//!  7 attention flat hnsw ivf vamana retopk   the kinds, each with its file sections
//!  6 file                                the file format's blocks (header, reader, writer, Persist)
//!  5 graph                               CSR, beam search, prune / reach / repair
//!  4 codes knn many                      key codes; exact kNN backends; many indexes searched at once
//!  3 search cluster dump                 the search interface; k-means; the dump layout
//!  2 store scratch eval                  keys and buffers; scratch; metrics
//!  1 cancel metric npy synth             leaves over the error type
//!  0 error
//! ```
//!
//! Code under `#[cfg(test)]` at the end of a file (its `mod tests`) is exempt: a unit test of
//! one kind may measure it against another (the exact scan as the yardstick).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FLOORS: &[(&str, u32)] = &[
    ("error", 0),
    ("cancel", 1),
    ("metric", 1),
    ("npy", 1),
    ("synth", 1),
    ("store", 2),
    ("scratch", 2),
    ("eval", 2),
    ("search", 3),
    ("cluster", 3),
    ("dump", 3),
    ("many", 4),
    ("codes", 4),
    ("knn", 4),
    ("graph", 5),
    ("file", 6),
    ("attention", 7),
    ("flat", 7),
    ("hnsw", 7),
    ("ivf", 7),
    ("vamana", 7),
    ("retopk", 7),
    ("spec", 8),
    ("io", 9),
];

/// The source without comment lines and without its trailing `#[cfg(test)] mod …` block.
fn code_of(src: &str) -> String {
    let mut out = String::new();
    let lines: Vec<&str> = src.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines[i + 1..]
                .iter()
                .map(|l| l.trim_start())
                .find(|l| !l.is_empty())
                .is_some_and(|l| l.starts_with("mod "))
        {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every top-level module named by a `crate::` path in `code` (`crate::a::b`, and the items of
/// `use crate::{a, b::c}` groups).
fn crate_refs(code: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // Skip `$crate::` and identifiers that end in `crate` (`my_crate::`).
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    refs.push(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                refs.push(name);
            }
        }
    }
    refs
}

/// `(file, module, module it uses)` for each use of a module on the same or a higher floor.
fn violations(files: &[(String, String)]) -> Vec<(String, String, String)> {
    let floor: BTreeMap<&str, u32> = FLOORS.iter().copied().collect();
    let mut bad = Vec::new();
    for (path, src) in files {
        let top = path.split('/').next().unwrap_or("").trim_end_matches(".rs");
        let Some(&own) = floor.get(top) else {
            bad.push((path.clone(), top.to_string(), "(no floor)".into()));
            continue;
        };
        for used in crate_refs(&code_of(src)) {
            if used == top {
                continue;
            }
            match floor.get(used.as_str()) {
                Some(&f) if f < own => {}
                // Crate-root re-exports (`crate::Error`, `crate::KeyStore`) name lower floors'
                // items; a lower-case name that is no module is an unknown module.
                None if used.starts_with(|c: char| c.is_uppercase()) => {}
                _ => bad.push((path.clone(), top.to_string(), used)),
            }
        }
    }
    bad
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, root, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p
                .strip_prefix(root)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            if rel != "lib.rs" {
                out.push((rel, std::fs::read_to_string(&p).expect("read")));
            }
        }
    }
}

#[test]
fn no_module_uses_one_on_its_floor_or_above() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 50, "read {} files", files.len());
    let bad = violations(&files);
    assert!(
        bad.is_empty(),
        "imports against the floors (file, module, uses):\n{}",
        bad.iter()
            .map(|(f, m, u)| format!("  {f}: {m} uses {u}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn every_module_of_lib_rs_has_a_floor() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("lib.rs");
    let floor: BTreeMap<&str, u32> = FLOORS.iter().copied().collect();
    let mods: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert!(mods.len() >= 20, "{mods:?}");
    for m in mods {
        assert!(floor.contains_key(m), "module {m} has no floor in FLOORS");
    }
}

#[test]
fn the_check_catches_upward_uses_and_ignores_tests_and_comments() {
    let file = |path: &str, src: &str| (path.to_string(), src.to_string());
    let up = [file(
        "graph/search.rs",
        "use crate::error::Result;\nuse crate::{store::KeyStore, io::Buf};\n",
    )];
    assert_eq!(
        violations(&up),
        vec![("graph/search.rs".into(), "graph".into(), "io".into())]
    );
    let sideways = [file("ivf/mod.rs", "fn f() { crate::flat::top_ids(); }\n")];
    assert_eq!(violations(&sideways).len(), 1);
    let fine = [file(
        "ivf/mod.rs",
        "// crate::io::load in a comment\nuse crate::cluster::train;\nuse crate::Error;\n\
         #[cfg(test)]\nmod tests {\n    use crate::flat::FlatIndex;\n}\n",
    )];
    assert!(violations(&fine).is_empty(), "{:?}", violations(&fine));
    let unknown = [file("newkind/mod.rs", "")];
    assert_eq!(violations(&unknown).len(), 1);
}
