//! Every int8 kernel set the CPU supports agrees with the scalar reference: f32 × int8 rows
//! within f32 rounding of the exact sum, and the integer code estimates bit for bit.

use proptest::prelude::*;
use qkindex::metric::affine::Affine;
use qkindex::metric::int8::{quantize_row, I8Kernels, QuantQuery, GROUP};
use qkindex::metric::scalar::dot_f64;
use qkindex::{Dtype, KeyStore};

fn assert_close(got: f32, a: &[f32], b: &[i8], what: &str) {
    let bf: Vec<f32> = b.iter().map(|&c| f32::from(c)).collect();
    let want = dot_f64(a, &bf);
    let mag: f64 = a
        .iter()
        .zip(&bf)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum();
    let tol = 1e-4 * mag + 1e-6;
    let err = (got as f64 - want).abs();
    assert!(
        err <= tol,
        "{what}: got {got}, want {want}, |err| {err} > {tol} (dim {})",
        a.len()
    );
}

fn code() -> impl Strategy<Value = i8> {
    -127i8..=127
}

/// A query, `n` int8 rows with scales, and row ids (repeats allowed).
fn case() -> impl Strategy<Value = (Vec<f32>, Vec<i8>, Vec<f32>, usize, Vec<u32>)> {
    (1usize..=300, 1usize..=10).prop_flat_map(|(d, n)| {
        (
            proptest::collection::vec(-50.0f32..50.0, d),
            proptest::collection::vec(code(), d * n),
            proptest::collection::vec(0.0f32..2.0, n),
            Just(d),
            proptest::collection::vec(0..n as u32, 0..=20),
        )
    })
}

#[test]
fn scalar_set_is_last_and_this_cpu_lists_its_sets() {
    let all = I8Kernels::available();
    assert_eq!(all.last().map(|k| k.isa), Some("scalar"));
    eprintln!(
        "int8 kernel sets: {:?}",
        all.iter().map(|k| k.isa).collect::<Vec<_>>()
    );
}

#[test]
fn every_dim_from_1_to_300_matches_reference() {
    let mut rng = qkindex::synth::Rng::new(5);
    for d in 1..=300 {
        let a: Vec<f32> = (0..d).map(|_| rng.normal() * 3.0).collect();
        let b: Vec<i8> = (0..d)
            .map(|_| (rng.normal() * 60.0).clamp(-127.0, 127.0) as i8)
            .collect();
        let qa: Vec<i8> = (0..d)
            .map(|_| (rng.normal() * 60.0).clamp(-127.0, 127.0) as i8)
            .collect();
        let exact = qkindex::metric::int8::dot_q8(&qa, &b);
        for k in I8Kernels::available() {
            assert_close((k.dot)(&a, &b), &a, &b, &format!("{} dot d {d}", k.isa));
            assert_eq!((k.dot_q8)(&qa, &b), exact, "{} dot_q8 d {d}", k.isa);
        }
    }
}

#[test]
fn extreme_codes_do_not_overflow() {
    for d in [64usize, 256, 1000] {
        let a = vec![-127i8; d];
        let b = vec![-127i8; d];
        let c = vec![127i8; d];
        for k in I8Kernels::available() {
            assert_eq!((k.dot_q8)(&a, &b), 127 * 127 * d as i32, "{}", k.isa);
            assert_eq!((k.dot_q8)(&a, &c), -127 * 127 * d as i32, "{}", k.isa);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn gather_and_range_match_reference((q, codes, scales, d, ids) in case()) {
        let n = scales.len();
        let mut qq = QuantQuery::default();
        qq.set(&q);
        for k in I8Kernels::available() {
            let mut g = vec![f32::NAN; ids.len()];
            (k.gather)(&q, &codes, &scales, d, &ids, &mut g);
            let mut r = vec![f32::NAN; n];
            (k.range)(&q, &codes, &scales, d, &mut r);
            let mut e = vec![f32::NAN; ids.len()];
            (k.gather_q8)(&qq, &codes, &scales, d, &ids, &mut e);
            for (i, &id) in ids.iter().enumerate() {
                let row = &codes[id as usize * d..(id as usize + 1) * d];
                let s = scales[id as usize];
                let dot = (k.dot)(&q, row);
                prop_assert_eq!(g[i].to_bits(), (s * dot).to_bits());
                prop_assert_eq!(r[id as usize].to_bits(), (s * dot).to_bits());
                assert_close(dot, &q, row, &format!("{} gather #{i}", k.isa));
                let want = qq.estimate(qkindex::metric::int8::dot_q8(&qq.codes, row), s);
                prop_assert_eq!(e[i].to_bits(), want.to_bits(), "{} gather_q8 #{}", k.isa, i);
            }
        }
    }

    /// An int8 store scores its decoded keys (`q · offset + scale · ((q ⊙ range) · code)`) the
    /// same through all three scorer entry points, bound to the query or not, and its decoded keys are within half a step
    /// of the input, dimension by dimension.
    #[test]
    fn i8_store_scorer_and_rows((q, _c, _s, d, ids) in case(), seed in 0u64..1000) {
        let n = 1 + ids.iter().copied().max().unwrap_or(0) as usize;
        let mut rng = qkindex::synth::Rng::new(seed);
        let keys: Vec<f32> = (0..n * d).map(|_| rng.normal() * 4.0).collect();
        let store = KeyStore::from_f32_as(keys.clone(), d, Dtype::I8).expect("store");
        prop_assert_eq!(store.dtype(), Dtype::I8);
        prop_assert_eq!(store.bytes(), n * (d + 4) + 8 * d);
        let deq = store.to_f32();
        let affine = Affine::fit(d, keys.chunks_exact(d));
        for (row, back) in keys.chunks_exact(d).zip(deq.chunks_exact(d)) {
            let mut codes = vec![0i8; d];
            let scale = affine.encode(&mut row.to_vec(), &mut codes);
            for ((&x, &y), r) in row.iter().zip(back).zip(affine.range()) {
                prop_assert!((x - y).abs() <= r * scale / 2.0 + 1e-5 * x.abs().max(1.0));
            }
        }
        let scorer = store.scorer();
        let mut by_ids = vec![f32::NAN; ids.len()];
        scorer.score_ids(&q, &ids, &mut by_ids);
        let mut by_range = vec![f32::NAN; n];
        scorer.score_range(&q, 0, &mut by_range);
        let mut buf = Vec::new();
        let bound = scorer.bind(&q, &mut buf);
        let mut bound_ids = vec![f32::NAN; ids.len()];
        bound.score_ids(&ids, &mut bound_ids);
        let mut bound_range = vec![f32::NAN; n];
        bound.score_range(0, &mut bound_range);
        for (i, &id) in ids.iter().enumerate() {
            prop_assert_eq!(by_ids[i].to_bits(), bound_ids[i].to_bits());
            prop_assert_eq!(by_ids[i].to_bits(), bound.score(id).to_bits());
            prop_assert_eq!(by_range[id as usize].to_bits(), bound_range[id as usize].to_bits());
            prop_assert_eq!(by_ids[i].to_bits(), scorer.score(&q, id).to_bits());
            prop_assert_eq!(by_ids[i].to_bits(), by_range[id as usize].to_bits());
            let want: f64 = dot_f64(&q, &deq[id as usize * d..(id as usize + 1) * d]);
            prop_assert!((by_ids[i] as f64 - want).abs() <= 1e-3 * want.abs().max(1.0));
        }
    }
}

/// Beside an outlier channel (a large offset and spread, as LLM keys have), the store's
/// per-dimension ranges keep the small dimensions: its scores stay within a tenth of the error
/// that per-key scales alone allow, and a flat scan finds the exact top-10.
#[test]
fn i8_store_keeps_small_dimensions_next_to_an_outlier_channel() {
    let (n, d) = (2000usize, 64usize);
    let mut rng = qkindex::synth::Rng::new(4);
    let keys: Vec<f32> = (0..n * d)
        .map(|i| {
            if i % d == 0 {
                80.0 + 10.0 * rng.normal()
            } else {
                rng.normal()
            }
        })
        .collect();
    let store = KeyStore::from_f32_as(keys.clone(), d, Dtype::I8).expect("store");
    let scorer = store.scorer();
    let mut worst = 0.0f64;
    let mut worst_per_key = 0.0f64;
    let mut found = 0;
    for _ in 0..20 {
        let q: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
        let exact: Vec<f64> = keys.chunks_exact(d).map(|k| dot_f64(&q, k)).collect();
        let mut got = vec![0.0f32; n];
        scorer.score_range(&q, 0, &mut got);
        for (id, (&e, &g)) in exact.iter().zip(&got).enumerate() {
            worst = worst.max((e - f64::from(g)).abs());
            let row = &keys[id * d..(id + 1) * d];
            let mut codes = vec![0i8; d];
            let s = quantize_row(row, &mut codes);
            let per_key: Vec<f32> = codes.iter().map(|&c| s * f32::from(c)).collect();
            worst_per_key = worst_per_key.max((e - dot_f64(&q, &per_key)).abs());
        }
        let top = |v: &mut Vec<(f64, usize)>| {
            v.sort_by(|a, b| b.0.total_cmp(&a.0));
            v.iter().take(10).map(|p| p.1).collect::<Vec<_>>()
        };
        let want = top(&mut exact.iter().copied().zip(0..).collect());
        let have = top(&mut got.iter().map(|&g| f64::from(g)).zip(0..).collect());
        found += want.iter().filter(|i| have.contains(i)).count();
    }
    assert!(
        worst < 0.1 * worst_per_key,
        "{worst} vs per key {worst_per_key}"
    );
    assert!(found >= 195, "top-10 found {found} of 200");
}

#[test]
fn push_codes_each_key_and_gather_keeps_codes() {
    let mut s = KeyStore::empty(Dtype::I8, 3).expect("store");
    assert_eq!(s.push(&[1.27, -0.5, 0.0]).expect("push"), 0);
    assert_eq!(s.push(&[0.0, 0.0, 0.0]).expect("push"), 1);
    assert!(s.push(&[f32::NAN, 0.0, 0.0]).is_err());
    let mut row = [0.0; 3];
    s.row_into(0, &mut row);
    assert!((row[0] - 1.27).abs() < 1e-6 && (row[1] + 0.5).abs() < 0.006 && row[2] == 0.0);
    s.row_into(1, &mut row);
    assert_eq!(row, [0.0; 3]);
    let g = s.gather(&[1, 0]).expect("gather");
    assert_eq!(g.dtype(), Dtype::I8);
    assert_eq!(g.to_f32()[3..], s.to_f32()[..3]);
    assert_eq!("i8".parse::<Dtype>().expect("parses"), Dtype::I8);
    assert_eq!(Dtype::I8.numpy_name(), "int8");
}

/// `rows` (`GROUP` rows of `d` codes) interleaved as [`qkindex::metric::int8::group_q8`] reads
/// them: `quads` lines of 64 bytes, then (for `scan_q8`) a line of scales and a line of ids.
fn interleave(rows: &[Vec<i8>], scales: &[f32], quads: usize) -> Vec<u8> {
    let mut g = vec![0x80u8; (quads + 2) * 4 * GROUP];
    for (s, row) in rows.iter().enumerate() {
        for (i, &c) in row.iter().enumerate() {
            g[64 * (i / 4) + 4 * s + i % 4] = (c as u8) ^ 0x80;
        }
        g[64 * quads + 4 * s..64 * quads + 4 * s + 4].copy_from_slice(&scales[s].to_le_bytes());
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every set's group kernel equals the scalar row-by-row integer dot products bit for bit
    /// (rows past the ones given hold code 0), and the fused scan equals their estimates
    /// within the rounding of one fused multiply-add.
    #[test]
    fn group_and_scan_kernels_match_row_dots(
        d in 1usize..=300,
        rows in 1usize..=GROUP,
        groups in 1usize..=3,
        seed in 0u64..1000,
    ) {
        let quads = d.div_ceil(4);
        let mut rng = qkindex::synth::Rng::new(seed);
        let mut code = || (rng.normal() * 70.0).clamp(-127.0, 127.0) as i8;
        let q: Vec<i8> = (0..4 * quads).map(|i| if i < d { code() } else { 0 }).collect();
        let mut all = Vec::new();
        let mut want = Vec::new();
        let mut qq = QuantQuery::default();
        let qf: Vec<f32> = q[..d].iter().map(|&c| f32::from(c) * 0.01).collect();
        qq.set(&qf);
        qq.codes.resize(4 * quads, 0);
        qq.bias = 0.25;
        for g in 0..groups {
            let codes: Vec<Vec<i8>> = (0..rows).map(|_| (0..d).map(|_| code()).collect()).collect();
            let scales: Vec<f32> = (0..GROUP).map(|s| 0.5 + (s + g) as f32 * 0.125).collect();
            let bytes = interleave(&codes, &scales, quads);
            for k in I8Kernels::available() {
                let mut out = [i32::MIN; GROUP];
                (k.group_q8)(&q, &bytes[..64 * quads], &mut out);
                for (s, &got) in out.iter().enumerate() {
                    let exact = codes.get(s).map_or(0, |row| qkindex::metric::int8::dot_q8(&q[..d], row));
                    prop_assert_eq!(got, exact, "{} group_q8 d {} row {}", k.isa, d, s);
                }
            }
            for (s, &scale) in scales.iter().enumerate() {
                let dot = codes.get(s).map_or(0, |row| qkindex::metric::int8::dot_q8(&qq.codes[..d], row));
                want.push(qq.estimate(dot, scale));
            }
            all.extend(bytes);
        }
        for k in I8Kernels::available() {
            let mut est = vec![f32::NAN; groups * GROUP];
            (k.scan_q8)(&qq, &all, quads, &mut est);
            for (i, (&e, &w)) in est.iter().zip(&want).enumerate() {
                prop_assert!((e - w).abs() <= 1e-5 * (w.abs() + (w - qq.bias).abs()).max(1.0), "{} scan_q8 #{}: {} vs {}", k.isa, i, e, w);
            }
        }
    }
}

#[test]
fn group_kernel_extremes_do_not_overflow() {
    for d in [64usize, 256, 512] {
        let quads = d.div_ceil(4);
        let q = vec![-127i8; 4 * quads];
        let rows: Vec<Vec<i8>> = (0..GROUP)
            .map(|s| vec![if s % 2 == 0 { -127 } else { 127 }; d])
            .collect();
        let bytes = interleave(&rows, &[1.0; GROUP], quads);
        for k in I8Kernels::available() {
            let mut out = [0i32; GROUP];
            (k.group_q8)(&q, &bytes[..64 * quads], &mut out);
            for (s, &o) in out.iter().enumerate() {
                let sign = if s % 2 == 0 { 1 } else { -1 };
                assert_eq!(o, sign * 127 * 127 * d as i32, "{} d {d}", k.isa);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every set's 4-bit scan equals the scalar reference (any nibbles, dims padded to 8)
    /// within the rounding of one fused multiply-add.
    #[test]
    fn scan_q4_matches_reference(
        octets in 1usize..=40,
        groups in 1usize..=3,
        seed in 0u64..1000,
    ) {
        let mut rng = qkindex::synth::Rng::new(seed);
        let mut qq = QuantQuery::default();
        let qf: Vec<f32> = (0..8 * octets).map(|_| rng.normal()).collect();
        qq.set(&qf);
        qq.bias = -0.5;
        let bytes = (octets + 2) * 4 * GROUP;
        let mut all = vec![0u8; groups * bytes];
        for g in 0..groups {
            for (i, b) in all[g * bytes..g * bytes + 64 * octets].iter_mut().enumerate() {
                *b = ((rng.normal() * 1000.0).abs() as usize % 256).wrapping_add(i) as u8;
            }
            for s in 0..GROUP {
                let at = g * bytes + 64 * octets + 4 * s;
                all[at..at + 4].copy_from_slice(&(0.25 + s as f32 * 0.5).to_le_bytes());
            }
        }
        let mut want = vec![f32::NAN; groups * GROUP];
        qkindex::metric::int8::scan_q4(&qq, &all, octets, &mut want);
        for k in I8Kernels::available() {
            let mut est = vec![f32::NAN; groups * GROUP];
            (k.scan_q4)(&qq, &all, octets, &mut est);
            for (i, (&e, &w)) in est.iter().zip(&want).enumerate() {
                prop_assert!((e - w).abs() <= 1e-5 * (w.abs() + (w - qq.bias).abs()).max(1.0), "{} scan_q4 #{}: {} vs {}", k.isa, i, e, w);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every set's batched scan (`scan_q8_rows`: one pass for all the queries where the set
    /// has `scan_q8_many`) writes each query's row bit for bit as the set's own `scan_q8` does
    /// for that query alone: 1 to 19 queries (passes of 8 and their remainders), any biases.
    #[test]
    fn batched_scan_rows_equal_one_scan_per_query(
        d in 1usize..=200,
        queries in 1usize..=19,
        groups in 1usize..=4,
        seed in 0u64..1000,
    ) {
        let quads = d.div_ceil(4);
        let mut rng = qkindex::synth::Rng::new(seed);
        let mut all = Vec::new();
        for g in 0..groups {
            let codes: Vec<Vec<i8>> = (0..GROUP)
                .map(|_| (0..d).map(|_| (rng.normal() * 70.0).clamp(-127.0, 127.0) as i8).collect())
                .collect();
            let scales: Vec<f32> = (0..GROUP).map(|s| 0.25 + (s * 3 + g) as f32 * 0.0625).collect();
            all.extend(interleave(&codes, &scales, quads));
        }
        let qs: Vec<QuantQuery> = (0..queries)
            .map(|b| {
                let mut qq = QuantQuery::default();
                let qf: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
                qq.set(&qf);
                qq.codes.resize(4 * quads, 0);
                qq.bias = 0.125 * b as f32 - 0.5;
                qq
            })
            .collect();
        // Rows one slot longer than the groups: the slot past them is left as it was.
        let stride = groups * GROUP + 1;
        for k in I8Kernels::available() {
            let mut rows = vec![f32::NAN; queries * stride];
            k.scan_q8_rows(&qs, &all, quads, &mut rows);
            for (b, (qq, row)) in qs.iter().zip(rows.chunks_exact(stride)).enumerate() {
                let mut one = vec![f32::NAN; groups * GROUP];
                (k.scan_q8)(qq, &all, quads, &mut one);
                for (i, (&got, &want)) in row.iter().zip(&one).enumerate() {
                    prop_assert_eq!(got.to_bits(), want.to_bits(), "{} query {} of {} #{}: {} vs {}", k.isa, b, queries, i, got, want);
                }
                prop_assert!(row[groups * GROUP].is_nan(), "{} query {}: wrote past its groups", k.isa, b);
            }
        }
    }
}
