//! Workload flags (shared by `simulate`, `bench` and `workload gen`) and `kernelsight workload gen`.
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use crate::workload::{trace, Arrival, Lengths, Sharing, WorkloadSpec};
use std::path::PathBuf;

/// Which requests arrive when. Numbers are parsed loosely so that a negative value gets a
/// clear error instead of being taken for a flag.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Length distribution: sharegpt (lognormal, means 161 in / 338 out), fixed (needs --isl/--osl), uniform (--isl/--osl ± --range-ratio, vLLM's convention), uniform-upto (in [len * --range-ratio, len], SGLang's / InferenceMAX's convention).
    #[arg(long, default_value = "sharegpt", value_parser = ["sharegpt", "fixed", "uniform", "uniform-upto"])]
    pub workload: String,
    /// Prompt tokens (fixed or uniform; giving --isl/--osl alone implies fixed).
    #[arg(long, allow_hyphen_values = true)]
    pub isl: Option<f64>,
    /// Output tokens (fixed or uniform).
    #[arg(long, allow_hyphen_values = true)]
    pub osl: Option<f64>,
    /// Uniform lengths in [len*(1-r), len*(1+r)] (uniform-upto: in [len*r, len]).
    #[arg(long, default_value_t = 0.5, allow_hyphen_values = true)]
    pub range_ratio: f64,
    /// Arrival rate in requests/s ('inf' sends all at once). Open loop.
    #[arg(long, allow_hyphen_values = true)]
    pub rate: Option<String>,
    /// Gamma shape of inter-arrival gaps: 1 = Poisson, <1 burstier, >1 more regular.
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    pub burstiness: f64,
    /// Closed loop: this many clients, each sending its next request when its last one ends.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "rate")]
    pub concurrency: Option<f64>,
    /// Closed loop: time from a client's answer ending to its next request reaching the engine
    /// (an engine busy with others has started its next step by then).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true, requires = "concurrency")]
    pub client_turnaround_ms: f64,
    /// Number of requests (default: 1000, or the whole trace).
    #[arg(long, allow_hyphen_values = true)]
    pub num_requests: Option<f64>,
    /// Shared system prompts: each request picks one of N groups...
    #[arg(long, allow_hyphen_values = true, requires = "prefix_tokens")]
    pub prefix_groups: Option<f64>,
    /// ...and prepends its group's prompt of this many tokens.
    #[arg(long, allow_hyphen_values = true, requires = "prefix_groups")]
    pub prefix_tokens: Option<f64>,
    /// Multi-turn sessions of this many turns; each turn's prompt is the conversation so far.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "prefix_groups")]
    pub turns: Option<f64>,
    /// Gap between a session's turns (open loop).
    #[arg(long, default_value_t = 5.0, allow_hyphen_values = true)]
    pub think_time_s: f64,
    /// Replay a trace (CSV or JSONL): arrival_s,prompt_tokens,output_tokens[,prefix_group[,prefix_tokens]].
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn count(flag: &str, v: f64) -> Result<u32> {
    if !(v >= 1.0) || v.fract() != 0.0 || v > u32::MAX as f64 {
        bail!("--{flag} must be a positive integer, got {v}");
    }
    Ok(v as u32)
}

impl WorkloadArgs {
    /// The workload these flags describe; `default_rate` applies when neither --rate nor
    /// --concurrency is given.
    pub fn to_spec(&self, default_rate_per_s: f64) -> Result<WorkloadSpec> {
        let arrival = match (&self.rate, self.concurrency) {
            (_, Some(c)) => Arrival::Closed { concurrency: count("concurrency", c)?, turnaround_s: self.client_turnaround_ms * 1e-3 },
            (Some(r), None) => {
                let rate_per_s = if r.eq_ignore_ascii_case("inf") {
                    f64::INFINITY
                } else {
                    r.parse::<f64>().ok().with_context(|| format!("--rate must be a number of requests per second or 'inf', got '{r}'"))?
                };
                Arrival::Rate { rate_per_s, burstiness: self.burstiness }
            }
            (None, None) => Arrival::Rate { rate_per_s: default_rate_per_s, burstiness: self.burstiness },
        };
        let isl = self.isl.map(|v| count("isl", v)).transpose()?;
        let osl = self.osl.map(|v| count("osl", v)).transpose()?;
        let kind = if self.workload == "sharegpt" && (isl.is_some() || osl.is_some()) { "fixed" } else { self.workload.as_str() };
        let lengths = match kind {
            "sharegpt" => Lengths::ShareGpt,
            _ => {
                let (Some(isl), Some(osl)) = (isl, osl) else {
                    bail!("--workload {kind} needs both --isl and --osl");
                };
                match kind {
                    "fixed" => Lengths::Fixed { isl, osl },
                    "uniform-upto" => Lengths::UniformUpTo { isl, osl, low_ratio: self.range_ratio },
                    _ => Lengths::Uniform { isl, osl, range_ratio: self.range_ratio },
                }
            }
        };
        let sharing = match (self.prefix_groups, self.prefix_tokens, self.turns) {
            (Some(g), Some(p), _) => Sharing::Groups { groups: count("prefix-groups", g)?, prefix_tokens: count("prefix-tokens", p)? },
            (_, _, Some(t)) => Sharing::Sessions { turns: count("turns", t)?, think_time_s: self.think_time_s },
            _ => Sharing::None,
        };
        let num_requests = self.num_requests.map(|n| count("num-requests", n).map(u64::from)).transpose()?;
        let spec = WorkloadSpec { num_requests, arrival, lengths, sharing, seed: self.seed, trace: self.trace.clone() };
        spec.validate()?;
        Ok(spec)
    }
}

#[derive(Debug, Args)]
pub struct WorkloadCmdArgs {
    #[command(subcommand)]
    pub command: WorkloadCommand,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadCommand {
    /// Write the generated workload as CSV (arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens),
    /// e.g. to replay the simulator's own requests against a real server.
    Gen(GenArgs),
}

#[derive(Debug, Args)]
pub struct GenArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Output CSV file ('-' for stdout).
    #[arg(long)]
    pub out: PathBuf,
}

/// Rate used when `workload gen` is given neither --rate nor --concurrency.
pub const GEN_DEFAULT_RATE_PER_S: f64 = 10.0;

pub fn run(args: WorkloadCmdArgs) -> Result<()> {
    let WorkloadCommand::Gen(a) = args.command;
    let spec = a.workload.to_spec(GEN_DEFAULT_RATE_PER_S)?;
    let mut source = spec.build()?;
    let n = if a.out.as_os_str() == "-" {
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::new(stdout.lock());
        trace::write_csv(source.as_mut(), &mut w)?
    } else {
        let f = std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
        let mut w = std::io::BufWriter::new(f);
        let n = trace::write_csv(source.as_mut(), &mut w)?;
        std::io::Write::flush(&mut w)?;
        n
    };
    if a.out.as_os_str() != "-" {
        let how = match spec.arrival {
            Arrival::Closed { concurrency, .. } => format!("closed loop of {concurrency} clients: arrival_s is 0, send when a client is free"),
            Arrival::Rate { rate_per_s, .. } => format!("{rate_per_s} req/s"),
        };
        eprintln!("wrote {n} requests ({how}) to {}", a.out.display());
    }
    Ok(())
}
