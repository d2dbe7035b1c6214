//! Public H100 serving measurements: validate the simulator or refit the engines' host overhead.
//!
//!   cargo run --release --example silicon -- validate [--limit N] [--out DIR] [--json]
//!   cargo run --release --example silicon -- fit [--tier roofline] [--out calibration/host]
//!
//! After `fit`, `touch build.rs` and rebuild: host files are embedded in the binary.
use anyhow::{bail, Result};
use kernelsight::e2e::silicon::{fit_silicon_host, validate_silicon};
use kernelsight::perf::Tier;
use std::path::PathBuf;

const DATA: &str = "calibration/public/silicon_h100_sxm_agg.csv";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let data = PathBuf::from(flag("--data").unwrap_or_else(|| DATA.into()));
    match args.first().map(String::as_str) {
        Some("validate") => {
            let limit = flag("--limit").map(|v| v.parse()).transpose()?;
            let tiers = [Tier::Roofline, Tier::Target, Tier::CrossGen];
            let report = validate_silicon(&data, &tiers, limit)?;
            if args.iter().any(|a| a == "--json") {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            if let Some(dir) = flag("--out") {
                report.write_csv(&PathBuf::from(&dir))?;
                std::fs::write(PathBuf::from(&dir).join("silicon_report.json"), serde_json::to_string_pretty(&report)? + "\n")?;
                std::fs::write(PathBuf::from(&dir).join("silicon_report.txt"), report.render())?;
            }
        }
        Some("fit") => {
            let tier = match flag("--tier").as_deref() {
                None | Some("roofline") => Tier::Roofline,
                Some("target") => Tier::Target,
                Some("cross-gen") => Tier::CrossGen,
                Some(o) => bail!("--tier must be roofline, target or cross-gen, got '{o}'"),
            };
            let out = PathBuf::from(flag("--out").unwrap_or_else(|| "calibration/host".into()));
            for f in fit_silicon_host(&data, tier, &out)? {
                println!(
                    "{}: {} runs, per_step {:.1} us, per_seq {:.2} us; TPOT median APE {:.1}% -> {:.1}% (p90 {:.1}% -> {:.1}%)",
                    f.engine, f.runs, f.host.per_step_us, f.host.per_seq_us, f.tpot_before.median_ape, f.tpot_after.median_ape, f.tpot_before.p90_ape, f.tpot_after.p90_ape
                );
            }
            println!("wrote {}/<engine>.json; run `touch build.rs` and rebuild to embed them", out.display());
        }
        _ => bail!("usage: silicon validate [--limit N] [--out DIR] [--json] [--data CSV] | silicon fit [--tier T] [--out DIR] [--data CSV]"),
    }
    Ok(())
}
