//! Error statistics shared by the validation reports.
use crate::quantile::quantile;
use serde::Serialize;

/// Absolute percentage error of a prediction, in percent.
pub fn ape(predicted: f64, measured: f64) -> f64 {
    100.0 * (predicted - measured).abs() / measured.abs()
}

/// Summary of the APEs of a group (percent). Empty groups have count 0 and NaN statistics,
/// serialized as null.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ErrorStats {
    pub count: usize,
    pub median_ape: f64,
    pub p90_ape: f64,
    pub max_ape: f64,
}

impl ErrorStats {
    pub fn of(apes: &[f64]) -> ErrorStats {
        let finite: Vec<f64> = apes.iter().copied().filter(|x| x.is_finite()).collect();
        ErrorStats {
            count: finite.len(),
            median_ape: quantile(&finite, 0.5),
            p90_ape: quantile(&finite, 0.9),
            max_ape: finite.iter().copied().fold(f64::NAN, f64::max),
        }
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
    fn quantiles_and_ape() {
        assert_eq!(ape(110.0, 100.0), 10.0);
        assert_eq!(ape(90.0, 100.0), 10.0);
        let s = ErrorStats::of(&[1.0, 5.0, f64::NAN, 3.0]);
        assert_eq!((s.count, s.median_ape, s.max_ape), (3, 3.0, 5.0));
        // Sorted 1..=10: median between 5 and 6; p90 at position 8.1 -> 9 + 0.1.
        let v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let s = ErrorStats::of(&v);
        assert_eq!((s.count, s.median_ape, s.max_ape), (10, 5.5, 10.0));
        assert!((s.p90_ape - 9.1).abs() < 1e-12);
        assert_eq!(ErrorStats::of(&[]).cell(), "-");
    }
}
