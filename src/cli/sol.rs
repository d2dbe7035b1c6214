//! `kernelsight sol`: speed-of-light bounds, headroom and trial budgets for kernel-optimizing
//! agents. Schemas and formulas: `docs/headroom.md`.
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;

use crate::hardware::load_gpu;
use crate::headroom::{budget, evaluate_definition, evaluate_kernel, serve, trace, validate, Answer, Target};
use crate::schema::{read_rows, write_rows};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SolArgs {
    #[command(subcommand)]
    cmd: Option<SolCmd>,
    /// GPU id (see `hw list`) or a spec .toml path; in --serve, the default for requests without "gpu".
    #[arg(long)]
    gpu: Option<String>,
    /// FlashInfer-Trace definition JSON.
    #[arg(long, conflicts_with_all = ["input", "serve"])]
    definition: Option<PathBuf>,
    /// FlashInfer-Trace workloads (.jsonl); every line is evaluated.
    #[arg(long, requires = "definition")]
    workload: Option<PathBuf>,
    /// A var axis value instead of --workload, e.g. --axis M=128 (repeatable).
    #[arg(long = "axis", value_name = "NAME=VALUE", requires = "definition", conflicts_with = "workload")]
    axes: Vec<String>,
    /// Measured kernel time in microseconds: adds headroom, verdict and a trial budget.
    #[arg(long)]
    measured_us: Option<f64>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Shared-schema kernel CSV to bound (output = input columns + sol_us, practical_us).
    #[arg(long, conflicts_with = "serve")]
    input: Option<PathBuf>,
    /// Output CSV for --input (default: stdout).
    #[arg(long, requires = "input")]
    output: Option<PathBuf>,
    /// Answer one JSON request per stdin line with one JSON line on stdout.
    #[arg(long)]
    serve: bool,
}

#[derive(Debug, Subcommand)]
enum SolCmd {
    /// Spread N optimization trials over problems in proportion to expected gain.
    Budget(BudgetArgs),
    /// Measured / SOL per op over measurement CSVs; lists rows faster than the SOL.
    Validate(ValidateArgs),
}

#[derive(Debug, Args)]
struct BudgetArgs {
    /// Problems CSV (columns in docs/headroom.md).
    problems: PathBuf,
    /// Trials to spread.
    #[arg(long)]
    trials: u32,
    /// GPU for rows without a 'gpu' column.
    #[arg(long)]
    gpu: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ValidateArgs {
    /// Shared-schema CSVs (.csv or .csv.gz) with latency_us and gpu columns (repeatable).
    /// Default: the public subset (microbench/public) and microbench/data/*/*.csv.
    #[arg(long = "input")]
    inputs: Vec<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: SolArgs) -> Result<()> {
    match args.cmd {
        Some(SolCmd::Budget(b)) => return run_budget(b),
        Some(SolCmd::Validate(v)) => return run_validate(v),
        None => {}
    }
    if args.serve {
        let stdin = std::io::stdin();
        return serve::serve(stdin.lock(), std::io::stdout().lock(), args.gpu);
    }
    let gpu_id = args.gpu.as_deref().ok_or_else(|| anyhow!("--gpu is required (e.g. --gpu h200_sxm)"))?;
    let target = Target::load(gpu_id)?;
    let gpu = &target.gpu;
    if let Some(input) = &args.input {
        return run_csv(input, args.output.as_deref(), &target);
    }
    let Some(def_path) = &args.definition else {
        bail!("give --definition D.json [--workload W.jsonl], --input shapes.csv, --serve, or a subcommand (budget, validate)");
    };
    let def = trace::Definition::from_path(def_path)?;
    let workloads = match &args.workload {
        Some(w) => trace::Workload::read_jsonl(w)?
            .into_iter()
            .enumerate()
            .map(|(i, wl)| (format!("{}: line {}", w.display(), i + 1), wl))
            .collect(),
        None => vec![("--axis".to_string(), axes_workload(&args.axes)?)],
    };
    let mut out = std::io::stdout().lock();
    for (origin, w) in &workloads {
        let a = evaluate_definition(&def, w, gpu, args.measured_us, origin)?;
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&a)?)?;
        } else {
            write_text(&mut out, &a)?;
        }
    }
    Ok(())
}

fn axes_workload(axes: &[String]) -> Result<trace::Workload> {
    let mut obj = serde_json::Map::new();
    for a in axes {
        let (name, value) = a.split_once('=').ok_or_else(|| anyhow!("--axis '{a}' must be NAME=VALUE"))?;
        let v: u64 = value.trim().parse().map_err(|_| anyhow!("--axis '{a}': value must be a non-negative integer"))?;
        obj.insert(name.trim().to_string(), v.into());
    }
    trace::Workload::from_value(&serde_json::Value::Object(obj), "--axis")
}

fn write_text(out: &mut impl Write, a: &Answer) -> Result<()> {
    let b = &a.bounds;
    let wl = a.workload.as_deref().map(|u| format!(" workload {u}")).unwrap_or_default();
    writeln!(out, "{}{wl} on {} ({}, {} tensor cores)", a.subject, a.gpu, b.class.as_str(), b.compute_dtype)?;
    writeln!(
        out,
        "  hard SOL   {:>12.3} us  {} bound: {:.4e} FLOP -> {:.3} us, {:.4e} B -> {:.3} us",
        b.sol_us,
        b.bound.as_str(),
        b.flops,
        b.compute_us,
        b.bytes,
        b.memory_us
    )?;
    writeln!(
        out,
        "  practical  {:>12.3} us  {} (ceilings: compute {:.3}, memory {:.3}; floor {} us)",
        b.practical_us,
        b.dominant.as_str(),
        b.ceiling.compute,
        b.ceiling.memory,
        crate::headroom::bound::LATENCY_FLOOR_US
    )?;
    if let Some(n) = &a.nominal {
        writeln!(out, "  nominal    {:.4e} FLOP, {:.4e} B (practical bound input)", n.flops, n.bytes)?;
    }
    if let Some(s) = &a.assessment {
        writeln!(
            out,
            "  measured   {:>12.3} us  headroom {:.2}x, {:.2}x SOL -> {} (suggested trials: {})",
            s.measured_us,
            s.headroom,
            s.sol_ratio,
            s.verdict.as_str(),
            s.suggested_trials
        )?;
        writeln!(out, "             {}", s.reason)?;
    }
    for n in &a.notes {
        writeln!(out, "  note: {n}")?;
    }
    for m in &a.missing {
        writeln!(out, "  missing: {m}")?;
    }
    Ok(())
}

fn run_csv(input: &std::path::Path, output: Option<&std::path::Path>, target: &Target) -> Result<()> {
    let rows = read_rows(input)?;
    let mut cols = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let a = evaluate_kernel(&r.kernel, target, None).with_context(|| format!("{}: line {}", input.display(), i + 2))?;
        cols.push(vec![format!("{:.4}", a.bounds.sol_us), format!("{:.4}", a.bounds.practical_us)]);
    }
    let extra = ["sol_us", "practical_us"];
    match output {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            write_rows(f, &rows, &extra, |i| cols[i].clone())
        }
        None => write_rows(std::io::stdout().lock(), &rows, &extra, |i| cols[i].clone()),
    }
}

fn run_budget(a: BudgetArgs) -> Result<()> {
    let problems = budget::read_problems(&a.problems, a.gpu.as_deref())?;
    let plan = budget::allocate(&problems, a.trials);
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&plan)?)?;
        return Ok(());
    }
    writeln!(out, "{:<32} {:>10} {:>10} {:>10} {:>7}", "problem", "headroom", "verdict", "trials", "need")?;
    for x in &plan.allocations {
        writeln!(out, "{:<32} {:>9.2}x {:>10} {:>10} {:>7}", x.name, x.headroom, x.verdict.as_str(), x.trials, x.need)?;
    }
    writeln!(out, "allocated {} of {} trials", plan.trials_allocated, plan.trials_total)?;
    writeln!(out, "expected geomean speedup ceiling: {:.3}x (all headroom closed: {:.3}x)", plan.expected_geomean_speedup, plan.full_geomean_speedup)?;
    Ok(())
}

fn run_validate(a: ValidateArgs) -> Result<()> {
    let rows = if a.inputs.is_empty() {
        validate::project_measurements()?
    } else {
        let mut rows = Vec::new();
        for p in &a.inputs {
            rows.extend(crate::ingest::read_rows_file(p)?);
        }
        rows
    };
    let rep = validate::validate(&rows);
    print_validation(&rep, a.json)?;
    if !a.json {
        let mut gpus: Vec<&str> = rows.iter().filter_map(|r| r.gpu.as_deref()).collect();
        gpus.sort_unstable();
        gpus.dedup();
        let mut out = std::io::stdout().lock();
        writeln!(out, "best observed efficiency per class (compute of peak FLOPs, memory of peak bandwidth; traffic > L2):")?;
        for id in gpus {
            let Ok(gpu) = load_gpu(id) else { continue };
            let best = validate::best_efficiency(&rows, &gpu);
            let cells: Vec<String> =
                best.iter().map(|(c, (ce, me))| format!("{} {ce:.3}/{me:.3}", c.as_str())).collect();
            writeln!(out, "  {id}: {}", cells.join(", "))?;
        }
    }
    Ok(())
}

pub fn print_validation(rep: &validate::Report, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(rep)?)?;
        return Ok(());
    }
    writeln!(out, "measured / hard SOL over {} rows", rep.rows)?;
    writeln!(
        out,
        "{:<20} {:<16} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9} {:>6} {:>9} {:>9}",
        "gpu", "op", "rows", "min", "p01", "p50", "p99", "max", "<SOL", "beyond", "anomalies"
    )?;
    for g in &rep.groups {
        writeln!(
            out,
            "{:<20} {:<16} {:>7} {:>7.3} {:>7.3} {:>7.2} {:>7.1} {:>9.1} {:>6} {:>9} {:>9}",
            g.gpu, g.op, g.rows, g.min, g.p01, g.p50, g.p99, g.max, g.below_sol, g.unexplained, g.anomalies
        )?;
    }
    writeln!(out, "(<SOL: rows below the hard SOL; beyond: below it by more than the noise margin with no warm-L2 explanation; anomalies: of those, known upstream errors)")?;
    for (why, n) in &rep.skipped {
        writeln!(out, "skipped {n} rows: {why}")?;
    }
    let mut reasons: Vec<&str> = rep.violations.iter().filter_map(|v| v.anomaly).collect();
    reasons.sort_unstable();
    reasons.dedup();
    for r in reasons {
        writeln!(out, "known anomaly: {r}")?;
    }
    for v in rep.violations.iter().filter(|v| !v.warm_l2 && v.anomaly.is_none()).take(20) {
        writeln!(
            out,
            "  {:.3}x SOL  {} {} [{}] measured {:.3} us < SOL {:.3} us",
            v.ratio, v.gpu, v.kernel, v.source, v.measured_us, v.sol_us
        )?;
    }
    let warm = rep.violations.iter().filter(|v| v.warm_l2).count();
    writeln!(out, "rows beyond the {:.0}% noise margin: {} possible with a warm L2, {} known anomalies, {} unexplained", crate::headroom::verdict::NOISE_MARGIN * 100.0, warm, rep.anomalies(), rep.unexplained())?;
    Ok(())
}
