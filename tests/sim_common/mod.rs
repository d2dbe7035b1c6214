//! Helpers shared by the simulator tests: a transparent step-time model, a recording
//! observer and small configurations.
#![allow(dead_code)]

use kernelsight::perf::{SeqWork, StepCost, StepTimeModel};
use kernelsight::sim::engine::{EngineParams, Policy};
use kernelsight::sim::record::{RequestRecord, SimObserver, StepRecord};
use kernelsight::sim::router::RouterKind;
use kernelsight::sim::{self, Outcome, SimConfig};
use kernelsight::workload::{RequestSource, RequestSpec};
use std::sync::Mutex;

/// Step time = 100 us + 2 us per new token + 0.01 us per cached token attended, so expected
/// times can be computed by hand. Records every batch it is asked about.
#[derive(Default)]
pub struct Affine {
    pub batches: Mutex<Vec<Vec<SeqWork>>>,
}

impl Affine {
    pub fn time_us(seqs: &[SeqWork]) -> f64 {
        100.0 + seqs.iter().map(|s| 2.0 * s.new_tokens as f64 + 0.01 * s.cached_tokens as f64).sum::<f64>()
    }
}

impl StepTimeModel for Affine {
    fn step_time(&self, seqs: &[SeqWork]) -> StepCost {
        assert!(!seqs.is_empty() && seqs.iter().all(|s| s.new_tokens >= 1), "precondition: {seqs:?}");
        self.batches.lock().unwrap().push(seqs.to_vec());
        let mut c = StepCost::default();
        c.add_class("host", 100.0);
        c.add_class("gemm", Self::time_us(seqs) - 100.0);
        c
    }
    fn describe(&self) -> String {
        "affine test model".into()
    }
}

#[derive(Default)]
pub struct Collect {
    pub records: Vec<RequestRecord>,
    pub step_starts_us: Vec<f64>,
}

impl SimObserver for Collect {
    fn on_request(&mut self, r: &RequestRecord) -> anyhow::Result<()> {
        self.records.push(r.clone());
        Ok(())
    }
    fn on_step(&mut self, s: &StepRecord) -> anyhow::Result<()> {
        self.step_starts_us.push(s.start_us);
        Ok(())
    }
}

pub struct VecSource(pub std::vec::IntoIter<RequestSpec>);
impl RequestSource for VecSource {
    fn next_request(&mut self) -> anyhow::Result<Option<RequestSpec>> {
        Ok(self.0.next())
    }
}

pub fn req(id: u64, arrival_s: f64, prompt: u32, output: u32) -> RequestSpec {
    RequestSpec { id, arrival_s, prompt_tokens: prompt, output_tokens: output, prefix_group: None, prefix_tokens: 0 }
}

pub fn engine(policy: Policy) -> EngineParams {
    let name = match policy {
        Policy::Continuous => "vllm",
        Policy::PrefillFirst => "sglang",
        Policy::Static => "static",
        Policy::DecodeFirst => "hf",
    };
    EngineParams::load(name).unwrap()
}

pub fn config(engine: EngineParams, num_gpu_blocks: u32) -> SimConfig {
    SimConfig {
        engine,
        num_gpu_blocks,
        kv_layout: Default::default(),
        max_model_len: 1 << 20,
        dp: 1,
        pp: 1,
        router: RouterKind::RoundRobin,
        slo_ttft_ms: None,
        slo_tpot_ms: None,
    }
}

pub fn run(cfg: &SimConfig, reqs: Vec<RequestSpec>, concurrency: Option<u32>) -> (Outcome, Collect, Affine) {
    let model = Affine::default();
    let mut obs = Collect::default();
    let o = sim::run(cfg, &model, &mut VecSource(reqs.into_iter()), concurrency.map(sim::ClosedLoop::clients), &mut obs).unwrap();
    (o, obs, model)
}
