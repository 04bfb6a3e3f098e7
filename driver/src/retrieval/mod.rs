//! Retrieval attention for decode steps (docs/DESIGN.md §2): per query head, a static set `S` (the
//! first `sink` positions and the last `window`) is attended exactly; a [`Selector`] picks `Ω`,
//! up to `k` keys from the rest `R` (positions `sink..n − window`); the two parts are merged
//! exactly ([`softmax::Partial`]).
//!
//! ```text
//!  PolicyConfig ──► selector::build (per layer × KV head in parallel, at the end of the prefill
//!    (policy.rs)      (build.rs): prefill keys, the GQA group's prefill queries, &dyn KnnBackend)
//!                         │
//!                         ▼ Box<dyn Selector>: static-only | scan | index | retopk
//!  decode step of one layer (step.rs), per KV head in parallel:
//!    upkeep ── keys leaving the window (with their guides) ──► Selector::upkeep
//!    select ── per query head ──► Selector::select ──► Selection (rest ids, inner products)
//!       │                                  └──► StepObserver (probes.rs; untimed, optional)
//!    attend ── static part (or the GPU's) + selected keys + sampled tail (tail.rs)
//!    merge ─── online-softmax merge (softmax.rs)
//!    measure ─ mass and recall against every key (stats.rs; untimed, optional)
//!    fold ──── counters into RetrievalStats (stats.rs)
//! ```
//!
//! | file | job |
//! |---|---|
//! | `policy.rs` | `PolicyKind`, `PolicyConfig`: which selector and its sizes |
//! | `selector/` | the `Selector` trait and one file per selector; the policy → selector factory |
//! | `shape.rs` | `Shape`: the attention shape served |
//! | `build.rs` | the end of the prefill: every (layer, KV head)'s selector, built in parallel |
//! | `step.rs` | `Retrieval`: per-head state and the decode step in phases (the `DecodeAttention` hook) |
//! | `guides.rs` | per window key, the query that guides its insertion when it leaves the window |
//! | `ids.rs` | `Pos`, `RestId` and the split of positions into sinks, rest and window |
//! | `stats.rs` | `RetrievalStats`, `ReTopKCounts`, `WiderRun`; measuring recall and mass |
//! | `probes.rs` | research re-searches behind a `StepObserver`, outside the timed step |
//! | `rest.rs` | the index over one KV head's rest (any kind; insertion or an exact tail) |
//! | `softmax.rs` | partial attention over a set of positions; the exact merge |
//! | `tail.rs` | the sampled estimate of the left-out keys' share |
//!
//! State is per layer and KV head: one selector over that head's rest, shared by the query
//! heads that read it (an index is built from all their prefill queries, as the benchmarks
//! measure it). When a key leaves the window it enters the selector, guided by the decode query
//! of the group that scored it highest while it was in the window (the query-aware insertion
//! of `qkindex::AttentionIndex::insert`).

mod build;
mod guides;
mod ids;
mod policy;
mod probes;
pub mod rest;
mod selector;
mod shape;
pub mod softmax;
mod stats;
mod step;
pub mod tail;

pub use build::cache_keys;
pub use ids::{Pos, RestId, Split};
pub use policy::{PolicyConfig, PolicyKind, DEFAULT_PATIENCE, DEFAULT_STEP_SEEDS};
pub use probes::{SeededProbe, SelectEvent, StepObserver, WIDER_EF};
pub use rest::RestIndex;
pub use selector::{build_tally, BuildTally, HeadPrefill, Selection, Selector};
pub use shape::Shape;
pub use stats::{ReTopKCounts, RetrievalStats, WiderRun};
pub use step::Retrieval;
