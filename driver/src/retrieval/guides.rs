//! Guides of the query-aware insertion (`qkindex::AttentionIndex::insert`): while a key is in
//! the window, the query of its GQA group with the largest `q·k / |q|` is kept; when the key
//! leaves the window it enters the selector guided by that query.

use std::collections::VecDeque;

use super::ids::Split;
use super::selector::HeadPrefill;
use qkindex_model::{simd, ModelError};

/// A window key with the best query seen for it.
#[derive(Clone, Debug)]
struct Guide {
    score: f32,
    query: Vec<f32>,
}

impl Guide {
    fn none() -> Self {
        Guide {
            score: f32::NEG_INFINITY,
            query: Vec::new(),
        }
    }
}

/// One guide per key from the first not yet handed to the selector up to the last position.
#[derive(Clone, Debug, Default)]
pub(super) struct Guides {
    slots: VecDeque<Guide>,
}

impl Guides {
    /// Guides of the prefill's window keys: each key's best prefill query (at or after it) of
    /// the group; query norms computed once.
    pub fn from_prefill(prefill: &HeadPrefill<'_>) -> Result<Self, ModelError> {
        let (split, hd, group) = (prefill.split, prefill.head_dim, prefill.group);
        let mut span = Vec::with_capacity(split.window().len() * group);
        for t in split.window() {
            for j in 0..group {
                let qh = prefill.query(j, t)?;
                span.push((qh, inv_norm(qh)));
            }
        }
        let slots = split
            .window()
            .map(|p| {
                let key = &prefill.keys[p * hd..(p + 1) * hd];
                best_guide(key, &span[(p - split.end) * group..])
            })
            .collect();
        Ok(Guides { slots })
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Gives every position of `split` from `next` on a slot (new ones empty, filled by
    /// [`Guides::update`]).
    pub fn cover(&mut self, next: usize, split: Split) {
        while next + self.slots.len() < split.n {
            self.slots.push_back(Guide::none());
        }
    }

    /// The guide query of the oldest key (empty when none was kept).
    pub fn pop(&mut self) -> Vec<f32> {
        self.slots.pop_front().map(|g| g.query).unwrap_or_default()
    }

    /// Offers query `q` to the window's keys: `window_scores[i]` is its scaled score with the
    /// key of slot `i`.
    pub fn update(&mut self, q: &[f32], window_scores: &[f32]) {
        let inv = inv_norm(q);
        for (guide, &sc) in self.slots.iter_mut().zip(window_scores) {
            let c = sc * inv;
            if c > guide.score {
                guide.score = c;
                guide.query.clear();
                guide.query.extend_from_slice(q);
            }
        }
    }
}

/// The query (of those given with their inverse norms) with the largest `q·k / |q|`, and that
/// score.
fn best_guide(key: &[f32], queries: &[(&[f32], f32)]) -> Guide {
    let mut best = Guide::none();
    for &(q, inv) in queries {
        let s = simd::dot(q, key) * inv;
        if s > best.score {
            best.score = s;
            best.query = q.to_vec();
        }
    }
    best
}

/// `1 / |q|` (finite for a zero query).
fn inv_norm(q: &[f32]) -> f32 {
    1.0 / simd::dot(q, q).sqrt().max(f32::MIN_POSITIVE)
}
