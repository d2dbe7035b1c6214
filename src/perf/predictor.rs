//! Step-time predictor: expands a batch into kernels (`kernels::graph`), times each with a
//! kernel-time model, and adds host overhead. Token-count-dependent kernels (GEMMs, norms,
//! collectives) are memoized by (tokens, sequences); attention is timed per step.

use super::graphs::{CudaGraphs, GraphPadding};
use super::host::{CaptureLoad, HostOverhead, StepLoad};
use super::{KernelTimeModel, SeqWork, StepCost, StepTimeModel, Tier};
use crate::deployment::Deployment;
use crate::hardware::GpuSpec;
use crate::kernels::graph::{attention_kernels, engine_step_kernels, max_seqlen_k, packed_lengths, packed_sdpa_kernels, split_modules, token_kernels, AttentionImpl, KernelInstance};
use crate::model::ModelConfig;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The kernel-time model for `tier` on `gpu` (calibrated where `calibration/` has fitted
/// models, falling back to cross-gen and then roofline per op), and a note on any fallback.
pub fn kernel_model_for(gpu: &GpuSpec, tier: Tier) -> anyhow::Result<(Arc<dyn KernelTimeModel>, Option<String>)> {
    let km = super::efficiency::KernelModel::load(gpu, tier)?;
    let note = if km.warnings().is_empty() { None } else { Some(km.warnings().join("; ")) };
    Ok((Arc::new(km), note))
}

/// One row of a step's kernel table.
#[derive(Debug, Clone, Serialize)]
pub struct TimedKernel {
    pub instance: KernelInstance,
    pub sol: super::sol::Sol,
    /// Predicted time of one launch.
    pub predicted_us: f64,
}

pub struct Predictor {
    pub model: ModelConfig,
    pub gpu: GpuSpec,
    pub dep: Deployment,
    pub host: HostOverhead,
    pub attention_impl: AttentionImpl,
    kernel_model: Arc<dyn KernelTimeModel>,
    /// Token-dependent kernels' cost at their tables' rates, kernel launch count, and the
    /// GEMMs the power cap applies to, by (tokens, sequences, tokens routed to experts).
    token_cache: Mutex<HashMap<(u64, u64, u64), TokenCost>>,
    /// CUDA graphs over padded shapes (None: eager or unpadded engines).
    graphs: Option<CudaGraphs>,
    /// Ops the engine runs as several small elementwise kernels, with their kernel counts.
    unfused: BTreeMap<crate::schema::Op, u32>,
    /// Ops the engine launches as several kernels but that are timed as one (launch counts).
    launches_per_op: BTreeMap<crate::schema::Op, u32>,
    /// Aten ops the engine's Python dispatches per instance of an op, by op and library
    /// (`EngineParams::host_ops`); ops not listed count their launches.
    host_ops: BTreeMap<(crate::schema::Op, Option<&'static str>), u32>,
    /// The engine runs q/k/v, gate/up and the q/k norms as separate modules (`EngineParams::separate_modules`).
    separate_modules: bool,
    /// `EngineParams::decode_batched_experts`.
    decode_batched_experts: bool,
    /// The host prepares step n+1 while the GPU runs step n (`EngineParams::async_scheduling`).
    async_scheduling: bool,
    /// `EngineParams::piecewise_graph_max_tokens`.
    piecewise_graph_max_tokens: Option<u64>,
    /// `EngineParams::kv_cache_write` and `step_prep_kernels`.
    kv_cache_write: bool,
    step_prep_kernels: u32,
    /// The experts library was measured with the graph's padding rows in (see `step_tokens`).
    experts_padded: bool,
    /// The model's KV cache layer groups per kind [full, sliding, linear] (host bookkeeping
    /// runs per group) and its sliding window.
    cache_groups: [u64; 3],
    sliding_window: u64,
    /// Eager packed-SDPA engines: the (query, key) shapes cuDNN has built a plan for so far
    /// (None: the engine pads shapes into CUDA graphs, or runs no cuDNN SDPA).
    sdpa_plans: Option<Mutex<HashSet<(u64, u64)>>>,
    /// Dense bf16 GEMMs run no faster than the GPU holds at its power limit (`perf::power_cap`);
    /// None: not measured for this GPU's die, or the roofline tier.
    sustained_gemm: Option<super::power_cap::PowerCap>,
}

/// The token-count kernels of a step: their cost at the tables' rates, their launches, each
/// power-capped GEMM's (time at the tables' rate, FLOPs), all launches of it together, and the
/// other kernels' tensor-core work (`Kernels::tensor_flops`).
#[derive(Clone)]
struct TokenCost {
    cost: StepCost,
    dispatches: Dispatches,
    capped_gemms: Arc<[(f64, f64)]>,
    tensor_flops: f64,
    /// Some capped GEMM runs faster than the back-to-back rate at the tables' rate (else the
    /// cap cannot bind and the step's other FLOPs need not be counted).
    cap_can_bind: bool,
}

/// A step's kernel launches (what a CUDA-graph capture records) and the aten ops its Python
/// dispatches (what an eager engine's host pays for: `StepLoad::host_ops`).
#[derive(Clone, Copy, Default)]
struct Dispatches {
    launches: u64,
    host_ops: u64,
}

impl std::ops::Add for Dispatches {
    type Output = Dispatches;
    fn add(self, o: Dispatches) -> Dispatches {
        Dispatches { launches: self.launches + o.launches, host_ops: self.host_ops + o.host_ops }
    }
}

/// What `Predictor::add_kernels` collects besides the cost: the power-capped GEMMs (time at
/// the tables' rate, FLOPs) and the other kernels' FLOPs in bf16-equivalents (tensor-core work
/// that draws power like a GEMM's: attention's matmuls, FP8 GEMMs at half).
#[derive(Default)]
struct Kernels {
    capped_gemms: Vec<(f64, f64)>,
    tensor_flops: f64,
}

/// A step's GPU work before host time: its cost (power cap applied), launches, host load,
/// the host's own launch time, and the bf16 GEMM rate the cap set (None: no cap, or it does
/// not bind in this step).
struct GpuStep {
    cost: StepCost,
    launches: u64,
    load: StepLoad,
    launch_us: f64,
    gemm_tflops: Option<f64>,
}

impl Predictor {
    /// Builds a predictor for `tier`. Until calibrated models exist every tier falls back to
    /// the roofline model; `describe()` says which model is in use.
    pub fn new(model: &ModelConfig, gpu: &GpuSpec, dep: &Deployment, tier: Tier) -> anyhow::Result<Predictor> {
        dep.validate()?;
        let (km, _note) = kernel_model_for(gpu, tier)?;
        Ok(Predictor::with_kernel_model(model, gpu, dep, km))
    }

    pub fn with_kernel_model(model: &ModelConfig, gpu: &GpuSpec, dep: &Deployment, km: Arc<dyn KernelTimeModel>) -> Predictor {
        let sustained_gemm = super::power_cap::shipped_rates()
            .and_then(|rates| super::power_cap::power_cap(gpu, km.tier(), &rates))
            .expect("calibration/power/sustained_gemm.toml is checked by perf::power_cap's tests");
        Predictor {
            model: model.clone(),
            gpu: gpu.clone(),
            dep: dep.clone(),
            host: HostOverhead::default(),
            attention_impl: AttentionImpl::PerSequence,
            kernel_model: km,
            token_cache: Mutex::new(HashMap::new()),
            graphs: None,
            unfused: Default::default(),
            launches_per_op: Default::default(),
            host_ops: Default::default(),
            separate_modules: false,
            decode_batched_experts: false,
            async_scheduling: false,
            piecewise_graph_max_tokens: None,
            kv_cache_write: false,
            step_prep_kernels: 0,
            experts_padded: false,
            sdpa_plans: None,
            sustained_gemm,
            cache_groups: model.kv_cache_groups_by_kind(),
            sliding_window: model.max_sliding_window(),
        }
    }

    pub fn with_host_overhead(mut self, host: HostOverhead) -> Self {
        self.host = host;
        self
    }

    pub fn with_attention_impl(mut self, attention_impl: AttentionImpl) -> Self {
        self.attention_impl = attention_impl;
        self
    }

    /// The predictor an engine profile implies: its kernel libraries (`kernel_backends`),
    /// attention implementation and CUDA-graph padding (`kv_cap_tokens`: KV cache size in
    /// tokens per layer group), with `host` as its host overhead.
    pub fn for_engine(
        model: &ModelConfig,
        gpu: &GpuSpec,
        dep: &Deployment,
        km: super::efficiency::KernelModel,
        engine: &crate::sim::engine::EngineParams,
        host: HostOverhead,
        kv_cap_tokens: u64,
    ) -> anyhow::Result<Predictor> {
        dep.validate()?;
        let km = km.with_op_backends(&engine.op_backends()?).with_named_libraries(engine.named_ops()?)?;
        // An unfused op whose engine library the kernel model has measured is timed as that
        // library; its pieces still count as launches.
        let (measured, unfused): (BTreeMap<_, _>, BTreeMap<_, _>) =
            engine.unfused_ops()?.into_iter().partition(|(op, _)| km.engine_library(*op, dep.act_dtype_for_elementwise()).is_some());
        // Experts measured with this engine's graph padding rows are timed at the real tokens.
        let experts_padded = engine.cuda_graphs.is_some()
            && km.engine_library(crate::schema::Op::Moe, dep.weight_dtype).is_some_and(|c| c.starts_with(crate::calibrate::model::HF_PADDED_EXPERTS_BACKEND));
        let mut p = Predictor::with_kernel_model(model, gpu, dep, Arc::new(km)).with_host_overhead(host).with_attention_impl(engine.attention_impl);
        p.unfused = unfused;
        p.launches_per_op = engine.op_launches()?;
        p.launches_per_op.extend(measured);
        p.host_ops = engine.op_host_ops()?;
        p.separate_modules = engine.separate_modules;
        p.decode_batched_experts = engine.decode_batched_experts;
        p.async_scheduling = engine.async_scheduling;
        p.piecewise_graph_max_tokens = engine.piecewise_graph_max_tokens.map(u64::from);
        p.kv_cache_write = engine.kv_cache_write;
        p.step_prep_kernels = engine.step_prep_kernels;
        p.experts_padded = experts_padded;
        // Sink models run transformers' eager math attention instead of SDPA.
        if engine.cuda_graphs.is_none() && engine.attention_impl == AttentionImpl::PackedSdpa && !model.attention_sinks {
            p = p.with_sdpa_plans();
        }
        if let Some(pad) = engine.cuda_graphs {
            p = p.with_cuda_graphs(pad, engine.max_num_batched_tokens as u64, kv_cap_tokens);
        }
        Ok(p)
    }

    /// Pads steps as a CUDA-graph engine does (`max_q_tokens`: the step token budget;
    /// `kv_cap_tokens`: the KV cache size) and charges a graph capture, at the host model's
    /// `HostOverhead::capture_extra_us` the first time a padded shape is run. Makes the
    /// predictor stateful.
    pub fn with_cuda_graphs(mut self, padding: GraphPadding, max_q_tokens: u64, kv_cap_tokens: u64) -> Self {
        self.graphs = Some(CudaGraphs::new(padding, max_q_tokens, kv_cap_tokens));
        self
    }

    /// Charges `HostOverhead::sdpa_plan_us` the first time a packed attention shape runs (an
    /// eager engine on cuDNN's SDPA). Makes the predictor stateful.
    pub fn with_sdpa_plans(mut self) -> Self {
        self.sdpa_plans = Some(Mutex::new(HashSet::new()));
        self
    }

    fn attention(&self, seqs: &[SeqWork]) -> Vec<KernelInstance> {
        match self.attention_impl {
            AttentionImpl::PerSequence => attention_kernels(&self.model, &self.dep, seqs),
            AttentionImpl::PackedSdpa => packed_sdpa_kernels(&self.model, &self.dep, seqs, self.graphs.as_ref()),
        }
    }

    /// The graph a step replays: its padded query tokens and, for packed attention, the padded
    /// keys it reads and (where the engine keys by it) each attention type's padded longest key
    /// sequence.
    fn graph_key(&self, graphs: &CudaGraphs, seqs: &[SeqWork]) -> Vec<u64> {
        let (q, groups) = packed_lengths(&self.model, seqs, Some(graphs));
        let mut key = vec![q];
        if self.attention_impl == AttentionImpl::PackedSdpa {
            key.extend(groups.iter().map(|g| g.2));
            key.extend(max_seqlen_k(&self.model, seqs).into_iter().filter_map(|len| graphs.pad_seqlen_k(len)));
        }
        key
    }

    pub fn tier(&self) -> Tier {
        self.kernel_model.tier()
    }

    /// How served tokens spread over MoE experts in the kernel times (`--moe-routing`).
    pub fn served_routing(&self) -> crate::kernels::cost::Routing {
        self.kernel_model.served_routing()
    }

    pub fn kernel_us(&self, k: &crate::schema::Kernel) -> f64 {
        self.kernel_model.predict_us(k)
    }

    /// Query tokens a step runs (padded under CUDA graphs) and the tokens its MoE experts are
    /// timed at. The padding rows all carry one token id, so the router sends them to one set
    /// of top-k experts: the expert kernels read the weights of the experts the real tokens
    /// pick plus that one set, as if for `real + 1` tokens, unless the experts library was
    /// measured with such padding rows in (then: the real tokens). Non-MoE models: unused.
    pub fn step_tokens(&self, seqs: &[SeqWork]) -> (u64, u64) {
        let real: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
        let padded = self.graphs.as_ref().map_or(real, |g| g.pad_q(real));
        let routed = match (self.model.moe.is_some(), self.experts_padded) {
            (false, _) => padded,
            (true, true) => real,
            (true, false) => padded.min(real + 1),
        };
        (padded, routed)
    }

    /// The token-count kernels of a step of `tokens` (padded) query tokens of which `routed`
    /// reach the experts as distinct tokens.
    fn token_kernels_routed(&self, tokens: u64, seqs: u64, routed: u64) -> Vec<KernelInstance> {
        let mut kernels = token_kernels(&self.model, &self.dep, tokens, seqs);
        if self.separate_modules {
            kernels = split_modules(kernels, &self.model, &self.dep);
        }
        // A decode step (one new token per sequence) of an engine that runs its experts as
        // batched_mm there; one GPU's whole experts only (no tensor or expert parallelism).
        let batched = self.decode_batched_experts && tokens == seqs;
        for ki in kernels.iter_mut().filter(|ki| ki.kernel.op == crate::schema::Op::Moe) {
            ki.kernel.num_tokens = routed;
            if batched && ki.kernel.tp <= 1 && ki.kernel.ep <= 1 {
                ki.library = Some(crate::kernels::graph::BATCHED_EXPERTS_LIBRARY);
            }
        }
        kernels.extend(engine_step_kernels(&self.model, &self.dep, tokens, self.kv_cache_write, self.step_prep_kernels));
        kernels
    }

    /// Every kernel of one step with its SOL and predicted time (a bf16 GEMM no faster than
    /// the GPU holds at its power limit in this step).
    pub fn kernel_table(&self, seqs: &[SeqWork]) -> Vec<TimedKernel> {
        let gemm_tflops = self.gpu_step(seqs, self.async_scheduling).gemm_tflops;
        let (tokens, routed) = self.step_tokens(seqs);
        let mut kernels = self.token_kernels_routed(tokens, seqs.len() as u64, routed);
        kernels.extend(self.attention(seqs));
        kernels
            .into_iter()
            .map(|instance| {
                let sol = super::sol::sol_routed(&instance.kernel, &self.gpu, self.kernel_model.served_routing());
                let us = self.table_rate_us(&instance);
                let predicted_us = gemm_tflops.map_or(us, |r| super::power_cap::capped_us(&instance.kernel, us, r));
                TimedKernel { instance, sol, predicted_us }
            })
            .collect()
    }

    /// The power cap on bf16 GEMMs (None: none applies).
    pub fn sustained_gemm(&self) -> Option<&super::power_cap::PowerCap> {
        self.sustained_gemm.as_ref()
    }

    /// The rate the power limit holds this step's bf16 GEMMs to, where it binds on any of them.
    pub fn step_gemm_tflops(&self, seqs: &[SeqWork]) -> Option<f64> {
        self.gpu_step(seqs, self.async_scheduling).gemm_tflops
    }

    /// The bf16 GEMM rate the power limit allows in a step whose capped GEMMs (`gemms`: time at
    /// the tables' rate, FLOPs) run among `other_us` of other GPU work, `wall_of` turning GPU
    /// time into the step's wall time (host gaps idle the GPU). How the step fills its wall
    /// time sets the rate and the rate the wall time: a few rounds settle it (the rate moves by
    /// a few percent). Returns the rate and the GEMMs' time at it; None where no cap applies or
    /// none can bind.
    fn capped_gemm_rate(&self, gemms: &[(f64, f64)], other_us: f64, other_tensor_flops: f64, wall_of: impl Fn(f64) -> f64) -> Option<(f64, f64)> {
        let cap = self.sustained_gemm.as_ref()?;
        let gemm_us = |tflops: f64| gemms.iter().map(|&(us, flops)| us.max(flops / (tflops * 1e6))).sum::<f64>();
        // Slower than the cap at its tightest (decode steps): the cap cannot bind.
        let tightest = cap.sustained_tflops();
        if gemms.iter().all(|&(us, flops)| us >= flops / (tightest * 1e6)) {
            return None;
        }
        let flops = gemms.iter().map(|g| g.1).sum::<f64>() + other_tensor_flops;
        let mut tflops = cap.sustained_tflops();
        for _ in 0..4 {
            let gpu_us = other_us + gemm_us(tflops);
            // Tensor-core time at the rate, whichever kernel it is in; the rest of the GPU time
            // (memory-bound kernels, a memory-bound GEMM's remainder) counts as other work.
            let tensor_us = (flops / (tflops * 1e6)).min(gpu_us);
            tflops = cap.tflops_in(tensor_us, gpu_us - tensor_us, wall_of(gpu_us));
        }
        Some((tflops, gemm_us(tflops)))
    }

    /// One launch of `ki` at its kernel tables' rate (short bursts), by its own kernel library
    /// where the graph names one; an op the engine runs unfused costs its pieces, each an
    /// elementwise pass over the op's tensor.
    fn table_rate_us(&self, ki: &KernelInstance) -> f64 {
        if ki.library == Some(crate::kernels::graph::BATCHED_EXPERTS_LIBRARY) {
            return self.batched_experts_us(&ki.kernel);
        }
        if let Some(&n) = self.unfused.get(&ki.kernel.op) {
            let k = &ki.kernel;
            let elements_per_token = if k.op == crate::schema::Op::Rope { (k.num_heads + k.num_kv_heads) * k.head_dim } else { k.hidden };
            let pass = crate::schema::Kernel { num_tokens: k.num_tokens, hidden: elements_per_token, ..crate::schema::Kernel::new(crate::schema::Op::Add, k.dtype) };
            return n as f64 * self.kernel_model.predict_us(&pass);
        }
        match ki.library {
            Some(lib) => self.kernel_model.predict_us_in(&ki.kernel, lib),
            None => self.kernel_model.predict_us(&ki.kernel),
        }
    }

    /// Experts run as batched_mm (`EngineParams::decode_batched_experts`): the gather of each
    /// routed (token, expert) pair's gate, up and down weights (an index_select writing
    /// pairs x expert bytes) and the bmm over them, priced as one wide matrix-vector product per
    /// projection (m = 1, the pairs' weights side by side: the same bytes and FLOPs).
    fn batched_experts_us(&self, k: &crate::schema::Kernel) -> f64 {
        use crate::schema::{Kernel, Op};
        let pairs = k.num_tokens * k.topk;
        let expert_bytes = 3 * k.hidden * k.inter * k.dtype.bytes() as u64;
        let gather = Kernel { bytes: pairs * expert_bytes, ..Kernel::new(Op::Copy, k.dtype) };
        let gate_up = Kernel { m: 1, n: pairs * 2 * k.inter, k: k.hidden, ..Kernel::new(Op::Gemm, k.dtype) };
        let down = Kernel { m: 1, n: pairs * k.hidden, k: k.inter, ..Kernel::new(Op::Gemm, k.dtype) };
        self.kernel_model.predict_us_in(&gather, "torch_index_select") + self.kernel_model.predict_us(&gate_up) + self.kernel_model.predict_us(&down)
    }

    /// Kernel launches of `ki` in a step, an op the engine runs unfused counting each piece.
    fn launches(&self, ki: &KernelInstance) -> u64 {
        let op = &ki.kernel.op;
        ki.count * self.unfused.get(op).or_else(|| self.launches_per_op.get(op)).copied().unwrap_or(1) as u64
    }

    /// Aten ops the engine's Python dispatches for `ki` in a step: the profile's count for its
    /// op and library, else for its op, else its launches.
    fn host_ops(&self, ki: &KernelInstance) -> u64 {
        let op = ki.kernel.op;
        match ki.library.and_then(|l| self.host_ops.get(&(op, Some(l)))).or_else(|| self.host_ops.get(&(op, None))) {
            Some(&n) => ki.count * n as u64,
            None => self.launches(ki),
        }
    }

    /// Adds the kernels' time at their tables' rates to `cost`, except GEMMs the power cap
    /// applies to, which go to `out`; returns how many kernel launches they are (an op the
    /// engine runs unfused counts each piece) and how many aten ops the host dispatches.
    fn add_kernels(&self, cost: &mut StepCost, out: &mut Kernels, kernels: &[KernelInstance], count_flops: bool) -> Dispatches {
        let mut d = Dispatches::default();
        for ki in kernels {
            let us = self.table_rate_us(ki) * ki.count as f64;
            let flops = if count_flops && self.sustained_gemm.is_some() { crate::kernels::cost::flops(&ki.kernel) * ki.count as f64 } else { 0.0 };
            if self.sustained_gemm.is_some() && super::power_cap::is_capped(&ki.kernel) {
                out.capped_gemms.push((us, flops));
            } else {
                cost.add_class(ki.kernel.op.class(), us);
                out.tensor_flops += flops * self.gpu.peak_flops(crate::schema::Dtype::Bf16) / self.gpu.peak_flops(ki.kernel.dtype);
            }
            d = d + Dispatches { launches: self.launches(ki), host_ops: self.host_ops(ki) };
        }
        d
    }

    fn token_cost(&self, tokens: u64, seqs: u64, routed: u64) -> TokenCost {
        let key = (tokens, seqs, routed);
        if let Some(c) = self.token_cache.lock().expect("cache poisoned").get(&key) {
            return c.clone();
        }
        let (mut cost, mut k) = (StepCost::default(), Kernels::default());
        let dispatches = self.add_kernels(&mut cost, &mut k, &self.token_kernels_routed(tokens, seqs, routed), true);
        let cap_can_bind = self.sustained_gemm.as_ref().is_some_and(|cap| k.capped_gemms.iter().any(|&(us, flops)| us < flops / (cap.sustained_tflops() * 1e6)));
        let c = TokenCost { cost, dispatches, capped_gemms: k.capped_gemms.into(), tensor_flops: k.tensor_flops, cap_can_bind };
        self.token_cache.lock().expect("cache poisoned").insert(key, c.clone());
        c
    }
}

impl Predictor {
    /// Kernel launches of a step as the engine issues them (unfused pieces counted).
    pub fn step_launches(&self, seqs: &[SeqWork]) -> u64 {
        self.step_dispatches(seqs).launches
    }

    /// Aten ops the engine's Python dispatches in a step (`StepLoad::host_ops`).
    pub fn step_host_ops(&self, seqs: &[SeqWork]) -> u64 {
        self.step_dispatches(seqs).host_ops
    }

    fn step_dispatches(&self, seqs: &[SeqWork]) -> Dispatches {
        let (padded, routed) = self.step_tokens(seqs);
        let attention = self.attention(seqs).iter().fold(Dispatches::default(), |d, ki| d + Dispatches { launches: self.launches(ki), host_ops: self.host_ops(ki) });
        self.token_cost(padded, seqs.len() as u64, routed).dispatches + attention
    }

    /// What capturing the graph of a step of `kernels` launches involves: its launches, and
    /// the activations it adds to the graphs' shared memory pool (`pool_growth_tokens` query
    /// tokens x hidden x layers; see `CudaGraphs::capture`).
    pub fn capture_load(&self, pool_growth_tokens: u64, kernels: u64) -> CaptureLoad {
        CaptureLoad { kernels, activations: pool_growth_tokens * self.model.hidden * self.model.num_layers }
    }

    /// What the step asks of the host (`host_ops`: the aten ops it dispatches, `step_host_ops`).
    pub fn step_load(&self, seqs: &[SeqWork], host_ops: u64) -> StepLoad {
        let [full, sliding, _] = self.cache_groups;
        let read = |s: &SeqWork| s.cached_tokens as u64 + s.new_tokens as u64;
        let full_read: u64 = if full > 0 { seqs.iter().map(read).sum() } else { 0 };
        let sliding_read: u64 = if sliding > 0 { seqs.iter().map(|s| read(s).min(self.sliding_window)).sum() } else { 0 };
        let tokens: u64 = seqs.iter().map(|s| s.new_tokens as u64).sum();
        // Compiled piecewise graphs: only a step with prefill tokens leaves the full graph.
        let prefill = seqs.iter().any(|s| s.new_tokens > 1);
        let (piecewise_layers, eager_layers) = match self.piecewise_graph_max_tokens {
            Some(max) if prefill && tokens <= max => (self.model.num_layers, 0),
            Some(_) if prefill => (0, self.model.num_layers),
            _ => (0, 0),
        };
        StepLoad {
            piecewise_layers,
            eager_layers,
            layers: self.model.num_layers,
            tp_layers: if self.dep.tp > 1 { self.model.num_layers } else { 0 },
            host_ops,
            seqs: seqs.len() as u64,
            seq_groups: seqs.len() as u64 * self.cache_groups.iter().sum::<u64>().max(1),
            tokens,
            full_read_tokens: full_read * full,
            sliding_read_tokens: sliding_read * sliding,
        }
    }

    /// Whether the step's packed attention shape is new to cuDNN, so that its plan is built now
    /// (`HostOverhead::sdpa_plan_us`); registers it. Always false for engines without
    /// `sdpa_plans`. Call once per step, in run order.
    pub fn register_sdpa_plan(&self, seqs: &[SeqWork]) -> bool {
        let Some(plans) = &self.sdpa_plans else { return false };
        let (q, groups) = packed_lengths(&self.model, seqs, None);
        let kv = groups.first().map_or(0, |g| g.2);
        plans.lock().expect("plan set poisoned").insert((q, kv))
    }

    /// The step's cost and, if it captured a new CUDA graph, what the capture involved (always
    /// None without graphs).
    pub fn step_time_and_capture(&self, seqs: &[SeqWork]) -> (StepCost, Option<CaptureLoad>) {
        self.step_cost(seqs, self.async_scheduling)
    }

    /// `overlap_host`: the host work hides behind the GPU's step (async scheduling with a
    /// step in flight) rather than adding to it.
    fn step_cost(&self, seqs: &[SeqWork], overlap_host: bool) -> (StepCost, Option<CaptureLoad>) {
        let GpuStep { mut cost, launches, load, launch_us, .. } = self.gpu_step(seqs, overlap_host);
        let gpu_us = cost.total_us;
        let wall_us = self.wall_us(gpu_us, &load, launch_us, overlap_host);
        cost.add_class("host", wall_us - gpu_us);
        cost.launch_us = launch_us;
        if self.register_sdpa_plan(seqs) {
            cost.add_class("host", self.host.sdpa_plan_us);
        }
        let padded = self.step_tokens(seqs).0;
        let capture = self.graphs.as_ref().and_then(|g| g.capture(self.graph_key(g, seqs), padded)).map(|growth| self.capture_load(growth, launches));
        if let Some(c) = &capture {
            cost.add_class("host", self.host.capture_extra_us(gpu_us, c));
        }
        (cost, capture)
    }
}

impl Predictor {
    /// The step's GPU work, its power-capped GEMMs at the rate the step's wall time allows.
    fn gpu_step(&self, seqs: &[SeqWork], overlap_host: bool) -> GpuStep {
        let (padded, routed) = self.step_tokens(seqs);
        let TokenCost { mut cost, dispatches, capped_gemms, tensor_flops, cap_can_bind } = self.token_cost(padded, seqs.len() as u64, routed);
        let mut attention = Kernels::default();
        let dispatches = dispatches + self.add_kernels(&mut cost, &mut attention, &self.attention(seqs), cap_can_bind);
        let launches = dispatches.launches;
        let load = self.step_load(seqs, dispatches.host_ops);
        let launch_us = self.host.step_us(0.0, &load);
        let gemms = if attention.capped_gemms.is_empty() { capped_gemms } else { capped_gemms.iter().chain(&attention.capped_gemms).copied().collect() };
        let tensor_flops = tensor_flops + attention.tensor_flops;
        let capped = self.capped_gemm_rate(&gemms, cost.total_us, tensor_flops, |gpu_us| self.wall_us(gpu_us, &load, launch_us, overlap_host));
        let gemm_us = capped.map_or_else(|| gemms.iter().map(|g| g.0).sum(), |c| c.1);
        cost.add_class("gemm", gemm_us);
        if let Some(gap_ns) = self.graphs.as_ref().and_then(|g| g.padding.replay_gap_per_kernel_ns) {
            cost.add_class("graph_idle", gap_ns as f64 * 1e-3 * launches as f64);
        }
        GpuStep { cost, launches, load, launch_us, gemm_tflops: capped.map(|c| c.0) }
    }

    /// Overlapped host work hides behind the GPU's step (and the GPU waits for it when it is
    /// longer); otherwise the host's share adds to the step.
    fn wall_us(&self, gpu_us: f64, load: &StepLoad, launch_us: f64, overlap_host: bool) -> f64 {
        if overlap_host {
            gpu_us.max(launch_us)
        } else {
            self.host.step_us(gpu_us, load)
        }
    }
}

impl StepTimeModel for Predictor {
    fn step_time(&self, seqs: &[SeqWork]) -> StepCost {
        self.step_time_and_capture(seqs).0
    }

    fn step_time_from_idle(&self, seqs: &[SeqWork]) -> StepCost {
        self.step_cost(seqs, false).0
    }

    fn describe(&self) -> String {
        match &self.sustained_gemm {
            Some(cap) => format!(
                "{}; bf16 GEMMs at most {:.0} TFLOPS at the power limit back to back, up to {:.0} with idle time in the step ({})",
                self.kernel_model.describe(),
                cap.sustained_tflops(),
                cap.tflops_at(0.0),
                cap.from
            ),
            None => self.kernel_model.describe(),
        }
    }

    fn request_path_us(&self) -> f64 {
        self.host.request_path_us
    }

    fn idle_wake_us(&self) -> f64 {
        self.host.idle_wake_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;

    fn llama() -> (ModelConfig, GpuSpec) {
        (ModelConfig::load("llama-3.1-8b").unwrap(), load_gpu("h200_sxm").unwrap())
    }

    /// The predictor of a shipped engine profile, one GPU, no host time.
    fn for_profile(m: &ModelConfig, g: &GpuSpec, profile: &str, tier: Tier, kv_tokens: u64) -> Predictor {
        let engine = crate::sim::engine::EngineParams::load(profile).unwrap();
        let km = super::super::efficiency::KernelModel::load(g, tier).unwrap();
        Predictor::for_engine(m, g, &Deployment::default(), km, &engine, HostOverhead::zero(), kv_tokens).unwrap()
    }

    #[test]
    fn generate_decode_steps_run_the_experts_as_batched_mm() {
        // transformers' generate gathers each token's top-k experts' weights in decode steps and
        // multiplies them by one bmm: the experts' time grows with tokens x top-k and moves at
        // least read + write + read of those weights; continuous batching keeps grouped_mm, which
        // reads each active expert once, and so does a generate prefill.
        let m = ModelConfig::load("mixtral-8x7b-v0.1").unwrap();
        let g = load_gpu("h200_sxm").unwrap();
        let (generate, cb) = (for_profile(&m, &g, "hf-generate", Tier::Target, 1 << 16), for_profile(&m, &g, "hf", Tier::Target, 1 << 16));
        let experts_us = |p: &Predictor, seqs: &[SeqWork]| -> f64 {
            p.kernel_table(seqs).iter().filter(|k| k.instance.kernel.op == crate::schema::Op::Moe).map(|k| k.predicted_us * k.instance.count as f64).sum()
        };
        let decode = |b: usize| vec![SeqWork { new_tokens: 1, cached_tokens: 512 }; b];
        let (one, sixteen) = (experts_us(&generate, &decode(1)), experts_us(&generate, &decode(16)));
        let expert_bytes = 3.0 * m.hidden as f64 * m.moe.as_ref().unwrap().expert_inter as f64 * 2.0;
        let floor_us = 3.0 * 16.0 * 2.0 * expert_bytes * m.num_layers as f64 / (g.memory.hbm_bandwidth_tbps * 1e6);
        assert!(sixteen >= floor_us && sixteen > 10.0 * one, "B=1 {one:.0} us, B=16 {sixteen:.0} us, floor {floor_us:.0} us");
        assert!(experts_us(&cb, &decode(16)) < 0.25 * sixteen, "continuous batching keeps grouped_mm");
        let prefill = [SeqWork { new_tokens: 16, cached_tokens: 0 }];
        assert_eq!(experts_us(&generate, &prefill), experts_us(&cb, &prefill), "a prefill step keeps grouped_mm");
    }

    #[test]
    fn a_long_prefill_steps_gemms_run_no_faster_than_the_power_limit_allows() {
        let m = ModelConfig::load("qwen3-14b").unwrap();
        let g = load_gpu("h100_sxm").unwrap();
        let dep = Deployment::default();
        let step = [SeqWork { new_tokens: 8192, cached_tokens: 0 }];
        let target = Predictor::new(&m, &g, &dep, Tier::Target).unwrap();
        let cap = target.sustained_gemm().cloned().unwrap();
        assert!(cap.from.contains("h100_sxm measured"), "{}", cap.from);
        // One long prefill step with no host time: GEMMs most of the wall time, so the rate sits
        // between the back-to-back one and the one measured with idle between steps.
        let tflops = target.gpu_step(&step, false).gemm_tflops.unwrap();
        // A decode step's GEMMs are memory-bound, far below the cap: it does not bind.
        assert!(target.step_gemm_tflops(&[SeqWork { new_tokens: 1, cached_tokens: 500 }; 8]).is_none());
        assert!(tflops >= cap.sustained_tflops() && tflops < cap.tflops_at(0.0), "{tflops}");
        let gemms: Vec<TimedKernel> = target.kernel_table(&step).into_iter().filter(|k| k.instance.kernel.op == crate::schema::Op::Gemm).collect();
        let floor = |k: &TimedKernel| k.sol.flops / (tflops * 1e6);
        assert!(gemms.iter().all(|k| k.predicted_us >= floor(k) * (1.0 - 1e-9)));
        // The tables price the MLP's 8192-row GEMMs faster than the power limit holds: the cap binds there.
        assert!(gemms.iter().any(|k| (k.predicted_us - floor(k)).abs() < 1e-6 * floor(k)), "no GEMM at the cap");
        // The baseline stays plain, and the step is faster at the tables' rates.
        assert!(Predictor::new(&m, &g, &dep, Tier::Roofline).unwrap().sustained_gemm().is_none());
        let uncapped = Predictor { sustained_gemm: None, ..Predictor::new(&m, &g, &dep, Tier::Target).unwrap() };
        assert!(uncapped.step_time(&step).total_us < target.step_time(&step).total_us);
    }

    #[test]
    fn host_time_idling_the_gpu_lets_a_steps_gemms_run_faster_under_the_power_limit() {
        let m = ModelConfig::load("qwen3-14b").unwrap();
        let g = load_gpu("h100_sxm").unwrap();
        let dep = Deployment::default();
        let step = [SeqWork { new_tokens: 4096, cached_tokens: 0 }];
        let busy = Predictor::new(&m, &g, &dep, Tier::Target).unwrap().with_host_overhead(HostOverhead::zero());
        let gpu_us = busy.step_time(&step).total_us;
        // The same step with as much host time again, the GPU idle meanwhile (no async scheduling).
        let idle = Predictor::new(&m, &g, &dep, Tier::Target).unwrap().with_host_overhead(HostOverhead { per_step_us: gpu_us, ..HostOverhead::zero() });
        let cap = busy.sustained_gemm().unwrap().clone();
        let (fast, slow) = (idle.gpu_step(&step, false).gemm_tflops.unwrap(), busy.gpu_step(&step, false).gemm_tflops.unwrap());
        assert!(fast > slow && fast <= cap.tflops_at(0.0) && slow >= cap.sustained_tflops(), "{fast} {slow}");
        assert!(idle.step_time(&step).gemm_us < busy.step_time(&step).gemm_us);
        // Overlapped host work (async scheduling) hides behind the GPU: no idle, no relief.
        let overlapped = idle.gpu_step(&step, true).gemm_tflops.unwrap();
        assert!((overlapped - slow).abs() < 1e-4 * slow, "{overlapped} {slow}");
    }

    #[test]
    fn tensor_core_work_outside_the_gemms_draws_power_like_them() {
        let m = ModelConfig::load("qwen3-14b").unwrap();
        let p = Predictor::new(&m, &load_gpu("h100_sxm").unwrap(), &Deployment::default(), Tier::Target).unwrap();
        let cap = p.sustained_gemm().unwrap().clone();
        // 20 ms of GEMMs priced at 800 TFLOPS by the tables, 10 ms of other kernels, no host.
        let gemms = [(20_000.0, 800e6 * 20_000.0)];
        let rate = |tensor_flops: f64| p.capped_gemm_rate(&gemms, 10_000.0, tensor_flops, |gpu_us| gpu_us).unwrap().0;
        // Memory-bound others (no FLOPs) relieve the limit partly; attention-like ones that keep
        // the tensor cores busy their whole 10 ms relieve nothing: the back-to-back rate.
        let (memory, tensor) = (rate(0.0), rate(cap.sustained_tflops() * 1e6 * 10_000.0));
        assert!(memory > cap.sustained_tflops() * 1.01, "{memory}");
        assert!((tensor - cap.sustained_tflops()).abs() < 1e-9 * tensor, "{tensor}");
    }

    #[test]
    fn engine_modules_are_timed_as_measured_where_measured_and_as_pieces_elsewhere() {
        let (m, g) = llama();
        let at = |tier| for_profile(&m, &g, "hf", tier, 98304);
        let (measured, pieces) = (at(Tier::Target), at(Tier::Roofline));
        let batch = [SeqWork { new_tokens: 1, cached_tokens: 500 }; 8];
        let norm = |p: &Predictor| p.kernel_table(&batch).into_iter().find(|t| t.instance.name.ends_with("input_norm")).unwrap();
        let pass = crate::schema::Kernel { num_tokens: 8, hidden: m.hidden, ..crate::schema::Kernel::new(crate::schema::Op::Add, Deployment::default().act_dtype_for_elementwise()) };
        // The roofline tier never measured transformers' RMSNorm: 9 elementwise passes.
        assert!((norm(&pieces).predicted_us - 9.0 * pieces.kernel_us(&pass)).abs() < 1e-9);
        // The H200 target tier has: the module's own time, not the passes'.
        let lib = measured.kernel_model.predict_us_in(&norm(&measured).instance.kernel, crate::calibrate::model::HF_MODULES_BACKEND);
        assert_eq!(norm(&measured).predicted_us, lib);
        assert_ne!(lib, 9.0 * measured.kernel_us(&pass));
        // Either way the engine launches the same kernels.
        assert_eq!(measured.step_launches(&batch), pieces.step_launches(&batch));
    }

    #[test]
    fn only_the_engine_whose_router_was_measured_is_timed_by_it() {
        let m = ModelConfig::load("qwen3-30b-a3b").unwrap();
        let g = load_gpu("h200_sxm").unwrap();
        let router_us = |engine: &str| {
            let t = for_profile(&m, &g, engine, Tier::Target, 98304).kernel_table(&[SeqWork { new_tokens: 1, cached_tokens: 500 }; 8]);
            t.into_iter().find(|k| k.instance.name.ends_with("router")).unwrap()
        };
        // vLLM's GEMM + fused top-k was never measured: the roofline, not transformers' chain.
        let vllm = router_us("vllm");
        let roofline = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap().kernel_us(&vllm.instance.kernel);
        assert_eq!(vllm.predicted_us, roofline);
        // transformers' router is the collector's torch chain, measured on this GPU.
        let hf = router_us("hf");
        let km = super::super::efficiency::KernelModel::load(&g, Tier::Target).unwrap();
        assert_eq!(hf.predicted_us, km.predict_us_with(&hf.instance.kernel, Some("torch")));
        assert!(hf.predicted_us > vllm.predicted_us);
    }

    #[test]
    fn vllms_sampler_is_timed_as_measured_and_grows_with_the_sequences_sampled() {
        let m = ModelConfig::load("qwen3-8b").unwrap();
        let g = load_gpu("h200_sxm").unwrap();
        let sampling = |engine: &str, seqs: usize| {
            for_profile(&m, &g, engine, Tier::Target, 98304).kernel_table(&vec![SeqWork { new_tokens: 1, cached_tokens: 2100 }; seqs]).into_iter().find(|k| k.instance.name == "sampling").unwrap()
        };
        // vLLM's Gumbel-max sampler over 151,936 logits: 24 and 178 us measured at 12 and 128
        // sequences (microbench/vllm_sampler.py), far above the one memory pass of its SOL.
        let (s12, s128) = (sampling("vllm", 12), sampling("vllm", 128));
        let km = super::super::efficiency::KernelModel::load(&g, Tier::Target).unwrap();
        assert_eq!(s12.predicted_us, km.predict_us_with(&s12.instance.kernel, Some("vllm/gumbel")));
        assert!(s128.predicted_us > 4.0 * s12.predicted_us && s12.predicted_us > 5.0 * s12.sol.sol_us, "{} {}", s12.predicted_us, s128.predicted_us);
        assert!((15.0..40.0).contains(&s12.predicted_us) && (120.0..260.0).contains(&s128.predicted_us), "{} {}", s12.predicted_us, s128.predicted_us);
    }

    #[test]
    fn decode_step_reads_all_weights_once() {
        let (m, g) = llama();
        let p = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        let table = p.kernel_table(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]);
        let gemm_bytes: f64 = table
            .iter()
            .filter(|t| t.instance.kernel.op == crate::schema::Op::Gemm)
            .map(|t| t.sol.bytes * t.instance.count as f64)
            .sum();
        // All linear weights except the embedding table: 8.03e9 - 128256*4096 params, 2 bytes each.
        let expected = (8.030e9 - 128256.0 * 4096.0) * 2.0;
        assert!((gemm_bytes / expected - 1.0).abs() < 0.01, "{gemm_bytes} vs {expected}");
    }

    #[test]
    fn step_time_is_order_independent_and_sums_classes() {
        let (m, g) = llama();
        let p = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        let a = [SeqWork { new_tokens: 512, cached_tokens: 0 }, SeqWork { new_tokens: 1, cached_tokens: 2000 }];
        let b = [a[1], a[0]];
        let (ca, cb) = (p.step_time(&a), p.step_time(&b));
        assert_eq!(ca, cb);
        let sum: f64 = ca.classes().iter().map(|c| c.1).sum();
        assert!((sum - ca.total_us).abs() < 1e-6);
        // More context makes decode slower.
        let longer = p.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 100_000 }]);
        let shorter = p.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]);
        assert!(longer.total_us > shorter.total_us);
    }

    #[test]
    fn tensor_parallel_adds_communication() {
        let (m, g) = llama();
        let dep = Deployment { tp: 2, ..Deployment::default() };
        let p = Predictor::new(&m, &g, &dep, Tier::Roofline).unwrap();
        let c = p.step_time(&[SeqWork { new_tokens: 256, cached_tokens: 0 }]);
        assert!(c.communication_us > 0.0);
        let p1 = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        assert!(p1.step_time(&[SeqWork { new_tokens: 256, cached_tokens: 0 }]).communication_us == 0.0);
    }

    #[test]
    fn a_replayed_graph_step_idles_the_gap_once_per_launched_kernel() {
        let m = ModelConfig::load("llama-3.1-8b").unwrap();
        let g = load_gpu("h200_sxm").unwrap();
        let with_gap = |ns: Option<u32>| {
            Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline)
                .unwrap()
                .with_cuda_graphs(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: Some(1024), replay_gap_per_kernel_ns: ns }, 8192, 98304)
        };
        let seqs = [SeqWork { new_tokens: 1, cached_tokens: 500 }; 4];
        let (none, gap) = (with_gap(None), with_gap(Some(500)));
        let launches = gap.step_launches(&seqs);
        assert!(launches >= 32 * 5, "{launches} launches for 32 layers");
        let (a, b) = (none.step_time(&seqs), gap.step_time(&seqs));
        assert!((b.total_us - a.total_us - 0.5 * launches as f64).abs() < 1e-6, "{} us for {launches} launches", b.total_us - a.total_us);
        assert!((b.graph_idle_us - 0.5 * launches as f64).abs() < 1e-6 && a.graph_idle_us == 0.0);
        assert_eq!(a.host_us, b.host_us);
        assert_eq!(a.gemm_us + a.attention_us + a.elementwise_us, b.gemm_us + b.attention_us + b.elementwise_us);
    }

    #[test]
    fn padded_moe_steps_route_the_padding_as_one_token() {
        let m = ModelConfig::load("mixtral-8x7b-v0.1").unwrap();
        let g = load_gpu("h200_sxm").unwrap();
        let p = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline)
            .unwrap()
            .with_cuda_graphs(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: Some(1024), replay_gap_per_kernel_ns: None }, 8192, 98304);
        let experts = |seqs: &[SeqWork]| {
            let t = p.kernel_table(seqs);
            let e = t.iter().find(|k| k.instance.kernel.op == crate::schema::Op::Moe).unwrap();
            let gemm = t.iter().find(|k| k.instance.name.ends_with("qkv_proj")).unwrap();
            (e.instance.kernel.num_tokens, gemm.instance.kernel.m)
        };
        // One decoding request: dense GEMMs run the 64 padded rows, the experts see 2 tokens.
        assert_eq!(experts(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]), (2, 64));
        // 64 real tokens fill the padded shape: no padding rows to route.
        assert_eq!(experts(&[SeqWork { new_tokens: 1, cached_tokens: 100 }; 64]), (64, 64));
        // The expert time follows the routed tokens, the dense time the padded ones.
        let one = p.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]);
        let full = p.step_time(&[SeqWork { new_tokens: 1, cached_tokens: 100 }; 64]);
        assert!(one.moe_us < full.moe_us, "{one:?} vs {full:?}");
        // (Only the logits GEMM, one row per sequence, differs between the two.)
        assert!((one.gemm_us - full.gemm_us).abs() < 0.01 * full.gemm_us, "{one:?} vs {full:?}");
        // Without padding the experts see the real tokens.
        let eager = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap();
        let unpadded = eager.kernel_table(&[SeqWork { new_tokens: 1, cached_tokens: 100 }]);
        assert_eq!(unpadded.iter().find(|k| k.instance.kernel.op == crate::schema::Op::Moe).unwrap().instance.kernel.num_tokens, 1);
    }

    #[test]
    fn only_vllm_steps_with_prompt_tokens_leave_the_full_graph_and_above_the_limit_all_graphs() {
        let (m, g) = llama();
        let engine = crate::sim::engine::EngineParams::load("vllm").unwrap();
        assert_eq!(engine.piecewise_graph_max_tokens, Some(512));
        let km = super::super::efficiency::KernelModel::load(&g, Tier::Roofline).unwrap();
        let host = HostOverhead { piecewise_launch_per_layer_us: 300.0, eager_launch_per_layer_us: 600.0, ..HostOverhead::zero() };
        let p = Predictor::for_engine(&m, &g, &Deployment::default(), km, &engine, host, 1 << 20).unwrap();
        let layers = m.num_layers;
        let decode = vec![SeqWork { new_tokens: 1, cached_tokens: 900 }; 64];
        let small_prefill = [SeqWork { new_tokens: 500, cached_tokens: 0 }];
        let mixed_large: Vec<SeqWork> = std::iter::once(SeqWork { new_tokens: 2000, cached_tokens: 0 }).chain(decode.iter().copied()).collect();
        let kinds = |s: &[SeqWork]| {
            let l = p.step_load(s, 0);
            (l.piecewise_layers, l.eager_layers)
        };
        assert_eq!(kinds(&decode), (0, 0));
        assert_eq!(kinds(&small_prefill), (layers, 0));
        assert_eq!(kinds(&mixed_large), (0, layers));
        // A tiny prefill on a small GPU load is host-bound: the step lasts the launch time.
        let t = p.step_time_from_idle(&[SeqWork { new_tokens: 16, cached_tokens: 0 }]).total_us;
        assert!(t >= 300.0 * layers as f64, "{t} us");
        // The transformers profiles have no such limit.
        let hf = crate::sim::engine::EngineParams::load("hf-cudagraph").unwrap();
        assert_eq!(hf.piecewise_graph_max_tokens, None);
    }

    #[test]
    fn vllm_steps_write_the_kv_cache_per_attention_layer_and_prepare_their_inputs() {
        let (m, g) = llama();
        let table = |profile: &str| for_profile(&m, &g, profile, Tier::Roofline, 1 << 20).kernel_table(&[SeqWork { new_tokens: 1, cached_tokens: 500 }; 12]);
        let vllm = table("vllm");
        let write: Vec<_> = vllm.iter().filter(|k| k.instance.name.ends_with("kv_cache_write")).collect();
        assert_eq!(write.iter().map(|k| k.instance.count).sum::<u64>(), m.num_layers);
        // 12 new tokens' keys and values of every KV head, bf16.
        assert_eq!(write[0].instance.kernel.bytes, 12 * 2 * m.num_kv_heads * m.head_dim * 2);
        assert_eq!(write[0].instance.library, Some(crate::kernels::graph::ENGINE_STEP_LIBRARY));
        let prep = vllm.iter().find(|k| k.instance.name == "step_input_prep").expect("input preparation kernels");
        assert_eq!(prep.instance.count, 20);
        assert!(prep.predicted_us > 0.0);
        // Profiles that do not set them (transformers') run none.
        assert!(!table("hf").iter().any(|k| k.instance.name.ends_with("kv_cache_write") || k.instance.name == "step_input_prep"));
    }

    #[test]
    fn async_scheduling_hides_host_work_behind_the_gpu_step_unless_the_engine_was_idle() {
        let (m, g) = llama();
        let dep = Deployment::default();
        let make = |per_step_us: f64, async_scheduling: bool| {
            let engine = crate::sim::engine::EngineParams { async_scheduling, ..crate::sim::engine::EngineParams::load("vllm").unwrap() };
            let km = super::super::efficiency::KernelModel::load(&g, Tier::Roofline).unwrap();
            let host = HostOverhead { per_step_us, ..HostOverhead::zero() };
            Predictor::for_engine(&m, &g, &dep, km, &engine, host, 98304).unwrap()
        };
        let seqs = [SeqWork { new_tokens: 1, cached_tokens: 500 }; 8];
        let at = |per_step_us: f64, async_scheduling: bool| make(per_step_us, async_scheduling).step_time(&seqs);
        let gpu = at(0.0, false).total_us;
        assert!(gpu > 100.0);
        // Serial: the host's share adds to the GPU's.
        assert!((at(0.5 * gpu, false).total_us - 1.5 * gpu).abs() < 1e-6 * gpu);
        // Overlapped: shorter host work is hidden, longer host work sets the step.
        assert!((at(0.5 * gpu, true).total_us - gpu).abs() < 1e-6 * gpu);
        assert!((at(2.0 * gpu, true).total_us - 2.0 * gpu).abs() < 1e-6 * gpu);
        // No step in flight to hide behind: the host's share adds again.
        assert!((make(0.5 * gpu, true).step_time_from_idle(&seqs).total_us - 1.5 * gpu).abs() < 1e-6 * gpu);
        let serial = make(0.5 * gpu, false);
        assert_eq!(serial.step_time(&seqs).total_us, serial.step_time_from_idle(&seqs).total_us);
    }

    #[test]
    fn eager_sdpa_engine_pays_a_cudnn_plan_once_per_attention_shape() {
        let (m, g) = llama();
        let host = HostOverhead { sdpa_plan_us: 40_000.0, ..HostOverhead::zero() };
        let base = || Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline).unwrap().with_host_overhead(host.clone()).with_attention_impl(AttentionImpl::PackedSdpa);
        let p = base().with_sdpa_plans();
        let step = |n: usize, cached: u32| vec![SeqWork { new_tokens: 1, cached_tokens: cached }; n];
        assert_eq!(p.step_time(&step(8, 500)).host_us, 40_000.0);
        assert_eq!(p.step_time(&step(8, 500)).host_us, 0.0, "the same shape reuses its plan");
        // A decode step later reads one more key per sequence: a new shape.
        assert_eq!(p.step_time(&step(8, 501)).host_us, 40_000.0);
        // Without plans (CUDA graphs, other attention): nothing charged.
        assert_eq!(base().step_time(&step(8, 500)).host_us, 0.0);
    }

    #[test]
    fn cuda_graph_engine_pays_a_capture_once_per_padded_shape() {
        let (m, g) = llama();
        let host = HostOverhead { graph_capture_us: 50_000.0, ..HostOverhead::zero() };
        let p = Predictor::new(&m, &g, &Deployment::default(), Tier::Roofline)
            .unwrap()
            .with_host_overhead(host)
            .with_attention_impl(AttentionImpl::PackedSdpa)
            .with_cuda_graphs(GraphPadding { q_tokens: 64, kv_tokens: 16384, seqlen_k_pow2_min: Some(1024), replay_gap_per_kernel_ns: None }, 8192, 98304);
        let step = |n: usize, cached: u32| vec![SeqWork { new_tokens: 1, cached_tokens: cached }; n];
        let (first, captured) = p.step_time_and_capture(&step(8, 500));
        assert!(captured.is_some());
        // The capture adds the host's capture cost (no per-layer launch time in this host).
        let gpu = first.total_us - first.host_us;
        assert!((first.host_us - 50_000.0).abs() < 1e-6, "{first:?}");
        // 8 x 900 cached tokens pad to the same 64 queries, 16384 KV tokens and 1024-key longest
        // sequence: same graph, same padded work.
        let (again, captured) = p.step_time_and_capture(&step(8, 900));
        assert!(captured.is_none() && again.host_us == 0.0);
        assert!((again.total_us - gpu).abs() < 1e-6);
        // So do 60 sequences (60 queries pad to 64).
        assert!(p.step_time_and_capture(&step(60, 200)).1.is_none());
        // One request growing past 1024 keys changes the key, at the same padded work.
        let (grown, captured) = p.step_time_and_capture(&[step(7, 500), step(1, 1100)].concat());
        assert!(captured.is_some() && (grown.total_us - grown.host_us - gpu).abs() < 1e-6, "{grown:?}");
        assert!(p.step_time_and_capture(&[step(7, 300), step(1, 1500)].concat()).1.is_none());
        // A longer KV read crosses the padding boundary: a new graph.
        assert!(p.step_time_and_capture(&step(8, 3000)).1.is_some());
        // Every graph so far ran 64 query tokens: only the first grew the shared pool.
        let wider = p.step_time_and_capture(&step(100, 500)).1.expect("128 queries: a new graph");
        assert_eq!(wider.activations, 64 * m.hidden * m.num_layers);
    }
}

