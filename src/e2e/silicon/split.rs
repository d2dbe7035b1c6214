//! Which runs may be used to fit the host-overhead model (calibration) and which only test it.
//!
//! Per backend one model is the calibration model; every other model of that backend is held
//! out entirely. SGLang was measured on a single model (Qwen3-32B), so its held-out runs are
//! the layouts not used for fitting (TP 1 and 4; TP 2 and 8 calibrate): held out by layout,
//! not by model, and reported apart. Backends without an entry are all held out (no fit).

use super::rows::SimPoint;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Calibration,
    /// A model never used for fitting.
    HeldOutModel,
    /// The calibration model in a layout never used for fitting.
    HeldOutLayout,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Calibration, Split::HeldOutModel, Split::HeldOutLayout];

    /// JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Split::Calibration => "calibration",
            Split::HeldOutModel => "held_out_model",
            Split::HeldOutLayout => "held_out_layout",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Split::Calibration => "calibration",
            Split::HeldOutModel => "held-out model",
            Split::HeldOutLayout => "held-out layout",
        }
    }
}

/// (backend, calibration model, TP degrees used for fitting; None = all).
pub const CALIBRATION: [(&str, &str, Option<&[u32]>); 3] =
    [("trtllm", "llama-3.1-8b", None), ("vllm", "qwen3-32b", None), ("sglang", "qwen3-32b", Some(&[2, 8]))];

pub fn split(p: &SimPoint) -> Split {
    match CALIBRATION.iter().find(|(b, _, _)| *b == p.engine) {
        Some((_, model, _)) if *model != p.model => Split::HeldOutModel,
        Some((_, _, Some(tps))) if !tps.contains(&p.tp) => Split::HeldOutLayout,
        Some(_) => Split::Calibration,
        None => Split::HeldOutModel,
    }
}

/// One line per backend, for reports.
pub fn describe() -> Vec<String> {
    CALIBRATION
        .iter()
        .map(|(b, m, tps)| match tps {
            None => format!("{b}: calibration = all {m} runs; every other model held out"),
            Some(t) => format!(
                "{b}: calibration = {m} runs with tp in {t:?}; other tp of {m} held out by layout; other models held out"
            ),
        })
        .collect()
}
