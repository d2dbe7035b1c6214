//! `kernelsight simulate` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct SimulateArgs {}

pub fn run(_args: SimulateArgs) -> Result<()> {
    anyhow::bail!("'simulate' is not implemented yet")
}
