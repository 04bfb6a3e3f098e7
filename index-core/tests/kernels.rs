//! Every kernel set the CPU supports agrees with the f64 scalar reference.

use half::f16;
use proptest::prelude::*;
use qkindex::metric::{scalar::dot_f64, Kernels};

/// Tolerance of an f32-accumulated inner product against the exact one.
fn tolerance(a: &[f32], b: &[f32]) -> f64 {
    let mag: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum();
    1e-4 * mag + 1e-6
}

fn assert_close(got: f32, a: &[f32], b: &[f32], what: &str) {
    let want = dot_f64(a, b);
    let tol = tolerance(a, b);
    let err = (got as f64 - want).abs();
    assert!(
        err <= tol,
        "{what}: got {got}, want {want}, |err| {err} > tol {tol} (dim {})",
        a.len()
    );
}

/// Values of mixed magnitude: mostly O(1), some up to 1e3, some tiny, some exact zeros.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -4.0f32..4.0,
        2 => -1.0e3f32..1.0e3,
        1 => -1.0e-3f32..1.0e-3,
        1 => Just(0.0f32),
    ]
}

fn vec_pair(max_dim: usize) -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (1..=max_dim).prop_flat_map(|d| {
        (
            proptest::collection::vec(value(), d),
            proptest::collection::vec(value(), d),
        )
    })
}

/// A query, a key matrix of `n` rows and random row ids (repeats allowed).
fn gather_case() -> impl Strategy<Value = (Vec<f32>, Vec<f32>, usize, Vec<u32>)> {
    (1usize..=300, 1usize..=12).prop_flat_map(|(d, n)| {
        (
            proptest::collection::vec(value(), d),
            proptest::collection::vec(value(), d * n),
            Just(d),
            proptest::collection::vec(0..n as u32, 0..=20),
        )
    })
}

fn f16_round(v: &[f32]) -> (Vec<f16>, Vec<f32>) {
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    let exact: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
    (h, exact)
}

#[test]
fn scalar_set_is_always_available_and_last() {
    let all = Kernels::available();
    assert!(!all.is_empty());
    assert_eq!(all.last().map(|k| k.isa), Some("scalar"));
    assert_eq!(qkindex::metric::kernels().isa, all[0].isa);
    eprintln!(
        "kernel sets: {:?}",
        all.iter().map(|k| k.isa).collect::<Vec<_>>()
    );
}

#[test]
fn every_dim_from_1_to_300_matches_reference() {
    // Deterministic sweep over every tail length of every lane width.
    let mut rng = qkindex::synth::Rng::new(11);
    for d in 1..=300 {
        let a: Vec<f32> = (0..d).map(|_| rng.normal() * 3.0).collect();
        let b: Vec<f32> = (0..d).map(|_| rng.normal() * 3.0).collect();
        let (bh, bx) = f16_round(&b);
        for k in Kernels::available() {
            assert_close((k.dot_f32)(&a, &b), &a, &b, &format!("{} dot_f32", k.isa));
            assert_close((k.dot_f16)(&a, &bh), &a, &bx, &format!("{} dot_f16", k.isa));
        }
    }
}

#[test]
fn empty_vectors_give_zero() {
    for k in Kernels::available() {
        assert_eq!((k.dot_f32)(&[], &[]), 0.0, "{}", k.isa);
        assert_eq!((k.dot_f16)(&[], &[]), 0.0, "{}", k.isa);
        let mut out: [f32; 0] = [];
        (k.gather_f32)(&[1.0], &[1.0, 2.0], 1, &[], &mut out);
        (k.gather_f16)(&[1.0], &[f16::ONE, f16::ONE], 1, &[], &mut out);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn dot_f32_matches_f64_reference((a, b) in vec_pair(300)) {
        for k in Kernels::available() {
            assert_close((k.dot_f32)(&a, &b), &a, &b, &format!("{} dot_f32", k.isa));
        }
    }

    #[test]
    fn dot_f16_matches_f64_reference((a, b) in vec_pair(300)) {
        let (bh, bx) = f16_round(&b);
        for k in Kernels::available() {
            assert_close((k.dot_f16)(&a, &bh), &a, &bx, &format!("{} dot_f16", k.isa));
        }
    }

    #[test]
    fn gather_matches_f64_reference((q, keys, d, ids) in gather_case()) {
        let (kh, kx) = f16_round(&keys);
        for k in Kernels::available() {
            let mut out32 = vec![f32::NAN; ids.len()];
            let mut out16 = vec![f32::NAN; ids.len()];
            (k.gather_f32)(&q, &keys, d, &ids, &mut out32);
            (k.gather_f16)(&q, &kh, d, &ids, &mut out16);
            for (i, &id) in ids.iter().enumerate() {
                let r = id as usize * d..(id as usize + 1) * d;
                assert_close(out32[i], &q, &keys[r.clone()], &format!("{} gather_f32 #{i}", k.isa));
                assert_close(out16[i], &q, &kx[r], &format!("{} gather_f16 #{i}", k.isa));
                // gather is exactly the dot kernel of the same set on that row
                let row = id as usize * d..(id as usize + 1) * d;
                prop_assert_eq!(out32[i].to_bits(), (k.dot_f32)(&q, &keys[row.clone()]).to_bits());
                prop_assert_eq!(out16[i].to_bits(), (k.dot_f16)(&q, &kh[row]).to_bits());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The store's scorer (best kernels) agrees with the reference through all three entry
    /// points, for f32 and f16 stores.
    #[test]
    fn store_scorer_matches_reference((q, keys, d, ids) in gather_case()) {
        let n = keys.len() / d;
        let (kh, kx) = f16_round(&keys);
        let s32 = qkindex::KeyStore::from_f32(keys.clone(), d).expect("f32 store");
        let s16 = qkindex::KeyStore::from_f16(kh, d).expect("f16 store");
        for (store, exact) in [(&s32, &keys), (&s16, &kx)] {
            let scorer = store.scorer();
            let mut by_ids = vec![f32::NAN; ids.len()];
            scorer.score_ids(&q, &ids, &mut by_ids);
            let mut by_range = vec![f32::NAN; n];
            scorer.score_range(&q, 0, &mut by_range);
            for (i, &id) in ids.iter().enumerate() {
                let row = &exact[id as usize * d..(id as usize + 1) * d];
                assert_close(by_ids[i], &q, row, "score_ids");
                prop_assert_eq!(by_ids[i].to_bits(), scorer.score(&q, id).to_bits());
                prop_assert_eq!(by_ids[i].to_bits(), by_range[id as usize].to_bits());
            }
            if n > 1 {
                let mut tail = vec![f32::NAN; n - 1];
                scorer.score_range(&q, 1, &mut tail);
                prop_assert_eq!(&tail, &by_range[1..].to_vec());
            }
        }
    }
}

/// Range scans score rows in blocks (four at a time where `dim` is a multiple of 16) and must
/// give every row the same bits as a gather of that row, at every block alignment.
#[test]
fn range_blocks_match_gather_bit_for_bit() {
    for k in Kernels::available() {
        for d in [16usize, 32, 48, 64, 80, 128, 144, 65] {
            for n in 1..=9usize {
                let q: Vec<f32> = (0..d)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                    .collect();
                let keys: Vec<f32> = (0..d * n)
                    .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 13.0)
                    .collect();
                let (kh, kx) = f16_round(&keys);
                let ids: Vec<u32> = (0..n as u32).collect();
                for start in 0..n.min(3) {
                    let rows = n - start;
                    let (mut r32, mut g32) = (vec![f32::NAN; rows], vec![f32::NAN; n]);
                    (k.range_f32)(&q, &keys[start * d..], d, &mut r32);
                    (k.gather_f32)(&q, &keys, d, &ids, &mut g32);
                    let (mut r16, mut g16) = (vec![f32::NAN; rows], vec![f32::NAN; n]);
                    (k.range_f16)(&q, &kh[start * d..], d, &mut r16);
                    (k.gather_f16)(&q, &kh, d, &ids, &mut g16);
                    for r in 0..rows {
                        let id = start + r;
                        let what = format!("{} d {d} n {n} start {start} row {id}", k.isa);
                        assert_eq!(r32[r].to_bits(), g32[id].to_bits(), "f32 {what}");
                        assert_eq!(r16[r].to_bits(), g16[id].to_bits(), "f16 {what}");
                        assert_close(r32[r], &q, &keys[id * d..(id + 1) * d], &what);
                        assert_close(r16[r], &q, &kx[id * d..(id + 1) * d], &what);
                    }
                }
            }
        }
    }
}
