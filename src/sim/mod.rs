//! Discrete-event serving simulator: requests arrive, a router spreads them over data-parallel
//! replicas, each replica's scheduler forms batches, the step-time model says how long each
//! batch takes, and completions free KV blocks and produce tokens.
//!
//! Invariants (each guarded by a test): simulated time never goes back; every admitted request
//! finishes exactly once with exactly its output tokens, or is rejected with a reason; KV blocks
//! are never over-allocated and none are held at the end; same inputs give the same outputs.

pub mod engine;
pub mod events;
pub mod kv;
pub mod metrics;
pub mod record;
pub mod reject;
pub mod replica;
pub mod request;
pub mod router;
pub mod summary;

use crate::perf::StepTimeModel;
use crate::workload::RequestSource;
use anyhow::{bail, Result};
use engine::EngineParams;
use events::{Event, EventQueue};
use record::{Recorder, RequestRecord, SimObserver, StepRecord};
use replica::{HostTimeline, Replica};
use request::Req;
use router::{Router, RouterKind};

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub engine: EngineParams,
    /// KV pages per replica: blocks of `engine.block_size` tokens, one per KV group
    /// (`kv_layout`; for a model of one attention kind, one per block).
    pub num_gpu_blocks: u32,
    /// How a request's blocks spread over KV groups (sliding-window hybrids).
    pub kv_layout: kv::KvLayout,
    /// Longest sequence (prompt + output) the model serves.
    pub max_model_len: u32,
    /// Data-parallel replicas.
    pub dp: u32,
    /// Pipeline stages: up to `pp` batches in flight per replica.
    pub pp: u32,
    pub router: RouterKind,
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
}

impl SimConfig {
    /// Async scheduling pipelines the host's launch of the next step with the GPU's run of this
    /// one (`HostTimeline`); pipeline-parallel replicas keep the synchronous rule.
    pub fn async_pipeline(&self) -> bool {
        self.engine.async_scheduling && self.pp == 1
    }

    pub fn validate(&self) -> Result<()> {
        self.engine.validate()?;
        if self.num_gpu_blocks == 0 {
            bail!("the KV cache has no blocks (--num-gpu-blocks must be at least 1)");
        }
        if self.dp == 0 || self.pp == 0 {
            bail!("dp and pp must be at least 1");
        }
        if self.max_model_len == 0 {
            bail!("max model length must be at least 1");
        }
        for (name, v) in [("--slo-ttft-ms", self.slo_ttft_ms), ("--slo-tpot-ms", self.slo_tpot_ms)] {
            if let Some(v) = v {
                if !(v > 0.0 && v.is_finite()) {
                    bail!("{name} must be a positive number of milliseconds, got {v}");
                }
            }
        }
        Ok(())
    }
}

/// What a run leaves: the aggregates (requests themselves went to the observer).
pub struct Outcome {
    pub rec: Recorder,
    pub num_requests: u64,
    pub end_us: f64,
    /// Integral over time of the KV fraction in use, averaged over replicas (seconds).
    pub kv_frac_s: f64,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    model: &'a dyn StepTimeModel,
    q: EventQueue,
    replicas: Vec<Replica>,
    rec: Recorder,
    kv_frac_s: f64,
    idle_wake_us: f64,
}

impl Sim<'_> {
    fn kick(&mut self, r: u32, now_us: f64) {
        let rep = &mut self.replicas[r as usize];
        if !rep.kick_pending {
            rep.kick_pending = true;
            self.q.push(now_us, Event::Kick { replica: r });
        }
    }

    /// A request reached replica `r`: an idle engine starts its step `idle_wake_us` later, with
    /// whatever arrived by then; a busy one picks it up when its current step allows.
    fn arrived(&mut self, r: u32, now_us: f64) {
        let rep = &self.replicas[r as usize];
        let idle = rep.in_flight == 0 && rep.running.is_empty() && rep.waiting.len() == 1;
        self.kick(r, if idle { now_us + self.idle_wake_us } else { now_us });
    }

    /// Starts a step on replica `r` if a stage is free and there is work.
    fn try_start(&mut self, r: u32, now_us: f64, obs: &mut dyn SimObserver) -> Result<()> {
        let pp = self.cfg.pp;
        let rep = &mut self.replicas[r as usize];
        rep.kick_pending = false;
        if rep.in_flight >= pp || rep.stage_free_us > now_us {
            return Ok(());
        }
        // Nothing running and nothing in flight: the engine was idle, whatever the clock says.
        let was_idle = rep.in_flight == 0 && rep.running.is_empty();
        let async_pipeline = self.cfg.async_pipeline();
        // Async scheduling forms this step when the host turns to it (`HostTimeline`): arrivals
        // since then wait for the next step. From idle it takes everything; pipelined replicas
        // keep the synchronous rule.
        let launch_start_us = rep.host.launch_start_us(now_us);
        rep.admit_arrived_by_us = if !async_pipeline || was_idle { f64::INFINITY } else { launch_start_us };
        let mut tag = rep.schedule(&mut self.rec, now_us);
        if tag.is_none() && rep.in_flight == 0 && rep.has_work() {
            // A step that only preempted freed blocks: admission can go ahead now, of anything
            // waiting (the engine holds no step to have formed this one during).
            rep.admit_arrived_by_us = f64::INFINITY;
            tag = rep.schedule(&mut self.rec, now_us);
            if tag.is_none() {
                bail!(
                    "scheduler stalled on replica {r} at t={:.6} s: {} running, {} waiting, {} of {} KV blocks free",
                    now_us * 1e-6,
                    rep.running.len(),
                    rep.waiting.len(),
                    rep.pool.num_free(),
                    rep.pool.num_blocks()
                );
            }
        }
        let Some(tag) = tag else {
            // Nothing to launch: the engine hands out what it holds and idles.
            if rep.in_flight == 0 {
                rep.release_tokens(now_us, &mut self.rec);
                rep.host = HostTimeline::IDLE;
            }
            return Ok(());
        };
        let mut cost = if was_idle { self.model.step_time_from_idle(&rep.work) } else { self.model.step_time(&rep.work) };
        if !(cost.total_us > 0.0 && cost.total_us.is_finite()) {
            bail!("the step-time model returned {} us for a batch of {} sequences", cost.total_us, rep.work.len());
        }
        if async_pipeline {
            // The GPU cannot finish a step before the host has launched it; the step before it
            // hands its tokens out once both are done.
            let launch_end_us = launch_start_us + cost.launch_us;
            let wait_us = launch_end_us - now_us - cost.total_us;
            if wait_us > 0.0 {
                cost.total_us += wait_us;
                cost.host_us += wait_us;
            }
            let prev_out_us = match rep.held_since_us() {
                Some(done_us) => {
                    let out_us = launch_end_us.max(done_us);
                    rep.release_tokens(out_us, &mut self.rec);
                    out_us
                }
                None => f64::NEG_INFINITY,
            };
            rep.host = HostTimeline { launch_end_us, prev_out_us };
        }
        let t_us = cost.total_us;
        let tokens: u64 = rep.work.iter().map(|w| w.new_tokens as u64).sum();
        self.q.push(now_us + t_us, Event::StepDone { replica: r, batch: tag });
        rep.stage_free_us = now_us + t_us / pp as f64;
        if pp > 1 {
            self.q.push(rep.stage_free_us, Event::StageFree { replica: r });
        }
        let used_frac = rep.pool.num_used() as f64 / rep.pool.num_blocks() as f64;
        self.rec.kv_peak_frac = self.rec.kv_peak_frac.max(used_frac);
        let dp = self.cfg.dp as f64;
        // With pipelining, a replica's KV use is sampled once per stage interval.
        let interval_s = t_us / pp as f64 * 1e-6;
        self.kv_frac_s += used_frac * interval_s / dp;
        let b = self.rec.series.at(now_us * 1e-6);
        b.kv_used_frac_s += used_frac * interval_s / dp;
        b.busy_s += interval_s / dp;
        self.rec.step(&cost, rep.work.len(), tokens);
        obs.on_step(&StepRecord { replica: r, start_us: now_us, cost: &cost, num_seqs: rep.work.len() as u32, num_tokens: tokens as u32 })?;
        Ok(())
    }
}

/// A closed loop of clients: each sends its next request `turnaround_us` after its last one
/// ends (the time a real client takes to read the answer and send again; an engine that is
/// busy has started its next step by then, so the request waits for the one after).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClosedLoop {
    pub clients: u32,
    pub turnaround_us: f64,
}

impl ClosedLoop {
    /// Clients that send again the instant their answer ends.
    pub fn clients(clients: u32) -> ClosedLoop {
        ClosedLoop { clients, turnaround_us: 0.0 }
    }
}

/// Runs the whole workload. `closed`: a closed loop of clients (arrival times in the workload
/// are then ignored). Per-request records go to `obs` as requests end.
pub fn run(
    cfg: &SimConfig,
    model: &dyn StepTimeModel,
    source: &mut dyn RequestSource,
    closed: Option<ClosedLoop>,
    obs: &mut dyn SimObserver,
) -> Result<Outcome> {
    cfg.validate()?;
    let request_path_us = model.request_path_us();
    if !(request_path_us >= 0.0 && request_path_us.is_finite()) {
        bail!("the step-time model's request path must be a finite number of microseconds >= 0, got {request_path_us}");
    }
    let idle_wake_us = model.idle_wake_us();
    if !(idle_wake_us >= 0.0 && idle_wake_us.is_finite()) {
        bail!("the step-time model's idle wake-up must be a finite number of microseconds >= 0, got {idle_wake_us}");
    }
    let replicas = (0..cfg.dp)
        .map(|i| Replica::new(i, cfg.engine.clone(), cfg.num_gpu_blocks, cfg.kv_layout, request_path_us))
        .collect();
    let mut sim = Sim {
        cfg,
        model,
        q: EventQueue::default(),
        replicas,
        rec: Recorder::new(cfg.slo_ttft_ms.map(|v| v * 1e3), cfg.slo_tpot_ms.map(|v| v * 1e3)),
        kv_frac_s: 0.0,
        idle_wake_us,
    };
    let mut router = Router::new(cfg.router, cfg.dp);
    if let Some(c) = closed {
        if !(c.turnaround_us >= 0.0 && c.turnaround_us.is_finite()) {
            bail!("client turnaround must be a finite number of microseconds >= 0, got {}", c.turnaround_us);
        }
    }
    let concurrency = closed.map(|c| c.clients);
    match concurrency {
        Some(c) => {
            // The first wave goes out at the requests' own times: 0 for generated workloads; a
            // replayed serving client sends its burst one request after another.
            for client in 0..c {
                let Some(spec) = source.next_request()? else { break };
                if !(spec.arrival_s >= 0.0 && spec.arrival_s.is_finite()) {
                    bail!("request {} of a closed loop arrives at {} s; first-wave times must be finite and >= 0", spec.id, spec.arrival_s);
                }
                sim.q.push(spec.arrival_s * 1e6, Event::Arrival { spec, client });
            }
        }
        None => {
            if let Some(spec) = source.next_request()? {
                sim.q.push(spec.arrival_s * 1e6, Event::Arrival { spec, client: 0 });
            }
        }
    }
    let mut num_requests = 0u64;
    let mut arrived_tokens = 0u64;
    let mut finished = Vec::new();
    while let Some((now_us, ev)) = sim.q.pop() {
        match ev {
            Event::Arrival { spec, client } => {
                num_requests += 1;
                arrived_tokens += spec.prompt_tokens as u64 + spec.output_tokens as u64;
                if concurrency.is_none() {
                    if let Some(next) = source.next_request()? {
                        let t = next.arrival_s * 1e6;
                        if t < now_us {
                            bail!("request {} arrives at {} s, before the previous one; arrivals must be sorted", next.id, next.arrival_s);
                        }
                        sim.q.push(t, Event::Arrival { spec: next, client: 0 });
                    }
                }
                let r = router.pick(&spec, &sim.replicas);
                let rep = &mut sim.replicas[r as usize];
                if let Some(reason) = reject::Rejection::of(&spec, cfg, rep) {
                    sim.rec.reject(reason, RequestRecord {
                        id: spec.id,
                        replica: r,
                        arrival_s: now_us * 1e-6,
                        prompt_tokens: spec.prompt_tokens,
                        output_tokens: spec.output_tokens,
                        cached_tokens: 0,
                        queue_ms: f64::NAN,
                        ttft_ms: f64::NAN,
                        tpot_ms: None,
                        e2e_ms: f64::NAN,
                        finish_s: now_us * 1e-6,
                        preemptions: 0,
                        rejected: None,
                        client,
                        out_us: now_us,
                    });
                } else {
                    router.assigned(&spec, r);
                    let table = rep.table();
                    rep.waiting.push_back(Req::new(&spec, now_us, client, table));
                    sim.arrived(r, now_us);
                }
            }
            Event::StepDone { replica, batch } => {
                let rep = &mut sim.replicas[replica as usize];
                rep.complete(batch, now_us, &mut sim.rec);
                if !cfg.async_pipeline() {
                    // Synchronous engines hand the step's tokens out as it ends.
                    rep.release_tokens(now_us, &mut sim.rec);
                }
                sim.kick(replica, now_us);
            }
            Event::StageFree { replica } => sim.kick(replica, now_us),
            Event::Kick { replica } => {
                sim.try_start(replica, now_us, obs)?;
                // Every step computes at least one token; a run needing far more steps than it
                // has tokens is cycling (e.g. preempting and readmitting forever): stop, don't hang.
                if sim.rec.steps > 10_000 + 64 * arrived_tokens {
                    bail!(
                        "no progress: {} steps for {} tokens of {} requests by t={:.3} s ({} preemptions); the KV cache is too small for this engine's admission policy",
                        sim.rec.steps, arrived_tokens, num_requests, now_us * 1e-6, sim.rec.preemptions
                    );
                }
            }
        }
        if !sim.rec.finished.is_empty() {
            std::mem::swap(&mut finished, &mut sim.rec.finished);
            for r in finished.drain(..) {
                obs.on_request(&r)?;
                if let Some(c) = closed {
                    if let Some(spec) = source.next_request()? {
                        // The client sends again after it got the answer: handed out, then back
                        // through the path.
                        let at_us = r.out_us.max(now_us) + request_path_us + c.turnaround_us;
                        sim.q.push(at_us, Event::Arrival { spec, client: r.client });
                    }
                }
            }
        }
    }
    for rep in &sim.replicas {
        if rep.has_work() {
            bail!("simulation ended with {} running and {} waiting requests on replica {}", rep.running.len(), rep.waiting.len(), rep.idx);
        }
        if rep.pool.total_refs() != 0 {
            bail!("replica {} leaked KV blocks: {} references held at the end", rep.idx, rep.pool.total_refs());
        }
    }
    let end_us = sim.q.now_us();
    Ok(Outcome { rec: sim.rec, num_requests, end_us, kv_frac_s: sim.kv_frac_s })
}
