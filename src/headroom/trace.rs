//! FlashInfer-Trace definitions and workloads: parsing, validation and axis resolution.
//!
//! A definition names an `op_type`, its axes (`const` with a value, or `var`), and its input and
//! output tensors (shape as a list of axis names, dtype). A workload binds every `var` axis to a
//! value. Errors name the file (`origin`), the field and what was expected.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum Axis {
    Const(u64),
    Var,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Axis names; `None` for scalars (kernel arguments, not HBM traffic).
    pub shape: Option<Vec<String>>,
    pub dtype: String,
    pub description: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub op_type: String,
    pub description: String,
    pub tags: Vec<String>,
    pub axes: BTreeMap<String, Axis>,
    pub inputs: BTreeMap<String, Tensor>,
    pub outputs: BTreeMap<String, Tensor>,
}

/// One workload: the values of the definition's `var` axes, and which inputs the file does not
/// carry (stored in safetensors blobs).
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub uuid: Option<String>,
    pub definition: Option<String>,
    pub axes: BTreeMap<String, u64>,
    /// Inputs whose values live in a safetensors blob the trace file does not include.
    pub blob_inputs: Vec<String>,
}

/// Bytes per element of a FlashInfer-Trace dtype name.
pub fn dtype_bytes(dtype: &str) -> Option<f64> {
    Some(match dtype {
        "float64" | "int64" | "uint64" => 8.0,
        "float32" | "int32" | "uint32" => 4.0,
        "float16" | "bfloat16" | "int16" | "uint16" => 2.0,
        "float8_e4m3fn" | "float8_e5m2" | "float8_e4m3fnuz" | "float8_e5m2fnuz" | "int8"
        | "uint8" | "bool" => 1.0,
        "float4_e2m1" | "float4_e2m1fn" => 0.5,
        _ => return None,
    })
}

const KNOWN_DTYPES: &str = "float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, \
    float4_e2m1, int64, int32, int16, int8, uint8, bool";

impl Definition {
    pub fn from_path(path: &Path) -> Result<Definition> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading definition {}", path.display()))?;
        Definition::from_json_str(&text, &path.display().to_string())
    }

    pub fn from_json_str(text: &str, origin: &str) -> Result<Definition> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| anyhow!("{origin}: malformed definition JSON: {e}"))?;
        Definition::from_value(&v, origin)
    }

    pub fn from_value(v: &Value, origin: &str) -> Result<Definition> {
        let obj = v.as_object().ok_or_else(|| anyhow!("{origin}: a definition must be a JSON object"))?;
        let string = |field: &str, required: bool| -> Result<String> {
            match obj.get(field) {
                Some(Value::String(s)) => Ok(s.clone()),
                None | Some(Value::Null) if !required => Ok(String::new()),
                None => bail!("{origin}: missing required field '{field}' (a string)"),
                Some(other) => bail!("{origin}: field '{field}' must be a string, got {other}"),
            }
        };
        let name = string("name", true)?;
        let op_type = string("op_type", true)?;
        let description = string("description", false)?;
        let tags = match obj.get("tags") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| anyhow!("{origin}: field 'tags' must be a list of strings"))?,
            Some(_) => bail!("{origin}: field 'tags' must be a list of strings"),
        };
        let axes_v = obj
            .get("axes")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("{origin}: missing required field 'axes' (an object)"))?;
        let mut axes = BTreeMap::new();
        for (a, spec) in axes_v {
            let kind = spec.get("type").and_then(Value::as_str);
            let axis = match kind {
                Some("var") => Axis::Var,
                Some("const") => {
                    let value = spec.get("value").and_then(Value::as_u64).ok_or_else(|| {
                        anyhow!("{origin}: field 'axes.{a}.value' must be a non-negative integer for a const axis")
                    })?;
                    Axis::Const(value)
                }
                _ => bail!("{origin}: field 'axes.{a}.type' must be \"const\" or \"var\""),
            };
            axes.insert(a.clone(), axis);
        }
        let inputs = parse_tensors(obj.get("inputs"), "inputs", &axes, origin)?;
        let outputs = parse_tensors(obj.get("outputs"), "outputs", &axes, origin)?;
        Ok(Definition { name, op_type, description, tags, axes, inputs, outputs })
    }

    /// Value of a tag `key:value`, e.g. `stage` -> `decode`.
    pub fn tag_value(&self, key: &str) -> Option<&str> {
        self.tags.iter().find_map(|t| t.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
    }

    /// Binds the workload's axes: every `var` axis must be given, a given `const` axis must
    /// match its value, and no undeclared axis may appear.
    pub fn resolve(&self, w: &Workload, origin: &str) -> Result<Shape> {
        if let Some(d) = &w.definition {
            if !d.is_empty() && *d != self.name {
                bail!("{origin}: workload is for definition '{d}', not '{}'", self.name);
            }
        }
        let mut values = BTreeMap::new();
        for (name, axis) in &self.axes {
            match (axis, w.axes.get(name)) {
                (Axis::Const(c), Some(&v)) if v != *c => bail!(
                    "{origin}: workload axis '{name}' = {v} contradicts definition '{}' constant {name} = {c}",
                    self.name
                ),
                (Axis::Const(c), _) => {
                    values.insert(name.clone(), *c);
                }
                (Axis::Var, Some(&v)) => {
                    values.insert(name.clone(), v);
                }
                (Axis::Var, None) => bail!(
                    "{origin}: workload lacks axis '{name}' (definition '{}' declares var axes: {})",
                    self.name,
                    self.var_axes().join(", ")
                ),
            }
        }
        for name in w.axes.keys() {
            if !self.axes.contains_key(name) {
                bail!(
                    "{origin}: workload axis '{name}' is not declared by definition '{}' (axes: {})",
                    self.name,
                    self.axes.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        Ok(Shape { values })
    }

    pub fn var_axes(&self) -> Vec<String> {
        self.axes.iter().filter(|(_, a)| **a == Axis::Var).map(|(n, _)| n.clone()).collect()
    }

    /// A tensor by name among inputs then outputs.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.inputs.get(name).or_else(|| self.outputs.get(name))
    }
}

fn parse_tensors(
    v: Option<&Value>,
    field: &str,
    axes: &BTreeMap<String, Axis>,
    origin: &str,
) -> Result<BTreeMap<String, Tensor>> {
    let obj = v
        .and_then(Value::as_object)
        .ok_or_else(|| anyhow!("{origin}: missing required field '{field}' (an object of tensors)"))?;
    let mut out = BTreeMap::new();
    for (name, spec) in obj {
        let dtype = spec
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("{origin}: field '{field}.{name}.dtype' must be a string"))?;
        if dtype_bytes(dtype).is_none() {
            bail!("{origin}: field '{field}.{name}.dtype' = '{dtype}' is not a known dtype ({KNOWN_DTYPES})");
        }
        let shape = match spec.get("shape") {
            None | Some(Value::Null) => None,
            Some(Value::Array(dims)) => {
                let mut names = Vec::new();
                for d in dims {
                    let a = d.as_str().ok_or_else(|| {
                        anyhow!("{origin}: field '{field}.{name}.shape' must list axis names, got {d}")
                    })?;
                    if !axes.contains_key(a) {
                        bail!("{origin}: field '{field}.{name}.shape' uses axis '{a}', which 'axes' does not declare");
                    }
                    names.push(a.to_string());
                }
                Some(names)
            }
            Some(other) => bail!("{origin}: field '{field}.{name}.shape' must be a list or null, got {other}"),
        };
        let description = spec.get("description").and_then(Value::as_str).unwrap_or("").to_string();
        out.insert(name.clone(), Tensor { shape, dtype: dtype.to_string(), description });
    }
    Ok(out)
}

impl Workload {
    /// Accepts a JSONL line (`{"definition":..,"workload":{..}}`), the inner workload object
    /// (`{"axes":..,"inputs":..}`), or a bare axes object (`{"M": 128}`).
    pub fn from_value(v: &Value, origin: &str) -> Result<Workload> {
        let obj = v.as_object().ok_or_else(|| anyhow!("{origin}: a workload must be a JSON object"))?;
        let definition = obj.get("definition").and_then(Value::as_str).map(str::to_string);
        let inner = match obj.get("workload") {
            Some(w) => w.as_object().ok_or_else(|| anyhow!("{origin}: field 'workload' must be an object"))?,
            None => obj,
        };
        let (axes_obj, inputs) = match inner.get("axes") {
            Some(a) => (
                a.as_object().ok_or_else(|| anyhow!("{origin}: field 'workload.axes' must be an object"))?,
                inner.get("inputs"),
            ),
            None if obj.contains_key("workload") => bail!("{origin}: missing field 'workload.axes'"),
            None => (inner, None),
        };
        let mut axes = BTreeMap::new();
        for (k, val) in axes_obj {
            if k == "definition" {
                continue;
            }
            let n = val.as_u64().ok_or_else(|| {
                anyhow!("{origin}: workload axis '{k}' = {val} must be a non-negative integer")
            })?;
            axes.insert(k.clone(), n);
        }
        let mut blob_inputs = Vec::new();
        if let Some(Value::Object(ins)) = inputs {
            for (name, spec) in ins {
                if spec.get("type").and_then(Value::as_str) == Some("safetensors") {
                    blob_inputs.push(name.clone());
                }
            }
        }
        let uuid = inner.get("uuid").and_then(Value::as_str).map(str::to_string);
        Ok(Workload { uuid, definition, axes, blob_inputs })
    }

    /// Reads every line of a `.jsonl` workload file; errors name the line.
    pub fn read_jsonl(path: &Path) -> Result<Vec<Workload>> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading workloads {}", path.display()))?;
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let origin = format!("{}: line {}", path.display(), i + 1);
            let v: Value = serde_json::from_str(line)
                .map_err(|e| anyhow!("{origin}: malformed workload JSON: {e}"))?;
            out.push(Workload::from_value(&v, &origin)?);
        }
        if out.is_empty() {
            bail!("{}: no workloads (expected one JSON object per line)", path.display());
        }
        Ok(out)
    }
}

/// Resolved axis values of one definition + workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub values: BTreeMap<String, u64>,
}

impl Shape {
    pub fn get(&self, axis: &str) -> Result<u64> {
        self.values.get(axis).copied().ok_or_else(|| anyhow!("definition lacks axis '{axis}'"))
    }

    pub fn get_f(&self, axis: &str) -> Result<f64> {
        self.get(axis).map(|v| v as f64)
    }

    pub fn opt(&self, axis: &str) -> Option<u64> {
        self.values.get(axis).copied()
    }

    /// Number of elements of a tensor (scalars: 0, they are kernel arguments).
    pub fn elems(&self, t: &Tensor) -> f64 {
        match &t.shape {
            None => 0.0,
            Some(dims) => dims.iter().map(|d| self.values.get(d).copied().unwrap_or(0) as f64).product(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gemm_def() -> Definition {
        let v = json!({"name":"g","op_type":"gemm","axes":{"M":{"type":"var"},"N":{"type":"const","value":128},"K":{"type":"const","value":64}},
            "inputs":{"A":{"shape":["M","K"],"dtype":"float16"},"B":{"shape":["N","K"],"dtype":"float16"}},
            "outputs":{"C":{"shape":["M","N"],"dtype":"float16"}}});
        Definition::from_value(&v, "g.json").unwrap()
    }

    #[test]
    fn resolve_checks_missing_contradicting_and_unknown_axes() {
        let d = gemm_def();
        let ok = Workload::from_value(&json!({"axes":{"M":8}}), "w").unwrap();
        let s = d.resolve(&ok, "w").unwrap();
        assert_eq!((s.get("M").unwrap(), s.get("N").unwrap(), s.get("K").unwrap()), (8, 128, 64));
        let missing = Workload::from_value(&json!({"axes":{}}), "w").unwrap();
        let e = d.resolve(&missing, "w.jsonl: line 3").unwrap_err().to_string();
        assert!(e.contains("w.jsonl: line 3") && e.contains("lacks axis 'M'"), "{e}");
        let contra = Workload::from_value(&json!({"M":8,"N":256}), "w").unwrap();
        let e = d.resolve(&contra, "w").unwrap_err().to_string();
        assert!(e.contains("'N' = 256") && e.contains("N = 128"), "{e}");
        let unknown = Workload::from_value(&json!({"M":8,"Q":1}), "w").unwrap();
        assert!(d.resolve(&unknown, "w").unwrap_err().to_string().contains("'Q'"));
    }

    #[test]
    fn malformed_definitions_name_the_field() {
        let e = Definition::from_json_str("{\"name\": 1", "d.json").unwrap_err().to_string();
        assert!(e.contains("d.json") && e.contains("malformed"), "{e}");
        let e = Definition::from_value(&json!({"name":"x","axes":{},"inputs":{},"outputs":{}}), "d.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'op_type'"), "{e}");
        let bad_dtype = json!({"name":"x","op_type":"gemm","axes":{"M":{"type":"var"}},
            "inputs":{"A":{"shape":["M"],"dtype":"float7"}},"outputs":{}});
        let e = Definition::from_value(&bad_dtype, "d.json").unwrap_err().to_string();
        assert!(e.contains("inputs.A.dtype") && e.contains("float7"), "{e}");
        let bad_axis = json!({"name":"x","op_type":"gemm","axes":{"M":{"type":"var"}},
            "inputs":{"A":{"shape":["M","Z"],"dtype":"float16"}},"outputs":{}});
        let e = Definition::from_value(&bad_axis, "d.json").unwrap_err().to_string();
        assert!(e.contains("inputs.A.shape") && e.contains("'Z'"), "{e}");
    }

    #[test]
    fn workload_line_lists_blob_inputs() {
        let line = json!({"definition":"g","workload":{"uuid":"u1","axes":{"M":4},
            "inputs":{"A":{"type":"random"},"idx":{"type":"safetensors","path":"./blob/x.safetensors"}}}});
        let w = Workload::from_value(&line, "w").unwrap();
        assert_eq!(w.uuid.as_deref(), Some("u1"));
        assert_eq!(w.blob_inputs, vec!["idx".to_string()]);
        let other = Workload { definition: Some("h".into()), ..w };
        assert!(gemm_def().resolve(&other, "w").unwrap_err().to_string().contains("'h'"));
    }
}
