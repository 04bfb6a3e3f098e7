//! The training queries of an index build, chosen alike by `qkindex bench` and `qkindex build`
//! (so that a bundle holds exactly what the bench measures).

use qkindex::dump::HeadTensor;

/// Training queries of query head `h`: its own prefill queries, or those of every query head
/// of its GQA group (`group` query heads per KV head `kv`) when `pool`, evenly strided down to
/// `max` rows (0: all).
pub fn training_queries(
    q: &HeadTensor,
    h: usize,
    kv: usize,
    group: usize,
    pool: bool,
    max: usize,
) -> Vec<f32> {
    let heads: Vec<usize> = if pool {
        (kv * group..(kv + 1) * group).collect()
    } else {
        vec![h]
    };
    let d = q.dim;
    let mut out = Vec::with_capacity(heads.len() * q.rows * d);
    for hh in heads {
        out.extend_from_slice(q.head(hh));
    }
    let rows = out.len() / d;
    if max > 0 && rows > max {
        let step = rows as f64 / max as f64;
        let picked: Vec<f32> = (0..max)
            .flat_map(|i| {
                let r = (i as f64 * step) as usize;
                out[r * d..(r + 1) * d].to_vec()
            })
            .collect();
        return picked;
    }
    out
}
