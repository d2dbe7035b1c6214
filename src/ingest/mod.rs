//! Importers for public kernel-measurement tables, normalized into the shared schema
//! (`schema::KernelRow`, latency in microseconds), and the loader of the curated subset shipped
//! in `microbench/public/`.
//!
//! Provenance conventions shared by all importers:
//! - `gpu`: aiconfigurator system id (`h200_sxm`, `a100_sxm`, ...);
//! - `source`: `aiconfigurator` or `vidur`;
//! - `backend`: `<framework>-<version>` plus an optional `/<variant>` suffix (`vllm-0.24.0`,
//!   `vllm-0.24.0/fp8_block`, `nccl-2.27.3`, `vllm-0.24.0/custom_ar_graph`);
//! - one extra column `kernel`: the upstream kernel implementation name (kernel_source), since
//!   one table can time the same shape with several kernels.
//!
//! Rows with the same kernel, gpu, source, backend and `kernel` are re-measurements and are
//! collapsed to their median latency.

pub mod aiconfigurator;
pub mod curate;
pub mod table;
pub mod vidur;

use crate::schema::{read_rows_from, write_rows, KernelRow};
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The one pass-through column every imported row carries.
pub const KERNEL_COLUMN: &str = "kernel";

/// Repository-relative folder of the curated public subset.
pub const PUBLIC_DIR: &str = "microbench/public";

/// Result of an import: normalized rows and skipped-row counts by reason.
#[derive(Debug, Default)]
pub struct Imported {
    pub rows: Vec<KernelRow>,
    pub skipped: BTreeMap<String, usize>,
}

impl Imported {
    /// Appends another import's rows and skip counts (rows are not re-aggregated here).
    pub fn absorb(&mut self, other: Imported) {
        self.rows.extend(other.rows);
        for (k, v) in other.skipped {
            *self.skipped.entry(k).or_insert(0) += v;
        }
    }
}

/// Imports every folder of `dirs` with `import_dir` and collapses rows repeated across them to
/// the median of the folders' medians (each folder's import already aggregates its own).
pub fn import_dirs(dirs: &[PathBuf], import_dir: impl Fn(&Path) -> Result<Imported>) -> Result<Imported> {
    let mut all = Imported::default();
    for dir in dirs {
        all.absorb(import_dir(dir)?);
    }
    all.rows = aggregate_median(all.rows);
    Ok(all)
}

/// Builds a measured row with the standard provenance and `kernel` column.
pub fn measured(
    kernel: crate::schema::Kernel,
    latency_us: f64,
    gpu: &str,
    source: &str,
    backend: String,
    kernel_name: &str,
) -> KernelRow {
    KernelRow {
        kernel,
        latency_us: Some(latency_us),
        gpu: Some(gpu.to_string()),
        source: Some(source.to_string()),
        backend: Some(backend),
        extra: vec![(KERNEL_COLUMN.to_string(), kernel_name.to_string())],
    }
}

/// Collapses rows with identical kernel and provenance to one row with the median latency
/// (mean of the two middle values for an even count), then sorts deterministically.
pub fn aggregate_median(rows: Vec<KernelRow>) -> Vec<KernelRow> {
    let mut groups: HashMap<_, (KernelRow, Vec<f64>)> = HashMap::new();
    for r in rows {
        let key = (r.kernel.clone(), r.gpu.clone(), r.source.clone(), r.backend.clone(), r.extra.clone());
        let lat = r.latency_us.unwrap_or(f64::NAN);
        groups.entry(key).or_insert_with(|| (r, Vec::new())).1.push(lat);
    }
    let mut out: Vec<KernelRow> = groups
        .into_values()
        .map(|(mut row, lats)| {
            row.latency_us = median(lats);
            row
        })
        .collect();
    sort_rows(&mut out);
    out
}

/// Median of the finite values (repeated measurements of one key), None when there are none.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    (!v.is_empty()).then(|| crate::quantile::median(&v))
}

/// Deterministic order: gpu, source, backend, op, dtype, kv dtype, shape, kernel name.
pub fn sort_rows(rows: &mut [KernelRow]) {
    rows.sort_by_cached_key(|r| {
        let k = &r.kernel;
        (
            r.gpu.clone().unwrap_or_default(),
            r.source.clone().unwrap_or_default(),
            r.backend.clone().unwrap_or_default(),
            k.op.as_str(),
            k.dtype.as_str(),
            k.kv_dtype.map(|d| d.as_str()).unwrap_or(""),
            k.numeric_fields().map(|(_, v)| v),
            r.extra.clone(),
        )
    });
}

/// Row counts per (gpu, op), for the import summary.
pub fn summary(rows: &[KernelRow]) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for r in rows {
        let key = (r.gpu.clone().unwrap_or_default(), r.kernel.op.as_str().to_string());
        *m.entry(key).or_insert(0) += 1;
    }
    m
}

/// Writes rows in the shared schema; gzip-compressed when the name ends in `.gz`.
pub fn write_rows_file(path: &Path, rows: &[KernelRow]) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let buf = std::io::BufWriter::new(file);
    if is_gz(path) {
        let mut gz = flate2::write::GzEncoder::new(buf, flate2::Compression::best());
        write_rows(&mut gz, rows, &[], |_| vec![]).with_context(|| format!("writing {}", path.display()))?;
        gz.finish()?.flush()?;
    } else {
        let mut buf = buf;
        write_rows(&mut buf, rows, &[], |_| vec![]).with_context(|| format!("writing {}", path.display()))?;
        buf.flush()?;
    }
    Ok(())
}

/// Reads a shared-schema CSV, gunzipping when the name ends in `.gz`.
pub fn read_rows_file(path: &Path) -> Result<Vec<KernelRow>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader: Box<dyn Read> = if is_gz(path) {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file)))
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    read_rows_from(reader, &path.display().to_string())
}

fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// The curated public subset: `microbench/public/*.csv.gz` under the current directory if it
/// exists there, else under this crate's source tree.
pub fn load_public() -> Result<Vec<KernelRow>> {
    load_public_from(&public_dir())
}

pub fn public_dir() -> PathBuf {
    let local = PathBuf::from(PUBLIC_DIR);
    if local.is_dir() {
        local
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(PUBLIC_DIR)
    }
}

/// Reads every `*.csv.gz` in `dir` (sorted by name) and concatenates the rows.
pub fn load_public_from(dir: &Path) -> Result<Vec<KernelRow>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading public data folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".csv.gz"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{}: no *.csv.gz files (expected the curated public subset)", dir.display());
    }
    let mut rows = Vec::new();
    for f in files {
        rows.extend(read_rows_file(&f)?);
    }
    Ok(rows)
}
