//! Integer dot products of quantized weight rows (ggml blocks, read in place) with an activation
//! vector quantized to 8 bits: the decode step's matrix-vector products.
//!
//! The design is ggml-cpu's (`ggml-quants.c`, `arch/x86/quants.c`): the activation row is
//! quantized once per product to blocks of 32 `i8` with one scale ([`Q8Act`], ggml's `Q8_0` with
//! an f32 scale and the sums that `Q8_1`/`Q8_K` carry), and each weight block is multiplied by
//! it with integer arithmetic: on x86-64 with AVX2 `_mm256_maddubs_epi16` (unsigned weight ×
//! signed activation, pairs summed to `i16`), `_mm256_madd_epi16` to `i32`, one f32 multiply-add
//! per block with the two scales. The weights' offsets (Q4_1's and Q4_K's mins, Q5_0's −16,
//! Q6_K's −32) are applied once per block through the activation sums, so the integer part only
//! sees unsigned codes. The portable code (every other CPU, aarch64 included) computes the same
//! integer sums in scalar loops; only the f32 summation order differs between the two paths.
//!
//! Rounding: the activation is rounded to 8 bits per block of 32 (relative error ≤ 1/254 of the
//! block's largest value), as llama.cpp does for the same weights; the weights are exact.

use half::f16;
use rayon::prelude::*;

use super::quant::{GgmlType, QK, QK_K};

/// An activation vector quantized in blocks of [`QK`] values: `x[32b + j] ≈ d[b] · qs[32b + j]`.
#[derive(Debug, Default, Clone)]
pub struct Q8Act {
    /// `blocks × 32` codes.
    pub qs: Vec<i8>,
    /// One scale per block.
    pub d: Vec<f32>,
    /// Per block, the sums of its first and last 16 codes (the weights' offsets use them).
    pub sums: Vec<[i32; 2]>,
}

impl Q8Act {
    /// Quantizes `x` (its length a multiple of [`QK`]) into `self`, reusing its buffers.
    pub fn quantize(&mut self, x: &[f32]) {
        let blocks = x.len() / QK;
        self.qs.resize(blocks * QK, 0);
        self.d.resize(blocks, 0.0);
        self.sums.resize(blocks, [0; 2]);
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let qs = &mut self.qs[b * QK..(b + 1) * QK];
            let mut s = [0i32; 2];
            for (j, (q, &v)) in qs.iter_mut().zip(xb).enumerate() {
                // |v·id| ≤ 127 (up to rounding of id), so the cast cannot wrap.
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
                s[j / 16] += i32::from(*q);
            }
            self.d[b] = d;
            self.sums[b] = s;
        }
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// Whether [`dot_row`] handles weights of type `ty` (the others are dequantized at load).
pub fn supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q4K | GgmlType::Q6K
    )
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Scale and min `j` (0..8) of a Q4_K block's 12 packed bytes (as `quant.rs` decodes them).
fn q4k_scale_min(j: usize, p: &[u8]) -> (u8, u8) {
    if j < 4 {
        (p[j] & 63, p[j + 4] & 63)
    } else {
        (
            (p[j + 4] & 0x0F) | ((p[j - 4] >> 6) << 4),
            (p[j + 4] >> 4) | ((p[j] >> 6) << 4),
        )
    }
}

/// A row kernel: the dot product of one weight row (whole blocks of its type, `a.blocks()`
/// weights' worth) with the quantized activation.
type RowKernel = fn(&[u8], &Q8Act) -> f32;

/// A kernel of one row and up to [`MANY`] activations: `out[i] = w · a_i` (`out` as long as
/// `acts`), each the [`RowKernel`]'s value for `a_i`.
type ManyKernel = fn(&[u8], &[Q8Act], &mut [f32]);

/// Activations per call of a [`ManyKernel`].
const MANY: usize = 4;

/// The several-activation kernel of `ty` for this CPU, where there is one (Q8_0 and Q4_1 with
/// AVX2: SmolLM2's types).
fn many_kernel(ty: GgmlType) -> Option<ManyKernel> {
    #[cfg(target_arch = "x86_64")]
    if avx512::detected() {
        // The row kernels are AVX-512's, whose sums these would not equal bit for bit: the
        // row kernel per activation keeps `matvec_many` equal to `matvec`.
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::detected() {
        return avx2::many_kernel(ty);
    }
    let _ = ty;
    None
}

/// Whether this CPU has an integer row kernel for `ty` (what [`matvec`] needs).
pub fn has_kernel(ty: GgmlType) -> bool {
    kernel(ty).is_some()
}

/// The dot product of one row of `ty` weights (`w`: `cols / block_weights` whole blocks, cols =
/// `32 · a.blocks()`) with `a`; `None` for a type without a kernel.
pub fn dot_row(ty: GgmlType, w: &[u8], a: &Q8Act) -> Option<f32> {
    kernel(ty).map(|k| k(w, a))
}

/// The kernel of `ty` for this CPU (detected once).
fn kernel(ty: GgmlType) -> Option<RowKernel> {
    #[cfg(target_arch = "x86_64")]
    if avx512::detected() {
        return avx512::kernel(ty);
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::detected() {
        return avx2::kernel(ty);
    }
    scalar_kernel(ty)
}

fn scalar_kernel(ty: GgmlType) -> Option<RowKernel> {
    Some(match ty {
        GgmlType::Q8_0 => scalar::q8_0,
        GgmlType::Q4_1 => scalar::q4_1,
        GgmlType::Q5_0 => scalar::q5_0,
        GgmlType::Q4K => scalar::q4_k,
        GgmlType::Q6K => scalar::q6_k,
        _ => return None,
    })
}

/// `y[r] = w_r · x` for every row of a quantized matrix: `w` is `rows` rows of `row_bytes`
/// bytes (ggml blocks of `ty`), `a` the quantized `x`, `y` `rows` long. Rows are split among
/// rayon's threads. Returns `false` (writing nothing) for a type without a kernel.
pub fn matvec(ty: GgmlType, w: &[u8], row_bytes: usize, a: &Q8Act, y: &mut [f32]) -> bool {
    matvec_many(ty, w, row_bytes, std::slice::from_ref(a), y)
}

/// [`matvec`] of `acts.len()` vectors at once: `y[i · rows + r] = w_r · x_i` (`y` row-major
/// `n × rows`). Each weight row is read from memory once for all `n` vectors (a decode step of
/// several sequences), and for the types with a several-activation kernel its blocks are
/// unpacked once for up to four of them; each product is the one [`matvec`] computes for that
/// vector alone.
pub fn matvec_many(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    acts: &[Q8Act],
    y: &mut [f32],
) -> bool {
    let Some(k) = kernel(ty) else {
        return false;
    };
    let n = acts.len();
    let rows = y.len() / n.max(1);
    // Enough rows per task that scheduling costs little, enough tasks to balance two or more
    // threads (the LM head has 49K–262K rows, a KV projection 192).
    let per_task = (rows / (8 * rayon::current_num_threads())).clamp(16, 2048);
    if n == 1 {
        y.par_chunks_mut(per_task)
            .zip(w.par_chunks(per_task * row_bytes))
            .for_each(|(ys, ws)| {
                for (yv, row) in ys.iter_mut().zip(ws.chunks_exact(row_bytes)) {
                    *yv = k(row, &acts[0]);
                }
            });
        return true;
    }
    // Row-major `rows × n` per task (each task's rows contiguous), then transposed.
    let many = many_kernel(ty);
    let mut yt = vec![0f32; rows * n];
    yt.par_chunks_mut(per_task * n)
        .zip(w.par_chunks(per_task * row_bytes))
        .for_each(|(ys, ws)| {
            for (yr, row) in ys.chunks_exact_mut(n).zip(ws.chunks_exact(row_bytes)) {
                match many {
                    Some(m) => {
                        for (yc, ac) in yr.chunks_mut(MANY).zip(acts.chunks(MANY)) {
                            m(row, ac, yc);
                        }
                    }
                    None => {
                        for (yv, a) in yr.iter_mut().zip(acts) {
                            *yv = k(row, a);
                        }
                    }
                }
            }
        });
    for (r, yr) in yt.chunks_exact(n).enumerate() {
        for (i, &v) in yr.iter().enumerate() {
            y[i * rows + r] = v;
        }
    }
    true
}

/// `rows` random but valid rows of `cols` weights of `ty` (whole blocks), seeded: random bytes
/// with every f16 scale replaced by a small finite value (random bytes would give NaNs and
/// infinities). For tests and benchmarks of the kernels; empty for a type without a block
/// layout.
pub fn random_blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let Some((per, bytes)) = ty.block_layout() else {
        return Vec::new();
    };
    let mut rng = qkindex::synth::Rng::new(seed);
    let mut w: Vec<u8> = (0..rows * (cols / per) * bytes)
        .map(|_| rng.below(256) as u8)
        .collect();
    let scale_at: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q4K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    for blk in w.chunks_exact_mut(bytes) {
        for &at in scale_at {
            let v = f16::from_f32(0.01 + 0.02 * rng.normal().abs());
            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

/// The portable kernels: integer sums per block in scalar loops.
mod scalar {
    use super::*;

    pub fn q8_0(w: &[u8], a: &Q8Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(34).enumerate() {
            let qa = &a.qs[b * QK..(b + 1) * QK];
            let s: i32 = blk[2..]
                .iter()
                .zip(qa)
                .map(|(&q, &x)| i32::from(q as i8) * i32::from(x))
                .sum();
            acc += f16_at(blk, 0) * a.d[b] * s as f32;
        }
        acc
    }

    pub fn q4_1(w: &[u8], a: &Q8Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(20).enumerate() {
            let qa = &a.qs[b * QK..(b + 1) * QK];
            let mut s = 0i32;
            for (j, &q) in blk[4..].iter().enumerate() {
                s += i32::from(q & 0x0F) * i32::from(qa[j]);
                s += i32::from(q >> 4) * i32::from(qa[j + 16]);
            }
            let [s0, s1] = a.sums[b];
            acc += a.d[b] * (f16_at(blk, 0) * s as f32 + f16_at(blk, 2) * (s0 + s1) as f32);
        }
        acc
    }

    pub fn q5_0(w: &[u8], a: &Q8Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(22).enumerate() {
            let qa = &a.qs[b * QK..(b + 1) * QK];
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let mut s = 0i32;
            for (j, &q) in blk[6..].iter().enumerate() {
                let lo = u32::from(q & 0x0F) | (((qh >> j) & 1) << 4);
                let hi = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
                s += lo as i32 * i32::from(qa[j]) + hi as i32 * i32::from(qa[j + 16]);
            }
            let [s0, s1] = a.sums[b];
            acc += f16_at(blk, 0) * a.d[b] * (s - 16 * (s0 + s1)) as f32;
        }
        acc
    }

    pub fn q4_k(w: &[u8], a: &Q8Act) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(144).enumerate() {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (packed, qs) = (&blk[4..16], &blk[16..144]);
            for j in 0..8 {
                let b = sb * 8 + j;
                let qa = &a.qs[b * QK..(b + 1) * QK];
                let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                let shift = 4 * (j % 2);
                let s: i32 = q
                    .iter()
                    .zip(qa)
                    .map(|(&v, &x)| i32::from((v >> shift) & 0x0F) * i32::from(x))
                    .sum();
                let (sc, m) = q4k_scale_min(j, packed);
                let [s0, s1] = a.sums[b];
                acc += a.d[b]
                    * (d * f32::from(sc) * s as f32 - dmin * f32::from(m) * (s0 + s1) as f32);
            }
        }
        acc
    }

    pub fn q6_k(w: &[u8], a: &Q8Act) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(210).enumerate() {
            let (ql, rest) = blk.split_at(QK_K / 2);
            let (qh, rest) = rest.split_at(QK_K / 4);
            let (scales, dbytes) = rest.split_at(QK_K / 16);
            let d = f16_at(dbytes, 0);
            for half in 0..2 {
                let ql = &ql[half * 64..half * 64 + 64];
                let qh = &qh[half * 32..half * 32 + 32];
                let sc = &scales[half * 8..half * 8 + 8];
                for r in 0..4 {
                    let b = sb * 8 + half * 4 + r;
                    let qa = &a.qs[b * QK..(b + 1) * QK];
                    let mut s = [0i32; 2];
                    for l in 0..32 {
                        let low = ql[l + 32 * (r % 2)] >> (4 * (r / 2)) & 0x0F;
                        let q = low | (((qh[l] >> (2 * r)) & 3) << 4);
                        s[l / 16] += i32::from(q) * i32::from(qa[l]);
                    }
                    let [s0, s1] = a.sums[b];
                    let (sa, sb_) = (i32::from(sc[2 * r] as i8), i32::from(sc[2 * r + 1] as i8));
                    let t = sa * (s[0] - 32 * s0) + sb_ * (s[1] - 32 * s1);
                    acc += d * a.d[b] * t as f32;
                }
            }
        }
        acc
    }
}

/// `pub fn kernel(ty)` of a kernel module: its five `#[target_feature]` kernels (`q8_0`,
/// `q4_1`, `q5_0`, `q4_k`, `q6_k`) wrapped as plain fns, which the module's `detected` must
/// have vouched for before `kernel` is called.
#[cfg(target_arch = "x86_64")]
macro_rules! row_kernels {
    () => {
        pub fn kernel(ty: GgmlType) -> Option<RowKernel> {
            macro_rules! wrap {
                ($f:ident) => {{
                    fn k(w: &[u8], a: &Q8Act) -> f32 {
                        // SAFETY: `kernel` is called only after this module's `detected`
                        // found every feature the kernels enable.
                        unsafe { $f(w, a) }
                    }
                    k as RowKernel
                }};
            }
            Some(match ty {
                GgmlType::Q8_0 => wrap!(q8_0),
                GgmlType::Q4_1 => wrap!(q4_1),
                GgmlType::Q5_0 => wrap!(q5_0),
                GgmlType::Q4K => wrap!(q4_k),
                GgmlType::Q6K => wrap!(q6_k),
                _ => return None,
            })
        }
    };
}

/// How far ahead of the block being multiplied the x86 kernels prefetch the weights.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 2048;

/// Prefetches `lines` cache lines from [`PREFETCH`] bytes past `w[at]`. Hardware prefetch alone
/// left the kernels at 57–76 % of the read bandwidth (`docs/bench/model-step`); the address may
/// lie past `w` (a prefetch never faults, and the next rows follow in memory). SSE's prefetch
/// is part of every x86-64 CPU.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead(w: &[u8], at: usize, lines: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let ahead = w.as_ptr().wrapping_add(at + PREFETCH);
    for l in 0..lines {
        // SAFETY: SSE is in every x86-64 target; a prefetch reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l).cast()) };
    }
}

/// The AVX2 kernels (ggml's `arch/x86/quants.c` scheme), with F16C for the block scales.
#[cfg(target_arch = "x86_64")]
mod avx2;

/// The AVX-512 VNNI kernels, preferred where the CPU has them (`QKINDEX_NO_AVX512=1` falls back
/// to AVX2, for comparisons).
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::super::quant::dequantize_into;
    use super::*;
    use qkindex::synth::Rng;

    fn random_row(ty: GgmlType, cols: usize, rng: &mut Rng) -> Vec<u8> {
        random_blocks(ty, 1, cols, rng.below(1 << 30) as u64)
    }

    #[test]
    fn kernels_equal_the_dequantized_dot_product() {
        let mut rng = Rng::new(5);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ] {
            assert!(supported(ty));
            // Odd block counts too (the AVX-512 kernels take blocks in pairs and fours).
            let odd: &[usize] = match ty {
                GgmlType::Q4K | GgmlType::Q6K => &[768],
                _ => &[96, 160],
            };
            for &cols in [256usize, 512, 1024].iter().chain(odd) {
                let w = random_row(ty, cols, &mut rng);
                let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
                let mut a = Q8Act::default();
                a.quantize(&x);
                let mut wf = vec![0f32; cols];
                assert!(dequantize_into(ty, &w, &mut wf));
                // The exact product of the dequantized weights with the quantized activation:
                // every kernel must reproduce it up to f32 summation order.
                let xq: Vec<f64> = (0..cols)
                    .map(|i| f64::from(a.d[i / QK]) * f64::from(a.qs[i]))
                    .collect();
                let want: f64 = wf.iter().zip(&xq).map(|(&w, &x)| f64::from(w) * x).sum();
                let mag: f64 = wf
                    .iter()
                    .zip(&xq)
                    .map(|(&w, &x)| (f64::from(w) * x).abs())
                    .sum();
                let tol = 1e-5 * mag.max(1e-3);
                let s = scalar_kernel(ty).expect("scalar")(&w, &a);
                assert!(
                    (f64::from(s) - want).abs() <= tol,
                    "{ty:?} {cols} scalar: {s} vs {want}"
                );
                let k = dot_row(ty, &w, &a).expect("kernel");
                assert!(
                    (f64::from(k) - want).abs() <= tol,
                    "{ty:?} {cols}: {k} vs {want}"
                );
                // Every kernel set this CPU has, not only the one dispatched.
                #[cfg(target_arch = "x86_64")]
                for (set, found) in [
                    ("avx2", avx2::detected().then(|| avx2::kernel(ty)).flatten()),
                    (
                        "avx512",
                        avx512::detected().then(|| avx512::kernel(ty)).flatten(),
                    ),
                ] {
                    if let Some(kf) = found {
                        let v = kf(&w, &a);
                        assert!(
                            (f64::from(v) - want).abs() <= tol,
                            "{ty:?} {cols} {set}: {v} vs {want}"
                        );
                    }
                }
                // And the float product within the activation's 8-bit rounding.
                let exact: f64 = wf.iter().zip(&x).map(|(&w, &x)| f64::from(w * x)).sum();
                let wmag: f64 = wf
                    .iter()
                    .zip(&x)
                    .map(|(&w, &x)| f64::from((w * x).abs()))
                    .sum();
                assert!(
                    (f64::from(k) - exact).abs() <= wmag / 100.0,
                    "{ty:?}: {k} vs {exact}"
                );
            }
        }
        assert!(!supported(GgmlType::F32));
        assert_eq!(dot_row(GgmlType::F16, &[], &Q8Act::default()), None);
    }

    #[test]
    fn quantize_bounds_codes_and_keeps_zero_blocks() {
        let mut x = vec![0f32; 64];
        for (i, v) in x[32..].iter_mut().enumerate() {
            *v = (i as f32 - 10.0) * 0.37;
        }
        let mut a = Q8Act::default();
        a.quantize(&x);
        assert_eq!((a.blocks(), a.d[0]), (2, 0.0));
        assert!(a.qs[..32].iter().all(|&q| q == 0));
        assert_eq!(a.qs[32..].iter().map(|q| q.unsigned_abs()).max(), Some(127));
        for (i, &v) in x[32..].iter().enumerate() {
            assert!((a.d[1] * f32::from(a.qs[32 + i]) - v).abs() <= a.d[1] / 2.0 + 1e-6);
        }
        let s: i32 = a.qs[32..48].iter().map(|&q| i32::from(q)).sum();
        assert_eq!(a.sums[1][0], s);
    }

    #[test]
    fn matvec_fills_every_row() {
        let mut rng = Rng::new(9);
        let (rows, cols) = (37, 256);
        let ty = GgmlType::Q4K;
        let row_bytes = ty.bytes_for(cols as u64).expect("size") as usize;
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(ty, cols, &mut rng))
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
        let mut a = Q8Act::default();
        a.quantize(&x);
        let mut y = vec![f32::NAN; rows];
        assert!(matvec(ty, &w, row_bytes, &a, &mut y));
        for (r, &v) in y.iter().enumerate() {
            let want = dot_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &a).expect("k");
            assert_eq!(v, want, "row {r}");
        }
        assert!(!matvec(GgmlType::F32, &w, row_bytes, &a, &mut y));
        // Several vectors at once (the Q8_0 and Q4_1 kernels take up to four per call: five
        // make a call of four and one of one): each row of the result is that vector's
        // matvec, bit for bit.
        for ty in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::Q4_1] {
            let row_bytes = ty.bytes_for(cols as u64).expect("size") as usize;
            let w: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(ty, cols, &mut rng))
                .collect();
            for n in [2, 3, 5] {
                let acts: Vec<Q8Act> = (0..n)
                    .map(|_| {
                        let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
                        let mut a = Q8Act::default();
                        a.quantize(&x);
                        a
                    })
                    .collect();
                let mut ys = vec![f32::NAN; n * rows];
                assert!(matvec_many(ty, &w, row_bytes, &acts, &mut ys));
                for (i, a) in acts.iter().enumerate() {
                    let mut one = vec![f32::NAN; rows];
                    assert!(matvec(ty, &w, row_bytes, a, &mut one));
                    assert_eq!(
                        &ys[i * rows..(i + 1) * rows],
                        one.as_slice(),
                        "{ty:?}: vector {i} of {n}"
                    );
                }
            }
        }
    }
}
