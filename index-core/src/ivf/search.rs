//! The search of [`IvfIndex`]: every centroid scored, the `nprobe` best lists scanned on the
//! keys (or on their codes, then the best candidates re-ranked on the keys).

use super::IvfIndex;
use crate::codes::rerank_exact;
use crate::error::{at_least_one, Result};
use crate::scratch::Scratch;
use crate::search::{check_query, AnnIndex, IndexKind, SearchOutput, SearchParams, SearchStats};

/// Keys scored per kernel call when scanning a list.
const CHUNK: usize = 512;

impl AnnIndex for IvfIndex {
    fn kind(&self) -> IndexKind {
        IndexKind::Ivf
    }

    fn len(&self) -> usize {
        self.ids.as_slice().len()
    }

    fn dim(&self) -> usize {
        self.dim
    }

    /// Reads `params.nprobe` (`ef` does not apply and is ignored, and so are seeds).
    fn memory_bytes(&self) -> usize {
        self.bytes()
    }

    fn search_seeded(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        _seeds: &[u32],
        scratch: &mut Scratch,
        out: &mut SearchOutput,
    ) -> Result<()> {
        let (key_ids, offsets) = (self.ids.as_slice(), self.offsets.as_slice());
        let n = key_ids.len();
        check_query(query, self.dim, k, n)?;
        let nprobe = params.nprobe.unwrap_or(self.params.default_nprobe);
        at_least_one("nprobe", nprobe)?;
        let nlist = self.nlist();
        let nprobe = nprobe.min(nlist);
        out.clear();
        let Scratch {
            best,
            ids,
            scores,
            query: query_buf,
            ..
        } = scratch;
        if scores.len() < nlist + CHUNK {
            scores.resize(nlist + CHUNK, 0.0);
        }
        let (centroid_scores, buf) = scores.split_at_mut(nlist);
        self.centroids
            .scorer()
            .score_range(query, 0, centroid_scores);
        // The nprobe best lists, best first (out.scores is a spare buffer until the end).
        best.reset(nprobe);
        best.push_block(centroid_scores, 0);
        ids.clear();
        best.drain_sorted(ids, &mut out.scores);
        out.scores.clear();

        let lists = self.lists.scorer();
        if let Some(codes) = &self.codes {
            let default = if self.params.rerank == 0 {
                k + k / 4
            } else {
                self.params.rerank
            };
            let candidates = params.ef.unwrap_or(default).max(k);
            let probe = std::mem::take(ids);
            let estimates =
                codes.candidates(query, &probe, offsets, candidates, scratch, &mut out.ids);
            scratch.ids = probe;
            out.stats.distance_computations = estimates as u64;
            rerank_exact(&lists, query, k, scratch, out);
            out.stats.distance_computations += nlist as u64;
            for id in out.ids.iter_mut() {
                *id = key_ids.get(*id as usize).copied().unwrap_or(u32::MAX);
            }
            drop_damaged(n, out);
            return Ok(());
        }
        let scorer = lists.bind(query, query_buf);
        best.reset(k);
        let mut scanned = 0usize;
        for &l in ids.iter() {
            // Clamped so that the offsets of an unverified, damaged file cannot make the scan
            // leave the keys (valid offsets are unchanged by this).
            let e = (offsets.get(l as usize + 1).copied().unwrap_or(0) as usize).min(n);
            let s = (offsets.get(l as usize).copied().unwrap_or(0) as usize).min(e);
            scanned += e - s;
            let mut p = s;
            while p < e {
                let len = CHUNK.min(e - p);
                let chunk = &mut buf[..len];
                scorer.score_range(p, chunk);
                best.push_block(chunk, p as u32);
                p += len;
            }
        }
        best.drain_sorted(&mut out.ids, &mut out.scores);
        for id in out.ids.iter_mut() {
            *id = key_ids.get(*id as usize).copied().unwrap_or(u32::MAX);
        }
        drop_damaged(n, out);
        out.stats = SearchStats {
            distance_computations: (nlist + scanned) as u64,
            hops: 0,
            ..Default::default()
        };
        Ok(())
    }
}

/// Drops ids `≥ n` from `out`: only an unverified, damaged id map holds them (docs/FORMAT.md).
fn drop_damaged(n: usize, out: &mut SearchOutput) {
    if out.ids.iter().any(|&id| id as usize >= n) {
        let mut kept = 0;
        for i in 0..out.ids.len() {
            if (out.ids[i] as usize) < n {
                out.ids[kept] = out.ids[i];
                out.scores[kept] = out.scores[i];
                kept += 1;
            }
        }
        out.ids.truncate(kept);
        out.scores.truncate(kept);
    }
}
