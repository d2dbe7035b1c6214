//! `kernelsight sol` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct SolArgs {}

pub fn run(_args: SolArgs) -> Result<()> {
    anyhow::bail!("'sol' is not implemented yet")
}
