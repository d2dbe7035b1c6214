//! `kernelsight validate`: prediction error on measurements never used for fitting.
//! `validate kernels` checks per-kernel times, every tier on the same held-out rows.
use super::calibrate::FitArgs;
use crate::calibrate::{self, report, validate, Data};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(subcommand)]
    pub what: ValidateWhat,
}

#[derive(Debug, Subcommand)]
pub enum ValidateWhat {
    /// Per-kernel APE of the target, cross-gen and roofline tiers on held-out rows.
    Kernels(KernelsArgs),
    /// End-to-end APE of TTFT/TPOT/ITL/throughput: replays the H200 traces in the simulator.
    E2e(crate::e2e::cli::E2eArgs),
}

#[derive(Debug, Args)]
pub struct KernelsArgs {
    /// Evaluate only this GPU (default: each of a100_sxm, h100_sxm, h200_sxm, b200_sxm, gb200,
    /// l40s that has measurements, left out in turn).
    #[arg(long)]
    pub holdout_gpu: Option<String>,
    /// Print `{tier: {op: {median_ape, p90_ape, max_ape, count}}}` as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Folder for rows.csv, summary.json and the log-log predicted-vs-measured plot (PNG, SVG).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the markdown report (tables, worst shapes, this command line) here.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Measurement folders (default: microbench/public and microbench/data).
    #[arg(long, num_args = 1..)]
    pub data: Vec<PathBuf>,
    /// Evaluate only these op families (comma-separated, e.g. `all_reduce,p2p`); the roofline
    /// constants are then fitted on those ops' rows only.
    #[arg(long, value_delimiter = ',')]
    pub ops: Vec<crate::schema::Op>,
    #[command(flatten)]
    pub fit: FitArgs,
}

pub fn run(args: ValidateArgs) -> Result<()> {
    match args.what {
        ValidateWhat::Kernels(a) => kernels(a),
        ValidateWhat::E2e(a) => crate::e2e::cli::run(a),
    }
}

fn kernels(args: KernelsArgs) -> Result<()> {
    let dirs = if args.data.is_empty() { calibrate::default_data_dirs() } else { args.data.clone() };
    let mut data = Data::load(&dirs)?;
    if !args.ops.is_empty() {
        data.rows.retain(|m| args.ops.contains(&m.kernel.op));
    }
    let eval: Vec<String> = match &args.holdout_gpu {
        Some(g) => vec![g.clone()],
        None => {
            let measured = data.gpus();
            calibrate::LOGO_GPUS.iter().filter(|g| measured.iter().any(|m| m == *g)).map(|g| g.to_string()).collect()
        }
    };
    let validation = validate::validate_kernels(&data, &eval, &args.fit.params())?;
    let rows = &validation.rows;
    let (pooled, per_gpu) = validate::summarize(rows);
    let command: Vec<String> = std::iter::once("kernelsight".to_string()).chain(std::env::args().skip(1)).collect();
    let command = command.join(" ");
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report::json(&pooled))?);
    } else {
        println!("held-out rows of: {}\n", eval.join(", "));
        println!("{}", report::table(&pooled));
        println!("{}", report::per_gpu_table(&per_gpu));
        if rows.iter().any(|r| r.kernel.op.is_collective()) {
            println!("{}", report::per_link_table(rows));
        }
        println!("{}", report::sibling_table(&validation));
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let f = std::fs::File::create(dir.join("rows.csv")).with_context(|| format!("creating {}/rows.csv", dir.display()))?;
        report::write_csv(std::io::BufWriter::new(f), rows)?;
        std::fs::write(dir.join("summary.json"), serde_json::to_string_pretty(&report::json(&pooled))? + "\n")?;
        calibrate::plot::predicted_vs_measured(dir, "predicted_vs_measured", rows)?;
        eprintln!("wrote {0}/rows.csv, {0}/summary.json, {0}/predicted_vs_measured.png and .svg", dir.display());
    }
    if let Some(md) = &args.markdown {
        let notes = format!(
            "Data: {} measurements after median aggregation over GPUs {}. Held-out rows: fold 0 of a \
             shape-level hash split (every backend's measurement of a shape is held out together).",
            data.rows.len(),
            data.gpus().join(", ")
        );
        std::fs::write(md, report::markdown(&validation, &command, &notes)).with_context(|| format!("writing {}", md.display()))?;
        eprintln!("wrote {}", md.display());
    }
    Ok(())
}
