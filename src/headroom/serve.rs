//! `sol --serve`: one JSON request per input line, one JSON answer per output line, so an agent
//! loop can keep the process open. A bad request gets `{"error": ...}` and serving goes on.

use super::trace::{Definition, Workload};
use super::{evaluate_definition, evaluate_kernel, verdict::check_measured, Answer, Target};
use crate::schema::{Dtype, Kernel, Op};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;

/// Request keys that are not kernel-shape fields.
const CONTROL_KEYS: [&str; 7] = ["id", "gpu", "measured_us", "definition", "workload", "workload_index", "uuid"];

/// Answers requests, loading each GPU spec (and its calibration) once.
pub struct Server {
    default_gpu: Option<String>,
    targets: HashMap<String, Target>,
}

impl Server {
    pub fn new(default_gpu: Option<String>) -> Server {
        Server { default_gpu, targets: HashMap::new() }
    }

    /// Answer to one request line: the answer object, or `{"error": ...}` (with the
    /// request's `id` echoed when it has one).
    pub fn answer_line(&mut self, line: &str) -> Value {
        let parsed: Result<Value> = serde_json::from_str(line).map_err(|e| anyhow!("malformed request JSON: {e}"));
        let id = parsed.as_ref().ok().and_then(|v| v.get("id").cloned());
        let result = parsed.and_then(|v| self.answer(&v));
        let mut out = match result {
            Ok(a) => serde_json::to_value(a).unwrap_or_else(|e| error_value(&format!("{e}"))),
            Err(e) => error_value(&format!("{e:#}")),
        };
        if let (Some(id), Some(obj)) = (id, out.as_object_mut()) {
            obj.insert("id".into(), id);
        }
        out
    }

    pub fn answer(&mut self, req: &Value) -> Result<Answer> {
        let obj = req.as_object().ok_or_else(|| anyhow!("a request must be a JSON object"))?;
        let gpu_id = match obj.get("gpu") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => bail!("field 'gpu' must be a string, got {other}"),
            None => self.default_gpu.clone().ok_or_else(|| anyhow!("missing field 'gpu' (e.g. \"h200_sxm\")"))?,
        };
        let measured = match obj.get("measured_us") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let t = v.as_f64().ok_or_else(|| anyhow!("field 'measured_us' must be a number, got {v}"))?;
                Some(check_measured(t, "measured_us")?)
            }
        };
        if !self.targets.contains_key(&gpu_id) {
            let target = Target::load(&gpu_id).context("field 'gpu'")?;
            self.targets.insert(gpu_id.clone(), target);
        }
        let target = &self.targets[&gpu_id];
        if let Some(d) = obj.get("definition") {
            let def = definition_from(d)?;
            let w = workload_from(obj)?;
            evaluate_definition(&def, &w, &target.gpu, measured, "field 'workload'")
        } else if obj.contains_key("op") {
            evaluate_kernel(&kernel_from(obj)?, target, measured)
        } else {
            bail!("a request needs 'definition' (with 'workload') or kernel-shape fields starting with 'op'")
        }
    }
}

fn error_value(msg: &str) -> Value {
    let mut m = Map::new();
    m.insert("error".into(), Value::String(msg.to_string()));
    Value::Object(m)
}

/// `definition`: an inline definition object or a path to a definition JSON file.
fn definition_from(v: &Value) -> Result<Definition> {
    match v {
        Value::String(path) => Definition::from_path(Path::new(path)),
        Value::Object(_) => Definition::from_value(v, "field 'definition'"),
        other => bail!("field 'definition' must be an object or a path, got {other}"),
    }
}

/// `workload`: an object (a JSONL line, the inner workload, or bare axes) or a path to a
/// `.jsonl` file with `workload_index` (0-based, default 0) or `uuid` picking the line.
fn workload_from(obj: &Map<String, Value>) -> Result<Workload> {
    match obj.get("workload") {
        None | Some(Value::Null) => Workload::from_value(&Value::Object(Map::new()), "field 'workload'"),
        Some(Value::String(path)) => {
            let all = Workload::read_jsonl(Path::new(path))?;
            if let Some(uuid) = obj.get("uuid").and_then(Value::as_str) {
                return all
                    .into_iter()
                    .find(|w| w.uuid.as_deref() == Some(uuid))
                    .ok_or_else(|| anyhow!("field 'uuid': no workload '{uuid}' in {path}"));
            }
            let i = match obj.get("workload_index") {
                None => 0,
                Some(v) => v.as_u64().ok_or_else(|| anyhow!("field 'workload_index' must be a non-negative integer"))? as usize,
            };
            let n = all.len();
            all.into_iter()
                .nth(i)
                .ok_or_else(|| anyhow!("field 'workload_index' = {i} but {path} has {n} workloads"))
        }
        Some(v @ Value::Object(_)) => Workload::from_value(v, "field 'workload'"),
        Some(other) => bail!("field 'workload' must be an object or a path, got {other}"),
    }
}

/// Kernel-shape fields of the shared schema (`op`, `dtype`, `m`, `n`, `k`, ..., `kv_dtype`).
pub fn kernel_from(obj: &Map<String, Value>) -> Result<Kernel> {
    let text = |f: &str| -> Result<Option<&str>> {
        match obj.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => bail!("field '{f}' must be a string, got {other}"),
        }
    };
    let op: Op = text("op")?.ok_or_else(|| anyhow!("missing field 'op'"))?.parse().context("field 'op'")?;
    let dtype: Dtype = text("dtype")?.map(str::parse).transpose().context("field 'dtype'")?.unwrap_or(Dtype::Bf16);
    let kv_dtype: Option<Dtype> = text("kv_dtype")?.map(str::parse).transpose().context("field 'kv_dtype'")?;
    let template = Kernel::new(op, dtype);
    let names: Vec<&str> = template.numeric_fields().iter().map(|(n, _)| *n).collect();
    let mut fields = serde_json::to_value(&template)?;
    let slots = fields.as_object_mut().ok_or_else(|| anyhow!("kernel template is not an object"))?;
    for (key, val) in obj {
        if CONTROL_KEYS.contains(&key.as_str()) || ["op", "dtype", "kv_dtype"].contains(&key.as_str()) {
            continue;
        }
        if !names.contains(&key.as_str()) {
            bail!("unknown field '{key}'; kernel-shape fields: op, dtype, kv_dtype, {}", names.join(", "));
        }
        let n = val.as_u64().ok_or_else(|| anyhow!("field '{key}' = {val} must be a non-negative integer"))?;
        slots.insert(key.clone(), Value::from(n));
    }
    let mut k: Kernel = serde_json::from_value(fields)?;
    k.kv_dtype = kv_dtype;
    k.validate()?;
    Ok(k)
}

/// Serves until end of input, flushing after each answer.
pub fn serve<R: BufRead, W: Write>(input: R, mut output: W, default_gpu: Option<String>) -> Result<()> {
    let mut server = Server::new(default_gpu);
    for line in input.lines() {
        let line = line.context("reading a request line")?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = server.answer_line(&line);
        writeln!(output, "{answer}")?;
        output.flush()?;
    }
    Ok(())
}
