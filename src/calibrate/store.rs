//! Layout of the fitted models under `calibration/` (JSON, embedded in the binary by build.rs;
//! a directory on disk can stand in for them):
//!
//! - `roofline.json`: the baseline's constant efficiency per op class;
//! - `target/<gpu>.json.gz`: models fitted on that GPU's own measurements;
//! - `cross-gen/all.json.gz`: fitted on every measured GPU (for GPUs with no measurements);
//! - `cross-gen/no_<gpu>.json.gz`: fitted with that GPU left out, so its cross-gen prediction
//!   never uses its own measurements;
//! - `manifest.json`: what data produced them.
//!
//! Model sets are gzipped: their tree ensembles are megabytes of JSON numbers, and every refit
//! rewrites them in git history. Readers ask for `x.json`; a `x.json.gz` stands in for it.

use super::model::ModelSet;
use crate::perf::roofline::RooflineParams;
use anyhow::{Context, Result};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::{Read, Write};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

include!(concat!(env!("OUT_DIR"), "/embedded_calibration.rs"));

/// The baseline's fitted constants and what they were fitted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RooflineFile {
    pub params: RooflineParams,
    pub fitted_on: Vec<String>,
    pub rows: usize,
}

/// Where calibration files are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// The copy built into the binary.
    Embedded,
    Dir(PathBuf),
}

pub fn target_path(gpu: &str) -> String {
    format!("target/{gpu}.json")
}

pub fn cross_gen_path(held_out: Option<&str>) -> String {
    match held_out {
        Some(g) => format!("cross-gen/no_{g}.json"),
        None => "cross-gen/all.json".to_string(),
    }
}

pub const ROOFLINE_PATH: &str = "roofline.json";
pub const MANIFEST_PATH: &str = "manifest.json";

impl Store {
    /// Text of `rel` (a path relative to `calibration/`), read from `rel` or else from its
    /// gzipped `rel.gz`; None when neither exists.
    pub fn text(&self, rel: &str) -> Result<Option<String>> {
        let gz = format!("{rel}.gz");
        match self {
            Store::Embedded => {
                if let Some((_, t)) = EMBEDDED_CALIBRATION.iter().find(|(p, _)| *p == rel) {
                    return Ok(Some(t.to_string()));
                }
                match EMBEDDED_CALIBRATION_GZ.iter().find(|(p, _)| *p == gz) {
                    Some((_, bytes)) => gunzip(bytes).map(Some).with_context(|| format!("decompressing embedded calibration/{gz}")),
                    None => Ok(None),
                }
            }
            Store::Dir(d) => {
                let p = d.join(rel);
                if p.is_file() {
                    return std::fs::read_to_string(&p).map(Some).with_context(|| format!("reading {}", p.display()));
                }
                let p = d.join(&gz);
                if !p.is_file() {
                    return Ok(None);
                }
                let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
                gunzip(&bytes).map(Some).with_context(|| format!("decompressing {}", p.display()))
            }
        }
    }

    pub fn read<T: DeserializeOwned>(&self, rel: &str) -> Result<Option<T>> {
        let Some(text) = self.text(rel)? else { return Ok(None) };
        let v = serde_json::from_str(&text).with_context(|| format!("parsing calibration file {} ({})", rel, self.describe()))?;
        Ok(Some(v))
    }

    /// The model set at `rel`. The embedded ones are parsed once per process and shared: a
    /// replay builds a predictor per run, and parsing a GPU's trees takes tens of milliseconds.
    pub fn model_set(&self, rel: &str) -> Result<Option<Arc<ModelSet>>> {
        type Parsed = Mutex<HashMap<String, Option<Arc<ModelSet>>>>;
        static EMBEDDED_SETS: OnceLock<Parsed> = OnceLock::new();
        let parse = || -> Result<Option<Arc<ModelSet>>> { Ok(self.read::<ModelSet>(rel)?.map(|s| Arc::new(s.checked_against_features()))) };
        if *self != Store::Embedded {
            return parse();
        }
        let sets = EMBEDDED_SETS.get_or_init(Default::default);
        if let Some(set) = sets.lock().expect("model set cache poisoned").get(rel) {
            return Ok(set.clone());
        }
        // Parsed outside the lock: threads asking for different sets do not wait on each other.
        let set = parse()?;
        sets.lock().expect("model set cache poisoned").insert(rel.to_string(), set.clone());
        Ok(set)
    }

    pub fn describe(&self) -> String {
        match self {
            Store::Embedded => "built into the binary".to_string(),
            Store::Dir(d) => d.display().to_string(),
        }
    }
}

fn gunzip(bytes: &[u8]) -> Result<String> {
    let mut text = String::new();
    GzDecoder::new(bytes).read_to_string(&mut text)?;
    Ok(text)
}

fn create_parent(p: &Path) -> Result<()> {
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    Ok(())
}

/// Writes `value` as compact JSON at `dir/rel`, creating folders.
pub fn write_json<T: Serialize>(dir: &Path, rel: &str, value: &T) -> Result<PathBuf> {
    let p = dir.join(rel);
    create_parent(&p)?;
    let text = serde_json::to_string(value)?;
    std::fs::write(&p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// Writes `value` as gzipped compact JSON at `dir/rel.gz` (deterministic: no timestamp in the
/// header) and removes a plain `dir/rel` left by an older layout, which would shadow it.
pub fn write_json_gz<T: Serialize>(dir: &Path, rel: &str, value: &T) -> Result<PathBuf> {
    let p = dir.join(format!("{rel}.gz"));
    create_parent(&p)?;
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(serde_json::to_string(value)?.as_bytes())?;
    enc.write_all(b"\n")?;
    std::fs::write(&p, enc.finish()?).with_context(|| format!("writing {}", p.display()))?;
    let plain = dir.join(rel);
    if plain.is_file() {
        std::fs::remove_file(&plain).with_context(|| format!("removing {} (replaced by {})", plain.display(), p.display()))?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use crate::kernels::cost::Routing;
    use super::*;

    #[test]
    fn a_gzipped_file_stands_in_for_its_json_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::Dir(dir.path().to_path_buf());
        write_json(dir.path(), "target/x.json", &serde_json::json!({"old": 1})).unwrap();
        assert_eq!(store.read::<serde_json::Value>("target/x.json").unwrap().unwrap()["old"], 1);
        let p = write_json_gz(dir.path(), "target/x.json", &serde_json::json!({"new": [1.5, 2]})).unwrap();
        assert!(p.ends_with("target/x.json.gz"));
        assert!(!dir.path().join("target/x.json").exists(), "the stale plain file must go");
        let v: serde_json::Value = store.read("target/x.json").unwrap().unwrap();
        assert_eq!(v["new"][0], 1.5);
        assert!(store.text("target/missing.json").unwrap().is_none());
        // Same value, same bytes: refits that change nothing leave git history alone.
        let first = std::fs::read(&p).unwrap();
        write_json_gz(dir.path(), "target/x.json", &serde_json::json!({"new": [1.5, 2]})).unwrap();
        assert_eq!(first, std::fs::read(&p).unwrap());
    }

    #[test]
    fn trees_fitted_on_another_feature_list_are_not_used() {
        use crate::calibrate::dataset::Measurement;
        use crate::calibrate::model::{FitParams, Form, OpModel};
        use crate::schema::{Dtype, Kernel, Op};
        use std::collections::BTreeMap;
        let g = crate::hardware::load_gpu("h100_sxm").unwrap();
        let rows: Vec<Measurement> = (0..64u64)
            .map(|i| {
                let k = Kernel::gemm(Dtype::Bf16, 1 + i * 37, 4096, 4096);
                let latency_us = 5.0 + crate::perf::sol::sol(&k, &g).sol_us * if i % 2 == 0 { 1.3 } else { 2.1 };
                Measurement { routing: Routing::Uniform, kernel: k, gpu: g.id.clone(), backend: "cublas".into(), source: "s".into(), latency_us }
            })
            .collect();
        let refs: Vec<&Measurement> = rows.iter().collect();
        let fitted = OpModel::fit(Op::Gemm, &refs, &|_| &g, &FitParams::default());
        let set = |m: OpModel| ModelSet { tier: "target".into(), trained_on: vec![g.id.clone()], held_out: None, held_out_ops: vec![], ops: BTreeMap::from([(Op::Gemm, m)]) };
        let mut stale = fitted.clone();
        stale.features[1] = "a_feature_that_no_longer_exists".into();
        let dir = tempfile::tempdir().unwrap();
        write_json_gz(dir.path(), "target/now.json", &set(fitted.clone())).unwrap();
        write_json_gz(dir.path(), "target/old.json", &set(stale)).unwrap();
        let store = Store::Dir(dir.path().to_path_buf());
        let now = store.model_set("target/now.json").unwrap().unwrap();
        let old = store.model_set("target/old.json").unwrap().unwrap();
        assert_eq!(now.ops[&Op::Gemm].form, Form::Learned);
        assert_eq!(old.ops[&Op::Gemm].form, Form::BaseOnly);
        let mut base_only = fitted;
        base_only.form = Form::BaseOnly;
        let k = Kernel::gemm(Dtype::Bf16, 300, 4096, 4096);
        assert_eq!(old.ops[&Op::Gemm].predict_us(&k, &g, None), base_only.predict_us(&k, &g, None));
    }

    #[test]
    fn a_corrupt_gzip_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("roofline.json.gz"), b"not gzip").unwrap();
        let err = Store::Dir(dir.path().to_path_buf()).text("roofline.json").unwrap_err();
        assert!(format!("{err:#}").contains("roofline.json.gz"), "{err:#}");
    }

    #[test]
    fn the_embedded_model_sets_are_gzipped_and_readable() {
        assert!(EMBEDDED_CALIBRATION_GZ.iter().any(|(p, _)| *p == "cross-gen/all.json.gz"));
        assert!(!EMBEDDED_CALIBRATION.iter().any(|(p, _)| p.starts_with("target/") || p.starts_with("cross-gen/")));
        let set = Store::Embedded.model_set(&cross_gen_path(None)).unwrap().expect("cross-gen/all");
        assert_eq!(set.tier, "cross-gen");
    }
}
