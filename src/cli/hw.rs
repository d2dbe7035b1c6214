//! `kernelsight hw`: list the embedded GPU spec sheets and show one in full.
use crate::hardware::{builtin_specs, load_gpu, GpuSpec};
use crate::schema::Dtype;
use anyhow::Result;
use clap::{Args, Subcommand};

/// GPU spec sheets: peak rates, memory, caches, links, power.
///
/// Every figure comes from a vendor datasheet or whitepaper (see `hw show ID` for the source
/// of each section). Peak rates are DENSE: the with-sparsity figures of datasheets are halved.
#[derive(Debug, Args)]
#[command(after_help = "\
Peak rates are dense (datasheet with-sparsity figures halved); a format without native
support (e.g. fp8 on A100) runs in the next wider one. Specs ship inside the binary from
hw_specs/*.toml; `hw show` also accepts a path to such a file.

Examples:
  kernelsight hw list
  kernelsight hw show h100_sxm
  kernelsight hw show ./my_gpu.toml --json")]
pub struct HwArgs {
    #[command(subcommand)]
    command: HwCommand,
}

#[derive(Debug, Subcommand)]
enum HwCommand {
    /// Table of all embedded GPUs: dense bf16/fp8/fp4 TFLOP/s, memory, L2, SMs, links, TDP.
    ///
    /// "-" marks a format without native tensor-core support (it then runs in the next
    /// wider supported format, e.g. fp8 on A100 runs as bf16).
    List {
        /// Print a JSON array of the full specs instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Every field of one GPU spec, derived ridge points, and where each figure comes from.
    Show {
        /// Embedded id (see `hw list`, e.g. h200_sxm) or a path to a spec .toml file in the
        /// same format as hw_specs/*.toml.
        id: String,
        /// Print the spec as JSON (the same fields as the .toml) instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: HwArgs) -> Result<()> {
    let text = match args.command {
        HwCommand::List { json: false } => render_list(&builtin_specs()?),
        HwCommand::List { json: true } => serde_json::to_string_pretty(&builtin_specs()?)? + "\n",
        HwCommand::Show { id, json: false } => render_show(&load_gpu(&id)?),
        HwCommand::Show { id, json: true } => serde_json::to_string_pretty(&load_gpu(&id)?)? + "\n",
    };
    print!("{text}");
    Ok(())
}

/// Up to two decimals, trailing zeros dropped ("989.4", "50", "7.75").
fn num(v: f64) -> String {
    decimals(v, 2)
}

/// Up to `places` decimals, trailing zeros dropped.
fn decimals(v: f64, places: usize) -> String {
    let s = format!("{v:.places$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn opt(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "-".to_string())
}

/// The `hw list` table, one row per spec, columns padded to their widest cell.
pub fn render_list(specs: &[GpuSpec]) -> String {
    let header = [
        "ID", "NAME", "BF16", "FP8", "FP4", "HBM_GB", "TB/s", "L2_MB", "SMs", "LINK", "UP_GB/s",
        "TDP_W",
    ];
    let rows: Vec<Vec<String>> = specs
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone(),
                num(s.peak.bf16_tflops),
                opt(s.peak.fp8_tflops),
                opt(s.peak.fp4_tflops),
                num(s.memory.hbm_gb),
                decimals(s.memory.hbm_bandwidth_tbps, 3),
                num(s.memory.l2_mb),
                s.compute.sm_count.to_string(),
                link_name(s).to_string(),
                num(s.interconnect.scaleup_gbps_per_dir),
                num(s.tdp_w),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        // Text columns (id, name, link) align left, numbers right.
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| match c {
                0 | 1 | 9 => format!("{cell:<w$}"),
                _ => format!("{cell:>w$}"),
            })
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    out.push_str(
        "BF16/FP8/FP4: dense peak TFLOP/s (no sparsity); '-' = no native support.\n\
         UP_GB/s: scale-up bandwidth per GPU per direction. SMs: compute units on AMD.\n\
         L2_MB excludes AMD Infinity Cache. Details and sources: kernelsight hw show ID\n",
    );
    out
}

fn link_name(s: &GpuSpec) -> &'static str {
    match s.interconnect.scaleup_kind {
        crate::hardware::LinkKind::Nvlink => "nvlink",
        crate::hardware::LinkKind::Xgmi => "xgmi",
        crate::hardware::LinkKind::Pcie => "pcie",
    }
}

/// The `hw show` text: every field, derived ridge points and the source notes.
pub fn render_show(s: &GpuSpec) -> String {
    let mut o = String::new();
    // Appends one formatted line to `o`.
    macro_rules! say {
        ($($arg:tt)*) => {{
            o.push_str(&format!($($arg)*));
            o.push('\n');
        }};
    }
    say!("{}: {} ({}, {})", s.id, s.name, s.vendor, s.arch);
    say!("\nDense peak (TFLOP/s; int8 in TOP/s)");
    let formats = [
        ("fp32", Dtype::Fp32),
        ("tf32", Dtype::Tf32),
        ("bf16", Dtype::Bf16),
        ("fp16", Dtype::Fp16),
        ("fp8", Dtype::Fp8),
        ("int8", Dtype::Int8),
        ("fp4", Dtype::Fp4),
    ];
    for (label, dtype) in formats {
        match s.native_peak_tflops(dtype) {
            Some(v) => say!("  {label:<6} {}", num(v)),
            None => {
                let runs_as = s.effective_compute_dtype(dtype);
                say!("  {label:<6} -  (no native support; runs as {runs_as})")
            }
        }
    }
    let m = &s.memory;
    say!("\nMemory");
    say!("  capacity          {} GB ({})", num(m.hbm_gb), m.dram.as_str().to_uppercase());
    say!(
        "  bandwidth         {} TB/s",
        decimals(m.hbm_bandwidth_tbps, 3)
    );
    say!("  L2 cache          {} MB", num(m.l2_mb));
    let c = &s.compute;
    say!("\nCompute");
    say!("  SMs / CUs         {}", c.sm_count);
    say!("  boost clock       {} MHz", num(c.boost_clock_mhz));
    say!("  shared mem / SM   {} KB", num(c.smem_per_sm_kb));
    let i = &s.interconnect;
    say!("\nInterconnect (per GPU, one direction)");
    say!(
        "  scale-up          {} GB/s over {}, {} GPUs per scale-up domain",
        num(i.scaleup_gbps_per_dir),
        link_name(s),
        i.gpus_per_node
    );
    say!("  host link         {} GB/s", num(i.pcie_gbps_per_dir));
    say!("  scale-out         {} GB/s", num(i.scaleout_gbps_per_dir));
    say!("\nPower and price");
    say!("  TDP               {} W", num(s.tdp_w));
    // Measured, not a datasheet figure: the rate serving steps' bf16 GEMMs are capped at.
    let sustained = crate::perf::power_cap::shipped_rates().and_then(|r| crate::perf::power_cap::power_cap(s, crate::perf::Tier::Target, &r));
    match sustained {
        Ok(Some(cap)) => say!(
            "  bf16 GEMMs held   {} TFLOPS back to back at the power limit, {} with idle between steps ({}; calibration/power/sustained_gemm.toml)",
            num(cap.sustained_tflops()),
            num(cap.tflops_at(0.0)),
            cap.from
        ),
        _ => say!("  bf16 GEMMs held   - (not measured for this die)"),
    }
    match s.price_usd_per_hour {
        Some(p) => say!(
            "  price             {} USD per GPU-hour (illustrative)",
            num(p)
        ),
        None => say!("  price             - (none given)"),
    }
    say!("\nRidge point (FLOP per HBM byte; above it a kernel is compute-bound)");
    for (label, dtype) in [
        ("bf16", Dtype::Bf16),
        ("fp8", Dtype::Fp8),
        ("fp4", Dtype::Fp4),
    ] {
        if s.native_peak_tflops(dtype).is_some() {
            say!("  {label:<6} {:.0}", s.ridge_flops_per_byte(dtype));
        }
    }
    say!("\nSources");
    for (key, note) in &s.sources {
        say!("  {key}: {note}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_drop_trailing_zeros() {
        assert_eq!(num(989.4), "989.4");
        assert_eq!(num(50.0), "50");
        assert_eq!(num(7.75), "7.75");
        assert_eq!(num(0.864), "0.86");
        assert_eq!(decimals(0.864, 3), "0.864");
    }
}
