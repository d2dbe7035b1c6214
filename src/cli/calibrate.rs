//! `kernelsight calibrate` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct CalibrateArgs {}

pub fn run(_args: CalibrateArgs) -> Result<()> {
    anyhow::bail!("'calibrate' is not implemented yet")
}
