//! [`top_ids`]: the ids of a scan's best estimates, without a sort or a heap over all of them.

use crate::scratch::{from_order_key, order_key};

/// Appends to `out` the ids of the `c` largest values of `est` (in no order; ties at the
/// boundary broken arbitrarily). A threshold from every 16th value keeps about `1.25 c`
/// candidates in one pass over `est` (lowered until at least `c` pass), and a selection among
/// those picks `c`: no sort and no heap over all of `est`. Compiled for AVX-512 too (the
/// 16-value tests become one comparison into a mask register), picked at run time.
pub(crate) fn top_ids(
    est: &[f32],
    c: usize,
    sample: &mut Vec<u32>,
    picked: &mut Vec<u64>,
    out: &mut Vec<u32>,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::metric::isa::avx512_loops() {
        // SAFETY: `avx512_loops` is true only when every feature that `top_ids_avx512`
        // enables was detected on this CPU.
        return unsafe { top_ids_avx512(est, c, sample, picked, out) };
    }
    top_ids_impl(est, c, sample, picked, out)
}

/// [`top_ids_impl`] compiled with AVX-512 (callers check the features first).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,bmi1,bmi2,popcnt,lzcnt")]
unsafe fn top_ids_avx512(
    est: &[f32],
    c: usize,
    sample: &mut Vec<u32>,
    picked: &mut Vec<u64>,
    out: &mut Vec<u32>,
) {
    top_ids_impl(est, c, sample, picked, out)
}

#[inline(always)]
fn top_ids_impl(
    est: &[f32],
    c: usize,
    sample: &mut Vec<u32>,
    picked: &mut Vec<u64>,
    out: &mut Vec<u32>,
) {
    const STRIDE: usize = 16;
    if c >= est.len() {
        out.extend(0..est.len() as u32);
        return;
    }
    let mut rank = (c + c / 4).div_ceil(STRIDE) + 2;
    loop {
        // Scores as order-preserving integers ([`order_key`]): selections compare integers.
        sample.clear();
        sample.extend(est.iter().step_by(STRIDE).map(|&e| order_key(e)));
        let t = if rank >= sample.len() {
            f32::NEG_INFINITY
        } else {
            from_order_key(*sample.select_nth_unstable_by(rank, |a, b| b.cmp(a)).1)
        };
        picked.clear();
        // 16 values per test (one vectorised comparison); few blocks hold any.
        for (b, block) in est.chunks(16).enumerate() {
            let mut mask = block
                .iter()
                .enumerate()
                .fold(0u32, |m, (i, &e)| m | (u32::from(e >= t) << i));
            while mask != 0 {
                let i = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                picked.push(u64::from(order_key(block[i])) << 32 | (16 * b + i) as u64);
            }
        }
        if picked.len() >= c || t == f32::NEG_INFINITY {
            break;
        }
        rank *= 2;
    }
    if picked.len() > c {
        picked.select_nth_unstable_by(c - 1, |a, b| b.cmp(a));
        picked.truncate(c);
    }
    out.extend(picked.iter().map(|&x| x as u32));
}
