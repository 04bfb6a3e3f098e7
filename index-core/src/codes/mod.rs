//! Key codes one floor below the indexes (issue 26): what `flat:codes=…`, `ivf:codes=…` and
//! the graph's walks on codes share.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | [`Codes`] (the spec value), [`Width`] and the [`GroupCode`] trait every group code implements, 64-byte [`Line`]s, [`scan_groups`], [`rerank_exact`] |
//! | `keys.rs` | [`KeyCodes`]: the int8 encoder (affine per dimension, scaled per key) and [`CodeScorer`] |
//! | `i8.rs` | [`I8`]: int8 codes, 4 dimensions of 16 keys per line |
//! | `i4.rs` | [`I4`]: 4-bit codes, 8 dimensions of 16 keys per line |
//! | `select.rs` | [`top_ids`]: the best candidates of a scan's estimates, without a sort |
//! | `scan.rs` | [`ScanCodes`]: every key's codes in id order and their scan with an exact re-rank (`flat:codes=i8`, and the query heads a graph routes to the scan) |
//!
//! ```text
//!  keys ──KeyCodes::new──► int8 codes + scales ──write_slot_as(Width)──► groups of 16 keys
//!  query ──quantize_query_as──► QuantQuery ──scan (I8 / I4 kernels)──► estimates
//!        ──top_ids / beam──► candidates ──rerank_exact (stored keys)──► SearchOutput
//! ```
//!
//! Adding a code type: one file with a [`GroupCode`] impl and a [`Width`] variant.

mod i4;
mod i8;
mod keys;
mod scan;
mod select;

pub(crate) use i4::I4;
pub(crate) use i8::{EMPTY_LINE, I8};
pub use keys::{CodeScorer, KeyCodes};
pub use scan::ScanCodes;
pub(crate) use select::top_ids;

use crate::error::{Error, Result};
use crate::metric::int8::{GroupQ8, QuantQuery, GROUP};
use crate::scratch::Scratch;
use crate::search::SearchOutput;
use crate::store::Scorer;

/// Key codes a search traverses or scans on (issue 26): the candidates are ranked by code
/// estimates and the final list is re-ranked on the stored keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codes {
    /// Traverse on the stored keys (f16/f32/int8) themselves.
    #[default]
    None,
    /// Int8 codes normalised per dimension with one scale per key, estimated with an int8 query (VNNI where present).
    I8,
    /// The same codes also stored inline with the adjacency: each node's block holds its
    /// neighbours' codes, estimated together from one contiguous read
    /// ([`crate::graph::inline::InlineCodes`]; about `degree · (dim + 8)` more bytes per key).
    #[serde(rename = "i8-inline")]
    I8Inline,
    /// 4-bit codes (the int8 codes rounded to 15 levels), for the scans (`flat`, `ivf`): half
    /// the bytes, coarser estimates (re-rank more candidates).
    I4,
}

impl Codes {
    /// The spec name (`none`, `i8`, `i8-inline`, `i4`).
    pub fn name(self) -> &'static str {
        match self {
            Codes::None => "none",
            Codes::I8 => "i8",
            Codes::I8Inline => "i8-inline",
            Codes::I4 => "i4",
        }
    }

    /// True for [`Codes::None`].
    pub fn is_none(&self) -> bool {
        *self == Codes::None
    }

    /// The group width a scan of these codes uses (`None`: the exact scan; `i8-inline` has no
    /// meaning for a scan).
    pub(crate) fn scan_width(self) -> Option<Width> {
        match self {
            Codes::None | Codes::I8Inline => None,
            Codes::I8 => Some(Width::I8),
            Codes::I4 => Some(Width::I4),
        }
    }
}

impl std::str::FromStr for Codes {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        [Codes::None, Codes::I8, Codes::I8Inline, Codes::I4]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| Error::invalid_param("codes", s, "expected none, i8, i8-inline or i4"))
    }
}

/// One cache line of interleaved groups ([`KeyCodes::write_slot_as`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// A code type stored in interleaved groups of [`GROUP`] keys: a group is its code lines, then
/// one line of [`GROUP`] f32 scales, then one of [`GROUP`] u32 ids.
pub(crate) trait GroupCode {
    /// Dimensions of the [`GROUP`] keys one line holds.
    const DIMS_PER_LINE: usize;
    /// A line of empty slots (code 0 in every dimension).
    const EMPTY: Line;
    /// Writes the int8 code `code` of one key into slot `slot` of a group's code lines `lines`
    /// (made of [`GroupCode::EMPTY`] lines for the slots not written); returns the scale to store
    /// beside it for a key whose int8 scale is `scale`.
    fn write_code(lines: &mut [Line], slot: usize, code: &[i8], scale: f32) -> f32;
    /// The estimates of whole consecutive groups (`bytes`, `code_lines` code lines each) for
    /// `quant` into `out` ([`GROUP`] per group).
    fn scan(quant: &QuantQuery, bytes: &[u8], code_lines: usize, out: &mut [f32]);
}

/// The group code of a scan or walk: [`I8`] or [`I4`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Width {
    #[default]
    I8,
    I4,
}

/// `$e` with `$c` the [`GroupCode`] type of width `$w`.
macro_rules! with_code {
    ($w:expr, $c:ident => $e:expr) => {
        match $w {
            Width::I8 => {
                type $c = I8;
                $e
            }
            Width::I4 => {
                type $c = I4;
                $e
            }
        }
    };
}

impl Width {
    /// Dimensions per line.
    pub(crate) fn dims_per_line(self) -> usize {
        with_code!(self, C => C::DIMS_PER_LINE)
    }

    /// Lines of codes per group for keys of `dim` dimensions.
    pub(crate) fn code_lines(self, dim: usize) -> usize {
        dim.div_ceil(self.dims_per_line())
    }

    /// A line of empty slots.
    pub(crate) fn empty_line(self) -> Line {
        with_code!(self, C => C::EMPTY)
    }

    /// [`GroupCode::write_code`] of this width.
    pub(crate) fn write_code(
        self,
        lines: &mut [Line],
        slot: usize,
        code: &[i8],
        scale: f32,
    ) -> f32 {
        with_code!(self, C => C::write_code(lines, slot, code, scale))
    }

    /// [`GroupCode::scan`] of this width.
    pub(crate) fn scan(self, quant: &QuantQuery, bytes: &[u8], code_lines: usize, out: &mut [f32]) {
        with_code!(self, C => C::scan(quant, bytes, code_lines, out))
    }
}

/// Where [`scan_groups`] sends the estimates of each group.
pub(crate) trait GroupSink {
    /// Estimates at or below this are not wanted (read once per group).
    fn floor(&self) -> f32;
    /// The estimates of one group: `mask` has the bits of the valid slots above the floor
    /// (never 0), `ids` the group's ids.
    fn take(&mut self, mask: u32, ids: &[u32; GROUP], est: &[f32; GROUP]);
}

/// The estimates of the first `count` slots of consecutive `groups` (of `quads + 2` lines) for
/// `query` (its codes padded to `4 · quads`), handed to `sink` ([`GroupSink`]) group by group.
#[inline(always)]
pub(crate) fn scan_groups<S: GroupSink + ?Sized>(
    groups: &[Line],
    quads: usize,
    count: usize,
    query: &QuantQuery,
    group_q8: GroupQ8,
    sink: &mut S,
) {
    let mut dots = [0i32; GROUP];
    let mut est = [0.0f32; GROUP];
    let mut left = count;
    for group in groups.chunks_exact(quads + 2) {
        if left == 0 {
            break;
        }
        let (codes, rest) = group.split_at(quads);
        group_q8(&query.codes, bytemuck::cast_slice(codes), &mut dots);
        let scales: &[f32; GROUP] = bytemuck::cast_ref(&rest[0]);
        let f = sink.floor();
        let mut mask = 0u32;
        for (s, e) in est.iter_mut().enumerate() {
            *e = query.estimate(dots[s], scales[s]);
            mask |= u32::from(*e > f) << s;
        }
        let valid = left.min(GROUP);
        left -= valid;
        mask &= ((1u64 << valid) - 1) as u32;
        if mask != 0 {
            sink.take(mask, bytemuck::cast_ref(&rest[1]), &est);
        }
    }
}

/// Replaces the candidates of a traversal on codes in `out` (ranked by estimate, every
/// estimate counted in `distance_computations`) with the best `k` of them by `exact` score,
/// best first; the estimates move to `code_estimates` and `distance_computations` counts the
/// exact products.
pub(crate) fn rerank_exact(
    exact: &Scorer<'_>,
    query: &[f32],
    k: usize,
    scratch: &mut Scratch,
    out: &mut SearchOutput,
) {
    let estimates = out.stats.distance_computations;
    let Scratch { best, scores, .. } = scratch;
    scores.resize(out.ids.len(), 0.0);
    exact.score_ids(query, &out.ids, scores);
    best.reset(k);
    for (&id, &score) in out.ids.iter().zip(scores.iter()) {
        best.push(score, id);
    }
    let exact_products = out.ids.len() as u64;
    out.ids.clear();
    out.scores.clear();
    best.drain_sorted(&mut out.ids, &mut out.scores);
    out.stats.distance_computations = exact_products;
    out.stats.code_estimates = estimates;
}
