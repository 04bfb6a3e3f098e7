//! What the ISA kernel files share: the macro that turns a pair of dot kernels into a
//! [`Kernels`](super::Kernels) set (with gather and range loops compiled for the same features,
//! so that the dot kernel inlines into them), those loops, and the prefetch hint.
//!
//! The macros name `Kernels`, `gather_rows` and `range_rows` (and, for `range: blocks`,
//! `range_blocks`) unqualified: the ISA file that calls them imports those names.

/// Defines `unsafe fn $set() -> Kernels`, one instruction set's kernels: its dot kernels, and
/// gather and range loops compiled for `$features` around them (`range: single` scores one row at
/// a time, `range: blocks($four)` several rows per step through `$four`, see the x86 file's
/// `range_blocks`). The defined function is unsafe: the function pointers it returns may only be
/// called on a CPU with `$features`.
macro_rules! kernel_set {
    (
        $(#[$doc:meta])*
        $set:ident, $isa:literal, $features:literal,
        f32: ($dot_f32:ident, range: $range_f32:ident $(($four_f32:ident))?
              $(, gather: rows4($g4_f32:ident))?),
        f16: ($dot_f16:ident, range: $range_f16:ident $(($four_f16:ident))?
              $(, gather: rows4($g4_f16:ident))?) $(,)?
    ) => {
        $(#[$doc])*
        unsafe fn $set() -> Kernels {
            scan_loops!($features, f32, $dot_f32, gather_f32, range_f32, $range_f32 $(($four_f32))?; $($g4_f32)?);
            scan_loops!($features, f16, $dot_f16, gather_f16, range_f16, $range_f16 $(($four_f16))?; $($g4_f16)?);
            Kernels {
                isa: $isa,
                // SAFETY: the caller of this function vouches for the features.
                dot_f32: |a, b| unsafe { $dot_f32(a, b) },
                // SAFETY: the caller of this function vouches for the features.
                dot_f16: |a, b| unsafe { $dot_f16(a, b) },
                // SAFETY: the caller of this function vouches for the features.
                gather_f32: |q, keys, dim, ids, out| unsafe { gather_f32(q, keys, dim, ids, out) },
                // SAFETY: the caller of this function vouches for the features.
                gather_f16: |q, keys, dim, ids, out| unsafe { gather_f16(q, keys, dim, ids, out) },
                // SAFETY: the caller of this function vouches for the features.
                range_f32: |q, rows, dim, out| unsafe { range_f32(q, rows, dim, out) },
                // SAFETY: the caller of this function vouches for the features.
                range_f16: |q, rows, dim, out| unsafe { range_f16(q, rows, dim, out) },
            }
        }
    };
}

/// The gather and range loops of one key type `$t` over the dot kernel `$dot`, compiled for
/// `$features` so that the kernel inlines into them; with a four-row kernel after the `;`
/// (`unsafe fn(q: &[f32], rows: [&[$t]; 4], out: &mut [f32])`, `q.len()` a multiple of 8), the
/// gather scores four rows per step.
macro_rules! scan_loops {
    ($features:literal, $t:ty, $dot:ident, $gather:ident, $range:ident, $how:ident $(($four:ident))?; $($g4:ident)?) => {
        #[target_feature(enable = $features)]
        fn $gather(q: &[f32], keys: &[$t], dim: usize, ids: &[u32], out: &mut [f32]) {
            gather_loop!($($g4)?; q, keys, dim, ids, out, $dot)
        }
        #[target_feature(enable = $features)]
        fn $range(q: &[f32], rows: &[$t], dim: usize, out: &mut [f32]) {
            range_loop!($how $(($four))?, q, rows, dim, out, $dot)
        }
    };
}

/// The body of a gather kernel: one row at a time, or four rows per step through `$four`.
macro_rules! gather_loop {
    (; $q:ident, $keys:ident, $dim:ident, $ids:ident, $out:ident, $dot:ident) => {
        // SAFETY: same target features as this function.
        gather_rows($keys, $dim, $ids, $out, |row| unsafe { $dot($q, row) })
    };
    ($four:ident; $q:ident, $keys:ident, $dim:ident, $ids:ident, $out:ident, $dot:ident) => {
        gather_blocks(
            $keys,
            $dim,
            $ids,
            $out,
            $dim.is_multiple_of(8) && $q.len() >= $dim,
            // SAFETY: same target features; `gather_blocks` passes four rows of `dim` values and
            // blocks only when `dim` is a multiple of 8 and `q` holds `dim` values.
            |rows, o| unsafe { $four(&$q[..$dim], rows, o) },
            // SAFETY: same target features as this function.
            |row| unsafe { $dot($q, row) },
        )
    };
}

/// The body of a range kernel: `single` (one row at a time) or `blocks(four)`.
macro_rules! range_loop {
    (single, $q:ident, $rows:ident, $dim:ident, $out:ident, $dot:ident) => {
        // SAFETY: same target features as this function.
        range_rows($rows, $dim, $out, |row| unsafe { $dot($q, row) })
    };
    (blocks($four:ident), $q:ident, $rows:ident, $dim:ident, $out:ident, $dot:ident) => {
        range_blocks(
            $q,
            $rows,
            $dim,
            $out,
            // SAFETY: same target features; `range_blocks` passes 4 rows of a `dim` that is a
            // multiple of 16.
            |block, o| unsafe { $four($q, block, $dim, o) },
            // SAFETY: same target features as this function.
            |row| unsafe { $dot($q, row) },
        )
    };
}

/// The gather loop (inlined into each set's `#[target_feature]` kernel): requests every row
/// first so that their cache misses overlap, then scores each row `ids[i]` with `dot`.
#[inline(always)]
pub(super) fn gather_rows<T>(
    keys: &[T],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
    dot: impl Fn(&[T]) -> f32,
) {
    prefetch_rows(keys, dim, ids);
    for (o, &id) in out.iter_mut().zip(ids) {
        let start = id as usize * dim;
        *o = dot(&keys[start..start + dim]);
    }
}

/// [`gather_rows`] four rows per step through `four` when `blocked` (the rest, and everything
/// otherwise, one at a time through `one`). `four` must give each row the bits `one` gives it.
// Only the x86 AVX2 set has a four-row gather kernel today.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(super) fn gather_blocks<T>(
    keys: &[T],
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
    blocked: bool,
    four: impl Fn([&[T]; 4], &mut [f32]),
    one: impl Fn(&[T]) -> f32,
) {
    prefetch_rows(keys, dim, ids);
    let n = out.len().min(ids.len());
    let split = if blocked { n / 4 * 4 } else { 0 };
    let row = |id: u32| {
        let start = id as usize * dim;
        &keys[start..start + dim]
    };
    for (o, b) in out[..split].chunks_exact_mut(4).zip(ids.chunks_exact(4)) {
        four([row(b[0]), row(b[1]), row(b[2]), row(b[3])], o);
    }
    for (o, &id) in out[split..n].iter_mut().zip(&ids[split..n]) {
        *o = one(row(id));
    }
}

/// Requests every row `ids[i]` of `keys` (rows of `dim` values) so that their misses overlap.
#[inline(always)]
fn prefetch_rows<T>(keys: &[T], dim: usize, ids: &[u32]) {
    let size = std::mem::size_of::<T>();
    for &id in ids {
        prefetch_row(
            keys.as_ptr().cast(),
            id as usize * dim * size,
            dim * size,
            std::mem::size_of_val(keys),
        );
    }
}

/// The plain range loop: `out[i] = dot(rows[i])`, one row at a time.
#[inline(always)]
pub(super) fn range_rows<T>(rows: &[T], dim: usize, out: &mut [f32], dot: impl Fn(&[T]) -> f32) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        *o = dot(row);
    }
}

/// Prefetches the cache lines of one key row (`row_bytes` long at byte `offset` of a buffer of
/// `total_bytes`) into L1; does nothing when the row lies outside the buffer.
#[inline(always)]
fn prefetch_row(base: *const i8, offset: usize, row_bytes: usize, total_bytes: usize) {
    if offset + row_bytes > total_bytes {
        return;
    }
    let mut line = 0;
    while line < row_bytes {
        // SAFETY: the address lies inside the buffer (checked above); a prefetch never faults.
        prefetch_line(unsafe { base.add(offset + line) });
        line += 64;
    }
}

/// Prefetches every cache line of `values` into L1.
#[inline(always)]
pub(super) fn prefetch_slice<T>(values: &[T]) {
    let bytes = std::mem::size_of_val(values);
    prefetch_row(values.as_ptr().cast(), 0, bytes, bytes);
}

/// Asks for the cache line holding `p` in L1 (x86 `prefetcht0`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_line(p: *const i8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: prefetch never faults, whatever the address; SSE is baseline on x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
}

/// Asks for the cache line holding `p` in L1 (`prfm pldl1keep`: a hint for a load, kept).
/// Inline assembly because the aarch64 prefetch intrinsic is not stable in Rust.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn prefetch_line(p: *const i8) {
    // SAFETY: PRFM never faults and changes no register, flag or memory; it only hints the cache.
    unsafe {
        std::arch::asm!(
            "prfm pldl1keep, [{p}]",
            p = in(reg) p,
            options(nostack, preserves_flags, readonly)
        )
    };
}
