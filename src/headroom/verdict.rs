//! What a measured time means against the bounds: headroom, verdict and a trial budget.

use super::bound::{warm_l2_sol_us, Bounds};
use anyhow::{bail, Result};
use serde::Serialize;

/// A measured time this far below the hard SOL is not timing noise: CUDA-event timings of one
/// kernel repeat within a few percent, and no spec figure behind the SOL is exceeded in the
/// project's measurement data by more than this (`kernelsight sol validate`).
pub const NOISE_MARGIN: f64 = 0.05;

/// Within this factor of the practical bound a kernel matches the best observed kernels of its
/// class: further trials are unlikely to pay.
pub const NEAR_SOL_HEADROOM: f64 = 1.15;

/// Speedup one successful optimization trial is expected to bring (5%). The trial budget to
/// close a headroom h is ln(h) / ln(1 + GAIN_PER_TRIAL): it grows with log headroom.
pub const GAIN_PER_TRIAL: f64 = 0.05;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Faster than physics allows: the kernel skips work or the timing is broken.
    Suspicious,
    /// At the practical bound: stop spending trials.
    NearSol,
    /// Worth more trials.
    Headroom,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Suspicious => "suspicious",
            Verdict::NearSol => "near-sol",
            Verdict::Headroom => "headroom",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assessment {
    pub measured_us: f64,
    /// measured / practical bound.
    pub headroom: f64,
    /// measured / hard SOL.
    pub sol_ratio: f64,
    pub verdict: Verdict,
    pub suggested_trials: u32,
    pub reason: String,
}

/// Checks a measured time; `field` names it in the error.
pub fn check_measured(us: f64, field: &str) -> Result<f64> {
    if !us.is_finite() || us <= 0.0 {
        bail!("field '{field}' = {us} must be a positive time in microseconds");
    }
    Ok(us)
}

/// Trials worth spending on a kernel with this headroom (0 at or near the practical bound).
pub fn trials_for(headroom: f64) -> u32 {
    if headroom <= NEAR_SOL_HEADROOM {
        return 0;
    }
    (headroom.ln() / (1.0 + GAIN_PER_TRIAL).ln()).ceil() as u32
}

pub fn assess(b: &Bounds, measured_us: f64, l2_bytes: f64) -> Result<Assessment> {
    let measured_us = check_measured(measured_us, "measured_us")?;
    let headroom = measured_us / b.practical_us;
    let sol_ratio = measured_us / b.sol_us;
    let (verdict, reason) = if measured_us < b.sol_us * (1.0 - NOISE_MARGIN) {
        let mut why = format!(
            "measured {measured_us:.3} us is {:.1}% below the hard SOL {:.3} us (noise margin {:.0}%): \
             the kernel probably skips work or the timing is broken",
            (1.0 - sol_ratio) * 100.0,
            b.sol_us,
            NOISE_MARGIN * 100.0
        );
        let warm = warm_l2_sol_us(b.compute_us, b.bytes, b.memory_us, b.bound, l2_bytes);
        if warm.is_some_and(|w| measured_us >= w * (1.0 - NOISE_MARGIN)) {
            why.push_str(&format!(
                "; but with up to {:.0} MB of its {:.1} MB traffic served from a warm L2 the time is possible: \
                 re-time with L2 flushed",
                l2_bytes / 1e6,
                b.bytes / 1e6
            ));
        }
        (Verdict::Suspicious, why)
    } else if headroom <= NEAR_SOL_HEADROOM {
        (
            Verdict::NearSol,
            format!("within {NEAR_SOL_HEADROOM}x of the practical bound ({:.3} us): stop spending trials", b.practical_us),
        )
    } else {
        (
            Verdict::Headroom,
            format!("{headroom:.2}x above the practical bound ({:.3} us), {} bound", b.practical_us, b.dominant.as_str()),
        )
    };
    let suggested_trials = if verdict == Verdict::Headroom { trials_for(headroom) } else { 0 };
    Ok(Assessment { measured_us, headroom, sol_ratio, verdict, suggested_trials, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headroom::bound::{default_ceiling, OpClass, Resource};
    use crate::schema::Dtype;

    fn bounds(sol: f64, practical: f64) -> Bounds {
        Bounds {
            class: OpClass::Gemm,
            compute_dtype: Dtype::Bf16,
            flops: 0.0,
            bytes: 1e9,
            compute_us: 0.0,
            memory_us: sol,
            sol_us: sol,
            bound: Resource::Memory,
            practical_us: practical,
            dominant: Resource::Memory,
            ceiling: default_ceiling(OpClass::Gemm),
        }
    }

    #[test]
    fn verdicts_follow_the_thresholds() {
        let b = bounds(100.0, 110.0);
        assert_eq!(assess(&b, 90.0, 50e6).unwrap().verdict, Verdict::Suspicious);
        // 4% under SOL is within the noise margin; 100/110 < 1.15 -> near-sol.
        assert_eq!(assess(&b, 96.0, 50e6).unwrap().verdict, Verdict::NearSol);
        assert_eq!(assess(&b, 126.0, 50e6).unwrap().verdict, Verdict::NearSol);
        let a = assess(&b, 220.0, 50e6).unwrap();
        assert_eq!(a.verdict, Verdict::Headroom);
        assert!((a.headroom - 2.0).abs() < 1e-12);
        // ln 2 / ln 1.05 = 14.2 -> 15 trials; headroom 4 -> 28.4 -> 29.
        assert_eq!(a.suggested_trials, 15);
        assert_eq!(trials_for(4.0), 29);
    }

    #[test]
    fn bad_measured_times_name_the_field() {
        let b = bounds(1.0, 2.0);
        for bad in [0.0, -3.0, f64::NAN] {
            let e = assess(&b, bad, 0.0).unwrap_err().to_string();
            assert!(e.contains("measured_us") && e.contains("positive"), "{e}");
        }
    }

    #[test]
    fn l2_resident_suspicious_mentions_warm_cache() {
        let mut b = bounds(100.0, 110.0);
        b.bytes = 10e6;
        assert!(assess(&b, 50.0, 50e6).unwrap().reason.contains("L2"));
    }
}
