//! `kernelsight validate` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct ValidateArgs {}

pub fn run(_args: ValidateArgs) -> Result<()> {
    anyhow::bail!("'validate' is not implemented yet")
}
