//! What a run records: per-request records (streamed out, not kept) and constant-memory
//! aggregates (histograms, time series, counters).

use super::metrics::{Histogram, Series};
use crate::perf::StepCost;
use serde::Serialize;
use std::collections::BTreeMap;

/// One finished or rejected request. Times in milliseconds from its arrival unless `_s`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    pub id: u64,
    pub replica: u32,
    pub arrival_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    pub queue_ms: f64,
    pub ttft_ms: f64,
    /// (E2E - TTFT) / (output tokens - 1); None for one-token answers.
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    pub finish_s: f64,
    pub preemptions: u32,
    /// Why the request was not served (None when it finished).
    pub rejected: Option<super::reject::Rejection>,
    #[serde(skip)]
    pub client: u32,
    /// When the engine handed the answer out (us, before the path back to the client).
    #[serde(skip)]
    pub out_us: f64,
}

/// One engine step, for traces.
#[derive(Debug, Clone, Copy)]
pub struct StepRecord<'a> {
    pub replica: u32,
    pub start_us: f64,
    pub cost: &'a StepCost,
    pub num_seqs: u32,
    pub num_tokens: u32,
}

/// Receives records as the run goes (CSV writers, traces, progress bars).
pub trait SimObserver {
    fn on_request(&mut self, _r: &RequestRecord) -> anyhow::Result<()> {
        Ok(())
    }
    fn on_step(&mut self, _s: &StepRecord) -> anyhow::Result<()> {
        Ok(())
    }
}

/// An observer that ignores everything.
pub struct NoObserver;
impl SimObserver for NoObserver {}

#[derive(Debug, Default)]
pub struct Recorder {
    pub ttft_us: Histogram,
    pub tpot_us: Histogram,
    pub itl_us: Histogram,
    pub e2e_us: Histogram,
    pub queue_us: Histogram,
    pub series: Series,
    pub completed: u64,
    pub rejected: BTreeMap<super::reject::Rejection, u64>,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub preemptions: u64,
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub class_us: [f64; 7],
    pub steps: u64,
    pub step_tokens: u64,
    pub step_seqs: u64,
    pub kv_peak_frac: f64,
    pub last_finish_us: f64,
    /// Requests meeting every SLO given.
    pub good: u64,
    pub slo_ttft_us: Option<f64>,
    pub slo_tpot_us: Option<f64>,
    /// Records produced since the event loop last drained them.
    pub finished: Vec<RequestRecord>,
    itl_run: (f64, u64),
}

impl Recorder {
    pub fn new(slo_ttft_us: Option<f64>, slo_tpot_us: Option<f64>) -> Recorder {
        Recorder { slo_ttft_us, slo_tpot_us, ..Default::default() }
    }

    /// Inter-token latencies come in runs of equal values (a decode batch): add them as one.
    #[inline]
    pub fn itl(&mut self, v_us: f64) {
        if self.itl_run.0 == v_us {
            self.itl_run.1 += 1;
        } else {
            self.flush_itl();
            self.itl_run = (v_us, 1);
        }
    }

    pub fn flush_itl(&mut self) {
        let (v, n) = self.itl_run;
        self.itl_us.add_n(v, n);
        self.itl_run = (0.0, 0);
    }

    pub fn step(&mut self, cost: &StepCost, seqs: usize, tokens: u64) {
        self.steps += 1;
        self.step_seqs += seqs as u64;
        self.step_tokens += tokens;
        for (acc, (_, us)) in self.class_us.iter_mut().zip(cost.classes()) {
            *acc += us;
        }
    }

    pub fn reject(&mut self, reason: super::reject::Rejection, mut rec: RequestRecord) {
        rec.rejected = Some(reason);
        *self.rejected.entry(reason).or_default() += 1;
        self.finished.push(rec);
    }

    pub fn finish(&mut self, rec: RequestRecord) {
        self.completed += 1;
        self.ttft_us.add(rec.ttft_ms * 1e3);
        self.e2e_us.add(rec.e2e_ms * 1e3);
        self.queue_us.add(rec.queue_ms * 1e3);
        if let Some(t) = rec.tpot_ms {
            self.tpot_us.add(t * 1e3);
        }
        let ok_ttft = self.slo_ttft_us.is_none_or(|s| rec.ttft_ms * 1e3 <= s);
        let ok_tpot = self.slo_tpot_us.is_none_or(|s| rec.tpot_ms.is_none_or(|t| t * 1e3 <= s));
        if ok_ttft && ok_tpot {
            self.good += 1;
        }
        self.prompt_tokens += rec.prompt_tokens as u64;
        self.series.at(rec.finish_s).completed += 1;
        self.last_finish_us = self.last_finish_us.max(rec.finish_s * 1e6);
        self.finished.push(rec);
    }
}
