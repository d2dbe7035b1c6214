//! `kernelsight microbench plan`: writes the sweep plan that `microbench/collect.py` runs.
use crate::microbench::{default_plan, model_plan, write_plan};
use crate::model::ModelConfig;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct MicrobenchArgs {
    #[command(subcommand)]
    command: MicrobenchCommand,
}

#[derive(Debug, Subcommand)]
enum MicrobenchCommand {
    /// Emit a sweep plan (shared kernel-shape CSV) for the GPU collector.
    ///
    /// Without --model: the default model-agnostic sweep. With --model: the exact shapes of
    /// each model at --tp added to it (or alone with --no-default). Run the plan on a GPU with
    /// `python3 microbench/collect.py --plan FILE --out results.csv`.
    Plan(PlanArgs),
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Built-in model name or path to a Hugging Face config.json (repeatable).
    #[arg(long = "model", value_name = "M")]
    models: Vec<String>,
    /// Tensor-parallel degree for --model shapes (heads and MLP widths per GPU).
    #[arg(long, default_value_t = 1)]
    tp: u64,
    /// Leave out the default sweep (needs at least one --model).
    #[arg(long)]
    no_default: bool,
    /// Output CSV (default: standard output).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn run(args: MicrobenchArgs) -> Result<()> {
    match args.command {
        MicrobenchCommand::Plan(a) => plan(a),
    }
}

fn plan(a: PlanArgs) -> Result<()> {
    if a.no_default && a.models.is_empty() {
        bail!("--no-default leaves nothing to plan: give at least one --model");
    }
    let mut rows = if a.no_default { Vec::new() } else { default_plan() };
    for name in &a.models {
        let m = ModelConfig::load(name)?;
        rows.extend(model_plan(&m, a.tp).with_context(|| format!("planning model '{name}'"))?);
    }
    match &a.out {
        Some(path) => {
            let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
            write_plan(std::io::BufWriter::new(f), &rows)?;
            eprintln!("wrote {} rows to {}", rows.len(), path.display());
        }
        None => write_plan(std::io::stdout().lock(), &rows)?,
    }
    Ok(())
}
