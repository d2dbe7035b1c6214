//! Constant-memory statistics: log-bucketed histograms (percentiles within 0.2%, exact when
//! all values are equal) and a time series whose buckets double in width as time goes on.

use serde::Serialize;

/// Mantissa bits kept per bucket: relative bucket width 2^-8, midpoint error <= 0.2%.
const MANTISSA_BITS: u32 = 8;
const SHIFT: u32 = 52 - MANTISSA_BITS;
/// Bucket range covers 2^-12 .. 2^44 (microseconds: sub-nanosecond to months).
const LO_EXP: u64 = 1023 - 12;
const HI_EXP: u64 = 1023 + 44;
const LO_IDX: u64 = LO_EXP << MANTISSA_BITS;
const NUM_BUCKETS: usize = ((HI_EXP - LO_EXP) << MANTISSA_BITS) as usize;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    zeros: u64,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn scaled(self, f: f64) -> Percentiles {
        Percentiles { mean: self.mean * f, p50: self.p50 * f, p90: self.p90 * f, p95: self.p95 * f, p99: self.p99 * f, max: self.max * f }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: Vec::new(), zeros: 0, count: 0, sum: 0.0, min: f64::INFINITY, max: 0.0 }
    }
}

impl Histogram {
    /// Adds `n` copies of `v` (>= 0).
    #[inline]
    pub fn add_n(&mut self, v: f64, n: u64) {
        if n == 0 {
            return;
        }
        self.count += n;
        self.sum += v * n as f64;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        if v <= 0.0 {
            self.zeros += n;
            return;
        }
        if self.counts.is_empty() {
            self.counts = vec![0; NUM_BUCKETS];
        }
        let idx = ((v.to_bits() >> SHIFT).clamp(LO_IDX, LO_IDX + NUM_BUCKETS as u64 - 1) - LO_IDX) as usize;
        self.counts[idx] += n;
    }

    #[inline]
    pub fn add(&mut self, v: f64) {
        self.add_n(v, 1)
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// Nearest-rank quantile, q in [0, 1]; the bucket's midpoint clamped to [min, max].
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank <= self.zeros {
            return 0.0;
        }
        let mut seen = self.zeros;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = f64::from_bits((i as u64 + LO_IDX) << SHIFT);
                let hi = f64::from_bits((i as u64 + LO_IDX + 1) << SHIFT);
                return ((lo + hi) / 2.0).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn percentiles(&self) -> Percentiles {
        Percentiles {
            mean: self.mean(),
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p95: self.quantile(0.95),
            p99: self.quantile(0.99),
            max: if self.count == 0 { 0.0 } else { self.max },
        }
    }

    /// (value, cumulative fraction) points for a CDF plot, one per non-empty bucket.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        if self.count == 0 {
            return out;
        }
        let mut seen = self.zeros;
        if self.zeros > 0 {
            out.push((0.0, seen as f64 / self.count as f64));
        }
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 {
                seen += c;
                let hi = f64::from_bits((i as u64 + LO_IDX + 1) << SHIFT).min(self.max);
                out.push((hi, seen as f64 / self.count as f64));
            }
        }
        out
    }
}

/// One time bucket of the run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Bucket {
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub completed: u64,
    /// Integral over the bucket of the share of KV blocks in use, averaged over replicas
    /// (divide by the width for the bucket's mean use).
    pub kv_used_frac_s: f64,
    /// Engine-busy seconds in the bucket, averaged over replicas.
    pub busy_s: f64,
}

/// Buckets of `width_s`; when more than `MAX_BUCKETS` would be needed, neighbours merge and
/// the width doubles, so memory stays constant however long the run.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub width_s: f64,
    pub buckets: Vec<Bucket>,
}

const MAX_BUCKETS: usize = 512;

impl Default for Series {
    fn default() -> Self {
        Series { width_s: 0.05, buckets: Vec::new() }
    }
}

impl Series {
    #[inline]
    pub fn at(&mut self, t_s: f64) -> &mut Bucket {
        let mut i = (t_s / self.width_s) as usize;
        while i >= MAX_BUCKETS {
            self.merge();
            i = (t_s / self.width_s) as usize;
        }
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, Bucket::default());
        }
        &mut self.buckets[i]
    }

    fn merge(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|c| {
                let mut b = c[0];
                if let Some(o) = c.get(1) {
                    b.output_tokens += o.output_tokens;
                    b.prompt_tokens += o.prompt_tokens;
                    b.completed += o.completed;
                    b.kv_used_frac_s += o.kv_used_frac_s;
                    b.busy_s += o.busy_s;
                }
                b
            })
            .collect();
        self.buckets = merged;
        self.width_s *= 2.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_one_to_hundred() {
        let mut h = Histogram::default();
        for i in 1..=100 {
            h.add(i as f64);
        }
        let p = h.percentiles();
        assert_eq!(p.mean, 50.5);
        // Nearest rank: p50 = 50, p90 = 90, p99 = 99, each within a 0.4% bucket.
        for (got, want) in [(p.p50, 50.0), (p.p90, 90.0), (p.p99, 99.0)] {
            assert!((got - want).abs() / want < 0.004, "{got} vs {want}");
        }
        assert_eq!(p.max, 100.0);
    }

    #[test]
    fn constant_values_are_exact() {
        let mut h = Histogram::default();
        h.add_n(12.345, 1000);
        assert_eq!(h.quantile(0.99), 12.345);
        assert_eq!(h.quantile(0.01), 12.345);
    }

    #[test]
    fn series_merges_when_long() {
        let mut s = Series::default();
        s.at(0.01).output_tokens += 1;
        s.at(1000.0).output_tokens += 2;
        assert!(s.buckets.len() <= MAX_BUCKETS);
        assert_eq!(s.buckets.iter().map(|b| b.output_tokens).sum::<u64>(), 3);
        assert_eq!(s.buckets[0].output_tokens, 1);
    }
}
