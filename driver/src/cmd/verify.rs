//! `qkindex verify PATH`: fully checks an index file, key file or bundle (every checksum, the
//! graph's ids and offsets, finite keys, key references). Prints one line; exits non-zero with
//! the reason on any fault.

use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// An index file, a key file or a bundle directory.
    pub path: PathBuf,
}

/// Exit status on a fault.
const FAULT: i32 = 1;

pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let t = Instant::now();
    match qkindex::io::verify(&args.path) {
        Ok(r) => {
            let s = t.elapsed().as_secs_f64();
            println!(
                "ok: {} ({} files, {} bytes checked in {:.3}s, {:.2} GB/s)",
                args.path.display(),
                r.files,
                r.bytes,
                s,
                r.bytes as f64 / s.max(1e-9) / 1e9
            );
            Ok(())
        }
        Err(e) => {
            println!("fault: {e}");
            std::process::exit(FAULT);
        }
    }
}
