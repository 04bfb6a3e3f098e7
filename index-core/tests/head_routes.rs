//! Per-query-head routes of an `AttentionIndex` (`AttentionParams::head_scan`): the heads the
//! scan check gave the int8 scan answer exactly as `flat:codes=i8` over the same keys, the
//! others as the graph, through inserts and a file round trip.

use qkindex::attention::Codes;
use qkindex::io::{self, AnyIndex, LoadOptions};
use qkindex::synth::ood;
use qkindex::{
    AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, FlatParams, KeyStore, Scratch,
    SearchOutput, SearchParams,
};
use std::sync::Arc;

const DIM: usize = 16;

fn search(index: &dyn AnnIndex, q: &[f32], params: &SearchParams) -> SearchOutput {
    let mut scratch = Scratch::new(index.len());
    let mut out = SearchOutput::default();
    index
        .search_into(q, 10, params, &mut scratch, &mut out)
        .expect("search");
    out
}

fn head(h: usize) -> SearchParams {
    SearchParams {
        head: Some(h),
        ..SearchParams::default()
    }
}

/// Every routed head's answers (ids, scores and counts) equal the int8 scan's, the other
/// heads' equal the graph's before routing; a search naming no head walks the graph.
fn assert_routes(routed: &AttentionIndex, graph: &AttentionIndex, queries: &[f32]) {
    let scan = FlatIndex::with_params(
        routed.keys().clone(),
        &FlatParams {
            codes: Codes::I8,
            rerank: 0,
        },
    )
    .expect("scan");
    for q in queries.chunks_exact(DIM).take(12) {
        for (h, &scans) in routed.params().head_scan.iter().enumerate() {
            let got = search(routed, q, &head(h));
            let want = match scans {
                true => search(&scan, q, &SearchParams::default()),
                false => search(graph, q, &head(h)),
            };
            assert_eq!(got, want, "head {h} (scans: {scans})");
            assert_eq!(routed.head_scans(Some(h)), scans);
            if scans {
                assert_eq!(got.stats.code_estimates, routed.len() as u64);
            }
        }
        // A block of rows of several heads (the decode's `search_many`) answers each row as
        // its own search: the routed rows share one pass over the codes.
        let heads = [1, 0, 2, 1, 1];
        let block: Vec<f32> = heads.iter().flat_map(|_| q.iter().copied()).collect();
        let mut outs = vec![SearchOutput::default(); heads.len()];
        let mut scratch = routed.new_scratch();
        routed
            .search_rows(
                &block,
                10,
                &|r| head(heads[r]),
                &|_| &[],
                &mut scratch,
                &mut outs,
            )
            .expect("rows");
        for (&h, out) in heads.iter().zip(&outs) {
            assert_eq!(*out, search(routed, q, &head(h)), "row of head {h}");
        }
        let unnamed = search(routed, q, &SearchParams::default());
        assert_eq!(unnamed, search(graph, q, &SearchParams::default()));
        assert!(!routed.head_scans(None));
    }
}

#[test]
fn routed_heads_scan_and_the_others_walk_through_inserts_and_files() {
    let n = 500;
    let data = ood(n + 40, 64, DIM, 21);
    let keys = Arc::new(KeyStore::from_f32(data.keys[..n * DIM].to_vec(), DIM).expect("keys"));
    let params = AttentionParams {
        head_ef: vec![64, 96, 64],
        ..AttentionParams::default()
    };
    let mut graph = AttentionIndex::build(keys, &data.train_queries[..n * DIM], &params, &CpuKnn)
        .expect("build");
    let mut routed = graph.clone();
    routed.route_heads_to_scan(vec![false, true, false]);
    assert!(
        routed.memory_bytes() > graph.memory_bytes(),
        "the codes are held"
    );
    assert_routes(&routed, &graph, &data.test_queries);

    // Inserts keep the scan's codes in step with the keys.
    let mut scratch = Scratch::new(n + 40);
    for i in n..n + 40 {
        let key = &data.keys[i * DIM..(i + 1) * DIM];
        let guides = &data.train_queries[i * DIM..(i + 1) * DIM];
        let a = graph.insert(key, guides, &mut scratch).expect("insert");
        let b = routed.insert(key, guides, &mut scratch).expect("insert");
        assert_eq!(a, b);
    }
    assert_eq!(routed.len(), n + 40);
    assert_routes(&routed, &graph, &data.test_queries);

    // A file keeps the routes.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("routed.qki");
    routed.save(&path).expect("save");
    let AnyIndex::Attention(loaded) = io::load(&path, &LoadOptions::default()).expect("load")
    else {
        panic!("an attention index");
    };
    assert_eq!(loaded.params().head_scan, [false, true, false]);
    assert_routes(&loaded, &graph, &data.test_queries);

    // Routing no head (or clearing the routes) drops the codes: every head walks.
    routed.route_heads_to_scan(vec![false; 3]);
    assert_eq!(routed.memory_bytes(), graph.memory_bytes());
    assert_routes(&routed, &graph, &data.test_queries);
}
