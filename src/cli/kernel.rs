//! `kernelsight kernel`: SOL and predicted time of one kernel, or of a CSV of kernels.
use crate::hardware::load_gpu;
use crate::kernels::cost::Routing;
use crate::perf::efficiency::KernelModel;
use crate::perf::sol::sol_routed;
use crate::perf::{KernelTimeModel, Tier};
use crate::schema::{read_rows, write_rows, Dtype, Kernel, Op};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  kernelsight kernel --gpu h200_sxm --op gemm --m 4096 --n 4096 --k 4096 --dtype bf16\n  kernelsight kernel --gpu h200_sxm --op attn_decode --batch 64 --kv-len 4096 --num-heads 32 --num-kv-heads 8 --head-dim 128\n  kernelsight kernel --gpu h100_sxm --input shapes.csv --output preds.csv")]
pub struct KernelArgs {
    /// GPU id or spec path.
    #[arg(long, default_value = "h200_sxm")]
    pub gpu: String,
    /// Kernel-time model.
    #[arg(long, value_enum, default_value = "target")]
    pub tier: Tier,
    /// Kernel library, as a prefix of the calibrated backends (e.g. `sdpa_cudnn_masked`,
    /// `trtllm`); default: each op's most measured one. An --input row's `backend` column wins.
    #[arg(long)]
    pub backend: Option<String>,
    /// CSV in the shared kernel-shape schema; writes input columns + sol_us, predicted_us.
    #[arg(long, conflicts_with = "op")]
    pub input: Option<PathBuf>,
    /// Output CSV for --input (default: stdout).
    #[arg(long, requires = "input")]
    pub output: Option<PathBuf>,
    /// Op of a single kernel (gemm, attn_prefill, attn_decode, moe, all_reduce, rmsnorm, ...).
    #[arg(long)]
    pub op: Option<Op>,
    #[arg(long, default_value = "bf16")]
    pub dtype: Dtype,
    #[arg(long)]
    pub kv_dtype: Option<Dtype>,
    #[arg(long, default_value_t = 0)]
    pub m: u64,
    #[arg(long, default_value_t = 0)]
    pub n: u64,
    #[arg(long, default_value_t = 0)]
    pub k: u64,
    #[arg(long, default_value_t = 0)]
    pub batch: u64,
    #[arg(long, default_value_t = 0)]
    pub seq_len: u64,
    #[arg(long, default_value_t = 0)]
    pub kv_len: u64,
    #[arg(long, default_value_t = 0)]
    pub num_heads: u64,
    #[arg(long, default_value_t = 0)]
    pub num_kv_heads: u64,
    #[arg(long, default_value_t = 0)]
    pub head_dim: u64,
    #[arg(long, default_value_t = 0)]
    pub num_tokens: u64,
    #[arg(long, default_value_t = 0)]
    pub hidden: u64,
    #[arg(long, default_value_t = 0)]
    pub inter: u64,
    #[arg(long, default_value_t = 0)]
    pub topk: u64,
    #[arg(long, default_value_t = 0)]
    pub num_experts: u64,
    #[arg(long, default_value_t = 0)]
    pub tp: u64,
    #[arg(long, default_value_t = 0)]
    pub ep: u64,
    #[arg(long, default_value_t = 0)]
    pub num_gpus: u64,
    /// Message bytes for collectives, bytes copied for `copy`.
    #[arg(long, default_value_t = 0)]
    pub bytes: u64,
    /// Sliding window (attention), 0 = none.
    #[arg(long, default_value_t = 0)]
    pub window: u64,
    /// A MoE kernel's routing: uniform (default: this GPU's expected shard), balanced, or
    /// power_law_<alpha> (aiconfigurator's skewed loads, the busiest shard, priced like the
    /// library's own rows measured so where there are any). --input rows keep their own (the
    /// `routing` column, else their source's convention).
    #[arg(long, default_value = "uniform", value_parser = super::common::parse_moe_routing)]
    pub moe_routing: Routing,
    #[arg(long)]
    pub json: bool,
}

impl KernelArgs {
    /// The routing one GPU's kernel is priced for: `uniform` is its own expected shard (as its
    /// SOL counts it); a serving step's busiest shard is `step`'s.
    fn routing(&self) -> Routing {
        match self.moe_routing {
            Routing::UniformBusiest => Routing::Uniform,
            r => r,
        }
    }

    fn kernel(&self, op: Op) -> Kernel {
        Kernel {
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            seq_len: self.seq_len,
            kv_len: self.kv_len,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            num_tokens: self.num_tokens,
            hidden: self.hidden,
            inter: self.inter,
            topk: self.topk,
            num_experts: self.num_experts,
            tp: self.tp,
            ep: self.ep,
            num_gpus: self.num_gpus,
            bytes: self.bytes,
            window: self.window,
            kv_dtype: self.kv_dtype,
            ..Kernel::new(op, self.dtype)
        }
    }
}

/// Error when no library the model measured for `op` starts with `prefix`.
fn check_library(model: &KernelModel, op: crate::schema::Op, prefix: &str, dtype: crate::schema::Dtype, gpu: &crate::hardware::GpuSpec) -> Result<()> {
    match model.unknown_library(op, &[prefix.to_string()], dtype) {
        Some(known) => bail!("backend '{prefix}': no {} library calibrated for {} ({}) starts with it; allowed: {}", op.as_str(), gpu.id, model.tier_used().as_str(), known.join(", ")),
        None => Ok(()),
    }
}

pub fn run(args: KernelArgs) -> Result<()> {
    let gpu = load_gpu(&args.gpu)?;
    // `--backend` and a row's `backend` name libraries: a same-die sibling may have measured them.
    // One GPU's kernel: its own expected work under uniform routing (the mean expert-parallel
    // shard, as its SOL counts it); the busiest shard a serving step waits for is `step`'s.
    let model = KernelModel::load(&gpu, args.tier)?.with_siblings()?.with_served_routing(args.routing());
    for note in model.warnings() {
        eprintln!("note: {note}");
    }
    if let Some(input) = &args.input {
        let rows = read_rows(input)?;
        // A row's own backend column (if any) picks the kernel library, else --backend; one the
        // model never measured is an error, not a silent switch to the op's default library.
        for (i, r) in rows.iter().enumerate() {
            if let Some(b) = r.backend.as_deref().or(args.backend.as_deref()) {
                check_library(&model, r.kernel.op, b, r.kernel.dtype, &gpu).with_context(|| format!("{}: data row {}", input.display(), i + 1))?;
            }
        }
        // A MoE row measured with balanced routing is predicted for the experts it read.
        let mut preds: Vec<(f64, f64)> = Vec::with_capacity(rows.len());
        for (i, r) in rows.iter().enumerate() {
            let routing = crate::calibrate::dataset::row_routing(&r.kernel, r.extra_value("routing"), r.backend.as_deref().unwrap_or(""), r.source.as_deref().unwrap_or(""))
                .with_context(|| format!("{}: data row {}", input.display(), i + 1))?;
            let backend = r.backend.as_deref().or(args.backend.as_deref());
            preds.push((sol_routed(&r.kernel, &gpu, routing).sol_us, model.predict_routed_us_with(&r.kernel, backend, routing)));
        }
        let fmt = |i: usize| vec![format!("{:.4}", preds[i].0), format!("{:.4}", preds[i].1)];
        match &args.output {
            Some(p) => {
                let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
                write_rows(f, &rows, &["sol_us", "predicted_us"], fmt)?;
                eprintln!("wrote {} predictions to {}", rows.len(), p.display());
            }
            None => write_rows(std::io::stdout().lock(), &rows, &["sol_us", "predicted_us"], fmt)?,
        }
        return Ok(());
    }
    let Some(op) = args.op else { bail!("give --op (and its shape fields) or --input shapes.csv") };
    let k = args.kernel(op);
    k.validate()?;
    if let Some(b) = &args.backend {
        check_library(&model, op, b, k.dtype, &gpu)?;
    }
    let s = sol_routed(&k, &gpu, args.routing());
    let predicted_us = model.predict_us_with(&k, args.backend.as_deref());
    if args.json {
        let mut out = json!({
            "gpu": gpu.id, "op": k.op, "dtype": k.dtype, "shape": k.shape_string(), "flops": s.flops, "bytes": s.bytes,
            "sol_us": s.sol_us, "bound": s.bound, "predicted_us": predicted_us, "tier": model.tier_used().as_str(),
            "library": model.library_for(&k, args.backend.as_deref()),
        });
        if op == Op::Moe {
            out["moe_routing"] = args.routing().served_name().into();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let routed = if op == Op::Moe { format!(", {} routing", args.routing().served_name()) } else { String::new() };
        println!("{} {} {} on {}{routed}", k.op, k.dtype, k.shape_string(), gpu.id);
        println!("  flops        {:.4e}", s.flops);
        println!("  bytes        {:.4e}", s.bytes);
        println!("  compute      {:.3} us at {:.0} TFLOP/s", s.compute_us, gpu.peak_flops(k.dtype) / 1e12);
        println!("  traffic      {:.3} us", s.memory_us);
        println!("  SOL          {:.3} us ({}-bound)", s.sol_us, s.bound.as_str());
        println!("  predicted    {:.3} us [{}]", predicted_us, KernelTimeModel::describe(&model));
        let library = model.library_for(&k, args.backend.as_deref()).unwrap_or_else(|| "none (roofline constants)".into());
        let how = if args.backend.is_some() { "--backend" } else { "default: the op's most measured; --backend to choose" };
        println!("  library      {library} ({how})");
        if let Some(lib) = model.default_library(op).filter(|b| args.backend.is_none() && crate::calibrate::model::is_engine_only(op, b)) {
            println!("  note         {op} was measured only as one engine's implementation ({lib}): without --backend it is priced by the roofline");
        }
    }
    Ok(())
}
