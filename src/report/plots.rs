//! Plots (PNG and SVG, same drawing code): latency CDFs, throughput and KV use over time, and
//! the kernel-time breakdown. PNG text uses the embedded DejaVu Sans (licence next to the font
//! in assets/fonts/), so no system font library is needed.

use crate::sim::metrics::Histogram;
use crate::sim::summary::Summary;
use crate::sim::Outcome;
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

pub(crate) fn register_font() {
    REGISTER.call_once(|| {
        // The embedded font is a valid TTF; failure would only lose PNG text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

pub(crate) fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing plot: {e:?}")
}

pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn cdf_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, h: &Histogram, color: RGBColor) -> Result<()> {
    let pts: Vec<(f64, f64)> = h.cdf().into_iter().map(|(us, f)| (us / 1e3, f)).collect();
    let x_max = pts.last().map(|p| p.0).unwrap_or(1.0).max(1e-3) * 1.05;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc("ms").y_desc("fraction").label_style(("sans-serif", 13)).draw().map_err(err)?;
    let mut line = Vec::with_capacity(pts.len() * 2 + 1);
    let mut prev = 0.0;
    line.push((0.0, 0.0));
    for (x, f) in pts {
        line.push((x, prev));
        line.push((x, f));
        prev = f;
    }
    chart.draw_series(LineSeries::new(line, color.stroke_width(2))).map_err(err)?;
    Ok(())
}

fn latency<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, o: &Outcome) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((2, 2));
    let r = &o.rec;
    let specs = [("TTFT", &r.ttft_us), ("TPOT", &r.tpot_us), ("ITL", &r.itl_us), ("E2E latency", &r.e2e_us)];
    for (i, (area, (name, h))) in panels.iter().zip(specs).enumerate() {
        cdf_panel(area, &format!("{name} CDF"), h, COLORS[i])?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn timeline<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, o: &Outcome) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically((50).percent());
    let s = &o.rec.series;
    let w = s.width_s;
    let t_max = (s.buckets.len() as f64 * w).max(w);
    let tok: Vec<(f64, f64)> = s.buckets.iter().enumerate().map(|(i, b)| (i as f64 * w, b.output_tokens as f64 / w)).collect();
    let y_max = tok.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption("Output throughput", ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(err)?;
    chart.configure_mesh().x_desc("simulated time (s)").y_desc("tokens/s").label_style(("sans-serif", 13)).draw().map_err(err)?;
    chart.draw_series(LineSeries::new(tok, COLORS[0].stroke_width(2))).map_err(err)?;
    let kv: Vec<(f64, f64)> = s.buckets.iter().enumerate().map(|(i, b)| (i as f64 * w, b.kv_used_frac_s / w * 100.0)).collect();
    let mut chart = ChartBuilder::on(&bottom)
        .caption("KV cache in use (time-averaged per bucket)", ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..100.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc("simulated time (s)").y_desc("% of blocks").label_style(("sans-serif", 13)).draw().map_err(err)?;
    chart.draw_series(LineSeries::new(kv, COLORS[1].stroke_width(2))).map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn breakdown<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, s: &Summary) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let classes: Vec<(&String, f64)> = s.kernel_time_share.iter().map(|(k, v)| (k, *v * 100.0)).collect();
    let n = classes.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption("Share of step time by kernel class", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(110)
        .build_cartesian_2d(0.0..100.0, (0..n - 1).into_segmented())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("% of summed step time")
        .y_labels(classes.len())
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => classes.get(*i as usize).map(|c| c.0.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(classes.iter().enumerate().map(|(i, (_, v))| {
            let i = i as i32;
            let mut bar = Rectangle::new([(0.0, SegmentValue::Exact(i)), (*v, SegmentValue::Exact(i + 1))], COLORS[i as usize % 6].filled());
            bar.set_margin(4, 4, 0, 0);
            bar
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes latency_cdf, timeline and kernel_breakdown as .png and .svg into `dir`.
pub fn write_all(dir: &Path, o: &Outcome, s: &Summary) -> Result<()> {
    register_font();
    let size = (1000, 700);
    let p = |name: &str| dir.join(name);
    latency(BitMapBackend::new(&p("latency_cdf.png"), size).into_drawing_area(), o)?;
    latency(SVGBackend::new(&p("latency_cdf.svg"), size).into_drawing_area(), o)?;
    timeline(BitMapBackend::new(&p("timeline.png"), size).into_drawing_area(), o)?;
    timeline(SVGBackend::new(&p("timeline.svg"), size).into_drawing_area(), o)?;
    let small = (800, 400);
    breakdown(BitMapBackend::new(&p("kernel_breakdown.png"), small).into_drawing_area(), s)?;
    breakdown(SVGBackend::new(&p("kernel_breakdown.svg"), small).into_drawing_area(), s)?;
    Ok(())
}
