//! Index files (docs/FORMAT.md): round trips of every kind (identical results after a mapped
//! open, nothing copied), bundles sharing keys, atomic replacement, and the corruption matrix:
//! every damage is a typed `Error::Format` naming the path and the section, never a panic.

use half::f16;
use proptest::prelude::*;
use qkindex::io::bundle::{Bundle, BundleWriter};
use qkindex::io::format::{self, SectionKind, ENTRY_LEN, HEADER_LEN};
use qkindex::io::{self, AnyIndex, LoadOptions, RawFile};
use qkindex::synth::ood;
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, Error, FlatIndex, KeyStore, SearchOutput,
    SearchParams,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

const N: usize = 600;
const DIM: usize = 16;
const M: usize = 20;
const K: usize = 10;

struct Fixture {
    queries: Vec<f32>,
    attention_f16: AttentionIndex,
    attention_f32: AttentionIndex,
    attention_i8: AttentionIndex,
    flat_f16: FlatIndex,
    flat_i8: FlatIndex,
    /// `attention_f16` saved: the bytes every corruption test starts from.
    attention_bytes: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let data = ood(N, M, DIM, 5);
        let k16 = Arc::new(
            KeyStore::from_f16(data.keys.iter().map(|&x| f16::from_f32(x)).collect(), DIM)
                .expect("keys"),
        );
        let k32 = Arc::new(KeyStore::from_f32(data.keys.clone(), DIM).expect("keys"));
        let params = AttentionParams::default();
        let attention_f16 =
            AttentionIndex::build(k16.clone(), &data.train_queries, &params, &CpuKnn)
                .expect("build");
        let attention_f32 =
            AttentionIndex::build(k32, &data.train_queries, &params, &CpuKnn).expect("build");
        let k8 = Arc::new(KeyStore::quantize_i8(&data.keys, DIM).expect("keys"));
        let attention_i8 = AttentionIndex::build(k8.clone(), &data.train_queries, &params, &CpuKnn)
            .expect("build");
        let dir = tempdir();
        let path = dir.join("a.qki");
        attention_f16.save(&path).expect("save");
        let attention_bytes = std::fs::read(&path).expect("read");
        Fixture {
            queries: data.test_queries,
            attention_f16,
            attention_f32,
            attention_i8,
            flat_f16: FlatIndex::new(k16),
            flat_i8: FlatIndex::new(k8),
            attention_bytes,
        }
    })
}

fn tempdir() -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let i = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("qkindex-io-test-{}-{i}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tempdir");
    dir
}

fn search_all(index: &dyn AnnIndex, queries: &[f32]) -> Vec<SearchOutput> {
    let mut scratch = index.new_scratch();
    queries
        .chunks_exact(DIM)
        .map(|q| {
            index
                .search(q, K, &SearchParams::with_ef(32), &mut scratch)
                .expect("search")
        })
        .collect()
}

fn assert_mapped(index: &AnyIndex) {
    assert!(index.key_store().is_mapped(), "keys should be mapped");
    if let Some(a) = index.as_attention() {
        assert!(
            a.graph().expect("graph").is_mapped(),
            "graph should be mapped"
        );
    }
}

#[test]
fn round_trip_every_kind_gives_identical_results() {
    let f = fixture();
    let dir = tempdir();
    let kinds: [(&str, &dyn AnnIndex, &dyn io::Persist); 5] = [
        ("attention-f16", &f.attention_f16, &f.attention_f16),
        ("attention-f32", &f.attention_f32, &f.attention_f32),
        ("attention-i8", &f.attention_i8, &f.attention_i8),
        ("flat-f16", &f.flat_f16, &f.flat_f16),
        ("flat-i8", &f.flat_i8, &f.flat_i8),
    ];
    for (name, index, persist) in kinds {
        let path = dir.join(format!("{name}.qki"));
        persist
            .writer(io::KeysPlacement::Inline)
            .expect("writer")
            .write(&path)
            .expect("save");
        let before = search_all(index, &f.queries);
        for opts in [
            LoadOptions::default(),
            LoadOptions::no_verify(),
            LoadOptions::default().resident(),
            LoadOptions::no_verify().resident(),
        ] {
            let loaded = io::load(&path, &opts).expect("load");
            assert_mapped(&loaded);
            assert_eq!(loaded.kind(), index.kind(), "{name}");
            assert_eq!(search_all(&loaded, &f.queries), before, "{name} {opts:?}");
        }
        io::verify(&path).expect("verify");
    }
    // Scans and walks on codes: the codes are derived again at load, from the params in the
    // file, and give the same results.
    let data = ood(N, M, DIM, 5);
    let keys = f.flat_f16.keys().clone();
    let specs = [
        "flat:codes=i8",
        "flat:codes=i8,rerank=40",
        "flat:codes=i4",
        "ivf:codes=i8",
        "ivf:codes=i4",
        "attention:codes=i8-inline",
    ];
    for spec in specs {
        let built = spec
            .parse::<qkindex::IndexSpec>()
            .expect("spec")
            .build(keys.clone(), &data.train_queries, &CpuKnn)
            .expect("build");
        let path = dir.join(format!("{spec}.qki").replace([':', ',', '='], "-"));
        built.save(&path).expect("save");
        let before = search_all(&built, &f.queries);
        assert!(before.iter().all(|o| o.stats.code_estimates > 0), "{spec}");
        let loaded = io::load(&path, &LoadOptions::default()).expect("load");
        assert_eq!(search_all(&loaded, &f.queries), before, "{spec}");
        assert_eq!(loaded.memory_bytes(), built.memory_bytes(), "{spec}");
    }
    let loaded = io::load(dir.join("attention-f16.qki"), &LoadOptions::default()).expect("load");
    let a = loaded.as_attention().expect("attention");
    assert_eq!(
        a.graph().expect("graph"),
        f.attention_f16.graph().expect("graph")
    );
    assert_eq!(a.entries(), f.attention_f16.entries());
    assert_eq!(a.params(), f.attention_f16.params());
    assert!(loaded.as_flat().is_none());
}

#[test]
fn resident_load_owns_its_copy_of_the_file() {
    // A resident index reads the file once: rewriting the file in place afterwards (which a
    // mapping must never see) leaves its searches unchanged.
    let f = fixture();
    let path = tempdir().join("resident.qki");
    io::Persist::writer(&f.attention_f16, io::KeysPlacement::Inline)
        .expect("writer")
        .write(&path)
        .expect("save");
    let loaded = io::load(&path, &LoadOptions::default().resident()).expect("load");
    std::fs::write(&path, b"overwritten in place").expect("overwrite");
    assert_eq!(
        search_all(&loaded, &f.queries),
        search_all(&f.attention_f16, &f.queries)
    );
    assert!(io::load(&path, &LoadOptions::default().resident()).is_err());
}

#[test]
fn push_on_mapped_keys_copies_first() {
    let f = fixture();
    let dir = tempdir();
    let path = dir.join("flat.qki");
    f.flat_f16.save(&path).expect("save");
    let loaded = io::load(&path, &LoadOptions::default()).expect("load");
    let mut keys = (**loaded.key_store()).clone();
    assert!(keys.is_mapped());
    let id = keys.push(&[0.5; DIM]).expect("push");
    assert_eq!(id as usize, N);
    assert!(!keys.is_mapped());
    let mut row = [0.0; DIM];
    keys.row_into(3, &mut row);
    let mut orig = [0.0; DIM];
    f.flat_f16.keys().row_into(3, &mut orig);
    assert_eq!(row, orig);
}

#[test]
fn bundle_shares_keys_between_heads() {
    let f = fixture();
    let dir = tempdir().join("bundle");
    let mut w = BundleWriter::new(&dir).expect("bundle");
    let r = w.write_keys(9, 0, f.attention_f16.keys()).expect("keys");
    w.write_index(9, 0, 0, &f.attention_f16, &r).expect("index");
    w.write_index(9, 1, 0, &f.flat_f16, &r).expect("index");
    w.finish(serde_json::json!({"test": true})).expect("finish");

    let b = Bundle::open(&dir, &LoadOptions::default()).expect("open");
    let (a, fl) = (b.get(9, 0).expect("h0"), b.get(9, 1).expect("h1"));
    assert!(Arc::ptr_eq(a.key_store(), fl.key_store()), "one key store");
    assert_mapped(a);
    assert_eq!(
        search_all(a, &f.queries),
        search_all(&f.attention_f16, &f.queries)
    );
    assert_eq!(
        search_all(fl, &f.queries),
        search_all(&f.flat_f16, &f.queries)
    );
    // One index file opened on its own finds its key file beside it.
    let alone = io::load(dir.join("index-L09-h0.qki"), &LoadOptions::default()).expect("load");
    assert_eq!(
        search_all(&alone, &f.queries),
        search_all(&f.attention_f16, &f.queries)
    );
    let rep = io::verify(&dir).expect("verify bundle");
    assert_eq!(rep.files, 4);
    assert!(matches!(
        io::inspect(&dir).expect("inspect"),
        io::Inspection::Bundle { .. }
    ));

    // A key file replaced by other keys no longer matches the reference.
    let other = Arc::new(KeyStore::from_f32(vec![1.0; N * DIM], DIM).expect("keys"));
    let mut w2 = BundleWriter::new(&dir).expect("bundle");
    w2.write_keys(9, 0, &other).expect("keys");
    let err =
        io::load(dir.join("index-L09-h0.qki"), &LoadOptions::default()).expect_err("should fail");
    assert_format(&err, &dir.join("index-L09-h0.qki"), "keys_ref");
    let err = io::verify(&dir).expect_err("should fail");
    assert!(matches!(err, Error::Format { .. }), "{err}");
}

/// A writer that fails after `left` bytes.
struct FailAfter<'a> {
    inner: &'a mut dyn std::io::Write,
    left: usize,
}

impl std::io::Write for FailAfter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::other("injected failure"));
        }
        let n = buf.len().min(self.left);
        self.left -= n;
        self.inner.write(&buf[..n])
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[test]
fn failed_save_leaves_old_file_and_no_temp_file() {
    let f = fixture();
    let dir = tempdir();
    let path = dir.join("index.qki");
    f.flat_f16.save(&path).expect("save");
    let old = std::fs::read(&path).expect("read");
    let writer = io::Persist::writer(&f.attention_f16, io::KeysPlacement::Inline).expect("w");
    for cut in [0, 10, 64, 5000, f.attention_bytes.len() - 1] {
        let err = io::write_atomic(&path, |out| {
            writer.write_to(&mut FailAfter {
                inner: out,
                left: cut,
            })
        })
        .expect_err("should fail");
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert_eq!(std::fs::read(&path).expect("read"), old, "cut at {cut}");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("index.qki")]);
    }
    // And a save that completes replaces it.
    f.attention_f16.save(&path).expect("save");
    assert_eq!(std::fs::read(&path).expect("read"), f.attention_bytes);
}

fn assert_format(err: &Error, path: &Path, section: &str) {
    match err {
        Error::Format {
            path: p,
            section: s,
            reason,
        } => {
            assert_eq!(p, path, "path in {err}");
            assert_eq!(s, section, "section in {err} ({reason})");
        }
        other => panic!("expected a format error in {section}, got {other}"),
    }
}

/// Loads `bytes` written to a file (verified), expecting a format error in `section`.
fn expect_error(bytes: &[u8], section: &str) {
    let dir = tempdir();
    let path = dir.join("bad.qki");
    std::fs::write(&path, bytes).expect("write");
    let err = io::load(&path, &LoadOptions::default()).expect_err("should fail");
    assert_format(&err, &path, section);
    let err = io::verify(&path).expect_err("should fail");
    assert_format(&err, &path, section);
}

fn entries(bytes: &[u8]) -> Vec<format::SectionEntry> {
    RawFile::from_bytes(Path::new("x"), bytes)
        .expect("valid")
        .sections()
        .to_vec()
}

#[test]
fn truncation_at_every_section_boundary() {
    let b = &fixture().attention_bytes;
    // Inside the header and the table.
    expect_error(&b[..0], "header");
    expect_error(&b[..HEADER_LEN - 1], "header");
    expect_error(&b[..HEADER_LEN + ENTRY_LEN], "section table");
    for e in entries(b) {
        let name = e.kind.name();
        // Cut at the start, inside, and one byte before the end of each section.
        for cut in [e.offset, e.offset + e.len / 2, e.end() - 1] {
            expect_error(&b[..cut as usize], &name);
        }
    }
    // Appended bytes are also caught.
    let mut longer = b.clone();
    longer.extend_from_slice(&[0; 64]);
    expect_error(&longer, "header");
}

#[test]
fn flipped_byte_in_header_and_every_section() {
    let b = &fixture().attention_bytes;
    for at in [8usize, 12, 20, 24, 40, 60] {
        let mut c = b.clone();
        c[at] ^= 0x10;
        expect_error(&c, "header");
    }
    let mut c = b.clone();
    c[HEADER_LEN + 9] ^= 1;
    expect_error(&c, "section table");
    for e in entries(b) {
        for at in [e.offset, e.offset + e.len / 2, e.end() - 1] {
            let mut c = b.clone();
            c[at as usize] ^= 0x40;
            expect_error(&c, &e.kind.name());
        }
    }
    // Padding after the table is covered too (it must be zero).
    let first = entries(b)[0];
    let table_end = HEADER_LEN + entries(b).len() * ENTRY_LEN;
    if (first.offset as usize) > table_end {
        let mut c = b.clone();
        c[table_end] = 1;
        expect_error(&c, &first.kind.name());
    }
}

#[test]
fn unverified_open_then_verify_finds_the_damage() {
    let b = &fixture().attention_bytes;
    let e = entries(b)
        .into_iter()
        .find(|e| e.kind == SectionKind::KEYS)
        .expect("keys");
    let mut c = b.clone();
    c[e.offset as usize + 3] ^= 0x01;
    let dir = tempdir();
    let path = dir.join("damaged.qki");
    std::fs::write(&path, &c).expect("write");
    let idx = io::load(&path, &LoadOptions::no_verify()).expect("opens without verification");
    assert_eq!(idx.len(), N);
    assert_format(&io::verify(&path).expect_err("should fail"), &path, "keys");
}

fn set_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn wrong_magic_future_version_and_overflowing_counts() {
    let b = &fixture().attention_bytes;
    let mut c = b.clone();
    c[0] = b'X';
    expect_error(&c, "header");

    let mut c = b.clone();
    set_u32(&mut c, 8, io::FORMAT_VERSION + 1);
    format::reseal(&mut c);
    let path = tempdir().join("future.qki");
    std::fs::write(&path, &c).expect("write");
    let err = io::load(&path, &LoadOptions::default()).expect_err("should fail");
    assert_format(&err, &path, "header");
    let future = format!("version {}", io::FORMAT_VERSION + 1);
    assert!(err.to_string().contains(&future), "{err}");

    // n so large that n × d × 2 overflows, checksums made valid again.
    let mut c = b.clone();
    set_u64(&mut c, 24, u64::MAX / 4);
    format::reseal(&mut c);
    expect_error(&c, "header");
    // n in range but not matching the keys section.
    let mut c = b.clone();
    set_u64(&mut c, 24, (N + 1) as u64);
    format::reseal(&mut c);
    expect_error(&c, "keys");
    // d huge: n × d overflows the keys section.
    let mut c = b.clone();
    set_u32(&mut c, 20, u32::MAX);
    format::reseal(&mut c);
    expect_error(&c, "keys");
    // A section count past the cap, and one that runs the table past the file.
    let mut c = b.clone();
    set_u32(&mut c, 32, u32::MAX);
    format::reseal(&mut c);
    expect_error(&c, "section table");
    let mut c = b.clone();
    set_u32(&mut c, 32, 1000);
    format::reseal(&mut c);
    expect_error(&c, "section table");
    // A section length that overflows offset + len.
    let first = entries(b)[0];
    let mut c = b.clone();
    set_u64(&mut c, HEADER_LEN + 16, u64::MAX - 10);
    format::reseal(&mut c);
    expect_error(&c, &first.kind.name());
    // A misaligned offset.
    let mut c = b.clone();
    set_u64(&mut c, HEADER_LEN + 8, first.offset + 4);
    format::reseal(&mut c);
    expect_error(&c, &first.kind.name());
}

#[test]
fn ids_at_or_above_n_are_rejected() {
    let b = &fixture().attention_bytes;
    let es = entries(b);
    let nb = es
        .iter()
        .find(|e| e.kind == SectionKind::CSR_NEIGHBORS)
        .expect("neighbours");
    let mut c = b.clone();
    set_u32(&mut c, nb.offset as usize + 8, N as u32);
    format::reseal(&mut c);
    expect_error(&c, "csr_neighbors");

    // Unverified, the same file opens and searches without a panic or an out-of-range id.
    let idx = io::load_bytes(&c, "bad.qki", &LoadOptions::no_verify()).expect("opens");
    for out in search_all(&idx, &fixture().queries) {
        assert!(out.ids.iter().all(|&i| (i as usize) < N));
    }

    let ep = es
        .iter()
        .find(|e| e.kind == SectionKind::ENTRY_POINTS)
        .expect("entries");
    let mut c = b.clone();
    set_u32(&mut c, ep.offset as usize, u32::MAX);
    format::reseal(&mut c);
    expect_error(&c, "entry_points");

    // Offsets that decrease.
    let off = es
        .iter()
        .find(|e| e.kind == SectionKind::CSR_OFFSETS)
        .expect("offsets");
    let mut c = b.clone();
    set_u32(&mut c, off.offset as usize + 4 * 5, u32::MAX);
    format::reseal(&mut c);
    expect_error(&c, "csr_offsets");
    let idx = io::load_bytes(&c, "bad.qki", &LoadOptions::no_verify()).expect("opens");
    search_all(&idx, &fixture().queries);
}

#[test]
fn key_file_is_not_an_index_and_inspect_reports_sections() {
    let f = fixture();
    let dir = tempdir();
    let mut w = BundleWriter::new(&dir).expect("bundle");
    w.write_keys(2, 1, f.attention_f16.keys()).expect("keys");
    let path = dir.join("keys-L02-kv1.qki");
    assert_format(
        &io::load(&path, &LoadOptions::default()).expect_err("should fail"),
        &path,
        "header",
    );
    let keys = io::load_keys(&path, &LoadOptions::default()).expect("keys");
    assert_eq!(keys.len(), N);
    io::verify(&path).expect("verify key file");

    let apath = dir.join("a.qki");
    std::fs::write(&apath, &f.attention_bytes).expect("write");
    let io::Inspection::File(info) = io::inspect(&apath).expect("inspect") else {
        panic!("a file");
    };
    assert_eq!(info.kind, "attention");
    assert_eq!(info.n, N as u64);
    let names: Vec<_> = info.sections.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(
        names,
        [
            "keys",
            "csr_offsets",
            "csr_neighbors",
            "entry_points",
            "params"
        ]
    );
    assert_eq!(
        info.params.expect("params")["params"]["kq"],
        serde_json::json!(100)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random byte flips (raw, and with checksums made valid again) and truncations never
    /// panic; a file that still opens searches without panicking.
    #[test]
    fn random_damage_never_panics(
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..6),
        cut in proptest::option::of(any::<usize>()),
        reseal in any::<bool>(),
    ) {
        let mut c = fixture().attention_bytes.clone();
        for (at, x) in flips {
            let i = at % c.len();
            c[i] ^= x;
        }
        if let Some(cut) = cut {
            c.truncate(cut % c.len());
        }
        if reseal {
            format::reseal(&mut c);
        }
        for opts in [LoadOptions::default(), LoadOptions::no_verify()] {
            match io::load_bytes(&c, "fuzz.qki", &opts) {
                Ok(idx) => {
                    let mut scratch = idx.new_scratch();
                    let q = &fixture().queries[..DIM];
                    let _ = idx.search(q, K.min(idx.len()), &SearchParams::with_ef(32), &mut scratch);
                }
                Err(Error::Format { section, .. }) => prop_assert!(!section.is_empty()),
                Err(other) => prop_assert!(false, "unexpected error kind: {other}"),
            }
        }
    }
}

/// Int8 files: the keys section packs `d` offsets, `d` ranges, `n` scales, then the codes; a
/// version 1 header cannot declare int8, a bad offset or range fails the load, a non-finite
/// scale fails verification, a wrong length names the section.
#[test]
fn int8_keys_section_is_checked() {
    let f = fixture();
    let dir = tempdir();
    let path = dir.join("a8.qki");
    f.attention_i8.save(&path).expect("save");
    let b = std::fs::read(&path).expect("read");
    let loaded = io::load(&path, &LoadOptions::default()).expect("load");
    assert_eq!(loaded.key_store().dtype(), qkindex::Dtype::I8);
    assert_eq!(loaded.key_store().to_f32(), f.attention_i8.keys().to_f32());

    let mut c = b.clone();
    set_u32(&mut c, 8, 1);
    format::reseal(&mut c);
    expect_error(&c, "header");

    let keys = entries(&b)
        .into_iter()
        .find(|e| e.kind == SectionKind::KEYS)
        .expect("keys section");
    for (at, bad) in [(3, f32::NAN), (DIM + 2, 0.0), (DIM + 1, -1.0)] {
        let mut c = b.clone();
        let at = keys.offset as usize + 4 * at;
        c[at..at + 4].copy_from_slice(&bad.to_le_bytes());
        format::reseal(&mut c);
        expect_error(&c, "keys");
    }
    let mut c = b.clone();
    let at = keys.offset as usize + 4 * (2 * DIM + 3);
    c[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    format::reseal(&mut c);
    let bad = dir.join("nan-scale.qki");
    std::fs::write(&bad, &c).expect("write");
    assert!(io::load(&bad, &LoadOptions::no_verify()).is_ok());
    let err = io::verify(&bad).expect_err("NaN scale");
    assert_format(&err, &bad, "keys");
    assert!(err.to_string().contains("row 3"), "{err}");

    // d one larger: the section no longer holds n scales and n × d codes.
    let mut c = b.clone();
    set_u32(&mut c, 20, DIM as u32 + 1);
    format::reseal(&mut c);
    expect_error(&c, "keys");
}
