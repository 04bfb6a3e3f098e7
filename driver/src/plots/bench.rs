//! The plots of a bench report: recall against scanned and against QPS, per layer at a budget,
//! and the Q→K / K→K gap at that budget; one set per K.

use super::aggregate::{curves, gap, per_layer, query_sets, Axis};
use super::style::{category, draw_lines, frame, legend, mesh, short_number};
use super::{plots_dir, write_figure, DrawResult, Figure, Series, COLORS, PANEL};
use crate::report::{BenchReport, Row};
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Writes every plot of `report` into `dir/plots/` as PNG and SVG; returns the files written.
pub fn write_all(report: &BenchReport, dir: &Path, budget: f64) -> Result<Vec<PathBuf>> {
    let out = plots_dir(dir)?;
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
            write_figure(&out, stem, chart, &mut written)?;
        }
    }
    Ok(written)
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

impl Figure for Chart {
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

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        match self {
            Chart::Curves { panels, x, k } => {
                let areas = root.split_evenly((1, panels.len().max(1)));
                for ((name, series), area) in panels.iter().zip(areas) {
                    let title = format!("{} — recall@{k}", query_title(name));
                    draw_curves(&area, &title, x, series)?;
                }
                Ok(())
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
                draw_layers(root, &title, layers, series)
            }
            Chart::Gap { bars, budget, k } => {
                let title = format!("recall@{k} at ≤ {:.0}% scanned: Q→K vs K→K", budget * 100.0);
                draw_gap(root, &title, bars)
            }
        }
    }
}

fn draw_curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    series: &[Series],
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
    let mut chart =
        frame(area, title, 22, 44, 56).build_cartesian_2d((lo..hi).log_scale(), y_lo..1.005f64)?;
    mesh(&mut chart)
        .x_desc(x_label)
        .y_desc("recall")
        .x_label_formatter(&|x| short_number(*x))
        .y_label_formatter(&|y| format!("{y:.2}"))
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
    let mut chart =
        frame(area, title, 22, 44, 56).build_cartesian_2d(-0.5..n - 0.5, 0.0..1.005f64)?;
    let labels: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
    mesh(&mut chart)
        .x_desc("model layer")
        .y_desc("recall")
        .x_labels(layers.len().max(1))
        .x_label_formatter(&|x| category(&labels, *x))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    draw_lines(&mut chart, series, 4, SeriesLabelPosition::LowerLeft)
}

fn draw_gap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    bars: &[(String, Option<f64>, Option<f64>)],
) -> DrawResult<DB> {
    let n = bars.len().max(1) as f64;
    let mut chart =
        frame(area, title, 22, 90, 56).build_cartesian_2d(-0.5..n - 0.5, 0.0..1.05f64)?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    mesh(&mut chart)
        .y_desc("recall")
        .x_labels(bars.len().max(1))
        .x_label_formatter(&|x| category(&names, *x))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .disable_x_mesh()
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
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn query_title(name: &str) -> &str {
    match name {
        "q2k" => "Q→K (decode queries)",
        "k2k" => "K→K (keys as queries)",
        other => other,
    }
}
