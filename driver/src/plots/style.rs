//! The house look shared by every plot: chart frame, mesh, legend, lines with point markers and
//! the text of axis labels.

use super::{DrawResult, Series, COLORS};
use plotters::chart::MeshStyle;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

/// A chart builder on `area` with the title in `caption` points, the margin and the label areas.
pub(super) fn frame<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title: &str,
    caption: i32,
    x_label_area: i32,
    y_label_area: i32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", caption))
        .margin(12)
        .x_label_area_size(x_label_area)
        .y_label_area_size(y_label_area);
    builder
}

/// The mesh of `chart` with the house label and grid styles; the caller adds axis names and
/// formatters and draws it.
pub(super) fn mesh<'a, 'b, DB, X, Y>(
    chart: &'b mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
) -> MeshStyle<'a, 'b, X, Y, DB>
where
    DB: DrawingBackend,
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    let mut mesh = chart.configure_mesh();
    mesh.label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 235));
    mesh
}

/// Draws the legend of `chart`'s labelled series at `position`.
pub(super) fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
}

/// Draws each series as a coloured line with point markers, and the legend.
pub(super) fn draw_lines<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, DB, CT>,
    series: &[Series],
    radius: i32,
    position: SeriesLabelPosition,
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
    legend(chart, position)
}

/// The label of category axis position `x`: `labels[x]` at whole non-negative positions, else
/// nothing.
pub(super) fn category(labels: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 {
        labels.get(i as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// 0.05 → "0.05", 12000 → "12k".
pub(super) fn short_number(x: f64) -> String {
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
