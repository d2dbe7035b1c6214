//! Chrome/Perfetto trace (JSON object format) of engine steps: one span per step on a replica's
//! "steps" track, and its kernel-class times as spans on a "kernel classes" track. The classes
//! are laid end to end inside the step in a fixed order: their sum is modelled, their real
//! interleaving is not. Capped at `max_steps` steps so traces of long runs stay small.

use crate::sim::record::StepRecord;
use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

pub struct ChromeTrace {
    out: BufWriter<File>,
    max_steps: u64,
    steps: u64,
    first: bool,
    /// Replicas whose tracks are named already.
    named: std::collections::BTreeSet<u32>,
}

impl ChromeTrace {
    pub fn create(path: &Path, max_steps: u64) -> Result<ChromeTrace> {
        let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::new(f);
        write!(out, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        Ok(ChromeTrace { out, max_steps, steps: 0, first: true, named: Default::default() })
    }

    fn event(&mut self, json: &str) -> Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_all(json.as_bytes())?;
        Ok(())
    }

    pub fn step(&mut self, s: &StepRecord) -> Result<()> {
        if self.steps >= self.max_steps {
            return Ok(());
        }
        if self.named.insert(s.replica) {
            for (tid, name) in [(0, "steps"), (1, "kernel classes")] {
                let e = format!(
                    "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{tid},\"args\":{{\"name\":\"{name}\"}}}}",
                    s.replica
                );
                self.event(&e)?;
            }
        }
        self.steps += 1;
        let e = format!(
            "{{\"ph\":\"X\",\"name\":\"step\",\"pid\":{},\"tid\":0,\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"seqs\":{},\"tokens\":{}}}}}",
            s.replica, s.start_us, s.cost.total_us, s.num_seqs, s.num_tokens
        );
        self.event(&e)?;
        let mut t = s.start_us;
        for (class, us) in s.cost.classes() {
            if us <= 0.0 {
                continue;
            }
            let e = format!("{{\"ph\":\"X\",\"name\":\"{class}\",\"pid\":{},\"tid\":1,\"ts\":{t:.3},\"dur\":{us:.3}}}", s.replica);
            self.event(&e)?;
            t += us;
        }
        Ok(())
    }

    /// Closes the JSON; returns the number of steps written.
    pub fn finish(mut self) -> Result<u64> {
        write!(self.out, "]}}")?;
        self.out.flush()?;
        Ok(self.steps)
    }
}
