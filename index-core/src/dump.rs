//! Reader of the dump layout (DESIGN.md §4): a manifest plus per-layer `.npy` tensors of
//! post-RoPE queries and keys, `[heads, tokens, head_dim]`, float16 or float32. A dump is read
//! from its directory ([`Dump::open`], [`Dump::read`]) or, with the same checks, from the bytes
//! of its files held in memory ([`Manifest::from_json`], [`Dump::parse`]).

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
    /// Parses and validates the text of a `manifest.json`; `path` names it in errors.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let manifest: Manifest = serde_json::from_str(text)
            .map_err(|e| Error::format(path, "manifest", e.to_string()))?;
        let bad = |reason: String| Error::format(path, "manifest", reason);
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
        Ok(manifest)
    }

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
        let manifest = Manifest::from_json(&path, &text)?;
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
        self.check_layer(layer)?;
        let path = self.path(layer, part);
        let a = npy::read_f32(&path)?;
        self.tensor(&path, part, a)
    }

    /// [`Dump::read`] of the tensor file's bytes held in memory (named in errors by
    /// [`Dump::path`]): the same checks, no file is opened.
    pub fn parse(&self, layer: usize, part: Part, bytes: &[u8]) -> Result<HeadTensor> {
        self.check_layer(layer)?;
        let path = self.path(layer, part);
        let a = npy::parse_f32(&path, bytes)?;
        self.tensor(&path, part, a)
    }

    fn check_layer(&self, layer: usize) -> Result<()> {
        let m = &self.manifest;
        if !m.layers.contains(&layer) {
            return Err(Error::invalid_param(
                "layer",
                layer,
                format!("not in the dump (layers {:?})", m.layers),
            ));
        }
        Ok(())
    }

    /// The array `a` read from `path` as the `part` tensor, its shape checked against the
    /// manifest and its values checked finite.
    fn tensor(&self, path: &Path, part: Part, a: npy::Array<f32>) -> Result<HeadTensor> {
        let m = &self.manifest;
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
                path,
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
                path,
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
        self.check_head(head)?;
        let (q, k, qdec) = (
            self.read(layer, Part::Q)?,
            self.read(layer, Part::K)?,
            self.read(layer, Part::QDec)?,
        );
        self.inputs_of(head, &q, &k, &qdec)
    }

    /// [`Dump::head_inputs`] of the bytes of the layer's `q`, `k` and `qdec` files held in
    /// memory ([`Dump::parse`]).
    pub fn parse_head_inputs(
        &self,
        layer: usize,
        head: usize,
        [q, k, qdec]: [&[u8]; 3],
    ) -> Result<HeadInputs> {
        self.check_head(head)?;
        let (q, k, qdec) = (
            self.parse(layer, Part::Q, q)?,
            self.parse(layer, Part::K, k)?,
            self.parse(layer, Part::QDec, qdec)?,
        );
        self.inputs_of(head, &q, &k, &qdec)
    }

    fn check_head(&self, head: usize) -> Result<()> {
        let m = &self.manifest;
        if head >= m.n_q_heads {
            return Err(Error::invalid_param(
                "head",
                head,
                format!("the dump has {} query heads", m.n_q_heads),
            ));
        }
        Ok(())
    }

    /// Head `head`'s inputs from its layer's tensors, as read by [`Dump::read`] (whose shapes
    /// match the manifest).
    fn inputs_of(
        &self,
        head: usize,
        q: &HeadTensor,
        k: &HeadTensor,
        qdec: &HeadTensor,
    ) -> Result<HeadInputs> {
        let m = &self.manifest;
        let kv = m.kv_head_of(head);
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

    /// [`Dump::read_ids`] of the file's bytes held in memory.
    pub fn parse_ids(&self, name: &str, bytes: &[u8]) -> Result<Vec<i64>> {
        Ok(npy::parse_i64(&self.dir.join(name), bytes)?.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"{"format": "qkindex-dump/1", "model": "tiny", "head_dim": 4,
        "n_layers": 2, "n_q_heads": 4, "n_kv_heads": 2, "layers": [1], "n_prefill": 3,
        "n_decode": 2, "rope_theta": 10000.0, "text": "unit test"}"#;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("qkindex-dump-unit-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create temp dir");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn ramp(n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * scale).sin()).collect()
    }

    /// A dump of [`MANIFEST`] written to a temp dir: layer 1, q/k/qdec (f16 keys, f32 queries).
    fn write_dump(dir: &Path) -> Dump {
        std::fs::write(dir.join("manifest.json"), MANIFEST).expect("manifest");
        let d = Dump::open(dir).expect("open");
        npy::write_f32(&d.path(1, Part::Q), &[4, 3, 4], &ramp(48, 0.3)).expect("q");
        npy::write_f16(&d.path(1, Part::K), &[2, 5, 4], &ramp(40, 0.7)).expect("k");
        npy::write_f32(&d.path(1, Part::QDec), &[4, 2, 4], &ramp(32, 1.1)).expect("qdec");
        npy::write_i64(&dir.join("prompt_ids.npy"), &[3], &[7, 8, 9]).expect("ids");
        d
    }

    fn bytes(d: &Dump, part: Part) -> Vec<u8> {
        std::fs::read(d.path(1, part)).expect("read back")
    }

    #[test]
    fn in_memory_reads_equal_file_reads() {
        let tmp = TempDir::new("equal");
        let d = write_dump(&tmp.0);
        let m = Manifest::from_json(Path::new("m.json"), MANIFEST).expect("manifest");
        assert_eq!(m, d.manifest);
        for part in [Part::Q, Part::K, Part::QDec] {
            let from_file = d.read(1, part).expect("read");
            assert_eq!(
                d.parse(1, part, &bytes(&d, part)).expect("parse"),
                from_file
            );
        }
        let (q, k, qdec) = (
            bytes(&d, Part::Q),
            bytes(&d, Part::K),
            bytes(&d, Part::QDec),
        );
        for head in 0..4 {
            let a = d.head_inputs(1, head).expect("head inputs");
            let b = d
                .parse_head_inputs(1, head, [&q, &k, &qdec])
                .expect("parsed head inputs");
            assert_eq!((a.train, a.decode), (b.train, b.decode), "head {head}");
            assert_eq!(a.keys.len(), b.keys.len());
        }
        let ids = std::fs::read(tmp.0.join("prompt_ids.npy")).expect("ids bytes");
        assert_eq!(
            d.parse_ids("prompt_ids.npy", &ids).expect("ids"),
            vec![7, 8, 9]
        );
        assert_eq!(d.read_ids("prompt_ids.npy").expect("ids"), vec![7, 8, 9]);
    }

    #[test]
    fn in_memory_errors_equal_file_errors() {
        let tmp = TempDir::new("errors");
        let d = write_dump(&tmp.0);
        // The wrong layer, a head past the last, the keys given as the queries, cut bytes.
        let (q, k) = (bytes(&d, Part::Q), bytes(&d, Part::K));
        assert!(matches!(
            d.parse(0, Part::Q, &q),
            Err(Error::InvalidParam { .. })
        ));
        assert!(matches!(
            d.parse_head_inputs(1, 4, [&q, &k, &q]),
            Err(Error::InvalidParam { .. })
        ));
        let e = d.parse(1, Part::Q, &k).expect_err("keys as queries");
        assert!(
            matches!(&e, Error::Format { section, .. } if section == "shape"),
            "{e}"
        );
        for cut in [0, 5, 20, q.len() - 1] {
            let e = d.parse(1, Part::Q, &q[..cut]).expect_err("cut");
            assert!(matches!(e, Error::Format { .. }), "cut at {cut}: {e}");
            std::fs::write(d.path(1, Part::Q), &q[..cut]).expect("write cut");
            let f = d.read(1, Part::Q).expect_err("cut file");
            assert_eq!(e.to_string(), f.to_string(), "cut at {cut}");
        }
        for bad in [
            "",
            "{}",
            &MANIFEST.replace("qkindex-dump/1", "other/1"),
            &MANIFEST.replace("\"head_dim\": 4", "\"head_dim\": 0"),
            &MANIFEST.replace("\"n_kv_heads\": 2", "\"n_kv_heads\": 3"),
        ] {
            let e = Manifest::from_json(Path::new("m.json"), bad).expect_err(bad);
            assert!(matches!(e, Error::Format { .. }), "{bad}: {e}");
        }
    }
}
