//! Measurements for calibration: shared-schema CSVs (plain or gzipped) read file by file so
//! every error names its file and line, checked against the known GPUs, re-measurements
//! collapsed to their median.

use crate::hardware::GpuSpec;
use crate::kernels::cost::{alpha_centi_after, Routing};
use crate::schema::{read_rows_from, Kernel, KernelRow, Op};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One measured kernel on one GPU with one kernel library.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub kernel: Kernel,
    pub gpu: String,
    /// Kernel-library category, the model's categorical feature: the `backend` column without
    /// its framework version, plus the `kernel` column when present
    /// (`vllm-0.24.0/fp8_block` + `CutlassFp8` -> `vllm/fp8_block/CutlassFp8`).
    pub backend: String,
    /// Where the row came from (`aiconfigurator`, `kernelsight-microbench`, ...); several sources
    /// of one aggregated row are joined with `+`.
    pub source: String,
    pub latency_us: f64,
    /// How a MoE row's tokens were spread over experts (its SOL counts the experts read).
    pub routing: Routing,
}

/// Strips the version from `framework-1.2.3[/variant]` and appends the kernel name.
pub fn backend_category(backend: Option<&str>, kernel_name: Option<&str>) -> String {
    let b = backend.unwrap_or("unknown");
    let (head, rest) = match b.find('/') {
        Some(i) => (&b[..i], &b[i..]),
        None => (b, ""),
    };
    let version_start = |(i, c): &(usize, char)| (*c == '-' || *c == ' ') && head[i + 1..].starts_with(|d: char| d.is_ascii_digit());
    let framework = match head.char_indices().find(version_start) {
        Some((i, _)) => &head[..i],
        None => head,
    };
    match kernel_name {
        Some(k) if !k.is_empty() => format!("{framework}{rest}/{k}"),
        _ => format!("{framework}{rest}"),
    }
}

/// Drops the GPU's own name from backend path segments (`vidur/a100_dgx` on a100_sxm ->
/// `vidur/dgx`), so a category means the same topology or library on every GPU and carries
/// across generations.
pub fn without_gpu_name(category: &str, gpu: &str) -> String {
    let family = format!("{}_", gpu.split('_').next().unwrap_or(gpu));
    category.split('/').map(|seg| seg.strip_prefix(family.as_str()).unwrap_or(seg)).collect::<Vec<_>>().join("/")
}

/// Every `*.csv` and `*.csv.gz` under `dir`, recursively, sorted.
pub fn data_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    collect(dir, &mut out).with_context(|| format!("listing measurement files under {}", dir.display()))?;
    out.sort();
    Ok(out)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else {
            let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            if name.ends_with(".csv") || name.ends_with(".csv.gz") {
                out.push(p);
            }
        }
    }
    Ok(())
}

fn open(path: &Path) -> Result<Box<dyn std::io::Read>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(if path.extension().map(|e| e == "gz").unwrap_or(false) {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    })
}

/// Whether the file's header names an `op` column: side files next to the measurements
/// (e.g. `nvidia-smi` samples) are not kernel tables.
pub fn is_kernel_table(path: &Path) -> Result<bool> {
    let mut rdr = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(open(path)?);
    let headers = rdr.headers().with_context(|| format!("{}: reading header", path.display()))?;
    Ok(headers.iter().any(|h| h == "op"))
}

/// Reads one shared-schema file (gunzipping `.gz`) and turns its rows into measurements.
/// Errors name the file and line: missing `latency_us`/`gpu`, unknown GPU ids.
pub fn read_measurements(path: &Path, specs: &[GpuSpec]) -> Result<Vec<Measurement>> {
    let origin = path.display().to_string();
    let rows = read_rows_from(open(path)?, &origin)?;
    rows_to_measurements(rows, &origin, specs)
}

/// Checks provenance and units of measured rows; `origin` names the file in errors. Rows are
/// assumed to be in file order, one per line after the header.
pub fn rows_to_measurements(rows: Vec<KernelRow>, origin: &str, specs: &[GpuSpec]) -> Result<Vec<Measurement>> {
    let known: BTreeSet<&str> = specs.iter().map(|s| s.id.as_str()).collect();
    let mut out = Vec::with_capacity(rows.len());
    for (i, r) in rows.into_iter().enumerate() {
        let line = i + 2;
        let Some(latency_us) = r.latency_us else {
            let cols: Vec<&str> = r.extra.iter().map(|(n, _)| n.as_str()).collect();
            bail!(
                "{origin}: line {line}: no 'latency_us' value; calibration needs measured rows \
                 (a positive time in microseconds; unrecognized columns here: {})",
                if cols.is_empty() { "none".to_string() } else { cols.join(", ") }
            );
        };
        let gpu = r.gpu.clone().ok_or_else(|| anyhow!("{origin}: line {line}: empty 'gpu' column; say which GPU measured the row"))?;
        if !known.contains(gpu.as_str()) {
            bail!(
                "{origin}: line {line}: unknown gpu '{gpu}'; known: {} (add a spec under hw_specs/)",
                known.iter().copied().collect::<Vec<_>>().join(", ")
            );
        }
        let kernel_name = r.extra_value("kernel");
        let backend = without_gpu_name(&backend_category(r.backend.as_deref(), kernel_name), &gpu);
        let source = r.source.clone().unwrap_or_else(|| "unknown".to_string());
        let routing = row_routing(&r.kernel, r.extra_value("routing"), &backend, &source).with_context(|| format!("{origin}: line {line}"))?;
        out.push(Measurement { backend, source, kernel: r.kernel, gpu, latency_us, routing });
    }
    Ok(out)
}

/// The routing a MoE row was measured with: its `routing` column (the collector's:
/// `power_law_<alpha>` its own generator, `power_law_loads_<alpha>` aiconfigurator's), else
/// aiconfigurator's convention (balanced unless the backend names a `power_law_<alpha>`
/// variant: their own generator, `Routing::PowerLawLoads`), else uniform. Their categories
/// never stand in for served traffic's library (`perf::efficiency`).
pub fn row_routing(k: &Kernel, column: Option<&str>, backend: &str, source: &str) -> Result<Routing> {
    if k.op != Op::Moe {
        return Ok(Routing::Uniform);
    }
    match column.map(str::trim).filter(|c| !c.is_empty()) {
        Some("balanced") => Ok(Routing::Balanced),
        Some("uniform") => Ok(Routing::Uniform),
        Some(c) => {
            match (alpha_centi_after(c, "power_law_loads_"), alpha_centi_after(c, "power_law_")) {
                (Some(alpha_centi), _) => Ok(Routing::PowerLawLoads { alpha_centi }),
                (None, Some(alpha_centi)) => Ok(Routing::PowerLaw { alpha_centi }),
                _ => bail!("column 'routing': '{c}' is not a known routing (allowed: balanced, uniform, power_law_<alpha>, power_law_loads_<alpha> with alpha in [0, 10])"),
            }
        }
        None if source.starts_with("aiconfigurator") => Ok(match aiconfigurator_power_law(backend) {
            Some(alpha_centi) => Routing::PowerLawLoads { alpha_centi },
            None => Routing::Balanced,
        }),
        None => Ok(Routing::Uniform),
    }
}

/// Alpha (hundredths) of an aiconfigurator backend's `power_law_<alpha>` segment.
fn aiconfigurator_power_law(backend: &str) -> Option<u16> {
    backend.split('/').find_map(|seg| alpha_centi_after(seg, "power_law_"))
}

/// Reads every measurement file under `dirs` (missing directories are skipped, with a note).
pub fn load_dirs(dirs: &[PathBuf], specs: &[GpuSpec]) -> Result<(Vec<Measurement>, Vec<String>)> {
    let mut all = Vec::new();
    let mut notes = Vec::new();
    for d in dirs {
        if !d.is_dir() {
            notes.push(format!("{}: no such directory, skipped", d.display()));
            continue;
        }
        for f in data_files(d)? {
            if !is_kernel_table(&f)? {
                notes.push(format!("{}: no 'op' column, not a kernel table, skipped", f.display()));
                continue;
            }
            let m = read_measurements(&f, specs)?;
            notes.push(format!("{}: {} rows", f.display(), m.len()));
            all.extend(m);
        }
    }
    Ok((aggregate(all), notes))
}

/// Collapses re-measurements (same GPU, backend category and kernel) to their median latency,
/// sorted deterministically.
pub fn aggregate(rows: Vec<Measurement>) -> Vec<Measurement> {
    let mut groups: HashMap<(String, String, Kernel, Routing), (Vec<f64>, BTreeSet<String>)> = HashMap::new();
    for m in rows {
        let e = groups.entry((m.gpu, m.backend, m.kernel, m.routing)).or_default();
        e.0.push(m.latency_us);
        e.1.insert(m.source);
    }
    let mut out: Vec<Measurement> = groups
        .into_iter()
        .map(|((gpu, backend, kernel, routing), (mut lats, sources))| {
            lats.sort_by(|a, b| a.total_cmp(b));
            let n = lats.len();
            let latency_us = if n % 2 == 1 { lats[n / 2] } else { (lats[n / 2 - 1] + lats[n / 2]) / 2.0 };
            Measurement { kernel, gpu, backend, source: sources.into_iter().collect::<Vec<_>>().join("+"), latency_us, routing }
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.gpu, a.kernel.op, &a.backend, a.kernel.shape_string(), a.kernel.dtype, a.routing)
            .cmp(&(&b.gpu, b.kernel.op, &b.backend, b.kernel.shape_string(), b.kernel.dtype, b.routing))
    });
    out
}

/// Deterministic shape-level fold in 0..folds: FNV-1a of op, dtypes and shape. Every backend's
/// and every GPU's measurement of one shape lands in the same fold, so a held-out shape is
/// never seen in training under another library.
pub fn shape_fold(k: &Kernel, folds: u64) -> u64 {
    shape_hash(k) % folds
}

/// Whether a training row's shape is in the inner validation set that picks the number of
/// boosted trees (about one shape in ten). It reads other bits of the hash than `shape_fold`,
/// so the inner set cuts across the outer folds.
pub fn is_inner_validation(k: &Kernel) -> bool {
    (shape_hash(k) >> 32) % 10 == 0
}

fn shape_hash(k: &Kernel) -> u64 {
    let key = format!("{}|{}|{:?}|{}", k.op, k.dtype, k.kv_dtype, k.shape_string());
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Row counts per (gpu, op) and per source, for reports.
pub fn counts(rows: &[Measurement]) -> BTreeMap<(String, String), usize> {
    let mut c = BTreeMap::new();
    for m in rows {
        *c.entry((m.gpu.clone(), m.kernel.op.to_string())).or_insert(0) += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::builtin_specs;
    use crate::schema::Dtype;

    #[test]
    fn backend_category_drops_version_keeps_variant_and_kernel() {
        assert_eq!(backend_category(Some("vllm-0.24.0/fp8_block"), Some("Cutlass")), "vllm/fp8_block/Cutlass");
        assert_eq!(backend_category(Some("nccl-2.27.3"), None), "nccl");
        assert_eq!(backend_category(Some("nccl 2.28.9"), None), "nccl");
        assert_eq!(backend_category(Some("trtllm-1.3.0rc20"), Some("torch_flow")), "trtllm/torch_flow");
        assert_eq!(backend_category(Some("flash-attn"), None), "flash-attn");
        assert_eq!(backend_category(None, None), "unknown");
        assert_eq!(without_gpu_name("vidur/a100_pairwise_nvlink/internode", "a100_sxm"), "vidur/pairwise_nvlink/internode");
        assert_eq!(without_gpu_name("vidur/a40_dgx", "a40"), "vidur/dgx");
        assert_eq!(without_gpu_name("vllm/a100_x", "h100_sxm"), "vllm/a100_x");
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let specs = builtin_specs().unwrap();
        let csv = "op,dtype,m,n,k,latency_us,gpu\ngemm,bf16,1,2,3,5,h200_sxm\ngemm,bf16,1,2,3,5,h900\n";
        let rows = read_rows_from(csv.as_bytes(), "a.csv").unwrap();
        let err = rows_to_measurements(rows, "a.csv", &specs).unwrap_err().to_string();
        assert!(err.contains("a.csv: line 3") && err.contains("unknown gpu 'h900'"), "{err}");
        let csv = "op,dtype,m,n,k,latency_ms,gpu\ngemm,bf16,1,2,3,5,h200_sxm\n";
        let rows = read_rows_from(csv.as_bytes(), "b.csv").unwrap();
        let err = rows_to_measurements(rows, "b.csv", &specs).unwrap_err().to_string();
        assert!(err.contains("b.csv: line 2") && err.contains("latency_us") && err.contains("latency_ms"), "{err}");
        let csv = "op,dtype,m,n,k,latency_us,gpu\ngemm,bf16,1,2,3,0,h200_sxm\n";
        let err = read_rows_from(csv.as_bytes(), "c.csv").unwrap_err();
        assert!(format!("{err:#}").contains("c.csv: line 2"), "{err:#}");
    }

    #[test]
    fn moe_rows_carry_the_routing_they_were_measured_with() {
        let specs = builtin_specs().unwrap();
        let head = "op,dtype,num_tokens,hidden,inter,topk,num_experts,tp,ep,latency_us,gpu,source,backend";
        let row = "moe,bf16,32,2880,2880,4,128,1,1,50,h200_sxm";
        let read = |csv: String| rows_to_measurements(read_rows_from(csv.as_bytes(), "m.csv").unwrap(), "m.csv", &specs);
        // The collector's column wins; aiconfigurator's convention is balanced unless the
        // backend names a power-law variant; anything else routes uniformly.
        let m = read(format!("{head},routing\n{row},kernelsight,lib,balanced\n{row},kernelsight,lib,power_law_1.2\n{row},kernelsight,lib,\n{row},kernelsight,lib,power_law_loads_1.2\n")).unwrap();
        assert_eq!(
            m.iter().map(|m| m.routing).collect::<Vec<_>>(),
            [Routing::Balanced, Routing::PowerLaw { alpha_centi: 120 }, Routing::Uniform, Routing::PowerLawLoads { alpha_centi: 120 }]
        );
        let m = read(format!("{head}\n{row},aiconfigurator,vllm-0.24.0\n{row},aiconfigurator,vllm-0.24.0/power_law_1.01\n")).unwrap();
        assert_eq!(m.iter().map(|m| m.routing).collect::<Vec<_>>(), [Routing::Balanced, Routing::PowerLawLoads { alpha_centi: 101 }]);
        let err = read(format!("{head},routing\n{row},kernelsight,lib,zipf\n")).unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("m.csv: line 2") && err.contains("'zipf'") && err.contains("balanced, uniform, power_law_<alpha>"), "{err}");
        // A balanced and a skewed measurement of one shape stay apart.
        let m = read(format!("{head},routing\n{row},kernelsight,lib,balanced\n{row},kernelsight,lib,power_law_1.2\n")).unwrap();
        assert_eq!(aggregate(m).len(), 2);
    }

    #[test]
    fn aggregate_takes_the_median_per_gpu_backend_and_shape() {
        let k = Kernel::gemm(Dtype::Bf16, 16, 32, 64);
        let m = |lat: f64, backend: &str| Measurement {
            kernel: k.clone(),
            gpu: "h200_sxm".into(),
            backend: backend.into(),
            source: "s".into(),
            latency_us: lat,
            routing: Routing::Uniform,
        };
        let out = aggregate(vec![m(3.0, "a"), m(1.0, "a"), m(10.0, "a"), m(7.0, "b"), m(5.0, "b")]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].latency_us, 3.0);
        assert_eq!(out[1].latency_us, 6.0);
    }

    #[test]
    fn folds_are_per_shape_and_roughly_balanced() {
        let mut hist = [0usize; 5];
        for m in [1u64, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192] {
            for n in [128u64, 256, 1024, 4096, 8192, 16384] {
                hist[shape_fold(&Kernel::gemm(Dtype::Bf16, m, n, 4096), 5) as usize] += 1;
            }
        }
        // 84 shapes over 5 folds: each fold gets some, none gets most.
        assert!(hist.iter().all(|&c| c >= 8 && c <= 28), "{hist:?}");
    }
}
