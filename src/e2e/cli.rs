//! `kernelsight validate e2e`: replays measured serving runs and reports the error per metric.

use super::traces;
use crate::perf::Tier;
use crate::report::scatter::{predicted_vs_measured, Series};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(after_help = "Example:\n  kernelsight validate e2e --out out/e2e\n\nRuns of the calibration families fit the host-overhead model; the other families are held out and never used for fitting anything.")]
pub struct E2eArgs {
    /// Trace folders (one sub-folder per model, see their READMEs); repeatable.
    #[arg(long, default_values = ["calibration/traces/h200_sxm", "calibration/traces/h200_sxm_tp2"])]
    pub traces: Vec<PathBuf>,
    /// Kernel-time tiers to compare (repeatable); default: roofline, target and cross-gen.
    #[arg(long, value_enum)]
    pub tier: Vec<Tier>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write per-run predictions (CSV) and predicted-vs-measured plots (PNG, SVG) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the host model fitted for the first tier to calibration/host/hf.json.
    #[arg(long)]
    pub write_host: bool,
}

pub fn run(args: E2eArgs) -> Result<()> {
    let tiers = if args.tier.is_empty() { vec![Tier::Roofline, Tier::Target, Tier::CrossGen] } else { args.tier.clone() };
    let dirs: Vec<&std::path::Path> = args.traces.iter().map(PathBuf::as_path).collect();
    let report = traces::validate(&dirs, &tiers)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        report.write_csv(&dir.join("e2e_h200_runs.csv"))?;
        for metric in traces::METRICS {
            let series: Vec<Series> = tiers
                .iter()
                .map(|t| Series {
                    name: t.as_str().to_string(),
                    points: report.runs.iter().filter(|r| r.tier == t.as_str()).map(|r| (r.measured[metric], r.predicted[metric])).collect(),
                })
                .collect();
            let unit = if metric == "throughput" { "tok/s" } else { "ms" };
            predicted_vs_measured(dir, &format!("e2e_{metric}"), &format!("H200 traces: {metric}"), unit, &series)?;
        }
        eprintln!("wrote {}/e2e_h200_runs.csv and e2e_<metric>.png/.svg", dir.display());
    }
    if args.write_host {
        let tier = tiers[0].as_str();
        let path = PathBuf::from("calibration/host/hf.json");
        std::fs::create_dir_all("calibration/host")?;
        std::fs::write(&path, serde_json::to_string_pretty(&report.host_fits[tier])? + "\n")?;
        eprintln!("wrote {} (fitted with tier {tier}); rebuild to embed it", path.display());
    }
    Ok(())
}
