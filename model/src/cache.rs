//! The KV cache of a sequence: the host copy every backend keeps canonical.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::config::Heads;

/// The element type exact attention reads keys and values in on the CPU.
///
/// `F16` keeps a half-precision copy of every layer beside the f32 cache (policies, captures and
/// indexes still read f32): a decode step's exact attention streams half the bytes (it is
/// memory-bound: SmolLM2 at 8K reads 377 MB of f32 keys and values per token), as llama.cpp's
/// default f16 cache does. The cost is half again the cache's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    F32,
    F16,
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(format!("unknown KV cache type {s:?}: f32 or f16")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}

/// The KV cache of a sequence: per layer, `n_kv_heads` blocks of row-major `rows × head_dim`
/// keys (post-RoPE) and values, `rows` = `capacity` for a layer that keeps every position.
///
/// A sliding-window layer of `w` keys may keep only its window ([`KvCache::windowed`]): its
/// blocks hold `w − 1 + max_call` rows, positions `first_position(layer)..len()`, and a write
/// that would overflow them first moves the last `w − 1` positions to the front. Gemma 3 at
/// 131,072 positions: 15 local layers × 2,559 rows instead of 131,072 (4.0 GiB of f32 keys and
/// values down to 79 MB).
///
/// This host copy is the canonical cache on every backend (policies and captures read it); a GPU
/// backend mirrors it on the device and tells caches apart by [`KvCache::id`], which every new
/// cache and every clone gets afresh. GPU backends take caches that keep every position.
#[derive(Debug)]
pub struct KvCache {
    id: u64,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// The f16 copy of `k` and `v`, same layout ([`KvDtype::F16`]); empty otherwise.
    k16: Vec<Vec<f16>>,
    v16: Vec<Vec<f16>>,
    /// Per layer: `Some(w)` where the layer keeps only its window of `w` keys.
    windows: Vec<Option<usize>>,
    /// Per layer: the rows of each KV head's block.
    rows: Vec<usize>,
    /// Per layer: the position of row 0 (0 for a layer that keeps every position).
    first: Vec<usize>,
}

fn next_cache_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Clone for KvCache {
    fn clone(&self) -> Self {
        KvCache {
            id: next_cache_id(),
            capacity: self.capacity,
            len: self.len,
            k: self.k.clone(),
            v: self.v.clone(),
            k16: self.k16.clone(),
            v16: self.v16.clone(),
            windows: self.windows.clone(),
            rows: self.rows.clone(),
            first: self.first.clone(),
        }
    }
}

impl KvCache {
    /// A cache of `n_layers` layers, `n_kv_heads` heads, room for `capacity` positions, empty.
    #[cfg(test)]
    pub(crate) fn zeroed(n_layers: usize, n_kv_heads: usize, capacity: usize, hd: usize) -> Self {
        Self::windowed(&vec![None; n_layers], n_kv_heads, capacity, hd, 0)
    }

    /// A cache whose layer `l` keeps only its window where `windows[l]` is `Some(w)`, for
    /// forward calls of at most `max_call` rows: `w − 1 + max_call` rows (at most `capacity`).
    pub(crate) fn windowed(
        windows: &[Option<usize>],
        n_kv_heads: usize,
        capacity: usize,
        hd: usize,
        max_call: usize,
    ) -> Self {
        let rows: Vec<usize> = windows
            .iter()
            .map(|w| w.map_or(capacity, |w| (w.saturating_sub(1) + max_call).min(capacity)))
            .collect();
        let windows = windows
            .iter()
            .zip(&rows)
            .map(|(&w, &r)| w.filter(|_| r < capacity))
            .collect();
        let blocks = || {
            rows.iter()
                .map(|&r| vec![0f32; n_kv_heads * r * hd])
                .collect()
        };
        KvCache {
            id: next_cache_id(),
            capacity,
            len: 0,
            k: blocks(),
            v: blocks(),
            k16: Vec::new(),
            v16: Vec::new(),
            windows,
            first: vec![0; rows.len()],
            rows,
        }
    }

    /// The same cache keeping an f16 copy of its keys and values from now on (those already
    /// written converted), for exact attention ([`KvDtype::F16`]).
    pub(crate) fn with_f16_copy(mut self) -> Self {
        let half = |blocks: &[Vec<f32>]| -> Vec<Vec<f16>> {
            blocks
                .iter()
                .map(|b| b.iter().map(|&x| f16::from_f32(x)).collect())
                .collect()
        };
        self.k16 = half(&self.k);
        self.v16 = half(&self.v);
        self
    }

    /// The element type exact attention reads ([`KvCache::layer_f16`] when `F16`).
    pub fn dtype(&self) -> KvDtype {
        if self.k16.is_empty() {
            KvDtype::F32
        } else {
            KvDtype::F16
        }
    }

    /// The f16 copy of [`KvCache::layer`] (same layout), where the cache keeps one.
    pub fn layer_f16(&self, layer: usize) -> Option<(&[f16], &[f16])> {
        Some((self.k16.get(layer)?, self.v16.get(layer)?))
    }

    /// The rows of each KV head's block of `layer` (`capacity` unless the layer keeps only its
    /// window).
    pub fn layer_rows(&self, layer: usize) -> usize {
        self.rows[layer]
    }

    /// The position of row 0 of `layer` (0 unless the layer keeps only its window).
    pub fn first_position(&self, layer: usize) -> usize {
        self.first[layer]
    }

    /// Whether some layer keeps only its window.
    pub fn is_windowed(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }

    /// Identity of this cache's contents (new for every cache and every clone).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Keys and values of `layer`, all heads (`n_kv_heads` blocks of
    /// [`KvCache::layer_rows`]` × head_dim`, row `r` at position `first_position(layer) + r`).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    /// Writes the keys and values of positions `pos0..pos0 + rows` of `layer`: `k` and `v` are
    /// row-major `rows × (n_kv_heads · head_dim)`, one row per position. A layer that keeps
    /// only its window `w` first drops what the new rows no longer need (all but the last
    /// `w − 1` positions before `pos0`) when they would not fit; `rows` must be at most the
    /// `max_call` it was made for (the forward pass's calls are).
    pub(crate) fn write_rows(
        &mut self,
        layer: usize,
        pos0: usize,
        k: &[f32],
        v: &[f32],
        heads: Heads,
    ) {
        let (n_kv, hd) = (heads.n_kv_heads, heads.head_dim);
        let kv_dim = n_kv * hd;
        let n = k.len() / kv_dim.max(1);
        let block = self.rows[layer];
        if let Some(w) = self.windows[layer] {
            let first = self.first[layer];
            if pos0 + n > first + block {
                let keep_from = pos0.saturating_sub(w.saturating_sub(1)).max(first);
                let (from, to) = ((keep_from - first) * hd, (pos0 - first) * hd);
                for g in 0..n_kv {
                    let base = g * block * hd;
                    self.k[layer].copy_within(base + from..base + to, base);
                    self.v[layer].copy_within(base + from..base + to, base);
                    if let (Some(k16), Some(v16)) =
                        (self.k16.get_mut(layer), self.v16.get_mut(layer))
                    {
                        k16.copy_within(base + from..base + to, base);
                        v16.copy_within(base + from..base + to, base);
                    }
                }
                self.first[layer] = keep_from;
            }
        }
        let pos0 = pos0 - self.first[layer];
        let (kc, vc) = (&mut self.k[layer], &mut self.v[layer]);
        for r in 0..n {
            for g in 0..n_kv {
                let dst = (g * block + pos0 + r) * hd;
                let src = r * kv_dim + g * hd;
                kc[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                vc[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
            }
        }
        if let (Some(k16), Some(v16)) = (self.k16.get_mut(layer), self.v16.get_mut(layer)) {
            for g in 0..n_kv {
                let at = (g * block + pos0) * hd;
                let span = at..at + n * hd;
                k16[span.clone()].convert_from_f32_slice(&self.k[layer][span.clone()]);
                v16[span.clone()].convert_from_f32_slice(&self.v[layer][span]);
            }
        }
    }

    /// Sets the number of filled positions (after a backend wrote them).
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// Bytes of the cache's blocks (f32, and the f16 copy where kept), allocated for its
    /// capacity.
    pub fn bytes(&self) -> usize {
        let f32s: usize = self.k.iter().chain(&self.v).map(Vec::len).sum();
        let f16s: usize = self.k16.iter().chain(&self.v16).map(Vec::len).sum();
        4 * f32s + 2 * f16s
    }

    /// Number of positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys of `layer` and KV head `g` at positions `first_position(layer)..len()` (`0..len()`
    /// unless the layer keeps only its window), row-major.
    pub fn keys(&self, layer: usize, g: usize, head_dim: usize) -> &[f32] {
        let base = g * self.rows[layer] * head_dim;
        &self.k[layer][base..base + (self.len - self.first[layer]) * head_dim]
    }

    /// Values of `layer` and KV head `g`, the positions of [`KvCache::keys`].
    pub fn values(&self, layer: usize, g: usize, head_dim: usize) -> &[f32] {
        let base = g * self.rows[layer] * head_dim;
        &self.v[layer][base..base + (self.len - self.first[layer]) * head_dim]
    }

    /// A copy with room for `capacity` positions (at least `len()`); layers that keep only
    /// their window keep their blocks as they are.
    pub fn with_capacity(&self, capacity: usize, head_dim: usize) -> KvCache {
        let capacity = capacity.max(self.len);
        let rows: Vec<usize> = (0..self.rows.len())
            .map(|l| match self.windows[l] {
                Some(_) => self.rows[l],
                None => capacity,
            })
            .collect();
        fn regrow<T: Copy + Default>(
            c: &KvCache,
            rows: &[usize],
            head_dim: usize,
            blocks: &[Vec<T>],
        ) -> Vec<Vec<T>> {
            blocks
                .iter()
                .enumerate()
                .map(|(l, layer)| {
                    let (old, new) = (c.rows[l], rows[l]);
                    let groups = layer.len() / (old * head_dim).max(1);
                    let mut out = vec![T::default(); groups * new * head_dim];
                    let len = (c.len - c.first[l]) * head_dim;
                    for g in 0..groups {
                        let (src, dst) = (g * old * head_dim, g * new * head_dim);
                        out[dst..dst + len].copy_from_slice(&layer[src..src + len]);
                    }
                    out
                })
                .collect()
        }
        KvCache {
            id: next_cache_id(),
            capacity,
            len: self.len,
            k: regrow(self, &rows, head_dim, &self.k),
            v: regrow(self, &rows, head_dim, &self.v),
            k16: regrow(self, &rows, head_dim, &self.k16),
            v16: regrow(self, &rows, head_dim, &self.v16),
            windows: self.windows.clone(),
            rows,
            first: self.first.clone(),
        }
    }
}
