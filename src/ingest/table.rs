//! A small in-memory table read from one parquet or CSV file, with typed accessors whose errors
//! name the file, the column and the row. Importers look up columns by name, never by position,
//! because column order differs between upstream table versions.

use anyhow::{anyhow, bail, Context, Result};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use std::borrow::Cow;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Str(String),
}

/// How rows are numbered in error messages.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Numbering {
    /// Parquet: data rows counted from 1.
    Row,
    /// CSV: file lines, the header being line 1.
    Line,
}

#[derive(Debug, Clone)]
pub struct Table {
    pub origin: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    numbering: Numbering,
}

impl Table {
    /// Builds a table from in-memory CSV-like text cells (used by CSV reading and tests).
    pub fn from_strings(origin: &str, header: Vec<String>, rows: Vec<Vec<String>>) -> Table {
        let rows = rows.into_iter().map(|r| r.into_iter().map(Cell::Str).collect()).collect();
        Table { origin: origin.to_string(), header, rows, numbering: Numbering::Line }
    }

    pub fn read_parquet(path: &Path) -> Result<Table> {
        let origin = path.display().to_string();
        let file = std::fs::File::open(path).with_context(|| format!("opening {origin}"))?;
        let reader =
            SerializedFileReader::new(file).with_context(|| format!("{origin}: not a readable parquet file"))?;
        let header: Vec<String> = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let mut rows = Vec::with_capacity(reader.metadata().file_metadata().num_rows().max(0) as usize);
        let iter = reader.get_row_iter(None).with_context(|| format!("{origin}: reading rows"))?;
        for (i, row) in iter.enumerate() {
            let row = row.with_context(|| format!("{origin}: row {}: decoding", i + 1))?;
            let cells = row
                .get_column_iter()
                .map(|(name, f)| match f {
                    Field::Null => Ok(Cell::Null),
                    Field::Str(s) => Ok(Cell::Str(s.clone())),
                    Field::Bool(b) => Ok(Cell::Str(b.to_string())),
                    Field::Byte(v) => Ok(Cell::Int(*v as i64)),
                    Field::Short(v) => Ok(Cell::Int(*v as i64)),
                    Field::Int(v) => Ok(Cell::Int(*v as i64)),
                    Field::Long(v) => Ok(Cell::Int(*v)),
                    Field::UByte(v) => Ok(Cell::Int(*v as i64)),
                    Field::UShort(v) => Ok(Cell::Int(*v as i64)),
                    Field::UInt(v) => Ok(Cell::Int(*v as i64)),
                    Field::ULong(v) => Ok(Cell::Int(*v as i64)),
                    Field::Float(v) => Ok(Cell::Float(*v as f64)),
                    Field::Double(v) => Ok(Cell::Float(*v)),
                    other => Err(anyhow!(
                        "{origin}: row {}: column '{name}' has unsupported type ({other})",
                        i + 1
                    )),
                })
                .collect::<Result<Vec<Cell>>>()?;
            rows.push(cells);
        }
        Ok(Table { origin, header, rows, numbering: Numbering::Row })
    }

    pub fn read_csv(path: &Path) -> Result<Table> {
        let origin = path.display().to_string();
        let file = std::fs::File::open(path).with_context(|| format!("opening {origin}"))?;
        let mut rdr = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(file);
        let header: Vec<String> =
            rdr.headers().with_context(|| format!("{origin}: reading header"))?.iter().map(String::from).collect();
        let mut rows = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let rec = rec.with_context(|| format!("{origin}: line {}: malformed CSV record", i + 2))?;
            rows.push(rec.iter().map(String::from).collect());
        }
        Ok(Table::from_strings(&origin, header, rows))
    }

    /// Where row `i` (0-based) is, for error messages.
    pub fn row_label(&self, i: usize) -> String {
        match self.numbering {
            Numbering::Row => format!("row {}", i + 1),
            Numbering::Line => format!("line {}", i + 2),
        }
    }

    /// Fails on a missing required column or on a column that is neither required nor optional,
    /// so that a new upstream column with unknown meaning is never silently ignored.
    pub fn check_columns(&self, table: &str, required: &[&str], optional: &[&str]) -> Result<()> {
        for r in required {
            if !self.header.iter().any(|h| h == r) {
                bail!(
                    "{}: missing column '{r}' (table {table} needs: {})",
                    self.origin,
                    required.join(", ")
                );
            }
        }
        for h in &self.header {
            if !required.contains(&h.as_str()) && !optional.contains(&h.as_str()) {
                bail!(
                    "{}: unknown column '{h}' in table {table} (known: {}, {})",
                    self.origin,
                    required.join(", "),
                    optional.join(", ")
                );
            }
        }
        Ok(())
    }

    pub fn col(&self, name: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| anyhow!("{}: missing column '{name}'", self.origin))
    }

    pub fn opt_col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    pub fn f64_at(&self, row: usize, col: usize) -> Result<f64> {
        let v = match &self.rows[row][col] {
            Cell::Int(v) => *v as f64,
            Cell::Float(v) => *v,
            Cell::Str(s) => s.parse::<f64>().map_err(|_| self.bad(row, col, "is not a number"))?,
            Cell::Null => return Err(self.bad(row, col, "is empty")),
        };
        if !v.is_finite() {
            return Err(self.bad(row, col, "is not finite"));
        }
        Ok(v)
    }

    /// A non-negative integer (shape fields, counts).
    pub fn u64_at(&self, row: usize, col: usize) -> Result<u64> {
        let v = self.f64_at(row, col)?;
        if v < 0.0 || v.fract() != 0.0 {
            return Err(self.bad(row, col, "must be a non-negative integer"));
        }
        Ok(v as u64)
    }

    /// A latency in milliseconds, returned in microseconds.
    pub fn latency_ms_as_us(&self, row: usize, col: usize) -> Result<f64> {
        let ms = self.f64_at(row, col)?;
        if ms <= 0.0 {
            return Err(self.bad(row, col, "must be a positive time in milliseconds"));
        }
        Ok(ms * 1000.0)
    }

    pub fn str_at(&self, row: usize, col: usize) -> Cow<'_, str> {
        match &self.rows[row][col] {
            Cell::Str(s) => Cow::Borrowed(s.as_str()),
            Cell::Int(v) => Cow::Owned(v.to_string()),
            Cell::Float(v) => Cow::Owned(v.to_string()),
            Cell::Null => Cow::Borrowed(""),
        }
    }

    /// Error for a cell: file, row, column and value.
    pub fn bad(&self, row: usize, col: usize, what: &str) -> anyhow::Error {
        anyhow!(
            "{}: {}: column '{}' = '{}' {what}",
            self.origin,
            self.row_label(row),
            self.header[col],
            self.str_at(row, col)
        )
    }
}
