//! Replays a measured run in the simulator with the profile of the engine that ran it, and the
//! simulator's batch for one logged step.

use super::traces::{TraceEngine, TraceModel, TraceRun, TraceStep};
use crate::deployment::Deployment;
use crate::hardware::load_gpu;
use crate::perf::efficiency::KernelModel;
use crate::perf::graphs::GraphPadding;
use crate::perf::host::HostOverhead;
use crate::perf::predictor::Predictor;
use crate::perf::{SeqWork, StepTimeModel, Tier};
use crate::plan::evaluate::served_fraction;
use crate::quantile::quantile;
use crate::sim::SimConfig;
use crate::sim::engine::EngineParams;
use crate::sim::record::{RequestRecord, SimObserver};
use crate::sim::router::RouterKind;
use crate::sim::summary::Summary;
use crate::workload::{RequestSource, RequestSpec};
use anyhow::Result;
use std::collections::BTreeMap;

/// The engine profile a run used, with the run's own settings: `vllm` for vLLM's runs; for
/// transformers', `hf` eager or `hf-cudagraph` with the run's padding (and the profile's graph
/// key, which the run record does not hold).
pub(crate) fn engine_for(run: &TraceRun) -> Result<EngineParams> {
    if run.engine == TraceEngine::Vllm {
        let mut engine = EngineParams::load("vllm")?;
        engine.block_size = run.block_size;
        engine.max_num_batched_tokens = run.max_batch_tokens;
        engine.prefix_caching = run.prefix_sharing;
        engine.max_num_seqs = run.max_num_seqs.unwrap_or(engine.max_num_seqs);
        engine.async_scheduling = run.async_scheduling.unwrap_or(engine.async_scheduling);
        return Ok(engine);
    }
    let mut engine = EngineParams::load(if run.graphs.is_some() { "hf-cudagraph" } else { "hf" })?;
    // The run records its padding; the graph key and the replay gap are the engine profile's.
    let (key, gap) = engine.cuda_graphs.map_or((None, None), |g| (g.seqlen_k_pow2_min, g.replay_gap_per_kernel_ns));
    engine.cuda_graphs = run.graphs.map(|g| GraphPadding { seqlen_k_pow2_min: key, replay_gap_per_kernel_ns: gap, ..g });
    engine.block_size = run.block_size;
    engine.max_num_batched_tokens = run.max_batch_tokens;
    engine.prefix_caching = run.prefix_sharing;
    Ok(engine)
}

pub fn predictor_for(model: &TraceModel, run: &TraceRun, tier: Tier, host: HostOverhead) -> Result<Predictor> {
    let gpu = load_gpu(&model.gpu)?;
    let dep = Deployment { tp: run.tp, ..Deployment::default() };
    Predictor::for_engine(&model.config, &gpu, &dep, KernelModel::load(&gpu, tier)?, &engine_for(run)?, host, run.kv_cap_tokens)
}

/// A logged step as the simulator's batch: the step's requests sharing its query tokens and
/// its KV read evenly (packed attention and the token kernels depend on the totals only).
pub fn logged_step_batch(s: &TraceStep) -> Vec<SeqWork> {
    let n = s.num_requests.max(1) as u64;
    (0..n)
        .map(|i| SeqWork {
            new_tokens: (s.q_tokens / n + u64::from(i < s.q_tokens % n)).max(1) as u32,
            cached_tokens: (s.kv_read / n + u64::from(i < s.kv_read % n)) as u32,
        })
        .collect()
}

/// Collects the simulated requests of a replay.
#[derive(Default)]
struct Finished(Vec<RequestRecord>);

impl SimObserver for Finished {
    fn on_request(&mut self, r: &RequestRecord) -> Result<()> {
        self.0.push(r.clone());
        Ok(())
    }
}

struct VecSource(std::vec::IntoIter<RequestSpec>);

impl RequestSource for VecSource {
    fn next_request(&mut self) -> Result<Option<RequestSpec>> {
        Ok(self.0.next())
    }
}

/// Evictions the engine made in a run (soft resets summed over its requests), where recorded.
pub fn measured_evictions(run: &TraceRun) -> Option<u64> {
    run.requests.iter().map(|r| r.soft_resets.map(u64::from)).sum()
}

/// A run as the simulator replayed it.
pub struct Replayed {
    pub metrics: BTreeMap<&'static str, f64>,
    /// Every finished request's TTFT (ms), in no particular order.
    pub ttft_ms: Vec<f64>,
    /// The step-time model, described.
    pub describe: String,
    /// Requests preempted (evicted and recomputed) in the simulation.
    pub preemptions: u64,
}

/// Replays one run with its engine's profile and returns the predicted metrics.
pub fn replay(model: &TraceModel, run: &TraceRun, tier: Tier, host: &HostOverhead) -> Result<Replayed> {
    let p = predictor_for(model, run, tier, host.clone())?;
    let engine = engine_for(run)?;
    let kv_layout = crate::sim::kv::KvLayout::of(&model.config, engine.block_size);
    let cfg = SimConfig {
        engine,
        // The harness's cache: `blocks_per_group` blocks for each of the model's KV groups, in
        // one pool.
        num_gpu_blocks: run.blocks_per_group * kv_layout.groups(),
        kv_layout,
        max_model_len: model.config.max_context.min(u32::MAX as u64) as u32,
        dp: 1,
        pp: 1,
        router: RouterKind::RoundRobin,
        slo_ttft_ms: None,
        slo_tpot_ms: None,
    };
    // Requests in the order they were sent (a closed loop sends them in file order).
    let mut source = VecSource(run.sent.clone().into_iter());
    let mut finished = Finished::default();
    let closed = run.clients.map(|clients| crate::sim::ClosedLoop { clients, turnaround_us: run.turnaround_s.unwrap_or(0.0) * 1e6 });
    let outcome = crate::sim::run(&cfg, &p, &mut source, closed, &mut finished)?;
    let s = Summary::new(&outcome, &cfg, p.describe());
    // TTFT, TPOT and throughput from the simulated requests with the same quantile and
    // definitions as the measured side (`measured_metrics`); ITL from the simulator's histogram.
    let done: Vec<&RequestRecord> = finished.0.iter().filter(|r| r.rejected.is_none()).collect();
    let ttft: Vec<f64> = done.iter().map(|r| r.ttft_ms).collect();
    let tpot: Vec<f64> = done.iter().filter_map(|r| r.tpot_ms).collect();
    let end_s = done.iter().map(|r| r.finish_s).fold(0.0, f64::max);
    let tokens: u64 = done.iter().map(|r| r.output_tokens as u64).sum();
    let metrics = BTreeMap::from([
        ("ttft_p50", quantile(&ttft, 0.5)),
        ("ttft_p90", quantile(&ttft, 0.9)),
        ("tpot_p50", quantile(&tpot, 0.5)),
        ("tpot_p90", quantile(&tpot, 0.9)),
        ("itl_p50", s.itl_ms.p50),
        ("itl_p90", s.itl_ms.p90),
        ("throughput", tokens as f64 / end_s),
        ("served_fraction", served_fraction(&done.iter().map(|r| (r.arrival_s, r.finish_s)).collect::<Vec<_>>())),
    ]);
    Ok(Replayed { metrics, ttft_ms: ttft, describe: p.describe(), preemptions: outcome.rec.preemptions })
}

