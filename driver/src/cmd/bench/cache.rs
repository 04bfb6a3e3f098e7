//! `qkindex bench --cache DIR`: built indexes kept between runs, so that a sweep can be
//! measured again (on an idle machine, with other settings) without rebuilding.
//!
//! Each build is one index file (the format of `qkindex build`, keys inline) and a JSON side
//! file with its labels and build times. Both are named by a hash of everything the build
//! depends on: the dump's path and size, layer, head, training-query selection and the index
//! spec (its canonical form names every build parameter that differs from a preset). A file that fails to load (truncated, corrupt, another format version) is
//! rebuilt and overwritten, never trusted. Entries are loaded resident
//! ([`LoadOptions::resident`]), and a fresh build is measured as reloaded from its entry, so
//! that the first run and the cached runs search the same memory layout.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use qkindex::io::{load, LoadOptions};
use qkindex::IndexSpec;

use super::kinds::{Built, Sweep};
use super::BenchArgs;

/// The cache entry of one build.
pub struct Entry {
    index: PathBuf,
    side: PathBuf,
    key: String,
}

impl Entry {
    /// The entry of `spec` for one head (`n` keys) under `dir`.
    pub fn new(
        dir: &Path,
        args: &BenchArgs,
        spec: &IndexSpec,
        layer: usize,
        head: usize,
        n: usize,
    ) -> Self {
        let input = &args.input;
        let dump = std::fs::canonicalize(&input.dump).unwrap_or_else(|_| input.dump.clone());
        let key = format!(
            "dump={} n={n} layer={layer} head={head} spec={spec} pool={} max_train={} format={}",
            dump.display(),
            !input.no_pool,
            input.max_train,
            env!("CARGO_PKG_VERSION"),
        );
        let name = spec.name();
        let stem = format!("L{layer:02}-h{head}-{name}-{:016x}", fnv1a(key.as_bytes()));
        Entry {
            index: dir.join(format!("{stem}.qki")),
            side: dir.join(format!("{stem}.json")),
            key,
        }
    }

    /// The cached build, when both files are there, describe this build and load cleanly.
    pub fn load(&self) -> Option<Built> {
        let side: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&self.side).ok()?).ok()?;
        if side["key"].as_str() != Some(self.key.as_str()) {
            return None;
        }
        let sweep = match side["sweep"].as_str()? {
            "single" => Sweep::Single,
            "ef" => Sweep::Ef,
            "rerank" => Sweep::Rerank,
            "nprobe" => Sweep::Nprobe {
                nlist: usize::try_from(side["nlist"].as_u64()?).ok()?,
            },
            "nprobe-rerank" => Sweep::NprobeRerank {
                nlist: usize::try_from(side["nlist"].as_u64()?).ok()?,
            },
            _ => return None,
        };
        // Resident (read into huge pages), so that searches measure the index, not the TLB
        // misses of a file mapping in 4 KiB pages.
        let index = match load(&self.index, &LoadOptions::default().resident()) {
            Ok(index) => index,
            Err(e) => {
                eprintln!("cache: rebuilding {} ({e})", self.index.display());
                return None;
            }
        };
        Some(Built {
            index,
            index_name: side["index_name"].as_str()?.to_string(),
            variant: side["variant"].as_str()?.to_string(),
            build_s: side["build_s"].clone(),
            sweep,
        })
    }

    /// Writes `built` (the index file first, then the side file that makes it valid).
    pub fn store(&self, built: &Built) -> Result<()> {
        if let Some(dir) = self.index.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        built
            .index
            .save(&self.index)
            .with_context(|| format!("writing {}", self.index.display()))?;
        let (sweep, nlist) = match built.sweep {
            Sweep::Single => ("single", None),
            Sweep::Ef => ("ef", None),
            Sweep::Rerank => ("rerank", None),
            Sweep::Nprobe { nlist } => ("nprobe", Some(nlist)),
            Sweep::NprobeRerank { nlist } => ("nprobe-rerank", Some(nlist)),
        };
        let side = serde_json::json!({
            "key": self.key,
            "index_name": built.index_name,
            "variant": built.variant,
            "build_s": built.build_s,
            "sweep": sweep,
            "nlist": nlist,
        });
        std::fs::write(&self.side, serde_json::to_vec_pretty(&side)?)
            .with_context(|| format!("writing {}", self.side.display()))
    }
}

/// FNV-1a, 64 bits: a stable name for a cache key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::fnv1a;

    #[test]
    fn fnv1a_known_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
