//! Workloads: which requests arrive when, how long their prompts and answers are, and which
//! of them share a prompt prefix. Generated lazily (memory bounded by pending multi-turn
//! sessions), seeded, or replayed from a trace file.

pub mod lengths;
pub mod synth;
pub mod trace;

use anyhow::{bail, Result};
use std::path::PathBuf;

/// One request as the workload describes it.
///
/// Prefix sharing: the first `prefix_tokens` tokens of the request's token sequence (prompt,
/// then output) are the leading tokens of its group's shared token stream; the rest are unique
/// to the request. A system prompt shared by a group gives `prefix_tokens` = its length; a
/// multi-turn session gives every turn `prefix_tokens = prompt + output` (the conversation is
/// the stream, so the next turn's prompt starts with this turn's prompt and answer).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    pub id: u64,
    /// Arrival time; ignored in closed-loop runs, where a client sends when its last answer ends.
    pub arrival_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub prefix_group: Option<u64>,
    pub prefix_tokens: u32,
}

/// A stream of requests in arrival order.
pub trait RequestSource {
    fn next_request(&mut self) -> Result<Option<RequestSpec>>;
}

/// When requests arrive.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrival {
    /// Open loop: Gamma-distributed gaps with mean 1/rate and shape `burstiness` (as vLLM's
    /// benchmark: 1 = Poisson, < 1 burstier, > 1 more regular). An infinite rate sends all at 0.
    Rate { rate_per_s: f64, burstiness: f64 },
    /// Closed loop: `concurrency` clients, each sending its next request `turnaround_s` after
    /// its last one ends.
    Closed { concurrency: u32, turnaround_s: f64 },
}

/// Prompt and output length distributions.
#[derive(Debug, Clone, PartialEq)]
pub enum Lengths {
    /// Lognormal fitted to ShareGPT's published means (see `lengths.rs`).
    ShareGpt,
    Fixed { isl: u32, osl: u32 },
    /// Uniform in [len*(1-r), len*(1+r)], as vLLM's random dataset `--random-range-ratio`.
    Uniform { isl: u32, osl: u32, range_ratio: f64 },
    /// Uniform in [len*r, len], as `--random-range-ratio` of SGLang's bench_serving and of the
    /// InferenceMAX benchmark client (the public H100 serving rows use r = 0.8).
    UniformUpTo { isl: u32, osl: u32, low_ratio: f64 },
}

/// Prefix sharing between requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Sharing {
    None,
    /// Each request picks one of `groups` system prompts of `prefix_tokens` tokens, prepended.
    Groups { groups: u32, prefix_tokens: u32 },
    /// Multi-turn sessions of `turns` requests; turn k+1 arrives `think_time_s` after turn k
    /// (open loop) and its prompt is the whole conversation so far plus a new user message.
    Sessions { turns: u32, think_time_s: f64 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    /// None: the whole trace, or 1,000 synthetic requests.
    pub num_requests: Option<u64>,
    pub arrival: Arrival,
    pub lengths: Lengths,
    pub sharing: Sharing,
    pub seed: u64,
    /// Replay this CSV/JSONL trace instead of generating (arrivals from it unless closed loop).
    pub trace: Option<PathBuf>,
}

pub const DEFAULT_NUM_REQUESTS: u64 = 1000;

impl WorkloadSpec {
    pub fn validate(&self) -> Result<()> {
        if self.num_requests == Some(0) {
            bail!("--num-requests must be at least 1");
        }
        match self.arrival {
            Arrival::Rate { rate_per_s, burstiness } => {
                if !(rate_per_s > 0.0) {
                    bail!("--rate must be a positive number of requests per second (or 'inf'), got {rate_per_s}");
                }
                if !(burstiness > 0.0 && burstiness.is_finite()) {
                    bail!("--burstiness must be a positive finite number (1 = Poisson), got {burstiness}");
                }
            }
            Arrival::Closed { concurrency, turnaround_s } => {
                if concurrency == 0 {
                    bail!("--concurrency must be at least 1");
                }
                if !(turnaround_s >= 0.0 && turnaround_s.is_finite()) {
                    bail!("--client-turnaround-ms must be a finite number >= 0, got {}", turnaround_s * 1e3);
                }
                if matches!(self.sharing, Sharing::Sessions { .. }) {
                    bail!("multi-turn sessions (--turns) need open-loop arrivals (--rate), not --concurrency");
                }
            }
        }
        match self.lengths {
            Lengths::ShareGpt => {}
            Lengths::Fixed { isl, osl } | Lengths::Uniform { isl, osl, .. } | Lengths::UniformUpTo { isl, osl, .. } => {
                if isl == 0 || osl == 0 {
                    bail!("--isl and --osl must be at least 1 token, got isl={isl} osl={osl}");
                }
            }
        }
        if let Lengths::Uniform { range_ratio, .. } = self.lengths {
            if !(0.0..1.0).contains(&range_ratio) {
                bail!("--range-ratio must be in [0, 1), got {range_ratio}");
            }
        }
        if let Lengths::UniformUpTo { low_ratio, .. } = self.lengths {
            if !(low_ratio > 0.0 && low_ratio <= 1.0) {
                bail!("--range-ratio of --workload uniform-upto must be in (0, 1] (lengths in [len*r, len]), got {low_ratio}");
            }
        }
        match self.sharing {
            Sharing::None => {}
            Sharing::Groups { groups, prefix_tokens } => {
                if groups == 0 || prefix_tokens == 0 {
                    bail!("--prefix-groups and --prefix-tokens must be at least 1, got {groups} and {prefix_tokens}");
                }
            }
            Sharing::Sessions { turns, think_time_s } => {
                if turns == 0 {
                    bail!("--turns must be at least 1");
                }
                if !(think_time_s >= 0.0 && think_time_s.is_finite()) {
                    bail!("--think-time-s must be a finite number >= 0, got {think_time_s}");
                }
            }
        }
        Ok(())
    }

    /// The request stream this spec describes.
    pub fn build(&self) -> Result<Box<dyn RequestSource>> {
        self.validate()?;
        match &self.trace {
            Some(path) => Ok(Box::new(trace::TraceReader::open(path, self.num_requests)?)),
            None => Ok(Box::new(synth::Synthetic::new(self.clone()))),
        }
    }

    /// The closed loop the simulator runs (None: open loop).
    pub fn closed_loop(&self) -> Option<crate::sim::ClosedLoop> {
        match self.arrival {
            Arrival::Closed { concurrency, turnaround_s } => Some(crate::sim::ClosedLoop { clients: concurrency, turnaround_us: turnaround_s * 1e6 }),
            Arrival::Rate { .. } => None,
        }
    }
}
