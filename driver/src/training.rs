//! What an index build reads from a dump, chosen alike by `qkindex bench` and `qkindex build`
//! (so that a bundle holds exactly what the bench measures): the layers and query heads, and
//! each head's training queries.

use anyhow::{bail, Context, Result};
use clap::Args;
use qkindex::dump::{Dump, HeadTensor, Manifest};
use std::path::PathBuf;

/// The dump flags of `qkindex bench` and `qkindex build`.
#[derive(Debug, Args)]
pub struct DumpInput {
    /// Dump directory (docs/DESIGN.md §4 layout).
    #[arg(long)]
    pub dump: PathBuf,
    /// Model layer numbers (default: all layers of the dump).
    #[arg(long, value_delimiter = ',')]
    pub layers: Vec<usize>,
    /// Query heads (default: all).
    #[arg(long, value_delimiter = ',')]
    pub heads: Vec<usize>,
    /// Train each head's index on its own prefill queries only (default: pool the queries of
    /// all query heads that share the KV head).
    #[arg(long)]
    pub no_pool: bool,
    /// Use at most this many training queries per index (evenly strided; 0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_train: usize,
}

impl DumpInput {
    /// The dump, and the layers and query heads to run ([`layers_and_heads`]).
    pub fn open(&self) -> Result<(Dump, Vec<usize>, Vec<usize>)> {
        let dump = Dump::open(&self.dump)
            .with_context(|| format!("opening dump {}", self.dump.display()))?;
        let (layers, heads) = layers_and_heads(&dump.manifest, &self.layers, &self.heads)?;
        Ok((dump, layers, heads))
    }

    /// The training queries of query head `h` ([`training_queries`] with these flags).
    pub fn training_queries(&self, q: &HeadTensor, h: usize, kv: usize, group: usize) -> Training {
        training_queries(q, h, kv, group, !self.no_pool, self.max_train)
    }
}

/// Training queries, and for each the number of keys its position could attend to (the
/// dump's keys are its prefill positions, so the query at position `t` sees `t + 1`).
#[derive(Debug)]
pub struct Training {
    /// Row-major f32, the dump's head dimension wide.
    pub rows: Vec<f32>,
    /// One count per row (read by causal builds: `attention:causal=true`).
    pub visible: Vec<u32>,
}

/// The layers and query heads a run covers: the given ones, or every one the dump has.
///
/// Errors: a query head the dump does not have.
fn layers_and_heads(
    m: &Manifest,
    layers: &[usize],
    heads: &[usize],
) -> Result<(Vec<usize>, Vec<usize>)> {
    let layers = if layers.is_empty() {
        m.layers.clone()
    } else {
        layers.to_vec()
    };
    let heads: Vec<usize> = if heads.is_empty() {
        (0..m.n_q_heads).collect()
    } else {
        heads.to_vec()
    };
    if let Some(h) = heads.iter().find(|&&h| h >= m.n_q_heads) {
        bail!(
            "query head {h} out of range (the dump has {} query heads)",
            m.n_q_heads
        );
    }
    Ok((layers, heads))
}

/// Training queries of query head `h`: its own prefill queries, or those of every query head
/// of its GQA group (`group` query heads per KV head `kv`) when `pool`, evenly strided down to
/// `max` rows (0: all).
fn training_queries(
    q: &HeadTensor,
    h: usize,
    kv: usize,
    group: usize,
    pool: bool,
    max: usize,
) -> Training {
    let heads: Vec<usize> = if pool {
        (kv * group..(kv + 1) * group).collect()
    } else {
        vec![h]
    };
    let d = q.dim;
    let mut out = Vec::with_capacity(heads.len() * q.rows * d);
    let mut visible = Vec::with_capacity(heads.len() * q.rows);
    for hh in heads {
        out.extend_from_slice(q.head(hh));
        visible.extend((1..=q.rows).map(|t| t as u32));
    }
    let rows = out.len() / d;
    if max > 0 && rows > max {
        let step = rows as f64 / max as f64;
        let pick: Vec<usize> = (0..max).map(|i| (i as f64 * step) as usize).collect();
        return Training {
            rows: pick
                .iter()
                .flat_map(|&r| out[r * d..(r + 1) * d].iter().copied())
                .collect(),
            visible: pick.iter().map(|&r| visible[r]).collect(),
        };
    }
    Training { rows: out, visible }
}
