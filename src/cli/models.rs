//! `kernelsight models` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct ModelsArgs {}

pub fn run(_args: ModelsArgs) -> Result<()> {
    anyhow::bail!("'models' is not implemented yet")
}
