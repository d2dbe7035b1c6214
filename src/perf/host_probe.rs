//! The serving host's speed against the machine an engine's host model was fitted on, from
//! `microbench/e2e/host_speed_probe.py` readings (`--host-probe`) or as a plain factor
//! (`--host-scale`; the flags: `cli::common::HostSpeedArgs`). Lent H200 machines of one recorded
//! CPU model run vLLM's host work at two speeds ~1.5x apart; the probe's Python loop tells them apart
//! (`microbench/data/h200_sxm/vllm_engine/README.md`, runs 9 and 10).

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

/// The probe field the factor is read from: ns per iteration of a pure-Python loop, the kind of
/// work an engine's scheduler loop does.
pub const PROBE_FIELD: &str = "python_loop_ns";

/// Probe readings of one host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostProbe {
    /// `python_loop_ns` of every reading, in file order.
    pub python_loop_ns: Vec<f64>,
}

impl HostProbe {
    /// Reads probe files: each one reading (the probe's JSON object), a JSON array of
    /// readings, or a harness `env.json` whose `host_probe` array holds them. Readings that
    /// failed on the device (`{"error": ...}` in an array) are skipped; a file without any
    /// reading is an error naming it.
    pub fn load(paths: &[PathBuf]) -> Result<HostProbe> {
        if paths.is_empty() {
            bail!("--host-probe needs at least one probe file");
        }
        let mut python_loop_ns = Vec::new();
        for path in paths {
            let found = readings_in(path)?;
            if found.is_empty() {
                bail!("{}: no probe reading with a '{PROBE_FIELD}' field (write one with microbench/e2e/host_speed_probe.py)", path.display());
            }
            python_loop_ns.extend(found);
        }
        Ok(HostProbe { python_loop_ns })
    }

    /// Median over the readings: a shared host's single-thread speed swings between readings
    /// (58-118 ns on one slow machine), so one reading is not enough.
    pub fn median_python_loop_ns(&self) -> f64 {
        crate::quantile::median(&self.python_loop_ns)
    }

    /// How much slower (> 1) this host runs the probe than the reference machine did.
    pub fn factor_against(&self, reference_ns: f64) -> f64 {
        self.median_python_loop_ns() / reference_ns
    }
}

/// The probe readings one file holds (none for a harness `env.json` written without a probe).
pub fn readings_in(path: &Path) -> Result<Vec<f64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading host probe {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    readings(&json, path)
}

fn readings(json: &serde_json::Value, path: &Path) -> Result<Vec<f64>> {
    let one = |v: &serde_json::Value, at: &str| -> Result<Option<f64>> {
        match v.get(PROBE_FIELD) {
            None => Ok(None),
            Some(x) => {
                let ns = x.as_f64().filter(|ns| *ns > 0.0 && ns.is_finite()).ok_or_else(|| {
                    anyhow!("{}{at}: field '{PROBE_FIELD}' must be a positive number of nanoseconds, got {x}", path.display())
                })?;
                Ok(Some(ns))
            }
        }
    };
    let list = match json {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Object(map) => match map.get("host_probe") {
            Some(serde_json::Value::Array(items)) => items,
            _ => return Ok(one(json, "")?.into_iter().collect()),
        },
        _ => bail!("{}: a host probe file holds a JSON object or an array of them", path.display()),
    };
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        if let Some(ns) = one(item, &format!(" reading {i}"))? {
            out.push(ns);
        }
    }
    Ok(out)
}

/// How fast the serving host is, as the CLI gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum HostSpeed {
    /// Every host term times this.
    Scale(f64),
    /// Every host term times the probe's median over the fitted machine's (the engine's host
    /// model must record its reference reading).
    Probe(HostProbe),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn readings_come_from_objects_arrays_and_env_files_and_the_median_is_taken() {
        let d = tempfile::tempdir().unwrap();
        let one = write(d.path(), "p.json", r#"{"python_loop_ns": 100.0, "launch_us": 6.0}"#);
        let many = write(d.path(), "a.json", r#"[{"python_loop_ns": 60.0}, {"error": "timed out"}, {"python_loop_ns": 80.0}]"#);
        let env = write(d.path(), "env.json", r#"{"plan": "x", "host_probe": [{"python_loop_ns": 120.0}]}"#);
        let p = HostProbe::load(&[one, many, env]).unwrap();
        assert_eq!(p.python_loop_ns, vec![100.0, 60.0, 80.0, 120.0]);
        assert_eq!(p.median_python_loop_ns(), 90.0);
        assert_eq!(p.factor_against(60.0), 1.5);
    }

    #[test]
    fn bad_probe_files_name_the_file_and_field() {
        let d = tempfile::tempdir().unwrap();
        let neg = write(d.path(), "neg.json", r#"{"python_loop_ns": -3}"#);
        let e = HostProbe::load(&[neg]).unwrap_err().to_string();
        assert!(e.contains("neg.json") && e.contains("python_loop_ns") && e.contains("positive"), "{e}");
        let none = write(d.path(), "none.json", r#"{"launch_us": 6.0}"#);
        let e = HostProbe::load(&[none]).unwrap_err().to_string();
        assert!(e.contains("none.json") && e.contains("no probe reading"), "{e}");
        let text = write(d.path(), "t.json", "not json");
        assert!(HostProbe::load(&[text]).unwrap_err().to_string().contains("t.json"));
        assert!(HostProbe::load(&[]).is_err());
    }
}
