//! The SVG chart: grouped bars per backend, log scale.

use std::path::Path;

use plotters::prelude::*;

use super::cells::row_label;
use crate::compare::report::{BackendReport, Cell, Report};

/// Which cell of a backend a chart series shows.
type Pick = fn(&BackendReport) -> &Cell;

/// Grouped bars per backend, log scale: uncontended, contended, end to end, limit.
pub fn svg(report: &Report, path: &Path) -> anyhow::Result<()> {
    let series: [(&str, RGBColor, Pick); 4] = [
        (
            "uncontended acquire+release/s",
            RGBColor(31, 119, 180),
            |b| &b.uncontended,
        ),
        (
            "16 contenders: acquire+release/s",
            RGBColor(255, 127, 14),
            |b| &b.contended,
        ),
        ("fenced edits/s, 3 workers", RGBColor(44, 160, 44), |b| {
            &b.e2e
        }),
        (
            "limit of the service, ops/s",
            RGBColor(150, 150, 150),
            |b| &b.limit.1,
        ),
    ];
    let n = report.backends.len().max(1);
    let max = report
        .backends
        .iter()
        .flat_map(|b| series.iter().filter_map(|s| (s.2)(b).rate()))
        .fold(10.0f64, f64::max);
    // A decade and more of headroom, so that the legend sits above the bars.
    let top = 10f64.powf(max.log10().ceil() + 1.2);
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("draw {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let names: Vec<String> = report.backends.iter().map(row_label).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Locks compared ({}; log scale; n/m = not measured)",
                report.date
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, (1f64..top).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 {
                names.get(i).map(|s| s.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("per second")
        .draw()
        .map_err(|e| err(&e))?;
    let width = 0.8 / series.len() as f64;
    for (k, (name, color, pick)) in series.iter().enumerate() {
        let bars: Vec<Rectangle<(f64, f64)>> = report
            .backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let rate = pick(b).rate()?;
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Some(Rectangle::new(
                    [(x0, 1.0), (x0 + width * 0.9, rate.max(1.0))],
                    color.filled(),
                ))
            })
            .collect();
        let c = *color;
        chart
            .draw_series(bars)
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        let missing: Vec<Text<(f64, f64), String>> = report
            .backends
            .iter()
            .enumerate()
            .filter(|(_, b)| pick(b).rate().is_none())
            .map(|(i, _)| {
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Text::new("n/m".to_string(), (x0, 1.3), ("sans-serif", 10).into_font())
            })
            .collect();
        chart.draw_series(missing).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
