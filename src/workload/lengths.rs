//! Prompt/output length distributions.

use super::Lengths;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};

/// ShareGPT means from the vLLM paper (Kwon et al., SOSP 2023, Fig. 11): 161 input and 338
/// output tokens per request. Lognormal with these means; the spreads (sigma) are chosen to
/// give the long right tail of that figure. Lengths are clamped to [4, 4096] / [1, 2048].
pub const SHAREGPT_MEAN_INPUT: f64 = 161.0;
pub const SHAREGPT_MEAN_OUTPUT: f64 = 338.0;
const SHAREGPT_SIGMA_INPUT: f64 = 1.0;
const SHAREGPT_SIGMA_OUTPUT: f64 = 0.9;

pub struct LengthSampler {
    kind: Lengths,
    input: LogNormal<f64>,
    output: LogNormal<f64>,
}

fn lognormal_with_mean(mean: f64, sigma: f64) -> LogNormal<f64> {
    // E[X] = exp(mu + sigma^2 / 2)
    LogNormal::new(mean.ln() - sigma * sigma / 2.0, sigma).expect("finite lognormal parameters")
}

impl LengthSampler {
    pub fn new(kind: Lengths) -> Self {
        LengthSampler {
            kind,
            input: lognormal_with_mean(SHAREGPT_MEAN_INPUT, SHAREGPT_SIGMA_INPUT),
            output: lognormal_with_mean(SHAREGPT_MEAN_OUTPUT, SHAREGPT_SIGMA_OUTPUT),
        }
    }

    /// (prompt tokens, output tokens), both >= 1.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> (u32, u32) {
        match self.kind {
            Lengths::ShareGpt => {
                let i = self.input.sample(rng).round().clamp(4.0, 4096.0) as u32;
                let o = self.output.sample(rng).round().clamp(1.0, 2048.0) as u32;
                (i, o)
            }
            Lengths::Fixed { isl, osl } => (isl, osl),
            Lengths::Uniform { isl, osl, range_ratio } => (uniform(rng, isl, range_ratio), uniform(rng, osl, range_ratio)),
            Lengths::UniformUpTo { isl, osl, low_ratio } => (uniform_up_to(rng, isl, low_ratio), uniform_up_to(rng, osl, low_ratio)),
        }
    }
}

fn uniform(rng: &mut ChaCha8Rng, len: u32, r: f64) -> u32 {
    let lo = ((len as f64) * (1.0 - r)).floor().max(1.0) as u32;
    let hi = ((len as f64) * (1.0 + r)).ceil().max(lo as f64) as u32;
    rng.gen_range(lo..=hi)
}

/// Integers in [int(len*r), len], as those benchmark clients draw them (numpy randint).
fn uniform_up_to(rng: &mut ChaCha8Rng, len: u32, r: f64) -> u32 {
    let lo = ((len as f64) * r).floor().max(1.0) as u32;
    rng.gen_range(lo.min(len)..=len)
}
