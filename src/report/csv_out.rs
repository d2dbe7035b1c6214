//! Per-request CSV, written as requests end (nothing kept in memory).

use crate::sim::record::RequestRecord;
use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

pub const HEADER: &str =
    "id,replica,arrival_s,prompt_tokens,output_tokens,cached_tokens,queue_ms,ttft_ms,tpot_ms,e2e_ms,finish_s,preemptions,status";

pub struct RequestCsv {
    out: BufWriter<File>,
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        String::new()
    }
}

impl RequestCsv {
    pub fn create(path: &Path) -> Result<RequestCsv> {
        let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::new(f);
        writeln!(out, "{HEADER}")?;
        Ok(RequestCsv { out })
    }

    pub fn write(&mut self, r: &RequestRecord) -> Result<()> {
        writeln!(
            self.out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.id,
            r.replica,
            num(r.arrival_s),
            r.prompt_tokens,
            r.output_tokens,
            r.cached_tokens,
            num(r.queue_ms),
            num(r.ttft_ms),
            r.tpot_ms.map(num).unwrap_or_default(),
            num(r.e2e_ms),
            num(r.finish_s),
            r.preemptions,
            r.rejected.map(|x| format!("rejected:{x}")).unwrap_or_else(|| "ok".into())
        )?;
        Ok(())
    }

    pub fn finish(mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}
