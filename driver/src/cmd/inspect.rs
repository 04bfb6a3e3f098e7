//! `qkindex inspect PATH`: the header, sections and parameters of an index file, key file or
//! bundle (docs/FORMAT.md). Reads headers and small JSON sections only; `qkindex verify` checks
//! the data.

use anyhow::Result;
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
}

pub fn run(args: InspectArgs) -> Result<()> {
    let info = io::inspect(&args.path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    match &info {
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
