//! Edge pruning: how a node's ranked candidates are cut down to its out-edges. The attention
//! graph's build ([`crate::AttentionIndex::build`]) and its insertion
//! ([`crate::AttentionIndex::insert`]) both prune through [`prune`], so the two cannot drift
//! apart.

use crate::metric::{kernels, prefetch};

/// How a node's candidates are cut down to its out-edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prune {
    /// Keep the best-ranked candidates.
    Top,
    /// RNG-like occlusion with inner products: candidate `c` of `v` is dropped when an
    /// already-kept neighbour `s` has `s·c > v·c`.
    Occlusion,
    /// [`Prune::Occlusion`] first, then the free slots filled with the best-ranked of the
    /// candidates it dropped.
    OcclusionFill,
}

impl Prune {
    /// Every rule, in the order of the names.
    pub const ALL: [Prune; 3] = [Prune::Top, Prune::Occlusion, Prune::OcclusionFill];

    /// The rule's name (`top`, `occlusion`, `occlusion-fill`), as index specs and the command
    /// line spell it.
    pub fn name(self) -> &'static str {
        match self {
            Prune::Top => "top",
            Prune::Occlusion => "occlusion",
            Prune::OcclusionFill => "occlusion-fill",
        }
    }
}

impl std::fmt::Display for Prune {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Prune {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        Prune::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                crate::Error::invalid_param("prune", s, "expected top, occlusion or occlusion-fill")
            })
    }
}

/// How many candidates ahead the occlusion loop prefetches a row.
const PREFETCH_AHEAD: usize = 4;

/// The out-edges `rule` keeps of `cands` (ids, best-ranked first, without repeats and without
/// the node itself): at most `max` ids, in the order they are kept. `pivot` is the node's own
/// vector and `row(c)` candidate `c`'s (both `dim` values). Occlusion stops at `max` kept
/// candidates; with fill, the free slots then take the dropped ones in rank order. Candidates
/// are drawn one at a time (a few ahead, for the prefetch), so a lazily ordered iterator is
/// only ordered as far as the rule reads it.
pub fn prune<'a>(
    rule: Prune,
    pivot: &[f32],
    cands: impl IntoIterator<Item = u32>,
    max: usize,
    row: impl Fn(u32) -> &'a [f32],
) -> Vec<u32> {
    if rule == Prune::Top {
        return cands.into_iter().take(max).collect();
    }
    let dot = kernels().dot_f32;
    let mut kept: Vec<u32> = Vec::with_capacity(max);
    // The kept rows side by side, so that the occlusion tests read them from cache rather than
    // from wherever the key matrix holds them.
    let mut kept_rows: Vec<f32> = Vec::with_capacity(max * pivot.len());
    let mut dropped: Vec<u32> = Vec::new();
    // Candidates are rows scattered over the key matrix: each is asked for a few steps before
    // it is read.
    let mut cands = cands.into_iter();
    let mut ahead: std::collections::VecDeque<u32> = cands.by_ref().take(PREFETCH_AHEAD).collect();
    for &c in &ahead {
        prefetch(row(c));
    }
    while kept.len() < max {
        let Some(c) = ahead.pop_front() else {
            break;
        };
        if let Some(next) = cands.next() {
            prefetch(row(next));
            ahead.push_back(next);
        }
        let rc = row(c);
        let vc = dot(pivot, rc);
        let occluded = !pivot.is_empty()
            && !kept_rows
                .chunks_exact(pivot.len())
                .all(|s| dot(s, rc) <= vc);
        if occluded {
            dropped.push(c);
        } else {
            kept.push(c);
            kept_rows.extend_from_slice(rc);
        }
    }
    if rule == Prune::OcclusionFill {
        let room = max - kept.len();
        kept.extend(dropped.into_iter().take(room));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pivot is `(1, 0)`; 1 and 2 point almost the same way (2 is occluded by 1), 3 points
    /// elsewhere. Candidates come best-ranked first: 1, 2, 3.
    fn occluded_case(rule: Prune, max: usize) -> Vec<u32> {
        let keys = [1.0, 0.0, 1.0, 0.1, 1.0, 0.2, 0.5, -1.0];
        let row = |i: u32| &keys[i as usize * 2..i as usize * 2 + 2];
        prune(rule, row(0), [1, 2, 3], max, row)
    }

    #[test]
    fn occlusion_fill_keeps_the_diverse_edges_then_fills_by_rank() {
        assert_eq!(occluded_case(Prune::Top, 2), vec![1, 2]);
        assert_eq!(occluded_case(Prune::Occlusion, 3), vec![1, 3]);
        assert_eq!(occluded_case(Prune::OcclusionFill, 3), vec![1, 3, 2]);
        // With room for two, the occluded candidate is the one left out (Top would drop 3).
        assert_eq!(occluded_case(Prune::OcclusionFill, 2), vec![1, 3]);
        assert_eq!(occluded_case(Prune::OcclusionFill, 1), vec![1]);
    }

    #[test]
    fn names_round_trip() {
        // Spec strings and build-cache keys embed these names: `top` must stay `top`.
        assert_eq!(Prune::Top.to_string(), "top");
        assert_eq!(Prune::Occlusion.to_string(), "occlusion");
        assert_eq!(Prune::OcclusionFill.to_string(), "occlusion-fill");
        for p in Prune::ALL {
            assert_eq!(p.to_string().parse::<Prune>().expect("parses"), p);
        }
        assert!(matches!(
            "fill".parse::<Prune>(),
            Err(crate::Error::InvalidParam { name: "prune", .. })
        ));
    }
}
