//! Skips that the test run reports. A test that cannot run here (no model file, no GPU, no NVRTC,
//! no opt-in data directory) calls [`skip`] and returns: the reason goes to its captured output
//! and, where `QKINDEX_SKIP_LOG` names a file (`scripts/test.sh` sets it), one line
//! `crate::test: reason` is appended to that file, which `scripts/test.sh` prints at its end
//! (cargo captures a passing test's output, so a print alone is seen by nobody).
//!
//! Shared by the workspace's test crates through `#[path = ".../tests/support/skip.rs"] mod skip;`.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

/// Records that the running test skipped, and why.
pub fn skip(reason: &str) {
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    let line = format!("{}::{name}: {reason}", env!("CARGO_CRATE_NAME"));
    println!("SKIP {line}");
    if let Some(path) = std::env::var_os("QKINDEX_SKIP_LOG") {
        // One write of one line in append mode: lines of parallel tests do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            panic!(
                "QKINDEX_SKIP_LOG={}: cannot record the skip: {e}",
                PathBuf::from(path).display()
            );
        }
    }
}

/// Skips with `reason`, except under CI (`CI` set), where what is missing is a failure: CI
/// fetches every model and sets every opt-in the tests need.
pub fn skip_unless_ci(reason: &str) {
    assert!(std::env::var_os("CI").is_none(), "CI: {reason}");
    skip(reason);
}

/// The directory of the opt-in data outside the repository (`QKINDEX_SHARED_DATA`, e.g.
/// `../shared/data` holding `smollm2-public-8k`; a relative path is taken from the repository
/// root, since cargo runs each test crate in its own directory) joined with `name`, or None after
/// a skip record where the variable is unset. Set but without `name/manifest.json` is a failure: who
/// opted in expects the test to run.
pub fn shared_data(name: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("QKINDEX_SHARED_DATA") else {
        skip_unless_ci(&format!(
            "QKINDEX_SHARED_DATA is not set (it names the directory holding `{name}`, data \
             outside the repository; opt-in)"
        ));
        return None;
    };
    // Every crate that includes this file lies one level below the repository root.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join(dir).join(name);
    assert!(
        path.join("manifest.json").is_file(),
        "QKINDEX_SHARED_DATA is set but {} has no manifest.json",
        path.display()
    );
    Some(path)
}
