//! Calibration: measurement ingest, hardware-normalized features, per-op model fitting,
//! validation on held-out rows, and the `calibration/` files the runtime model reads.
//!
//! Tiers (see `perf::Tier`): `target` models are fitted on one GPU's own sweep; `cross-gen`
//! models never see the GPU they predict (leave-one-GPU-out); `roofline` is SOL over one
//! constant efficiency per op class.

pub mod base;
pub mod dataset;
pub mod features;
pub mod gbdt;
pub mod model;
pub mod plot;
pub mod report;
pub mod select;
pub mod store;
pub mod validate;

use crate::hardware::GpuSpec;
use crate::perf::roofline::RooflineParams;
use crate::perf::sol::sol_routed;
use anyhow::{anyhow, Result};
use dataset::Measurement;
use model::{fit_set, FitParams, ModelSet};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use store::RooflineFile;

/// Fewest rows of one op on one GPU for a `target` model of that op; below it the runtime
/// falls back to cross-gen and says so.
pub const MIN_TARGET_ROWS: usize = 50;
/// Fewest rows of one op (over all training GPUs) for a cross-gen model of it.
pub const MIN_CROSS_GEN_ROWS: usize = 50;

/// The GPUs the cross-generation targets are stated over.
pub const LOGO_GPUS: [&str; 6] = ["a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s"];

/// Measurements plus the specs of every GPU they name.
pub struct Data {
    pub rows: Vec<Measurement>,
    pub specs: BTreeMap<String, GpuSpec>,
    /// One line per file read (path and row count).
    pub notes: Vec<String>,
}

impl Data {
    pub fn load(dirs: &[PathBuf]) -> Result<Data> {
        let all_specs = crate::hardware::builtin_specs()?;
        let (rows, notes) = dataset::load_dirs(dirs, &all_specs)?;
        let used: BTreeSet<&str> = rows.iter().map(|m| m.gpu.as_str()).collect();
        let specs = all_specs.into_iter().filter(|s| used.contains(s.id.as_str())).map(|s| (s.id.clone(), s)).collect();
        Ok(Data { rows, specs, notes })
    }

    pub fn from_rows(rows: Vec<Measurement>, specs: Vec<GpuSpec>) -> Data {
        Data { rows, specs: specs.into_iter().map(|s| (s.id.clone(), s)).collect(), notes: vec![] }
    }

    pub fn spec(&self, gpu: &str) -> &GpuSpec {
        &self.specs[gpu]
    }

    pub fn gpus(&self) -> Vec<String> {
        let s: BTreeSet<&str> = self.rows.iter().map(|m| m.gpu.as_str()).collect();
        s.into_iter().map(str::to_string).collect()
    }

    fn rows_where(&self, keep: impl Fn(&Measurement) -> bool) -> Vec<&Measurement> {
        self.rows.iter().filter(|m| keep(m)).collect()
    }
}

/// Default measurement folders: the curated public subset and the project's own sweeps,
/// relative to the current directory when present there, else to this crate's source tree.
pub fn default_data_dirs() -> Vec<PathBuf> {
    ["microbench/public", "microbench/data"]
        .iter()
        .map(|rel| {
            let here = Path::new(rel);
            if here.is_dir() {
                here.to_path_buf()
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
            }
        })
        .collect()
}

/// Fits the baseline: per op class, the median of SOL / measured over `rows`, the launch floor
/// and collective latency kept at their documented defaults.
pub fn fit_roofline(rows: &[&Measurement], spec: &dyn Fn(&str) -> GpuSpec) -> RooflineFile {
    let mut by_class: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut specs: BTreeMap<&str, GpuSpec> = BTreeMap::new();
    for m in rows {
        let g = specs.entry(m.gpu.as_str()).or_insert_with(|| spec(&m.gpu));
        let s = sol_routed(&m.kernel, g, m.routing);
        by_class.entry(m.kernel.op.class()).or_default().push((s.sol_us / m.latency_us).min(1.0));
    }
    let mut params = RooflineParams::default();
    for (class, mut effs) in by_class {
        effs.sort_by(|a, b| a.total_cmp(b));
        let med = effs[effs.len() / 2];
        match class {
            "gemm" => params.gemm = med,
            "attention" => params.attention = med,
            "moe" => params.moe = med,
            "communication" => params.communication = med,
            _ => params.elementwise = med,
        }
    }
    RooflineFile { params, fitted_on: specs.keys().map(|s| s.to_string()).collect(), rows: rows.len() }
}

/// Everything `calibrate` writes.
pub struct Calibration {
    pub roofline: RooflineFile,
    pub target: Vec<ModelSet>,
    pub cross_gen: Vec<ModelSet>,
}

/// Fits every tier. `only_gpu` limits the per-GPU models (target and leave-out) to one GPU.
pub fn calibrate(data: &Data, only_gpu: Option<&str>, params: &FitParams) -> Result<Calibration> {
    let gpus = data.gpus();
    if gpus.is_empty() {
        return Err(anyhow!("no measurements found; nothing to calibrate"));
    }
    if let Some(g) = only_gpu {
        if !gpus.iter().any(|x| x == g) {
            return Err(anyhow!("no measurements for gpu '{g}'; measured GPUs: {}", gpus.join(", ")));
        }
    }
    let spec = |g: &str| data.spec(g);
    let all = data.rows_where(|_| true);
    let roofline = fit_roofline(&all, &|g| data.spec(g).clone());
    let mut target = Vec::new();
    let mut cross_gen = vec![fit_set("cross-gen", &all, None, &spec, params, MIN_CROSS_GEN_ROWS)];
    for g in gpus.iter().filter(|g| only_gpu.map(|o| o == g.as_str()).unwrap_or(true)) {
        let own = data.rows_where(|m| &m.gpu == g);
        target.push(fit_set("target", &own, None, &spec, params, MIN_TARGET_ROWS));
        // Only ops this GPU measured differ from the all-GPU model when it is left out; the
        // others are read from cross-gen/all.json at load time.
        let own_ops: BTreeSet<_> = own.iter().map(|m| m.kernel.op).collect();
        let others = data.rows_where(|m| &m.gpu != g && own_ops.contains(&m.kernel.op));
        if !others.is_empty() {
            let mut set = fit_set("cross-gen", &others, Some(g), &spec, params, MIN_CROSS_GEN_ROWS);
            set.held_out_ops = own_ops.into_iter().collect();
            cross_gen.push(set);
        }
    }
    Ok(Calibration { roofline, target, cross_gen })
}

/// Writes the calibration files under `dir` (see `store` for the layout); returns the paths.
pub fn write_calibration(cal: &Calibration, data: &Data, dir: &Path, command: &str) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    written.push(store::write_json(dir, store::ROOFLINE_PATH, &cal.roofline)?);
    for set in &cal.target {
        written.push(store::write_json_gz(dir, &store::target_path(&set.trained_on[0]), set)?);
    }
    for set in &cal.cross_gen {
        written.push(store::write_json_gz(dir, &store::cross_gen_path(set.held_out.as_deref()), set)?);
    }
    let counts: BTreeMap<String, usize> =
        dataset::counts(&data.rows).into_iter().map(|((g, op), n)| (format!("{g}/{op}"), n)).collect();
    let manifest = serde_json::json!({
        "command": command,
        "rows_after_median_aggregation": data.rows.len(),
        "rows_by_gpu_and_op": counts,
        "files_read": data.notes,
    });
    std::fs::write(dir.join(store::MANIFEST_PATH), serde_json::to_string_pretty(&manifest)? + "\n")?;
    written.push(dir.join(store::MANIFEST_PATH));
    Ok(written)
}
