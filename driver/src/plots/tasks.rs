//! The plot of `qkindex tasks`: per prompt length, the score averaged over the tasks against
//! the keys scored per selection (log x), one line per retrieving policy through its budgets,
//! the policies without a budget (`full`, `static`) as horizontal reference lines.

use super::style::{frame, legend, mesh, short_number};
use super::{register_font, write_figure, DrawResult, Figure, COLORS, PANEL};
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One length's curves: (policy, points (keys scored, score)) and (run, score) references.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskPanel {
    pub length: usize,
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
    pub refs: Vec<(String, f64)>,
}

/// Writes `dir/tasks.png` and `dir/tasks.svg`; returns the files written.
pub fn write_tasks(panels: &[TaskPanel], dir: &Path) -> Result<Vec<PathBuf>> {
    register_font()?;
    let mut written = Vec::new();
    write_figure(dir, "tasks", &Tasks { panels }, &mut written)?;
    Ok(written)
}

struct Tasks<'a> {
    panels: &'a [TaskPanel],
}

impl Figure for Tasks<'_> {
    fn size(&self) -> (u32, u32) {
        (PANEL.0 * self.panels.len().max(1) as u32, PANEL.1)
    }

    fn is_empty(&self) -> bool {
        self.panels.is_empty()
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let areas = root.split_evenly((1, self.panels.len().max(1)));
        for (panel, area) in self.panels.iter().zip(areas) {
            draw_panel(&area, panel)?;
        }
        Ok(())
    }
}

fn draw_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &TaskPanel) -> DrawResult<DB> {
    let (lo, hi) = p
        .lines
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|q| q.0))
        .filter(|x| *x > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(l, h), x| (l.min(x), h.max(x)));
    let (x_lo, x_hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 2.0, hi * 2.0)
    } else {
        (1.0, 10.0)
    };
    let title = format!("score over tasks, {} tokens", p.length);
    let mut chart =
        frame(area, &title, 20, 44, 60).build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..105.0)?;
    mesh(&mut chart)
        .x_desc("keys scored per selection")
        .y_desc("score (string match, %)")
        .x_label_formatter(&|x| short_number(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        // On a log axis plotters packs light lines below each decade into a grey band.
        .x_max_light_lines(1)
        .draw()?;
    for (i, (label, y)) in p.refs.iter().enumerate() {
        let c = COLORS[10 + i % 6];
        chart
            .draw_series(LineSeries::new(
                [(x_lo, *y), (x_hi, *y)],
                c.mix(0.8).stroke_width(2),
            ))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    for (i, (label, pts)) in p.lines.iter().enumerate() {
        let c = COLORS[i % 10];
        let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|q| q.0 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
        chart.draw_series(pts.iter().map(|&q| Circle::new(q, 4, c.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}
