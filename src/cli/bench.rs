//! `kernelsight bench`: simulator speed (simulated requests per wall second, ns per engine
//! step, peak memory) on a fixed scenario. A measurement, not a test: run it in release mode.
use super::simulate::SimulateArgs;
use crate::sim::record::NoObserver;
use anyhow::Result;
use clap::Args;
use std::time::Instant;

#[derive(Debug, Args)]
#[command(after_help = "Example (the issue's target: 100,000 ShareGPT-like requests of Llama-3.1-8B on one H200):\n  cargo run --release -- bench --num-requests 100000")]
pub struct BenchArgs {
    /// Scenario flags as for `simulate` (default: 100,000 requests of the default scenario).
    #[command(flatten)]
    pub sim: SimulateArgs,
    /// Repetitions; the fastest is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
}

/// Peak resident memory of this process, from /proc (Linux); None elsewhere.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    if args.sim.workload.num_requests.is_none() && args.sim.workload.trace.is_none() {
        args.sim.workload.num_requests = Some(100_000.0);
    }
    let scenario = args.sim.scenario()?;
    println!("{}", scenario.setup.join("\n"));
    let mut best: Option<(f64, u64, u64, u64)> = None;
    for _ in 0..args.repeat.max(1) {
        let mut source = scenario.workload.build()?;
        let t0 = Instant::now();
        let o = crate::sim::run(&scenario.cfg, &scenario.predictor, source.as_mut(), scenario.workload.closed_loop(), &mut NoObserver)?;
        let wall = t0.elapsed().as_secs_f64();
        if best.is_none_or(|b| wall < b.0) {
            best = Some((wall, o.num_requests, o.rec.steps, o.rec.output_tokens));
        }
    }
    let (wall, n, steps, out) = best.expect("at least one repetition");
    println!();
    println!("wall time          {wall:.3} s (fastest of {})", args.repeat.max(1));
    println!("requests           {n} ({:.0} simulated requests per wall second)", n as f64 / wall);
    println!("engine steps       {steps} ({:.0} ns per step)", wall * 1e9 / steps.max(1) as f64);
    println!("output tokens      {out} ({:.1} M per wall second)", out as f64 / wall / 1e6);
    if let Some(b) = peak_rss_bytes() {
        println!("peak memory (RSS)  {:.1} MiB", b as f64 / (1u64 << 20) as f64);
    }
    Ok(())
}
