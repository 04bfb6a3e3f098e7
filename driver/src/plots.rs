//! Plots of a benchmark report (PNG and SVG, drawn with `plotters`):
//!
//! - `recall_vs_scanned_k{K}`: recall@K against the fraction of keys scanned (log x), Q→K and
//!   K→K side by side — the gap between the panels is the out-of-distribution penalty;
//! - `recall_vs_qps_k{K}`: recall@K against single-thread queries per second (log x);
//! - `per_layer_k{K}`: per model layer, recall@K (Q→K) at a fixed scanned budget;
//! - `gap_k{K}`: per index, recall@K at the same budget for Q→K and for K→K.
//!
//! Every point of a curve is one search setting (`ef`, `nprobe`) averaged over the heads that
//! were measured at it: mean recall, mean scanned, median QPS. Text is drawn with the bundled
//! DejaVu Sans (`assets/`), so the PNGs look the same on every machine.

use crate::report::{params_str, BenchReport, Row};
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const PANEL: (u32, u32) = (720, 540);
/// Tableau 10 (distinct, colour-blind-friendly), then black and lighter Tableau shades, so that up
/// to 16 series get distinct colours.
const COLORS: [RGBColor; 16] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
];

/// One curve: a labelled list of (x, recall) points.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// Writes every plot of `report` into `dir/plots/` as PNG and SVG; returns the files written.
pub fn write_all(report: &BenchReport, dir: &Path, budget: f64) -> Result<Vec<PathBuf>> {
    register_font()?;
    let out = dir.join("plots");
    std::fs::create_dir_all(&out)?;
    let mut written = Vec::new();
    let mut ks: Vec<usize> = report.rows.iter().map(|r| r.k).collect();
    ks.sort_unstable();
    ks.dedup();
    for k in ks {
        let rows: Vec<&Row> = report.rows.iter().filter(|r| r.k == k).collect();
        let sets = query_sets(&rows);
        let scanned: Vec<(String, Vec<Series>)> = sets
            .iter()
            .map(|q| (q.clone(), curves(&rows, q, Axis::Scanned)))
            .collect();
        let qps: Vec<(String, Vec<Series>)> = sets
            .iter()
            .map(|q| (q.clone(), curves(&rows, q, Axis::Qps)))
            .collect();
        let layer = per_layer(&rows, budget);
        let gap = gap(&rows, budget);
        let charts: [(String, Chart); 4] = [
            (
                format!("recall_vs_scanned_k{k}"),
                Chart::Curves {
                    panels: scanned,
                    x: "fraction of keys scanned",
                    k,
                },
            ),
            (
                format!("recall_vs_qps_k{k}"),
                Chart::Curves {
                    panels: qps,
                    x: "queries per second (one thread)",
                    k,
                },
            ),
            (
                format!("per_layer_k{k}"),
                Chart::Layers {
                    layers: layer.0,
                    series: layer.1,
                    budget,
                    k,
                },
            ),
            (
                format!("gap_k{k}"),
                Chart::Gap {
                    bars: gap,
                    budget,
                    k,
                },
            ),
        ];
        for (stem, chart) in &charts {
            if chart.is_empty() {
                continue;
            }
            let size = chart.size();
            let png = out.join(format!("{stem}.png"));
            draw(BitMapBackend::new(&png, size).into_drawing_area(), chart)?;
            let svg = out.join(format!("{stem}.svg"));
            draw(SVGBackend::new(&svg, size).into_drawing_area(), chart)?;
            written.push(png);
            written.push(svg);
        }
    }
    Ok(written)
}

fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the bundled plot font could not be loaded"))
    }
}

enum Chart {
    Curves {
        panels: Vec<(String, Vec<Series>)>,
        x: &'static str,
        k: usize,
    },
    Layers {
        layers: Vec<usize>,
        series: Vec<Series>,
        budget: f64,
        k: usize,
    },
    Gap {
        bars: Vec<(String, Option<f64>, Option<f64>)>,
        budget: f64,
        k: usize,
    },
}

impl Chart {
    fn is_empty(&self) -> bool {
        match self {
            Chart::Curves { panels, .. } => panels.iter().all(|(_, s)| s.is_empty()),
            Chart::Layers { series, .. } => series.is_empty(),
            Chart::Gap { bars, .. } => bars.is_empty(),
        }
    }

    fn size(&self) -> (u32, u32) {
        match self {
            Chart::Curves { panels, .. } => (PANEL.0 * panels.len().max(1) as u32, PANEL.1),
            _ => PANEL,
        }
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, chart: &Chart) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing a plot: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    match chart {
        Chart::Curves { panels, x, k } => {
            let areas = root.split_evenly((1, panels.len().max(1)));
            let log_x = true;
            for ((name, series), area) in panels.iter().zip(areas) {
                let title = format!("{} — recall@{k}", query_title(name));
                draw_curves(&area, &title, x, series, log_x).map_err(err)?;
            }
        }
        Chart::Layers {
            layers,
            series,
            budget,
            k,
        } => {
            let title = format!(
                "Q→K recall@{k} per layer at ≤ {:.0}% scanned",
                budget * 100.0
            );
            draw_layers(&root, &title, layers, series).map_err(err)?;
        }
        Chart::Gap { bars, budget, k } => {
            let title = format!("recall@{k} at ≤ {:.0}% scanned: Q→K vs K→K", budget * 100.0);
            draw_gap(&root, &title, bars).map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw_curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    series: &[Series],
    _log_x: bool,
) -> DrawResult<DB> {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (mut lo, mut hi) = xs.fold((f64::INFINITY, 0.0f64), |(l, h), x| (l.min(x), h.max(x)));
    if !lo.is_finite() || lo <= 0.0 {
        lo = 1e-3;
    }
    if hi <= lo {
        hi = lo * 10.0;
    }
    let (lo, hi) = (lo / 1.25, hi * 1.25);
    let y_lo = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::min);
    let y_lo = ((y_lo - 0.02).max(0.0) * 20.0).floor() / 20.0;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), y_lo..1.005f64)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("recall")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_label_formatter(&|x| short_number(*x))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    draw_lines(&mut chart, series, 3, SeriesLabelPosition::LowerRight)
}

fn draw_layers<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    layers: &[usize],
    series: &[Series],
) -> DrawResult<DB> {
    let n = layers.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..1.005f64)?;
    let labels = layers.to_vec();
    chart
        .configure_mesh()
        .x_desc("model layer")
        .y_desc("recall")
        .x_labels(layers.len().max(1))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels
                    .get(i as usize)
                    .map_or(String::new(), |l| l.to_string())
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    draw_lines(&mut chart, series, 4, SeriesLabelPosition::LowerLeft)
}

fn draw_gap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    bars: &[(String, Option<f64>, Option<f64>)],
) -> DrawResult<DB> {
    let n = bars.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(90)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..1.05f64)?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .y_desc("recall")
        .x_labels(bars.len().max(1))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .disable_x_mesh()
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let sides = [
        ("Q→K", COLORS[0], -0.38, -0.02),
        ("K→K", COLORS[1], 0.02, 0.38),
    ];
    for (side, (name, color, x0, x1)) in sides.into_iter().enumerate() {
        let rects = bars.iter().enumerate().filter_map(|(i, b)| {
            let v = if side == 0 { b.1 } else { b.2 }?;
            let x = i as f64;
            Some(Rectangle::new([(x + x0, 0.0), (x + x1, v)], color.filled()))
        });
        chart
            .draw_series(rects)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()?;
    Ok(())
}

/// Scaling plots: per head dimension, QPS over the exact scan and fraction scanned at the
/// recall target, against the number of keys (log-log), one curve per index.
pub fn write_scaling(
    points: &[crate::cmd::scaling::Point],
    dir: &Path,
    target: f64,
    k: usize,
) -> Result<Vec<PathBuf>> {
    register_font()?;
    let out = dir.join("plots");
    std::fs::create_dir_all(&out)?;
    let mut dims: Vec<usize> = points.iter().map(|p| p.d).collect();
    dims.sort_unstable();
    dims.dedup();
    let mut written = Vec::new();
    type Metric = fn(&crate::cmd::scaling::Point) -> Option<f64>;
    let metrics: [(&str, &str, Metric); 2] = [
        ("qps_over_flat", "QPS / exact scan", |p| p.qps_over_flat),
        ("scanned", "fraction of keys scanned", |p| p.min_scanned),
    ];
    for (stem, y_label, get) in metrics {
        let panels: Vec<(String, Vec<Series>)> = dims
            .iter()
            .map(|&d| {
                let mut by: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
                for p in points.iter().filter(|p| p.d == d) {
                    if let Some(y) = get(p) {
                        by.entry(p.index.as_str())
                            .or_default()
                            .push((p.n as f64, y));
                    }
                }
                let series = by
                    .into_iter()
                    .map(|(label, mut pts)| {
                        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                        Series {
                            label: label.to_string(),
                            points: pts,
                        }
                    })
                    .collect();
                (format!("d = {d}"), series)
            })
            .collect();
        if panels.iter().all(|(_, s)| s.is_empty()) {
            continue;
        }
        let size = (PANEL.0 * panels.len() as u32, PANEL.1);
        let title = format!("{y_label} at recall@{k} ≥ {target}");
        let png = out.join(format!("scaling_{stem}.png"));
        draw_loglog(
            BitMapBackend::new(&png, size).into_drawing_area(),
            &panels,
            &title,
            y_label,
        )?;
        let svg = out.join(format!("scaling_{stem}.svg"));
        draw_loglog(
            SVGBackend::new(&svg, size).into_drawing_area(),
            &panels,
            &title,
            y_label,
        )?;
        written.push(png);
        written.push(svg);
    }
    Ok(written)
}

fn draw_loglog<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    panels: &[(String, Vec<Series>)],
    title: &str,
    y_label: &str,
) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing a plot: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for ((name, series), area) in panels.iter().zip(areas) {
        draw_loglog_panel(&area, &format!("{title}, {name}"), y_label, series).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn draw_loglog_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    series: &[Series],
) -> DrawResult<DB> {
    let bounds = |f: fn(&(f64, f64)) -> f64| {
        series
            .iter()
            .flat_map(|s| s.points.iter().map(f))
            .filter(|v| *v > 0.0)
            .fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)))
    };
    let fix = |(lo, hi): (f64, f64)| {
        if !lo.is_finite() || hi <= 0.0 {
            (0.1, 10.0)
        } else {
            (lo / 1.5, hi * 1.5)
        }
    };
    let (x_lo, x_hi) = fix(bounds(|p| p.0));
    let (y_lo, y_hi) = fix(bounds(|p| p.1));
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("keys (n)")
        .y_desc(y_label)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_label_formatter(&|x| short_number(*x))
        .y_label_formatter(&|y| short_number(*y))
        .light_line_style(RGBColor(235, 235, 235))
        // On a log axis plotters packs light lines below each decade into a grey band.
        .y_max_light_lines(1)
        .draw()?;
    draw_lines(&mut chart, series, 4, SeriesLabelPosition::UpperLeft)
}

/// Draws each series as a coloured line with point markers, and the legend.
fn draw_lines<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, DB, CT>,
    series: &[Series],
    radius: i32,
    legend: SeriesLabelPosition,
) -> DrawResult<DB> {
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
            });
        chart.draw_series(
            s.points
                .iter()
                .map(|&p| Circle::new(p, radius, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()?;
    Ok(())
}

fn query_title(name: &str) -> &str {
    match name {
        "q2k" => "Q→K (decode queries)",
        "k2k" => "K→K (keys as queries)",
        other => other,
    }
}

/// 0.05 → "0.05", 12000 → "12k".
fn short_number(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.3}M", x / 1e6)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .replace(".M", "M")
    } else if x >= 1e3 {
        format!("{}k", trim(x / 1e3))
    } else {
        trim(x)
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// The label of a row's curve: `index[/variant]`, with the implementation when not ours.
pub fn series_label(r: &Row) -> String {
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

fn query_sets(rows: &[&Row]) -> Vec<String> {
    let mut sets: Vec<String> = rows.iter().map(|r| r.queries.clone()).collect();
    sets.sort_by_key(|q| (q != "q2k", q.clone()));
    sets.dedup();
    sets
}

#[derive(Clone, Copy, PartialEq)]
enum Axis {
    Scanned,
    Qps,
}

/// Per series (sorted by label), one point per search setting: (mean scanned or median QPS,
/// mean recall) over the heads measured at that setting. Flat scans are one point.
fn curves(rows: &[&Row], queries: &str, axis: Axis) -> Vec<Series> {
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
                        crate::report::median(&mut q)
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
fn recall_at_budget<'a>(rows: impl Iterator<Item = &'a &'a Row>, budget: f64) -> Option<f64> {
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
fn per_layer(rows: &[&Row], budget: f64) -> (Vec<usize>, Vec<Series>) {
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
fn gap(rows: &[&Row], budget: f64) -> Vec<(String, Option<f64>, Option<f64>)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Latency;

    fn row(index: &str, queries: &str, layer: usize, ef: usize, recall: f64, scanned: f64) -> Row {
        Row {
            index: index.into(),
            variant: String::new(),
            implementation: "qkindex".into(),
            k: 100,
            layer,
            head: 0,
            queries: queries.into(),
            params: serde_json::json!({ "ef": ef }),
            recall,
            scanned: Some(scanned),
            distance_computations: Some(scanned * 1000.0),
            qps: 1000.0 / scanned,
            latency_us: Latency::default(),
            build_s: serde_json::Value::Null,
            bytes_per_key: None,
            mass_ratio: None,
            output_cosine: None,
        }
    }

    #[test]
    fn curves_average_heads_per_setting_and_budget_picks_the_best_recall() {
        let a = row("attention", "q2k", 2, 100, 0.9, 0.05);
        let mut b = row("attention", "q2k", 2, 100, 0.8, 0.07);
        b.head = 1;
        let c = row("attention", "q2k", 9, 200, 0.99, 0.2);
        let rows = vec![&a, &b, &c];
        let s = curves(&rows, "q2k", Axis::Scanned);
        assert_eq!(s.len(), 1);
        let p = s[0].points[0];
        assert!((p.0 - 0.06).abs() < 1e-12 && (p.1 - 0.85).abs() < 1e-12);
        let (layers, series) = per_layer(&rows, 0.1);
        assert_eq!(layers, vec![2, 9]);
        // Layer 9's only head cannot stay within 10 %: no point.
        let want = [(0.0, 0.85)];
        assert_eq!(series[0].points.len(), 1);
        for (got, want) in series[0].points.iter().zip(want) {
            assert!((got.0 - want.0).abs() < 1e-12 && (got.1 - want.1).abs() < 1e-12);
        }
    }

    #[test]
    fn recall_at_budget_interpolates_in_log_scanned() {
        let a = row("hnsw", "q2k", 2, 100, 0.8, 0.05);
        let b = row("hnsw", "q2k", 2, 200, 0.9, 0.2);
        let rows = [&a, &b];
        assert_eq!(recall_at_budget(rows.iter(), 0.01), None);
        let mid = recall_at_budget(rows.iter(), 0.1).expect("within");
        assert!((mid - 0.85).abs() < 1e-12, "{mid}");
        assert_eq!(recall_at_budget(rows.iter(), 0.5), Some(0.9));
    }

    #[test]
    fn plots_are_written_as_png_and_svg() {
        let rows: Vec<Row> = [("q2k", 0.8), ("k2k", 0.95)]
            .iter()
            .flat_map(|&(q, r)| {
                [100, 200].map(|ef| {
                    row(
                        "attention",
                        q,
                        9,
                        ef,
                        r * ef as f64 / 200.0,
                        ef as f64 / 2000.0,
                    )
                })
            })
            .collect();
        let report = BenchReport::new(Path::new("dump"), 100, "wall", rows, 1.0);
        let dir = std::env::temp_dir().join(format!("qkindex-plots-{}", std::process::id()));
        let files = write_all(&report, &dir, 0.1).expect("plots");
        assert_eq!(files.len(), 8);
        for f in &files {
            let len = std::fs::metadata(f).expect("plot file").len();
            assert!(len > 1000, "{} is {len} bytes", f.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
