//! `kernelsight bench` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> Result<()> {
    anyhow::bail!("'bench' is not implemented yet")
}
