//! Row tiles of a grouped expert GEMM: each expert's tokens are padded up to a multiple of the
//! kernel's tile height (CUTLASS grouped GEMMs, Triton's fused MoE, Marlin and transformers'
//! padded experts all do), so the work done depends on how the routing's per-expert counts fall
//! against the tile, not on the assignments alone. Balanced routing fills tiles exactly where
//! T*k/E is a multiple of the tile; random or skewed routing scatters the counts and spills
//! experts into one more tile (measured on the H200: Marlin at 2,048 tokens under uniform routing
//! takes 1.31-1.39x its balanced time, `microbench/plans/marlin_routing/README.md`).

/// Tile heights (rows) a grouped expert GEMM may pad each expert's tokens to; which one a
/// library uses is left to the learned correction, which sees the padding at each.
pub const ROW_TILES: [f64; 3] = [16.0, 64.0, 128.0];

/// Expected tiles, `E[ceil(n / B)]` for each `B` of `ROW_TILES`, of an expert whose token count
/// `n` is Binomial(`trials`, `p`) (each of `trials` tokens picks it with probability `p`).
pub fn binomial_tiles(trials: f64, p: f64) -> [f64; 3] {
    let t = trials.round().max(0.0);
    let p = p.clamp(0.0, 1.0);
    let mean = t * p;
    let sd = (t * p * (1.0 - p)).sqrt();
    if mean <= 0.0 {
        return [0.0; 3];
    }
    let mut out = [0.0; 3];
    // Exact where the count's spread is narrow against a tile; where it spans several tiles the
    // count's position inside a tile is near uniform: E[ceil(n/B)] = mean/B + (B-1)/(2B).
    let exact: Vec<usize> = (0..3).filter(|&i| sd < 2.0 * ROW_TILES[i]).collect();
    for (i, b) in ROW_TILES.iter().enumerate() {
        if !exact.contains(&i) {
            out[i] = mean / b + (b - 1.0) / (2.0 * b);
        }
    }
    if exact.is_empty() {
        return out;
    }
    let lo = (mean - 10.0 * sd - 2.0).floor().max(0.0) as u64;
    let hi = (mean + 10.0 * sd + 2.0).ceil().min(t) as u64;
    let ln_t_fact = libm::lgamma(t + 1.0);
    let ln_choose = |n: f64| ln_t_fact - libm::lgamma(n + 1.0) - libm::lgamma(t - n + 1.0);
    let ln_pmf = |n: f64| {
        let a = if n > 0.0 { n * p.ln() } else { 0.0 };
        let b = if t - n > 0.0 { (t - n) * (1.0 - p).ln() } else { 0.0 };
        ln_choose(n) + a + b
    };
    let (mut mass, mut acc) = (0.0, [0.0; 3]);
    for n in lo..=hi {
        let w = ln_pmf(n as f64).exp();
        mass += w;
        for &i in &exact {
            acc[i] += w * (n as f64 / ROW_TILES[i]).ceil();
        }
    }
    for &i in &exact {
        out[i] = if mass > 0.0 { acc[i] / mass } else { (mean / ROW_TILES[i]).ceil() };
    }
    out
}

/// Tiles of `counts` experts holding exactly these token counts.
pub fn count_tiles(counts: impl IntoIterator<Item = f64>) -> [f64; 3] {
    let mut out = [0.0; 3];
    for n in counts {
        for (o, b) in out.iter_mut().zip(ROW_TILES) {
            *o += (n.max(0.0) / b).ceil();
        }
    }
    out
}

/// Padded rows over assigned rows (>= 1; 1 for a shard with no rows), per tile height.
pub fn padding_ratios(tiles: [f64; 3], assignments: f64) -> [f64; 3] {
    let mut out = [1.0; 3];
    if assignments > 0.0 {
        for ((o, t), b) in out.iter_mut().zip(tiles).zip(ROW_TILES) {
            *o = (t * b / assignments).max(1.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn binomial_tiles_match_sampling() {
        // Narrow (exact sum) and wide (uniform-position approximation) regimes, against draws.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for &(t, p) in &[(2048.0, 8.0 / 256.0), (64.0, 0.25), (16384.0, 0.5), (3.0, 0.5)] {
            let draws = 4000;
            let mut sum = [0.0; 3];
            for _ in 0..draws {
                let n = (0..t as usize).filter(|_| rng.gen::<f64>() < p).count() as f64;
                for (s, b) in sum.iter_mut().zip(ROW_TILES) {
                    *s += (n / b).ceil();
                }
            }
            let got = binomial_tiles(t, p);
            for i in 0..3 {
                let sampled = sum[i] / draws as f64;
                assert!((got[i] - sampled).abs() <= 0.02 * sampled + 0.02, "t={t} p={p} B={}: {} vs sampled {sampled}", ROW_TILES[i], got[i]);
            }
        }
    }

    #[test]
    fn uniform_counts_spill_into_more_tiles_than_balanced_ones() {
        // 2,048 tokens x top-4 of 128 experts: 64 rows each when balanced, one 64-row tile each;
        // binomial counts around 64 put about half the experts into a second tile.
        let balanced = padding_ratios(count_tiles(std::iter::repeat(64.0).take(128)), 2048.0 * 4.0);
        assert_eq!(balanced[1], 1.0);
        let per_expert = binomial_tiles(2048.0, 4.0 / 128.0);
        let uniform = padding_ratios(per_expert.map(|x| x * 128.0), 2048.0 * 4.0);
        assert!(uniform[1] > 1.35 && uniform[1] < 1.6, "{uniform:?}");
        assert!(uniform[0] < uniform[1] && uniform[1] < uniform[2], "{uniform:?}");
    }
}
