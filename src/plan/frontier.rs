//! Pareto frontier: points no other point beats on both throughput per GPU (higher is better)
//! and latency (lower is better).

/// Indices of the Pareto-optimal points of `(latency, throughput)` pairs, ordered by rising
/// latency. A point is dropped when another has latency <= and throughput >= with at least
/// one strict; of exact duplicates the first is kept. Points with a non-finite coordinate
/// (an overloaded run with unbounded latency) are never on the frontier.
pub fn pareto_frontier(points: &[(f64, f64)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..points.len()).filter(|&i| points[i].0.is_finite() && points[i].1.is_finite()).collect();
    // Lowest latency first; among equal latencies the highest throughput first, then index.
    order.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0).then(points[b].1.total_cmp(&points[a].1)).then(a.cmp(&b)));
    let mut out = Vec::new();
    let mut best_throughput = f64::NEG_INFINITY;
    for i in order {
        if points[i].1 > best_throughput {
            best_throughput = points[i].1;
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_undominated_points() {
        // (latency, throughput): b dominates d (faster and more throughput); c is the
        // highest-throughput point; a the fastest.
        let pts = [(10.0, 100.0), (20.0, 300.0), (40.0, 500.0), (30.0, 200.0), (50.0, 500.0)];
        assert_eq!(pareto_frontier(&pts), vec![0, 1, 2]);
    }

    #[test]
    fn ties_and_nan() {
        let pts = [(10.0, 100.0), (10.0, 150.0), (10.0, 150.0), (f64::NAN, 1e9), (5.0, f64::NAN), (f64::INFINITY, 1e9)];
        assert_eq!(pareto_frontier(&pts), vec![1]);
        assert!(pareto_frontier(&[]).is_empty());
    }
}
