//! `kernelsight import aiconfigurator|vidur DIR... [--out FILE.csv[.gz]]`: normalizes public
//! measurement tables into the shared kernel schema and prints rows per GPU and op.
use crate::ingest::{self, aiconfigurator, curate, vidur, Imported};
use crate::schema::Op;
use anyhow::Result;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Source {
    /// aiconfigurator parquet tables (`systems/data/<gpu>/<family>/<framework>/<version>/*.parquet`).
    Aiconfigurator,
    /// Vidur profiling CSVs (`profiling/compute/<gpu>/.../mlp.csv`, `profiling/network/...`).
    Vidur,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Which public data set DIR holds.
    pub source: Source,
    /// Folders to search recursively for the data set's tables (rows repeated across them are
    /// collapsed to the median of each folder's medians).
    #[arg(required = true, num_args = 1..)]
    pub dirs: Vec<PathBuf>,
    /// Write the normalized rows here (shared schema CSV; gzip when the name ends in .gz).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep only the subset shipped in microbench/public/ (see its README.md).
    #[arg(long)]
    pub curated: bool,
    /// Keep only these ops (comma-separated schema op names, e.g. rmsnorm,rope).
    #[arg(long, value_delimiter = ',')]
    pub ops: Vec<String>,
    /// Write this in the `source` column instead of the data set's name (a re-measurement in
    /// the data set's format is not the data set).
    #[arg(long)]
    pub source_label: Option<String>,
    /// Write this in the `kernel` column instead of the data set's kernel name: a re-written
    /// kernel that times differently from the data set's on the same GPU is another library
    /// category, not the same one.
    #[arg(long)]
    pub kernel_label: Option<String>,
}

pub fn run(args: ImportArgs) -> Result<()> {
    let curated = args.curated;
    let imported = ingest::import_dirs(&args.dirs, |dir| match args.source {
        Source::Aiconfigurator if curated => {
            let mut all = aiconfigurator::import_dir_where(dir, curate::wants_file)?;
            all.rows.retain(curate::keep);
            Ok(all)
        }
        Source::Aiconfigurator => aiconfigurator::import_dir(dir),
        Source::Vidur => vidur::import_dir(dir),
    })?;
    let imported = select(imported, &args.ops, args.source_label.as_deref(), args.kernel_label.as_deref())?;
    print_summary(&imported);
    if let Some(out) = &args.out {
        ingest::write_rows_file(out, &imported.rows)?;
        println!("wrote {} rows to {}", imported.rows.len(), out.display());
    }
    Ok(())
}

/// Keeps the rows of `ops` (all when empty) and relabels their source and kernel name.
fn select(mut imported: Imported, ops: &[String], source_label: Option<&str>, kernel_label: Option<&str>) -> Result<Imported> {
    if !ops.is_empty() {
        let wanted: Vec<Op> = ops.iter().map(|name| name.parse::<Op>().map_err(|e| e.context("--ops"))).collect::<Result<_>>()?;
        let before = imported.rows.len();
        imported.rows.retain(|r| wanted.contains(&r.kernel.op));
        let dropped = before - imported.rows.len();
        if dropped > 0 {
            imported.skipped.insert(format!("not in --ops {}", ops.join(",")), dropped);
        }
    }
    for r in &mut imported.rows {
        if let Some(label) = source_label {
            r.source = Some(label.to_string());
        }
        if let Some(label) = kernel_label {
            r.extra.retain(|(name, _)| name != ingest::KERNEL_COLUMN);
            r.extra.push((ingest::KERNEL_COLUMN.to_string(), label.to_string()));
        }
    }
    Ok(imported)
}

fn print_summary(imported: &Imported) {
    println!("{:<22} {:<16} {:>9}", "gpu", "op", "rows");
    for ((gpu, op), n) in ingest::summary(&imported.rows) {
        println!("{gpu:<22} {op:<16} {n:>9}");
    }
    println!("total {} rows (repeated keys collapsed to their median)", imported.rows.len());
    for (reason, n) in &imported.skipped {
        println!("skipped {n:>7} rows: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Dtype, Kernel};

    fn row(op: Op) -> crate::schema::KernelRow {
        ingest::measured(Kernel::new(op, Dtype::Fp16), 2.0, "h200_sxm", vidur::SOURCE, "vidur".into(), "k")
    }

    #[test]
    fn select_keeps_the_named_ops_counts_the_rest_and_relabels_the_source() {
        let imported = Imported { rows: vec![row(Op::Rmsnorm), row(Op::Embedding), row(Op::Rope)], ..Default::default() };
        let out = select(imported, &["rmsnorm".into(), "rope".into()], Some("kernelsight re-measurement"), None).unwrap();
        assert_eq!(out.rows.iter().map(|r| r.kernel.op).collect::<Vec<_>>(), vec![Op::Rmsnorm, Op::Rope]);
        assert_eq!(out.skipped.values().sum::<usize>(), 1);
        assert!(out.rows.iter().all(|r| r.source.as_deref() == Some("kernelsight re-measurement")));
        // The backend stays the data set's: the rows join its library categories.
        assert!(out.rows.iter().all(|r| r.backend.as_deref() == Some("vidur")));
        assert!(out.rows.iter().all(|r| r.extra_value("kernel") == Some("k")));
    }

    #[test]
    fn select_relabels_the_kernel_once() {
        let imported = Imported { rows: vec![row(Op::Embedding)], ..Default::default() };
        let out = select(imported, &[], None, Some("emb_replica")).unwrap();
        assert_eq!(out.rows[0].extra.iter().filter(|(n, _)| n == "kernel").count(), 1);
        assert_eq!(out.rows[0].extra_value("kernel"), Some("emb_replica"));
    }

    #[test]
    fn select_rejects_an_unknown_op_by_name() {
        let err = select(Imported::default(), &["rms_norm".into()], None, None).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("--ops") && msg.contains("rms_norm"), "{msg}");
    }
}
