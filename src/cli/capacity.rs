//! `kernelsight capacity` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct CapacityArgs {}

pub fn run(_args: CapacityArgs) -> Result<()> {
    anyhow::bail!("'capacity' is not implemented yet")
}
