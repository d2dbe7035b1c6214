//! The fitted kernel-time model of one op family: a physical base time (a latency term plus SOL
//! over a constant efficiency; per link class for collectives) times a learned correction
//! `exp(gbdt(features))`. Predictions are never below SOL, so efficiency = SOL / predicted is
//! always in (0, 1].

use super::base::{Base, TwoResourceBase};
use super::dataset::{is_inner_validation, Measurement};
use super::features::{self, LinkClass};
use super::gbdt::{Gbdt, GbdtParams};
use crate::hardware::GpuSpec;
use crate::kernels::cost::Routing;
use crate::perf::roofline::RooflineParams;
use crate::perf::sol::Sol;
use crate::quantile::upper_median;
use crate::schema::{Kernel, Op};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Boosting with the tree count picked on an inner validation set of shapes
/// (`dataset::is_inner_validation`, `Gbdt::fit_early_stopped`): half the fixed count's step
/// with twice its trees at most (never more total shrinkage than the fixed 100 x 0.2: with 400
/// trees L40S's fp8-KV FlashInfer prefill shapes the inner set did not cover were predicted 72x
/// SOL), stopped `PATIENCE` trees past the inner set's best. Only where the inner set has
/// `MIN_ROWS` rows: on fewer its best count is noise (the collective families, tens of shapes
/// per GPU, got worse with it), and the fixed `GbdtParams` count stays.
mod early_stopping {
    pub const LEARNING_RATE: f64 = 0.1;
    pub const MAX_TREES: usize = 200;
    pub const PATIENCE: usize = 30;
    pub const MIN_ROWS: usize = 200;
}

/// How an op's time is predicted: the physical base times the learned correction, the base
/// alone, the two-resource base (elementwise libraries measured on GPUs of different DRAM
/// bytes per SM cycle; other rows the base alone), or the roofline form (SOL over the op's
/// median efficiency, with the launch floor); all but the first are chosen where the
/// correction did not transfer between the training GPUs (see `select`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Form {
    #[default]
    Learned,
    BaseOnly,
    TwoResource,
    Roofline,
}

impl Form {
    /// The name the calibration files use (`serde` kebab case).
    pub fn as_str(self) -> &'static str {
        match self {
            Form::Learned => "learned",
            Form::BaseOnly => "base-only",
            Form::TwoResource => "two-resource",
            Form::Roofline => "roofline",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpModel {
    pub op: Op,
    #[serde(default)]
    pub form: Form,
    /// The inner leave-one-GPU-out check that chose `form`, when one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inner_check: Option<super::select::InnerCheck>,
    /// Bases by link class (`scaleup`, `pcie`, `scaleout`) for collectives; `all` always.
    pub bases: BTreeMap<String, Base>,
    /// Elementwise ops: two-resource bases by kernel library (backend), where its training
    /// GPUs pin both coefficients (the `TwoResource` form).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub two_resource: BTreeMap<String, TwoResourceBase>,
    /// Elementwise libraries measured on GPUs of one balance whose large rows stay well below
    /// the streaming rate (`TwoResourceBase::fit_issue_bound`): their base in the `BaseOnly` and
    /// `TwoResource` forms (cross-gen; cleared for the other forms).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub issue_bound: BTreeMap<String, TwoResourceBase>,
    /// One-hot vocabulary of backend categories.
    pub backends: Vec<String>,
    /// Backend assumed when the caller names none: the most measured one.
    pub default_backend: String,
    pub features: Vec<String>,
    pub gbdt: Gbdt,
    /// Range of the training targets ln(measured / base): predictions are clamped to it, so a
    /// shape outside the training data never extrapolates past what was measured.
    pub y_range: (f64, f64),
    /// Collectives: the training targets' range per base key (link class and timing method),
    /// the clamp for that key's rows. Where several GPUs train, an eager-timed key (one of
    /// Vidur's cluster profiles) is listed only if at least `MIN_CORRECTION_GPUS` of them
    /// measured it; a row whose key is not listed gets no correction (the base alone): a
    /// correction seen on one cluster cannot be told apart from that cluster's identity, and a
    /// key never measured has no correction at all. None (older files): `y_range` for all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction_ranges: Option<BTreeMap<String, (f64, f64)>>,
    /// Eager-timed collective keys left out of `correction_ranges` because one training GPU
    /// measured them: that GPU and the key's range. The correction describes that GPU's
    /// cluster, so it applies to that GPU's rows alone (where `eager_transfer_us` starts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub own_corrections: BTreeMap<String, (String, (f64, f64))>,
    /// Eager-timed collective libraries (Vidur's cluster profiles) and the GPUs that measured
    /// each: where `eager_transfer_us` carries them from to a GPU that did not.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub library_gpus: BTreeMap<String, Vec<String>>,
    /// Median of SOL / measured over the op's training rows (the `Roofline` form's efficiency).
    #[serde(default = "one")]
    pub median_efficiency: f64,
    /// The `Roofline` form's floor per kernel library: the median time of its launch-bound
    /// training rows (`launch_floors_us`); libraries without such rows take the default floor.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub launch_floors_us: BTreeMap<String, f64>,
    pub train_rows: usize,
    pub train_gpus: Vec<String>,
    /// Models of the rows of another measurement path, by path, with bases, vocabulary and
    /// trees of their own so that neither path's corrections reach the other: MLA rows that
    /// time the whole module (`module`; this model holds the attention-core rows: their times
    /// differ by the projections and their kernels by vendor), and eager-timed collectives
    /// (`eager`; this model holds the benchmark-timed ones: Vidur's profiles are bimodal,
    /// 8 or 40 us at the same size on one H100 cluster, and trees sharing their size splits
    /// moved NCCL and custom all-reduce predictions by 2-5x). Empty for other ops.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_path: BTreeMap<String, OpModel>,
}

/// The measurement path of a row (`OpModel::by_path` key): `module` for MLA rows that time the
/// whole module, `eager` for collectives timed as the NCCL kernel of eager `torch.distributed`
/// calls (Vidur's cluster profiles), `eager_sinks` for attention timed as transformers' eager
/// math path with sinks (a chain of torch kernels over the materialised scores, 10-20x slower
/// than the fused kernels sharing the op), `packed_sdpa` for transformers' packed masked cuDNN
/// attention (flat in the query length up to ~512 tokens where the fused kernels grow, so in
/// the shared trees its off-grid query lengths swung 30 % between neighbours), `hf_experts` for
/// transformers' own experts forward (sort, histc, masks and gathers around the two grouped
/// GEMMs: ~20 kernels where the collector's pipeline has ~12), `hf_modules` for transformers'
/// eager RMSNorm, rotary and act * mul modules (5-10 torch kernels, up to 16x their fused
/// kernel's SOL), `fp8_block` for block-scaled FP8 experts (vLLM's Fp8MoEMethod kernels: in
/// the shared trees they moved the other MoE libraries' held-out median from 3.4 to 3.9 % and
/// priced L40S's bf16 Triton experts at 1-8 tokens 10x); None for the rows the model itself
/// holds.
fn model_path(op: Op, backend: &str) -> Option<&'static str> {
    if op.is_collective() && features::is_eager_kernel_timed(backend) {
        return Some("eager");
    }
    if let Some(&(_, _, path)) = ENGINE_LIBRARY_PATHS.iter().find(|(o, prefix, _)| *o == op && backend.starts_with(prefix)) {
        return Some(path);
    }
    features::mla_module_weights(op, backend).map(|_| "module")
}

/// The time a row's base scales: SOL, or for transformers' packed cuDNN attention the bound of
/// its busiest SM where that is longer (`perf::sol::tiled_attention_bound_us`): at 2-16 heads
/// the kernel runs a few CTAs over every key, and the time follows the keys per CTA, not SOL.
fn base_sol_us(op: Op, k: &Kernel, gpu: &GpuSpec, backend: &str, s: &Sol) -> f64 {
    if model_path(op, backend) == Some("packed_sdpa") {
        s.sol_us.max(crate::perf::sol::tiled_attention_bound_us(k, gpu, s.compute_us))
    } else {
        s.sol_us
    }
}

/// Libraries on a path of their own (`model_path`): (op, backend prefix, path). The transformers
/// engine's, measured on the H200 only (the collector's own torch._grouped_mm experts pipeline
/// joins transformers': the same grouped GEMMs, measured under three routings), and vLLM's
/// block-FP8 experts.
const ENGINE_LIBRARY_PATHS: [(Op, &str, &str); 10] = [
    (Op::AttnPrefill, EAGER_SINKS_BACKEND, "eager_sinks"),
    (Op::AttnPrefill, PACKED_SDPA_BACKEND, "packed_sdpa"),
    (Op::Moe, HF_EXPERTS_BACKEND, "hf_experts"),
    (Op::Moe, HF_PADDED_EXPERTS_BACKEND, "hf_experts"),
    (Op::Moe, "grouped_mm(torch._grouped_mm)", "hf_experts"),
    (Op::Moe, "vllm/fp8_block/", "fp8_block"),
    (Op::Rmsnorm, HF_MODULES_BACKEND, "hf_modules"),
    (Op::FusedAddRmsnorm, HF_MODULES_BACKEND, "hf_modules"),
    (Op::Rope, HF_MODULES_BACKEND, "hf_modules"),
    (Op::SiluMul, HF_MODULES_BACKEND, "hf_modules"),
];

/// Libraries whose measurements stand for one engine's own implementation of an op and for
/// nothing else: the collector's torch router (gate linear, fp32 softmax, top-k, renormalise:
/// transformers' router, 26 us at 64 tokens on the H200) is not the GEMM plus one fused top-k
/// kernel vLLM, SGLang and TensorRT-LLM run, which nobody here measured. An engine that does
/// not name such a library for the op gets the roofline baseline, not these measurements.
const ENGINE_ONLY_LIBRARIES: [(Op, &str); 1] = [(Op::MoeRouter, "torch")];

/// Whether `backend` is a library measured for one engine only (`ENGINE_ONLY_LIBRARIES`).
pub fn is_engine_only(op: Op, backend: &str) -> bool {
    ENGINE_ONLY_LIBRARIES.iter().any(|&(o, prefix)| o == op && backend.starts_with(prefix))
}

/// Backend of transformers' eager attention with sinks (`microbench/collect.py`).
pub const EAGER_SINKS_BACKEND: &str = "torch_eager_sinks";
/// Backend of transformers' packed masked SDPA attention (cuDNN; `microbench/collect.py`).
pub const PACKED_SDPA_BACKEND: &str = "sdpa_cudnn_masked";
/// Backend of transformers' own grouped-GEMM experts forward (`microbench/collect.py`).
pub const HF_EXPERTS_BACKEND: &str = "hf_grouped_mm";
/// The same forward as transformers' CUDA-graph engine runs it: the real tokens padded to a
/// multiple of 64 rows that all carry one token (`microbench/collect.py`). Its rows' token
/// count is the real tokens'.
pub const HF_PADDED_EXPERTS_BACKEND: &str = "hf_padded_grouped_mm";
/// Backend of transformers' own eager modules: RMSNorm, rotary, act * mul, each several torch
/// kernels in fp32 and bf16 (`microbench/collect.py`).
pub const HF_MODULES_BACKEND: &str = "hf_modules";

fn one() -> f64 {
    1.0
}

/// Most backend categories kept as one-hot features; rarer ones share the all-zero code.
const MAX_BACKENDS: usize = 24;

/// Fitting knobs for one op family.
#[derive(Debug, Clone, Copy)]
pub struct FitParams {
    pub gbdt: GbdtParams,
    /// Training rows are subsampled (deterministically) to at most this many.
    pub max_rows: usize,
    /// Whether the tree count is picked on an inner validation set of shapes (`early_stopping`).
    /// That set tells how well the trees generalize to new shapes of the training GPUs, which
    /// is the target tier's job; the cross-gen tier predicts GPUs no row came from, where more
    /// trees stack up corrections for spec-sheet combinations nobody measured (H100 left out:
    /// decode at kv_len 2 went from 10 us to 1559 us), so it keeps the fixed count.
    pub early_stop_on_shapes: bool,
}

impl Default for FitParams {
    fn default() -> Self {
        FitParams { gbdt: GbdtParams::default(), max_rows: 40_000, early_stop_on_shapes: true }
    }
}

/// Which base a row is fitted with: collectives per link class and timing method (eager
/// kernel timing adds the ranks' launch skew to the latency term); MLA per measurement path
/// (attention core, whole module, module with another norm dispatch: `features::mla_path`);
/// streaming elementwise ops per DRAM technology (GDDR cards reach a larger fraction of their
/// spec bandwidth in these kernels than HBM GPUs: A40 about 1.5x H100's, while A100 and H100
/// agree within 15 %);
/// everything else one base.
pub(crate) fn base_key(op: Op, gpu: &GpuSpec, k: &Kernel, backend: &str) -> String {
    if op.is_collective() {
        class_key(LinkClass::of_row(gpu, k.num_gpus, backend), features::is_eager_kernel_timed(backend))
    } else if matches!(op, Op::MlaPrefill | Op::MlaDecode) {
        features::mla_path(backend)
    } else if op.class() == "elementwise" {
        gpu.memory.dram.as_str().to_string()
    } else {
        "all".to_string()
    }
}

/// What the native norm and rotary chain adds to an MLA module row of base key `key` measured
/// with another dispatch (`module/<norm>`, see `features::mla_path`); 0 for every other row.
fn dispatch_chain_us(key: &str, k: &Kernel, gpu: &GpuSpec) -> f64 {
    if matches!(k.op, Op::MlaPrefill | Op::MlaDecode) && key.starts_with("module/") {
        crate::kernels::dispatch_chain::ChainFit::h200().extra_us(k, gpu)
    } else {
        0.0
    }
}

fn class_key(class: LinkClass, eager: bool) -> String {
    if eager {
        format!("{}/eager", class.as_str())
    } else {
        class.as_str().to_string()
    }
}

/// Fewest rows of one collective library on one link class for a base of its own: libraries
/// differ in algorithm (a one-shot custom all-reduce has a few microseconds of latency, NCCL's
/// ring ten or more), which one latency per link class cannot hold. Where several GPUs train,
/// the library must be measured on at least two of them: a base seen on one GPU only (Vidur's
/// cluster profiles) describes that cluster, not the library. Elementwise ops keep a library's
/// base from one GPU: it is the same two numbers the DRAM-kind base would take from that GPU,
/// without another library's kernels and timing method (Vidur's CUPTI kernel times against
/// our CUDA-graph replays) pooled in, and need fewer rows (`MIN_ELEMENTWISE_LIBRARY_BASE_ROWS`).
const MIN_LIBRARY_BASE_ROWS: usize = 20;

/// Fewest rows of one elementwise library for a base of its own: two numbers (launch floor and
/// inverse efficiency) over a sweep of sizes. Copy libraries were measured at 8-14 sizes each
/// (1 MB to 4 GB); pooled, torch's masked_scatter (12 us at 1 MB) set a 16 us floor under every
/// copy, which put a small copy at 16 us on GPUs whose copies were never measured.
const MIN_ELEMENTWISE_LIBRARY_BASE_ROWS: usize = 8;

fn min_library_base_rows(op: Op) -> usize {
    if op.is_collective() {
        MIN_LIBRARY_BASE_ROWS
    } else {
        MIN_ELEMENTWISE_LIBRARY_BASE_ROWS
    }
}

/// Fewest training GPUs of an eager-timed collective base key for its rows to get the tree
/// correction (when the model trains on that many GPUs at all).
pub const MIN_CORRECTION_GPUS: usize = 2;

fn library_key(class_key: &str, backend: &str) -> String {
    format!("{class_key}|{backend}")
}

/// Ops whose kernel libraries get bases of their own within a base key: collectives (a
/// one-shot custom all-reduce is not NCCL's ring) and streaming elementwise ops (Vidur's
/// CUPTI-timed kernels are not our CUDA-graph triton/torch ones).
fn has_library_bases(op: Op) -> bool {
    op.is_collective() || op.class() == "elementwise"
}

/// Bases to try for a row, best first: its library on its class and timing method, its class
/// and timing method, the nearest class with the same method, its class with the other method,
/// then the base of all rows.
fn base_keys(op: Op, gpu: &GpuSpec, k: &Kernel, backend: &str) -> Vec<String> {
    let own = base_key(op, gpu, k, backend);
    let mut keys = if has_library_bases(op) { vec![library_key(&own, backend), own.clone()] } else { vec![own.clone()] };
    if op.is_collective() {
        let class = LinkClass::of_row(gpu, k.num_gpus, backend);
        let eager = features::is_eager_kernel_timed(backend);
        keys.extend(class.nearest().map(|c| class_key(c, eager)));
        keys.push(class_key(class, !eager));
    }
    // A module row of another norm dispatch uses the plain module base: its rows train as the
    // native chain would have timed them, and `predict_in_form` takes the chain's extra off
    // (`dispatch_chain_us`).
    if own.starts_with("module/") {
        keys.push("module".to_string());
    }
    keys.push("all".to_string());
    keys
}

/// Whether a collective row describes what a deployment on its GPU runs: the GPU's own fabric,
/// timed by a benchmark loop. The default backend is chosen among these.
fn is_native(gpu: &GpuSpec, k: &Kernel, backend: &str) -> bool {
    LinkClass::of_row(gpu, k.num_gpus, backend) == LinkClass::of(gpu, k.num_gpus) && !features::is_eager_kernel_timed(backend)
}

impl OpModel {
    /// Whether `backend` has a base of its own for this row, rather than its class's pooled one.
    pub(crate) fn has_library_base(&self, gpu: &GpuSpec, k: &Kernel, backend: &str) -> bool {
        has_library_bases(self.op) && self.bases.contains_key(&library_key(&base_key(self.op, gpu, k, backend), backend))
    }

    /// Every library category this model knows: its own and its measurement paths'.
    pub fn all_backends(&self) -> impl Iterator<Item = &String> {
        self.backends.iter().chain(self.by_path.values().flat_map(|p| p.backends.iter()))
    }

    /// Without issue-bound bases, its paths' included: they carry a library to other GPUs, and
    /// the target tier has no use for them.
    pub fn without_issue_bound(mut self) -> OpModel {
        self.issue_bound.clear();
        for sub in self.by_path.values_mut() {
            sub.issue_bound.clear();
        }
        self
    }

    /// Without the `Roofline` form's library floors, its paths' included: only that form reads them.
    pub fn without_launch_floors(mut self) -> OpModel {
        self.launch_floors_us.clear();
        for sub in self.by_path.values_mut() {
            sub.launch_floors_us.clear();
        }
        self
    }

    /// Fits one op family on `rows` (all of op `op`); `spec` maps a GPU id to its spec. Rows of
    /// another measurement path (`model_path`) are fitted apart when rows of the main path are
    /// present too: the main rows make this model, the others `by_path[path]`.
    pub fn fit<'a>(op: Op, rows: &[&Measurement], spec: &dyn Fn(&str) -> &'a GpuSpec, params: &FitParams) -> OpModel {
        // The rules that depend on how many GPUs train (library bases, eager corrections) count
        // the op family's GPUs, not one path's: a path measured on one of several GPUs is that
        // GPU's cluster, not the hardware.
        let gpu_count = rows.iter().map(|m| m.gpu.as_str()).collect::<BTreeSet<_>>().len();
        let (other, main): (Vec<&Measurement>, Vec<&Measurement>) =
            rows.iter().partition(|m| model_path(op, &m.backend).is_some());
        if other.is_empty() || main.is_empty() {
            return Self::fit_path(op, rows, spec, params, gpu_count);
        }
        let mut m = Self::fit_path(op, &main, spec, params, gpu_count);
        let mut paths: BTreeMap<&str, Vec<&Measurement>> = BTreeMap::new();
        for r in other {
            paths.entry(model_path(op, &r.backend).expect("partitioned above")).or_default().push(r);
        }
        // A ratio between GPUs from a benchmark-timed model fitted on one GPU is its SOL ratio
        // again: eager libraries are carried to other GPUs (`eager_transfer_us`) only where at
        // least two GPUs fitted it (p2p's is the H200's two rows: not).
        let main_gpus = main.iter().map(|r| r.gpu.as_str()).collect::<BTreeSet<_>>().len();
        for (path, path_rows) in paths {
            let mut sub = Self::fit_path(op, &path_rows, spec, params, gpu_count);
            if main_gpus < MIN_CORRECTION_GPUS {
                sub.library_gpus.clear();
            }
            m.by_path.insert(path.to_string(), sub);
        }
        m.train_rows = rows.len();
        m.train_gpus = rows.iter().map(|r| r.gpu.clone()).collect::<BTreeSet<_>>().into_iter().collect();
        m
    }

    /// One path's model; `train_gpu_count`: the GPUs training the whole op family.
    fn fit_path<'a>(op: Op, rows: &[&Measurement], spec: &dyn Fn(&str) -> &'a GpuSpec, params: &FitParams, train_gpu_count: usize) -> OpModel {
        let mut rows: Vec<&Measurement> = rows.to_vec();
        if rows.len() > params.max_rows {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.gbdt.seed);
            rows.shuffle(&mut rng);
            rows.truncate(params.max_rows);
        }
        // Each row with the time it trains on: an MLA module row of another norm dispatch as the
        // native chain would have timed it (`dispatch_chain_us`), so every module row shares one
        // base and the trees learn one kind of module time.
        let prepared: Vec<(Vec<f64>, Sol, &Measurement, String, f64)> = rows
            .iter()
            .map(|m| {
                let g = spec(&m.gpu);
                let (x, s) = features::extract_with_sol_routed(&m.kernel, g, &m.backend, m.routing);
                let key = base_key(op, g, &m.kernel, &m.backend);
                let chain = dispatch_chain_us(&key, &m.kernel, g);
                let key = if chain > 0.0 { "module".to_string() } else { key };
                (x, s, *m, key, m.latency_us + chain)
            })
            .collect();
        let mut by_key: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut library_gpus: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
        for (_, s, m, key, t) in &prepared {
            let pt = (base_sol_us(op, &m.kernel, spec(&m.gpu), &m.backend, s), *t);
            by_key.entry(key.clone()).or_default().push(pt);
            if key != "all" {
                by_key.entry("all".to_string()).or_default().push(pt);
            }
            if key != "all" && has_library_bases(op) {
                let lib = library_key(key, &m.backend);
                library_gpus.entry(lib.clone()).or_default().insert(m.gpu.as_str());
                by_key.entry(lib).or_default().push(pt);
            }
        }
        by_key.retain(|k, pts| {
            !k.contains('|') || (pts.len() >= min_library_base_rows(op) && library_gpus[k].len() >= if op.is_collective() { train_gpu_count.min(2) } else { 1 })
        });
        let bases: BTreeMap<String, Base> = by_key.iter().map(|(k, pts)| (k.clone(), Base::fit(pts))).collect();
        let mut library_rows: BTreeMap<&str, Vec<(f64, &GpuSpec, f64)>> = BTreeMap::new();
        if op.class() == "elementwise" {
            for (_, s, m, _, _) in &prepared {
                library_rows.entry(m.backend.as_str()).or_default().push((s.bytes, spec(&m.gpu), m.latency_us));
            }
        }
        let mut two_resource: BTreeMap<String, TwoResourceBase> = BTreeMap::new();
        let mut issue_bound: BTreeMap<String, TwoResourceBase> = BTreeMap::new();
        for (lib, pts) in library_rows {
            match TwoResourceBase::fit(&pts).filter(|_| pts.len() >= MIN_LIBRARY_BASE_ROWS) {
                Some(b) => {
                    two_resource.insert(lib.to_string(), b);
                }
                None => {
                    if let Some(b) = TwoResourceBase::fit_issue_bound(&pts) {
                        issue_bound.insert(lib.to_string(), b);
                    }
                }
            }
        }
        let base_of = |m: &Measurement, s: &Sol| {
            let sol_us = base_sol_us(op, &m.kernel, spec(&m.gpu), &m.backend, s);
            base_keys(op, spec(&m.gpu), &m.kernel, &m.backend).iter().find_map(|k| bases.get(k)).map(|b| b.time_us(sol_us)).unwrap_or(sol_us)
        };

        // Vocabulary over every training row; the default backend among this op's own rows
        // (collectives: those on their GPU's own fabric, benchmark-timed, where there are any).
        let categories: Vec<std::borrow::Cow<str>> = rows.iter().map(|m| features::backend_category(op, &m.backend)).collect();
        let mut backend_counts: BTreeMap<&str, usize> = BTreeMap::new();
        let mut own_counts: BTreeMap<&str, usize> = BTreeMap::new();
        let mut native_counts: BTreeMap<&str, usize> = BTreeMap::new();
        for (m, c) in rows.iter().zip(&categories) {
            *backend_counts.entry(c.as_ref()).or_insert(0) += 1;
            if m.kernel.op == op {
                *own_counts.entry(m.backend.as_str()).or_insert(0) += 1;
                if op.is_collective() && is_native(spec(&m.gpu), &m.kernel, &m.backend) {
                    *native_counts.entry(m.backend.as_str()).or_insert(0) += 1;
                }
            }
        }
        let ranked = by_count(backend_counts);
        let (own, native) = (by_count(own_counts), by_count(native_counts));
        let default_backend = native.first().or(own.first()).map(|b| b.0.to_string()).unwrap_or_default();
        let backends: Vec<String> = ranked.iter().take(MAX_BACKENDS).map(|b| b.0.to_string()).collect();

        let mut effs: Vec<f64> =
            prepared.iter().filter(|(_, _, m, _, _)| m.kernel.op == op).map(|(_, s, m, _, _)| (s.sol_us / m.latency_us).min(1.0)).collect();
        let median_efficiency = upper_median(&mut effs).unwrap_or(1.0).max(1e-6);
        let launch_floors_us = if op.is_collective() {
            BTreeMap::new()
        } else {
            launch_floors_us(prepared.iter().filter(|(_, _, m, _, _)| m.kernel.op == op).map(|(_, s, m, _, t)| (m.backend.as_str(), s.sol_us, *t)))
        };
        let mut x = Vec::with_capacity(prepared.len());
        let mut y = Vec::with_capacity(prepared.len());
        let mut key_ranges: BTreeMap<&str, ((f64, f64), BTreeSet<&str>)> = BTreeMap::new();
        for ((feat, s, m, key, latency_us), category) in prepared.iter().zip(&categories) {
            let base = base_of(m, s);
            x.push(with_backend(feat.clone(), &backends, category));
            // Measurements faster than SOL (L2-resident data) train as "at SOL".
            let t = (latency_us.max(s.sol_us) / base).ln();
            y.push(t);
            let e = key_ranges.entry(key.as_str()).or_insert(((f64::INFINITY, f64::NEG_INFINITY), BTreeSet::new()));
            e.0 = (e.0 .0.min(t), e.0 .1.max(t));
            e.1.insert(m.gpu.as_str());
        }
        let inner: Vec<bool> = prepared.iter().map(|(_, _, m, _, _)| is_inner_validation(&m.kernel)).collect();
        let gbdt = if params.early_stop_on_shapes && inner.iter().filter(|v| **v).count() >= early_stopping::MIN_ROWS {
            let p = GbdtParams { learning_rate: early_stopping::LEARNING_RATE, trees: early_stopping::MAX_TREES, ..params.gbdt };
            Gbdt::fit_early_stopped(&x, &y, &inner, &p, early_stopping::PATIENCE)
        } else {
            Gbdt::fit(&x, &y, &params.gbdt)
        };
        let y_range = y.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let shared = |k: &str, gpus: &BTreeSet<&str>| !k.ends_with("/eager") || gpus.len() >= MIN_CORRECTION_GPUS.min(train_gpu_count);
        let correction_ranges = op.is_collective().then(|| {
            key_ranges.iter().filter(|(k, (_, gpus))| shared(k, gpus)).map(|(k, (r, _))| (k.to_string(), *r)).collect::<BTreeMap<String, (f64, f64)>>()
        });
        let own_corrections: BTreeMap<String, (String, (f64, f64))> = if op.is_collective() {
            key_ranges
                .iter()
                .filter(|(k, (_, gpus))| !shared(k, gpus) && gpus.len() == 1)
                .map(|(k, (r, gpus))| (k.to_string(), (gpus.iter().next().expect("one GPU").to_string(), *r)))
                .collect()
        } else {
            BTreeMap::new()
        };
        // The eager libraries' GPUs, from the per-(link class, library) sets the bases used.
        let mut eager_gpus: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (key, gpus) in &library_gpus {
            match key.split_once('|') {
                Some((_, backend)) if op.is_collective() && features::is_eager_kernel_timed(backend) => eager_gpus.entry(backend).or_default().extend(gpus),
                _ => {}
            }
        }
        let eager_library_gpus: BTreeMap<String, Vec<String>> =
            eager_gpus.into_iter().map(|(b, g)| (b.to_string(), g.into_iter().map(str::to_string).collect())).collect();
        let mut names: Vec<String> = features::names(op).iter().map(|s| s.to_string()).collect();
        names.extend(backends.iter().map(|b| format!("backend={b}")));
        let train_gpus: BTreeSet<String> = rows.iter().map(|m| m.gpu.clone()).collect();
        OpModel {
            op,
            form: Form::Learned,
            inner_check: None,
            bases,
            two_resource,
            issue_bound,
            backends,
            default_backend,
            features: names,
            gbdt,
            y_range,
            correction_ranges,
            own_corrections,
            library_gpus: eager_library_gpus,
            median_efficiency,
            launch_floors_us,
            train_rows: rows.len(),
            train_gpus: train_gpus.into_iter().collect(),
            by_path: BTreeMap::new(),
        }
    }

    /// Predicted time of `k` on `gpu` with `backend` (None = the default one), never below SOL;
    /// a MoE kernel's tokens routed uniformly (served traffic).
    pub fn predict_us(&self, k: &Kernel, gpu: &GpuSpec, backend: Option<&str>) -> f64 {
        self.predict_routed_us(k, gpu, backend, Routing::Uniform)
    }

    /// As `predict_us` for a kernel whose tokens are routed as `routing` (a measured row's).
    pub fn predict_routed_us(&self, k: &Kernel, gpu: &GpuSpec, backend: Option<&str>, routing: Routing) -> f64 {
        let t = self.predict_in_form(self.form, k, gpu, backend, routing);
        // A GEMM over fewer rows does a subset of the work of one over more (same n, k; the
        // library can run the larger problem's tiling, as CUDA-graph engines do by padding), so
        // its time never exceeds that of the next power-of-two row count. Measurement grids
        // skip most m between powers of two (aiconfigurator: 17 then 32), where the trees are
        // unconstrained: unguarded, B200's cross-gen model put m = 48 at 194 us (measured 1.8).
        if self.op == Op::Gemm && k.m > 1 && !k.m.is_power_of_two() {
            let up = Kernel { m: k.m.next_power_of_two(), ..k.clone() };
            let t_up = self.predict_in_form(self.form, &up, gpu, backend, routing);
            return t.min(t_up).max(crate::perf::sol::sol(k, gpu).sol_us);
        }
        t
    }

    /// The one-hot category of a MoE query under aiconfigurator's power law (`Routing::PowerLawLoads`,
    /// served with `--moe-routing power_law_<alpha>`): the library's own `/power_law_<alpha>`
    /// variant where it was measured so. Those rows carry their routing in the backend string,
    /// so the trees learned the skew's cost partly through that category; the plain library's
    /// category would price the skew from its balanced rows (MiniMax's experts on the H100,
    /// EP4, 8,192 tokens: 1,374 us against the 1,631 us its power-law row measured).
    fn routed_category<'a>(&self, category: std::borrow::Cow<'a, str>, routing: Routing) -> std::borrow::Cow<'a, str> {
        if self.op != Op::Moe || !matches!(routing, Routing::PowerLawLoads { .. }) || category.contains("/power_law_") {
            return category;
        }
        let Some((head, kernel)) = category.rsplit_once('/') else { return category };
        let variant = format!("{head}/{}/{kernel}", routing.served_name());
        if self.backends.contains(&variant) {
            variant.into()
        } else {
            category
        }
    }

    /// Whether `features` (stored at fit time) are what `features::names` gives now.
    fn features_are_current(&self) -> bool {
        let now = features::names(self.op);
        self.features.len() == now.len() + self.backends.len() && self.features.iter().zip(&now).all(|(a, b)| a == b)
    }

    /// Trees fitted on another feature list (a calibration older than `features::names`) would
    /// read misaligned inputs: such a model (or path model) predicts with its base alone.
    /// Checked once when a file is loaded, not per prediction.
    fn drop_stale_trees(&mut self) {
        if self.form == Form::Learned && !self.features_are_current() {
            self.form = Form::BaseOnly;
        }
        for sub in self.by_path.values_mut() {
            sub.drop_stale_trees();
        }
    }

    /// An eager-timed collective (Vidur's cluster profiles, path model `sub`) on a GPU that did
    /// not measure its library: the library's time on each GPU that did (`sub` there, with that
    /// cluster's own correction), times how much faster this model's benchmark-timed library
    /// (NCCL or a custom all-reduce, fitted on every training GPU) runs the same collective here
    /// than there; geometric mean over those GPUs. A cluster's launch floor and bandwidth share
    /// are its own, so the base alone carried A100's eager DGX rows to the H100 at 1.3-2.1x its
    /// time (its NCCL runs 1.5-2x faster with NVLink 4 and in-switch reduction, not the 1.5x of the
    /// link bandwidths, and its hosts launch faster). None where the GPU measured the library,
    /// where either GPU's row runs off its own fabric (Vidur's PCIe pairs and multi-node rows:
    /// the benchmark-timed rows are on the fabric), or outside the learned and base forms.
    fn eager_transfer_us(&self, sub: &OpModel, form: Form, k: &Kernel, gpu: &GpuSpec, backend: &str, routing: Routing) -> Option<f64> {
        // First the map lookup: every prediction on a path of its own passes here.
        let sources = sub.library_gpus.get(backend)?;
        if !matches!(form, Form::Learned | Form::BaseOnly) || model_path(self.op, &self.default_backend).is_some() {
            return None;
        }
        let n = k.num_gpus;
        let on_fabric = |g: &GpuSpec| LinkClass::of_row(g, n, backend) == LinkClass::of(g, n);
        if sources.iter().any(|g| *g == gpu.id) || !on_fabric(gpu) {
            return None;
        }
        let here = self.predict_in_form(form, k, gpu, None, routing);
        let logs: Vec<f64> = sources
            .iter()
            .filter_map(|id| crate::hardware::builtin_spec(id))
            .filter(|src| on_fabric(src) && LinkClass::of(src, n) == LinkClass::of(gpu, n))
            .map(|src| {
                let there = self.predict_in_form(form, k, src, None, routing);
                (sub.predict_in_form(form, k, src, Some(backend), routing) * here / there).ln()
            })
            .collect();
        if logs.is_empty() {
            return None;
        }
        let sol_us = features::row_sol(k, gpu, backend).sol_us;
        Some((logs.iter().sum::<f64>() / logs.len() as f64).exp().max(sol_us))
    }

    /// As `predict_us` in the given form (a path model follows the form of the model it sits in).
    fn predict_in_form(&self, form: Form, k: &Kernel, gpu: &GpuSpec, backend: Option<&str>, routing: Routing) -> f64 {
        if backend.is_none() && matches!(self.op, Op::MlaPrefill | Op::MlaDecode) && model_path(self.op, &self.default_backend).is_some() {
            // A caller naming no backend asks for the attention core (the step graph emits the
            // projections as GEMMs of their own), but this model knows only whole-module rows:
            // the module's predicted time, at the core's share of the module's SOL.
            let module = features::row_sol(k, gpu, &self.default_backend).sol_us;
            let core = crate::perf::sol::sol(k, gpu).sol_us;
            return (self.predict_in_form(form, k, gpu, Some(&self.default_backend), routing) * core / module).max(core);
        }
        let backend = backend.unwrap_or(&self.default_backend);
        if let Some(sub) = model_path(self.op, backend).and_then(|p| self.by_path.get(p)) {
            if let Some(t) = self.eager_transfer_us(sub, form, k, gpu, backend, routing) {
                return t;
            }
            return sub.predict_in_form(form, k, gpu, Some(backend), routing);
        }
        let (feat, s) = features::extract_with_sol_routed(k, gpu, backend, routing);
        let base_sol = base_sol_us(self.op, k, gpu, backend, &s);
        let base = base_keys(self.op, gpu, k, backend).iter().find_map(|key| self.bases.get(key)).map(|b| b.time_us(base_sol)).unwrap_or(base_sol);
        let y = match form {
            Form::Learned => {
                let range = match &self.correction_ranges {
                    None => Some(self.y_range),
                    Some(ranges) => {
                        let key = base_key(self.op, gpu, k, backend);
                        ranges.get(&key).copied().or_else(|| self.own_corrections.get(&key).filter(|(g, _)| *g == gpu.id).map(|(_, r)| *r))
                    }
                };
                let category = self.routed_category(features::backend_category(self.op, backend), routing);
                match range {
                    Some((lo, hi)) => self.gbdt.predict(&with_backend(feat, &self.backends, &category)).clamp(lo, hi),
                    None => 0.0,
                }
            }
            Form::BaseOnly | Form::TwoResource => match self.two_resource.get(backend).filter(|_| form == Form::TwoResource).or_else(|| self.issue_bound.get(backend)) {
                Some(b) => return b.time_us(s.bytes, gpu).max(s.sol_us),
                None => 0.0,
            },
            Form::Roofline => {
                // As `perf::roofline`, with this op's own efficiency.
                let p = RooflineParams::default();
                let latency = if self.op.is_collective() { p.collective_latency_us } else { 0.0 };
                let floor = self.launch_floors_us.get(backend).copied().unwrap_or(p.launch_floor_us);
                return (s.sol_us / self.median_efficiency + latency).max(floor).max(s.sol_us);
            }
        };
        // A module row of another norm dispatch (B200's fused-kernel tables against everyone
        // else's native chain): the module as the native chain runs it, less the chain's extra.
        let chain_us = if matches!(self.op, Op::MlaPrefill | Op::MlaDecode) {
            dispatch_chain_us(&base_key(self.op, gpu, k, backend), k, gpu)
        } else {
            0.0
        };
        (base * y.exp() - chain_us).max(s.sol_us)
    }
}

/// Rows whose SOL is below this are launch-bound on every GPU measured here (the collector's
/// one-token adds: 1.2-1.5 us at a SOL of 0.01-0.2 us).
const LAUNCH_BOUND_SOL_US: f64 = 0.25;

/// Fewest launch-bound rows that give a library a floor of its own.
const MIN_FLOOR_ROWS: usize = 3;

/// Each library's launch floor: the median time of its launch-bound rows `(library, SOL us,
/// measured us)`, where it has at least `MIN_FLOOR_ROWS` of them. A kernel library launches in
/// about the same time on every recent GPU, where the default roofline floor (3 us) prices a
/// 1.2 us add at 2.4x.
fn launch_floors_us<'a>(rows: impl Iterator<Item = (&'a str, f64, f64)>) -> BTreeMap<String, f64> {
    let mut by_library: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (library, _, t_us) in rows.filter(|(_, sol_us, _)| *sol_us < LAUNCH_BOUND_SOL_US) {
        by_library.entry(library).or_default().push(t_us);
    }
    by_library
        .into_iter()
        .filter(|(_, times)| times.len() >= MIN_FLOOR_ROWS)
        .filter_map(|(library, mut times)| upper_median(&mut times).map(|t| (library.to_string(), t)))
        .collect()
}

/// Backends by decreasing row count (ties by name).
fn by_count(counts: BTreeMap<&str, usize>) -> Vec<(&str, usize)> {
    let mut r: Vec<(&str, usize)> = counts.into_iter().collect();
    r.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    r
}

fn with_backend(mut feat: Vec<f64>, vocab: &[String], backend: &str) -> Vec<f64> {
    feat.extend(vocab.iter().map(|b| if b == backend { 1.0 } else { 0.0 }));
    feat
}

/// Fitted models of every op family with data, for one tier and GPU set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSet {
    /// `target` or `cross-gen`.
    pub tier: String,
    /// GPU ids whose measurements trained it.
    pub trained_on: Vec<String>,
    /// Cross-gen: the GPU left out (None for the all-GPU model).
    pub held_out: Option<String>,
    /// Cross-gen leave-out sets: every op the held-out GPU measured. Those ops' models here
    /// never saw it; any op listed but absent had too little data on the other GPUs.
    #[serde(default)]
    pub held_out_ops: Vec<Op>,
    pub ops: BTreeMap<Op, OpModel>,
}

impl ModelSet {
    /// As loaded from a file: models whose trees no longer match the feature list predict
    /// with their bases (`OpModel::drop_stale_trees`).
    pub fn checked_against_features(mut self) -> ModelSet {
        for m in self.ops.values_mut() {
            m.drop_stale_trees();
        }
        self
    }
}

/// Op families with at least `min_rows` rows, grouped.
pub fn group_by_op<'a>(rows: &[&'a Measurement], min_rows: usize) -> BTreeMap<Op, Vec<&'a Measurement>> {
    let mut g: BTreeMap<Op, Vec<&Measurement>> = BTreeMap::new();
    for m in rows {
        g.entry(m.kernel.op).or_default().push(m);
    }
    g.retain(|_, v| v.len() >= min_rows);
    g
}

/// Fits every op family with enough rows (in parallel across families).
pub fn fit_set<'a>(
    tier: &str,
    rows: &[&Measurement],
    held_out: Option<&str>,
    spec: &(dyn Fn(&str) -> &'a GpuSpec + Sync),
    params: &FitParams,
    min_rows: usize,
) -> ModelSet {
    use rayon::prelude::*;
    let groups = group_by_op(rows, min_rows);
    let cross_gen = tier == "cross-gen";
    let params = &FitParams { early_stop_on_shapes: params.early_stop_on_shapes && !cross_gen, ..*params };
    let ops: BTreeMap<Op, OpModel> = groups
        .into_par_iter()
        .map(|(op, rows)| {
            let model = OpModel::fit(op, &rows, spec, params);
            (op, if cross_gen { super::select::checked(model, &rows, spec, params) } else { model.without_issue_bound().without_launch_floors() })
        })
        .collect();
    let trained_on: BTreeSet<String> = rows.iter().map(|m| m.gpu.clone()).collect();
    ModelSet {
        tier: tier.to_string(),
        trained_on: trained_on.into_iter().collect(),
        held_out: held_out.map(str::to_string),
        held_out_ops: vec![],
        ops,
    }
}

#[cfg(test)]
mod tests {
    use crate::calibrate::base::HBM_STREAMING_SHARE;
    use crate::kernels::cost::Routing;
    use super::*;

    #[test]
    fn engine_specific_libraries_fit_on_paths_of_their_own() {
        assert_eq!(model_path(Op::AttnPrefill, PACKED_SDPA_BACKEND), Some("packed_sdpa"));
        assert_eq!(model_path(Op::AttnPrefill, EAGER_SINKS_BACKEND), Some("eager_sinks"));
        assert_eq!(model_path(Op::Moe, "hf_grouped_mm(transformers grouped_mm_experts_forward)"), Some("hf_experts"));
        // The collector's torch grouped-GEMM experts join transformers'; vLLM's fused MoE and
        // the fused attention kernels share the main model.
        assert_eq!(model_path(Op::Moe, "grouped_mm(torch._grouped_mm)"), Some("hf_experts"));
        assert_eq!(model_path(Op::Moe, "vllm/vllm_unquantizedfusedmoe_triton_tritonexperts"), None);
        assert_eq!(model_path(Op::AttnPrefill, "sdpa_flash"), None);
        assert_eq!(model_path(Op::AttnPrefill, "vllm/vllm_flash_attn_fa3"), None);
    }

    #[test]
    fn collective_bases_recover_each_link_class() {
        use crate::hardware::load_gpu;
        // all_reduce on H100: NCCL-tests rows on NVSwitch, t = 8 us + wire / (0.8 x 450 GB/s);
        // Vidur rows on a pairwise-NVLink node with 4 GPUs (PCIe between the pairs),
        // t = 32 us + wire / (0.5 x 64 GB/s). Sizes 1 KiB .. 1 GiB.
        let h100 = load_gpu("h100_sxm").unwrap();
        let mut rows = Vec::new();
        for p in 10..=30 {
            for (n, backend, lat, eff, gbps) in
                [(8u64, "nccl", 8.0, 0.8, 450.0), (4, "vidur/pairwise_nvlink/all_reduce", 32.0, 0.5, 64.0)]
            {
                let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Fp16);
                k.num_gpus = n;
                k.bytes = 1u64 << p;
                let wire = 2.0 * (n as f64 - 1.0) / n as f64 * k.bytes as f64;
                let latency_us = lat + wire / (eff * gbps * 1e9) * 1e6;
                rows.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: "h100_sxm".into(), backend: backend.into(), source: "s".into(), latency_us });
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let m = OpModel::fit(Op::AllReduce, &refs, &|_| &h100, &FitParams::default());
        let close = |b: &Base, l: f64, c: f64| b.latency_us == l && (b.inv_efficiency - c).abs() < 1e-6;
        assert!(close(&m.bases["scaleup"], 8.0, 1.25), "{:?}", m.bases);
        assert!(close(&m.by_path["eager"].bases["pcie/eager"], 32.0, 2.0), "{:?}", m.by_path["eager"].bases);
        // The default backend is the benchmark-timed one on the GPU's own fabric.
        assert_eq!(m.default_backend, "nccl");
        // On B200 (900 GB/s NVLink) a 256 MiB all-reduce over 8 GPUs is the NVSwitch law at the
        // new bandwidth: 8 us + 2 * 7/8 * 256 MiB / (0.8 * 900 GB/s).
        let b200 = load_gpu("b200_sxm").unwrap();
        let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Fp16);
        k.num_gpus = 8;
        k.bytes = 256 << 20;
        let expected = 8.0 + 1.75 * (256u64 << 20) as f64 / (0.8 * 900e9) * 1e6;
        let mut base_only = m.clone();
        base_only.form = Form::BaseOnly;
        let got = base_only.predict_us(&k, &b200, None);
        assert!((got - expected).abs() / expected < 1e-9, "{got} vs {expected}");
        // A 2-GPU bridge row, a class with no training rows, borrows the NVSwitch base (both
        // NVLink), not the PCIe one, with SOL on H100's bridge (300 GB/s, not the board's 450):
        // 8 us + 1 MiB / (0.8 x 300 GB/s).
        k.num_gpus = 2;
        k.bytes = 1 << 20;
        let expected = 8.0 + (1u64 << 20) as f64 / (0.8 * 300e9) * 1e6;
        let got = base_only.predict_us(&k, &h100, Some("pairwise_nvlink"));
        assert!((got - expected).abs() / expected < 1e-9, "{got} vs {expected}");
    }

    #[test]
    fn packed_attention_at_unmeasured_head_counts_follows_the_busiest_sm() {
        use crate::hardware::load_gpu;
        use crate::perf::sol::{sol, tiled_attention_bound_us};
        // A world where the packed kernel runs at a third of its busiest SM's bound, + 6 us:
        // trained at 8, 32 and 64 heads, asked at 2 and 16. SOL falls 4x from 8 heads to 2,
        // the kernel's time does not (transformers' packed cuDNN attention on the H200: 261-276 us
        // at 64 queries x 16,384 keys for 2-64 heads of 64 dims).
        let g = load_gpu("h200_sxm").unwrap();
        let packed = |heads: u64, q: u64, keys: u64| Kernel {
            batch: 1,
            seq_len: q,
            kv_len: keys,
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: 64,
            ..Kernel::new(Op::AttnPrefill, crate::schema::Dtype::Bf16)
        };
        let truth = |k: &Kernel| 6.0 + 3.0 * tiled_attention_bound_us(k, &g, sol(k, &g).compute_us);
        let mut rows = Vec::new();
        for heads in [8u64, 32, 64] {
            for q in [64u64, 512, 2048] {
                for keys in [1024u64, 4096, 16384, 65536] {
                    let k = packed(heads, q, keys);
                    let latency_us = truth(&k);
                    rows.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: PACKED_SDPA_BACKEND.into(), source: "s".into(), latency_us });
                }
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let m = OpModel::fit(Op::AttnPrefill, &refs, &|_: &str| &g, &FitParams::default());
        for heads in [2u64, 16] {
            for (q, keys) in [(64u64, 16384u64), (512, 32768), (2048, 8192)] {
                let k = packed(heads, q, keys);
                let got = m.predict_us(&k, &g, Some(PACKED_SDPA_BACKEND));
                assert!((got / truth(&k) - 1.0).abs() < 0.05, "{heads} heads, {q} x {keys}: {got:.1} vs {:.1} us", truth(&k));
            }
        }
    }

    #[test]
    fn streaming_ops_get_a_base_per_dram_kind() {
        use crate::hardware::{load_gpu, DramKind};
        use crate::perf::sol::sol;
        // rmsnorm at 1/3 of spec bandwidth on H100 (HBM3) and 0.6 on A40 (GDDR6), + 4 us.
        let (h100, a40, a100) = (load_gpu("h100_sxm").unwrap(), load_gpu("a40").unwrap(), load_gpu("a100_sxm").unwrap());
        assert_eq!((h100.memory.dram, a40.memory.dram, a100.memory.dram), (DramKind::Hbm, DramKind::Gddr, DramKind::Hbm));
        let mut rows = Vec::new();
        for (g, eff) in [(&h100, 1.0 / 3.0), (&a40, 0.6)] {
            for t in [16u64, 64, 256, 1024, 4096, 16384] {
                let k = Kernel { num_tokens: t, hidden: 8192, ..Kernel::new(Op::Rmsnorm, crate::schema::Dtype::Fp16) };
                let latency_us = 4.0 + sol(&k, g).sol_us / eff;
                rows.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: "vidur/rmsnorm".into(), source: "s".into(), latency_us });
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let spec = |id: &str| if id == "a40" { &a40 } else { &h100 };
        let mut m = OpModel::fit(Op::Rmsnorm, &refs, &spec, &FitParams::default());
        assert!((m.bases["hbm"].inv_efficiency - 3.0).abs() < 1e-6, "{:?}", m.bases);
        assert!((m.bases["gddr"].inv_efficiency - 1.0 / 0.6).abs() < 1e-6, "{:?}", m.bases);
        // A100, never measured, is timed by the HBM base, not the pooled one.
        m.form = Form::BaseOnly;
        let k = Kernel { num_tokens: 8192, hidden: 8192, ..Kernel::new(Op::Rmsnorm, crate::schema::Dtype::Fp16) };
        let expected = 4.0 + 3.0 * sol(&k, &a100).sol_us;
        assert!((m.predict_us(&k, &a100, None) - expected).abs() < 1e-6 * expected);
    }

    #[test]
    fn balanced_rows_teach_the_time_per_expert_read_and_uniform_traffic_reads_fewer() {
        use crate::hardware::load_gpu;
        use crate::perf::sol::sol_routed;
        // A kernel at 40 % of bandwidth on the weights it reads, + 5 us, measured with balanced
        // routing (every assignment on its own expert up to 128).
        let g = load_gpu("h200_sxm").unwrap();
        let moe = |t: u64| Kernel { num_tokens: t, hidden: 2880, inter: 2880, topk: 4, num_experts: 128, tp: 2, ep: 1, ..Kernel::new(Op::Moe, crate::schema::Dtype::Bf16) };
        let truth = |t: u64, r: Routing| 5.0 + sol_routed(&moe(t), &g, r).memory_us / 0.4;
        let rows: Vec<Measurement> = [1u64, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256]
            .into_iter()
            .map(|t| Measurement { routing: Routing::Balanced, kernel: moe(t), gpu: g.id.clone(), backend: "lib".into(), source: "s".into(), latency_us: truth(t, Routing::Balanced) })
            .collect();
        let refs: Vec<&Measurement> = rows.iter().collect();
        let mut m = OpModel::fit(Op::Moe, &refs, &|_: &str| &g, &FitParams::default());
        m.form = Form::BaseOnly;
        // The measured rows are reproduced with their own routing, and served (uniform) traffic
        // at 32 tokens reads ~81 of 128 experts: ~0.64x the balanced time, not the same time.
        let balanced = m.predict_routed_us(&moe(32), &g, None, Routing::Balanced);
        assert!((balanced / truth(32, Routing::Balanced) - 1.0).abs() < 0.01, "{balanced}");
        let uniform = m.predict_us(&moe(32), &g, None);
        assert!((uniform / truth(32, Routing::Uniform) - 1.0).abs() < 0.01, "{uniform} vs {}", truth(32, Routing::Uniform));
        assert!(uniform < 0.7 * balanced, "{uniform} vs {balanced}");
    }

    #[test]
    fn form_names_are_the_calibration_files_names() {
        for f in [Form::Learned, Form::BaseOnly, Form::TwoResource, Form::Roofline] {
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{}\"", f.as_str()));
        }
    }

    #[test]
    fn two_resource_base_recovers_both_coefficients_from_two_gpus() {
        use crate::hardware::load_gpu;
        use crate::perf::sol::sol;
        // rmsnorm by one library on H100 (12.8 DRAM bytes per SM cycle) and A40 (4.8):
        // t = 2 us + max(0.8 x bytes / DRAM bandwidth, 0.1 SM cycles per byte): issue-bound on
        // H100, DRAM-bound on A40, so each GPU pins one coefficient.
        let truth = TwoResourceBase { latency_us: 2.0, inv_dram_efficiency: 0.8, sm_cycles_per_byte: 0.1 };
        let (h100, a40, a100) = (load_gpu("h100_sxm").unwrap(), load_gpu("a40").unwrap(), load_gpu("a100_sxm").unwrap());
        let kernel = |t: u64, h: u64| Kernel { num_tokens: t, hidden: h, ..Kernel::new(Op::Rmsnorm, crate::schema::Dtype::Fp16) };
        let mut rows = Vec::new();
        for g in [&h100, &a40] {
            for t in [1u64, 16, 64, 256, 1024, 4096, 16384] {
                for h in [2048u64, 4096, 8192] {
                    let k = kernel(t, h);
                    let latency_us = truth.time_us(sol(&k, g).bytes, g);
                    rows.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: "vidur/rmsnorm".into(), source: "s".into(), latency_us });
                }
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let spec = |id: &str| if id == "a40" { &a40 } else { &h100 };
        let mut m = OpModel::fit(Op::Rmsnorm, &refs, &spec, &FitParams::default());
        let b = m.two_resource["vidur/rmsnorm"];
        assert_eq!(b.latency_us, 2.0, "{b:?}");
        // The ratio of the terms sits on a quarter-octave grid: both coefficients within 3 % here.
        assert!((b.inv_dram_efficiency / 0.8 - 1.0).abs() < 0.03 && (b.sm_cycles_per_byte / 0.1 - 1.0).abs() < 0.03, "{b:?}");
        // A100, never measured, within 1 % at a large size; the HBM base (H100's bandwidth
        // law) misses it by the A100/H100 gap between SM cycles and bandwidth.
        let k = kernel(16384, 8192);
        let expected = truth.time_us(sol(&k, &a100).bytes, &a100);
        m.form = Form::TwoResource;
        assert!((m.predict_us(&k, &a100, None) / expected - 1.0).abs() < 0.01);
        m.form = Form::BaseOnly;
        assert!((m.predict_us(&k, &a100, None) / expected - 1.0).abs() > 0.02);
        // A library on GPUs of one balance (A100 and H100 differ by 5 %) gets no fit: its two
        // terms are collinear there. Neither does one GPU.
        fn pts<'a>(gs: &[&'a GpuSpec], law: &TwoResourceBase) -> Vec<(f64, &'a GpuSpec, f64)> {
            gs.iter().flat_map(|g| [1e6, 1e8].map(|bytes| (bytes, *g, law.time_us(bytes, g)))).collect()
        }
        assert!(TwoResourceBase::fit(&pts(&[&a100, &h100], &truth)).is_none());
        assert!(TwoResourceBase::fit(&pts(&[&a40], &truth)).is_none());
        assert!(TwoResourceBase::fit(&pts(&[&a100, &a40], &truth)).is_some());
    }

    #[test]
    fn a_library_far_below_the_streaming_rate_on_one_gpu_keeps_its_time_where_only_bandwidth_grows() {
        use crate::hardware::load_gpu;
        // Copies measured on the H100 alone: a strided copy held by SM issue (0.5 of the spec
        // bandwidth at every size beyond L2) and a gather near the streaming rate (0.87).
        let (h100, h200, a40) = (load_gpu("h100_sxm").unwrap(), load_gpu("h200_sxm").unwrap(), load_gpu("a40").unwrap());
        let sizes = [1u64 << 20, 1 << 24, 1 << 26, 1 << 27, 1 << 28, 1 << 29];
        let rows_at = |backend: &str, share: f64| -> Vec<Measurement> {
            sizes
                .iter()
                .map(|&bytes| {
                    let k = Kernel { bytes, ..Kernel::new(Op::Copy, crate::schema::Dtype::Bf16) };
                    let moved = crate::perf::sol::sol(&k, &h100).bytes;
                    let latency_us = 3.0 + 1e6 * moved / (share * h100.hbm_bytes_per_s());
                    Measurement { routing: Routing::Uniform, kernel: k, gpu: h100.id.clone(), backend: backend.into(), source: "s".into(), latency_us }
                })
                .collect()
        };
        let rows: Vec<Measurement> = [rows_at("torch_repeat_kv", 0.5), rows_at("torch_index_select", 0.87)].concat();
        let refs: Vec<&Measurement> = rows.iter().collect();
        let spec = |_: &str| &h100;
        let m = OpModel::fit(Op::Copy, &refs, &spec, &FitParams::default());
        assert!(m.issue_bound.contains_key("torch_repeat_kv") && !m.issue_bound.contains_key("torch_index_select"), "{:?}", m.issue_bound.keys());
        let m = OpModel { form: Form::BaseOnly, ..m };
        let big = Kernel { bytes: 1 << 29, ..Kernel::new(Op::Copy, crate::schema::Dtype::Bf16) };
        let t = |g: &GpuSpec, backend: &str| m.predict_us(&big, g, Some(backend));
        // The H200 has the H100's SMs and clock: the issue-bound copy takes the H100's time,
        // the gather scales with the bandwidth (4.8 / 3.35).
        assert!((t(&h200, "torch_repeat_kv") / t(&h100, "torch_repeat_kv") - 1.0).abs() < 0.02);
        assert!(t(&h200, "torch_index_select") / t(&h100, "torch_index_select") < 0.75);
        // A40's GDDR (0.7 TB/s) holds even the issue-bound copy to its DRAM at the streaming rate.
        let dram_us = 1e6 * crate::perf::sol::sol(&big, &a40).bytes / (HBM_STREAMING_SHARE * a40.hbm_bytes_per_s());
        assert!(t(&a40, "torch_repeat_kv") >= dram_us);
        // A GDDR card's rows say nothing about HBM's streaming rate: no issue-bound base from them.
        let slow: Vec<(f64, &GpuSpec, f64)> = sizes.iter().map(|&b| (b as f64, &a40, 1e6 * b as f64 / (0.3 * a40.hbm_bytes_per_s()))).collect();
        assert!(TwoResourceBase::fit_issue_bound(&slow).is_none());
    }

    #[test]
    fn the_roofline_form_floors_a_library_at_its_own_launch_time() {
        use crate::hardware::load_gpu;
        // Adds measured on the H100 by two libraries: "fast" launches in 1.2 us, "slow" in 2.5;
        // both stream at 0.8 of SOL beyond that. Tiny adds on the H200 take the library's floor,
        // not the default 3 us; a library with no launch-bound rows keeps the default.
        let (h100, h200) = (load_gpu("h100_sxm").unwrap(), load_gpu("h200_sxm").unwrap());
        let add = |tokens: u64| Kernel { num_tokens: tokens, hidden: 4096, ..Kernel::new(Op::Add, crate::schema::Dtype::Bf16) };
        let rows_of = |backend: &str, launch_us: f64, tokens: &[u64]| -> Vec<Measurement> {
            tokens
                .iter()
                .map(|&t| {
                    let sol_us = crate::perf::sol::sol(&add(t), &h100).sol_us;
                    let latency_us = launch_us.max(sol_us / 0.8);
                    Measurement { routing: Routing::Uniform, kernel: add(t), gpu: h100.id.clone(), backend: backend.into(), source: "s".into(), latency_us }
                })
                .collect()
        };
        let rows = [rows_of("fast", 1.2, &[1, 2, 4, 8, 4096, 16384]), rows_of("slow", 2.5, &[1, 2, 4, 8]), rows_of("big_only", 1.0, &[8192, 16384, 32768])].concat();
        let refs: Vec<&Measurement> = rows.iter().collect();
        let spec = |_: &str| &h100;
        let m = OpModel { form: Form::Roofline, ..OpModel::fit(Op::Add, &refs, &spec, &FitParams::default()) };
        assert_eq!(m.launch_floors_us.keys().collect::<Vec<_>>(), ["fast", "slow"]);
        let tiny = add(1);
        assert!((m.predict_us(&tiny, &h200, Some("fast")) - 1.2).abs() < 1e-9);
        assert!((m.predict_us(&tiny, &h200, Some("slow")) - 2.5).abs() < 1e-9);
        assert_eq!(m.predict_us(&tiny, &h200, Some("big_only")), RooflineParams::default().launch_floor_us);
        // The floor is only a floor: a large add still streams.
        assert!(m.predict_us(&add(32768), &h200, Some("fast")) > 10.0);
        assert!(m.clone().without_launch_floors().launch_floors_us.is_empty());
    }

    #[test]
    fn streaming_ops_get_a_base_per_library_within_a_dram_kind() {
        use crate::hardware::load_gpu;
        use crate::perf::sol::sol;
        // rmsnorm on H100 by two libraries: "vidur/rmsnorm" at 4 us + 3 x SOL (36 rows) and
        // "triton" at 1.5 us + 1.25 x SOL (24 rows). A100 rows of either library are timed by
        // that library's own HBM base, not by the pool of both.
        let (h100, a100) = (load_gpu("h100_sxm").unwrap(), load_gpu("a100_sxm").unwrap());
        let mut rows = Vec::new();
        for (backend, lat, c, n) in [("vidur/rmsnorm", 4.0, 3.0, 36u64), ("triton", 1.5, 1.25, 24)] {
            for i in 0..n {
                let k = Kernel { num_tokens: 16 << (i % 12), hidden: 1024 << (i / 12), ..Kernel::new(Op::Rmsnorm, crate::schema::Dtype::Fp16) };
                let latency_us = lat + c * sol(&k, &h100).sol_us;
                rows.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: "h100_sxm".into(), backend: backend.into(), source: "s".into(), latency_us });
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let mut m = OpModel::fit(Op::Rmsnorm, &refs, &|_| &h100, &FitParams::default());
        m.form = Form::BaseOnly;
        // At a third of the spec bandwidth "vidur/rmsnorm" also gets an issue-bound base (tested
        // above), "triton" at 0.8 not; this checks the DRAM bases per library beneath it.
        assert_eq!(m.issue_bound.keys().collect::<Vec<_>>(), ["vidur/rmsnorm"]);
        m.issue_bound.clear();
        let k = Kernel { num_tokens: 4096, hidden: 4096, ..Kernel::new(Op::Rmsnorm, crate::schema::Dtype::Fp16) };
        let s = sol(&k, &a100).sol_us;
        for (backend, expected) in [("vidur/rmsnorm", 4.0 + 3.0 * s), ("triton", 1.5 + 1.25 * s)] {
            let got = m.predict_us(&k, &a100, Some(backend));
            assert!((got - expected).abs() < 1e-6 * expected, "{backend}: {got} vs {expected}");
        }
    }

    #[test]
    fn a_copy_library_measured_at_ten_sizes_on_one_gpu_keeps_its_own_floor() {
        use crate::hardware::load_gpu;
        use crate::perf::sol::sol;
        // As the H200's copies: each library at ten sizes, 1 MB and up; a slow one (torch's
        // masked_scatter, 12 us at 1 MB) among fast ones (index_select, 2 us). A small copy of
        // a fast library on another GPU is its floor, not the pooled one.
        let (h200, h100) = (load_gpu("h200_sxm").unwrap(), load_gpu("h100_sxm").unwrap());
        let copy = |bytes: u64| Kernel { bytes, ..Kernel::new(Op::Copy, crate::schema::Dtype::Bf16) };
        let mut rows = Vec::new();
        for (backend, lat, c) in [("torch_index_select", 2.0, 1.3), ("torch_masked_scatter", 10.0, 6.0), ("torch_repeat_kv", 4.0, 1.6)] {
            for i in 0..10u32 {
                let k = copy(1 << (20 + i));
                let latency_us = lat + c * sol(&k, &h200).sol_us;
                rows.push(Measurement { routing: Routing::Uniform, kernel: k, gpu: "h200_sxm".into(), backend: backend.into(), source: "s".into(), latency_us });
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let mut m = OpModel::fit(Op::Copy, &refs, &|_| &h200, &FitParams::default());
        m.form = Form::BaseOnly;
        let small = copy(64 << 10);
        let got = m.predict_us(&small, &h100, Some("torch_index_select"));
        let expected = 2.0 + 1.3 * sol(&small, &h100).sol_us;
        assert!((got / expected - 1.0).abs() < 0.05, "{got} vs {expected}");
        assert!(m.predict_us(&small, &h100, Some("torch_masked_scatter")) > 9.0);
    }

    #[test]
    fn eager_timed_collectives_get_their_own_trees() {
        use crate::hardware::load_gpu;
        // H100 x4 all-reduce, 16 KiB-1 MiB: NCCL-tests rows smooth at 11 us + 1.2 x wire time;
        // Vidur's eager rows at the same sizes flip between 8 and 40 us (two populations in
        // one profile). The NCCL predictions must not inherit the flips.
        let h100 = load_gpu("h100_sxm").unwrap();
        let mut rows = Vec::new();
        for i in 0..64u64 {
            let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Bf16);
            k.num_gpus = 4;
            k.bytes = 16_384 + i * 16_384;
            let sol_us = features::extract_with_sol(&k, &h100, "nccl").1.sol_us;
            let row = |backend: &str, latency_us: f64| Measurement { routing: Routing::Uniform, kernel: k.clone(), gpu: "h100_sxm".into(), backend: backend.into(), source: "s".into(), latency_us };
            rows.push(row("nccl", 11.0 + 1.2 * sol_us));
            rows.push(row("vidur/dgx/all_reduce", if (i / 3) % 2 == 0 { 40.0 } else { 8.0 }));
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let m = OpModel::fit(Op::AllReduce, &refs, &|_| &h100, &FitParams::default());
        assert!(m.by_path.contains_key("eager"), "{:?}", m.by_path.keys());
        assert_eq!(m.default_backend, "nccl");
        for r in rows.iter().filter(|r| r.backend == "nccl") {
            let p = m.predict_us(&r.kernel, &h100, Some("nccl"));
            assert!((p / r.latency_us - 1.0).abs() < 0.05, "{} B: {p} vs {}", r.kernel.bytes, r.latency_us);
        }
        // The eager rows are still predicted by their own model.
        let v = &rows[1];
        assert!(m.predict_us(&v.kernel, &h100, Some(&v.backend)) > 8.0);
    }

    #[test]
    fn link_class_follows_the_measured_topology() {
        use crate::hardware::load_gpu;
        let h100 = load_gpu("h100_sxm").unwrap();
        let a40 = load_gpu("a40").unwrap();
        assert_eq!(LinkClass::of_row(&h100, 2, "nccl"), LinkClass::ScaleUp);
        assert_eq!(LinkClass::of_row(&h100, 2, "vidur/dgx/internode/send_recv"), LinkClass::ScaleOut);
        assert_eq!(LinkClass::of_row(&h100, 2, "vidur/pairwise_nvlink/all_reduce"), LinkClass::Bridge);
        assert_eq!(LinkClass::of_row(&h100, 4, "vidur/pairwise_nvlink/all_reduce"), LinkClass::Pcie);
        assert_eq!(LinkClass::of_row(&a40, 2, "vidur/pairwise_nvlink/send_recv"), LinkClass::Pcie);
        // A 2-GPU internode p2p of 50 MB on H100 is bounded by its 50 GB/s NIC, not NVLink.
        let mut k = Kernel::new(Op::P2p, crate::schema::Dtype::Fp16);
        k.num_gpus = 2;
        k.bytes = 50_000_000;
        let s = features::collective_sol(&k, &h100, LinkClass::ScaleOut);
        assert!((s.sol_us - 1000.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn network_sol_follows_the_rows_topology() {
        use crate::hardware::load_gpu;
        let a100 = load_gpu("a100_sxm").unwrap();
        let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Fp16);
        k.bytes = 64 << 20;
        // Vidur's 16-GPU internode all-reduce spans two nodes of 8: each node sends
        // 2 * 15/16 * 64 MiB over its 8 NICs of 25 GB/s.
        k.num_gpus = 16;
        let (_, s) = features::extract_with_sol(&k, &a100, "vidur/dgx/internode/all_reduce");
        let expected = 2.0 * 15.0 / 16.0 * (64u64 << 20) as f64 / (8.0 * 25e9) * 1e6;
        assert!((s.sol_us - expected).abs() < 1e-6, "{} vs {expected}", s.sol_us);
        // 8 GPUs internode: two nodes of 4, so 4 NICs per node.
        k.num_gpus = 8;
        let (_, s) = features::extract_with_sol(&k, &a100, "vidur/dgx/internode/all_reduce");
        let expected = 2.0 * 7.0 / 8.0 * (64u64 << 20) as f64 / (4.0 * 25e9) * 1e6;
        assert!((s.sol_us - expected).abs() < 1e-6, "{} vs {expected}", s.sol_us);
        // The same 8 GPUs in one HGX node run on NVLink (300 GB/s).
        let (_, s) = features::extract_with_sol(&k, &a100, "nccl");
        let expected = 2.0 * 7.0 / 8.0 * (64u64 << 20) as f64 / 300e9 * 1e6;
        assert!((s.sol_us - expected).abs() < 1e-6, "{} vs {expected}", s.sol_us);
        // A p2p send between two pairwise-NVLink servers: their own network, bounded by the
        // host PCIe (32 GB/s on A100), not the HGX NIC.
        let mut p = Kernel::new(Op::P2p, crate::schema::Dtype::Fp16);
        p.num_gpus = 2;
        p.bytes = 32_000_000;
        let backend = "vidur/pairwise_nvlink/internode/send_recv";
        assert_eq!(LinkClass::of_row(&a100, 2, backend), LinkClass::HostNet);
        let (_, s) = features::extract_with_sol(&p, &a100, backend);
        assert!((s.sol_us - 1000.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_correction_seen_on_one_cluster_is_not_applied() {
        use crate::hardware::load_gpu;
        // NCCL rows on H100 and B200 and eager (Vidur) rows on H100 only, all over NVSwitch.
        // Both populations carry a size-dependent factor the base cannot express.
        let specs = [load_gpu("h100_sxm").unwrap(), load_gpu("b200_sxm").unwrap()];
        let spec = |g: &str| specs.iter().find(|s| s.id == g).unwrap();
        let mut rows = Vec::new();
        for g in &specs {
            for p in 10..=28 {
                for (backend, lat) in [("nccl", 10.0), ("vidur/dgx/all_reduce", 40.0)] {
                    if backend.starts_with("vidur") && g.id != "h100_sxm" {
                        continue;
                    }
                    let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Fp16);
                    k.num_gpus = 8;
                    k.bytes = 1u64 << p;
                    let sol_us = features::extract_with_sol(&k, g, backend).1.sol_us;
                    let bump = if p % 2 == 0 { 1.3 } else { 1.0 };
                    rows.push(Measurement {
                        kernel: k,
                        gpu: g.id.clone(),
                        backend: backend.into(),
                        source: "s".into(),
                        latency_us: (lat + 1.25 * sol_us) * bump,
                        routing: Routing::Uniform,
                    });
                }
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let m = OpModel::fit(Op::AllReduce, &refs, &spec, &FitParams::default());
        let ranges = m.correction_ranges.as_ref().expect("collectives list their ranges");
        assert!(ranges.contains_key("scaleup"), "{ranges:?}");
        let eager_ranges = m.by_path["eager"].correction_ranges.as_ref().expect("collectives list their ranges");
        assert!(!eager_ranges.contains_key("scaleup/eager"), "{eager_ranges:?}");
        // The eager key's correction is kept for its own cluster only; the NCCL row gets its
        // correction on every GPU.
        assert_eq!(m.by_path["eager"].own_corrections["scaleup/eager"].0, "h100_sxm");
        let mut base_only = m.clone();
        base_only.form = Form::BaseOnly;
        let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Fp16);
        k.num_gpus = 8;
        k.bytes = 1 << 20;
        let eager = Some("vidur/dgx/all_reduce");
        assert_ne!(m.predict_us(&k, &specs[0], eager), base_only.predict_us(&k, &specs[0], eager));
        assert_ne!(m.predict_us(&k, &specs[0], Some("nccl")), base_only.predict_us(&k, &specs[0], Some("nccl")));
        // Without its carrying rule (`eager_transfer_us`), B200's eager row is the base alone.
        let mut no_transfer = m.clone();
        no_transfer.by_path.get_mut("eager").unwrap().library_gpus.clear();
        let mut no_transfer_base = no_transfer.clone();
        no_transfer_base.form = Form::BaseOnly;
        assert_eq!(no_transfer.predict_us(&k, &specs[1], eager), no_transfer_base.predict_us(&k, &specs[1], eager));
        // Fitted on one GPU (the target tier), every key keeps its correction.
        let own: Vec<&Measurement> = rows.iter().filter(|m| m.gpu == "h100_sxm").collect();
        let t = OpModel::fit(Op::AllReduce, &own, &spec, &FitParams::default());
        assert!(t.by_path["eager"].correction_ranges.as_ref().unwrap().contains_key("scaleup/eager"));
    }

    #[test]
    fn an_eager_library_is_carried_to_another_gpu_by_the_benchmark_timed_ratio() {
        use crate::hardware::load_gpu;
        // NCCL rows on A100, H200 and B200 over NVSwitch, each GPU with its own latency and
        // bandwidth share (H100 as its NVLink twin H200); Vidur's eager rows on A100 only, 1.5x
        // A100's NCCL. If the eager path
        // costs the same on H100 relative to its NCCL, H100's eager time is A100's times the
        // NCCL ratio, which the base alone (A100's latency, SOL at H100's link) misses.
        let specs = [load_gpu("a100_sxm").unwrap(), load_gpu("h100_sxm").unwrap(), load_gpu("b200_sxm").unwrap(), load_gpu("h200_sxm").unwrap()];
        let spec = |g: &str| specs.iter().find(|s| s.id == g).unwrap();
        let nccl_us = |g: &GpuSpec, k: &Kernel| {
            let (lat, c) = match g.id.as_str() {
                "a100_sxm" => (20.0, 1.4),
                "h100_sxm" | "h200_sxm" => (12.0, 1.05),
                _ => (14.0, 1.1),
            };
            lat + c * features::extract_with_sol(k, g, "nccl").1.sol_us
        };
        let kernel = |p: u32| {
            let mut k = Kernel::new(Op::AllReduce, crate::schema::Dtype::Fp16);
            k.num_gpus = 8;
            k.bytes = 1u64 << p;
            k
        };
        let eager_us = |g: &GpuSpec, k: &Kernel| 1.5 * nccl_us(g, k);
        let mut rows = Vec::new();
        for g in &specs {
            for p in 10..=28 {
                let k = kernel(p);
                let row = |backend: &str, latency_us: f64| Measurement { routing: Routing::Uniform, kernel: k.clone(), gpu: g.id.clone(), backend: backend.into(), source: "s".into(), latency_us };
                rows.push(row("nccl", nccl_us(g, &k)));
                if g.id == "a100_sxm" {
                    rows.push(row("vidur/dgx/all_reduce", eager_us(g, &k)));
                    // A multi-node profile: off the fabric, never carried.
                    rows.push(row("vidur/dgx/internode/all_reduce", 3.0 * eager_us(g, &k)));
                }
            }
        }
        let refs: Vec<&Measurement> = rows.iter().filter(|r| r.gpu != "h100_sxm").collect();
        let m = OpModel::fit(Op::AllReduce, &refs, &spec, &FitParams::default());
        assert_eq!(m.by_path["eager"].library_gpus["vidur/dgx/all_reduce"], vec!["a100_sxm".to_string()]);
        let mut no_transfer = m.clone();
        no_transfer.by_path.get_mut("eager").unwrap().library_gpus.clear();
        let (mut carried, mut base) = (Vec::new(), Vec::new());
        for p in [12, 16, 20, 24, 27] {
            let k = kernel(p);
            let truth = eager_us(&specs[1], &k);
            carried.push((m.predict_us(&k, &specs[1], Some("vidur/dgx/all_reduce")) / truth - 1.0).abs());
            base.push((no_transfer.predict_us(&k, &specs[1], Some("vidur/dgx/all_reduce")) / truth - 1.0).abs());
            // The GPU that measured the library keeps its own prediction.
            assert_eq!(
                m.predict_us(&k, &specs[0], Some("vidur/dgx/all_reduce")),
                no_transfer.predict_us(&k, &specs[0], Some("vidur/dgx/all_reduce"))
            );
            // Rows off the fabric are not carried.
            assert_eq!(
                m.predict_us(&k, &specs[1], Some("vidur/dgx/internode/all_reduce")),
                no_transfer.predict_us(&k, &specs[1], Some("vidur/dgx/internode/all_reduce"))
            );
        }
        let worst = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        assert!(worst(&carried) < 0.15, "carried errors {carried:?}");
        assert!(worst(&carried) < worst(&base), "carried {carried:?} vs base alone {base:?}");
    }

    #[test]
    fn mla_module_rows_get_their_own_model_and_share_one_base_across_norm_dispatches() {
        use crate::hardware::load_gpu;
        use crate::kernels::dispatch_chain::ChainFit;
        use crate::schema::Dtype;
        // mla_decode on H200: attention-core rows t = 20 us + 4 x SOL; whole-module rows
        // (native norm chain) t = 80 us + 2 x module SOL; module rows with the fused norm and
        // rotary kernels faster by the chain's extra time.
        let g = load_gpu("h200_sxm").unwrap();
        let chain = ChainFit::h200();
        let mut rows = Vec::new();
        for b in [1u64, 4, 16, 64, 256] {
            for kv in [1024u64, 4096, 16384] {
                for h in [1u64, 16, 128] {
                    let mut k = Kernel::new(Op::MlaDecode, Dtype::Bf16);
                    (k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim) = (b, kv, h, 1, 576);
                    let core = crate::perf::sol::sol(&k, &g).sol_us;
                    let module = features::row_sol(&k, &g, "vllm/module_gemm_bfloat16/K").sol_us;
                    let row = |backend: &str, latency_us: f64| Measurement {
                        kernel: k.clone(),
                        gpu: "h200_sxm".into(),
                        backend: backend.into(),
                        source: "s".into(),
                        latency_us,
                        routing: Routing::Uniform,
                    };
                    rows.push(row("vllm/core_kernel", 20.0 + 4.0 * core));
                    rows.push(row("vllm/module_gemm_bfloat16/K", 80.0 + 2.0 * module));
                    rows.push(row("vllm/module_gemm_bfloat16/norm_vllm_c/K", 80.0 + 2.0 * module - chain.extra_us(&k, &g)));
                }
            }
        }
        let refs: Vec<&Measurement> = rows.iter().collect();
        let m = OpModel::fit(Op::MlaDecode, &refs, &|_| &g, &FitParams::default());
        // The core rows make the model itself, with a core base and a core default backend
        // (the step graph's MLA kernel is the attention core).
        assert_eq!(m.default_backend, "vllm/core_kernel");
        assert!(m.bases.keys().all(|k| k == "core" || k == "all"), "{:?}", m.bases);
        let sub = &m.by_path["module"];
        // Both dispatches train one module base (the fused rows as the native chain times
        // them), and one one-hot category: the dispatch lives in the chain term alone.
        assert!(sub.bases.keys().all(|k| k == "module" || k == "all"), "{:?}", sub.bases);
        assert!(!sub.backends.iter().any(|b| b.contains("norm_")), "{:?}", sub.backends);
        // Predictions follow each row's path.
        let mut k = Kernel::new(Op::MlaDecode, Dtype::Bf16);
        (k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim) = (16, 4096, 16, 1, 576);
        let module = features::row_sol(&k, &g, "vllm/module_gemm_bfloat16/K").sol_us;
        let native = m.predict_us(&k, &g, Some("vllm/module_gemm_bfloat16/K"));
        assert!((native / (80.0 + 2.0 * module) - 1.0).abs() < 0.1, "{native} vs {}", 80.0 + 2.0 * module);
        let extra = chain.extra_us(&k, &g);
        assert!(extra > 20.0);
        let fused = m.predict_us(&k, &g, Some("vllm/module_gemm_bfloat16/norm_vllm_c/K"));
        assert!((fused - (native - extra)).abs() < 1e-6, "{fused} {native} {extra}");
        let core = crate::perf::sol::sol(&k, &g).sol_us;
        let p = m.predict_us(&k, &g, None);
        assert!((p / (20.0 + 4.0 * core) - 1.0).abs() < 0.1, "{p} vs {}", 20.0 + 4.0 * core);
        // A model of native module rows only, asked for the attention core (no backend named):
        // the module time at the core's share of the module SOL, never the whole module.
        let only: Vec<&Measurement> = rows.iter().filter(|r| r.backend == "vllm/module_gemm_bfloat16/K").collect();
        let mo = OpModel::fit(Op::MlaDecode, &only, &|_| &g, &FitParams::default());
        let whole = mo.predict_us(&k, &g, Some("vllm/module_gemm_bfloat16/K"));
        let p = mo.predict_us(&k, &g, None);
        assert!((p - (whole * core / module).max(core)).abs() < 1e-9 && p < whole, "{p} {whole}");
        // Asked for a norm dispatch it never measured, that model takes the native chain's
        // extra off the plain module's time (cross-gen B200 from the other GPUs' tables).
        let fused = mo.predict_us(&k, &g, Some("vllm/module_gemm_bfloat16/norm_vllm_c/K"));
        assert!((fused - (whole - extra)).abs() < 1e-6, "{fused} {whole} {extra}");
        // A model of fused-dispatch rows only prices the native module by adding the chain.
        let fused_only: Vec<&Measurement> = rows.iter().filter(|r| r.backend.contains("norm_vllm_c")).collect();
        let mf = OpModel::fit(Op::MlaDecode, &fused_only, &|_| &g, &FitParams::default());
        let native_from_fused = mf.predict_us(&k, &g, Some("vllm/module_gemm_bfloat16/K"));
        assert!((native_from_fused / (80.0 + 2.0 * module) - 1.0).abs() < 0.1, "{native_from_fused}");
    }

}
