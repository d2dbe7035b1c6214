//! `sol budget`: spread N optimization trials over a set of problems in proportion to their
//! expected gain.
//!
//! Model: a problem with headroom h (measured / practical bound) can gain at most ln h in log
//! time; each trial gains ln(1 + GAIN_PER_TRIAL) until that is used up, so it needs
//! `trials_for(h)` trials. Trials go to problems in proportion to weight x ln h, capped at each
//! problem's need; near-SOL and suspicious problems get none. The expected geomean speedup
//! ceiling is exp(sum w_i min(ln h_i, n_i ln(1 + g)) / sum w_i).

use super::serve::kernel_from;
use super::trace::{Definition, Workload};
use super::verdict::{check_measured, trials_for, Verdict, GAIN_PER_TRIAL};
use super::{evaluate_definition, evaluate_kernel, Target};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub name: String,
    pub measured_us: f64,
    pub practical_us: f64,
    pub sol_us: Option<f64>,
    pub weight: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Allocation {
    pub name: String,
    pub headroom: f64,
    pub verdict: Verdict,
    pub trials: u32,
    /// Trials that would close the whole headroom.
    pub need: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub allocations: Vec<Allocation>,
    pub trials_total: u32,
    pub trials_allocated: u32,
    /// Geomean speedup if the allocated trials realize their expected gain.
    pub expected_geomean_speedup: f64,
    /// Geomean speedup if every problem reached its practical bound.
    pub full_geomean_speedup: f64,
}

fn verdict_of(p: &Problem) -> (f64, Verdict) {
    let h = p.measured_us / p.practical_us;
    let v = if p.sol_us.map(|s| p.measured_us < s * (1.0 - super::verdict::NOISE_MARGIN)).unwrap_or(false) {
        Verdict::Suspicious
    } else if trials_for(h) == 0 {
        Verdict::NearSol
    } else {
        Verdict::Headroom
    };
    (h, v)
}

pub fn allocate(problems: &[Problem], trials: u32) -> Plan {
    let info: Vec<(f64, Verdict, u32, f64)> = problems
        .iter()
        .map(|p| {
            let (h, v) = verdict_of(p);
            let need = if v == Verdict::Headroom { trials_for(h) } else { 0 };
            let gain = if need > 0 { p.weight * h.ln() } else { 0.0 };
            (h, v, need, gain)
        })
        .collect();
    let mut alloc = vec![0u32; problems.len()];
    let mut remaining = trials;
    while remaining > 0 {
        let active: Vec<usize> = (0..problems.len()).filter(|&i| alloc[i] < info[i].2 && info[i].3 > 0.0).collect();
        if active.is_empty() {
            break;
        }
        let total: f64 = active.iter().map(|&i| info[i].3).sum();
        let mut given = 0;
        for &i in &active {
            let share = (remaining as f64 * info[i].3 / total).floor() as u32;
            let take = share.min(info[i].2 - alloc[i]);
            alloc[i] += take;
            given += take;
        }
        if given == 0 {
            // Shares all rounded down: one trial to the largest gain (lowest index on ties).
            let best = active.iter().copied().fold(active[0], |b, i| if info[i].3 > info[b].3 { i } else { b });
            alloc[best] += 1;
            given = 1;
        }
        remaining -= given;
    }
    let step = (1.0 + GAIN_PER_TRIAL).ln();
    let wsum: f64 = problems.iter().map(|p| p.weight).sum();
    let (mut expected, mut full) = (0.0, 0.0);
    for (i, p) in problems.iter().enumerate() {
        let lnh = if info[i].1 == Verdict::Headroom { info[i].0.ln() } else { 0.0 };
        expected += p.weight * lnh.min(alloc[i] as f64 * step);
        full += p.weight * lnh;
    }
    let gm = |x: f64| if wsum > 0.0 { (x / wsum).exp() } else { 1.0 };
    Plan {
        allocations: problems
            .iter()
            .enumerate()
            .map(|(i, p)| Allocation { name: p.name.clone(), headroom: info[i].0, verdict: info[i].1, trials: alloc[i], need: info[i].2 })
            .collect(),
        trials_total: trials,
        trials_allocated: alloc.iter().sum(),
        expected_geomean_speedup: gm(expected),
        full_geomean_speedup: gm(full),
    }
}

/// Reads a problems CSV (format in `docs/headroom.md`): `name`, `measured_us`, optional
/// `weight` and `gpu`, and the bound from `practical_us` (+ `sol_us`), or `definition` +
/// `workload` (+ `workload_index` or `uuid`), or shared-schema kernel columns starting at `op`.
pub fn read_problems(path: &Path, default_gpu: Option<&str>) -> Result<Vec<Problem>> {
    let origin = path.display().to_string();
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_path(path)
        .with_context(|| format!("opening {origin}"))?;
    let headers = rdr.headers().with_context(|| format!("{origin}: reading header"))?.clone();
    for required in ["name", "measured_us"] {
        if !headers.iter().any(|h| h == required) {
            bail!("{origin}: missing required column '{required}'");
        }
    }
    let mut targets = HashMap::new();
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let at = |e: anyhow::Error| e.context(format!("{origin}: line {line}"));
        let rec = rec.map_err(|e| anyhow!("{origin}: line {line}: malformed CSV record: {e}"))?;
        let row: HashMap<&str, &str> = headers.iter().zip(rec.iter()).filter(|(_, v)| !v.is_empty()).collect();
        out.push(problem_from(&row, default_gpu, &mut targets).map_err(at)?);
    }
    if out.is_empty() {
        bail!("{origin}: no problems");
    }
    Ok(out)
}

fn number(row: &HashMap<&str, &str>, field: &str) -> Result<Option<f64>> {
    row.get(field)
        .map(|v| v.parse::<f64>().map_err(|_| anyhow!("field '{field}' = '{v}' is not a number")))
        .transpose()
}

fn problem_from(
    row: &HashMap<&str, &str>,
    default_gpu: Option<&str>,
    targets: &mut HashMap<String, Target>,
) -> Result<Problem> {
    let name = row.get("name").ok_or_else(|| anyhow!("field 'name' is empty"))?.to_string();
    let measured_us = check_measured(number(row, "measured_us")?.ok_or_else(|| anyhow!("field 'measured_us' is empty"))?, "measured_us")?;
    let weight = number(row, "weight")?.unwrap_or(1.0);
    if !(weight > 0.0) || !weight.is_finite() {
        bail!("field 'weight' = {weight} must be a positive number");
    }
    if let Some(p) = number(row, "practical_us")? {
        let practical_us = check_measured(p, "practical_us")?;
        let sol_us = number(row, "sol_us")?.map(|s| check_measured(s, "sol_us")).transpose()?;
        return Ok(Problem { name, measured_us, practical_us, sol_us, weight });
    }
    let gpu_id = row.get("gpu").copied().or(default_gpu).ok_or_else(|| anyhow!("no 'gpu' column value and no --gpu"))?;
    if !targets.contains_key(gpu_id) {
        targets.insert(gpu_id.to_string(), Target::load(gpu_id).context("field 'gpu'")?);
    }
    let target = &targets[gpu_id];
    let answer = if let Some(def_path) = row.get("definition") {
        let def = Definition::from_path(Path::new(def_path))?;
        let wl_path = row.get("workload").ok_or_else(|| anyhow!("field 'workload' (a .jsonl path) is empty"))?;
        let all = Workload::read_jsonl(Path::new(wl_path))?;
        let w = match (row.get("uuid"), number(row, "workload_index")?) {
            (Some(u), _) => all.into_iter().find(|w| w.uuid.as_deref() == Some(*u)).ok_or_else(|| anyhow!("field 'uuid': no workload '{u}' in {wl_path}"))?,
            (None, i) => {
                let i = i.unwrap_or(0.0) as usize;
                all.into_iter().nth(i).ok_or_else(|| anyhow!("field 'workload_index' = {i} is past the end of {wl_path}"))?
            }
        };
        evaluate_definition(&def, &w, &target.gpu, None, wl_path)?
    } else if row.contains_key("op") {
        let mut obj = Map::new();
        for (k, v) in row {
            if ["name", "measured_us", "weight", "gpu"].contains(k) {
                continue;
            }
            let val = v.parse::<u64>().map(Value::from).unwrap_or_else(|_| Value::String(v.to_string()));
            obj.insert(k.to_string(), val);
        }
        evaluate_kernel(&kernel_from(&obj)?, target, None)?
    } else {
        bail!("each row needs 'practical_us', or 'definition' + 'workload', or kernel-shape columns starting with 'op'");
    };
    Ok(Problem { name, measured_us, practical_us: answer.bounds.practical_us, sol_us: Some(answer.bounds.sol_us), weight })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, measured: f64, practical: f64) -> Problem {
        Problem { name: name.into(), measured_us: measured, practical_us: practical, sol_us: None, weight: 1.0 }
    }

    #[test]
    fn near_sol_gets_nothing_and_gain_drives_the_split() {
        // Headrooms 1.05 (near-sol), 2 (needs 15 trials) and 4 (needs 29).
        let probs = [p("a", 105.0, 100.0), p("b", 200.0, 100.0), p("c", 400.0, 100.0)];
        let plan = allocate(&probs, 30);
        let t: Vec<u32> = plan.allocations.iter().map(|a| a.trials).collect();
        assert_eq!(t[0], 0);
        assert_eq!(t.iter().sum::<u32>(), 30);
        // Shares in proportion to ln 2 : ln 4 = 1 : 2 -> 10 and 20.
        assert_eq!((t[1], t[2]), (10, 20));
        // Expected: b gains min(ln2, 10 ln1.05), c min(ln4, 20 ln1.05); a gains 0.
        let step = 1.05f64.ln();
        let want = (((10.0 * step).min(2f64.ln()) + (20.0 * step).min(4f64.ln())) / 3.0).exp();
        assert!((plan.expected_geomean_speedup - want).abs() < 1e-12);
        assert!((plan.full_geomean_speedup - (8f64.ln() / 3.0).exp()).abs() < 1e-12);
    }

    #[test]
    fn surplus_trials_stop_at_each_need() {
        let plan = allocate(&[p("b", 200.0, 100.0), p("c", 400.0, 100.0)], 1000);
        assert_eq!(plan.allocations[0].trials, 15);
        assert_eq!(plan.allocations[1].trials, 29);
        assert_eq!(plan.trials_allocated, 44);
        assert!((plan.expected_geomean_speedup - plan.full_geomean_speedup).abs() < 1e-12);
    }

    #[test]
    fn suspicious_problems_get_no_trials() {
        let mut s = p("s", 50.0, 100.0);
        s.sol_us = Some(80.0);
        let plan = allocate(&[s, p("b", 200.0, 100.0)], 5);
        assert_eq!(plan.allocations[0].verdict, Verdict::Suspicious);
        assert_eq!((plan.allocations[0].trials, plan.allocations[1].trials), (0, 5));
    }
}
