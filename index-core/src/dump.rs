//! Reader of the dump layout (DESIGN.md §4): a manifest plus per-layer `.npy` tensors of
//! post-RoPE queries and keys, `[heads, tokens, head_dim]`, float16 or float32.

use crate::error::{Error, Result};
use crate::npy;
use crate::store::KeyStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The dump's `manifest.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub format: String,
    pub model: String,
    pub head_dim: usize,
    pub n_layers: usize,
    pub n_q_heads: usize,
    pub n_kv_heads: usize,
    pub layers: Vec<usize>,
    pub n_prefill: usize,
    pub n_decode: usize,
    pub rope_theta: f64,
    /// What text produced the dump (older dumps call it `text`).
    #[serde(alias = "text", default)]
    pub source: String,
}

impl Manifest {
    /// The KV head that query head `h` reads (GQA grouping).
    pub fn kv_head_of(&self, q_head: usize) -> usize {
        q_head / (self.n_q_heads / self.n_kv_heads).max(1)
    }
}

/// The inputs of one query head's searches ([`Dump::head_inputs`]).
#[derive(Clone, Debug)]
pub struct HeadInputs {
    /// The keys of its KV head, f16.
    pub keys: Arc<KeyStore>,
    /// The prefill queries of its GQA group, row-major.
    pub train: Vec<f32>,
    /// Its decode queries, row-major.
    pub decode: Vec<f32>,
}

/// A `[heads, rows, dim]` tensor, row-major f32.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadTensor {
    pub heads: usize,
    pub rows: usize,
    pub dim: usize,
    pub data: Vec<f32>,
}

impl HeadTensor {
    /// The `rows × dim` matrix of head `h`.
    pub fn head(&self, h: usize) -> &[f32] {
        &self.data[h * self.rows * self.dim..(h + 1) * self.rows * self.dim]
    }
}

/// Which tensor of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Prefill queries `[n_q_heads, n_prefill, d]`.
    Q,
    /// Prefill keys `[n_kv_heads, n_prefill, d]`.
    K,
    /// Prefill values `[n_kv_heads, n_prefill, d]`.
    V,
    /// Decode queries `[n_q_heads, n_decode, d]`.
    QDec,
    /// Decode (or held-out) keys `[n_kv_heads, n_decode, d]`.
    KDec,
    /// Decode values `[n_kv_heads, n_decode, d]`.
    VDec,
}

impl Part {
    fn suffix(self) -> &'static str {
        match self {
            Part::Q => "q",
            Part::K => "k",
            Part::V => "v",
            Part::QDec => "qdec",
            Part::KDec => "kdec",
            Part::VDec => "vdec",
        }
    }
}

/// An opened dump directory.
#[derive(Clone, Debug)]
pub struct Dump {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl Dump {
    /// Opens `dir` and validates its manifest.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| Error::format(&path, "manifest", e.to_string()))?;
        let bad = |reason: String| Error::format(&path, "manifest", reason);
        if !manifest.format.starts_with("qkindex-dump/") {
            return Err(bad(format!("unknown format {:?}", manifest.format)));
        }
        if manifest.head_dim == 0 || manifest.n_q_heads == 0 || manifest.n_kv_heads == 0 {
            return Err(bad(
                "head_dim, n_q_heads and n_kv_heads must be positive".into()
            ));
        }
        if !manifest.n_q_heads.is_multiple_of(manifest.n_kv_heads) {
            return Err(bad(format!(
                "n_q_heads ({}) is not a multiple of n_kv_heads ({})",
                manifest.n_q_heads, manifest.n_kv_heads
            )));
        }
        Ok(Dump { dir, manifest })
    }

    /// Path of one layer's tensor.
    pub fn path(&self, layer: usize, part: Part) -> PathBuf {
        self.dir
            .join(format!("layer{layer:02}.{}.npy", part.suffix()))
    }

    /// True when the layer's tensor file exists (values and decode keys are optional).
    pub fn has(&self, layer: usize, part: Part) -> bool {
        self.path(layer, part).is_file()
    }

    /// Reads one layer's tensor and checks its shape against the manifest.
    pub fn read(&self, layer: usize, part: Part) -> Result<HeadTensor> {
        let m = &self.manifest;
        if !m.layers.contains(&layer) {
            return Err(Error::invalid_param(
                "layer",
                layer,
                format!("not in the dump (layers {:?})", m.layers),
            ));
        }
        let path = self.path(layer, part);
        let a = npy::read_f32(&path)?;
        let heads = match part {
            Part::Q | Part::QDec => m.n_q_heads,
            _ => m.n_kv_heads,
        };
        // Keys (and values) may outnumber the prefill queries (`synth_ood.py --M-prefill`
        // subsamples the training queries of very large sets), never the reverse. Decode counts
        // may differ per tensor in older dumps: the file's count is taken.
        let (rows, at_least) = match part {
            Part::Q => (Some(m.n_prefill), false),
            Part::K | Part::V => (Some(m.n_prefill), true),
            _ => (None, false),
        };
        let ok = a.shape.len() == 3
            && a.shape[0] == heads
            && rows.is_none_or(|r| a.shape[1] == r || (at_least && a.shape[1] > r))
            && a.shape[2] == m.head_dim;
        if !ok {
            return Err(Error::format(
                &path,
                "shape",
                format!(
                    "expected [{heads}, {}{}, {}], found {:?}",
                    if at_least { "≥ " } else { "" },
                    rows.map_or("n".to_string(), |r| r.to_string()),
                    m.head_dim,
                    a.shape
                ),
            ));
        }
        if let Some(i) = a.data.iter().position(|x| !x.is_finite()) {
            return Err(Error::format(
                &path,
                "data",
                format!("non-finite value at flat index {i}"),
            ));
        }
        Ok(HeadTensor {
            heads,
            rows: a.shape[1],
            dim: m.head_dim,
            data: a.data,
        })
    }

    /// What a search of query head `head` at `layer` needs: the keys of its KV head (as f16,
    /// shared), the prefill queries of every query head reading that KV head (pooled,
    /// head-major: the training queries of its index) and its own decode queries.
    pub fn head_inputs(&self, layer: usize, head: usize) -> Result<HeadInputs> {
        let m = &self.manifest;
        if head >= m.n_q_heads {
            return Err(Error::invalid_param(
                "head",
                head,
                format!("the dump has {} query heads", m.n_q_heads),
            ));
        }
        let kv = m.kv_head_of(head);
        let (q, k, qdec) = (
            self.read(layer, Part::Q)?,
            self.read(layer, Part::K)?,
            self.read(layer, Part::QDec)?,
        );
        let keys = Arc::new(KeyStore::from_f16(
            k.head(kv).iter().map(|&x| half::f16::from_f32(x)).collect(),
            m.head_dim,
        )?);
        let group = m.n_q_heads / m.n_kv_heads;
        let train = (kv * group..(kv + 1) * group)
            .flat_map(|h| q.head(h).to_vec())
            .collect();
        Ok(HeadInputs {
            keys,
            train,
            decode: qdec.head(head).to_vec(),
        })
    }

    /// Reads an optional integer array at the dump's top level (for example `prompt_ids.npy`).
    pub fn read_ids(&self, name: &str) -> Result<Vec<i64>> {
        Ok(npy::read_i64(&self.dir.join(name))?.data)
    }
}
