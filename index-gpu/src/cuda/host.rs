//! The host side of a call: keys and queries as padded f16 rows, scaled into the f16 range
//! where needed; the GPU's lists rescored exactly in f32, or their scores unscaled.

use half::f16;
use qkindex::store::KeysRef;
use qkindex::{KeyStore, KnnResult};
use rayon::prelude::*;

/// Largest magnitude sent to the GPU: f16's maximum is 65,504; scores accumulate in f32.
const F16_SAFE: f32 = 60_000.0;

/// Keys as padded f16 bits: `n` rounded up to `row_multiple` rows × `dp` columns, zeros beyond.
/// Keys beyond the f16 range are all scaled by one positive factor (returned), which keeps every
/// query's ranking.
pub(super) fn pad_keys(keys: &KeyStore, dp: usize, row_multiple: usize) -> (Vec<u16>, f32) {
    let (n, d) = (keys.len(), keys.dim());
    let rows = n.next_multiple_of(row_multiple);
    let mut out = vec![0u16; rows * dp];
    let scale = match keys.rows() {
        KeysRef::F16(_) => 1.0,
        KeysRef::F32(x) => {
            let max = x
                .par_iter()
                .fold(|| 0.0f32, |a, v| a.max(v.abs()))
                .reduce(|| 0.0, f32::max);
            if max > F16_SAFE {
                F16_SAFE / max
            } else {
                1.0
            }
        }
        // Int8 keys are `offset + range · scale · code` with |code| <= 127.
        KeysRef::I8 { scales, affine, .. } => {
            let s = scales.iter().fold(0.0f32, |a, &s| a.max(s)) * 127.0;
            let max = affine
                .offset()
                .iter()
                .zip(affine.range())
                .fold(0.0f32, |a, (o, r)| a.max(o.abs() + r * s));
            if max > F16_SAFE {
                F16_SAFE / max
            } else {
                1.0
            }
        }
    };
    out.par_chunks_mut(dp).take(n).enumerate().for_each_init(
        || vec![0.0f32; d],
        |key, (i, row)| match keys.rows() {
            KeysRef::F16(x) => {
                for (o, v) in row.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *o = v.to_bits();
                }
            }
            KeysRef::F32(x) => {
                for (o, v) in row.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *o = f16::from_f32(v * scale).to_bits();
                }
            }
            KeysRef::I8 {
                codes,
                scales,
                affine,
            } => {
                affine.decode(scales[i], &codes[i * d..(i + 1) * d], key);
                for (o, v) in row.iter_mut().zip(key.iter()) {
                    *o = f16::from_f32(v * scale).to_bits();
                }
            }
        },
    );
    (out, scale)
}

/// Queries as padded f16 bits (rows rounded up to `row_multiple`), each row scaled into the f16
/// range if it leaves it (a positive factor per query keeps its ranking); returns the factors.
pub(super) fn pad_queries(
    q: &[f32],
    d: usize,
    dp: usize,
    row_multiple: usize,
) -> (Vec<u16>, Vec<f32>) {
    let m = q.len() / d;
    let mut out = vec![0u16; m.next_multiple_of(row_multiple) * dp];
    let mut scales = vec![1.0f32; m];
    out.par_chunks_mut(dp)
        .zip(scales.par_iter_mut())
        .zip(q.par_chunks(d))
        .for_each(|((row, s), x)| {
            let max = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            if max > F16_SAFE {
                *s = F16_SAFE / max;
            }
            for (o, v) in row.iter_mut().zip(x) {
                *o = f16::from_f32(v * *s).to_bits();
            }
        });
    (out, scales)
}

/// Replaces the GPU's scores by exact f32 products and re-sorts each row, best first (ties by id).
pub(super) fn rescore(queries: &[f32], keys: &KeyStore, k: usize, ids: &mut [u32], s: &mut [f32]) {
    let d = keys.dim();
    let scorer = keys.scorer();
    ids.par_chunks_mut(k)
        .zip(s.par_chunks_mut(k))
        .zip(queries.par_chunks(d))
        .for_each_init(Vec::new, |pairs, ((row_ids, row_s), q)| {
            pairs.clear();
            for &id in row_ids.iter().filter(|&&id| id != KnnResult::PAD) {
                pairs.push((scorer.score(q, id), id));
            }
            pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (j, (o_id, o_s)) in row_ids.iter_mut().zip(row_s.iter_mut()).enumerate() {
                match pairs.get(j) {
                    Some(&(sc, id)) => {
                        *o_id = id;
                        *o_s = sc;
                    }
                    None => {
                        *o_id = KnnResult::PAD;
                        *o_s = f32::NEG_INFINITY;
                    }
                }
            }
        });
}

/// Undoes the range scaling of [`pad_queries`] and [`pad_keys`] on GPU scores.
pub(super) fn unscale(scores: &mut [f32], k: usize, query_scales: &[f32], key_scale: f32) {
    scores
        .par_chunks_mut(k)
        .zip(query_scales.par_iter())
        .for_each(|(row, &qs)| {
            let f = 1.0 / (qs * key_scale);
            if f != 1.0 {
                for v in row.iter_mut().filter(|v| v.is_finite()) {
                    *v *= f;
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_keeps_inner_products_and_scales_out_of_range_rows() {
        let keys = KeyStore::from_f32(vec![1.0, -2.0, 3.0, 0.5, 0.25, -0.125], 3).expect("keys");
        let (kh, ks) = pad_keys(&keys, 16, 64);
        assert_eq!(kh.len(), 64 * 16);
        assert_eq!(ks, 1.0);
        assert_eq!(f16::from_bits(kh[16 + 2]).to_f32(), -0.125);
        assert!(kh[3..16].iter().all(|&b| b == 0));
        let (qh, qs) = pad_queries(&[1e6, 2.0, -3.0, 1.0, 2.0, 3.0], 3, 16, 64);
        assert_eq!(qh.len(), 64 * 16);
        assert!(qs[0] < 1.0 && qs[1] == 1.0);
        let big = f16::from_bits(qh[0]).to_f32();
        assert!(big.is_finite() && big <= 65_504.0);
    }

    #[test]
    fn rescore_sorts_by_exact_scores_and_keeps_padding() {
        let keys = KeyStore::from_f32(vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 2).expect("keys");
        let q = [1.0f32, 2.0];
        let mut ids = vec![0, 2, 1, KnnResult::PAD];
        let mut s = vec![0.0; 4];
        rescore(&q, &keys, 4, &mut ids, &mut s);
        assert_eq!(ids, vec![2, 1, 0, KnnResult::PAD]);
        assert_eq!(s[..3], [3.0, 2.0, 1.0]);
        assert_eq!(s[3], f32::NEG_INFINITY);
    }
}
