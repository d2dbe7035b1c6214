//! `kernelsight import` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct ImportArgs {}

pub fn run(_args: ImportArgs) -> Result<()> {
    anyhow::bail!("'import' is not implemented yet")
}
