//! `kernelsight plan` (placeholder until its issue lands).
use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct PlanArgs {}

pub fn run(_args: PlanArgs) -> Result<()> {
    anyhow::bail!("'plan' is not implemented yet")
}
