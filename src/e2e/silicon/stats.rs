//! Absolute percentage errors and their summary over a group of runs.

use serde::Serialize;

/// |predicted - measured| / measured, in percent.
pub fn ape(predicted: f64, measured: f64) -> f64 {
    (predicted - measured).abs() / measured * 100.0
}

/// Summary of the APEs of a group of runs (percent). Empty groups have count 0 and NaN
/// statistics, serialized as null.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ApeStats {
    pub count: usize,
    pub median_ape: f64,
    pub p90_ape: f64,
    pub max_ape: f64,
}

/// Linear-interpolated quantile of sorted values (q in [0, 1]), as numpy's default.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

impl ApeStats {
    pub fn of(apes: &[f64]) -> ApeStats {
        if apes.is_empty() {
            return ApeStats { count: 0, median_ape: f64::NAN, p90_ape: f64::NAN, max_ape: f64::NAN };
        }
        let mut v = apes.to_vec();
        v.sort_by(f64::total_cmp);
        ApeStats { count: v.len(), median_ape: quantile(&v, 0.5), p90_ape: quantile(&v, 0.9), max_ape: v[v.len() - 1] }
    }

    /// `median/p90/max` with one decimal, or `-` for an empty group.
    pub fn cell(&self) -> String {
        if self.count == 0 {
            "-".into()
        } else {
            format!("{:.1}/{:.1}/{:.0}", self.median_ape, self.p90_ape, self.max_ape)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ape_is_relative_to_the_measurement() {
        assert_eq!(ape(110.0, 100.0), 10.0);
        assert_eq!(ape(90.0, 100.0), 10.0);
        assert_eq!(ape(50.0, 25.0), 100.0);
    }

    #[test]
    fn median_p90_max_by_hand() {
        // Sorted 1..=10: median between 5 and 6; p90 at position 8.1 -> 9 + 0.1.
        let v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let s = ApeStats::of(&v);
        assert_eq!((s.count, s.median_ape, s.max_ape), (10, 5.5, 10.0));
        assert!((s.p90_ape - 9.1).abs() < 1e-12);
        assert_eq!(ApeStats::of(&[]).count, 0);
        assert_eq!(ApeStats::of(&[]).cell(), "-");
    }
}
