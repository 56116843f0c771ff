//! A report as a PNG chart ([`plot_png`]), in the embedded font: log-log, size across and the
//! median up, one line per method (reference values as crosses); or, where every figure is of
//! one size (a lone record's round trip beside eight loads), one bar per method with its p10–p90
//! whisker.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use super::format::{fmt_size, trim_zeros};
use super::model::{Figure, Report, Unit};
use crate::bench::error::{BenchError, BenchResult};

/// The embedded chart font (the GPU machine has no system fonts). DejaVu Sans, see
/// `assets/DejaVuSans.LICENSE`.
static FONT: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/DejaVuSans.ttf"
));

/// The font family name charts use (registered with plotters on first use).
const FAMILY: &str = "sans-serif";

impl Unit {
    fn axis_label(self) -> &'static str {
        match self {
            Unit::Nanoseconds => "time (median)",
            Unit::GigabytesPerSecond => "bandwidth, GB/s (median)",
            Unit::Bytes => "memory held (median)",
        }
    }
}

fn font_ready() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok())
}

/// Line colours (Tableau 10), cycled.
const COLORS: [RGBColor; 10] = [
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
];

/// Draws `report` as a log-log PNG chart at `path`: x = size, y = median, one line per method
/// (reference values as crosses); where every row is of one size, as bars (one per method, its
/// median, a whisker from p10 to p90). Rows with size 0 or a non-positive value are left out;
/// returns `false` (and writes nothing) when no row remains.
pub fn plot_png(report: &Report, path: &Path) -> BenchResult<bool> {
    let pts: Vec<&Figure> = report
        .figures
        .iter()
        .filter(|r| r.size > 0 && r.median > 0.0 && r.median.is_finite())
        .collect();
    if pts.is_empty() {
        return Ok(false);
    }
    if !font_ready() {
        return Err(BenchError::Plot {
            path: path.to_path_buf(),
            msg: "the embedded font could not be loaded".into(),
        });
    }
    let one_size = pts.iter().all(|r| r.size == pts[0].size);
    let drawn = if one_size && pts.len() > 1 {
        draw_bars(report, &pts, path)
    } else {
        draw(report, &pts, path)
    };
    drawn.map(|()| true).map_err(|msg| BenchError::Plot {
        path: path.to_path_buf(),
        msg,
    })
}

fn draw(report: &Report, pts: &[&Figure], path: &Path) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let fold = |f: fn(f64, f64) -> f64, init: f64, g: fn(&Figure) -> f64| {
        pts.iter().map(|r| g(r)).fold(init, f)
    };
    let (x0, x1) = (
        fold(f64::min, f64::INFINITY, |r| r.size as f64),
        fold(f64::max, 0.0, |r| r.size as f64),
    );
    let (y0, y1) = (
        fold(f64::min, f64::INFINITY, |r| r.median),
        fold(f64::max, 0.0, |r| r.median),
    );

    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let (y0, y1) = (y0 / 1.6, y1 * 1.6);
    let (x_bold, x_grid) = size_ticks(x0, x1, 12);
    let (y_bold, y_grid) = value_ticks(y0, y1, 14);
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&report.title, (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (x0..x1)
                .log_scale()
                .with_key_points(x_bold)
                .with_light_points(x_grid),
            (y0..y1)
                .log_scale()
                .with_key_points(y_bold)
                .with_light_points(y_grid),
        )
        .map_err(|x| e(&x))?;
    let unit = report.unit;
    chart
        .configure_mesh()
        .x_desc("size (bytes per operation)")
        .y_desc(unit.axis_label())
        .x_label_formatter(&|v| fmt_size(v.round() as u64))
        .y_label_formatter(&|v| trim_zeros(&unit.format(*v)))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(|x| e(&x))?;

    let mut drawn = 0;
    for method in report.methods() {
        let mut series: Vec<&Figure> = pts.iter().copied().filter(|r| r.method == method).collect();
        if series.is_empty() {
            continue;
        }
        let color = COLORS[drawn % COLORS.len()];
        drawn += 1;
        series.sort_by_key(|r| r.size);
        let xy: Vec<(f64, f64)> = series.iter().map(|r| (r.size as f64, r.median)).collect();
        let style = color.stroke_width(2);
        if series.iter().all(|r| r.is_reference()) {
            chart
                .draw_series(xy.iter().map(|p| Cross::new(*p, 8, style)))
                .map_err(|x| e(&x))?
                .label(method)
                .legend(move |(x, y)| Cross::new((x + 10, y), 5, style));
        } else {
            chart
                .draw_series(LineSeries::new(xy.clone(), style))
                .map_err(|x| e(&x))?
                .label(method)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart
                .draw_series(xy.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|x| e(&x))?;
        }
    }
    chart
        .configure_series_labels()
        // Bandwidth curves rise to a plateau (lower right is free); latency curves rise to the
        // right (upper left is free).
        .position(match unit {
            Unit::GigabytesPerSecond => SeriesLabelPosition::LowerRight,
            Unit::Nanoseconds | Unit::Bytes => SeriesLabelPosition::UpperLeft,
        })
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Pixels of a bar chart's row, and of a character of its labels (the font at 15 px, generously).
pub(super) const BAR_ROW: u32 = 30;
const LABEL_CHAR: u32 = 8;

/// Values further apart than this (largest over smallest) are drawn on a log axis.
const BAR_LOG_SPAN: f64 = 100.0;
/// One bar per figure of one size, top to bottom in the report's order: the median, a whisker
/// from p10 to p90 (measured figures), the median's value beside it. The axis is linear from 0,
/// or logarithmic where the values span more than [`BAR_LOG_SPAN`] (a call that waits 2 s beside
/// calls of a few µs).
fn draw_bars(report: &Report, pts: &[&Figure], path: &Path) -> Result<(), String> {
    let lo = pts.iter().map(|r| r.median).fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|r| right_end(r)).fold(0.0, f64::max);
    if hi / lo > BAR_LOG_SPAN {
        let (a, b) = (lo / 2.0, hi * 3.0);
        let (bold, grid) = value_ticks(a, b, 10);
        let axis = (a..b)
            .log_scale()
            .with_key_points(bold)
            .with_light_points(grid);
        bars_on(report, pts, path, axis, a, ", log scale")
    } else {
        bars_on(report, pts, path, 0.0..hi * 1.25, 0.0, "")
    }
}

/// A figure's right end in a bar chart: its p90 where it has one.
fn right_end(r: &Figure) -> f64 {
    if r.p90.is_finite() {
        r.p90.max(r.median)
    } else {
        r.median
    }
}

/// [`draw_bars`] on the value axis `axis`, whose bars start at `x0`.
fn bars_on<X>(
    report: &Report,
    pts: &[&Figure],
    path: &Path,
    axis: X,
    x0: f64,
    scale: &str,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let unit = report.unit;
    let n = pts.len() as u32;
    let widest = pts
        .iter()
        .map(|r| r.method.chars().count())
        .max()
        .unwrap_or(0) as u32;
    let label_area = (widest * LABEL_CHAR + 20).clamp(120, 900);
    let (width, height) = (label_area + 700, 130 + n * BAR_ROW);
    let size = fmt_size(pts[0].size);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&report.title, (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(label_area)
        .build_cartesian_2d(axis, (0..n as i32 - 1).into_segmented())
        .map_err(|x| e(&x))?;
    // Row k of the report is drawn at the top: segment n-1-k.
    let at = |k: usize| n as i32 - 1 - k as i32;
    let names: Vec<&str> = pts.iter().map(|r| r.method.as_str()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(format!(
            "{} at {size}, whiskers p10 to p90{scale}",
            unit.axis_label()
        ))
        .x_label_formatter(&|v| trim_zeros(&unit.format(*v)))
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names
                .get((n as i32 - 1 - i) as usize)
                .map_or(String::new(), |s| s.to_string()),
            _ => String::new(),
        })
        .y_labels(n as usize)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(|x| e(&x))?;
    for (k, r) in pts.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let (bottom, top) = (SegmentValue::Exact(at(k)), SegmentValue::Exact(at(k) + 1));
        let mut bar = Rectangle::new(
            [(x0, bottom), (r.median, top)],
            if r.is_reference() {
                color.mix(0.35).filled()
            } else {
                color.filled()
            },
        );
        bar.set_margin(5, 5, 0, 0);
        chart.draw_series([bar]).map_err(|x| e(&x))?;
        let mid = SegmentValue::CenterOf(at(k));
        if !r.is_reference() && r.p10.is_finite() && r.p90.is_finite() {
            chart
                .draw_series([PathElement::new(
                    vec![(r.p10.max(x0), mid.clone()), (r.p90, mid.clone())],
                    BLACK.stroke_width(2),
                )])
                .map_err(|x| e(&x))?;
        }
        chart
            .draw_series([Text::new(
                format!("  {}", trim_zeros(&unit.format(r.median))),
                (right_end(r), mid),
                TextStyle::from((FAMILY, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
            )])
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Tick marks of a log size axis over `[lo, hi]`: `(labelled, grid)` powers of two. Labelled
/// ticks are thinned to every 2nd, 4th, … exponent (even exponents, so labels read 4 KiB,
/// 16 KiB, …) until at most `max` remain; the grid has every power of two.
pub fn size_ticks(lo: f64, hi: f64, max: usize) -> (Vec<f64>, Vec<f64>) {
    let e0 = lo.max(1.0).log2().ceil() as i32;
    let e1 = hi.max(1.0).log2().floor() as i32;
    let grid: Vec<i32> = (e0..=e1).collect();
    let mut step = 1;
    while grid.len().div_ceil(step) > max.max(1) {
        step *= 2;
    }
    let bold = grid
        .iter()
        .filter(|e| e.rem_euclid(step as i32) == 0)
        .map(|&e| 2f64.powi(e))
        .collect();
    (bold, grid.iter().map(|&e| 2f64.powi(e)).collect())
}

/// Tick marks of a log value axis over `[lo, hi]`: `(labelled, grid)`. Labelled ticks are
/// 1-2-5 × 10ᵏ, or only 10ᵏ when that would be more than `max`; the grid has 1…9 × 10ᵏ.
pub fn value_ticks(lo: f64, hi: f64, max: usize) -> (Vec<f64>, Vec<f64>) {
    let (lo, hi) = (lo.max(f64::MIN_POSITIVE), hi.max(f64::MIN_POSITIVE));
    let d0 = lo.log10().floor() as i32;
    let d1 = hi.log10().ceil() as i32;
    let in_range = |v: &f64| *v >= lo * (1.0 - 1e-9) && *v <= hi * (1.0 + 1e-9);
    let series = |mults: &[f64]| -> Vec<f64> {
        (d0..=d1)
            .flat_map(|d| mults.iter().map(move |m| m * 10f64.powi(d)))
            .filter(in_range)
            .collect()
    };
    let mut bold = series(&[1.0, 2.0, 5.0]);
    if bold.len() > max {
        bold = series(&[1.0]);
    }
    let grid = series(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    (bold, grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_ticks_are_powers_of_two_thinned_to_the_label_budget() {
        let (bold, grid) = size_ticks(3000.0, 1.6e9, 12);
        assert_eq!(grid.first(), Some(&4096.0));
        assert_eq!(grid.last(), Some(&((1u64 << 30) as f64)));
        assert_eq!(grid.len(), 19);
        // 19 powers of two, at most 12 labels: every 2nd, on even exponents.
        assert_eq!(bold.len(), 10);
        assert_eq!(bold[0], 4096.0);
        assert_eq!(bold[1], 16384.0);
        let (bold, grid) = size_ticks(5.0, 70.0, 12);
        assert_eq!(grid, vec![8.0, 16.0, 32.0, 64.0]);
        assert_eq!(bold, grid);
    }

    #[test]
    fn value_ticks_use_1_2_5_or_decades() {
        let (bold, grid) = value_ticks(0.3, 40.0, 14);
        assert_eq!(bold, vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
        assert!(grid.iter().all(|g| (0.3 * 0.999..=40.0).contains(g)));
        assert_eq!(grid.len(), 7 + 9 + 4); // 0.3…0.9, 1…9, 10…40
                                           // Seven decades: 1-2-5 would be 21 labels, so only powers of ten.
        let (bold, _) = value_ticks(30.0, 3e8, 14);
        assert_eq!(bold, vec![100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8]);
    }
}
