//! The RoPE tables of a model: one [`Rope`] table per distinct (base, linear scale) among its
//! layers (Gemma 3: its local and global bases), and which table each layer uses.

use super::config::Config;
use super::ops::Rope;

/// The RoPE tables of a model: one per distinct base among its layers.
#[derive(Debug)]
pub struct RopeTables {
    tables: Vec<Rope>,
    /// The table of each layer.
    of_layer: Vec<usize>,
}

impl RopeTables {
    /// Tables for the layers of `cfg` up to position `cfg.context_length`: one per distinct
    /// (base, linear scale).
    pub fn new(cfg: &Config) -> Self {
        let mut bases: Vec<(f64, f64)> = Vec::new();
        let of_layer = (0..cfg.n_layers)
            .map(|layer| {
                let rope = cfg.layer(layer).rope;
                let base = (rope.base, rope.linear);
                bases.iter().position(|&b| b == base).unwrap_or_else(|| {
                    bases.push(base);
                    bases.len() - 1
                })
            })
            .collect();
        let tables = bases
            .iter()
            .map(|&(base, linear)| Rope::scaled(cfg.head_dim, base, linear, cfg.context_length))
            .collect();
        RopeTables { tables, of_layer }
    }

    /// The tables, in order of first use by a layer.
    pub fn tables(&self) -> &[Rope] {
        &self.tables
    }

    /// Index in [`RopeTables::tables`] of `layer`'s table.
    pub fn of_layer(&self, layer: usize) -> usize {
        self.of_layer[layer]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_with_one_rope_base_share_one_table() {
        let cfg = Config {
            n_layers: 3,
            context_length: 16,
            ..Config::smollm2_135m()
        };
        let r = RopeTables::new(&cfg);
        assert_eq!(r.tables().len(), 1);
        assert_eq!((0..3).map(|l| r.of_layer(l)).collect::<Vec<_>>(), [0, 0, 0]);
        assert_eq!(r.tables()[0].max_pos(), 16);
        let want = Rope::new(cfg.head_dim, cfg.rope_theta, 16);
        assert_eq!(r.tables()[0].tables(), want.tables());
    }
}
