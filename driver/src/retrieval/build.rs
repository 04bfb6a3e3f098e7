//! The end of the prefill: every (layer, KV head)'s selector built from its keys and its GQA
//! group's prefill queries, the builds in parallel; and the shapes they take.

use qkindex::KnnBackend;
use rayon::prelude::*;

use super::ids::Split;
use super::policy::PolicyConfig;
use super::selector::HeadPrefill;
use super::shape::Shape;
use qkindex_model::{KvCache, ModelError};

/// Keys of (layer, KV head) from a model's cache, as [`Retrieval::new`] takes them.
pub fn cache_keys(cache: &KvCache, head_dim: usize) -> impl Fn(usize, usize) -> Vec<f32> + '_ {
    move |layer, g| cache.keys(layer, g, head_dim).to_vec()
}

/// One layer as the prefill leaves it: how the decode step attends it, and for split layers
/// each KV head's state `H` (the step's `Head`, made by the `head` function of
/// [`build_layers`]: this file names no type of the step).
pub(super) enum Layer<H> {
    /// Attends every key (`dense_layers`): a score buffer per KV head.
    Dense(Vec<Vec<f32>>),
    /// A sliding-window layer the model attends itself (`local_layers`): never called.
    Local,
    /// Static set + selection, per KV head.
    Split(Vec<H>),
}

/// Each layer's state after a prefill of `n` positions (the arguments as
/// [`Retrieval::new`](super::Retrieval::new) takes them): `head(prefill)` per KV head (its
/// selector, built), or nothing for dense and local layers.
///
/// The (layer, KV head) builds run in parallel (rayon; each build is parallel inside as well,
/// but its connectivity pass and bookkeeping are sequential), so `progress` sees them in the
/// order they finish. Every build is deterministic: the result does not depend on that order.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_layers<H: Send>(
    cfg: &PolicyConfig,
    shape: Shape,
    keys_of: &(dyn Fn(usize, usize) -> Vec<f32> + Sync),
    n: usize,
    prefill_q: &[Vec<f32>],
    knn: &dyn KnnBackend,
    head: impl Fn(&HeadPrefill<'_>) -> Result<H, ModelError> + Sync,
    progress: impl FnMut(usize, usize) + Send,
) -> Result<Vec<Layer<H>>, ModelError> {
    let split = Split::at(n, cfg.sink, cfg.window);
    let progress = std::sync::Mutex::new(progress);
    let report = |layer: usize, g: usize| {
        if let Ok(mut p) = progress.lock() {
            p(layer, g);
        }
    };
    let jobs: Vec<(usize, usize)> = (0..shape.n_layers)
        .flat_map(|layer| (0..shape.n_kv_heads).map(move |g| (layer, g)))
        .collect();
    let built: Vec<Option<H>> = jobs
        .par_iter()
        .map(|&(layer, g)| {
            let head = if cfg.is_dense(layer) || cfg.is_local(layer) {
                None
            } else {
                let keys = keys_of(layer, g);
                let keys = keys.get(..n * shape.head_dim).ok_or_else(|| {
                    qkindex::Error::invalid_param("keys", keys.len(), "fewer than the prefill's")
                })?;
                let queries = prefill_q.get(layer).map(Vec::as_slice);
                let prefill = HeadPrefill::new(cfg, shape, (layer, g), split, keys, queries, knn);
                Some(head(&prefill)?)
            };
            report(layer, g);
            Ok(head)
        })
        .collect::<Result<_, ModelError>>()?;
    let mut built = built.into_iter();
    let layers = (0..shape.n_layers)
        .map(|layer| {
            let heads: Vec<H> = built.by_ref().take(shape.n_kv_heads).flatten().collect();
            if cfg.is_local(layer) {
                Layer::Local
            } else if cfg.is_dense(layer) {
                Layer::Dense(vec![Vec::new(); shape.n_kv_heads])
            } else {
                Layer::Split(heads)
            }
        })
        .collect();
    Ok(layers)
}
