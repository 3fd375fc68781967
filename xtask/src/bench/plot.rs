//! The report's plots, as PNGs drawn by plotters' bitmap backend. Text is drawn with a font
//! shipped as bytes in a crate (ab_glyph), so no system font library or font file is needed.

use std::{path::Path, sync::Once};

use anyhow::{Result, anyhow};
use plotters::{prelude::*, style::FontStyle};
use serde_json::Value;

use super::report::numbers;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The only font: every family name plotters asks for resolves to it.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

fn plot_error(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// Per mode, the CDF of kill -9 → ContainerDied (log x), with the two anchors dashed.
pub fn latency_cdf(measured: &Value, path: &Path) -> Result<()> {
    register_font();
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    let mut anchors = (Vec::new(), Vec::new());
    for row in measured["latency"].as_array().into_iter().flatten() {
        if !row["unavailable"].is_null() {
            continue;
        }
        let mut died = numbers(&row["kills"], "died_ms");
        died.sort_by(f64::total_cmp);
        series.push((row["label"].as_str().unwrap_or("?").to_owned(), died));
        anchors.0.extend(numbers(&row["kills"], "exit_ms"));
        anchors.1.extend(numbers(&row["kills"], "cri_ms"));
    }
    for (label, mut values) in [
        ("anchor: containerd /tasks/exit", anchors.0),
        ("anchor: CRI ContainerStatus EXITED", anchors.1),
    ] {
        values.sort_by(f64::total_cmp);
        series.push((label.to_owned(), values));
    }
    let all = series.iter().flat_map(|(_, v)| v.iter().copied());
    let hi = all.clone().fold(1.0f64, f64::max) * 1.5;
    let lo = all.filter(|v| *v > 0.0).fold(hi, f64::min).max(0.05) / 1.5;

    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "kill -9 -> ContainerDied at a watch client (CDF)",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0f64..1.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("ms after the kill (log scale)")
        .y_desc("fraction of kills")
        .draw()
        .map_err(plot_error)?;
    let anchors_from = series.len() - 2;
    for (i, (label, values)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = values.len().max(1) as f64;
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(k, v)| (v.max(lo), (k + 1) as f64 / n))
            .collect();
        let style = color.stroke_width(if i >= anchors_from { 1 } else { 2 });
        if i >= anchors_from {
            chart
                .draw_series(DashedLineSeries::new(points, 6, 4, style))
                .map_err(plot_error)?
        } else {
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(plot_error)?
        }
        .label(label.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// One line of the idle plot: its colour's index, its mode, its points (containers, % of a
/// core) by containers.
type IdleLine<'a> = (usize, &'a str, Vec<(f64, f64)>);

/// The idle rows of each mode as a line, in the order the modes first appear.
fn idle_lines(measured: &Value) -> Vec<IdleLine<'_>> {
    let rows: Vec<&Value> = measured["idle"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["mode"] != "none")
        .collect();
    let mut modes: Vec<&str> = rows.iter().filter_map(|r| r["mode"].as_str()).collect();
    modes.dedup();
    let point = |r: &Value| {
        Some((
            r["containers"].as_f64()?,
            r["plegd_cpu"].as_f64()? + r["containerd_added_cpu"].as_f64()?,
        ))
    };
    let mut lines: Vec<IdleLine<'_>> = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        if lines.iter().any(|(_, seen, _)| *seen == mode) {
            continue;
        }
        let mut points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r["mode"] == mode)
            .filter_map(|r| point(r))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        lines.push((i, mode, points));
    }
    lines
}

/// Per mode, the CPU plegd adds to an idle node (its own + containerd's extra) by containers.
pub fn idle_cpu(measured: &Value, path: &Path) -> Result<()> {
    register_font();
    let lines = idle_lines(measured);
    let points = || lines.iter().flat_map(|(_, _, points)| points);
    let x_hi = points().fold(1.0f64, |a, p| a.max(p.0)) * 1.1;
    let y_lo = points().fold(0.0f64, |a, p| a.min(p.1));
    let y_hi = points().fold(0.1f64, |a, p| a.max(p.1)) * 1.2;

    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "idle CPU plegd adds (plegd + containerd's extra)",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0f64..x_hi, y_lo..y_hi)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("idle containers")
        .y_desc("% of one core")
        .draw()
        .map_err(plot_error)?;
    for (i, mode, points) in &lines {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(*mode)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_idle_mode_is_one_line_sorted_by_containers_without_the_baseline() {
        let measured = json!({"idle": [
            {"mode": "none", "containers": 10, "plegd_cpu": 0.0, "containerd_added_cpu": 0.0},
            {"mode": "default", "containers": 100, "plegd_cpu": 0.5, "containerd_added_cpu": 0.1},
            {"mode": "polling-1s", "containers": 10, "plegd_cpu": 1.0, "containerd_added_cpu": 2.0},
            {"mode": "default", "containers": 10, "plegd_cpu": 0.25, "containerd_added_cpu": 0.0},
            {"mode": "polling-1s", "containers": 100, "plegd_cpu": 3.0},
        ]});
        assert_eq!(
            idle_lines(&measured),
            [
                (0, "default", vec![(10.0, 0.25), (100.0, 0.6)]),
                (1, "polling-1s", vec![(10.0, 3.0)]),
            ]
        );
    }
}
