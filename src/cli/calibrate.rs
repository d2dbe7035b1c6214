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
}

pub fn run(args: CalibrateArgs) -> Result<()> {
    let dirs = if args.data.is_empty() { calibrate::default_data_dirs() } else { args.data.clone() };
    let data = Data::load(&dirs)?;
    eprintln!("{} measurements after median aggregation, GPUs: {}", data.rows.len(), data.gpus().join(", "));
    let cal = calibrate::calibrate(&data, args.gpu.as_deref(), &FitParams::default())?;
    let command: Vec<String> = std::env::args().collect();
    let written = calibrate::write_calibration(&cal, &data, &args.out, &command.join(" "))?;
    for p in written {
        let size = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        println!("wrote {} ({} KB)", p.display(), size / 1024);
    }
    println!("rebuild (cargo build) to embed the new calibration in the binary");
    Ok(())
}
