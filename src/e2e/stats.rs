//! Error statistics shared by the validation reports.
use serde::Serialize;

/// Absolute percentage error of a prediction, in percent.
pub fn ape(predicted: f64, measured: f64) -> f64 {
    100.0 * (predicted - measured).abs() / measured.abs()
}

/// Linear-interpolated quantile of unsorted values (q in [0, 1]).
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

#[derive(Debug, Clone, Serialize, PartialEq)]
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_ape() {
        assert_eq!(ape(110.0, 100.0), 10.0);
        assert_eq!(ape(90.0, 100.0), 10.0);
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
        let s = ErrorStats::of(&[1.0, 5.0, f64::NAN, 3.0]);
        assert_eq!((s.count, s.median_ape, s.max_ape), (3, 3.0, 5.0));
    }
}
