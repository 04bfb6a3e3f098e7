//! Graph traversal on int8 key codes with an exact re-rank (issue 26).
//!
//! ```text
//!  query ──quantize──► QuantQuery ──beam_search_by(CodeScorer)──► best `rerank` by estimate
//!                                   (integer dot products, VNNI)          │
//!                                                                         ▼
//!            SearchOutput (exact scores, best first) ◄──top k── exact scores (Scorer, f16/f32)
//! ```
//!
//! The traversal reads `dim + 4` bytes per scored key instead of `2·dim` (f16) and scores it
//! with an integer kernel; only the final candidates are scored on the stored keys, so results
//! keep the contract of every search (exact scores of the store, best first). Stats count the
//! estimates in `code_estimates` and the exact products in `distance_computations`.

use super::inline::InlineCodes;
use super::search::{beam_search_by, walk, BeamSettings};
use super::Neighbors;
use crate::codes::{rerank_exact, KeyCodes, Width};
use crate::metric::int8::i8_kernels;
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::Scorer;

/// A beam search over `graph` ranked by code estimates of `codes`, then the best `rerank`
/// candidates (at least `settings.k`; `0` takes the whole list of `settings.ef`) scored exactly
/// with `exact`; writes the best `settings.k` of them into `out`, exact scores best first.
/// `out.stats.code_estimates` counts the estimates, `distance_computations` the exact products.
///
/// With `inline` (the blocks of `graph` made from `codes`), each expanded node's neighbours are
/// estimated from its block ([`InlineCodes`]), every one counted; else the walk gathers the codes
/// of the unvisited ones.
///
/// `codes` must code the keys `exact` scores (the same ids); ids at or beyond either are
/// skipped by the traversal as in [`super::beam_search`].
#[allow(clippy::too_many_arguments)]
pub fn search_codes<G: Neighbors + ?Sized>(
    graph: &G,
    codes: &KeyCodes,
    inline: Option<&InlineCodes>,
    exact: &Scorer<'_>,
    query: &[f32],
    entries: &[&[u32]],
    settings: &BeamSettings,
    rerank: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let mut quant = std::mem::take(&mut scratch.quant);
    codes.quantize_query_as(Width::I8, query, &mut quant);
    let candidates = if rerank == 0 { settings.ef } else { rerank }.max(settings.k);
    let traversal = BeamSettings {
        k: candidates,
        ..*settings
    };
    match inline {
        Some(inline) => walk(
            &inline.walk(codes, &quant),
            entries,
            &traversal,
            scratch,
            out,
        ),
        None => {
            let est = codes.scorer(&quant, i8_kernels());
            beam_search_by(graph, &est, entries, &traversal, scratch, out)
        }
    }
    scratch.quant = quant;
    rerank_exact(exact, query, settings.k, scratch, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{beam_search, Csr};
    use crate::store::KeyStore;

    #[test]
    fn codes_search_returns_exact_scores_best_first() {
        let data = crate::synth::ood(400, 4, 16, 3);
        let keys = KeyStore::from_f32(data.keys.clone(), 16).expect("keys");
        // A ring with chords: every node reachable.
        let lists: Vec<Vec<u32>> = (0..400u32)
            .map(|v| {
                vec![
                    (v + 1) % 400,
                    (v + 7) % 400,
                    (v + 53) % 400,
                    (v + 399) % 400,
                ]
            })
            .collect();
        let g = Csr::from_lists(&lists).expect("csr");
        let codes = KeyCodes::new(&keys);
        assert_eq!((codes.len(), codes.bytes()), (400, 400 * 20 + 8 * 16));
        let scorer = keys.scorer();
        let mut scratch = Scratch::new(400);
        let (mut out, mut plain) = (SearchOutput::default(), SearchOutput::default());
        let q = &data.test_queries[..16];
        let settings = BeamSettings::new(400, 10);
        let inline = InlineCodes::new(&g, &codes);
        beam_search(&g, &scorer, q, &[&[0]], &settings, &mut scratch, &mut plain);
        for layout in [None, Some(&inline)] {
            search_codes(
                &g,
                &codes,
                layout,
                &scorer,
                q,
                &[&[0]],
                &settings,
                0,
                &mut scratch,
                &mut out,
            );
            // ef = n: every key is estimated and re-ranked, so the result is the exact top-10.
            assert_eq!(out.ids, plain.ids);
            assert_eq!(out.scores, plain.scores);
            assert_eq!(out.stats.distance_computations, 400);
            for (&id, &s) in out.ids.iter().zip(&out.scores) {
                assert_eq!(s.to_bits(), scorer.score(q, id).to_bits());
            }
            // The gather walk estimates each key once; the inline walk estimates every
            // neighbour of every expanded node.
            match layout {
                None => assert_eq!(out.stats.code_estimates, 400),
                Some(_) => assert!(out.stats.code_estimates >= 399),
            }
            // A re-rank of 20 scores 20 keys exactly.
            search_codes(
                &g,
                &codes,
                layout,
                &scorer,
                q,
                &[&[0]],
                &settings,
                20,
                &mut scratch,
                &mut out,
            );
            assert_eq!(out.stats.distance_computations, 20);
            assert!(out.scores.windows(2).all(|w| w[0] >= w[1]));
        }
    }
}
