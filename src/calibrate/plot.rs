//! Log-log predicted-vs-measured scatter, one panel per tier, PNG and SVG from the same drawing
//! code. Points are thinned evenly to at most `MAX_POINTS` per panel so the files stay small.

use super::validate::{ValRow, TIERS};
use crate::report::plots::{register_font, COLORS};
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const MAX_POINTS: usize = 4000;

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing plot: {e:?}")
}

fn panels<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[ValRow]) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (lo, hi) = rows.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
        (lo.min(r.measured_us).min(r.predicted_us), hi.max(r.measured_us).max(r.predicted_us))
    });
    let (lo, hi) = (lo.max(0.1) / 1.5, hi.max(1.0) * 1.5);
    let mut ops: Vec<&str> = rows.iter().map(|r| r.kernel.op.as_str()).collect();
    ops.sort();
    ops.dedup();
    for (area, tier) in root.split_evenly((1, TIERS.len())).iter().zip(TIERS) {
        let pts: Vec<&ValRow> = rows.iter().filter(|r| r.tier == tier).collect();
        let step = pts.len().div_ceil(MAX_POINTS).max(1);
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{} ({} rows)", tier.as_str(), pts.len()), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("measured us")
            .y_desc("predicted us")
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(err)?;
        chart.draw_series(LineSeries::new([(lo, lo), (hi, hi)], BLACK.stroke_width(1))).map_err(err)?;
        for (i, op) in ops.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let series = pts.iter().step_by(step).filter(|r| r.kernel.op.as_str() == *op);
            chart
                .draw_series(series.map(|r| Circle::new((r.measured_us, r.predicted_us), 2, color.mix(0.5).filled())))
                .map_err(err)?
                .label(*op)
                .legend(move |(x, y)| Circle::new((x, y), 4, color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 11))
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `<stem>.png` and `<stem>.svg` under `dir`.
pub fn predicted_vs_measured(dir: &Path, stem: &str, rows: &[ValRow]) -> Result<()> {
    register_font();
    let size = (1500, 520);
    panels(BitMapBackend::new(&dir.join(format!("{stem}.png")), size).into_drawing_area(), rows)?;
    panels(SVGBackend::new(&dir.join(format!("{stem}.svg")), size).into_drawing_area(), rows)?;
    Ok(())
}
