//! Plots of benchmark reports (PNG and SVG, drawn with `plotters`).
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the shared frame: output folder, bundled font, panel size, colours, [`Figure`] written as PNG + SVG |
//! | `style.rs` | the house look: chart frame, mesh, legend, lines with markers, axis label text |
//! | `aggregate.rs` | bench rows → curves: per search setting, per layer at a budget, Q→K vs K→K |
//! | `bench.rs` | the four plots of a bench report (`qkindex bench`, `qkindex report`) |
//! | `scaling.rs` | the log-log plots of `qkindex scaling` |
//! | `tasks.rs` | the score-against-cost plot of `qkindex tasks` |
//! | `tests.rs` | unit tests |
//!
//! ```text
//!  BenchReport rows ──► aggregate (Series) ──► bench::Chart ─┐
//!  scaling::Point ───────────────────────► scaling::LogLog ─┴► Figure ──► plots/{stem}.png, .svg
//! ```
//!
//! The plots of a bench report, per K:
//! - `recall_vs_scanned_k{K}`: recall@K against the fraction of keys scanned (log x), Q→K and
//!   K→K side by side — the gap between the panels is the out-of-distribution penalty;
//! - `recall_vs_qps_k{K}`: recall@K against single-thread queries per second (log x);
//! - `per_layer_k{K}`: per model layer, recall@K (Q→K) at a fixed scanned budget;
//! - `gap_k{K}`: per index, recall@K at the same budget for Q→K and for K→K.
//!
//! Every point of a curve is one search setting (`ef`, `nprobe`) averaged over the heads that
//! were measured at it: mean recall, mean scanned, median QPS. Text is drawn with the bundled
//! DejaVu Sans (`assets/`), so the PNGs look the same on every machine.

mod aggregate;
mod bench;
mod scaling;
mod style;
mod tasks;
#[cfg(test)]
mod tests;

pub use bench::write_all;
pub use scaling::write_scaling;
pub use tasks::{write_tasks, TaskPanel};

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
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

type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// One image: its size, whether it has anything to show, and how it draws on a white area.
trait Figure {
    fn size(&self) -> (u32, u32);
    fn is_empty(&self) -> bool;
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// Registers the bundled font and creates `dir/plots/`; returns that folder.
fn plots_dir(dir: &Path) -> Result<PathBuf> {
    register_font()?;
    let out = dir.join("plots");
    std::fs::create_dir_all(&out)?;
    Ok(out)
}

/// Writes `out/{stem}.png` and `out/{stem}.svg` and appends both to `written`; an empty figure
/// writes nothing.
fn write_figure(
    out: &Path,
    stem: &str,
    figure: &impl Figure,
    written: &mut Vec<PathBuf>,
) -> Result<()> {
    if figure.is_empty() {
        return Ok(());
    }
    let size = figure.size();
    let png = out.join(format!("{stem}.png"));
    render(BitMapBackend::new(&png, size).into_drawing_area(), figure)?;
    let svg = out.join(format!("{stem}.svg"));
    render(SVGBackend::new(&svg, size).into_drawing_area(), figure)?;
    written.push(png);
    written.push(svg);
    Ok(())
}

fn render<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, figure: &impl Figure) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing a plot: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    figure.draw_on(&root).map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
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
