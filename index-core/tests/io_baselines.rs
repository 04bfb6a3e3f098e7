//! Index files of the baseline kinds (HNSW, IVF, Vamana, RobustVamana; docs/FORMAT.md): round
//! trips with identical results and nothing copied, bundles, and the corruption matrix —
//! truncation at every section boundary, a flipped byte in each section, ids `≥ n`, offsets
//! out of order and overflowing counts, each a typed `Error::Format` naming the path and the
//! section, never a panic (and an unverified open of a damaged file still searches safely).

use half::f16;
use qkindex::io::bundle::{Bundle, BundleWriter};
use qkindex::io::format::{self, SectionEntry, SectionKind, ENTRY_LEN, HEADER_LEN};
use qkindex::io::{self, AnyIndex, KeysPlacement, LoadOptions, RawFile};
use qkindex::synth::ood;
use qkindex::{
    AnnIndex, CpuKnn, Error, HnswIndex, HnswParams, IvfIndex, IvfParams, KeyStore, SearchOutput,
    SearchParams, VamanaIndex, VamanaParams,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

const N: usize = 500;
const DIM: usize = 16;
const M: usize = 40;
const K: usize = 10;

struct Fixture {
    queries: Vec<f32>,
    keys16: Arc<KeyStore>,
    /// Name, index: every kind in f16 and f32 keys.
    indexes: Vec<(&'static str, AnyIndex)>,
    /// `(name, saved bytes)` of the f16 index of each kind: what corruption tests start from.
    bytes: Vec<(&'static str, Vec<u8>)>,
}

fn hnsw_params() -> HnswParams {
    // Small m so that 500 keys still get three or four levels above 0.
    HnswParams {
        m: 6,
        ef_construction: 40,
        ..HnswParams::default()
    }
}

fn vamana_params(robust: bool) -> VamanaParams {
    VamanaParams {
        r: 16,
        l: 32,
        robust,
        stitch_t: 8,
        ..VamanaParams::default()
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let data = ood(N, M, DIM, 7);
        let keys16 = Arc::new(
            KeyStore::from_f16(data.keys.iter().map(|&x| f16::from_f32(x)).collect(), DIM)
                .expect("keys"),
        );
        let keys32 = Arc::new(KeyStore::from_f32(data.keys.clone(), DIM).expect("keys"));
        let train = data.train_queries.as_slice();
        let mut indexes = Vec::new();
        for (suffix, keys) in [("f16", &keys16), ("f32", &keys32)] {
            let hnsw = HnswIndex::build(keys.clone(), &hnsw_params()).expect("hnsw");
            let hnsw_ip = HnswIndex::build(
                keys.clone(),
                &HnswParams {
                    l2_reduction: false,
                    ..hnsw_params()
                },
            )
            .expect("hnsw-ip");
            let ivf = IvfIndex::build(keys, &IvfParams::default()).expect("ivf");
            let vamana =
                VamanaIndex::build(keys.clone(), None, &vamana_params(false), &CpuKnn).expect("v");
            let robust =
                VamanaIndex::build(keys.clone(), Some(train), &vamana_params(true), &CpuKnn)
                    .expect("robust");
            let name = |k: &str| -> &'static str { format!("{k}-{suffix}").leak() };
            indexes.push((name("hnsw"), AnyIndex::Hnsw(hnsw)));
            indexes.push((name("hnsw-ip"), AnyIndex::Hnsw(hnsw_ip)));
            indexes.push((name("ivf"), AnyIndex::Ivf(ivf)));
            indexes.push((name("vamana"), AnyIndex::Vamana(vamana)));
            indexes.push((name("robust-vamana"), AnyIndex::Vamana(robust)));
        }
        let dir = tempdir();
        let bytes = ["hnsw-f16", "ivf-f16", "vamana-f16"]
            .into_iter()
            .map(|name| {
                let (_, idx) = indexes.iter().find(|(n, _)| *n == name).expect("kind");
                let path = dir.join(format!("{name}.qki"));
                idx.save(&path).expect("save");
                (name, std::fs::read(&path).expect("read"))
            })
            .collect();
        Fixture {
            queries: data.test_queries,
            keys16,
            indexes,
            bytes,
        }
    })
}

fn tempdir() -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let i = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("qkindex-io-baselines-{}-{i}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tempdir");
    dir
}

fn search_all(index: &dyn AnnIndex, queries: &[f32]) -> Vec<SearchOutput> {
    let mut scratch = index.new_scratch();
    let params = SearchParams {
        ef: Some(24),
        nprobe: Some(4),
        ..SearchParams::default()
    };
    queries
        .chunks_exact(DIM)
        .map(|q| index.search(q, K, &params, &mut scratch).expect("search"))
        .collect()
}

/// Every array of a loaded index borrows the mapping.
fn assert_mapped(name: &str, index: &AnyIndex) {
    assert!(
        index.key_store().is_mapped(),
        "{name}: keys should be mapped"
    );
    match index {
        AnyIndex::Hnsw(h) => {
            assert!(h.level0().is_mapped(), "{name}: level 0");
            assert!(
                !h.upper().is_empty(),
                "{name}: the fixture should have upper levels"
            );
            assert!(h.upper().is_mapped(), "{name}: upper");
        }
        AnyIndex::Ivf(i) => assert!(i.is_mapped(), "{name}: lists"),
        AnyIndex::Vamana(v) => assert!(v.graph().is_mapped(), "{name}: graph"),
        _ => panic!("{name}: unexpected kind"),
    }
}

/// The structure of `a` equals that of `b`, field by field.
fn assert_same_structure(name: &str, a: &AnyIndex, b: &AnyIndex) {
    match (a, b) {
        (AnyIndex::Hnsw(x), AnyIndex::Hnsw(y)) => {
            assert_eq!(x.level0(), y.level0(), "{name}");
            assert_eq!(x.upper(), y.upper(), "{name}");
            assert_eq!(x.entry(), y.entry(), "{name}");
            assert_eq!(x.params(), y.params(), "{name}");
            assert_eq!(x.search_overhead(), y.search_overhead(), "{name}");
        }
        (AnyIndex::Ivf(x), AnyIndex::Ivf(y)) => {
            assert_eq!(x.list_ids(), y.list_ids(), "{name}");
            assert_eq!(x.offsets(), y.offsets(), "{name}");
            assert_eq!(x.centroids().to_f32(), y.centroids().to_f32(), "{name}");
            assert_eq!(x.list_keys().to_f32(), y.list_keys().to_f32(), "{name}");
            assert_eq!(x.params(), y.params(), "{name}");
            assert_eq!(x.bytes(), y.bytes(), "{name}");
        }
        (AnyIndex::Vamana(x), AnyIndex::Vamana(y)) => {
            assert_eq!(x.graph(), y.graph(), "{name}");
            assert_eq!(x.medoid(), y.medoid(), "{name}");
            assert_eq!(x.params(), y.params(), "{name}");
        }
        _ => panic!("{name}: kinds differ"),
    }
}

#[test]
fn round_trip_every_baseline_kind_gives_identical_results() {
    let f = fixture();
    let dir = tempdir();
    for (name, index) in &f.indexes {
        let path = dir.join(format!("{name}.qki"));
        index.save(&path).expect("save");
        let before = search_all(index, &f.queries);
        assert!(before.iter().all(|o| o.ids.len() == K), "{name}");
        for opts in [LoadOptions::default(), LoadOptions::no_verify()] {
            let loaded = io::load(&path, &opts).expect("load");
            assert_mapped(name, &loaded);
            assert_eq!(loaded.kind(), index.kind(), "{name}");
            assert_eq!(loaded.len(), N, "{name}");
            assert_eq!(loaded.dim(), DIM, "{name}");
            assert_same_structure(name, &loaded, index);
            assert_eq!(search_all(&loaded, &f.queries), before, "{name} {opts:?}");
            // Full budgets stay exact after loading (IVF: every list; graphs: ef = n).
            let exact = SearchParams {
                ef: Some(N),
                nprobe: Some(N),
                ..SearchParams::default()
            };
            let q = &f.queries[..DIM];
            let mut s = loaded.new_scratch();
            let got = loaded.search(q, K, &exact, &mut s).expect("search");
            let want = index.search(q, K, &exact, &mut s).expect("search");
            assert_eq!(got, want, "{name}");
        }
        io::verify(&path).expect("verify");
        // The per-kind save writes the same bytes as AnyIndex::save.
        let again = dir.join(format!("{name}.again.qki"));
        match index {
            AnyIndex::Hnsw(h) => h.save(&again),
            AnyIndex::Ivf(i) => i.save(&again),
            AnyIndex::Vamana(v) => v.save(&again),
            _ => unreachable!(),
        }
        .expect("save");
        assert_eq!(
            std::fs::read(&again).expect("read"),
            std::fs::read(&path).expect("read"),
            "{name}"
        );
    }
}

#[test]
fn bundle_with_every_baseline_kind() {
    let f = fixture();
    let dir = tempdir();
    let mut w = BundleWriter::new(&dir).expect("bundle");
    let key_ref = w.write_keys(9, 0, &f.keys16).expect("keys");
    let f16: Vec<&(&str, AnyIndex)> = f
        .indexes
        .iter()
        .filter(|(n, _)| n.ends_with("f16"))
        .collect();
    for (head, (_, index)) in f16.iter().enumerate() {
        w.write_index(9, head, 0, index.as_persist(), &key_ref)
            .expect("write index");
    }
    w.finish(serde_json::json!({})).expect("finish");
    io::verify(&dir).expect("verify bundle");
    let b = Bundle::open(&dir, &LoadOptions::default()).expect("open");
    for (head, (name, index)) in f16.iter().enumerate() {
        let loaded = b.get(9, head).expect("index");
        assert_mapped(name, loaded);
        assert_eq!(
            search_all(loaded, &f.queries),
            search_all(index, &f.queries),
            "{name}"
        );
        let info = match io::inspect(dir.join(format!("index-L09-h{head}.qki"))).expect("inspect") {
            io::Inspection::File(i) => i,
            other => panic!("{other:?}"),
        };
        let kind = index.kind().name();
        assert_eq!(info.kind, kind);
        assert_eq!(info.params.as_ref().expect("params")["index"], kind);
        // Graph kinds share the key file; IVF scans its own list-ordered copy.
        if let AnyIndex::Ivf(_) = index {
            assert!(info.keys_ref.is_none());
            assert!(info.sections.iter().any(|s| s.kind == "ivf_list_keys"));
        } else {
            assert_eq!(
                info.keys_ref.as_ref().expect("keys_ref")["file"],
                "keys-L09-kv0.qki"
            );
        }
    }
    // The graph kinds of the bundle share one key store.
    let graphs: Vec<&Arc<KeyStore>> = b
        .indexes()
        .filter(|(_, i)| i.as_ivf().is_none())
        .map(|(_, i)| i.key_store())
        .collect();
    assert!(graphs.len() >= 4);
    assert!(graphs.windows(2).all(|w| Arc::ptr_eq(w[0], w[1])));
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

/// Loads `bytes` written to a file (verified, and through `verify`), expecting a format error
/// in `section`.
fn expect_error(kind: &str, bytes: &[u8], section: &str) {
    let dir = tempdir();
    let path = dir.join(format!("bad-{kind}.qki"));
    std::fs::write(&path, bytes).expect("write");
    let err = io::load(&path, &LoadOptions::default()).expect_err(kind);
    assert_format(&err, &path, section);
    let err = io::verify(&path).expect_err(kind);
    assert_format(&err, &path, section);
}

/// Opens `bytes` without verification and searches every test query: no panic, no id `≥ n`.
fn unverified_search_is_safe(bytes: &[u8]) {
    let idx = io::load_bytes(bytes, "bad.qki", &LoadOptions::no_verify()).expect("opens");
    for out in search_all(&idx, &fixture().queries) {
        assert!(out.ids.iter().all(|&i| (i as usize) < N), "{:?}", out.ids);
        assert!(out.ids.len() <= K);
    }
}

fn entries(bytes: &[u8]) -> Vec<SectionEntry> {
    RawFile::from_bytes(Path::new("x"), bytes)
        .expect("valid")
        .sections()
        .to_vec()
}

fn entry(bytes: &[u8], kind: SectionKind) -> SectionEntry {
    entries(bytes)
        .into_iter()
        .find(|e| e.kind == kind)
        .unwrap_or_else(|| panic!("no section {}", kind.name()))
}

fn set_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// `bytes` with the u32 at index `i` of section `kind` set to `v`, checksums made valid.
fn with_u32(bytes: &[u8], kind: SectionKind, i: usize, v: u32) -> Vec<u8> {
    let e = entry(bytes, kind);
    let mut c = bytes.to_vec();
    set_u32(&mut c, e.offset as usize + 4 * i, v);
    format::reseal(&mut c);
    c
}

#[test]
fn every_section_of_every_kind_is_present_as_documented() {
    let f = fixture();
    let names = |kind: &str| -> Vec<String> {
        let (_, b) = f.bytes.iter().find(|(n, _)| *n == kind).expect("kind");
        entries(b).iter().map(|e| e.kind.name()).collect()
    };
    assert_eq!(
        names("hnsw-f16"),
        [
            "keys",
            "csr_offsets",
            "csr_neighbors",
            "entry_points",
            "hnsw_level_starts",
            "hnsw_upper_nodes",
            "hnsw_upper_offsets",
            "hnsw_upper_neighbors",
            "params"
        ]
    );
    assert_eq!(
        names("ivf-f16"),
        [
            "ivf_list_keys",
            "ivf_centroids",
            "ivf_list_offsets",
            "ivf_list_ids",
            "params"
        ]
    );
    assert_eq!(
        names("vamana-f16"),
        [
            "keys",
            "csr_offsets",
            "csr_neighbors",
            "entry_points",
            "params"
        ]
    );
}

#[test]
fn truncation_at_every_section_boundary() {
    for (kind, b) in &fixture().bytes {
        expect_error(kind, &b[..HEADER_LEN - 1], "header");
        expect_error(kind, &b[..HEADER_LEN + ENTRY_LEN], "section table");
        for e in entries(b) {
            for cut in [e.offset, e.offset + e.len / 2, e.end() - 1] {
                expect_error(kind, &b[..cut as usize], &e.kind.name());
            }
        }
    }
}

#[test]
fn flipped_byte_in_every_section() {
    for (kind, b) in &fixture().bytes {
        for e in entries(b) {
            for at in [e.offset, e.offset + e.len / 2, e.end() - 1] {
                let mut c = b.clone();
                c[at as usize] ^= 0x40;
                expect_error(kind, &c, &e.kind.name());
            }
        }
    }
}

#[test]
fn graph_ids_at_or_above_n_and_bad_offsets() {
    let f = fixture();
    for kind in ["hnsw-f16", "vamana-f16"] {
        let (_, b) = f.bytes.iter().find(|(n, _)| *n == kind).expect("kind");
        let c = with_u32(b, SectionKind::CSR_NEIGHBORS, 3, N as u32);
        expect_error(kind, &c, "csr_neighbors");
        unverified_search_is_safe(&c);
        let c = with_u32(b, SectionKind::ENTRY_POINTS, 0, N as u32);
        expect_error(kind, &c, "entry_points");
        // Offsets that decrease, and a last offset that overflows the neighbour count.
        let c = with_u32(b, SectionKind::CSR_OFFSETS, 5, u32::MAX);
        expect_error(kind, &c, "csr_offsets");
        unverified_search_is_safe(&c);
        let c = with_u32(b, SectionKind::CSR_OFFSETS, N, u32::MAX);
        expect_error(kind, &c, "csr_offsets");
        // A header n that disagrees with the sections, and one whose n × d overflows.
        let mut c = b.clone();
        set_u64(&mut c, 24, (N + 1) as u64);
        format::reseal(&mut c);
        expect_error(kind, &c, "keys");
        let mut c = b.clone();
        set_u32(&mut c, 20, u32::MAX);
        format::reseal(&mut c);
        expect_error(kind, &c, "keys");
        // Parameters that do not parse, or name another kind.
        let p = entry(b, SectionKind::PARAMS);
        let mut c = b.clone();
        c[p.offset as usize] = b'[';
        format::reseal(&mut c);
        expect_error(kind, &c, "params");
    }
}

#[test]
fn hnsw_upper_levels_are_checked() {
    let f = fixture();
    let (kind, b) = &f.bytes[0];
    assert_eq!(*kind, "hnsw-f16");
    let hnsw = f.indexes[0].1.as_hnsw().expect("hnsw");
    let (levels, pairs) = (hnsw.upper().len(), hnsw.upper().nodes().len());
    assert!(levels >= 2, "the fixture should have several upper levels");
    // Neighbour ids at or above n.
    for (i, v) in [(0, N as u32), (1, u32::MAX)] {
        let c = with_u32(b, SectionKind::HNSW_UPPER_NEIGHBORS, i, v);
        expect_error(kind, &c, "hnsw_upper_neighbors");
        unverified_search_is_safe(&c);
    }
    // Node ids: at or above n, and out of order (binary search needs them increasing).
    let c = with_u32(b, SectionKind::HNSW_UPPER_NODES, 0, N as u32);
    expect_error(kind, &c, "hnsw_upper_nodes");
    unverified_search_is_safe(&c);
    let c = with_u32(b, SectionKind::HNSW_UPPER_NODES, 1, 0);
    expect_error(kind, &c, "hnsw_upper_nodes");
    unverified_search_is_safe(&c);
    // Offsets: not starting at 0, decreasing, a last offset past the ids.
    let c = with_u32(b, SectionKind::HNSW_UPPER_OFFSETS, 0, 1);
    expect_error(kind, &c, "hnsw_upper_offsets");
    let c = with_u32(b, SectionKind::HNSW_UPPER_OFFSETS, 7, u32::MAX);
    expect_error(kind, &c, "hnsw_upper_offsets");
    unverified_search_is_safe(&c);
    let c = with_u32(b, SectionKind::HNSW_UPPER_OFFSETS, pairs, u32::MAX);
    expect_error(kind, &c, "hnsw_upper_offsets");
    // Level starts: not from 0, not ending at the node count, decreasing (an overflowing
    // count: a level that claims more pairs than there are).
    let c = with_u32(b, SectionKind::HNSW_LEVEL_STARTS, 0, 1);
    expect_error(kind, &c, "hnsw_level_starts");
    let c = with_u32(b, SectionKind::HNSW_LEVEL_STARTS, levels, u32::MAX);
    expect_error(kind, &c, "hnsw_level_starts");
    let c = with_u32(b, SectionKind::HNSW_LEVEL_STARTS, 1, u32::MAX);
    expect_error(kind, &c, "hnsw_level_starts");
    unverified_search_is_safe(&c);
    // An offsets section whose length does not match the node count: found on open even
    // unverified (the tail it gives up becomes zero padding).
    let e = entry(b, SectionKind::HNSW_UPPER_OFFSETS);
    let i = entries(b)
        .iter()
        .position(|x| x.kind == e.kind)
        .expect("entry");
    let mut c = b.clone();
    set_u64(&mut c, HEADER_LEN + i * ENTRY_LEN + 16, e.len - 4);
    let tail = e.end() as usize - 4;
    c[tail..tail + 4].fill(0);
    format::reseal(&mut c);
    let err = io::load_bytes(&c, "short.qki", &LoadOptions::no_verify()).expect_err("bad count");
    assert_format(&err, Path::new("short.qki"), "hnsw_upper_offsets");
    expect_error(kind, &c, "hnsw_upper_offsets");
}

#[test]
fn ivf_lists_are_checked() {
    let f = fixture();
    let (kind, b) = f.bytes.iter().find(|(n, _)| *n == "ivf-f16").expect("ivf");
    let nlist = f
        .indexes
        .iter()
        .find_map(|(n, i)| (*n == "ivf-f16").then(|| i.as_ivf().expect("ivf").nlist()))
        .expect("ivf");
    // Ids out of range, and a duplicate (the map must be a permutation).
    let c = with_u32(b, SectionKind::IVF_LIST_IDS, 4, N as u32);
    expect_error(kind, &c, "ivf_list_ids");
    unverified_search_is_safe(&c);
    let e = entry(b, SectionKind::IVF_LIST_IDS);
    let first = u32::from_le_bytes(
        b[e.offset as usize..e.offset as usize + 4]
            .try_into()
            .expect("4 bytes"),
    );
    let c = with_u32(b, SectionKind::IVF_LIST_IDS, 1, first);
    expect_error(kind, &c, "ivf_list_ids");
    // Offsets: decreasing (searchable unverified), not starting at 0, not ending at n.
    let c = with_u32(b, SectionKind::IVF_LIST_OFFSETS, 3, u32::MAX);
    expect_error(kind, &c, "ivf_list_offsets");
    unverified_search_is_safe(&c);
    let c = with_u32(b, SectionKind::IVF_LIST_OFFSETS, 0, 1);
    expect_error(kind, &c, "ivf_list_offsets");
    let c = with_u32(b, SectionKind::IVF_LIST_OFFSETS, nlist, u32::MAX);
    expect_error(kind, &c, "ivf_list_offsets");
    // A NaN in the keys or the centroids.
    let e = entry(b, SectionKind::IVF_LIST_KEYS);
    let mut c = b.clone();
    c[e.offset as usize + 2..e.offset as usize + 4].copy_from_slice(&f16::NAN.to_le_bytes());
    format::reseal(&mut c);
    expect_error(kind, &c, "ivf_list_keys");
    let c = with_u32(b, SectionKind::IVF_CENTROIDS, 5, f32::NAN.to_bits());
    expect_error(kind, &c, "ivf_centroids");
    // Header counts: n that disagrees with the keys, n × d that overflows.
    let mut c = b.clone();
    set_u64(&mut c, 24, (N + 1) as u64);
    format::reseal(&mut c);
    expect_error(kind, &c, "ivf_list_keys");
    let mut c = b.clone();
    set_u32(&mut c, 20, u32::MAX);
    format::reseal(&mut c);
    expect_error(kind, &c, "ivf_list_keys");
    // A recorded nlist that disagrees with the centroids.
    let p = entry(b, SectionKind::PARAMS);
    let text = String::from_utf8(b[p.offset as usize..p.end() as usize].to_vec()).expect("utf8");
    let needle = format!("\"nlist\": {nlist}\n");
    assert!(text.contains(&needle), "{text}");
    // Same digit count, so the section keeps its length.
    let bad = text.replace(&needle, &format!("\"nlist\": {}\n", nlist - 1));
    assert_eq!(bad.len(), text.len(), "nlist {nlist}");
    let mut c = b.clone();
    c[p.offset as usize..p.end() as usize].copy_from_slice(bad.as_bytes());
    format::reseal(&mut c);
    expect_error(kind, &c, "params");
}

#[test]
fn ivf_never_writes_keys_or_keys_ref() {
    let f = fixture();
    let (_, ivf) = f
        .indexes
        .iter()
        .find(|(n, _)| *n == "ivf-f32")
        .expect("ivf");
    let r = io::KeyRef {
        file: "keys.qki".into(),
        checksum: "0".repeat(16),
        n: N as u64,
        d: DIM as u64,
        dtype: qkindex::Dtype::F32,
    };
    let mut inline = Vec::new();
    ivf.as_persist()
        .writer(KeysPlacement::Inline)
        .expect("writer")
        .write_to(&mut inline)
        .expect("write");
    let mut by_ref = Vec::new();
    ivf.as_persist()
        .writer(KeysPlacement::Ref(&r))
        .expect("writer")
        .write_to(&mut by_ref)
        .expect("write");
    assert_eq!(inline, by_ref);
}
