//! `kernelsight hw` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct HwArgs {}

pub fn run(_args: HwArgs) -> Result<()> {
    anyhow::bail!("'hw' is not implemented yet")
}
