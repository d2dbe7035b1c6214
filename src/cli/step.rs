//! `kernelsight step` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct StepArgs {}

pub fn run(_args: StepArgs) -> Result<()> {
    anyhow::bail!("'step' is not implemented yet")
}
