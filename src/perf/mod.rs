//! Kernel and step timing: speed of light, learned efficiency, communication and host
//! overhead, composed by a predictor the simulator asks for step times.

pub mod efficiency;
pub mod graphs;
pub mod host;
pub mod host_probe;
pub mod power_cap;
pub mod predictor;
pub mod roofline;
pub mod sol;

use serde::Serialize;

/// One sequence's share of an engine step: `new_tokens` computed this step on top of
/// `cached_tokens` already in its KV cache (decode: new_tokens = 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct SeqWork {
    pub new_tokens: u32,
    pub cached_tokens: u32,
}

/// Time of one engine step, split by kernel class.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepCost {
    pub total_us: f64,
    pub gemm_us: f64,
    pub attention_us: f64,
    pub moe_us: f64,
    pub elementwise_us: f64,
    pub communication_us: f64,
    pub host_us: f64,
    /// GPU idle between the kernels of a replayed CUDA graph (`GraphPadding::replay_gap_per_kernel_ns`).
    pub graph_idle_us: f64,
    /// Host time to schedule and launch this step by itself (part of `total_us`): under async
    /// scheduling it runs while the GPU works on the step before, and the step before hands its
    /// tokens out only once it is done (`sim::replica::HostTimeline`). 0 without host terms.
    #[serde(skip)]
    pub launch_us: f64,
}

impl StepCost {
    pub fn add_class(&mut self, class: &str, us: f64) {
        match class {
            "gemm" => self.gemm_us += us,
            "attention" => self.attention_us += us,
            "moe" => self.moe_us += us,
            "communication" => self.communication_us += us,
            "host" => self.host_us += us,
            "graph_idle" => self.graph_idle_us += us,
            _ => self.elementwise_us += us,
        }
        self.total_us += us;
    }

    pub fn classes(&self) -> [(&'static str, f64); 7] {
        [
            ("gemm", self.gemm_us),
            ("attention", self.attention_us),
            ("moe", self.moe_us),
            ("elementwise", self.elementwise_us),
            ("communication", self.communication_us),
            ("host", self.host_us),
            ("graph_idle", self.graph_idle_us),
        ]
    }
}

/// What the simulator asks of a timing model.
///
/// Preconditions: `seqs` is non-empty, every `new_tokens >= 1`.
/// Postconditions: `total_us > 0` and equals the sum of the class times; the result depends
/// only on the multiset of `seqs` (order-independent) and is deterministic.
pub trait StepTimeModel: Send + Sync {
    fn step_time(&self, seqs: &[SeqWork]) -> StepCost;
    /// A step started on an idle engine (no step in flight, none just ended). Async scheduling
    /// prepares step n+1 while the GPU runs step n; with no step n, that host work is serial.
    /// Models without such overlap time it as any step.
    fn step_time_from_idle(&self, seqs: &[SeqWork]) -> StepCost {
        self.step_time(seqs)
    }
    /// Which tier/model produced the times, for reports.
    fn describe(&self) -> String;
    /// Time a request spends between the client and the engine core, in and out (API server,
    /// tokenizer, IPC, detokenizer): added to its TTFT and end-to-end latency and to a
    /// closed-loop client's turnaround, not to the gaps between its tokens.
    fn request_path_us(&self) -> f64 {
        0.0
    }
    /// How long an idle engine takes from its first arrival to starting the step that serves it;
    /// whatever arrives meanwhile joins that step (a burst's split across steps hangs on it).
    fn idle_wake_us(&self) -> f64 {
        0.0
    }
}

/// Which kernel-time model a prediction uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Speed of light divided by one constant efficiency per op class (the baseline).
    Roofline,
    /// Efficiency models fitted with the target GPU's own measurements.
    Target,
    /// Target GPU's measurements never used: efficiency from hardware-normalized features
    /// learned on other GPUs plus the target's spec sheet.
    CrossGen,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Roofline => "roofline",
            Tier::Target => "target",
            Tier::CrossGen => "cross-gen",
        }
    }
}

/// Time of one kernel on one GPU. Implementations never return less than the kernel's SOL.
pub trait KernelTimeModel: Send + Sync {
    fn predict_us(&self, k: &crate::schema::Kernel) -> f64;
    /// As `predict_us`, run by the kernel library `library` where the model knows it.
    fn predict_us_in(&self, k: &crate::schema::Kernel, _library: &str) -> f64 {
        self.predict_us(k)
    }
    /// The measured library (calibrated backend category) that times `op` among those the
    /// engine names, if this model has measurements of one (on this GPU or, for cross-gen, on
    /// the GPUs it was fitted on).
    fn engine_library(&self, _op: crate::schema::Op, _dtype: crate::schema::Dtype) -> Option<String> {
        None
    }
    fn tier(&self) -> Tier;
    fn describe(&self) -> String;
    /// How served tokens spread over MoE experts in `predict_us` (the SOL a report shows
    /// alongside must count the same experts and assignments).
    fn served_routing(&self) -> crate::kernels::cost::Routing {
        crate::kernels::cost::Routing::SERVED_DEFAULT
    }
}
