//! Exact attention on the CPU: causal grouped-query attention over a layer's cached keys and
//! values (f32, or an f16 copy: [`KvElem`]), in key tiles with an online softmax, a sliding
//! window computed as a window, and decode steps split into key chunks (flash-decoding).

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use super::simd::{self, exp_f32};

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Row stride (positions) of each KV head's block in the cache.
    pub capacity: usize,
    /// Sliding window: the query at `p` attends keys `p + 1 - w ..= p` only; `None`: `0..=p`.
    pub window: Option<usize>,
}

impl AttnShape {
    /// First key the query at position `p` attends.
    fn first_key(&self, p: usize) -> usize {
        self.window.map_or(0, |w| (p + 1).saturating_sub(w))
    }
}

/// Query rows per attention task (times the GQA group size).
const QUERY_BLOCK: usize = 64;
/// Keys per score tile: a `rows × KEY_TILE` tile (192 × 1024 floats, 768 KiB) stays in L2 while it
/// is scored, exponentiated and multiplied by the values (the flash-attention schedule). 1024 beat
/// 256 by ~15% at 4K tokens: fewer, larger GEMM calls.
const KEY_TILE: usize = 1024;
/// Keys per task when a single query block cannot keep the cores busy (decode): the key range is
/// split and the partial softmaxes are merged (flash-decoding).
const DECODE_KEY_CHUNK: usize = 1024;
/// The smallest chunk a decode step's keys are split into to give every thread a part: a
/// sliding window of 512 keys (Gemma 3's local layers) was one task on one core of two.
const MIN_DECODE_CHUNK: usize = 128;
/// Stacked query rows up to which scores use dot products instead of a GEMM call.
const SMALL_ROWS: usize = 16;

/// An element type of cached keys and values: f32, read in place, or f16, converted tile by tile
/// into a scratch buffer (where it stays in L2 while it is used).
pub trait KvElem: Copy + Send + Sync {
    /// `src` as f32: itself, or converted into `buf`.
    fn tile<'a>(src: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32];
}

impl KvElem for f32 {
    fn tile<'a>(src: &'a [f32], _: &'a mut Vec<f32>) -> &'a [f32] {
        src
    }
}

impl KvElem for half::f16 {
    fn tile<'a>(src: &'a [half::f16], buf: &'a mut Vec<f32>) -> &'a [f32] {
        if buf.len() < src.len() {
            buf.resize(src.len(), 0.0);
        }
        let out = &mut buf[..src.len()];
        simd::f16_to_f32(src, out);
        out
    }
}

/// Online-softmax state of `rows` query rows over a range of keys: running max `m`, sum of
/// exponentials `l`, unnormalized output `o` (row-major `rows × head_dim`).
#[derive(Debug)]
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
}

/// Attention of the stacked query rows `qb` (row-major `rows × hd`) over keys `k0..k1` of one KV
/// head (`kh`, `vh`: row-major `keys × hd`). Row `i` sees keys in `valid(i) = (lo, hi)` only (the
/// causal mask, and a sliding window's start).
fn attend_rows<T: KvElem>(
    qb: &[f32],
    hd: usize,
    kh: &[T],
    vh: &[T],
    (k0, k1): (usize, usize),
    valid: impl Fn(usize) -> (usize, usize),
    scale: f32,
) -> Partial {
    let rows = qb.len() / hd;
    let mut p = Partial {
        m: vec![f32::NEG_INFINITY; rows],
        l: vec![0f32; rows],
        o: vec![0f32; rows * hd],
    };
    let mut scores = vec![0f32; rows * KEY_TILE];
    // The f16 tiles' f32 copies: one pair per thread, grown once (a decode step runs hundreds
    // of these calls; zeroing fresh 256 KiB buffers in each cost more than f16 saved).
    thread_local! {
        static TILE_BUFS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    TILE_BUFS.with_borrow_mut(|(kbuf, vbuf)| {
        attend_tiles(
            qb,
            hd,
            kh,
            vh,
            (k0, k1),
            &valid,
            scale,
            &mut p,
            &mut scores,
            kbuf,
            vbuf,
        )
    });
    p
}

/// The tile loop of [`attend_rows`], accumulating into `p`.
#[allow(clippy::too_many_arguments)]
fn attend_tiles<T: KvElem>(
    qb: &[f32],
    hd: usize,
    kh: &[T],
    vh: &[T],
    (k0, k1): (usize, usize),
    valid: &impl Fn(usize) -> (usize, usize),
    scale: f32,
    p: &mut Partial,
    scores: &mut [f32],
    kbuf: &mut Vec<f32>,
    vbuf: &mut Vec<f32>,
) {
    let rows = qb.len() / hd;
    let mut t0 = k0;
    while t0 < k1 {
        let t1 = (t0 + KEY_TILE).min(k1);
        let w = t1 - t0;
        let st = &mut scores[..rows * w];
        let kt = T::tile(&kh[t0 * hd..t1 * hd], kbuf);
        let vt = T::tile(&vh[t0 * hd..t1 * hd], vbuf);
        if rows <= SMALL_ROWS {
            // Decode: a few rows; plain dot products beat a GEMM call here.
            simd::scores_small(qb, kt, hd, scale, st);
        } else {
            matmul(
                MatMut::from_row_major_slice_mut(st, rows, w),
                Accum::Replace,
                MatRef::from_row_major_slice(qb, rows, hd),
                MatRef::from_row_major_slice(kt, w, hd).transpose(),
                scale,
                Par::Seq,
            );
        }
        for (i, sr) in st.chunks_exact_mut(w).enumerate() {
            let (lo, hi) = valid(i);
            let live_end = hi.saturating_sub(t0).min(w);
            let live_start = lo.saturating_sub(t0).min(live_end);
            let (head, off) = sr.split_at_mut(live_end);
            off.fill(0.0);
            let (before, on) = head.split_at_mut(live_start);
            before.fill(0.0);
            if on.is_empty() {
                continue;
            }
            let m_new = p.m[i].max(simd::max(on));
            let alpha = if p.m[i] == f32::NEG_INFINITY {
                0.0
            } else {
                exp_f32(p.m[i] - m_new)
            };
            p.l[i] = p.l[i] * alpha + simd::exp_shift_sum(on, m_new);
            p.m[i] = m_new;
            if alpha != 1.0 {
                for x in &mut p.o[i * hd..(i + 1) * hd] {
                    *x *= alpha;
                }
            }
        }
        if rows <= SMALL_ROWS {
            simd::weighted_sum_small(st, vt, hd, &mut p.o);
        } else {
            matmul(
                MatMut::from_row_major_slice_mut(&mut p.o, rows, hd),
                Accum::Add,
                MatRef::from_row_major_slice(st, rows, w),
                MatRef::from_row_major_slice(vt, w, hd),
                1.0f32,
                Par::Seq,
            );
        }
        t0 = t1;
    }
}

/// Causal grouped-query attention of `n` new queries at positions `pos0..pos0 + n` against the cached
/// keys/values `0..pos0 + n` (with `s.window`, only the last `w` of them per query).
///
/// `q` and `out`: row-major `n × (n_heads · head_dim)`. `k_cache`, `v_cache`: `n_kv_heads` blocks of
/// row-major `capacity × head_dim`, positions `0..pos0 + n` filled. Query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`. One task per (KV head, block of queries, key chunk) stacks the
/// group's query heads, so each key tile is read once per group; scores live in `rows × KEY_TILE`
/// tiles with an online softmax, never `n × n × heads`. A sliding window is computed as a
/// window: a query block reads only the keys from its first query's window start on, so its work
/// is `rows × (w + rows)`, not `rows × pos`. A single query block (decode) splits its keys into
/// chunks whose partial softmaxes are merged exactly. The cache is f32 or f16 ([`KvElem`]).
pub fn attention<T: KvElem>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    s: AttnShape,
    pos0: usize,
    n: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let width = s.n_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let n_blocks = n.div_ceil(QUERY_BLOCK);
    let span = pos0 + n - s.first_key(pos0);
    let n_chunks = if n_blocks == 1 {
        // A multiple of the threads (each gets as many keys), at least one chunk per thread
        // where the keys allow chunks of MIN_DECODE_CHUNK, and chunks of at most
        // DECODE_KEY_CHUNK.
        let threads = rayon::current_num_threads()
            .min(span.div_ceil(MIN_DECODE_CHUNK))
            .max(1);
        span.div_ceil(DECODE_KEY_CHUNK).div_ceil(threads).max(1) * threads
    } else {
        1
    };
    let chunk = span.div_ceil(n_chunks).max(1);
    let tasks: Vec<(usize, usize, usize)> = (0..s.n_kv_heads)
        .flat_map(|g| (0..n_blocks).flat_map(move |b| (0..n_chunks).map(move |c| (g, b, c))))
        .collect();
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map(|&(g, b, c)| {
            let r0 = b * QUERY_BLOCK;
            let r1 = (r0 + QUERY_BLOCK).min(n);
            let keys = pos0 + r1;
            let first = s.first_key(pos0 + r0);
            let (k0, k1) = if n_chunks == 1 {
                (first, keys)
            } else {
                (
                    (first + c * chunk).min(keys),
                    (first + (c + 1) * chunk).min(keys),
                )
            };
            // Stack the group's heads: row (r - r0) * group + j is query r of head g * group + j.
            let mut qb = vec![0f32; (r1 - r0) * group * hd];
            for r in r0..r1 {
                for j in 0..group {
                    let h = g * group + j;
                    let row = (r - r0) * group + j;
                    qb[row * hd..(row + 1) * hd]
                        .copy_from_slice(&q[r * width + h * hd..r * width + (h + 1) * hd]);
                }
            }
            let base = g * s.capacity * hd;
            let kh = &k_cache[base..base + keys * hd];
            let vh = &v_cache[base..base + keys * hd];
            attend_rows(
                &qb,
                hd,
                kh,
                vh,
                (k0, k1),
                |i| {
                    let p = pos0 + r0 + i / group;
                    (s.first_key(p), p + 1)
                },
                scale,
            )
        })
        .collect();
    // Merge the chunks of each (KV head, block) and scatter the normalized rows.
    for (ti, part) in partials.chunks(n_chunks).enumerate() {
        let (g, b, _) = tasks[ti * n_chunks];
        let r0 = b * QUERY_BLOCK;
        let rows = part[0].m.len();
        for i in 0..rows {
            let m = part
                .iter()
                .map(|p| p.m[i])
                .fold(f32::NEG_INFINITY, f32::max);
            let r = r0 + i / group;
            let h = g * group + i % group;
            let dst = &mut out[r * width + h * hd..r * width + (h + 1) * hd];
            dst.fill(0.0);
            let mut l = 0f32;
            for p in part.iter().filter(|p| p.m[i] > f32::NEG_INFINITY) {
                let w = exp_f32(p.m[i] - m);
                l += p.l[i] * w;
                for (d, &o) in dst.iter_mut().zip(&p.o[i * hd..(i + 1) * hd]) {
                    *d += o * w;
                }
            }
            let inv = 1.0 / l;
            for d in dst.iter_mut() {
                *d *= inv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::dot;
    use super::*;

    /// Naive attention of query row `r` (position `r`), head `h`, over keys `lo..=r`.
    fn naive_row(
        q: &[f32],
        kc: &[f32],
        vc: &[f32],
        s: AttnShape,
        r: usize,
        h: usize,
        lo: usize,
    ) -> Vec<f32> {
        let hd = s.head_dim;
        let width = s.n_heads * hd;
        let g = h / (s.n_heads / s.n_kv_heads);
        let qh = &q[r * width + h * hd..r * width + (h + 1) * hd];
        let sc: Vec<f32> = (lo..=r)
            .map(|t| dot(qh, &kc[(g * s.capacity + t) * hd..][..hd]) / (hd as f32).sqrt())
            .collect();
        let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = sc.iter().map(|v| (v - m).exp()).collect();
        let z: f32 = e.iter().sum();
        (0..hd)
            .map(|d| {
                (lo..=r)
                    .map(|t| e[t - lo] / z * vc[(g * s.capacity + t) * hd + d])
                    .sum()
            })
            .collect()
    }

    #[test]
    fn windowed_attention_matches_naive_in_prefill_chunks_and_decode() {
        let s = AttnShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 8,
            capacity: 3000,
            window: Some(100),
        };
        let n = 2900;
        let width = s.n_heads * s.head_dim;
        let q: Vec<f32> = (0..n * width).map(|v| (v as f32 * 0.013).sin()).collect();
        let kc: Vec<f32> = (0..s.capacity * s.head_dim)
            .map(|v| (v as f32 * 0.029).cos())
            .collect();
        let vc: Vec<f32> = (0..kc.len()).map(|v| (v as f32 * 0.007).sin()).collect();
        let mut whole = vec![0f32; n * width];
        attention(&q, &kc, &vc, s, 0, n, &mut whole);
        // The same positions in two calls (a chunked prefill), and the last one as a decode step.
        let split = 1500;
        let mut chunked = vec![0f32; n * width];
        let (a, b) = chunked.split_at_mut(split * width);
        attention(&q[..split * width], &kc, &vc, s, 0, split, a);
        attention(&q[split * width..], &kc, &vc, s, split, n - split, b);
        let mut dec = vec![0f32; width];
        attention(&q[(n - 1) * width..], &kc, &vc, s, n - 1, 1, &mut dec);
        for r in [0, 50, 99, 100, 101, 700, 1499, 1500, 1563, n - 1] {
            for h in 0..s.n_heads {
                let want = naive_row(&q, &kc, &vc, s, r, h, (r + 1).saturating_sub(100));
                let hd = s.head_dim;
                for d in 0..hd {
                    let i = r * width + h * hd + d;
                    assert!((whole[i] - want[d]).abs() < 1e-5, "r {r} h {h} d {d}");
                    assert!((chunked[i] - want[d]).abs() < 1e-5, "chunked r {r}");
                    if r == n - 1 {
                        assert!((dec[h * hd + d] - want[d]).abs() < 1e-5, "decode");
                    }
                }
            }
        }
    }

    /// Queries of `n` positions and a full cache of shape `s` (keys scaled by `k_scale`).
    fn test_qkv(s: AttnShape, n: usize, k_scale: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let width = s.n_heads * s.head_dim;
        let q: Vec<f32> = (0..n * width).map(|v| (v as f32 * 0.013).sin()).collect();
        let kc: Vec<f32> = (0..s.n_kv_heads * s.capacity * s.head_dim)
            .map(|v| k_scale * (v as f32 * 0.029).cos())
            .collect();
        let vc: Vec<f32> = (0..kc.len()).map(|v| (v as f32 * 0.007).sin()).collect();
        (q, kc, vc)
    }

    #[test]
    fn an_f16_cache_attends_as_its_values_rounded_to_f16() {
        use half::f16;
        let s = AttnShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 16,
            capacity: 2600,
            window: None,
        };
        let n = 2500;
        let width = s.n_heads * s.head_dim;
        let (q, kc, vc) = test_qkv(s, n, 3.0);
        let half = |x: &[f32]| -> Vec<f16> { x.iter().map(|&v| f16::from_f32(v)).collect() };
        let back = |x: &[f16]| -> Vec<f32> { x.iter().map(|v| v.to_f32()).collect() };
        let (k16, v16) = (half(&kc), half(&vc));
        let (kr, vr) = (back(&k16), back(&v16));
        // A prefill (GEMM tiles) and a decode step (several key chunks) on the f16 cache equal
        // the same calls on its values rounded to f16 and widened back.
        for (pos0, rows) in [(0, n), (n - 1, 1)] {
            let qs = &q[pos0 * width..(pos0 + rows) * width];
            let mut got = vec![0f32; rows * width];
            attention(qs, &k16, &v16, s, pos0, rows, &mut got);
            let mut want = vec![0f32; rows * width];
            attention(qs, &kr, &vr, s, pos0, rows, &mut want);
            assert_eq!(got, want, "rows {rows}");
            // And differ from the f32 cache's by the rounding only.
            let mut exact = vec![0f32; rows * width];
            attention(qs, &kc, &vc, s, pos0, rows, &mut exact);
            let worst = got
                .iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst > 0.0 && worst < 5e-3, "rows {rows}: worst {worst}");
        }
    }

    #[test]
    fn attention_matches_naive() {
        let s = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            capacity: 1300,
            window: None,
        };
        let n = 1290;
        let width = s.n_heads * s.head_dim;
        let (q, kc, vc) = test_qkv(s, n, 1.0);
        // Prefill of all n at once vs. the last 3 one by one (decode), vs. a naive loop.
        let mut out = vec![0f32; n * width];
        attention(&q, &kc, &vc, s, 0, n, &mut out);
        let mut out_dec = vec![0f32; width];
        attention(&q[(n - 1) * width..], &kc, &vc, s, n - 1, 1, &mut out_dec);
        let hd = s.head_dim;
        for r in [0, 63, 64, 255, 256, 700, n - 1] {
            for h in 0..s.n_heads {
                let g = h / 2;
                let qh = &q[r * width + h * hd..r * width + (h + 1) * hd];
                let sc: Vec<f32> = (0..=r)
                    .map(|t| dot(qh, &kc[(g * s.capacity + t) * hd..][..hd]) / (hd as f32).sqrt())
                    .collect();
                let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = sc.iter().map(|v| (v - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    let o: f32 = (0..=r)
                        .map(|t| e[t] / z * vc[(g * s.capacity + t) * hd + d])
                        .sum();
                    assert!(
                        (out[r * width + h * hd + d] - o).abs() < 1e-5,
                        "r {r} h {h} d {d}"
                    );
                    if r == n - 1 {
                        assert!((out_dec[h * hd + d] - o).abs() < 1e-5);
                    }
                }
            }
        }
    }
}
