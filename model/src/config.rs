//! Hyperparameters of a model from its GGUF metadata (`<arch>.*` keys).

use super::arch::{Architecture, AttentionKind, LayerSpec};
use super::error::{ModelError, Result};
use super::gguf::GgufFile;

/// Attention heads of a layer: query heads, KV heads (GQA: query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`) and the head dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Largest values a file may state (far above the models this driver runs).
const MAX_LAYERS: usize = 1024;
const MAX_DIM: usize = 65_536;
const MAX_HEADS: usize = 1024;
const MAX_HEAD_DIM: usize = 1024;
const MAX_CONTEXT: usize = 1 << 20;
/// Largest `context_length × head_dim` (the RoPE tables hold half of it per base, f32 cos and
/// sin: 2^26 is 256 MiB a base); Gemma 3 270M needs 2^23.
const MAX_ROPE_TABLE: usize = 1 << 26;

/// Hyperparameters of a model of one [`Architecture`].
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Architecture,
    pub n_layers: usize,
    /// Hidden size (`embedding_length`).
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    /// The RoPE base of the file (`rope.freq_base`), raised by NTK scaling
    /// ([`Config::with_rope_scaling`]); [`Config::layer`] says which base each layer uses.
    pub rope_theta: f64,
    /// Linear RoPE scaling (position interpolation) of the layers with the file's base: their
    /// positions are divided by this factor (1 as trained; [`Config::with_rope_scaling`]).
    pub rope_linear: f64,
    pub rms_eps: f32,
    /// Keys a sliding-window layer attends (`attention.sliding_window`; 0 where every layer is
    /// global).
    pub sliding_window: usize,
    /// The RoPE scaling that produced `rope_theta`, `rope_linear` and `context_length` from the
    /// file's values.
    pub scaling: RopeScaling,
}

/// The RoPE scaling of the runs past the trained context: NTK. By a factor of 4 on the essays,
/// it cost Gemma 3 270M 0.9 % of perplexity at 32K where linear scaling cost 4.3 %, and at 64K
/// it scored 2.5 % better than linear (`docs/bench/long/README.md`).
pub const LONG_CONTEXT_SCALING: fn(f64) -> RopeScaling = RopeScaling::Ntk;

/// The largest factor a run gets without naming a scaling: 4.25, the stretch measured
/// (`docs/bench/long/README.md`: Gemma 3 270M from 32K to 131,072 + 512 positions, which need
/// 4.25, the next quarter past 4). Past it a command asks for `--rope-scaling` rather than
/// silently stretching a model 8× or 16× (SmolLM2's 8K to 100K).
pub const MAX_DEFAULT_SCALING: f64 = 4.25;

/// How the layers with the file's RoPE base are stretched past the trained context
/// ([`Config::with_rope_scaling`]). Parsed from and printed as `none`, `ntk:F`, `linear:F`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// NTK-aware: a larger base (`base · F^(d / (d − 2))`).
    Ntk(f64),
    /// Position interpolation: positions divided by `F`.
    Linear(f64),
}

impl RopeScaling {
    /// How many times the trained context the scaled model covers (1 for `None`).
    pub fn factor(self) -> f64 {
        match self {
            RopeScaling::None => 1.0,
            RopeScaling::Ntk(f) | RopeScaling::Linear(f) => f,
        }
    }
}

impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RopeScaling::None => write!(f, "none"),
            RopeScaling::Ntk(x) => write!(f, "ntk:{x}"),
            RopeScaling::Linear(x) => write!(f, "linear:{x}"),
        }
    }
}

impl std::str::FromStr for RopeScaling {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason| ModelError::InvalidParam {
            name: "rope-scaling",
            value: s.to_string(),
            reason,
        };
        if s == "none" {
            return Ok(RopeScaling::None);
        }
        let (mode, factor) = s
            .split_once(':')
            .ok_or_else(|| bad("expected none, ntk:F or linear:F"))?;
        let f: f64 = factor
            .parse()
            .map_err(|_| bad("the factor must be a number"))?;
        let scaling = match mode {
            "ntk" => RopeScaling::Ntk(f),
            "linear" => RopeScaling::Linear(f),
            _ => return Err(bad("expected none, ntk:F or linear:F")),
        };
        if !(f.is_finite() && (1.0..=64.0).contains(&f)) {
            return Err(bad("the factor must be in 1..=64"));
        }
        Ok(scaling)
    }
}

impl Config {
    /// Reads the configuration of a file whose `general.architecture` this driver runs.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = Architecture::from_gguf_name(g.meta_str("general.architecture")?)?;
        let prefix = arch.gguf_name();
        let key = |k: &str| format!("{prefix}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(g.meta_u64(&key(k))? as usize) };
        let dim = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = u("attention.head_count_kv").unwrap_or(n_heads);
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => g.meta_array("tokenizer.ggml.tokens")?.len(),
        };
        let bad = |k: &str, reason: &str| ModelError::Metadata {
            key: key(k),
            reason: reason.into(),
        };
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(
                "attention.head_count_kv",
                "must divide the number of query heads",
            ));
        }
        // Gemma 3 states its head dim (256 ≠ 640 / 4); Llama files leave it at dim / n_heads.
        let stated = u("attention.key_length").ok();
        let head_dim = match stated {
            Some(hd) => hd,
            None if n_heads <= dim && dim % n_heads == 0 => dim / n_heads,
            None => {
                return Err(bad(
                    "embedding_length",
                    "must be n_heads × the head dim when attention.key_length is absent",
                ))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > MAX_HEAD_DIM {
            let k = match stated {
                Some(_) => "attention.key_length",
                None => "embedding_length",
            };
            return Err(bad(k, "the head dim must be even, in 2..=1024"));
        }
        if u("attention.value_length").is_ok_and(|v| v != head_dim) {
            return Err(bad(
                "attention.value_length",
                "must equal the key length (head dim)",
            ));
        }
        let sliding_window = if arch.all_global() {
            0
        } else {
            let w = u("attention.sliding_window")?;
            if w == 0 {
                return Err(bad("attention.sliding_window", "must be at least 1"));
            }
            w
        };
        if let Ok(rope_dims) = u("rope.dimension_count") {
            if rope_dims != head_dim {
                return Err(bad("rope.dimension_count", "partial RoPE is not supported"));
            }
        }
        let cfg = Self {
            arch,
            n_layers: u("block_count")?,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: u("feed_forward_length")?,
            vocab_size,
            context_length: u("context_length")?,
            rope_theta: g.meta_f64(&key("rope.freq_base")).unwrap_or(10000.0),
            rope_linear: 1.0,
            rms_eps: g.meta_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            sliding_window,
            scaling: RopeScaling::None,
        };
        if cfg.n_layers == 0 || cfg.ffn_dim == 0 || cfg.vocab_size == 0 || cfg.context_length == 0 {
            return Err(bad("*", "a dimension is zero"));
        }
        // Bounds that keep a hostile file from asking for giant allocations (weights are
        // checked against the file's size when read; these bound what is allocated before).
        let limits = [
            ("block_count", cfg.n_layers, MAX_LAYERS),
            ("embedding_length", cfg.dim, MAX_DIM),
            ("attention.head_count", cfg.n_heads, MAX_HEADS),
            ("feed_forward_length", cfg.ffn_dim, MAX_DIM * 8),
            ("context_length", cfg.context_length, MAX_CONTEXT),
        ];
        for (k, v, max) in limits {
            if v > max {
                return Err(bad(k, &format!("{v} exceeds the supported {max}")));
            }
        }
        if cfg.context_length * cfg.head_dim > MAX_ROPE_TABLE {
            return Err(bad(
                "context_length",
                &format!(
                    "{} × head dim {} exceeds the supported {MAX_ROPE_TABLE}",
                    cfg.context_length, cfg.head_dim
                ),
            ));
        }
        if !(cfg.rope_theta.is_finite() && cfg.rope_theta > 1.0) {
            return Err(bad("rope.freq_base", "must be a finite number above 1"));
        }
        if !(cfg.rms_eps.is_finite() && cfg.rms_eps >= 0.0) {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                "must be finite and non-negative",
            ));
        }
        Ok(cfg)
    }

    /// The same model with NTK-aware RoPE scaling by `factor`
    /// (`with_rope_scaling(RopeScaling::Ntk(factor))`).
    pub fn with_rope_scale(self, factor: f64) -> Result<Self> {
        self.with_rope_scaling(RopeScaling::Ntk(factor))
    }

    /// The same model with its RoPE scaled for a context `factor` times the trained one
    /// (`factor` 1 is the model as trained). Both modes touch only the layers that use the
    /// file's base (every layer of Llama, Gemma 3's global layers); Gemma 3's local layers keep
    /// theirs, as in Hugging Face's Gemma 3 (`rope_scaling` applies to the global rotary
    /// embedding only):
    /// - [`RopeScaling::Ntk`]: the base becomes `base · factor^(d / (d − 2))` (`d` the head dim);
    /// - [`RopeScaling::Linear`]: positions are divided by `factor` (position interpolation,
    ///   Chen et al. 2023; Gemma 3's own long-context recipe, `{"rope_type": "linear",
    ///   "factor": 8.0}` in the 4B–27B configs).
    ///
    /// Scalings do not compose: a second call replaces the first (scaling is relative to the
    /// trained model, whose base and context the config remembers).
    pub fn with_rope_scaling(mut self, scaling: RopeScaling) -> Result<Self> {
        let factor = scaling.factor();
        if !(factor.is_finite() && (1.0..=64.0).contains(&factor)) {
            return Err(ModelError::InvalidParam {
                name: "rope-scaling",
                value: scaling.to_string(),
                reason: "the factor must be in 1..=64",
            });
        }
        let trained = self.trained_context();
        self.rope_theta = self.trained_rope_theta();
        self.rope_linear = 1.0;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Ntk(f) => {
                let d = self.head_dim as f64;
                self.rope_theta *= f.powf(d / (d - 2.0));
            }
            RopeScaling::Linear(f) => self.rope_linear = f,
        }
        self.scaling = if factor == 1.0 {
            RopeScaling::None
        } else {
            scaling
        };
        let longest = MAX_CONTEXT.min(MAX_ROPE_TABLE / self.head_dim);
        self.context_length = ((trained as f64 * factor) as usize).min(longest);
        Ok(self)
    }

    /// The RoPE scaling in effect ([`RopeScaling::None`] as loaded).
    pub fn rope_scaling(&self) -> RopeScaling {
        self.scaling
    }

    /// The context the model was trained for (the file's `context_length`).
    pub fn trained_context(&self) -> usize {
        (self.context_length as f64 / self.scaling.factor()).round() as usize
    }

    /// The file's RoPE base, before NTK scaling.
    fn trained_rope_theta(&self) -> f64 {
        match self.scaling {
            RopeScaling::Ntk(f) => {
                let d = self.head_dim as f64;
                self.rope_theta / f.powf(d / (d - 2.0))
            }
            RopeScaling::None | RopeScaling::Linear(_) => self.rope_theta,
        }
    }

    /// The scaling used when a run of `context` positions names none: none while the trained
    /// context holds it, past it [`LONG_CONTEXT_SCALING`] with the smallest multiple of 1/4
    /// that makes room (131,072 + 512 positions of Gemma 3: 4.25, not the 8 a power of two
    /// would take; the one place this default is written; `docs/bench/long/README.md`
    /// measured the choice).
    pub fn default_rope_scaling(&self, context: usize) -> RopeScaling {
        let trained = self.trained_context().max(1);
        if context <= trained {
            return RopeScaling::None;
        }
        let quarters = (4 * context).div_ceil(trained);
        LONG_CONTEXT_SCALING(quarters as f64 / 4.0)
    }

    /// What layer `layer` does (norms, activation, RoPE, attention kind).
    pub fn layer(&self, layer: usize) -> LayerSpec {
        self.arch.layer(
            layer,
            (self.rope_theta, self.rope_linear),
            self.sliding_window,
        )
    }

    /// The layers that attend globally (every layer of Llama; 5, 11, 17 of Gemma 3 270M): where
    /// decode policies apply and what dumps hold by default.
    pub fn global_layers(&self) -> Vec<usize> {
        (0..self.n_layers)
            .filter(|&l| self.layer(l).attention == AttentionKind::Global)
            .collect()
    }

    /// Width of the queries of one position, `n_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the keys (and values) of one position, `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The attention heads of every layer.
    pub fn heads(&self) -> Heads {
        Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// SmolLM2-135M's shape (the bundled model), for models with seeded random weights.
    pub fn smollm2_135m() -> Self {
        Config {
            arch: Architecture::Llama,
            n_layers: 30,
            dim: 576,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            ffn_dim: 1536,
            vocab_size: 49_152,
            context_length: 8192,
            rope_theta: 100_000.0,
            rope_linear: 1.0,
            rms_eps: 1e-5,
            sliding_window: 0,
            scaling: RopeScaling::None,
        }
    }

    /// Gemma 3 270M's shape, for models with seeded random weights.
    pub fn gemma3_270m() -> Self {
        Config {
            arch: Architecture::Gemma3,
            n_layers: 18,
            dim: 640,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            ffn_dim: 2048,
            vocab_size: 262_144,
            context_length: 32_768,
            rope_theta: 1_000_000.0,
            rope_linear: 1.0,
            rms_eps: 1e-6,
            sliding_window: 512,
            scaling: RopeScaling::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_scale_raises_the_base_ntk_style_and_the_context() {
        let cfg = Config::smollm2_135m().with_rope_scale(4.0).expect("scale");
        let want = 100_000.0 * 4f64.powf(64.0 / 62.0);
        assert!((cfg.rope_theta - want).abs() < 1e-6 * want);
        assert_eq!(cfg.context_length, 4 * 8192);
        assert_eq!(
            Config::smollm2_135m().with_rope_scale(1.0).expect("1"),
            Config::smollm2_135m()
        );
        for bad in [0.5, f64::NAN, 1000.0] {
            assert!(Config::smollm2_135m().with_rope_scale(bad).is_err());
        }
        // Gemma 3's local layers keep their base; the global ones scale.
        let g = Config::gemma3_270m().with_rope_scale(2.0).expect("scale");
        assert_eq!(g.layer(0).rope.base, crate::arch::GEMMA3_LOCAL_ROPE_BASE);
        assert!(g.layer(5).rope.base > 1e6);
    }

    #[test]
    fn rope_scaling_parses_prints_and_defaults_by_length() {
        for s in ["none", "ntk:4", "linear:8", "linear:2.5"] {
            let r: RopeScaling = s.parse().expect(s);
            assert_eq!(r.to_string(), s);
        }
        for bad in [
            "",
            "ntk",
            "linear:x",
            "yarn:4",
            "ntk:0.5",
            "linear:100",
            "ntk:NaN",
        ] {
            assert!(bad.parse::<RopeScaling>().is_err(), "{bad}");
        }
        let g = Config::gemma3_270m();
        assert_eq!(g.default_rope_scaling(32_768), RopeScaling::None);
        let long = LONG_CONTEXT_SCALING;
        assert_eq!(g.default_rope_scaling(32_769), long(1.25));
        assert_eq!(g.default_rope_scaling(65_536), long(2.0));
        assert_eq!(g.default_rope_scaling(131_072), long(4.0));
        assert_eq!(g.default_rope_scaling(131_073), long(4.25));
        assert_eq!(g.default_rope_scaling(131_072 + 512), long(4.25));
        // Measured from the trained context, whatever scaling is in effect.
        let scaled = g.with_rope_scale(4.0).expect("scale");
        assert_eq!(scaled.default_rope_scaling(32_768), RopeScaling::None);
    }
}
