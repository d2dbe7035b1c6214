//! `kernelsight validate e2e`: replays measured serving runs and reports the error per metric.

use super::{kv_capacity, peak_memory, silicon, static_steps, step_gpu, traces};
use crate::perf::host::HostOverhead;
use crate::perf::Tier;
use crate::report::scatter::{predicted_vs_measured, Series};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(after_help = "Example:\n  kernelsight validate e2e --out out/e2e\n\nRuns of the calibration families fit the host-overhead model; the other families are held out and never used for fitting anything.")]
pub struct E2eArgs {
    /// Trace folders (one sub-folder per model, see their READMEs); repeatable.
    #[arg(long, default_values = ["calibration/traces/h200_sxm", "calibration/traces/h200_sxm_tp2", "calibration/traces/h200_sxm_cudagraph", "calibration/traces/h200_sxm_tp2_cudagraph", "calibration/traces/h200_sxm_cudagraph_fresh", "calibration/traces/h200_sxm_cudagraph_blind7", "calibration/traces/h200_sxm_cudagraph_blind8", "calibration/traces/h200_sxm_host_probe", "calibration/traces/h200_sxm_closed_loop8", "calibration/traces/h200_sxm_closed_loop9", "calibration/traces/h200_sxm_kv_pressure10", "calibration/traces/h200_sxm_eager_layers11", "calibration/traces/h200_sxm_eager_blind12", "calibration/traces/h200_sxm_kv_pressure13", "calibration/traces/h200_sxm_load_sweep14", "calibration/traces/h200_sxm_minimax_blind15", "calibration/traces/h200_sxm_gptoss120_blind15", "calibration/traces/h200_sxm_capture_sweep16", "calibration/traces/h200_sxm_blind16", "calibration/traces/h200_sxm_vllm19", "calibration/traces/h200_sxm_vllm_load27", "calibration/traces/h200_sxm_vllm32", "calibration/traces/h100_sxm_blind36", "calibration/traces/h100_sxm_capture_sweep37", "calibration/traces/h100_sxm_capture_sweep37b", "calibration/traces/h100_sxm_capture_sweep38", "calibration/traces/h100_sxm_capture_sweep40", "calibration/traces/h100_sxm_capture_sweep40b", "calibration/traces/h100_sxm_capture_sweep40c", "calibration/traces/h100_sxm_capture_sweep41", "calibration/traces/h100_sxm_capture_sweep44", "calibration/traces/h100_sxm_capture_sweep46", "calibration/traces/h100_sxm_eager46", "calibration/traces/h100_sxm_eager_blind47", "calibration/traces/h100_sxm_memory47", "calibration/traces/h100_sxm_memory47b", "calibration/traces/h100_sxm_memory48", "calibration/traces/h100_sxm_selfsize48", "calibration/traces/h200_sxm_longctx49", "calibration/traces/h100_sxm_eager51", "calibration/traces/h100_sxm_eager52"])]
    pub traces: Vec<PathBuf>,
    /// Per-step GPU times (CUDA events) of CUDA-graph runs, compared step by step.
    #[arg(long, default_value = "calibration/traces/h200_sxm_cudagraph_profile")]
    pub step_profile: PathBuf,
    /// Kernel-time tiers to compare (repeatable); default: roofline, target and cross-gen.
    #[arg(long, value_enum)]
    pub tier: Vec<Tier>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write per-run predictions (CSV) and predicted-vs-measured plots (PNG, SVG) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Public H100 serving measurements (vLLM, TRT-LLM, SGLang) to validate against.
    #[arg(long, default_value = "calibration/public/silicon_h100_sxm_agg.csv")]
    pub silicon: PathBuf,
    /// Only the first N rows of the public file (quick checks).
    #[arg(long)]
    pub silicon_limit: Option<usize>,
    /// How the public rows whose provenance names no benchmark client are replayed: `cohort`
    /// (shipped: fixed lengths, 3 requests per client) or `aiconfigurator-bench` (the benchmark
    /// aiconfigurator's generator documents; a hypothesis, see docs/validation_e2e.md session 25).
    #[arg(long, value_enum, default_value_t = silicon::rows::UndocumentedClient::Cohort)]
    pub undocumented_client: silicon::rows::UndocumentedClient,
    /// Skip the public H100 comparison.
    #[arg(long)]
    pub no_silicon: bool,
    /// Skip the H200 traces.
    #[arg(long)]
    pub no_traces: bool,
    /// Refit the host models on the calibration splits with the first tier and write them to
    /// calibration/host/ (hf.json from the H200 traces; vllm/trtllm/sglang.json from the public
    /// file). Rebuild afterwards to embed them.
    #[arg(long)]
    pub fit_host: bool,
    /// vLLM runs: the shipped host model at this host speed (runs measured on a host CPU slower
    /// or faster than the one it was fitted on; see `simulate --host-scale / --host-probe`).
    #[command(flatten)]
    pub host_speed: crate::cli::common::HostSpeedArgs,
}

pub fn run(args: E2eArgs) -> Result<()> {
    let tiers = if args.tier.is_empty() { vec![Tier::Roofline, Tier::Target, Tier::CrossGen] } else { args.tier.clone() };
    // The fits that serve every tier's replay (vLLM's launch terms, the public rows' host terms,
    // `generate`'s host and TP hooks) use the target tier where it is asked for: fitted against
    // the roofline tier (first by default), `generate`'s host took the GPU's misses as host time
    // (29.5 ms per step, no TP hooks) and the eager TP2 replays lost their hook term.
    let fit_tier = if tiers.contains(&Tier::Target) { Tier::Target } else { tiers[0] };
    let host_dir = PathBuf::from("calibration/host");
    // vLLM's prefill-step launch terms come from the H200 vLLM traces; the public rows then
    // fit its per-step and per-sequence terms around them.
    // Loaded once: the vLLM fit, the replays and the step comparison all read them.
    let mut models = Vec::new();
    if !args.no_traces {
        for d in &args.traces {
            models.extend(traces::load_dir(d)?);
        }
    }
    let vllm_host = if args.fit_host && !args.no_traces {
        let has_vllm = models.iter().any(|m| m.runs.iter().any(|r| r.engine == traces::TraceEngine::Vllm));
        if has_vllm {
            let h = super::host_fit::fit_host_vllm(&models, fit_tier, &HostOverhead::for_engine("vllm")?)?;
            eprintln!("vllm: prefill steps {:.0} us/layer with piecewise graphs, {:.0} us/layer without ({})", h.piecewise_launch_per_layer_us, h.eager_launch_per_layer_us, h.source);
            Some(h)
        } else {
            None
        }
    } else {
        None
    };
    let base = |engine: &str| match (&vllm_host, engine) {
        (Some(h), "vllm") => Ok(h.clone()),
        _ => HostOverhead::for_engine(engine),
    };
    if args.fit_host && args.no_silicon {
        if let Some(h) = &vllm_host {
            std::fs::write(host_dir.join("vllm.json"), serde_json::to_string_pretty(h)? + "\n")?;
        }
    }
    if args.fit_host && !args.no_silicon {
        for f in silicon::fit_silicon_host(&args.silicon, fit_tier, &host_dir, &base)? {
            eprintln!(
                "{}: {} calibration runs, {:.0} us/step + {:.1} us/seq; TPOT median APE {:.1}% -> {:.1}%",
                f.engine, f.runs, f.host.per_step_us, f.host.per_seq_us, f.tpot_before.median_ape, f.tpot_after.median_ape
            );
        }
    }
    // `generate`'s host model, with transformers' TP hooks from the static decode lines at tp > 1.
    let statics = if args.no_traces { None } else { Some(static_steps::load(&args.traces)?) };
    let generate_host = match &statics {
        Some(set) => static_steps::fit_host(set, fit_tier)?,
        None => None,
    };
    if let Some(h) = &generate_host {
        eprintln!("{}: {}", static_steps::ENGINE, h.summary());
    }
    let tp_hooks_us = generate_host.as_ref().map_or(0.0, |h| h.tp_launch_per_layer_us);
    let traces_report = if args.no_traces { None } else { Some(super::traces_report::validate_models(&models, &tiers, &args.host_speed.speed()?, tp_hooks_us)?) };
    let step_rows = if args.no_traces || !args.step_profile.is_dir() { None } else { Some(step_gpu::validate(&args.step_profile, &models, &tiers)?) };
    let silicon_report = if args.no_silicon { None } else { Some(silicon::validate_silicon(&args.silicon, &tiers, args.silicon_limit, args.undocumented_client)?) };
    let kv_rows = if args.no_traces { None } else { Some(kv_capacity::validate(&args.traces)?).filter(|r| !r.is_empty()) };
    let peak_rows = if args.no_traces { None } else { Some(peak_memory::validate(&args.traces)?).filter(|r| !r.rows.is_empty()) };
    let static_report = match (&statics, &generate_host) {
        (Some(set), Some(h)) => Some(static_steps::validate(set, &tiers, h)?).filter(|r| !r.rows.is_empty()),
        _ => None,
    };
    if args.json {
        let static_json = static_report.as_ref().map(|r| serde_json::json!({ "rows": r.rows, "not_priced": r.skipped, "host": r.host }));
        let v = serde_json::json!({ "h200_traces": traces_report, "h200_step_gpu": step_rows, "h200_static_generate": static_json, "kv_capacity": kv_rows, "transformers_peak_memory": peak_rows, "h100_public": silicon_report });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if let Some(r) = &traces_report {
            print!("{}", r.render());
        }
        if let Some(rows) = &step_rows {
            print!("\n{}", step_gpu::render(rows));
        }
        if let Some(r) = &static_report {
            print!("\n{}", r.render(fit_tier.as_str()));
        }
        if let Some(rows) = &kv_rows {
            print!("\n{}", kv_capacity::render(rows));
        }
        if let Some(rows) = &peak_rows {
            print!("\n{}", peak_memory::render(rows));
        }
        if let Some(r) = &silicon_report {
            print!("\n{}", r.render());
        }
    }
    if let (Some(dir), Some(r)) = (&args.out, &silicon_report) {
        r.write_csv(dir)?;
    }
    if args.fit_host {
        if let Some(report) = &traces_report {
            let tier = tiers[0].as_str();
            std::fs::create_dir_all(&host_dir)?;
            for (key, file) in [(tier.to_string(), "hf.json"), (format!("{tier}/cudagraph"), "hf-cudagraph.json")] {
                if let Some(h) = report.host_fits.get(&key) {
                    let path = host_dir.join(file);
                    std::fs::write(&path, serde_json::to_string_pretty(h)? + "\n")?;
                    eprintln!("wrote {} (fitted with tier {tier}); rebuild to embed the host files", path.display());
                }
            }
            if let Some(h) = &generate_host {
                let path = host_dir.join(format!("{}.json", static_steps::ENGINE));
                std::fs::write(&path, serde_json::to_string_pretty(h)? + "\n")?;
                eprintln!("wrote {} (fitted with tier {tier})", path.display());
            }
        }
    }
    let Some(report) = traces_report else { return Ok(()) };
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        report.write_csv(&dir.join("e2e_h200_runs.csv"))?;
        for metric in traces::METRICS {
            let series: Vec<Series> = tiers
                .iter()
                .map(|t| Series {
                    name: t.as_str().to_string(),
                    points: report.runs.iter().filter(|r| r.tier == t.as_str()).map(|r| (r.measured[metric], r.predicted[metric])).collect(),
                })
                .collect();
            let unit = if metric == "throughput" { "tok/s" } else { "ms" };
            predicted_vs_measured(dir, &format!("e2e_{metric}"), &format!("H200 traces: {metric}"), unit, &series)?;
        }
        eprintln!("wrote {}/e2e_h200_runs.csv, e2e_<metric>.png/.svg and the public-data CSV", dir.display());
    }
    Ok(())
}
