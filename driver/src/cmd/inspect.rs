//! `qkindex inspect PATH`: the header, sections and parameters of an index file, key file or
//! bundle (docs/FORMAT.md). Reads headers and small JSON sections only (the header checksum and
//! the section table are checked: a damaged header is an error), and says so at the end:
//! the sections' checksums are `qkindex verify`'s job, or `inspect --verify`'s.

use anyhow::{Context, Result};
use clap::Args;
use qkindex::io::{self, FileInfo, Inspection};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// An index file, a key file or a bundle directory.
    pub path: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also check every section's checksum and the structure (what `qkindex verify` does);
    /// exits non-zero on a fault.
    #[arg(long)]
    pub verify: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let info = io::inspect(&args.path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print_inspection(&info)?;
    }
    // On stderr with --json, so that stdout stays one JSON document.
    let say = |line: String| {
        if args.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    if args.verify {
        let r =
            io::verify(&args.path).with_context(|| format!("verifying {}", args.path.display()))?;
        say(format!(
            "verified: every checksum and the structure ({} files, {} bytes)",
            r.files, r.bytes
        ));
    } else {
        say(format!(
            "checked: header checksum and section table only; the sections' data and checksums \
             were NOT verified (run `qkindex verify {}` or `inspect --verify`)",
            args.path.display()
        ));
    }
    Ok(())
}

fn print_inspection(info: &Inspection) -> Result<()> {
    match info {
        Inspection::File(f) => print_file(f, true),
        Inspection::Bundle {
            path,
            manifest,
            files,
        } => {
            println!("bundle {}", path.display());
            if let Some(meta) = manifest.get("meta") {
                println!("meta: {}", serde_json::to_string_pretty(meta)?);
            }
            for f in files {
                println!();
                print_file(f, false);
            }
        }
    }
    Ok(())
}

fn print_file(f: &FileInfo, params: bool) {
    println!("file       {}", f.path.display());
    println!(
        "format     v{}  kind {}  dtype {}  n {}  d {}  {} bytes  header checksum {}",
        f.format_version,
        f.kind,
        f.dtype.as_deref().unwrap_or("-"),
        f.n,
        f.d,
        f.file_len,
        f.header_checksum
    );
    println!(
        "  {:<22} {:>12} {:>14} {:>18}",
        "section", "offset", "bytes", "checksum (xxh3)"
    );
    for s in &f.sections {
        println!(
            "  {:<22} {:>12} {:>14} {:>18}",
            s.kind, s.offset, s.len, s.checksum
        );
    }
    if let Some(r) = &f.keys_ref {
        println!("keys in    {r}");
    }
    if params {
        if let Some(p) = &f.params {
            println!(
                "params     {}",
                serde_json::to_string_pretty(p).unwrap_or_default()
            );
        }
    }
}
