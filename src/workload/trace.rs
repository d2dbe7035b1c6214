//! Trace replay and writing: CSV (header `arrival_s,prompt_tokens,output_tokens` plus optional
//! `prefix_group`, `prefix_tokens`, any order) or JSONL (one object per line, same keys).
//! Read one record at a time, so a million-request trace costs no memory.

use super::{RequestSource, RequestSpec};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

pub const CSV_HEADER: &str = "arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens";

enum Format {
    Csv { reader: Box<csv::Reader<BufReader<File>>>, cols: [Option<usize>; 5], record: csv::StringRecord },
    Jsonl { lines: std::io::Lines<BufReader<File>> },
}

pub struct TraceReader {
    path: PathBuf,
    format: Format,
    limit: Option<u64>,
    emitted: u64,
    line: u64,
    last_arrival_s: f64,
    /// Non-numeric prefix group names (traces may use any string).
    groups: HashMap<String, u64>,
}

/// Numeric group names keep their number; other names are numbered from here, first seen first.
const NAMED_GROUP_BASE: u64 = 1 << 40;

const KEYS: [&str; 5] = ["arrival_s", "prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"];

impl TraceReader {
    pub fn open(path: &Path, limit: Option<u64>) -> Result<TraceReader> {
        let file = File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
        let is_jsonl = matches!(path.extension().and_then(|e| e.to_str()), Some("jsonl" | "json" | "ndjson"));
        let format = if is_jsonl {
            Format::Jsonl { lines: BufReader::new(file).lines() }
        } else {
            let mut reader = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(BufReader::new(file));
            let header = reader.headers().with_context(|| format!("{}: reading the CSV header", path.display()))?.clone();
            let mut cols = [None; 5];
            for (i, key) in KEYS.iter().enumerate() {
                cols[i] = header.iter().position(|h| h == *key);
            }
            for (i, key) in KEYS.iter().enumerate().take(3) {
                if cols[i].is_none() {
                    bail!(
                        "{}: line 1: missing column '{key}'; the header needs arrival_s,prompt_tokens,output_tokens \
                         (optional prefix_group,prefix_tokens), found '{}'",
                        path.display(),
                        header.iter().collect::<Vec<_>>().join(",")
                    );
                }
            }
            Format::Csv { reader: Box::new(reader), cols, record: csv::StringRecord::new() }
        };
        // CSV lines count the header; JSONL lines are counted as they are read.
        let line = if is_jsonl { 0 } else { 1 };
        Ok(TraceReader { path: path.to_path_buf(), format, limit, emitted: 0, line, last_arrival_s: 0.0, groups: HashMap::new() })
    }

    fn err(&self, msg: String) -> anyhow::Error {
        anyhow!("{}: line {}: {msg}", self.path.display(), self.line)
    }

    /// Raw field values of the next record, None at the end.
    fn next_fields(&mut self) -> Result<Option<[Option<String>; 5]>> {
        match &mut self.format {
            Format::Csv { reader, cols, record } => {
                let more = reader.read_record(record).map_err(|e| anyhow!("{}: {e}", self.path.display()))?;
                if !more {
                    return Ok(None);
                }
                self.line = record.position().map(|p| p.line()).unwrap_or(self.line + 1);
                let mut out: [Option<String>; 5] = Default::default();
                for (i, c) in cols.iter().enumerate() {
                    out[i] = c.and_then(|c| record.get(c)).filter(|s| !s.is_empty()).map(str::to_string);
                }
                Ok(Some(out))
            }
            Format::Jsonl { lines } => loop {
                let Some(line) = lines.next() else { return Ok(None) };
                self.line += 1;
                let line = line.with_context(|| format!("{}: reading", self.path.display()))?;
                if line.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value =
                    serde_json::from_str(&line).map_err(|e| anyhow!("{}: line {}: malformed JSON: {e}", self.path.display(), self.line))?;
                let mut out: [Option<String>; 5] = Default::default();
                for (i, key) in KEYS.iter().enumerate() {
                    out[i] = match v.get(*key) {
                        None | Some(serde_json::Value::Null) => None,
                        Some(serde_json::Value::String(s)) => Some(s.clone()),
                        Some(x) => Some(x.to_string()),
                    };
                }
                return Ok(Some(out));
            },
        }
    }

    fn number(&self, field: &Option<String>, key: &str) -> Result<f64> {
        let s = field.as_deref().ok_or_else(|| self.err(format!("missing value for '{key}'")))?;
        let x: f64 = s.parse().map_err(|_| self.err(format!("'{key}' must be a number, got '{s}'")))?;
        if !x.is_finite() || x < 0.0 {
            return Err(self.err(format!("'{key}' must be a finite number >= 0, got {s}")));
        }
        Ok(x)
    }

    fn count(&self, field: &Option<String>, key: &str, min: u32) -> Result<u32> {
        let x = self.number(field, key)?;
        if x.fract() != 0.0 || x < min as f64 || x > u32::MAX as f64 {
            return Err(self.err(format!("'{key}' must be an integer >= {min}, got {x}")));
        }
        Ok(x as u32)
    }
}

impl RequestSource for TraceReader {
    fn next_request(&mut self) -> Result<Option<RequestSpec>> {
        if self.limit.is_some_and(|n| self.emitted >= n) {
            return Ok(None);
        }
        let Some(f) = self.next_fields()? else { return Ok(None) };
        let arrival_s = self.number(&f[0], "arrival_s")?;
        if arrival_s < self.last_arrival_s {
            return Err(self.err(format!("arrival_s {arrival_s} is earlier than the previous {}; traces must be sorted by arrival time", self.last_arrival_s)));
        }
        self.last_arrival_s = arrival_s;
        let prompt = self.count(&f[1], "prompt_tokens", 1)?;
        let output = self.count(&f[2], "output_tokens", 1)?;
        let group = match &f[3] {
            None => None,
            Some(name) => match name.parse::<u64>() {
                Ok(id) if id < NAMED_GROUP_BASE => Some(id),
                _ => {
                    let n = NAMED_GROUP_BASE + self.groups.len() as u64;
                    Some(*self.groups.entry(name.clone()).or_insert(n))
                }
            },
        };
        // Without prefix_tokens, a grouped request's whole prompt is the group's stream (as in
        // multi-turn replays, where each prompt extends the previous one).
        let prefix = match (&f[4], group) {
            (_, None) => 0,
            (None, Some(_)) => prompt,
            (Some(_), Some(_)) => self.count(&f[4], "prefix_tokens", 0)?,
        };
        if prefix as u64 > prompt as u64 + output as u64 {
            return Err(self.err(format!("prefix_tokens {prefix} exceeds prompt_tokens + output_tokens = {}", prompt as u64 + output as u64)));
        }
        let id = self.emitted;
        self.emitted += 1;
        Ok(Some(RequestSpec { id, arrival_s, prompt_tokens: prompt, output_tokens: output, prefix_group: group, prefix_tokens: prefix }))
    }
}

/// Writes the whole stream as CSV with `CSV_HEADER`; returns the number of requests.
pub fn write_csv<W: Write>(source: &mut dyn RequestSource, out: &mut W) -> Result<u64> {
    writeln!(out, "{CSV_HEADER}")?;
    let mut n = 0;
    while let Some(r) = source.next_request()? {
        let group = r.prefix_group.map(|g| g.to_string()).unwrap_or_default();
        writeln!(out, "{},{},{},{},{}", r.arrival_s, r.prompt_tokens, r.output_tokens, group, r.prefix_tokens)?;
        n += 1;
    }
    Ok(n)
}
