//! The split decode step of retrieval attention: with the static part (sink + window) supplied
//! from outside — as the CUDA backend supplies it from the GPU while the CPU searches — the
//! output equals the policy attending everything itself, for every policy kind; the supplier is
//! asked once per layer step; a malformed supply is an error. Synthetic data, no model needed.

use qkindex::IndexSpec;
use qkindex_driver::retrieval::{PolicyConfig, PolicyKind, Retrieval, Shape};
use qkindex_model::{DecodeAttention, DecodeStep, StaticParts};

const SHAPE: Shape = Shape {
    n_layers: 2,
    n_heads: 6,
    n_kv_heads: 2,
    head_dim: 16,
};

/// The exact kNN of index builds: the CPU reference.
fn knn() -> &'static dyn qkindex::KnnBackend {
    &qkindex::CpuKnn
}

/// Deterministic values in [-1, 1) (splitmix64).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Reference static parts (f64) of every head over positions 0..sink and rest_end..n.
fn static_parts(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cap: usize,
    sink: usize,
    rest_end: usize,
    n: usize,
) -> StaticParts {
    let (hd, group) = (SHAPE.head_dim, SHAPE.n_heads / SHAPE.n_kv_heads);
    let scale = 1.0 / (hd as f64).sqrt();
    let mut parts = StaticParts::default();
    for h in 0..SHAPE.n_heads {
        let g = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let pos: Vec<usize> = (0..sink.min(n)).chain(rest_end..n).collect();
        let s: Vec<f64> = pos
            .iter()
            .map(|&p| {
                let kr = &k[(g * cap + p) * hd..][..hd];
                scale
                    * qh.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut o = vec![0f64; hd];
        let mut l = 0f64;
        for (&p, &si) in pos.iter().zip(&s) {
            let w = (si - m).exp();
            l += w;
            for (oi, vi) in o.iter_mut().zip(&v[(g * cap + p) * hd..][..hd]) {
                *oi += w * *vi as f64;
            }
        }
        parts.max.push(m as f32);
        parts.sum.push(l as f32);
        parts.o.extend(o.iter().map(|&x| x as f32));
    }
    parts
}

fn check(kind: PolicyKind, index: &str) {
    let index: IndexSpec = index.parse().expect("a valid index spec");
    let (n0, steps, hd) = (400, 6, SHAPE.head_dim);
    let cap = n0 + steps;
    let kv = SHAPE.n_kv_heads * cap * hd;
    let (k, v) = (values(kv, 1), values(kv, 2));
    let width = SHAPE.n_heads * hd;
    let prefill_q: Vec<Vec<f32>> = (0..SHAPE.n_layers)
        .map(|l| values(n0 * width, 10 + l as u64))
        .collect();
    let cfg = PolicyConfig {
        sink: 16,
        window: 64,
        k: 24,
        index: index.clone(),
        ..PolicyConfig::new(kind)
    };
    let keys_of = |_layer: usize, g: usize| k[g * cap * hd..(g * cap + n0) * hd].to_vec();
    let mut plain = Retrieval::new(
        cfg.clone(),
        SHAPE,
        &keys_of,
        n0,
        &prefill_q,
        knn(),
        |_, _| {},
    )
    .expect("policy");
    let mut split =
        Retrieval::new(cfg, SHAPE, &keys_of, n0, &prefill_q, knn(), |_, _| {}).expect("policy");
    for t in 0..steps {
        let pos = n0 + t;
        for layer in 0..SHAPE.n_layers {
            let q = values(width, 100 + (t * 7 + layer) as u64);
            let mut a = vec![0f32; width];
            let mut b = vec![0f32; width];
            let step = DecodeStep {
                layer,
                pos,
                q: &q,
                k: &k,
                v: &v,
                capacity: cap,
            };
            plain.attend(step, &mut a).expect("attend");
            let (sink, rest_end) = split.static_set(layer, pos).expect("a static set");
            assert_eq!(sink, 16);
            assert_eq!(rest_end, pos + 1 - 64);
            let mut calls = 0;
            let mut supply = || {
                calls += 1;
                Ok(static_parts(&q, &k, &v, cap, sink, rest_end, pos + 1))
            };
            split
                .attend_split(step, &mut supply, &mut b)
                .expect("split");
            assert_eq!(calls, 1, "{kind:?}: static parts asked {calls} times");
            let diff = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                diff < 1e-5,
                "{kind:?} {index} step {t} layer {layer}: {diff}"
            );
        }
    }
    let q = values(width, 999);
    let mut out = vec![0f32; width];
    let mut bad = || {
        Ok(StaticParts {
            max: vec![0.0; 2],
            sum: vec![1.0; 2],
            o: vec![0.0; 2 * hd],
        })
    };
    let step = DecodeStep {
        layer: 0,
        pos: n0 + steps - 1,
        q: &q,
        k: &k,
        v: &v,
        capacity: cap,
    };
    assert!(split.attend_split(step, &mut bad, &mut out).is_err());
}

#[test]
fn supplied_static_parts_give_the_same_output() {
    check(PolicyKind::Static, "attention");
    check(PolicyKind::ExactTopk, "flat");
    check(PolicyKind::IndexTopk, "attention");
    check(PolicyKind::Retopk, "flat");
}

#[test]
fn dense_layers_attend_everything_themselves() {
    let cfg = PolicyConfig {
        dense_layers: vec![1],
        sink: 16,
        window: 64,
        k: 8,
        ..PolicyConfig::new(PolicyKind::ExactTopk)
    };
    let (n0, hd) = (300, SHAPE.head_dim);
    let k = values(SHAPE.n_kv_heads * n0 * hd, 3);
    let keys_of = |_l: usize, g: usize| k[g * n0 * hd..(g + 1) * n0 * hd].to_vec();
    let width = SHAPE.n_heads * hd;
    let q: Vec<Vec<f32>> = (0..SHAPE.n_layers)
        .map(|l| values(n0 * width, 20 + l as u64))
        .collect();
    let r = Retrieval::new(cfg, SHAPE, &keys_of, n0, &q, knn(), |_, _| {}).expect("policy");
    assert!(r.static_set(1, n0).is_none());
    assert_eq!(r.static_set(0, n0), Some((16, n0 + 1 - 64)));
}
