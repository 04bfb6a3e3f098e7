//! Fuzzes the dump reader (`qkindex::dump`): arbitrary manifests and `.npy` files must give a
//! dump's tensors or a typed error, never a panic or a giant allocation.
//!
//! Input framing: an optional leading `F`, then the manifest and up to seven files separated by
//! [`SEP`]: the layer's `q`, `k`, `qdec`, `kdec`, `v`, `vdec` tensors and `prompt_ids.npy`
//! (a missing or empty piece is a missing file). The files are read in memory
//! (`Manifest::from_json`, `Dump::parse`, `Dump::parse_head_inputs`, `Dump::parse_ids`), at the
//! manifest's first layer. With `F`, they are also written to a directory of this process
//! (reused, overwritten) and read from there (`Dump::open`, `read`, `head_inputs`, `read_ids`),
//! and both readings must agree.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use qkindex::dump::{Dump, HeadInputs, HeadTensor, Manifest, Part};
use qkindex::Error;

/// Separates the pieces of an input (see the module doc).
const SEP: &[u8] = b"\n--qkindex-fuzz--\n";

const PARTS: [Part; 6] = [
    Part::Q,
    Part::K,
    Part::QDec,
    Part::KDec,
    Part::V,
    Part::VDec,
];

const IDS: &str = "prompt_ids.npy";

fn split(mut data: &[u8]) -> Vec<&[u8]> {
    let mut pieces = Vec::new();
    while let Some(at) = data.windows(SEP.len()).position(|w| w == SEP) {
        pieces.push(&data[..at]);
        data = &data[at + SEP.len()..];
    }
    pieces.push(data);
    pieces
}

/// This process's dump directory, created once.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("qkindex-fuzz-dump-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the fuzz dump directory");
        d
    })
}

/// The reader's errors are typed: a bad file is `Format`, a missing one `Io`, a layer or head
/// outside the manifest `InvalidParam`, keys the store refuses `DimensionMismatch`/`Empty`.
fn check_error(e: &Error) {
    match e {
        Error::Format { .. }
        | Error::Io { .. }
        | Error::InvalidParam { .. }
        | Error::DimensionMismatch { .. }
        | Error::Empty { .. }
        | Error::NonFinite { .. } => {}
        other => panic!("unexpected error kind: {other}"),
    }
}

fn same<T: PartialEq + std::fmt::Debug>(
    what: &str,
    mem: &Result<T, Error>,
    file: &Result<T, Error>,
) {
    match (mem, file) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}: in memory and from the file differ"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}: errors differ"),
        _ => panic!("{what}: in memory {mem:?}, from the file {file:?}"),
    }
}

fn inputs_key(r: &Result<HeadInputs, Error>) -> Result<(usize, &[f32], &[f32]), String> {
    match r {
        Ok(h) => Ok((h.keys.len(), &h.train, &h.decode)),
        Err(e) => Err(e.to_string()),
    }
}

fuzz_target!(|data: &[u8]| {
    let (files, data) = match data.split_first() {
        Some((b'F', rest)) => (true, rest),
        _ => (false, data),
    };
    let pieces = split(data);
    let manifest_bytes = pieces[0];
    let tensors: Vec<Option<&[u8]>> = (0..PARTS.len())
        .map(|i| pieces.get(i + 1).copied().filter(|b| !b.is_empty()))
        .collect();
    let ids = pieces
        .get(PARTS.len() + 1)
        .copied()
        .filter(|b| !b.is_empty());

    let mpath = Path::new("manifest.json");
    let manifest = match std::str::from_utf8(manifest_bytes) {
        Ok(text) => Manifest::from_json(mpath, text),
        Err(_) => Err(Error::format(mpath, "manifest", "not UTF-8")),
    };
    if files {
        clear();
        for (name, bytes) in std::iter::once(("manifest.json".to_string(), Some(manifest_bytes)))
            .chain(std::iter::once((IDS.to_string(), ids)))
        {
            write(&dir().join(name), bytes);
        }
        let opened = Dump::open(dir());
        match (&manifest, &opened) {
            (Ok(m), Ok(d)) => assert_eq!(m, &d.manifest),
            (Err(_), Err(e)) => check_error(e),
            _ => panic!("manifest: in memory {manifest:?}, Dump::open {opened:?}"),
        }
    }
    let manifest = match manifest {
        Ok(m) => m,
        Err(e) => return check_error(&e),
    };
    let dump = Dump {
        dir: dir().to_path_buf(),
        manifest,
    };
    let layer = dump.manifest.layers.first().copied().unwrap_or(0);
    // Each head's inputs parse the layer's three files again: one head (the last, whose KV
    // head and group are the furthest in) is read, and one past the last (refused first).
    let n_q = dump.manifest.n_q_heads;
    let heads = [n_q - 1, n_q];
    for h in heads {
        let _ = dump.manifest.kv_head_of(h);
    }

    let mut parsed: Vec<Option<Result<HeadTensor, Error>>> = Vec::new();
    for (part, bytes) in PARTS.iter().zip(&tensors) {
        let r = bytes.map(|b| dump.parse(layer, *part, b));
        if let Some(Ok(t)) = &r {
            assert_eq!(t.data.len(), t.heads * t.rows * t.dim);
            for h in 0..t.heads.min(4) {
                let _ = t.head(h);
            }
        }
        if let Some(Err(e)) = &r {
            check_error(e);
        }
        parsed.push(r);
    }
    let mut inputs = Vec::new();
    if let (Some(q), Some(k), Some(qdec)) = (tensors[0], tensors[1], tensors[2]) {
        for h in heads {
            let r = dump.parse_head_inputs(layer, h, [q, k, qdec]);
            if let Err(e) = &r {
                check_error(e);
            }
            inputs.push(r);
        }
    }
    let parsed_ids = ids.map(|b| dump.parse_ids(IDS, b));
    if let Some(Err(e)) = &parsed_ids {
        check_error(e);
    }

    if files {
        for (part, bytes) in PARTS.iter().zip(&tensors) {
            write(&dump.path(layer, *part), *bytes);
        }
        for ((part, mem), bytes) in PARTS.iter().zip(&parsed).zip(&tensors) {
            assert_eq!(dump.has(layer, *part), bytes.is_some());
            if let Some(mem) = mem {
                same("tensor", mem, &dump.read(layer, *part));
            }
        }
        if tensors[..3].iter().all(Option::is_some) {
            for (h, mem) in heads.iter().zip(&inputs) {
                let file = dump.head_inputs(layer, *h);
                assert_eq!(
                    inputs_key(mem),
                    inputs_key(&file),
                    "head inputs of head {h}"
                );
            }
        }
        if let Some(mem) = &parsed_ids {
            same("ids", mem, &dump.read_ids(IDS));
        }
    }
});

/// The files the last input wrote (its layer's names depend on its manifest).
static WRITTEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes the files of the last input.
fn clear() {
    let mut written = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    for path in written.drain(..) {
        if let Err(e) = std::fs::remove_file(&path) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::NotFound,
                "remove {}",
                path.display()
            );
        }
    }
}

/// Writes `bytes` to `path` (nothing when there are none).
fn write(path: &Path, bytes: Option<&[u8]>) {
    if let Some(b) = bytes {
        std::fs::write(path, b).expect("write a fuzz dump file");
        WRITTEN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.to_path_buf());
    }
}
