//! Host (CPU) overhead of an engine step: scheduling, input preparation, kernel launches and
//! sampling bookkeeping that the GPU does not hide. Parameters per engine live in
//! `calibration/host/<engine>.json` (fitted on end-to-end traces) and are embedded.

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

pub use super::host_probe::{HostProbe, HostSpeed};

include!(concat!(env!("OUT_DIR"), "/embedded_calibration.rs"));

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostOverhead {
    /// Fixed CPU time per step that no GPU work overlaps (scheduler, sync, bookkeeping).
    pub per_step_us: f64,
    pub per_seq_us: f64,
    /// Per scheduled sequence and KV cache layer group (`ModelConfig::kv_cache_groups`):
    /// engines whose Python scheduler books each request's blocks group by group
    /// (transformers' continuous batching), so sliding-window hybrids pay it many times.
    #[serde(default)]
    pub per_seq_cache_group_us: f64,
    pub per_token_us: f64,
    /// Per token of KV each scheduled sequence reads, per full-attention cache group: the
    /// engine lists every token's cache slot on the host (transformers' `get_read_indices`).
    #[serde(default)]
    pub per_full_read_token_us: f64,
    /// The same per sliding-window cache group (each sequence's read capped at the window),
    /// a per-token Python loop in transformers, several times dearer than the full path.
    #[serde(default)]
    pub per_sliding_read_token_us: f64,
    /// Eager engines launch each layer's kernels from Python while the GPU runs: the step
    /// lasts max(GPU time, launch_per_layer_us x layers). 0 for CUDA-graph engines.
    #[serde(default)]
    pub launch_per_layer_us: f64,
    /// Eager engines: Python dispatch per aten op; the step lasts at least
    /// `launch_per_layer_us x layers + launch_per_host_op_us x host_ops` (`StepLoad::host_ops`).
    #[serde(default)]
    pub launch_per_host_op_us: f64,
    /// Engines with piecewise compiled graphs (`EngineParams::piecewise_graph_max_tokens`):
    /// host time per layer of a step with prefill tokens that replays the pieces (attention
    /// launched between them), and of one too large for graphs (the compiled model run without
    /// them). Like eager launches, the step lasts at least this long.
    #[serde(default)]
    pub piecewise_launch_per_layer_us: f64,
    #[serde(default)]
    pub eager_launch_per_layer_us: f64,
    /// Eager engines that shard layers with Python hooks (transformers' tensor-parallel plan:
    /// hooks around every sharded linear, ranks kept in lockstep): host time per layer of a
    /// step at tp > 1, before the layer's launches, so it hides behind GPU-bound steps. Fitted
    /// on static `generate` decode steps at TP2 (`e2e::static_steps::fit_tp_hooks`).
    #[serde(default)]
    pub tp_launch_per_layer_us: f64,
    /// Per layer and step, work the kernel graph does not list and no GPU overlap hides: the
    /// unfused eager elementwise kernels (norm pieces, rotary halves, casts, routing) a CUDA
    /// graph of an eager model replays at their launch floor.
    #[serde(default)]
    pub per_layer_us: f64,
    /// CUDA-graph engines that capture lazily: a fixed cost and the per-kernel launch time of
    /// the eager passes of a capture (see `capture_extra_us`).
    #[serde(default)]
    pub graph_capture_us: f64,
    #[serde(default)]
    pub graph_capture_per_kernel_us: f64,
    /// Per million activation elements a capture adds to the graphs' shared memory pool
    /// (`CaptureLoad::activations`): the pool is allocated as captures first need it, so a
    /// shape no larger than one captured before in the run pays nothing here.
    #[serde(default)]
    pub graph_capture_per_m_activations_us: f64,
    /// Eager engines running cuDNN's SDPA over packed, unpadded batches (transformers'
    /// `paged|sdpa` without CUDA graphs): cuDNN builds an execution plan, on the host, for each
    /// (query, key) shape it has not run before, and a decode batch's key count grows every
    /// step. Charged per new shape (`Predictor::register_sdpa_plan`); under CUDA graphs the
    /// shapes are padded and the build is part of a capture.
    #[serde(default)]
    pub sdpa_plan_us: f64,
    /// Per request, the path between the client and the engine core and back (API server,
    /// tokenizer, IPC, detokenizer): added to TTFT and end-to-end latency, not to inter-token
    /// gaps (`StepTimeModel::request_path_us`). Measured, not fitted, where traces carry the
    /// engine's own timestamps (`e2e::host_fit::measured_request_path_us`).
    #[serde(default)]
    pub request_path_us: f64,
    /// From the first request reaching an idle engine core to the step that serves it: requests
    /// that arrive in between join that step (`StepTimeModel::idle_wake_us`). Measured from the
    /// engine's timestamps, like `request_path_us`, which then leaves it out.
    #[serde(default)]
    pub idle_wake_us: f64,
    /// The host-speed probe's median `python_loop_ns` on machines that run this engine's host
    /// work as fast as the model says (`--host-probe` scales by a host's reading over this);
    /// none where no probed machine was checked against the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_python_loop_ns: Option<f64>,
    /// Where set, a probed host scales only the CUDA-graph capture terms, by (its reading /
    /// `probe_python_loop_ns`) to this power, and leaves the other terms as they are: capture
    /// cost, host and driver work, follows the probe less than linearly across machines
    /// (`e2e::host_fit::ProbedCaptures::fit`). Unset: every term scales linearly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_probe_exponent: Option<f64>,
    /// Where set (and no capture exponent is), a probed host scales every term by (its reading /
    /// `probe_python_loop_ns`) to this power instead of linearly: the eager transformers engine's
    /// steps follow the probe less than in proportion across machines
    /// (`e2e::host_fit::ProbedEager::fit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_exponent: Option<f64>,
    /// Where the figures come from.
    pub source: Provenance,
}

/// Where a host model's terms come from, one entry per fit that set some of them: vLLM's
/// per-step terms come from the public H100 rows (`e2e::silicon::fit`), its prefill-step
/// launch terms and request path from the H200 traces (`e2e::host_fit::fit_host_vllm`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The fit that set every term `launch_terms` does not name.
    pub step_terms: String,
    /// The fit that set the prefill-step launch terms (`piecewise_launch_per_layer_us`,
    /// `eager_launch_per_layer_us`) and `request_path_us`, where another fit than
    /// `step_terms`'s did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub launch_terms: String,
    /// Which machines `probe_python_loop_ns` was read on and why they are the reference.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub probe_reference: String,
    /// A what-if applied on top at run time (`--host-scale`, `--host-probe`); never written by a fit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub adjusted: String,
}

impl Provenance {
    /// One fit (or note) for every term.
    pub fn of(text: impl Into<String>) -> Provenance {
        Provenance { step_terms: text.into(), ..Provenance::default() }
    }
}

impl std::fmt::Display for Provenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.step_terms)?;
        if !self.launch_terms.is_empty() {
            write!(f, "; launch terms and request path: {}", self.launch_terms)?;
        }
        if !self.probe_reference.is_empty() {
            write!(f, "; host probe: {}", self.probe_reference)?;
        }
        if !self.adjusted.is_empty() {
            write!(f, "; {}", self.adjusted)?;
        }
        Ok(())
    }
}

/// What capturing a step's CUDA graph involves, in the units of the capture terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureLoad {
    /// The step's kernel launches (each pass of the capture launches them all).
    pub kernels: u64,
    /// Activation elements the capture adds to the graphs' shared memory pool: padded tokens
    /// beyond the largest earlier capture's, x hidden x layers.
    pub activations: u64,
}

/// What one step asks of the host, in the units of the host model's terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepLoad {
    pub layers: u64,
    /// Aten ops the engine's Python dispatches (`EngineParams::host_ops`; an op the profile does
    /// not list counts its kernel launches, unfused pieces counted).
    pub host_ops: u64,
    pub seqs: u64,
    /// Layers of a step that replays piecewise graphs / runs the compiled model without graphs
    /// (`EngineParams::piecewise_graph_max_tokens`; 0 otherwise).
    pub piecewise_layers: u64,
    pub eager_layers: u64,
    /// Layers sharded over more than one GPU (tensor parallelism; 0 at tp = 1).
    pub tp_layers: u64,
    /// Scheduled sequences x the model's KV cache layer groups.
    pub seq_groups: u64,
    /// New (query) tokens of the step.
    pub tokens: u64,
    /// KV tokens the sequences read (cached + new), summed over full-attention cache groups.
    pub full_read_tokens: u64,
    /// The same over sliding-window cache groups, each sequence's capped at the window.
    pub sliding_read_tokens: u64,
}

impl Default for HostOverhead {
    /// A CUDA-graph engine's few hundred microseconds per step; used when an engine has no
    /// fitted file (documented in `docs/ARCHITECTURE.md`).
    fn default() -> Self {
        HostOverhead {
            per_step_us: 250.0,
            per_seq_us: 2.0,
            per_token_us: 0.05,
            source: Provenance::of("default placeholder (not fitted)"),
            ..HostOverhead::zero()
        }
    }
}

impl HostOverhead {
    /// No host overhead at all (the GPU time alone).
    pub fn zero() -> HostOverhead {
        HostOverhead {
            per_step_us: 0.0,
            per_seq_us: 0.0,
            per_seq_cache_group_us: 0.0,
            per_token_us: 0.0,
            per_full_read_token_us: 0.0,
            per_sliding_read_token_us: 0.0,
            launch_per_layer_us: 0.0,
            launch_per_host_op_us: 0.0,
            piecewise_launch_per_layer_us: 0.0,
            eager_launch_per_layer_us: 0.0,
            tp_launch_per_layer_us: 0.0,
            per_layer_us: 0.0,
            graph_capture_us: 0.0,
            graph_capture_per_kernel_us: 0.0,
            graph_capture_per_m_activations_us: 0.0,
            sdpa_plan_us: 0.0,
            request_path_us: 0.0,
            idle_wake_us: 0.0,
            probe_python_loop_ns: None,
            capture_probe_exponent: None,
            probe_exponent: None,
            source: Provenance::of("none"),
        }
    }

    /// Every term times `factor`: the same engine on a host CPU `factor` times slower (> 1) or
    /// faster than the one the model was fitted on. Lent H200 machines differ by up to ~1.5x in
    /// vLLM's host-bound decode (`microbench/data/h200_sxm/vllm_engine/README.md`, run 9).
    pub fn scaled(&self, factor: f64) -> Result<HostOverhead> {
        if !(factor > 0.0 && factor.is_finite()) {
            bail!("--host-scale must be a positive finite number (1 = the machine the host model was fitted on), got {factor}");
        }
        let mut h = self.clone();
        if factor != 1.0 {
            for (_, v) in h.terms_mut() {
                *v *= factor;
            }
            h.source.adjusted = format!("every term x {factor} (--host-scale)");
        }
        Ok(h)
    }

    /// The model for a host of the given speed: `--host-scale` as `scaled`; `--host-probe` the
    /// probe's median over `probe_python_loop_ns`, an error where the model records none.
    pub fn at_speed(&self, speed: &HostSpeed) -> Result<HostOverhead> {
        let probe = match speed {
            HostSpeed::Scale(f) => return self.scaled(*f),
            HostSpeed::Probe(p) => p,
        };
        let Some(reference) = self.probe_python_loop_ns else {
            bail!(
                "--host-probe: this engine's host model ({}) records no probe reference (field 'probe_python_loop_ns'); \
                 give the host's speed as --host-scale instead",
                self.source.step_terms
            );
        };
        let factor = probe.factor_against(reference);
        if let Some(exponent) = self.capture_probe_exponent {
            let capture = factor.powf(exponent);
            let mut h = self.with_capture_scaled(capture);
            h.source.adjusted = format!(
                "CUDA-graph capture terms x {capture:.3} (--host-probe: median python_loop_ns {:.1} over {} readings against {reference:.1}, to the power {exponent:.2})",
                probe.median_python_loop_ns(),
                probe.python_loop_ns.len()
            );
            return Ok(h);
        }
        let exponent = self.probe_exponent.unwrap_or(1.0);
        let factor = factor.powf(exponent);
        let mut h = self.scaled(factor)?;
        h.source.adjusted = format!(
            "every term x {factor:.3} (--host-probe: median python_loop_ns {:.1} over {} readings against {reference:.1} on the reference machines, to the power {exponent:.2})",
            probe.median_python_loop_ns(),
            probe.python_loop_ns.len()
        );
        Ok(h)
    }

    /// The CUDA-graph capture terms times `factor`, every other term as it is.
    pub fn with_capture_scaled(&self, factor: f64) -> HostOverhead {
        let mut h = self.clone();
        h.graph_capture_us *= factor;
        h.graph_capture_per_kernel_us *= factor;
        h.graph_capture_per_m_activations_us *= factor;
        h
    }

    /// Every time term with its field name: what `scaled` multiplies and `validate` checks.
    fn terms_mut(&mut self) -> [(&'static str, &mut f64); 18] {
        [
            ("per_step_us", &mut self.per_step_us),
            ("per_seq_us", &mut self.per_seq_us),
            ("per_seq_cache_group_us", &mut self.per_seq_cache_group_us),
            ("per_token_us", &mut self.per_token_us),
            ("per_full_read_token_us", &mut self.per_full_read_token_us),
            ("per_sliding_read_token_us", &mut self.per_sliding_read_token_us),
            ("launch_per_layer_us", &mut self.launch_per_layer_us),
            ("launch_per_host_op_us", &mut self.launch_per_host_op_us),
            ("piecewise_launch_per_layer_us", &mut self.piecewise_launch_per_layer_us),
            ("eager_launch_per_layer_us", &mut self.eager_launch_per_layer_us),
            ("tp_launch_per_layer_us", &mut self.tp_launch_per_layer_us),
            ("per_layer_us", &mut self.per_layer_us),
            ("graph_capture_us", &mut self.graph_capture_us),
            ("graph_capture_per_kernel_us", &mut self.graph_capture_per_kernel_us),
            ("graph_capture_per_m_activations_us", &mut self.graph_capture_per_m_activations_us),
            ("sdpa_plan_us", &mut self.sdpa_plan_us),
            ("request_path_us", &mut self.request_path_us),
            ("idle_wake_us", &mut self.idle_wake_us),
        ]
    }

    /// Step wall time from the GPU time of its kernels and what the step asks of the host.
    pub fn step_us(&self, gpu_us: f64, load: &StepLoad) -> f64 {
        let launch = self.launch_per_layer_us * load.layers as f64
            + self.launch_per_host_op_us * load.host_ops as f64
            + self.piecewise_launch_per_layer_us * load.piecewise_layers as f64
            + self.eager_launch_per_layer_us * load.eager_layers as f64
            + self.tp_launch_per_layer_us * load.tp_layers as f64;
        gpu_us.max(launch)
            + self.per_step_us
            + self.per_layer_us * load.layers as f64
            + self.per_seq_us * load.seqs as f64
            + self.per_seq_cache_group_us * load.seq_groups as f64
            + self.per_token_us * load.tokens as f64
            + self.per_full_read_token_us * load.full_read_tokens as f64
            + self.per_sliding_read_token_us * load.sliding_read_tokens as f64
    }

    /// One line: every non-zero term with its unit.
    pub fn summary(&self) -> String {
        let terms = [
            (self.per_step_us, "us/step"),
            (self.per_layer_us, "us/layer"),
            (self.per_seq_us, "us/seq"),
            (self.per_seq_cache_group_us, "us/seq/cache-group"),
            (self.per_token_us, "us/token"),
            (self.per_full_read_token_us, "us/KV-token/full-group"),
            (self.per_sliding_read_token_us, "us/KV-token/sliding-group"),
        ];
        // Per-token terms are fractions of a microsecond: three decimals there.
        let mut s: Vec<String> = terms
            .iter()
            .filter(|(v, _)| *v > 0.0)
            .map(|(v, u)| if u.contains("token") { format!("{v:.3} {u}") } else { format!("{v:.1} {u}") })
            .collect();
        if s.is_empty() {
            s.push("0 us/step".into());
        }
        let mut line = s.join(" + ");
        if self.launch_per_layer_us > 0.0 {
            line += &format!(", eager launches {:.0} us/layer", self.launch_per_layer_us);
        }
        if self.launch_per_host_op_us > 0.0 {
            line += &format!(", eager dispatch {:.1} us/aten op", self.launch_per_host_op_us);
        }
        if self.piecewise_launch_per_layer_us > 0.0 || self.eager_launch_per_layer_us > 0.0 {
            line += &format!(
                ", prefill steps {:.0} us/layer with piecewise graphs, {:.0} us/layer without",
                self.piecewise_launch_per_layer_us, self.eager_launch_per_layer_us
            );
        }
        if self.tp_launch_per_layer_us > 0.0 {
            line += &format!(", tensor-parallel hooks {:.0} us/layer at tp > 1", self.tp_launch_per_layer_us);
        }
        if self.sdpa_plan_us > 0.0 {
            line += &format!(", cuDNN SDPA plan {:.0} us per new shape", self.sdpa_plan_us);
        }
        if self.request_path_us > 0.0 {
            line += &format!(", client <-> engine path {:.0} us per request", self.request_path_us);
        }
        if self.idle_wake_us > 0.0 {
            line += &format!(", idle engine wakes {:.0} us after the first arrival", self.idle_wake_us);
        }
        if self.graph_capture_us > 0.0 || self.graph_capture_per_kernel_us > 0.0 || self.graph_capture_per_m_activations_us > 0.0 {
            line += &format!(
                ", CUDA-graph capture {:.0} us + {:.1} us/kernel + {:.1} us/M-activations",
                self.graph_capture_us, self.graph_capture_per_kernel_us, self.graph_capture_per_m_activations_us
            );
        }
        line
    }

    /// What capturing a step's CUDA graph adds to that step (transformers' `_capture_graph`):
    /// instead of one replay (`gpu_us`), an eager warm-up forward that lasts the longer of the
    /// GPU work and its `kernels` launches, then the recording pass (the same launches, no GPU
    /// work), plus a fixed cost and one per activation element:
    /// `max(0, per_kernel x kernels - gpu) + per_kernel x kernels + fixed + per_activation x ...`.
    pub fn capture_extra_us(&self, gpu_us: f64, c: &CaptureLoad) -> f64 {
        self.capture_extra_scaled_us(gpu_us, c, 1.0)
    }

    /// `capture_extra_us` with every capture term times `factor` (`with_capture_scaled`'s
    /// model), without building that model.
    pub fn capture_extra_scaled_us(&self, gpu_us: f64, c: &CaptureLoad, factor: f64) -> f64 {
        let launches = factor * self.graph_capture_per_kernel_us * c.kernels as f64;
        (launches - gpu_us).max(0.0)
            + launches
            + factor * (self.graph_capture_us + self.graph_capture_per_m_activations_us * c.activations as f64 / 1e6)
    }

    pub fn validate(&self, origin: &str) -> Result<()> {
        for (name, v) in self.clone().terms_mut() {
            if !(*v >= 0.0 && v.is_finite()) {
                bail!("{origin}: field '{name}' must be a non-negative number of microseconds, got {v}");
            }
        }
        if let Some(ns) = self.probe_python_loop_ns {
            if !(ns > 0.0 && ns.is_finite()) {
                bail!("{origin}: field 'probe_python_loop_ns' must be a positive number of nanoseconds, got {ns}");
            }
        }
        if let Some(e) = self.capture_probe_exponent {
            if !(e >= 0.0 && e.is_finite()) {
                bail!("{origin}: field 'capture_probe_exponent' must be a non-negative finite number, got {e}");
            }
            if self.probe_python_loop_ns.is_none() {
                bail!("{origin}: field 'capture_probe_exponent' needs 'probe_python_loop_ns', the reading it scales against");
            }
        }
        if let Some(e) = self.probe_exponent {
            if !(e >= 0.0 && e.is_finite()) {
                bail!("{origin}: field 'probe_exponent' must be a non-negative finite number, got {e}");
            }
            if self.probe_python_loop_ns.is_none() {
                bail!("{origin}: field 'probe_exponent' needs 'probe_python_loop_ns', the reading it scales against");
            }
        }
        Ok(())
    }

    /// The fitted host model of `engine` if one ships, else the default.
    pub fn for_engine(engine: &str) -> Result<HostOverhead> {
        let file = format!("host/{engine}.json");
        match EMBEDDED_CALIBRATION.iter().find(|(p, _)| *p == file) {
            Some((_, text)) => {
                let origin = format!("calibration/{file}");
                let h: HostOverhead = serde_json::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
                h.validate(&origin)?;
                Ok(h)
            }
            None => Ok(HostOverhead::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eager_launch_bound_steps_take_the_longer_of_cpu_and_gpu() {
        let h = HostOverhead { per_step_us: 100.0, per_seq_us: 0.0, per_token_us: 0.0, launch_per_layer_us: 500.0, ..HostOverhead::default() };
        // 32 layers x 500 us = 16 ms of launches hide a 5 ms GPU step ...
        let one = StepLoad { layers: 32, seqs: 1, seq_groups: 1, tokens: 1, ..StepLoad::default() };
        assert_eq!(h.step_us(5_000.0, &one), 16_100.0);
        // ... but not a 40 ms one.
        assert_eq!(h.step_us(40_000.0, &one), 40_100.0);
        // Per-op dispatches add to the per-layer launches: 32 x 500 + 400 x 50 = 36 ms.
        let k = HostOverhead { launch_per_host_op_us: 50.0, ..h };
        assert_eq!(k.step_us(5_000.0, &StepLoad { host_ops: 400, ..one }), 36_100.0);
    }

    #[test]
    fn a_slower_host_scales_every_term_and_leaves_gpu_bound_steps_alone() {
        let h = HostOverhead { per_step_us: 1_000.0, per_seq_us: 30.0, piecewise_launch_per_layer_us: 150.0, request_path_us: 2_500.0, ..HostOverhead::zero() };
        let s = h.scaled(1.5).unwrap();
        assert_eq!((s.per_step_us, s.per_seq_us, s.piecewise_launch_per_layer_us, s.request_path_us), (1_500.0, 45.0, 225.0, 3_750.0));
        // A host-bound step (32 layers of piecewise launches, 4.8 ms, over 1 ms of GPU work)
        // takes 1.5x its host time; a GPU-bound one only pays the larger per-step terms.
        let load = StepLoad { layers: 32, piecewise_layers: 32, seqs: 4, ..StepLoad::default() };
        assert_eq!(h.step_us(1_000.0, &load), 4_800.0 + 1_000.0 + 120.0);
        assert_eq!(s.step_us(1_000.0, &load), 7_200.0 + 1_500.0 + 180.0);
        assert_eq!(s.step_us(50_000.0, &load) - h.step_us(50_000.0, &load), 560.0);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(h.scaled(bad).unwrap_err().to_string().contains("--host-scale"), "{bad}");
        }
        assert_eq!(h.scaled(1.0).unwrap(), h);
    }

    #[test]
    fn a_probed_host_scales_by_its_median_reading_over_the_reference() {
        let probe = HostProbe { python_loop_ns: vec![90.0, 120.0, 60.0] };
        let h = HostOverhead { per_step_us: 1_000.0, per_seq_us: 30.0, probe_python_loop_ns: Some(60.0), ..HostOverhead::zero() };
        let s = h.at_speed(&HostSpeed::Probe(probe.clone())).unwrap();
        assert_eq!((s.per_step_us, s.per_seq_us), (1_500.0, 45.0));
        assert!(s.source.adjusted.contains("x 1.500") && s.source.adjusted.contains("3 readings"), "{}", s.source.adjusted);
        assert_eq!(h.at_speed(&HostSpeed::Scale(2.0)).unwrap(), h.scaled(2.0).unwrap());
        // A model no probed machine was checked against cannot be scaled by a probe.
        let e = HostOverhead { probe_python_loop_ns: None, ..h }.at_speed(&HostSpeed::Probe(probe)).unwrap_err().to_string();
        assert!(e.contains("probe_python_loop_ns") && e.contains("--host-scale"), "{e}");
        let bad = HostOverhead { probe_python_loop_ns: Some(0.0), ..HostOverhead::zero() };
        assert!(bad.validate("x.json").unwrap_err().to_string().contains("probe_python_loop_ns"));
    }

    #[test]
    fn a_probed_host_scales_only_the_capture_terms_where_the_model_says_so() {
        // Reference 125 ns, exponent 0.5: a 4x faster host (31.25 ns) captures in half the time.
        let h = HostOverhead {
            per_step_us: 1_000.0,
            graph_capture_us: 60_000.0,
            graph_capture_per_kernel_us: 30.0,
            probe_python_loop_ns: Some(125.0),
            capture_probe_exponent: Some(0.5),
            ..HostOverhead::zero()
        };
        let s = h.at_speed(&HostSpeed::Probe(HostProbe { python_loop_ns: vec![31.25] })).unwrap();
        assert_eq!((s.graph_capture_us, s.graph_capture_per_kernel_us, s.per_step_us), (30_000.0, 15.0, 1_000.0));
        assert!(s.source.adjusted.contains("capture terms x 0.500"), "{}", s.source.adjusted);
        // At the reference reading nothing moves.
        let same = h.at_speed(&HostSpeed::Probe(HostProbe { python_loop_ns: vec![125.0] })).unwrap();
        assert_eq!(same.graph_capture_us, h.graph_capture_us);
        // An exponent with no reading to scale against is a broken file.
        let e = HostOverhead { probe_python_loop_ns: None, ..h.clone() }.validate("hf-cudagraph.json").unwrap_err().to_string();
        assert!(e.contains("hf-cudagraph.json") && e.contains("capture_probe_exponent") && e.contains("probe_python_loop_ns"), "{e}");
        let e = HostOverhead { capture_probe_exponent: Some(-1.0), ..h }.validate("x.json").unwrap_err().to_string();
        assert!(e.contains("capture_probe_exponent"), "{e}");
    }

    #[test]
    fn a_probed_eager_host_scales_every_term_to_the_fitted_power() {
        // Reference 76 ns, exponent 0.5: a host reading 304 ns (4x slower) takes 2x every term.
        let h = HostOverhead { per_step_us: 5_000.0, launch_per_host_op_us: 13.0, sdpa_plan_us: 40_000.0, probe_python_loop_ns: Some(76.0), probe_exponent: Some(0.5), ..HostOverhead::zero() };
        let s = h.at_speed(&HostSpeed::Probe(HostProbe { python_loop_ns: vec![304.0] })).unwrap();
        assert_eq!((s.per_step_us, s.launch_per_host_op_us, s.sdpa_plan_us), (10_000.0, 26.0, 80_000.0));
        assert!(s.source.adjusted.contains("every term x 2.000") && s.source.adjusted.contains("power 0.50"), "{}", s.source.adjusted);
        // Without an exponent every term scales linearly (the vLLM host model).
        let linear = HostOverhead { probe_exponent: None, ..h.clone() }.at_speed(&HostSpeed::Probe(HostProbe { python_loop_ns: vec![304.0] })).unwrap();
        assert_eq!(linear.per_step_us, 20_000.0);
        let e = HostOverhead { probe_python_loop_ns: None, ..h.clone() }.validate("hf.json").unwrap_err().to_string();
        assert!(e.contains("hf.json") && e.contains("probe_exponent") && e.contains("probe_python_loop_ns"), "{e}");
        let e = HostOverhead { probe_exponent: Some(f64::NAN), ..h }.validate("x.json").unwrap_err().to_string();
        assert!(e.contains("probe_exponent"), "{e}");
    }

    #[test]
    fn group_bookkeeping_scales_with_sequences_times_cache_groups() {
        let h = HostOverhead { per_step_us: 1_000.0, per_seq_cache_group_us: 50.0, ..HostOverhead::zero() };
        // 32 sequences of a 6-group model (gemma-3 cut to 12 layers) vs a 1-group model.
        let load = |groups: u64| StepLoad { layers: 12, seqs: 32, seq_groups: 32 * groups, tokens: 32, ..StepLoad::default() };
        assert_eq!(h.step_us(30_000.0, &load(6)), 30_000.0 + 1_000.0 + 50.0 * 32.0 * 6.0);
        assert_eq!(h.step_us(30_000.0, &load(1)), 30_000.0 + 1_000.0 + 50.0 * 32.0);
        assert_eq!(h.summary(), "1000.0 us/step + 50.0 us/seq/cache-group");
    }

    #[test]
    fn kv_index_building_scales_with_read_tokens_per_group_kind() {
        let h = HostOverhead { per_full_read_token_us: 0.1, per_sliding_read_token_us: 0.3, ..HostOverhead::zero() };
        let load = StepLoad { full_read_tokens: 10_000, sliding_read_tokens: 50_000, ..StepLoad::default() };
        assert!((h.step_us(0.0, &load) - (1_000.0 + 15_000.0)).abs() < 1e-6);
        assert_eq!(h.summary(), "0.100 us/KV-token/full-group + 0.300 us/KV-token/sliding-group");
    }

    #[test]
    fn a_capture_costs_an_eager_forward_and_a_recording_pass() {
        let h = HostOverhead { graph_capture_us: 10_000.0, graph_capture_per_kernel_us: 100.0, ..HostOverhead::zero() };
        // Launch-bound warm-up: 320 launches (32 ms) hide a 5 ms step, then 32 ms of recording.
        assert_eq!(h.capture_extra_us(5_000.0, &CaptureLoad { kernels: 320, ..CaptureLoad::default() }), 27_000.0 + 32_000.0 + 10_000.0);
        // GPU-bound warm-up (a 200 ms prefill): the forward itself adds nothing beyond the replay
        // it replaces; the recording still costs its launches.
        assert_eq!(h.capture_extra_us(200_000.0, &CaptureLoad { kernels: 320, ..CaptureLoad::default() }), 32_000.0 + 10_000.0);
        // Activations add their own term.
        let m = HostOverhead { graph_capture_per_m_activations_us: 100.0, ..h };
        let load = CaptureLoad { kernels: 320, activations: 500_000_000 };
        assert_eq!(m.capture_extra_us(200_000.0, &load), 32_000.0 + 10_000.0 + 50_000.0);
    }

    #[test]
    fn negative_fields_are_rejected() {
        let h = HostOverhead { per_seq_us: -1.0, ..HostOverhead::default() };
        assert!(h.validate("x.json").unwrap_err().to_string().contains("per_seq_us"));
    }
}
