//! Predicted-versus-measured scatter plots on log-log axes with the y = x line, as PNG and SVG.

use super::plots::{err, register_font, COLORS};
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One named group of (measured, predicted) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, unit: &str, series: &[Series]) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let all = series.iter().flat_map(|s| s.points.iter()).flat_map(|&(a, b)| [a, b]).filter(|v| *v > 0.0 && v.is_finite());
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo < hi { (lo / 1.5, hi * 1.5) } else { (0.1, 10.0) };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("measured ({unit})"))
        .y_desc(format!("predicted ({unit})"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    chart.draw_series(LineSeries::new(vec![(lo, lo), (hi, hi)], BLACK.stroke_width(1))).map_err(err)?.label("y = x");
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts = s.points.iter().filter(|(a, b)| *a > 0.0 && *b > 0.0 && a.is_finite() && b.is_finite());
        chart
            .draw_series(pts.map(|&(a, b)| Circle::new((a, b), 3, c.filled())))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).label_font(("sans-serif", 13)).draw().map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `dir/stem.png` and `dir/stem.svg`.
pub fn predicted_vs_measured(dir: &Path, stem: &str, title: &str, unit: &str, series: &[Series]) -> Result<()> {
    register_font();
    std::fs::create_dir_all(dir)?;
    let png = dir.join(format!("{stem}.png"));
    draw(BitMapBackend::new(&png, (900, 800)).into_drawing_area(), title, unit, series)?;
    let svg = dir.join(format!("{stem}.svg"));
    draw(SVGBackend::new(&svg, (900, 800)).into_drawing_area(), title, unit, series)?;
    Ok(())
}
