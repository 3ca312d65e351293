//! The benches' plots, drawn the same way by every bench: SVG files with
//! plotters' SVG backend alone (no fonts or bitmaps; text is left to the
//! viewer). Included by each bench as `#[path = "plot.rs"] mod plot;`.
//!
//! - [`strips`]: one column per (label, tool), a dot per run, a bar at the
//!   median (hand-over latencies);
//! - [`bars`]: one bar per (label, tool, value);
//! - [`sweep`]: a measure against a swept parameter, one line per series
//!   through the medians, a whisker from min to max at each point.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

const BATON: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const CLIENTGO: RGBColor = RGBColor(0xd6, 0x27, 0x28);

/// A tool's colour: baton blue, anything else (client-go) red.
pub fn color(tool: &str) -> RGBColor {
    if tool == "baton" { BATON } else { CLIENTGO }
}

/// More colours, for series that are not a tool: the tableau palette
/// (blue and red first, as baton and client-go).
pub fn palette(i: usize) -> RGBColor {
    const P: [RGBColor; 8] = [
        BATON,
        CLIENTGO,
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x7f, 0x7f, 0x7f),
    ];
    P[i % P.len()]
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A strip chart: one column per (label, tool), a dot per run and a bar
/// at the median; `log` for a logarithmic y axis (values in seconds).
pub fn strips(
    path: &std::path::Path,
    title: &str,
    y_desc: &str,
    columns: &[(String, &str, Vec<f64>)],
    log: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let width = (150 * columns.len() as u32).max(900);
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = columns.len() as f64;
    let hi = columns
        .iter()
        .flat_map(|c| c.2.iter().copied())
        .fold(0.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root);
    chart
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(70);
    let labels: Vec<String> = columns.iter().map(|c| format!("{} {}", c.1, c.0)).collect();
    let xfmt = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    let points = |draw: &mut dyn FnMut(f64, f64, &str)| {
        for (i, (_, tool, vals)) in columns.iter().enumerate() {
            let k = vals.len().max(1) as f64;
            for (j, v) in vals.iter().enumerate() {
                draw(i as f64 - 0.2 + 0.4 * (j as f64 + 0.5) / k, *v, tool);
            }
        }
    };
    if log {
        let lo = columns
            .iter()
            .flat_map(|c| c.2.iter().copied())
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min);
        let lo = 10f64.powf(lo.log10().floor());
        let hi = 10f64.powf(hi.log10().ceil());
        let mut chart = chart.build_cartesian_2d(-0.5..n - 0.5, (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(columns.len() * 4)
            .x_label_formatter(&xfmt)
            .y_desc(y_desc)
            .y_label_formatter(&|y| format!("{y}"))
            .draw()?;
        let mut dots = Vec::new();
        points(&mut |x, y, tool| dots.push((x, y, tool.to_owned())));
        chart.draw_series(
            dots.iter()
                .map(|(x, y, t)| Circle::new((*x, *y), 4, color(t).filled())),
        )?;
        for (i, (_, tool, vals)) in columns.iter().enumerate() {
            let m = median(vals);
            let x = i as f64;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - 0.3, m), (x + 0.3, m)],
                color(tool).stroke_width(2),
            )))?;
        }
    } else {
        let hi = if hi <= 0.0 { 1.0 } else { hi * 1.1 };
        let mut chart = chart.build_cartesian_2d(-0.5..n - 0.5, 0.0..hi)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(columns.len() * 4)
            .x_label_formatter(&xfmt)
            .y_desc(y_desc)
            .draw()?;
        let mut dots = Vec::new();
        points(&mut |x, y, tool| dots.push((x, y, tool.to_owned())));
        chart.draw_series(
            dots.iter()
                .map(|(x, y, t)| Circle::new((*x, *y), 4, color(t).filled())),
        )?;
        for (i, (_, tool, vals)) in columns.iter().enumerate() {
            let m = median(vals);
            let x = i as f64;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - 0.3, m), (x + 0.3, m)],
                color(tool).stroke_width(2),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}

/// Bars: one per (label, tool, value).
pub fn bars(
    path: &std::path::Path,
    title: &str,
    y_desc: &str,
    bars: &[(String, &str, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    let width = (130 * bars.len() as u32).max(900);
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = bars.len() as f64;
    let hi = bars.iter().map(|b| b.2).fold(0.0f64, f64::max).max(1.0) * 1.15;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let xfmt = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..hi)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len() * 4)
        .x_label_formatter(&xfmt)
        .y_desc(y_desc)
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, tool, v))| {
        let x = i as f64;
        Rectangle::new([(x - 0.35, 0.0), (x + 0.35, *v)], color(tool).filled())
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, _, v))| {
        Text::new(
            format!("{v:.0}"),
            (i as f64 - 0.15, *v + hi * 0.03),
            ("sans-serif", 14),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// One line of a [`sweep`]: its name (in the legend), its colour, and per
/// swept value `x` every run's measure.
pub struct Series {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, Vec<f64>)>,
}

/// A measure against a swept parameter: per series a line through the
/// medians, a dot at each median and a whisker from the smallest run to the
/// largest. `log_x`, `log_y` for logarithmic axes (points at or below zero
/// are then left out).
pub fn sweep(
    path: &std::path::Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    log_x: bool,
    log_y: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let keep = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| keep(*x, log_x))
        .collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().flat_map(|p| p.1.iter().copied()))
        .filter(|y| keep(*y, log_y))
        .collect();
    let range = |v: &[f64], log: bool| -> (f64, f64) {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !lo.is_finite() {
            return if log { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        if log {
            // Whole decades, with room above the largest point.
            let lo = 10f64.powf(lo.log10().floor());
            (lo, 10f64.powf((hi * 1.05).log10().ceil()).max(lo * 10.0))
        } else {
            let pad = ((hi - lo.min(0.0)) * 0.08).max(1e-9);
            (lo.min(0.0), hi + pad)
        }
    };
    let (x0, x1) = range(&xs, log_x);
    // A little room at either end of x, so that no point sits on an edge.
    let (x0, x1) = if log_x {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() {
            (lo / 1.3, hi * 1.3)
        } else {
            (x0, x1)
        }
    } else {
        let pad = (x1 - x0) * 0.03;
        (x0 - pad, x1)
    };
    let (y0, y1) = range(&ys, log_y);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(80);
    let lin = |a: f64, b: f64| -> RangedCoordf64 { (a..b).into() };
    match (log_x, log_y) {
        (false, false) => draw_sweep(
            builder.build_cartesian_2d(lin(x0, x1), lin(y0, y1))?,
            x_desc,
            y_desc,
            series,
            (log_x, log_y),
        ),
        (true, false) => draw_sweep(
            builder.build_cartesian_2d((x0..x1).log_scale(), lin(y0, y1))?,
            x_desc,
            y_desc,
            series,
            (log_x, log_y),
        ),
        (false, true) => draw_sweep(
            builder.build_cartesian_2d(lin(x0, x1), (y0..y1).log_scale())?,
            x_desc,
            y_desc,
            series,
            (log_x, log_y),
        ),
        (true, true) => draw_sweep(
            builder.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?,
            x_desc,
            y_desc,
            series,
            (log_x, log_y),
        ),
    }?;
    root.present()?;
    Ok(())
}

fn draw_sweep<'a, X, Y>(
    mut chart: ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    (log_x, log_y): (bool, bool),
) -> Result<(), Box<dyn std::error::Error>>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    // Four significant digits at most, without trailing zeros (an axis'
    // steps add up to 0.15000000000000002).
    let number = |v: &f64| {
        if *v == 0.0 {
            return "0".to_owned();
        }
        let decimals = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
        let text = format!("{v:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            text
        }
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&number)
        .y_label_formatter(&number)
        .draw()?;
    let keep = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    for s in series {
        let c = s.color;
        let points: Vec<(f64, f64, f64, f64)> = s
            .points
            .iter()
            .filter(|(x, v)| keep(*x, log_x) && !v.is_empty())
            .map(|(x, v)| {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (*x, lo, median(v), hi)
            })
            .filter(|p| keep(p.2, log_y))
            .collect();
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, p.2)),
                c.stroke_width(2),
            ))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new((p.0, p.2), 4, c.filled())))?;
        chart.draw_series(
            points
                .iter()
                .filter(|p| keep(p.1, log_y) && p.3 > p.1)
                .map(|p| PathElement::new(vec![(p.0, p.1), (p.0, p.3)], c.stroke_width(1))),
        )?;
        // The whiskers' caps, 10 pixels wide whatever the axis.
        chart.draw_series(
            points
                .iter()
                .filter(|p| keep(p.1, log_y) && p.3 > p.1)
                .flat_map(|p| [(p.0, p.1), (p.0, p.3)])
                .map(|at| EmptyElement::at(at) + PathElement::new(vec![(-5, 0), (5, 0)], c.stroke_width(1))),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}
