//! PNG and SVG plots: the throughput-per-GPU vs latency frontier of a plan, and latency
//! versus offered load of one deployment. Text uses an embedded font, so PNGs render the
//! same on machines without system fonts.

use super::capacity::LoadPoint;
use super::search::{FrontierMetric, PlanResult};
use super::slo::{fmt_percentile, Slo};
use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::coord::combinators::BindKeyPoints;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use crate::report::plots::{err, register_font};

const SIZE: (u32, u32) = (1000, 700);

/// A drawing that can go to any backend.
trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>;
}

/// Writes `stem.png` and `stem.svg` in `dir` with the same drawing; returns both paths.
fn both(dir: &Path, stem: &str, fig: &impl Figure) -> Result<Vec<PathBuf>> {
    register_font();
    std::fs::create_dir_all(dir).with_context(|| format!("creating output directory {}", dir.display()))?;
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        fig.draw(&root)?;
        root.present().map_err(err).with_context(|| format!("writing {}", png.display()))?;
    }
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        fig.draw(&root)?;
        root.present().map_err(err).with_context(|| format!("writing {}", svg.display()))?;
    }
    Ok(vec![png, svg])
}

/// Range padded by a factor on a log axis; a degenerate range is widened.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.filter(|v| v.is_finite() && *v > 0.0).fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    (lo / 1.5, (hi * 1.5).max(lo * 2.0))
}

/// 1-2-5 ticks inside [lo, hi] for a log axis (only powers of ten when that gives too many).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    if out.len() > 12 {
        out.retain(|v| (v.log10() - v.log10().round()).abs() < 1e-9);
    }
    out
}

fn fmt_tick(v: &f64) -> String {
    if *v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{}", (v * 1e6).round() / 1e6)
    }
}

fn lin_max(values: impl Iterator<Item = f64>) -> f64 {
    let m = values.filter(|v| v.is_finite()).fold(0.0f64, f64::max);
    if m > 0.0 {
        m * 1.1
    } else {
        1.0
    }
}

struct Frontier {
    title: String,
    x_desc: String,
    /// (latency, throughput per GPU, meets every SLO)
    pts: Vec<(f64, f64, bool)>,
    line: Vec<(f64, f64)>,
    best: Option<(f64, f64)>,
    limit: Option<f64>,
}

/// Throughput per GPU against the frontier latency for every simulated candidate, the
/// Pareto frontier as a line, the chosen deployment ringed, the SLO as a vertical line.
pub fn frontier_plot(dir: &Path, r: &PlanResult) -> Result<Vec<PathBuf>> {
    let metric = r.frontier_metric;
    let point = |i: usize| (metric.value(&r.evaluated[i].outcome), r.evaluated[i].output_tokens_per_s_per_gpu);
    // Stopped runs have only lower bounds on latency: not plotted.
    let pts = (0..r.evaluated.len())
        .filter(|&i| !r.evaluated[i].outcome.stopped_early)
        .map(|i| (point(i).0, point(i).1, r.evaluated[i].meets_slo()))
        .filter(|p| p.0.is_finite() && p.0 > 0.0)
        .collect();
    let limit = match metric {
        FrontierMetric::Ttft => r.slo.ttft_ms,
        FrontierMetric::Tpot => r.slo.tpot_ms,
        FrontierMetric::E2e => r.slo.e2e_ms,
    };
    let pct = fmt_percentile(r.slo.percentile);
    let fig = Frontier {
        title: format!("Throughput per GPU vs {pct} {} ({} runs to the end)", metric.name(), r.evaluated.iter().filter(|e| !e.outcome.stopped_early).count()),
        x_desc: format!("{pct} {} (ms, log scale)", metric.name()),
        pts,
        line: r.frontier.iter().map(|&i| point(i)).collect(),
        best: r.best.map(point),
        limit,
    };
    both(dir, "frontier", &fig)
}

impl Figure for Frontier {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let (x0, x1) = log_range(self.pts.iter().map(|p| p.0));
        let y1 = lin_max(self.pts.iter().map(|p| p.1));
        let grey = RGBColor(170, 170, 170);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((x0..x1).log_scale().with_key_points(log_ticks(x0, x1)), 0.0..y1)
            .map_err(err)?;
        chart.configure_mesh().x_label_formatter(&fmt_tick).x_desc(self.x_desc.as_str()).y_desc("output tokens/s per GPU").label_style(("sans-serif", 15)).draw().map_err(err)?;
        chart
            .draw_series(self.pts.iter().filter(|p| !p.2).map(|p| Circle::new((p.0, p.1), 4, grey.filled())))
            .map_err(err)?
            .label("misses an SLO")
            .legend(move |(x, y)| Circle::new((x, y), 4, grey.filled()));
        chart
            .draw_series(self.pts.iter().filter(|p| p.2).map(|p| Circle::new((p.0, p.1), 4, GREEN.filled())))
            .map_err(err)?
            .label("meets every SLO")
            .legend(|(x, y)| Circle::new((x, y), 4, GREEN.filled()));
        chart
            .draw_series(LineSeries::new(self.line.iter().copied(), BLUE.stroke_width(2)))
            .map_err(err)?
            .label("Pareto frontier")
            .legend(|(x, y)| PathElement::new(vec![(x - 10, y), (x + 10, y)], BLUE.stroke_width(2)));
        if let Some(l) = self.limit.filter(|l| *l > x0 && *l < x1) {
            chart
                .draw_series(LineSeries::new(vec![(l, 0.0), (l, y1)], RED.stroke_width(1)))
                .map_err(err)?
                .label(format!("SLO {l} ms"))
                .legend(|(x, y)| PathElement::new(vec![(x - 10, y), (x + 10, y)], RED));
        }
        if let Some(b) = self.best {
            chart
                .draw_series(std::iter::once(Circle::new(b, 9, BLACK.stroke_width(2))))
                .map_err(err)?
                .label("cheapest meeting the SLOs")
                .legend(|(x, y)| Circle::new((x, y), 6, BLACK.stroke_width(2)));
        }
        chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.9)).label_font(("sans-serif", 15)).draw().map_err(err)?;
        Ok(())
    }
}

struct LoadCurve {
    title: String,
    pct: String,
    /// (rate, TTFT, TPOT) at the SLO percentile.
    pts: Vec<(f64, f64, f64)>,
    ttft_limit: Option<f64>,
    tpot_limit: Option<f64>,
    /// Vertical markers: (rate, label).
    marks: Vec<(f64, String)>,
}

/// TTFT and TPOT (at the SLO percentile) against offered load, one panel each, with the
/// SLO limits and markers (e.g. the requested rate and the highest sustainable rate).
pub fn load_plot(dir: &Path, stem: &str, title: &str, curve: &[LoadPoint], slo: &Slo, marks: Vec<(f64, String)>) -> Result<Vec<PathBuf>> {
    let fig = LoadCurve {
        title: title.to_string(),
        pct: fmt_percentile(slo.percentile),
        pts: curve.iter().map(|p| (p.rate_per_s, p.outcome.ttft_ms.at_slo, p.outcome.tpot_ms.at_slo)).collect(),
        ttft_limit: slo.ttft_ms,
        tpot_limit: slo.tpot_ms,
        marks,
    };
    both(dir, stem, &fig)
}

impl Figure for LoadCurve {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let root = root.titled(&self.title, ("sans-serif", 24)).map_err(err)?;
        let panels = root.split_evenly((2, 1));
        let x1 = lin_max(self.pts.iter().map(|p| p.0).chain(self.marks.iter().map(|m| m.0)));
        type Get = fn(&(f64, f64, f64)) -> f64;
        let series: [(&str, Option<f64>, Get, RGBColor); 2] =
            [("TTFT", self.ttft_limit, |p| p.1, BLUE), ("TPOT", self.tpot_limit, |p| p.2, MAGENTA)];
        for (panel, (name, limit, get, color)) in panels.iter().zip(series) {
            let (y0, y1) = log_range(self.pts.iter().map(get).chain(limit));
            let mut chart = ChartBuilder::on(panel)
                .margin(15)
                .x_label_area_size(45)
                .y_label_area_size(80)
                .build_cartesian_2d(0.0..x1, (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)))
                .map_err(err)?;
            chart
                .configure_mesh()
                .y_label_formatter(&fmt_tick)
                .x_desc("offered load (requests/s)")
                .y_desc(format!("{} {name} (ms)", self.pct))
                .label_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
            let line: Vec<(f64, f64)> = self.pts.iter().map(|p| (p.0, get(p))).filter(|p| p.1.is_finite() && p.1 > 0.0).collect();
            chart
                .draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(format!("{} {name}", self.pct))
                .legend(move |(x, y)| PathElement::new(vec![(x - 10, y), (x + 10, y)], color.stroke_width(2)));
            chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err)?;
            if let Some(l) = limit {
                chart
                    .draw_series(LineSeries::new(vec![(0.0, l), (x1, l)], RED))
                    .map_err(err)?
                    .label(format!("SLO {l} ms"))
                    .legend(|(x, y)| PathElement::new(vec![(x - 10, y), (x + 10, y)], RED));
            }
            for (i, (rate, label)) in self.marks.iter().enumerate() {
                let c = [BLACK, RGBColor(0, 128, 0)][i % 2];
                chart
                    .draw_series(LineSeries::new(vec![(*rate, y0), (*rate, y1)], c.stroke_width(1)))
                    .map_err(err)?
                    .label(label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x - 10, y), (x + 10, y)], c));
            }
            chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).background_style(WHITE.mix(0.9)).label_font(("sans-serif", 14)).draw().map_err(err)?;
        }
        Ok(())
    }
}
