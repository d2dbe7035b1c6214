//! The evaluator backed by the discrete-event simulator: one engine per replica with the
//! candidate's limits, KV blocks from the memory plan, step times from the predictor.
//!
//! Disaggregated candidates run two simulations: the prefill pool computes each prompt and
//! one token; the KV cache then travels to the decode pool (prompt tokens x KV bytes per
//! token per GPU over one GPU's link, NVLink when both pools fit in one node, else the
//! scale-out network; every GPU of a replica sends its own shard in parallel); the decode
//! pool admits the request with its prompt already in KV and generates every output token.

use crate::sim::kv::KvLayout;
use super::candidate::Candidate;
use super::evaluate::{served_fraction, Evaluator, Outcome, Quantiles, StopRule};
use crate::hardware::GpuSpec;
use crate::kernels::memory;
use crate::model::ModelConfig;
use crate::perf::host::HostOverhead;
use crate::perf::efficiency::KernelModel;
use crate::perf::predictor::Predictor;
use crate::perf::{SeqWork, StepCost, StepTimeModel, Tier};
use crate::sim::engine::EngineParams;
use crate::sim::metrics::Histogram;
use crate::sim::record::{RequestRecord, SimObserver, StepRecord};
use crate::sim::router::RouterKind;
use crate::sim::reject::Rejection;
use crate::sim::{self, SimConfig};
use crate::workload::{RequestSource, RequestSpec, Sharing, WorkloadSpec};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};

pub struct SimEvaluator {
    pub model: ModelConfig,
    /// Every GPU a candidate may name, by id.
    pub gpus: BTreeMap<String, GpuSpec>,
    /// Scheduler policy and defaults; each candidate overrides the two limits.
    pub engine: EngineParams,
    pub tier: Tier,
    pub router: RouterKind,
    /// CPU-side step costs of the engine (as `simulate` uses them).
    pub host: HostOverhead,
    /// How served tokens spread over MoE experts (`simulate --moe-routing`).
    pub served_routing: crate::kernels::cost::Routing,
}

fn quantiles(h: &Histogram, pct: f64) -> Quantiles {
    let q = |p: f64| if h.count() == 0 { f64::NAN } else { h.quantile(p) * 1e-3 };
    Quantiles { p50: q(0.5), p90: q(0.9), p99: q(0.99), at_slo: q(pct / 100.0) }
}

/// Watches a run: the most sequences in one step, latency histograms of finished requests,
/// rejections, every record when `keep`, and the early-stop rule.
#[derive(Default)]
struct Watch {
    peak_seqs: u32,
    keep: bool,
    records: Vec<RequestRecord>,
    ttft_us: Histogram,
    tpot_us: Histogram,
    e2e_us: Histogram,
    output_tokens: u64,
    last_finish_s: f64,
    /// (arrival_s, finish_s) of every finished request, for `served_fraction`.
    arrival_finish_s: Vec<(f64, f64)>,
    rejected: BTreeMap<Rejection, u64>,
    stop: Option<StopRule>,
    ttft_misses: u64,
    e2e_misses: u64,
    stopped: bool,
}

impl SimObserver for Watch {
    fn on_request(&mut self, r: &RequestRecord) -> Result<()> {
        if self.keep {
            self.records.push(r.clone());
        }
        if let Some(reason) = r.rejected {
            *self.rejected.entry(reason).or_default() += 1;
            return Ok(());
        }
        self.ttft_us.add(r.ttft_ms * 1e3);
        self.e2e_us.add(r.e2e_ms * 1e3);
        if let Some(t) = r.tpot_ms {
            self.tpot_us.add(t * 1e3);
        }
        self.output_tokens += r.output_tokens as u64;
        self.last_finish_s = self.last_finish_s.max(r.finish_s);
        self.arrival_finish_s.push((r.arrival_s, r.finish_s));
        if let Some(rule) = self.stop {
            self.ttft_misses += rule.ttft_ms.is_some_and(|l| r.ttft_ms > l) as u64;
            self.e2e_misses += rule.e2e_ms.is_some_and(|l| r.e2e_ms > l) as u64;
            if self.ttft_misses.max(self.e2e_misses) > rule.allowed_misses {
                self.stopped = true;
                bail!("stopped: a latency target can no longer be met");
            }
        }
        Ok(())
    }
    fn on_step(&mut self, s: &StepRecord) -> Result<()> {
        self.peak_seqs = self.peak_seqs.max(s.num_seqs);
        Ok(())
    }
}

/// The workload's requests with one output token each (the prefill pool's share).
struct PrefillShare {
    inner: Box<dyn RequestSource>,
    outputs: HashMap<u64, u32>,
}
impl RequestSource for PrefillShare {
    fn next_request(&mut self) -> Result<Option<RequestSpec>> {
        let Some(mut r) = self.inner.next_request()? else { return Ok(None) };
        self.outputs.insert(r.id, r.output_tokens);
        r.output_tokens = 1;
        r.prefix_tokens = r.prefix_tokens.min(r.prompt_tokens);
        Ok(Some(r))
    }
}

/// Requests from a list already in arrival order.
struct Listed(std::vec::IntoIter<RequestSpec>);
impl RequestSource for Listed {
    fn next_request(&mut self) -> Result<Option<RequestSpec>> {
        Ok(self.0.next())
    }
}

/// Decode-pool timing: a sequence entering with several new tokens carries KV computed by
/// the prefill pool, so its step costs one decode token at its full context.
struct ReceivedKv<'a>(&'a dyn StepTimeModel);

fn as_decode(seqs: &[SeqWork]) -> Vec<SeqWork> {
    seqs.iter().map(|s| SeqWork { new_tokens: 1, cached_tokens: s.cached_tokens + s.new_tokens - 1 }).collect()
}
impl StepTimeModel for ReceivedKv<'_> {
    fn step_time(&self, seqs: &[SeqWork]) -> StepCost {
        self.0.step_time(&as_decode(seqs))
    }
    fn step_time_from_idle(&self, seqs: &[SeqWork]) -> StepCost {
        self.0.step_time_from_idle(&as_decode(seqs))
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn request_path_us(&self) -> f64 {
        self.0.request_path_us()
    }
    fn idle_wake_us(&self) -> f64 {
        self.0.idle_wake_us()
    }
}

/// The prefill pool of a disaggregated deployment hands its requests to the decode pool, not to
/// the clients: no client path there (the decode pool's answers carry it).
struct InsidePool<'a>(&'a dyn StepTimeModel);
impl StepTimeModel for InsidePool<'_> {
    fn step_time(&self, seqs: &[SeqWork]) -> StepCost {
        self.0.step_time(seqs)
    }
    fn step_time_from_idle(&self, seqs: &[SeqWork]) -> StepCost {
        self.0.step_time_from_idle(seqs)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn idle_wake_us(&self) -> f64 {
        self.0.idle_wake_us()
    }
}

impl SimEvaluator {
    /// Evaluator for `model` on `gpus` under `engine`, with that engine's host overhead.
    pub fn new(model: ModelConfig, gpus: &[GpuSpec], engine: EngineParams, tier: Tier, router: RouterKind) -> Result<SimEvaluator> {
        let host = HostOverhead::for_engine(&engine.name)?;
        let gpus = gpus.iter().map(|g| (g.id.clone(), g.clone())).collect();
        Ok(SimEvaluator { model, gpus, engine, tier, router, host, served_routing: crate::kernels::cost::Routing::SERVED_DEFAULT })
    }

    /// The engine's host terms for a host of this speed (`HostOverhead::at_speed`).
    pub fn with_host_speed(mut self, speed: &crate::perf::host::HostSpeed) -> Result<SimEvaluator> {
        self.host = self.host.at_speed(speed)?;
        Ok(self)
    }

    /// Prices MoE experts for `routing` instead of uniform routing (`KernelModel::with_served_routing`).
    pub fn with_served_routing(mut self, routing: crate::kernels::cost::Routing) -> SimEvaluator {
        self.served_routing = routing;
        self
    }

    fn gpu(&self, id: &str) -> Result<&GpuSpec> {
        self.gpus.get(id).ok_or_else(|| anyhow!("candidate names GPU '{id}' that the planner did not load"))
    }

    /// Engine, KV blocks and predictor of one replica of `c`.
    fn replica_setup(&self, c: &Candidate, workload: &WorkloadSpec) -> Result<(EngineParams, u32, Predictor)> {
        let gpu = self.gpu(&c.gpu)?;
        let engine = EngineParams {
            max_num_seqs: c.limits.max_num_seqs,
            max_num_batched_tokens: c.limits.max_num_batched_tokens,
            // Without shared prefixes no lookup can hit, so the cache changes nothing but
            // costs hashing on every block: leave it off (same run, faster).
            prefix_caching: self.engine.prefix_caching && shares_prefixes(workload),
            ..self.engine.clone()
        };
        let dep = c.replica();
        let plan = memory::plan(&self.model, gpu, &dep, engine.gpu_memory_utilization, engine.max_num_batched_tokens as u64, engine.buffers())?;
        let blocks = engine.unpinned_pool_pages(&self.model, gpu, &dep, &plan)?;
        // The same construction as `simulate`: the engine's libraries, unfused ops, launches,
        // CUDA-graph padding and captures (capped at the pool's pages), async scheduling.
        let km = KernelModel::load(gpu, self.tier)?.with_served_routing(self.served_routing);
        let kv_cap_tokens = blocks as u64 * engine.block_size as u64;
        let pred = Predictor::for_engine(&self.model, gpu, &dep, km, &engine, self.host.clone(), kv_cap_tokens)?;
        Ok((engine, blocks, pred))
    }

    fn config(&self, engine: EngineParams, blocks: u32, dp: u64, pp: u64) -> SimConfig {
        SimConfig {
            kv_layout: KvLayout::of(&self.model, engine.block_size),
            engine,
            num_gpu_blocks: blocks,
            max_model_len: self.model.max_context.min(u32::MAX as u64) as u32,
            dp: dp as u32,
            pp: pp as u32,
            router: self.router,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
        }
    }

    fn colocated(&self, c: &Candidate, workload: &WorkloadSpec, pct: f64, stop: Option<StopRule>) -> Result<Outcome> {
        let (engine, blocks, pred) = self.replica_setup(c, workload)?;
        let cfg = self.config(engine, blocks, c.dep.dp, c.dep.pp);
        let mut source = workload.build()?;
        let mut w = Watch { stop, ..Watch::default() };
        match sim::run(&cfg, &pred, source.as_mut(), None, &mut w) {
            Ok(_) => {}
            Err(_) if w.stopped => {}
            Err(e) => return Err(e),
        }
        check_rejections(&w.rejected, &cfg)?;
        Ok(Outcome {
            ttft_ms: quantiles(&w.ttft_us, pct),
            tpot_ms: quantiles(&w.tpot_us, pct),
            e2e_ms: quantiles(&w.e2e_us, pct),
            requests: w.e2e_us.count(),
            output_tokens_per_s: if w.last_finish_s > 0.0 { w.output_tokens as f64 / w.last_finish_s } else { 0.0 },
            peak_running_seqs: w.peak_seqs,
            predicted_by: pred.describe(),
            stopped_early: w.stopped,
            served_fraction: served_fraction(&w.arrival_finish_s),
        })
    }

    fn disaggregated(&self, c: &Candidate, prefill: u64, decode: u64, workload: &WorkloadSpec, pct: f64) -> Result<Outcome> {
        let gpu = self.gpu(&c.gpu)?;
        let (engine, blocks, pred) = self.replica_setup(c, workload)?;
        // Prefill pool: prompts and their first token.
        let mut share = PrefillShare { inner: workload.build()?, outputs: HashMap::new() };
        let mut done = Watch { keep: true, ..Watch::default() };
        let cfg = self.config(engine.clone(), blocks, prefill, c.dep.pp);
        sim::run(&cfg, &InsidePool(&pred), &mut share, None, &mut done).context("prefill pool")?;
        check_rejections(&done.rejected, &cfg).context("prefill pool")?;
        // Decode pool: each request arrives once its KV has landed.
        let mut arrivals: Vec<(f64, RequestRecord)> =
            std::mem::take(&mut done.records).into_iter().map(|r| (r.finish_s + kv_transfer_s(&self.model, c, gpu, r.prompt_tokens), r)).collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.id.cmp(&b.1.id)));
        let mut origin: HashMap<u64, f64> = HashMap::with_capacity(arrivals.len());
        let mut max_prompt = 0u32;
        let specs: Vec<RequestSpec> = arrivals
            .iter()
            .map(|(t, r)| {
                origin.insert(r.id, r.arrival_s);
                max_prompt = max_prompt.max(r.prompt_tokens);
                RequestSpec {
                    id: r.id,
                    arrival_s: *t,
                    prompt_tokens: r.prompt_tokens,
                    output_tokens: share.outputs[&r.id],
                    prefix_group: None,
                    prefix_tokens: 0,
                }
            })
            .collect();
        // A received prompt needs no compute, so it must not be chunked by the token budget.
        let budget = engine.max_num_batched_tokens.max(max_prompt.saturating_add(engine.max_num_seqs));
        let cfg = self.config(EngineParams { max_num_batched_tokens: budget, ..engine }, blocks, decode, c.dep.pp);
        let mut decoded = Watch { keep: true, ..Watch::default() };
        sim::run(&cfg, &ReceivedKv(&pred), &mut Listed(specs.into_iter()), None, &mut decoded).context("decode pool")?;
        check_rejections(&decoded.rejected, &cfg).context("decode pool")?;
        let (mut ttft, mut tpot, mut e2e) = (Histogram::default(), Histogram::default(), Histogram::default());
        let (mut tokens, mut end_s) = (0u64, 0.0f64);
        let mut arrival_finish_s = Vec::with_capacity(decoded.records.len());
        for r in &decoded.records {
            let arrived = origin[&r.id];
            arrival_finish_s.push((arrived, r.finish_s));
            ttft.add((r.arrival_s + r.ttft_ms * 1e-3 - arrived) * 1e6);
            e2e.add((r.finish_s - arrived) * 1e6);
            if let Some(t) = r.tpot_ms {
                tpot.add(t * 1e3);
            }
            tokens += r.output_tokens as u64;
            end_s = end_s.max(r.finish_s);
        }
        Ok(Outcome {
            ttft_ms: quantiles(&ttft, pct),
            tpot_ms: quantiles(&tpot, pct),
            e2e_ms: quantiles(&e2e, pct),
            requests: decoded.records.len() as u64,
            output_tokens_per_s: if end_s > 0.0 { tokens as f64 / end_s } else { 0.0 },
            peak_running_seqs: done.peak_seqs.max(decoded.peak_seqs),
            predicted_by: pred.describe(),
            stopped_early: false,
            served_fraction: served_fraction(&arrival_finish_s),
        })
    }
}

/// Seconds to move `prompt_tokens` of KV from a prefill replica to a decode replica of `c`:
/// each GPU sends its shard over its own link, NVLink when all of `c` fits in one node,
/// otherwise the scale-out network.
pub fn kv_transfer_s(model: &ModelConfig, c: &Candidate, gpu: &GpuSpec, prompt_tokens: u32) -> f64 {
    let bytes = memory::kv_bytes_per_token_per_gpu(model, &c.replica()) * prompt_tokens as f64;
    let link_bytes_per_s = if c.total_gpus() <= gpu.interconnect.gpus_per_node as u64 {
        gpu.scaleup_bytes_per_s()
    } else {
        gpu.interconnect.scaleout_gbps_per_dir * 1e9
    };
    bytes / link_bytes_per_s
}

/// Whether requests of `w` can share KV (prefix groups, sessions, or a replayed trace that
/// may name groups).
pub fn shares_prefixes(w: &WorkloadSpec) -> bool {
    w.trace.is_some() || w.sharing != Sharing::None
}

/// A rejected request means the candidate cannot serve the workload at all.
fn check_rejections(rejected: &BTreeMap<Rejection, u64>, cfg: &SimConfig) -> Result<()> {
    if rejected.is_empty() {
        return Ok(());
    }
    bail!("requests rejected: {}", crate::sim::reject::describe(rejected, cfg, ", "))
}

impl Evaluator for SimEvaluator {
    fn evaluate(&self, c: &Candidate, workload: &WorkloadSpec, pct: f64) -> Result<Outcome> {
        self.evaluate_or_stop(c, workload, pct, None)
    }

    /// Colocated runs stop early; disaggregated ones (two chained runs) run to the end.
    fn evaluate_or_stop(&self, c: &Candidate, workload: &WorkloadSpec, pct: f64, stop: Option<StopRule>) -> Result<Outcome> {
        match c.disagg {
            None => self.colocated(c, workload, pct, stop),
            Some(s) => self.disaggregated(c, s.prefill_replicas, s.decode_replicas, workload, pct),
        }
    }
}
