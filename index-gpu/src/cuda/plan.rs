//! What a call does on the device, decided without one: pure functions that the device code
//! calls, so that the plan is tested on any machine (the kernels themselves run on the CPU under
//! `scripts/kernel-emu.sh`).
//!
//! - [`score_gemm`]: the cuBLAS `GemmEx` parameters ([`Gemm`]: column-major `m, n, k`, leading
//!   dimensions, transposes, operand offsets) that write a tile of scores row-major, query rows
//!   by key columns, the layout `topk_select_tile` and `radix_select_rows` read.
//! - [`query_chunk_rows`], [`key_tile_cols`], [`spans`]: the chunks of queries and the gemm
//!   path's tiles of keys, sized from free device memory, and how they cover the problem.
//! - [`RadixPlan`]: one chunk on the radix path: the keys its rows see, the GEMM, the buffer sizes
//!   and where the sort runs; [`radix_scratch`], [`gemm_scratch`] and [`reusable`]: the scratch
//!   buffers a call allocates and when they are reused.

use super::KernelPath;
use crate::kernels::{radix_slots, radix_sort_smem_bytes, FUSED_BM, FUSED_BN};
use crate::{GpuError, Result};

/// A cuBLAS operation on a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// As stored (`CUBLAS_OP_N`).
    N,
    /// Transposed (`CUBLAS_OP_T`).
    T,
}

/// One `cublasGemmEx` call as cuBLAS reads it, column-major: C (`m × n`, leading dimension
/// `ldc`) = op(A) (`m × k`) · op(B) (`k × n`), A and B read from elements `a_offset` and
/// `b_offset` of their buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gemm {
    pub transa: Op,
    pub transb: Op,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub a_offset: usize,
    pub b_offset: usize,
}

/// The GEMM that scores `rows` query rows against keys `k0..k0 + cols`, both row-major f16 with
/// `dp` halves per row (the queries from row 0 of theirs): the tile it writes is row-major
/// `rows × cols`, leading dimension `cols`, `tile[r·cols + c] = query r · key (k0 + c)`.
///
/// Column-major, the keys' rows are the columns of a `dp × n` matrix (so `op(A) = Aᵀ`, `lda =
/// dp`), the queries' rows those of a `dp × rows` one (`op(B) = B`, `ldb = dp`), and C =
/// `cols × rows` column-major is the row-major `rows × cols` tile.
pub(crate) fn score_gemm(rows: usize, (k0, cols): (usize, usize), dp: usize) -> Gemm {
    Gemm {
        transa: Op::T,
        transb: Op::N,
        m: cols,
        n: rows,
        k: dp,
        lda: dp,
        ldb: dp,
        ldc: cols,
        a_offset: k0 * dp,
        b_offset: 0,
    }
}

impl Gemm {
    /// Elements that A, B and C must hold (from element 0 of each buffer, offsets included).
    pub fn extents(&self) -> (usize, usize, usize) {
        // A column-major `rows × cols` matrix with leading dimension `ld`, from `offset`.
        let span = |offset: usize, rows: usize, cols: usize, ld: usize| {
            if rows == 0 || cols == 0 {
                0
            } else {
                offset + (cols - 1) * ld + rows
            }
        };
        let stored = |op, rows, cols| match op {
            Op::N => (rows, cols),
            Op::T => (cols, rows),
        };
        let (ar, ac) = stored(self.transa, self.m, self.k);
        let (br, bc) = stored(self.transb, self.k, self.n);
        let c = span(0, self.m, self.n, self.ldc);
        if self.m == 0 || self.n == 0 || self.k == 0 {
            // cuBLAS reads neither operand (and with k = 0 only scales C by beta).
            return (0, 0, c);
        }
        (
            span(self.a_offset, ar, ac, self.lda),
            span(self.b_offset, br, bc, self.ldb),
            c,
        )
    }

    /// `m, n, k, lda, ldb, ldc` as cuBLAS's `int`s, once checked: each leading dimension at
    /// least its stored matrix's rows (and 1), every value within `i32`, and buffers of
    /// `lens` (A, B, C elements) at least the [`extents`](Self::extents).
    pub fn checked(&self, lens: (usize, usize, usize)) -> Result<[i32; 6]> {
        let rows_of = |op, rows, cols| if op == Op::N { rows } else { cols };
        let need_lda = rows_of(self.transa, self.m, self.k).max(1);
        let need_ldb = rows_of(self.transb, self.k, self.n).max(1);
        if self.lda < need_lda || self.ldb < need_ldb || self.ldc < self.m.max(1) {
            return Err(GpuError::Input(format!(
                "internal: GEMM leading dimensions {self:?}"
            )));
        }
        let (a, b, c) = self.extents();
        if lens.0 < a || lens.1 < b || lens.2 < c {
            return Err(GpuError::Input(format!(
                "internal: GEMM {self:?} needs buffers of {a}, {b} and {c} elements, has {lens:?}"
            )));
        }
        let dims = [self.m, self.n, self.k, self.lda, self.ldb, self.ldc];
        let mut out = [0i32; 6];
        for (o, &v) in out.iter_mut().zip(&dims) {
            *o = i32::try_from(v).map_err(|_| {
                GpuError::Input(format!("GEMM sizes {dims:?} exceed cuBLAS's 32-bit int"))
            })?;
        }
        Ok(out)
    }
}

/// Keys a chunk of `rows` queries from query `row0` sees: all `n`, or causally up to its last
/// row's position (`row0 + rows`, at most `n`).
pub(crate) fn key_end(n: usize, row0: usize, rows: usize, causal: bool) -> usize {
    if causal {
        n.min(row0 + rows)
    } else {
        n
    }
}

/// `(start, len)` of consecutive spans of at most `step` (at least 1) covering `0..total`.
pub(crate) fn spans(total: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = step.max(1);
    (0..total)
        .step_by(step)
        .map(move |s| (s, step.min(total - s)))
}

/// The size of a kNN call as the chunk plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub path: KernelPath,
    /// Queries, keys, padded dimension, k.
    pub m: usize,
    pub n: usize,
    pub dp: usize,
    pub k: usize,
}

/// Most elements of the radix path's score tile (whole rows of `n` keys): cuBLAS's `int` sizes.
pub(crate) const RADIX_TILE_MAX: usize = 1 << 31;

impl Problem {
    /// Device bytes per query of a chunk: its f16 row, its result lists, and (gemm) a row of the
    /// score tile, (radix) a whole row of scores and the packed keys.
    pub fn bytes_per_query(&self) -> usize {
        let tile_row = match self.path {
            KernelPath::Gemm => 4 * self.n.min(65_536),
            KernelPath::Radix => 4 * self.n + 8 * radix_slots(self.k),
            _ => 0,
        };
        2 * self.dp + 8 * self.k + tile_row
    }

    /// The device memory the chunks may take out of `free` bytes: a quarter of what the keys
    /// (padded f16 rows) leave.
    pub fn chunk_budget(&self, free: usize) -> usize {
        let keys_bytes = self.n.next_multiple_of(FUSED_BN) * self.dp * 2;
        free.saturating_sub(keys_bytes) / 4
    }
}

/// Queries per chunk, a multiple of [`FUSED_BM`]: `requested` (rounded up) when non-zero, else a
/// quarter of the queries (so that copies overlap), at least 4,096 and at most 32,768, within
/// `free()` bytes of device memory ([`Problem::chunk_budget`]) and, on the radix path,
/// [`RADIX_TILE_MAX`] scores, wherever [`FUSED_BM`] rows fit them. `free` is read only without a
/// request.
pub(crate) fn query_chunk_rows(
    p: &Problem,
    requested: usize,
    free: impl FnOnce() -> Result<usize>,
) -> Result<usize> {
    if requested > 0 {
        return Ok(requested.next_multiple_of(FUSED_BM));
    }
    let budget = p.chunk_budget(free()?);
    let mut by_memory = (budget / p.bytes_per_query().max(1)).max(FUSED_BM);
    if p.path == KernelPath::Radix {
        // Whole rows of scores: keep the tile within 2³¹ elements (cuBLAS's int sizes).
        by_memory = by_memory.min((RADIX_TILE_MAX / p.n.max(1)).max(FUSED_BM));
    }
    let target =
        p.m.div_ceil(4)
            .clamp(4096, 32_768)
            .next_multiple_of(FUSED_BM);
    // The bounds rounded down to whole blocks of rows (rounded up, a chunk could pass them by up
    // to 63 rows), one block at least.
    let bound = (by_memory / FUSED_BM * FUSED_BM).max(FUSED_BM);
    Ok(target.min(bound))
}

/// Keys per GEMM tile (gemm path) for chunks of `chunk` queries and `n` keys: the score tile
/// (`chunk × tile` f32) takes at most a quarter of `free` bytes and 4 GiB; a multiple of 256, at
/// least 256 and at most `n` rounded up to 256.
pub(crate) fn key_tile_cols(free: usize, chunk: usize, n: usize) -> usize {
    let budget = (free / 4).min(4 << 30);
    let cols = (budget / (4 * chunk.max(1))).max(256) / 256 * 256;
    cols.min(n.next_multiple_of(256))
}

/// Elements of the gemm path's score tile for chunks of at most `chunk_rows` rows and key tiles
/// of `key_tile`.
pub(crate) fn gemm_scratch(chunk_rows: usize, key_tile: usize) -> usize {
    chunk_rows * key_tile
}

/// Elements of the radix path's score tile (f32) and packed keys (u64) for chunks of at most
/// `chunk_rows` rows over `n` keys: enough for every chunk's [`RadixPlan`].
pub(crate) fn radix_scratch(chunk_rows: usize, n: usize, k: usize) -> (usize, usize) {
    (chunk_rows * n, chunk_rows * radix_slots(k))
}

/// Whether a scratch buffer of `have` elements (`None`: none yet) serves `need`; else it is
/// freed and allocated anew.
pub(crate) fn reusable(have: Option<usize>, need: usize) -> bool {
    have.is_some_and(|h| h >= need)
}

/// One chunk on the radix path: the GEMM of its rows against every key they see, then
/// `radix_select_rows(tile, ld, rows, cols, row0, causal, k, slots, packed)` and
/// `sort_rows_desc(packed, rows, slots, k, in_smem, best_s, best_i)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RadixPlan {
    pub rows: usize,
    /// Keys the rows see ([`key_end`]): the tile's columns.
    pub cols: usize,
    /// The tile's leading dimension, as the GEMM writes it and the select kernel reads it.
    pub ld: usize,
    pub row0: usize,
    pub causal: bool,
    pub k: usize,
    /// Packed keys per row ([`radix_slots`]).
    pub slots: usize,
    pub gemm: Gemm,
}

impl RadixPlan {
    /// The plan of `rows` queries from query `row0`, padded dimension `dp`, against `n` keys.
    pub fn new(rows: usize, n: usize, dp: usize, row0: usize, causal: bool, k: usize) -> Self {
        let cols = key_end(n, row0, rows, causal);
        let gemm = score_gemm(rows, (0, cols), dp);
        RadixPlan {
            rows,
            cols,
            ld: gemm.ldc,
            row0,
            causal,
            k,
            slots: radix_slots(k),
            gemm,
        }
    }

    /// Elements of the score tile and of the packed keys the chunk needs.
    pub fn lens(&self) -> (usize, usize) {
        (self.rows * self.ld, self.rows * self.slots)
    }

    /// Fails unless buffers of `tile` scores and `packed` keys hold [`lens`](Self::lens).
    pub fn check_buffers(&self, tile: usize, packed: usize) -> Result<()> {
        let (need_tile, need_packed) = self.lens();
        if tile < need_tile || packed < need_packed {
            let RadixPlan { rows, cols, k, .. } = *self;
            return Err(GpuError::Input(format!(
                "radix path: buffers of {tile} scores and {packed} keys for {rows} rows × {cols} \
                 keys, k = {k}"
            )));
        }
        Ok(())
    }

    /// The sort's dynamic shared memory: `Some(bytes)` when a row's slots fit the block's opt-in
    /// limit `smem_optin` (sorted there), `None` when sorted in place in device memory.
    pub fn sort_smem(&self, smem_optin: usize) -> Option<usize> {
        let smem = radix_sort_smem_bytes(self.slots);
        (smem <= smem_optin).then_some(smem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// cuBLAS's GEMM on the CPU: `C = op(A)·op(B)` column-major, read exactly as `g` says (every
    /// index checked against the buffers, which are cut to [`Gemm::extents`]).
    fn cpu_gemm(g: &Gemm, a: &[u16], b: &[u16], c: &mut [f32]) {
        let (ea, eb, ec) = g.extents();
        let (a, b, c) = (&a[..ea], &b[..eb], &mut c[..ec]);
        let at = |i: usize, p: usize| match g.transa {
            Op::N => a[g.a_offset + i + p * g.lda],
            Op::T => a[g.a_offset + p + i * g.lda],
        };
        let bt = |p: usize, j: usize| match g.transb {
            Op::N => b[g.b_offset + p + j * g.ldb],
            Op::T => b[g.b_offset + j + p * g.ldb],
        };
        let h = |x: u16| f16::from_bits(x).to_f32();
        for j in 0..g.n {
            for i in 0..g.m {
                c[i + j * g.ldc] = (0..g.k).map(|p| h(at(i, p)) * h(bt(p, j))).sum();
            }
        }
    }

    /// `rows × d` small integers (exact in f16, exact dot products in f32), padded row-major to
    /// `dp` halves with zeros, as `host::pad_*` lay them out.
    fn rows_f16(rows: usize, d: usize, dp: usize, seed: usize) -> (Vec<f32>, Vec<u16>) {
        let x: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 7 + seed * 13) % 9) as f32 - 4.0)
            .collect();
        let mut h = vec![0u16; rows * dp];
        for (r, row) in x.chunks_exact(d).enumerate() {
            for (o, &v) in h[r * dp..].iter_mut().zip(row) {
                *o = f16::from_f32(v).to_bits();
            }
        }
        (x, h)
    }

    fn dot(x: &[f32], y: &[f32]) -> f32 {
        x.iter().zip(y).map(|(a, b)| a * b).sum()
    }

    /// The radix plan of every chunk of a call: the GEMM (CPU reference) writes a tile that the
    /// select kernel, reading `ld` and `cols` as the plan says, sees as `q · key`, for every key
    /// each row sees; the scratch holds every chunk's buffers.
    fn check_radix(m: usize, n: usize, d: usize, k: usize, chunk: usize, causal: bool) {
        let dp = d.next_multiple_of(16);
        let (q, qh) = rows_f16(m, d, dp, 1);
        let (keys, kh) = rows_f16(n, d, dp, 2);
        let chunk_rows = chunk.min(m);
        let (tile_len, packed_len) = radix_scratch(chunk_rows, n, k);
        let mut tile = vec![f32::NAN; tile_len];
        let mut seen = vec![0usize; m];
        for (q0, rows) in spans(m, chunk) {
            let p = RadixPlan::new(rows, n, dp, q0, causal, k);
            p.check_buffers(tile_len, packed_len).expect("scratch");
            assert_eq!((p.ld, p.slots), (p.gemm.ldc, radix_slots(k)));
            assert!(p.slots >= k && p.slots.is_power_of_two());
            let qc = &qh[q0 * dp..(q0 + rows) * dp];
            p.gemm
                .checked((kh.len(), qc.len(), tile.len()))
                .expect("gemm");
            cpu_gemm(&p.gemm, &kh, qc, &mut tile);
            for r in 0..rows {
                seen[q0 + r] += 1;
                let visible = if causal { n.min(q0 + r + 1) } else { n };
                assert!(
                    visible <= p.cols,
                    "row {} sees {visible} > {}",
                    q0 + r,
                    p.cols
                );
                let row = &tile[r * p.ld..r * p.ld + p.cols];
                for (c, &s) in row.iter().enumerate().take(visible) {
                    let want = dot(
                        &q[(q0 + r) * d..(q0 + r + 1) * d],
                        &keys[c * d..(c + 1) * d],
                    );
                    assert_eq!(s, want, "m {m} n {n} k {k}: row {} key {c}", q0 + r);
                }
            }
        }
        assert!(
            seen.iter().all(|&s| s == 1),
            "queries covered once: {seen:?}"
        );
    }

    #[test]
    fn radix_tiles_hold_each_rows_scores_where_the_kernel_reads_them() {
        check_radix(5, 1, 3, 1, 64, false); // one key
        check_radix(5, 1, 3, 7, 64, true); // k > n, causal
        check_radix(70, 37, 20, 100, 64, false); // k > n; rows not a multiple of the chunk
        check_radix(130, 200, 33, 16, 64, true); // causal: later chunks see more keys
        check_radix(40, 300, 16, 50, 16, true); // causal, keys beyond every row
        check_radix(3, 129, 128, 129, 2, false); // k = n; a last chunk of one row
    }

    #[test]
    fn gemm_key_tiles_cover_every_visible_key_once_in_place() {
        // The gemm path: tiles of `key_tile` keys from k0, each tile row-major rows × cols.
        for (m, n, d, key_tile, causal, row0) in [
            (7, 1, 5usize, 256, false, 0),
            (9, 1000, 40, 256, false, 0),
            (9, 1000, 40, 256, true, 600),
            (4, 513, 16, 512, true, 0),
        ] {
            let dp = d.next_multiple_of(16);
            let (q, qh) = rows_f16(m, d, dp, 3);
            let (keys, kh) = rows_f16(n, d, dp, 4);
            let end = key_end(n, row0, m, causal);
            let mut tile = vec![f32::NAN; gemm_scratch(m, key_tile)];
            let mut hits = vec![0usize; n];
            for (k0, cols) in spans(end, key_tile) {
                assert!(cols >= 1 && cols <= key_tile);
                let g = score_gemm(m, (k0, cols), dp);
                g.checked((kh.len(), qh.len(), tile.len())).expect("gemm");
                cpu_gemm(&g, &kh, &qh, &mut tile);
                for r in 0..m {
                    for c in 0..cols {
                        let key = k0 + c;
                        let want = dot(&q[r * d..(r + 1) * d], &keys[key * d..(key + 1) * d]);
                        assert_eq!(tile[r * g.ldc + c], want, "row {r} key {key}");
                    }
                }
                hits[k0..k0 + cols].iter_mut().for_each(|h| *h += 1);
            }
            assert!(hits[..end].iter().all(|&h| h == 1) && hits[end..].iter().all(|&h| h == 0));
        }
    }

    #[test]
    fn the_score_gemm_is_the_transposed_product_cublas_expects() {
        let g = score_gemm(3, (64, 10), 16);
        assert_eq!((g.transa, g.transb), (Op::T, Op::N));
        assert_eq!((g.m, g.n, g.k), (10, 3, 16));
        assert_eq!((g.lda, g.ldb, g.ldc), (16, 16, 10));
        assert_eq!((g.a_offset, g.b_offset), (64 * 16, 0));
        // Keys 64..74 of 16 halves, 3 query rows, a 3 × 10 tile.
        assert_eq!(g.extents(), (74 * 16, 3 * 16, 30));
        assert!(g.checked((74 * 16, 48, 30)).is_ok());
        assert!(g.checked((74 * 16 - 1, 48, 30)).is_err());
        assert!(g.checked((74 * 16, 47, 30)).is_err());
        assert!(g.checked((74 * 16, 48, 29)).is_err());
        let e = score_gemm(1, (0, 1 << 31), 16)
            .checked((usize::MAX, usize::MAX, usize::MAX))
            .expect_err("over i32");
        assert!(e.to_string().contains("32-bit"), "{e}");
        let bad = Gemm { ldc: 9, ..g };
        assert!(bad.checked((usize::MAX, usize::MAX, usize::MAX)).is_err());
        // The rate probe's square GEMM: the same parameters as a square score tile.
        let sq = score_gemm(256, (0, 256), 256);
        assert_eq!(
            (sq.m, sq.n, sq.k, sq.lda, sq.ldb, sq.ldc),
            (256, 256, 256, 256, 256, 256)
        );
        assert_eq!(score_gemm(0, (0, 5), 16).extents(), (0, 0, 0));
    }

    #[test]
    fn spans_cover_once_in_order() {
        for (total, step) in [
            (0, 64),
            (1, 64),
            (64, 64),
            (65, 64),
            (1000, 7),
            (5, 1),
            (3, 0),
        ] {
            let s: Vec<_> = spans(total, step).collect();
            let mut next = 0;
            for &(start, len) in &s {
                assert_eq!(start, next);
                assert!(len >= 1 && len <= step.max(1));
                next += len;
            }
            assert_eq!(next, total, "{total} by {step}: {s:?}");
        }
        assert_eq!(
            spans(130, 64).collect::<Vec<_>>(),
            [(0, 64), (64, 64), (128, 2)]
        );
    }

    const GIB: usize = 1 << 30;

    fn chunk(path: KernelPath, m: usize, n: usize, dp: usize, k: usize, free: usize) -> usize {
        let p = Problem { path, m, n, dp, k };
        query_chunk_rows(&p, 0, || Ok(free)).expect("chunk")
    }

    #[test]
    fn query_chunks_keep_to_the_target_and_the_memory_bound() {
        use KernelPath::*;
        // The target: a quarter of the queries within [4096, 32768].
        assert_eq!(chunk(Fused, 100, 1000, 128, 10, 80 * GIB), 4096);
        assert_eq!(chunk(Fused, 40_000, 1000, 128, 10, 80 * GIB), 10_048);
        assert_eq!(chunk(Gemm, 1 << 20, 1000, 128, 10, 80 * GIB), 32_768);
        // The radix tile's bound, 2³¹ / 600,000 = 3,579.1 rows: 3,520, not 3,584.
        assert_eq!(chunk(Radix, 1 << 20, 600_000, 128, 100, 80 * GIB), 3_520);
        // A request wins, rounded up; free memory is not read then.
        let p = Problem {
            path: Radix,
            m: 10,
            n: 10,
            dp: 16,
            k: 1,
        };
        let no_free = || Err(GpuError::Unavailable("not read".into()));
        assert_eq!(query_chunk_rows(&p, 192, no_free).expect("chunk"), 192);
        assert_eq!(query_chunk_rows(&p, 1, no_free).expect("chunk"), 64);
        assert!(query_chunk_rows(&p, 0, no_free).is_err());

        for path in [Fused, Gemm, Radix] {
            for (m, n, dp, k) in [
                (262_144, 262_144, 128, 100),
                (131_072, 131_072, 208, 1024),
                (100_000, 600_000, 128, 16_000),
                (5_000, 3_000_000, 64, 50),
                (1, 1, 16, 1),
                (50_000, 1_000_000, 128, 100_000),
                (1 << 20, 600_000, 128, 100), // radix: 2³¹ / n = 3,579.1 rows
            ] {
                for free in [GIB / 2, 4 * GIB, 20 * GIB, 78 * GIB, 139 * GIB] {
                    let p = Problem { path, m, n, dp, k };
                    let c = chunk(path, m, n, dp, k, free);
                    let what = format!("{p:?}, {free} bytes free: chunk {c}");
                    assert!(c >= FUSED_BM && c.is_multiple_of(FUSED_BM), "{what}");
                    assert!(c <= 32_768, "{what}");
                    // Within the memory budget wherever the smallest chunk fits it.
                    let budget = p.chunk_budget(free);
                    if budget >= FUSED_BM * p.bytes_per_query() {
                        assert!(c * p.bytes_per_query() <= budget, "{what}: over {budget}");
                    }
                    if path == Radix && n <= RADIX_TILE_MAX / FUSED_BM {
                        assert!(c * n <= RADIX_TILE_MAX, "{what}: tile of {} scores", c * n);
                    }
                    // The radix scratch of that chunk holds every chunk's buffers.
                    let rows = c.min(m);
                    let (tile, packed) = radix_scratch(rows, n, k);
                    for (q0, r) in spans(m, c).take(3) {
                        for causal in [false, true] {
                            RadixPlan::new(r, n, dp, q0, causal, k)
                                .check_buffers(tile, packed)
                                .expect("scratch");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn key_tiles_fit_the_budget() {
        for (free, chunk, n) in [
            (80 * GIB, 32_768, 1_000_000),
            (80 * GIB, 4096, 100),
            (GIB, 32_768, 262_144),
            (GIB / 64, 32_768, 262_144),
            (139 * GIB, 64, 10_000_000),
            (80 * GIB, 4096, 1),
        ] {
            let t = key_tile_cols(free, chunk, n);
            let what = format!("{free} bytes, chunk {chunk}, {n} keys: tile {t}");
            assert!(t.is_multiple_of(256) && t >= 256, "{what}");
            assert!(t <= n.next_multiple_of(256), "{what}");
            let budget = (free / 4).min(4 * GIB);
            if budget >= 4 * chunk * 256 {
                assert!(4 * chunk * t <= budget, "{what}");
            }
        }
        assert_eq!(key_tile_cols(80 * GIB, 32_768, 1_000_000), 32_768);
        assert_eq!(key_tile_cols(GIB / 64, 32_768, 262_144), 256);
    }

    #[test]
    fn radix_buffers_and_the_sort_placement() {
        let p = RadixPlan::new(64, 1000, 128, 0, false, 100);
        assert_eq!((p.cols, p.ld, p.slots), (1000, 1000, 128));
        assert_eq!(p.lens(), (64_000, 64 * 128));
        assert!(p.check_buffers(64_000, 64 * 128).is_ok());
        let e = p.check_buffers(63_999, 64 * 128).expect_err("short tile");
        assert!(
            e.to_string().contains("64 rows × 1000 keys, k = 100"),
            "{e}"
        );
        assert!(p.check_buffers(64_000, 64 * 128 - 1).is_err());
        // Causal: the chunk from query 100 sees keys ..164 only, and its tile is that wide.
        let c = RadixPlan::new(64, 1000, 128, 100, true, 100);
        assert_eq!((c.cols, c.ld, c.lens().0), (164, 164, 64 * 164));
        // The sort in shared memory when a row's slots fit the opt-in limit (227 KiB on sm_90).
        assert_eq!(p.sort_smem(227 * 1024), Some(128 * 8));
        let big = RadixPlan::new(2, 100_000, 128, 0, false, 30_000);
        assert_eq!(big.slots, 32_768);
        assert_eq!(big.sort_smem(227 * 1024), None);
        assert_eq!(big.sort_smem(256 * 1024), Some(256 * 1024));
        assert!(!reusable(None, 1));
        assert!(reusable(Some(10), 10) && reusable(Some(11), 10) && !reusable(Some(9), 10));
    }
}
