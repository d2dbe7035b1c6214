//! Simulation outputs: terminal report, per-request CSV, summary JSON, plots, Chrome trace.

pub mod csv_out;
pub mod plots;
pub mod scatter;
pub mod terminal;
pub mod trace;

use crate::sim::record::{RequestRecord, SimObserver, StepRecord};
use anyhow::Result;

/// Fans records out to whichever outputs are on.
#[derive(Default)]
pub struct Outputs {
    pub csv: Option<csv_out::RequestCsv>,
    pub trace: Option<trace::ChromeTrace>,
    pub progress: Option<indicatif::ProgressBar>,
}

impl SimObserver for Outputs {
    fn on_request(&mut self, r: &RequestRecord) -> Result<()> {
        if let Some(c) = &mut self.csv {
            c.write(r)?;
        }
        if let Some(p) = &self.progress {
            p.inc(1);
        }
        Ok(())
    }

    fn on_step(&mut self, s: &StepRecord) -> Result<()> {
        if let Some(t) = &mut self.trace {
            t.step(s)?;
        }
        Ok(())
    }
}
