//! Unit tests of [`Llama`](super::Llama): chunked prefills, local windows, the f16 cache copy, RoPE scaling.

use super::*;
use crate::ops::Rope;
use crate::LayerCapture;

/// A Gemma-3-shaped model small enough for a unit test: six layers (the last global), a
/// window of 8 keys, head dim ≠ dim / heads.
fn tiny_gemma() -> Llama {
    let cfg = Config {
        n_layers: 6,
        dim: 32,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 24,
        ffn_dim: 64,
        vocab_size: 50,
        context_length: 64,
        sliding_window: 8,
        ..Config::gemma3_270m()
    };
    let w = Weights::random(&cfg, 11);
    Llama::new(cfg, w)
}

#[test]
fn gemma3_layers_get_two_rope_tables_and_one_global_layer() {
    let m = tiny_gemma();
    assert_eq!(m.ropes().tables().len(), 2);
    assert_eq!(m.cfg.global_layers(), [5]);
    assert_eq!(
        (0..6).map(|l| m.ropes().of_layer(l)).collect::<Vec<_>>(),
        [0, 0, 0, 0, 0, 1]
    );
}

#[test]
fn gemma3_prefill_in_chunks_and_decode_steps_equal_one_prefill() {
    let m = tiny_gemma();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 50).collect();
    let mut tm = Timings::default();
    let mut cache = m.new_cache(40).expect("cache");
    let whole = m
        .forward(&tokens, &mut cache, None, &mut tm)
        .expect("prefill");
    assert!(whole.iter().all(|v| v.is_finite()));
    // 25 + 15 rows (the window spans the seam), then 30 rows and ten one-token steps.
    let mut c2 = m.new_cache(40).expect("cache");
    let mut chunked = m.forward(&tokens[..25], &mut c2, None, &mut tm).expect("a");
    chunked.extend(m.forward(&tokens[25..], &mut c2, None, &mut tm).expect("b"));
    let mut c3 = m.new_cache(40).expect("cache");
    let mut stepped = m.forward(&tokens[..30], &mut c3, None, &mut tm).expect("c");
    for &t in &tokens[30..] {
        stepped.extend(m.forward(&[t], &mut c3, None, &mut tm).expect("step"));
    }
    for (i, ((a, b), c)) in whole.iter().zip(&chunked).zip(&stepped).enumerate() {
        assert!((a - b).abs() < 1e-4, "chunked, value {i}: {a} vs {b}");
        assert!((a - c).abs() < 1e-4, "stepped, value {i}: {a} vs {c}");
    }
    // The windows are windows: through five local layers (window 8) position 39 sees
    // positions 4.. only, so the global layer's key at 39 ignores token 0, while its
    // attention (and so the output) does not.
    let run = |toks: &[u32]| {
        let mut k5 = Vec::new();
        let mut cb = |c: LayerCapture<'_>| {
            if c.layer == 5 {
                k5 = c.k[39 * 24..].to_vec();
            }
        };
        let mut c = m.new_cache(40).expect("cache");
        let h = m
            .forward(toks, &mut c, Some(&mut cb), &mut Timings::default())
            .expect("forward");
        (k5, h[39 * 32..].to_vec())
    };
    let mut other = tokens.clone();
    other[0] = 1;
    let ((k_a, h_a), (k_b, h_b)) = (run(&tokens), run(&other));
    assert_eq!(
        k_a, k_b,
        "layer 5's key at 39 depends on positions 4.. only"
    );
    assert_ne!(h_a, h_b, "the global layer attends position 0");
    let mut near = tokens.clone();
    near[10] = 1;
    assert_ne!(
        run(&near).0,
        k_a,
        "position 10 is inside the receptive field"
    );
}

#[test]
fn local_layers_keeping_only_their_window_compute_the_same() {
    let m = tiny_gemma();
    let tokens: Vec<u32> = (0..60).map(|i| (i * 11 + 5) % 50).collect();
    let mut tm = Timings::default();
    let mut full = KvCache::zeroed(6, 1, 60, 24);
    let want = m.forward(&tokens, &mut full, None, &mut tm).expect("full");
    // Window 8, calls of at most 5 rows: local blocks of 12 rows slide many times, in
    // calls of 5, 3, 1 rows and one-token steps.
    let windows: Vec<Option<usize>> = (0..6).map(|l| m.cfg.layer(l).attention.window()).collect();
    let mut win = KvCache::windowed(&windows, 1, 60, 24, 5);
    assert!(win.is_windowed());
    assert_eq!((win.layer_rows(0), win.layer_rows(5)), (12, 60));
    let mut got = Vec::new();
    let mut at = 0;
    for n in [5, 3, 1, 5, 5, 4, 2]
        .into_iter()
        .chain(std::iter::repeat(1))
    {
        if at == tokens.len() {
            break;
        }
        let end = (at + n).min(tokens.len());
        got.extend(
            m.forward(&tokens[at..end], &mut win, None, &mut tm)
                .expect("windowed"),
        );
        at = end;
    }
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!((a - b).abs() < 1e-4, "value {i}: {a} vs {b}");
    }
    // The local layer holds its last positions; the global one all of them (equal up to
    // rounding: calls of other sizes take other matmul kernels).
    let close = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4)
    };
    assert!(win.first_position(0) > 0);
    assert_eq!(win.keys(0, 0, 24).len(), (60 - win.first_position(0)) * 24);
    let tail = &full.keys(0, 0, 24)[win.first_position(0) * 24..];
    assert!(close(win.keys(0, 0, 24), tail));
    assert!(close(win.keys(5, 0, 24), full.keys(5, 0, 24)));
    // A copy with more room keeps the windowed blocks.
    let grown = win.with_capacity(64, 24);
    assert_eq!(grown.layer_rows(0), 12);
    assert_eq!(grown.keys(0, 0, 24), win.keys(0, 0, 24));
    assert_eq!(grown.keys(5, 0, 24), win.keys(5, 0, 24));
}

#[test]
fn an_f16_cache_copy_follows_every_write_and_attends_close_to_f32() {
    use half::f16;
    let mut m = tiny_gemma();
    let tokens: Vec<u32> = (0..60).map(|i| (i * 7 + 3) % 50).collect();
    let mut tm = Timings::default();
    assert_eq!(m.new_cache(60).expect("cache").dtype(), KvDtype::F32);
    assert!(m.new_cache(60).expect("cache").layer_f16(0).is_none());
    m.set_kv_dtype(KvDtype::F16);
    assert_eq!(m.new_cache(60).expect("cache").dtype(), KvDtype::F16);
    // Local layers keeping a window of 8 in blocks of 12 rows (calls of at most 5): they
    // slide many times.
    let windows: Vec<Option<usize>> = (0..6).map(|l| m.cfg.layer(l).attention.window()).collect();
    let mut c32 = KvCache::windowed(&windows, 1, 60, 24, 5);
    let mut c16 = KvCache::windowed(&windows, 1, 60, 24, 5).with_f16_copy();
    assert_eq!((c32.dtype(), c16.dtype()), (KvDtype::F32, KvDtype::F16));
    let (mut want, mut got) = (Vec::new(), Vec::new());
    let calls = (0..4)
        .map(|i| (5 * i, 5 * i + 5))
        .chain((20..60).map(|i| (i, i + 1)));
    for (a, b) in calls {
        want = m
            .forward(&tokens[a..b], &mut c32, None, &mut tm)
            .expect("f32");
        got = m
            .forward(&tokens[a..b], &mut c16, None, &mut tm)
            .expect("f16");
    }
    let worst = want
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst > 0.0 && worst < 2e-2, "worst {worst}");
    // The copy holds the f32 cache's keys and values rounded, for every layer, the slid
    // local ones included, and keeps doing so in a copy with more room.
    let check = |c: &KvCache| {
        for l in 0..m.cfg.n_layers {
            let (k, v) = c.layer(l);
            let (k16, v16) = c.layer_f16(l).expect("f16 copy");
            let rows = (c.len() - c.first_position(l)) * m.cfg.head_dim;
            assert!(c.first_position(l) > 0 || l == 5);
            for (x, h) in k[..rows].iter().zip(&k16[..rows]) {
                assert_eq!(f16::from_f32(*x), *h, "layer {l}");
            }
            for (x, h) in v[..rows].iter().zip(&v16[..rows]) {
                assert_eq!(f16::from_f32(*x), *h, "layer {l}");
            }
        }
    };
    check(&c16);
    let grown = c16.with_capacity(64, m.cfg.head_dim);
    assert_eq!(grown.dtype(), KvDtype::F16);
    check(&grown);
}

#[test]
fn linear_scaling_divides_the_global_layers_positions_only() {
    let g = Config::gemma3_270m()
        .with_rope_scaling(RopeScaling::Linear(4.0))
        .expect("linear");
    assert_eq!(g.context_length, 4 * 32_768);
    assert_eq!((g.layer(5).rope.base, g.layer(5).rope.linear), (1e6, 4.0));
    assert_eq!(g.layer(0).rope.linear, 1.0);
    // Position 4p of the scaled table rotates like position p of the trained one.
    let (hd, n) = (8, 12);
    let scaled = Rope::scaled(hd, 1e6, 4.0, 4 * n);
    let trained = Rope::new(hd, 1e6, n);
    let half = hd / 2;
    for p in 0..n {
        for i in 0..half {
            let (a, b) = (
                scaled.tables().0[4 * p * half + i],
                trained.tables().0[p * half + i],
            );
            assert!((a - b).abs() < 1e-6, "cos at position {p}, pair {i}");
        }
    }
    // A second scaling replaces the first: back to the file's base and context.
    let back = Config::gemma3_270m()
        .with_rope_scale(4.0)
        .and_then(|c| c.with_rope_scaling(RopeScaling::Linear(2.0)))
        .expect("rescale");
    assert_eq!(back.rope_theta, 1e6);
    assert_eq!(back.context_length, 2 * 32_768);
    assert_eq!(back.trained_context(), 32_768);
    // Two tables still: the local layers' and the scaled global one.
    let m = tiny_gemma()
        .with_rope_scaling(RopeScaling::Linear(2.0))
        .expect("linear");
    assert_eq!(m.ropes().tables().len(), 2);
    assert_eq!(m.cfg.context_length, 128);
}
