//! Bench rows → the series the plots draw: one point per search setting, the recall of a head's
//! curve at a scanned budget, per-layer means and the Q→K / K→K gap at that budget.

use super::Series;
use crate::report::{median, params_str, Row};
use std::collections::BTreeMap;

/// The label of a row's curve: `index[/variant]`, with the implementation when not ours.
fn series_label(r: &Row) -> String {
    let mut s = r.index.clone();
    if !r.variant.is_empty() {
        s.push('/');
        s.push_str(&r.variant);
    }
    if r.implementation != "qkindex" {
        s = format!("{} {s}", r.implementation);
    }
    s
}

/// The query sets of `rows`, `q2k` first.
pub(super) fn query_sets(rows: &[&Row]) -> Vec<String> {
    let mut sets: Vec<String> = rows.iter().map(|r| r.queries.clone()).collect();
    sets.sort_by_key(|q| (q != "q2k", q.clone()));
    sets.dedup();
    sets
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Axis {
    Scanned,
    Qps,
}

/// Per series (sorted by label), one point per search setting: (mean scanned or median QPS,
/// mean recall) over the heads measured at that setting. Flat scans are one point.
pub(super) fn curves(rows: &[&Row], queries: &str, axis: Axis) -> Vec<Series> {
    let mut groups: BTreeMap<String, BTreeMap<String, Vec<&Row>>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.queries == queries) {
        if axis == Axis::Scanned && r.scanned.is_none() {
            continue;
        }
        groups
            .entry(series_label(r))
            .or_default()
            .entry(params_str(&r.params))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for (label, settings) in groups {
        let mut points: Vec<(f64, f64)> = settings
            .values()
            .map(|rs| {
                let recall = rs.iter().map(|r| r.recall).sum::<f64>() / rs.len() as f64;
                let x = match axis {
                    Axis::Scanned => {
                        rs.iter().filter_map(|r| r.scanned).sum::<f64>() / rs.len() as f64
                    }
                    Axis::Qps => {
                        let mut q: Vec<f64> = rs.iter().map(|r| r.qps).collect();
                        median(&mut q)
                    }
                };
                (x, recall)
            })
            .filter(|p| p.0 > 0.0 && p.0.is_finite())
            .collect();
        points.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.total_cmp(&b.0)));
        if !points.is_empty() {
            out.push(Series { label, points });
        }
    }
    out
}

/// Recall of one head's curve at `budget` scanned: the best recall among settings within the
/// budget, or the value interpolated (linearly in log scanned) towards the next setting above it.
/// `None` when every setting scans more than the budget.
pub(super) fn recall_at_budget<'a>(
    rows: impl Iterator<Item = &'a &'a Row>,
    budget: f64,
) -> Option<f64> {
    let mut pts: Vec<(f64, f64)> = rows
        .filter_map(|r| Some((r.scanned.filter(|s| *s > 0.0)?, r.recall)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let within = pts.iter().rposition(|p| p.0 <= budget)?;
    let best = pts[..=within].iter().map(|p| p.1).fold(0.0, f64::max);
    let Some(&(s1, r1)) = pts.get(within + 1) else {
        return Some(best);
    };
    let (s0, r0) = pts[within];
    let t = (budget.ln() - s0.ln()) / (s1.ln() - s0.ln());
    Some(best.max(r0 + t * (r1 - r0)))
}

type HeadKey = (String, usize, usize);

fn by_head<'a>(rows: &[&'a Row], queries: &str) -> BTreeMap<HeadKey, Vec<&'a Row>> {
    let mut m: BTreeMap<HeadKey, Vec<&Row>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.queries == queries && r.index != "flat")
    {
        m.entry((series_label(r), r.layer, r.head))
            .or_default()
            .push(r);
    }
    m
}

/// Layers (sorted) and, per series, (layer position, mean over the layer's heads of the recall
/// at `budget`); a layer is left out of a series when one of its heads scans more than the
/// budget at every setting.
pub(super) fn per_layer(rows: &[&Row], budget: f64) -> (Vec<usize>, Vec<Series>) {
    let heads = by_head(rows, "q2k");
    let mut layers: Vec<usize> = heads.keys().map(|k| k.1).collect();
    layers.sort_unstable();
    layers.dedup();
    let mut acc: BTreeMap<String, BTreeMap<usize, Vec<Option<f64>>>> = BTreeMap::new();
    for ((label, layer, _), rs) in &heads {
        let r = recall_at_budget(rs.iter(), budget);
        acc.entry(label.clone())
            .or_default()
            .entry(*layer)
            .or_default()
            .push(r);
    }
    let series = acc
        .into_iter()
        .map(|(label, per)| Series {
            label,
            points: per
                .into_iter()
                .filter_map(|(layer, v)| {
                    let pos = layers.iter().position(|&l| l == layer)?;
                    let v: Option<Vec<f64>> = v.into_iter().collect();
                    let v = v?;
                    Some((pos as f64, v.iter().sum::<f64>() / v.len() as f64))
                })
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    (layers, series)
}

/// Per series: mean over heads of the recall at `budget`, on q2k and on k2k (absent when a
/// head scans more than the budget at every setting).
pub(super) fn gap(rows: &[&Row], budget: f64) -> Vec<(String, Option<f64>, Option<f64>)> {
    let mean_at = |queries: &str| -> BTreeMap<String, f64> {
        let mut acc: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
        for ((label, _, _), rs) in by_head(rows, queries) {
            acc.entry(label)
                .or_default()
                .push(recall_at_budget(rs.iter(), budget));
        }
        acc.into_iter()
            .filter_map(|(l, v)| {
                let v: Vec<f64> = v.into_iter().collect::<Option<_>>()?;
                Some((l, v.iter().sum::<f64>() / v.len() as f64))
            })
            .collect()
    };
    let (q, k) = (mean_at("q2k"), mean_at("k2k"));
    let mut labels: Vec<&String> = q.keys().chain(k.keys()).collect();
    labels.sort();
    labels.dedup();
    labels
        .into_iter()
        .map(|l| (l.clone(), q.get(l).copied(), k.get(l).copied()))
        .collect()
}
