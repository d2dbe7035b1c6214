//! Linear fits with non-negative coefficients (an overhead cannot be negative): least squares and
//! least absolute deviations, for the host-overhead fits.

/// Ordinary least squares, refitting without any coefficient that comes out negative (an
/// overhead cannot be negative).
pub(crate) fn nonneg_least_squares<const N: usize>(rows: &[([f64; N], f64)]) -> [f64; N] {
    nonneg_weighted_least_squares(rows, &vec![1.0; rows.len()])
}

/// Least absolute deviations with non-negative coefficients, by iteratively reweighted least
/// squares. Host residuals over predicted GPU time are heavy-tailed: a run whose kernels the
/// model mispredicts (gpt-oss's eager sink attention) shifts every step of it by the same
/// error, which a squared loss spreads over every other family's host time.
pub(crate) fn nonneg_least_absolute_deviations<const N: usize>(rows: &[([f64; N], f64)]) -> [f64; N] {
    // Residuals below this (1 us) count as exact, which keeps the weights finite.
    const EXACT_US: f64 = 1.0;
    let mut coef = nonneg_least_squares(rows);
    for _ in 0..100 {
        let weights: Vec<f64> = rows.iter().map(|(x, y)| 1.0 / (y - dot(x, &coef)).abs().max(EXACT_US)).collect();
        let next = nonneg_weighted_least_squares(rows, &weights);
        let moved = next.iter().zip(&coef).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        coef = next;
        if moved < 1e-3 {
            break;
        }
    }
    coef
}

pub(crate) fn dot<const N: usize>(x: &[f64; N], c: &[f64; N]) -> f64 {
    x.iter().zip(c).map(|(a, b)| a * b).sum()
}

fn nonneg_weighted_least_squares<const N: usize>(rows: &[([f64; N], f64)], weights: &[f64]) -> [f64; N] {
    let mut active = [true; N];
    loop {
        let idx: Vec<usize> = (0..N).filter(|&i| active[i]).collect();
        let k = idx.len();
        let mut a = vec![vec![0.0; k + 1]; k];
        for ((x, y), w) in rows.iter().zip(weights) {
            for (r, &i) in idx.iter().enumerate() {
                for (c, &j) in idx.iter().enumerate() {
                    a[r][c] += w * x[i] * x[j];
                }
                a[r][k] += w * x[i] * y;
            }
        }
        let sol = solve(a);
        let mut coef = [0.0; N];
        for (r, &i) in idx.iter().enumerate() {
            coef[i] = sol[r];
        }
        match idx.iter().find(|&&i| coef[i] < 0.0) {
            Some(&i) => active[i] = false,
            None => return coef,
        }
        if !active.iter().any(|&a| a) {
            return [0.0; N];
        }
    }
}

/// Gaussian elimination with partial pivoting on an augmented matrix.
fn solve(mut a: Vec<Vec<f64>>) -> Vec<f64> {
    let n = a.len();
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs())).unwrap();
        a.swap(c, p);
        if a[c][c].abs() < 1e-12 {
            continue;
        }
        for r in 0..n {
            if r != c {
                let f = a[r][c] / a[c][c];
                for k in c..=n {
                    a[r][k] -= f * a[c][k];
                }
            }
        }
    }
    (0..n).map(|i| if a[i][i].abs() < 1e-12 { 0.0 } else { a[i][n] / a[i][i] }).collect()
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_recovers_known_coefficients() {
        // y = 300 x0 + 40000 + 0 x2 (a negative true coefficient would be dropped).
        let rows: Vec<([f64; 3], f64)> = (0..20).map(|i| {
            let x = [2.0 + i as f64, 1.0, (i % 5) as f64];
            (x, 300.0 * x[0] + 40_000.0)
        }).collect();
        let c = nonneg_least_squares(&rows);
        assert!((c[0] - 300.0).abs() < 1e-6 && (c[1] - 40_000.0).abs() < 1e-3 && c[2].abs() < 1e-6, "{c:?}");
        let rows2: Vec<([f64; 3], f64)> = rows.iter().map(|(x, y)| (*x, y - 50.0 * x[2])).collect();
        assert_eq!(nonneg_least_squares(&rows2)[2], 0.0);
    }

    #[test]
    fn least_absolute_deviations_ignore_a_mispredicted_run() {
        // Host = 100 us/layer + 3000 us/step + 50 us/seq on 100 steps of 8- and 32-layer models;
        // 10 steps of one run carry a 25 ms kernel misprediction. Squared loss moves the fit by
        // milliseconds; absolute loss recovers the host terms.
        let rows: Vec<([f64; 3], f64)> = (0..100)
            .map(|i| {
                let x = [if i % 2 == 0 { 8.0 } else { 32.0 }, 1.0, (1 + i % 32) as f64];
                (x, 100.0 * x[0] + 3000.0 + 50.0 * x[2] + if i % 10 == 0 { 25_000.0 } else { 0.0 })
            })
            .collect();
        let lsq = nonneg_least_squares(&rows);
        assert!((lsq[1] - 3000.0).abs() > 1000.0, "{lsq:?}");
        let lad = nonneg_least_absolute_deviations(&rows);
        assert!((lad[0] - 100.0).abs() < 1.0 && (lad[1] - 3000.0).abs() < 30.0 && (lad[2] - 50.0).abs() < 1.0, "{lad:?}");
    }
}
