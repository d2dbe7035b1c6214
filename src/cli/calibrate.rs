//! `kernelsight calibrate`: fit the efficiency models of every tier and write `calibration/`.
use crate::calibrate::{self, model::FitParams, Data};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Only refit the per-GPU models (target, and cross-gen with it left out) of this GPU.
    #[arg(long)]
    pub gpu: Option<String>,
    /// Measurement folders (shared-schema *.csv / *.csv.gz, searched recursively).
    /// Default: microbench/public and microbench/data.
    #[arg(long, num_args = 1..)]
    pub data: Vec<PathBuf>,
    /// Where to write the models.
    #[arg(long, default_value = "calibration")]
    pub out: PathBuf,
    #[command(flatten)]
    pub fit: FitArgs,
}

/// Model-size knobs shared by `calibrate` and `validate kernels` (validate what ships).
#[derive(Debug, Args)]
pub struct FitArgs {
    /// Boosted trees per op family (cross-gen tier, and target-tier families with too few shapes to pick the count on an inner validation set).
    #[arg(long, default_value_t = FitParams::default().gbdt.trees)]
    pub trees: usize,
    /// Depth of each tree.
    #[arg(long, default_value_t = FitParams::default().gbdt.max_depth)]
    pub max_depth: usize,
    /// Shrinkage per tree.
    #[arg(long, default_value_t = FitParams::default().gbdt.learning_rate)]
    pub learning_rate: f64,
    /// Training rows per fit (deterministic subsample above it).
    #[arg(long, default_value_t = FitParams::default().max_rows)]
    pub max_rows: usize,
}

impl FitArgs {
    pub fn params(&self) -> FitParams {
        let mut p = FitParams::default();
        p.gbdt.trees = self.trees;
        p.gbdt.max_depth = self.max_depth;
        p.gbdt.learning_rate = self.learning_rate;
        p.max_rows = self.max_rows;
        p
    }
}

pub fn run(args: CalibrateArgs) -> Result<()> {
    let dirs = if args.data.is_empty() { calibrate::default_data_dirs() } else { args.data.clone() };
    let data = Data::load(&dirs)?;
    eprintln!("{} measurements after median aggregation, GPUs: {}", data.rows.len(), data.gpus().join(", "));
    let cal = calibrate::calibrate(&data, args.gpu.as_deref(), &args.fit.params())?;
    let command: Vec<String> = std::iter::once("kernelsight".to_string()).chain(std::env::args().skip(1)).collect();
    let written = calibrate::write_calibration(&cal, &data, &args.out, &command.join(" "))?;
    for p in written {
        let size = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        println!("wrote {} ({} KB)", p.display(), size / 1024);
    }
    println!("rebuild (cargo build) to embed the new calibration in the binary");
    Ok(())
}
