//! The KV cache of a sequence: the host copy every backend keeps canonical.

use super::backend::Heads;

/// The KV cache of a sequence: per layer, `n_kv_heads` blocks of row-major `capacity × head_dim`
/// keys (post-RoPE) and values.
///
/// This host copy is the canonical cache on every backend (policies and captures read it); a GPU
/// backend mirrors it on the device and tells caches apart by [`KvCache::id`], which every new
/// cache and every clone gets afresh.
#[derive(Debug)]
pub struct KvCache {
    id: u64,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
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
        }
    }
}

impl KvCache {
    /// A cache of `n_layers` layers, `n_kv_heads` heads, room for `capacity` positions, empty.
    pub(crate) fn zeroed(n_layers: usize, n_kv_heads: usize, capacity: usize, hd: usize) -> Self {
        let per_layer = n_kv_heads * capacity * hd;
        KvCache {
            id: next_cache_id(),
            capacity,
            len: 0,
            k: (0..n_layers).map(|_| vec![0f32; per_layer]).collect(),
            v: (0..n_layers).map(|_| vec![0f32; per_layer]).collect(),
        }
    }

    /// Identity of this cache's contents (new for every cache and every clone).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Keys and values of `layer`, all heads (`n_kv_heads` blocks of `capacity × head_dim`).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    /// Writes the keys and values of positions `pos0..pos0 + rows` of `layer`: `k` and `v` are
    /// row-major `rows × (n_kv_heads · head_dim)`, one row per position.
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
        let (kc, vc) = (&mut self.k[layer], &mut self.v[layer]);
        for r in 0..k.len() / kv_dim.max(1) {
            for g in 0..n_kv {
                let dst = (g * self.capacity + pos0 + r) * hd;
                let src = r * kv_dim + g * hd;
                kc[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                vc[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
            }
        }
    }

    /// Sets the number of filled positions (after a backend wrote them).
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
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

    /// Keys of `layer` and KV head `g` at positions `0..len()`, row-major.
    pub fn keys(&self, layer: usize, g: usize, head_dim: usize) -> &[f32] {
        let base = g * self.capacity * head_dim;
        &self.k[layer][base..base + self.len * head_dim]
    }

    /// Values of `layer` and KV head `g` at positions `0..len()`, row-major.
    pub fn values(&self, layer: usize, g: usize, head_dim: usize) -> &[f32] {
        let base = g * self.capacity * head_dim;
        &self.v[layer][base..base + self.len * head_dim]
    }

    /// A copy with room for `capacity` positions (at least `len()`).
    pub fn with_capacity(&self, capacity: usize, head_dim: usize) -> KvCache {
        let capacity = capacity.max(self.len);
        let regrow = |blocks: &Vec<Vec<f32>>| -> Vec<Vec<f32>> {
            blocks
                .iter()
                .map(|layer| {
                    let groups = layer.len() / (self.capacity * head_dim).max(1);
                    let mut out = vec![0f32; groups * capacity * head_dim];
                    for g in 0..groups {
                        let src = g * self.capacity * head_dim;
                        let dst = g * capacity * head_dim;
                        let len = self.len * head_dim;
                        out[dst..dst + len].copy_from_slice(&layer[src..src + len]);
                    }
                    out
                })
                .collect()
        };
        KvCache {
            id: next_cache_id(),
            capacity,
            len: self.len,
            k: regrow(&self.k),
            v: regrow(&self.v),
        }
    }
}
