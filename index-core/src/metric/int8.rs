//! Kernels over int8 key codes (issue 26): an f32 query against int8 rows with one f32 scale per
//! row (`key ≈ scale · code`, [`crate::Dtype::I8`]), and the code estimates of graph traversal,
//! where the query is quantized too and the inner product runs in integers.
//!
//! | function | job |
//! |---|---|
//! | [`I8Kernels::dot`] | `Σ q_i · c_i` for an f32 query and one int8 row (unscaled) |
//! | [`I8Kernels::gather`] | `scale[id] · (q · codes[id])` for a list of ids |
//! | [`I8Kernels::range`] | the same for consecutive rows |
//! | [`I8Kernels::dot_q8`] | `Σ q8_i · c_i` in i32 for an int8 query and one int8 row |
//! | [`I8Kernels::gather_q8`] | the code estimates of a list of ids ([`QuantQuery`]) |
//! | [`I8Kernels::group_q8`] | the integer dot products of [`GROUP`] interleaved rows (inline codes) |
//!
//! The scalar functions here are the reference of the property tests; `x86_int8.rs` holds the
//! AVX2 and AVX-512 versions (the integer kernels use AVX-512 VNNI or AVX-VNNI where present).
//! Kept apart from [`super::Kernels`] so that adding a key type does not touch every ISA's
//! kernel set.

use std::sync::OnceLock;

/// `Σ q_i · c_i` of an f32 query with one int8 row (equal lengths), without the row's scale.
pub type DotI8 = fn(&[f32], &[i8]) -> f32;
/// `out[i] = scales[ids[i]] · (q · codes[ids[i]])` for row-major `codes` with `dim` columns.
pub type GatherI8 = fn(&[f32], &[i8], &[f32], usize, &[u32], &mut [f32]);
/// `out[i] = scales[i] · (q · rows[i])` for consecutive row-major rows of `dim` columns.
pub type RangeI8 = fn(&[f32], &[i8], &[f32], usize, &mut [f32]);
/// `Σ a_i · b_i` of two int8 vectors (equal lengths, every value in `-127..=127`), exact in i32.
pub type DotQ8 = fn(&[i8], &[i8]) -> i32;
/// `out[i] = query.estimate(codes[ids[i]], scales[ids[i]])` ([`QuantQuery`]).
pub type GatherQ8 = fn(&QuantQuery, &[i8], &[f32], usize, &[u32], &mut [f32]);
/// `out[s] = Σ_i q_i · code(s, i)` for the [`GROUP`] rows of one interleaved group
/// ([`group_q8`] documents the layout); `q` has a multiple of 4 values, the group `GROUP · q.len()`
/// bytes. Exact in i32.
pub type GroupQ8 = fn(&[i8], &[u8], &mut [i32; GROUP]);
/// The estimates of consecutive groups of `quads + 2` lines each (codes, scales, ids, as
/// [`group_q8`] and the graph's inline blocks lay them out): `out[16·g + s] =
/// query.estimate(Σ_i query.codes_i · code(g, s, i), scale(g, s))` for every group `g` of
/// `groups` (whole groups; `out` holds `16 ·` their count).
pub type ScanQ8 = fn(&QuantQuery, &[u8], usize, &mut [f32]);
/// [`ScanQ8`] for 4-bit codes ([`scan_q4`]): groups of `octets + 2` lines.
pub type ScanQ4 = fn(&QuantQuery, &[u8], usize, &mut [f32]);
/// [`ScanQ8`] of several queries in one pass over the groups: the estimates of query `b` go to
/// row `b` of `out` (`queries.len()` rows of `out.len() / queries.len()` values), equal to what
/// the same set's [`ScanQ8`] writes for that query alone. Each line is loaded once for all the
/// queries (GQA: the query heads of a KV head search the same keys).
pub type ScanQ8Many = fn(&[QuantQuery], &[u8], usize, &mut [f32]);

/// Rows per interleaved group of [`I8Kernels::group_q8`] (one AVX-512 register of i32 sums).
pub const GROUP: usize = 16;

/// One consistent set of int8 kernels for the running CPU.
#[derive(Clone, Copy, Debug)]
pub struct I8Kernels {
    /// Which instruction set the kernels use (`"avx512-vnni"`, `"avx512"`, `"avx2-vnni"`,
    /// `"avx2"` or `"scalar"`).
    pub isa: &'static str,
    pub dot: DotI8,
    pub gather: GatherI8,
    pub range: RangeI8,
    pub dot_q8: DotQ8,
    pub gather_q8: GatherQ8,
    pub group_q8: GroupQ8,
    pub scan_q8: ScanQ8,
    pub scan_q4: ScanQ4,
    /// The batched [`ScanQ8`] where the set has one (the AVX2 sets; not yet the VNNI ones,
    /// whose single scan is load-bound already); [`I8Kernels::scan_q8_rows`] runs either.
    pub scan_q8_many: Option<ScanQ8Many>,
}

impl I8Kernels {
    /// The portable reference kernels.
    pub fn scalar() -> Self {
        I8Kernels {
            isa: "scalar",
            dot: dot_i8,
            gather: gather_i8,
            range: range_i8,
            dot_q8,
            gather_q8,
            group_q8,
            scan_q8,
            scan_q4,
            scan_q8_many: None,
        }
    }

    /// [`ScanQ8`] of every query of `queries` into consecutive rows of `out`
    /// (`out.len() / queries.len()` values each, at least `GROUP ·` the groups): in one pass over
    /// the groups with [`I8Kernels::scan_q8_many`] where the set has it, else one pass per query.
    /// The estimates are the same either way.
    pub fn scan_q8_rows(
        &self,
        queries: &[QuantQuery],
        groups: &[u8],
        quads: usize,
        out: &mut [f32],
    ) {
        let Some(stride) = out.len().checked_div(queries.len()) else {
            return;
        };
        match self.scan_q8_many {
            Some(many) if queries.len() > 1 => many(queries, groups, quads, out),
            _ => {
                for (query, row) in queries.iter().zip(out.chunks_exact_mut(stride)) {
                    (self.scan_q8)(query, groups, quads, row);
                }
            }
        }
    }

    /// Every int8 kernel set the running CPU supports, best first (the scalar set last).
    pub fn available() -> Vec<I8Kernels> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        all.extend(super::x86_int8::available());
        all.push(I8Kernels::scalar());
        all
    }
}

/// The best int8 kernel set for this CPU, detected on first use.
pub fn i8_kernels() -> &'static I8Kernels {
    static KERNELS: OnceLock<I8Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        I8Kernels::available()
            .into_iter()
            .next()
            .unwrap_or_else(I8Kernels::scalar)
    })
}

/// Symmetric int8 code of one row: `scale = max|x| / 127`, `code_i = round(x_i / scale)` in
/// `-127..=127` (so that `x_i ≈ scale · code_i` with error at most `scale / 2`). An all-zero row
/// has scale 0 and zero codes. Writes `codes` (length of `row`) and returns the scale.
pub fn quantize_row(row: &[f32], codes: &mut [i8]) -> f32 {
    let max = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        codes.iter_mut().for_each(|c| *c = 0);
        return 0.0;
    }
    let scale = max / 127.0;
    let inv = 127.0 / max;
    for (c, &x) in codes.iter_mut().zip(row) {
        *c = (x * inv).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// A query quantized for code estimates: `query ≈ scale · codes` ([`quantize_row`]), so that
/// `query · key ≈ scale · key_scale · Σ codes_i · key_codes_i + bias`, an integer inner product
/// (`bias` is the part common to every key of affine codes, 0 for plain ones).
/// `sum` (`Σ codes_i`) lets the VNNI kernels, which multiply unsigned by signed bytes, run on
/// `key_codes + 128` and subtract `128 · sum`.
#[derive(Clone, Debug, Default)]
pub struct QuantQuery {
    pub codes: Vec<i8>,
    pub scale: f32,
    pub sum: i32,
    pub bias: f32,
}

impl QuantQuery {
    /// Quantizes `query` into `self` (reusing its buffer), for keys coded as `scale · code`.
    pub fn set(&mut self, query: &[f32]) {
        self.codes.resize(query.len(), 0);
        self.scale = quantize_row(query, &mut self.codes);
        self.sum = self.codes.iter().map(|&c| i32::from(c)).sum();
        self.bias = 0.0;
    }

    /// Quantizes `query ⊙ range` into `self`, with `bias = query · offset`: the query for keys
    /// coded per dimension as `key_i ≈ offset_i + range_i · scale · code_i`
    /// ([`crate::codes::KeyCodes`]). All three slices have the query's length.
    pub fn set_affine(&mut self, query: &[f32], offset: &[f32], range: &[f32]) {
        let d = query.len();
        self.codes.resize(d, 0);
        let max = query
            .iter()
            .zip(range)
            .fold(0.0f32, |m, (q, r)| m.max((q * r).abs()));
        if max == 0.0 || !max.is_finite() {
            self.codes.iter_mut().for_each(|c| *c = 0);
            self.scale = 0.0;
        } else {
            let inv = 127.0 / max;
            for ((c, q), r) in self.codes.iter_mut().zip(query).zip(range) {
                *c = (q * r * inv).round().clamp(-127.0, 127.0) as i8;
            }
            self.scale = max / 127.0;
        }
        self.sum = self.codes.iter().map(|&c| i32::from(c)).sum();
        self.bias = query.iter().zip(offset).map(|(q, o)| q * o).sum();
    }

    /// The estimate of `query · key` for a key coded as `scale · codes`, given the integer
    /// inner product `dot = Σ self.codes_i · codes_i`.
    #[inline]
    pub fn estimate(&self, dot: i32, key_scale: f32) -> f32 {
        self.scale * key_scale * dot as f32 + self.bias
    }
}

/// `a · b` with four independent f32 accumulators (the order of [`super::scalar`]).
pub fn dot_i8(a: &[f32], b: &[i8]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 4];
    let chunks = n / 4;
    for c in 0..chunks {
        for l in 0..4 {
            acc[l] += a[4 * c + l] * f32::from(b[4 * c + l]);
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for i in 4 * chunks..n {
        s += a[i] * f32::from(b[i]);
    }
    s
}

/// `out[i] = scales[ids[i]] · (q · codes[ids[i]])`.
pub fn gather_i8(
    q: &[f32],
    codes: &[i8],
    scales: &[f32],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
) {
    for (o, &id) in out.iter_mut().zip(ids) {
        let s = id as usize * dim;
        *o = scales[id as usize] * dot_i8(q, &codes[s..s + dim]);
    }
}

/// `out[i] = scales[i] · (q · rows[i])`.
pub fn range_i8(q: &[f32], rows: &[i8], scales: &[f32], dim: usize, out: &mut [f32]) {
    for ((o, row), &s) in out.iter_mut().zip(rows.chunks_exact(dim)).zip(scales) {
        *o = s * dot_i8(q, row);
    }
}

/// `Σ a_i · b_i` in i32 (exact: 127² · dim stays far below `i32::MAX` for any head dimension).
pub fn dot_q8(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// `out[i] = query.estimate(codes[ids[i]] · query.codes, scales[ids[i]])`.
pub fn gather_q8(
    query: &QuantQuery,
    codes: &[i8],
    scales: &[f32],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
) {
    for (o, &id) in out.iter_mut().zip(ids) {
        let s = id as usize * dim;
        *o = query.estimate(
            dot_q8(&query.codes, &codes[s..s + dim]),
            scales[id as usize],
        );
    }
}

/// The reference of [`I8Kernels::group_q8`]. A group holds the codes of [`GROUP`] rows
/// interleaved by 4 dimensions, the layout of `vpdpbusd`: byte `64·j + 4·s + b` (for
/// `GROUP = 16`) is dimension `4·j + b` of row `s`, stored flipped (`code ^ 0x80`, so `0x80` is
/// code 0). `q` has `4·j` values (dimensions padded with zeros to a multiple of 4).
pub fn group_q8(q: &[i8], group: &[u8], out: &mut [i32; GROUP]) {
    out.fill(0);
    for (quad, block) in q.chunks_exact(4).zip(group.chunks_exact(4 * GROUP)) {
        for (o, row) in out.iter_mut().zip(block.chunks_exact(4)) {
            for (&c, &x) in row.iter().zip(quad) {
                *o += i32::from((c ^ 0x80) as i8) * i32::from(x);
            }
        }
    }
}

/// The reference of [`I8Kernels::scan_q8`]: [`group_q8`] per group, then the estimates.
pub fn scan_q8(query: &QuantQuery, groups: &[u8], quads: usize, out: &mut [f32]) {
    scan_groups_with(group_q8, query, groups, quads, out)
}

/// The reference of [`I8Kernels::scan_q4`]: 4-bit codes in groups of [`GROUP`] keys, 8
/// dimensions per 64-byte line. Byte `4·s + b` of line `j` (for `GROUP = 16`) holds dimension
/// `8·j + b` of key `s` in its low nibble and dimension `8·j + 4 + b` in its high nibble, each
/// stored as `code + 8` (codes in `-7..=7`); after the `octets` lines come the 16 scales and the
/// 16 ids. `out[16·g + s] = query.estimate(Σ_i query.codes_i · code(g, s, i), scale(g, s))`
/// (`query.codes` padded to `8 · octets`).
pub fn scan_q4(query: &QuantQuery, groups: &[u8], octets: usize, out: &mut [f32]) {
    let bytes = (octets + 2) * 4 * GROUP;
    let q = &query.codes;
    for (group, est) in groups.chunks_exact(bytes).zip(out.chunks_exact_mut(GROUP)) {
        let (codes, rest) = group.split_at(octets * 4 * GROUP);
        for (s, (e, scale)) in est.iter_mut().zip(rest.chunks_exact(4)).enumerate() {
            let mut dot = 0i32;
            for (j, line) in codes.chunks_exact(4 * GROUP).enumerate() {
                for b in 0..4 {
                    let byte = line[4 * s + b];
                    let (lo, hi) = (i32::from(byte & 15) - 8, i32::from(byte >> 4) - 8);
                    dot += lo * i32::from(q.get(8 * j + b).copied().unwrap_or(0));
                    dot += hi * i32::from(q.get(8 * j + 4 + b).copied().unwrap_or(0));
                }
            }
            let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
            *e = query.estimate(dot, scale);
        }
    }
}

/// [`scan_q8`] over any [`GroupQ8`] kernel (the sets without a fused scan use it).
#[inline(always)]
pub fn scan_groups_with(
    group_q8: GroupQ8,
    query: &QuantQuery,
    groups: &[u8],
    quads: usize,
    out: &mut [f32],
) {
    let bytes = (quads + 2) * 4 * GROUP;
    let mut dots = [0i32; GROUP];
    for (group, est) in groups.chunks_exact(bytes).zip(out.chunks_exact_mut(GROUP)) {
        let (codes, rest) = group.split_at(quads * 4 * GROUP);
        group_q8(&query.codes, codes, &mut dots);
        for ((e, &dot), scale) in est.iter_mut().zip(&dots).zip(rest.chunks_exact(4)) {
            let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
            *e = query.estimate(dot, scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_row_bounds_the_error_by_half_a_step() {
        let row = [0.3f32, -1.27, 0.0, 0.635, 1.0];
        let mut codes = [0i8; 5];
        let scale = quantize_row(&row, &mut codes);
        assert!((scale - 0.01).abs() < 1e-7);
        assert_eq!(codes[1], -127);
        for (&x, &c) in row.iter().zip(&codes) {
            assert!((x - scale * f32::from(c)).abs() <= scale / 2.0 + 1e-7);
        }
        assert_eq!(quantize_row(&[0.0; 3], &mut codes[..3]), 0.0);
        assert_eq!(&codes[..3], &[0, 0, 0]);
    }

    #[test]
    fn quant_query_estimates_the_inner_product() {
        let q = [0.5f32, -2.0, 1.5, 0.25];
        let k = [1.0f32, 0.5, -0.75, 2.0];
        let mut qq = QuantQuery::default();
        qq.set(&q);
        let mut kc = [0i8; 4];
        let ks = quantize_row(&k, &mut kc);
        let est = qq.estimate(dot_q8(&qq.codes, &kc), ks);
        let exact: f32 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
        assert!((est - exact).abs() < 0.05, "{est} vs {exact}");
        assert_eq!(qq.sum, qq.codes.iter().map(|&c| i32::from(c)).sum::<i32>());
    }
}
