//! The plots of `qkindex scaling`: per head dimension, QPS over the exact scan and fraction
//! scanned at the recall target, against the number of keys (log-log), one curve per index.

use super::style::{draw_lines, frame, mesh, short_number};
use super::{plots_dir, write_figure, DrawResult, Figure, Series, PANEL};
use crate::cmd::scaling::Point;
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Writes `dir/plots/scaling_{qps_over_flat,scanned}.{png,svg}`; returns the files written.
pub fn write_scaling(points: &[Point], dir: &Path, target: f64, k: usize) -> Result<Vec<PathBuf>> {
    let out = plots_dir(dir)?;
    let mut dims: Vec<usize> = points.iter().map(|p| p.d).collect();
    dims.sort_unstable();
    dims.dedup();
    let mut written = Vec::new();
    type Metric = fn(&Point) -> Option<f64>;
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
        let figure = LogLog {
            panels,
            title: format!("{y_label} at recall@{k} ≥ {target}"),
            y_label,
        };
        write_figure(&out, &format!("scaling_{stem}"), &figure, &mut written)?;
    }
    Ok(written)
}

/// Log-log panels side by side, one per head dimension.
struct LogLog<'a> {
    panels: Vec<(String, Vec<Series>)>,
    title: String,
    y_label: &'a str,
}

impl Figure for LogLog<'_> {
    fn size(&self) -> (u32, u32) {
        (PANEL.0 * self.panels.len() as u32, PANEL.1)
    }

    fn is_empty(&self) -> bool {
        self.panels.iter().all(|(_, s)| s.is_empty())
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let areas = root.split_evenly((1, self.panels.len().max(1)));
        for ((name, series), area) in self.panels.iter().zip(areas) {
            let title = format!("{}, {name}", self.title);
            draw_panel(&area, &title, self.y_label, series)?;
        }
        Ok(())
    }
}

fn draw_panel<DB: DrawingBackend>(
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
    let mut chart = frame(area, title, 20, 44, 60)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
    mesh(&mut chart)
        .x_desc("keys (n)")
        .y_desc(y_label)
        .x_label_formatter(&|x| short_number(*x))
        .y_label_formatter(&|y| short_number(*y))
        // On a log axis plotters packs light lines below each decade into a grey band.
        .y_max_light_lines(1)
        .draw()?;
    draw_lines(&mut chart, series, 4, SeriesLabelPosition::UpperLeft)
}
