//! `kernelsight kernel` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct KernelArgs {}

pub fn run(_args: KernelArgs) -> Result<()> {
    anyhow::bail!("'kernel' is not implemented yet")
}
