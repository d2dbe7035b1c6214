//! `kernelsight microbench` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct MicrobenchArgs {}

pub fn run(_args: MicrobenchArgs) -> Result<()> {
    anyhow::bail!("'microbench' is not implemented yet")
}
