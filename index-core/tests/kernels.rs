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

/// The AVX-512 kernels' summation order written out lane by lane (`mul_add` is the fused
/// multiply-add of VFMADD and FMLA): two 16-lane accumulators over steps of 32 values, one
/// 16-value step into the first, for f32 (`masked_tail`) the rest as one zero-padded step into
/// the second, the sum of the two reduced lane j + j+8, then j + j+4, then (0 + 2) + (1 + 3),
/// then (f16) the scalar tail.
fn dot_in_avx512_order<T: Copy>(a: &[f32], b: &[T], masked_tail: bool) -> f32
where
    f32: From<T>,
{
    let n = a.len().min(b.len());
    let mut acc = [[0.0f32; 16]; 2];
    let step = |acc: &mut [f32; 16], at: usize, len: usize| {
        for (l, lane) in acc.iter_mut().enumerate() {
            let (x, y) = if l < len {
                (a[at + l], f32::from(b[at + l]))
            } else {
                (0.0, 0.0)
            };
            *lane = x.mul_add(y, *lane);
        }
    };
    let mut i = 0;
    while i + 32 <= n {
        step(&mut acc[0], i, 16);
        step(&mut acc[1], i + 16, 16);
        i += 32;
    }
    if i + 16 <= n {
        step(&mut acc[0], i, 16);
        i += 16;
    }
    if masked_tail && i < n {
        step(&mut acc[1], i, n - i);
        i = n;
    }
    let v: Vec<f32> = (0..16).map(|l| acc[0][l] + acc[1][l]).collect();
    let s8: Vec<f32> = (0..8).map(|l| v[l] + v[l + 8]).collect();
    let t4: Vec<f32> = (0..4).map(|l| s8[l] + s8[l + 4]).collect();
    let mut s = (t4[0] + t4[2]) + (t4[1] + t4[3]);
    while i < n {
        s += a[i] * f32::from(b[i]);
        i += 1;
    }
    s
}

/// The AVX-512 and NEON kernels sum in one order (`metric/neon.rs`), so an inner product is the
/// same bits on either CPU: each set present is checked bit for bit against that order written
/// in scalar code, for every tail length, f32 and f16 keys, through dot, gather and range.
#[test]
fn avx512_and_neon_sum_in_one_order() {
    let all = Kernels::available();
    let same_order: Vec<Kernels> = all
        .into_iter()
        .filter(|k| k.isa == "avx512" || k.isa == "neon")
        .collect();
    #[cfg(target_arch = "aarch64")]
    assert!(
        same_order.iter().any(|k| k.isa == "neon"),
        "no NEON kernel set on aarch64"
    );
    let mut rng = qkindex::synth::Rng::new(25);
    for d in 1..=300usize {
        let q: Vec<f32> = (0..d).map(|_| rng.normal() * 3.0).collect();
        let keys: Vec<f32> = (0..2 * d).map(|_| rng.normal() * 3.0).collect();
        let (kh, _) = f16_round(&keys);
        let want32 = [
            dot_in_avx512_order(&q, &keys[..d], true).to_bits(),
            dot_in_avx512_order(&q, &keys[d..], true).to_bits(),
        ];
        let want16 = [
            dot_in_avx512_order(&q, &kh[..d], false).to_bits(),
            dot_in_avx512_order(&q, &kh[d..], false).to_bits(),
        ];
        for k in &same_order {
            let what = format!("{} d {d}", k.isa);
            assert_eq!(
                (k.dot_f32)(&q, &keys[..d]).to_bits(),
                want32[0],
                "dot_f32 {what}"
            );
            assert_eq!(
                (k.dot_f16)(&q, &kh[..d]).to_bits(),
                want16[0],
                "dot_f16 {what}"
            );
            let (mut g32, mut g16) = ([0.0f32; 2], [0.0f32; 2]);
            (k.gather_f32)(&q, &keys, d, &[1, 0], &mut g32);
            (k.gather_f16)(&q, &kh, d, &[1, 0], &mut g16);
            assert_eq!(
                [g32[1].to_bits(), g32[0].to_bits()],
                want32,
                "gather_f32 {what}"
            );
            assert_eq!(
                [g16[1].to_bits(), g16[0].to_bits()],
                want16,
                "gather_f16 {what}"
            );
            let (mut r32, mut r16) = ([0.0f32; 2], [0.0f32; 2]);
            (k.range_f32)(&q, &keys, d, &mut r32);
            (k.range_f16)(&q, &kh, d, &mut r16);
            assert_eq!(r32.map(f32::to_bits), want32, "range_f32 {what}");
            assert_eq!(r16.map(f32::to_bits), want16, "range_f16 {what}");
        }
    }
    eprintln!(
        "checked against the AVX-512 order: {:?}",
        same_order.iter().map(|k| k.isa).collect::<Vec<_>>()
    );
}

/// Gathers score four rows per step where a set has a four-row kernel (AVX2, `dim` a multiple
/// of 8): every row must get the bits of the one-row dot kernel, at every count of ids (full
/// blocks and the rest), and with repeated ids.
#[test]
fn gather_blocks_match_dot_bit_for_bit() {
    for k in Kernels::available() {
        for d in [8usize, 16, 24, 40, 64, 72, 128, 136, 256, 12] {
            let n = 11usize;
            let q: Vec<f32> = (0..d)
                .map(|i| ((i * 41 % 97) as f32 - 48.0) / 5.0)
                .collect();
            let keys: Vec<f32> = (0..d * n)
                .map(|i| ((i * 7907 % 223) as f32 - 111.0) / 11.0)
                .collect();
            let (kh, _) = f16_round(&keys);
            for count in 0..=10usize {
                let ids: Vec<u32> = (0..count).map(|i| ((i * 5 + 3) % n) as u32).collect();
                let (mut g32, mut g16) = (vec![f32::NAN; count], vec![f32::NAN; count]);
                (k.gather_f32)(&q, &keys, d, &ids, &mut g32);
                (k.gather_f16)(&q, &kh, d, &ids, &mut g16);
                for (i, &id) in ids.iter().enumerate() {
                    let row = id as usize * d..(id as usize + 1) * d;
                    let what = format!("{} d {d} count {count} #{i}", k.isa);
                    assert_eq!(
                        g32[i].to_bits(),
                        (k.dot_f32)(&q, &keys[row.clone()]).to_bits(),
                        "f32 {what}"
                    );
                    assert_eq!(
                        g16[i].to_bits(),
                        (k.dot_f16)(&q, &kh[row]).to_bits(),
                        "f16 {what}"
                    );
                }
            }
        }
    }
}
