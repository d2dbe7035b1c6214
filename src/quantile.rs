//! Order statistics shared across the crate: one definition of each, so a median in a report
//! and a median in a fit cannot drift apart.

/// Linear-interpolated quantile of unsorted values (q in [0, 1]; numpy's default), NaN for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Median (mean of the middle two for an even count), NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// The upper of the middle two (always one of the values): what the calibration fits use, so a
/// fitted coefficient is a candidate that was actually tried. Sorts in place; None for none.
pub fn upper_median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// Nearest-rank quantile of values already sorted ascending (q in [0, 1]): the value of rank
/// ceil(q n), the smallest with at least a share q of the values at or below it; always one of
/// the values. Panics on an empty slice.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_statistic_on_small_samples() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        // numpy.percentile([1,2,3,4], 90) = 3.7.
        assert!((quantile(&[1.0, 2.0, 3.0, 4.0], 0.9) - 3.7).abs() < 1e-12);
        assert!(median(&[]).is_nan());
        assert_eq!(upper_median(&mut [4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(upper_median(&mut []), None);
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5), 3.0);
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.99), 5.0);
        // Rank ceil(q n): the lower middle of an even count, the minimum at q = 0.
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0], 0.0), 1.0);
        assert_eq!(nearest_rank(&(1..=10).map(f64::from).collect::<Vec<_>>(), 0.9), 9.0);
    }
}
