//! Gradient-boosted regression trees (least squares, histogram splits), small enough to
//! serialize as compact JSON and evaluate in nanoseconds per tree.
//!
//! Why not a crate: linfa 0.8's trees are classifiers only, and the boosting crates that exist
//! either pull a C++ toolchain or serialize to formats far larger than these arrays. The
//! algorithm is the textbook one (Friedman 2001, histogram splits as in LightGBM), deterministic
//! for a given seed.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Training knobs.
#[derive(Debug, Clone, Copy)]
pub struct GbdtParams {
    pub trees: usize,
    pub max_depth: usize,
    pub learning_rate: f64,
    /// Smallest number of training rows in a leaf (raised to 1/1000 of the rows on large
    /// sets: splits finer than that chase measurement noise and bloat the JSON).
    pub min_leaf: usize,
    /// L2 penalty on leaf values (in rows): shrinks leaves backed by few rows.
    pub lambda: f64,
    /// Fraction of rows each tree sees (stochastic boosting).
    pub subsample: f64,
    pub max_bins: usize,
    pub seed: u64,
}

impl Default for GbdtParams {
    fn default() -> Self {
        GbdtParams {
            trees: 100,
            max_depth: 7,
            learning_rate: 0.2,
            min_leaf: 8,
            lambda: 1.0,
            subsample: 0.7,
            max_bins: 128,
            seed: 7,
        }
    }
}

/// One tree in flat form: node `i` is a leaf when its `feature < 0` (its value in `value`),
/// else it sends `x[feature] <= value` to `left` and the rest to `left + 1`. Nodes are packed
/// (8 bytes each) because evaluating trees is most of a simulation's time; the JSON keeps
/// three parallel arrays (`TreeArrays`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(from = "TreeArrays", into = "TreeArrays")]
pub struct Tree {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    value: f32,
    feature: i16,
    left: u16,
}

const LEAF: Node = Node { value: 0.0, feature: -1, left: 0 };

/// A tree as stored in calibration files.
#[derive(Serialize, Deserialize)]
struct TreeArrays {
    #[serde(rename = "f")]
    feature: Vec<i16>,
    #[serde(rename = "v")]
    value: Vec<f32>,
    #[serde(rename = "l")]
    left: Vec<u16>,
}

impl From<TreeArrays> for Tree {
    fn from(a: TreeArrays) -> Tree {
        let nodes = a.feature.iter().zip(&a.value).zip(&a.left).map(|((&feature, &value), &left)| Node { value, feature, left }).collect();
        Tree { nodes }
    }
}

impl From<Tree> for TreeArrays {
    fn from(t: Tree) -> TreeArrays {
        TreeArrays {
            feature: t.nodes.iter().map(|n| n.feature).collect(),
            value: t.nodes.iter().map(|n| n.value).collect(),
            left: t.nodes.iter().map(|n| n.left).collect(),
        }
    }
}

impl Tree {
    fn predict(&self, x: &[f64]) -> f64 {
        let mut n = self.nodes[0];
        while n.feature >= 0 {
            let go_left = x[n.feature as usize] <= n.value as f64;
            n = self.nodes[n.left as usize + usize::from(!go_left)];
        }
        n.value as f64
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gbdt {
    pub base: f64,
    pub trees: Vec<Tree>,
    /// The trees laid out for evaluation (`Complete`), built on first use.
    #[serde(skip)]
    complete: std::sync::OnceLock<Option<Complete>>,
}

impl PartialEq for Gbdt {
    fn eq(&self, other: &Gbdt) -> bool {
        self.base == other.base && self.trees == other.trees
    }
}

/// Every tree as a complete binary tree of the ensemble's depth, one after another: walking a
/// tree is then `depth` steps of `i = 2i + 1 + (go right)`, so several trees are walked at once
/// and their memory loads overlap (a simulation spends most of its time here). A leaf above
/// the bottom fills its whole subtree's bottom row with its value.
#[derive(Debug, Clone)]
struct Complete {
    depth: u32,
    nodes: Vec<Node>,
}

/// Trees walked side by side.
const LANES: usize = 8;

/// Deepest ensemble laid out complete (2^(d+1) - 1 nodes a tree: 8 KB at 9); deeper ones (a
/// calibration run with a larger `--max-depth`) are walked node by node.
const MAX_COMPLETE_DEPTH: u32 = 9;

impl Complete {
    fn of(trees: &[Tree]) -> Option<Complete> {
        fn depth(t: &Tree, i: usize) -> u32 {
            let n = t.nodes[i];
            if n.feature < 0 {
                0
            } else {
                1 + depth(t, n.left as usize).max(depth(t, n.left as usize + 1))
            }
        }
        fn fill(t: &Tree, src: usize, dst: usize, level: u32, depth: u32, out: &mut [Node]) {
            let n = t.nodes[src];
            if n.feature >= 0 {
                out[dst] = n;
                fill(t, n.left as usize, 2 * dst + 1, level + 1, depth, out);
                fill(t, n.left as usize + 1, 2 * dst + 2, level + 1, depth, out);
            } else {
                // Bottom-row slots under `dst`: a contiguous run of 2^(depth - level).
                let span = 1usize << (depth - level);
                let first = ((dst + 1) << (depth - level)) - 1;
                for slot in &mut out[first..first + span] {
                    *slot = Node { value: n.value, feature: -1, left: 0 };
                }
            }
        }
        let d = trees.iter().map(|t| depth(t, 0)).max().unwrap_or(0);
        if d > MAX_COMPLETE_DEPTH {
            return None;
        }
        let stride = (1usize << (d + 1)) - 1;
        let mut nodes = vec![Node { value: 0.0, feature: 0, left: 0 }; trees.len() * stride];
        for (i, t) in trees.iter().enumerate() {
            fill(t, 0, 0, 0, d, &mut nodes[i * stride..(i + 1) * stride]);
        }
        Some(Complete { depth: d, nodes })
    }

    fn predict(&self, x: &[f64]) -> f64 {
        let stride = (1usize << (self.depth + 1)) - 1;
        let mut sum = 0.0;
        for chunk in self.nodes.chunks(stride * LANES) {
            let lanes = chunk.len() / stride;
            let mut idx = [0usize; LANES];
            for _ in 0..self.depth {
                for (j, i) in idx.iter_mut().enumerate().take(lanes) {
                    let n = chunk[j * stride + *i];
                    // Not `>`: NaN goes right, as `Tree::predict` sends it.
                    #[allow(clippy::neg_cmp_op_on_partial_ord)]
                    let right = !(x[n.feature as usize] <= n.value as f64);
                    *i = 2 * *i + 1 + usize::from(right);
                }
            }
            sum += idx.iter().enumerate().take(lanes).map(|(j, i)| chunk[j * stride + i].value as f64).sum::<f64>();
        }
        sum
    }
}

impl Gbdt {
    fn new(base: f64, trees: Vec<Tree>) -> Gbdt {
        Gbdt { base, trees, complete: std::sync::OnceLock::new() }
    }

    pub fn predict(&self, x: &[f64]) -> f64 {
        self.base
            + match self.complete.get_or_init(|| Complete::of(&self.trees)) {
                Some(c) => c.predict(x),
                None => self.trees.iter().map(|t| t.predict(x)).sum::<f64>(),
            }
    }

    /// Drops the trees (the base alone predicts).
    pub fn clear_trees(&mut self) {
        self.trees.clear();
        self.complete = std::sync::OnceLock::new();
    }

    /// Fits `y ~ x` (rows of equal length) with `params.trees` trees. Deterministic for a
    /// given `params.seed`.
    pub fn fit(x: &[Vec<f64>], y: &[f64], params: &GbdtParams) -> Gbdt {
        boost(x, y, params, |_, _| false)
    }

    /// As `fit`, with the number of trees (at most `params.trees`) chosen on the rows flagged
    /// in `validation`: a first fit trains on the other rows and stops once the flagged rows'
    /// mean |residual| has not improved for `patience` trees; the returned model is refitted on
    /// every row with the best count. Falls back to `fit` when either side has no rows.
    pub fn fit_early_stopped(x: &[Vec<f64>], y: &[f64], validation: &[bool], params: &GbdtParams, patience: usize) -> Gbdt {
        assert_eq!(x.len(), validation.len(), "one flag per row");
        let (mut xt, mut yt, mut xv, mut yv) = (vec![], vec![], vec![], vec![]);
        for ((r, t), &v) in x.iter().zip(y).zip(validation) {
            let (xs, ys) = if v { (&mut xv, &mut yv) } else { (&mut xt, &mut yt) };
            xs.push(r.clone());
            ys.push(*t);
        }
        if xt.is_empty() || xv.is_empty() {
            return Gbdt::fit(x, y, params);
        }
        let mut pred = vec![yt.iter().sum::<f64>() / yt.len() as f64; xv.len()];
        let (mut best_loss, mut best_trees) = (f64::INFINITY, 1usize);
        boost(&xt, &yt, params, |i, tree| {
            for (p, r) in pred.iter_mut().zip(&xv) {
                *p += tree.predict(r);
            }
            let loss = pred.iter().zip(&yv).map(|(p, t)| (p - t).abs()).sum::<f64>() / yv.len() as f64;
            if loss < best_loss {
                (best_loss, best_trees) = (loss, i + 1);
            }
            i + 1 >= best_trees + patience
        });
        Gbdt::fit(x, y, &GbdtParams { trees: best_trees, ..*params })
    }
}

/// Boosts up to `params.trees` trees; `stop(index, tree)` after each tree ends it early.
fn boost(x: &[Vec<f64>], y: &[f64], params: &GbdtParams, mut stop: impl FnMut(usize, &Tree) -> bool) -> Gbdt {
    assert_eq!(x.len(), y.len(), "one target per row");
    let n = x.len();
    if n == 0 {
        return Gbdt::new(0.0, vec![]);
    }
    let p = x[0].len();
    let base = y.iter().sum::<f64>() / n as f64;
    let params = &GbdtParams { min_leaf: params.min_leaf.max(n / 1000), ..*params };
    let binned = Binned::new(x, p, params.max_bins);
    let mut pred = vec![base; n];
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let mut all_rows: Vec<u32> = (0..n as u32).collect();
    let take = ((n as f64 * params.subsample).ceil() as usize).clamp(1, n);
    let mut trees = Vec::with_capacity(params.trees);
    for i in 0..params.trees {
        let resid: Vec<f64> = y.iter().zip(&pred).map(|(a, b)| a - b).collect();
        all_rows.shuffle(&mut rng);
        let mut rows = all_rows[..take].to_vec();
        rows.sort_unstable();
        let tree = grow(&binned, &resid, rows, params);
        for (i, pr) in pred.iter_mut().enumerate() {
            *pr += tree.predict(&x[i]);
        }
        let done = stop(i, &tree);
        trees.push(tree);
        if done {
            break;
        }
    }
    Gbdt::new(base, trees)
}

/// `x` rounded to `digits` significant digits: leaf values need no more, and the JSON shrinks.
/// (Thresholds are kept at full f32 precision: grid sizes like 4096 and 4097 differ by 0.0004 in
/// log2.)
fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits - 1 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// Features quantized to at most `max_bins` bins per column; `edges[f][b]` is the largest raw
/// value in bin `b`, so a split "bin <= b" separates values up to `edges[f][b]` from the rest.
struct Binned {
    cols: Vec<Vec<u8>>,
    edges: Vec<Vec<f64>>,
    /// `lows[f][b]`: the smallest raw value in bin `b`. A split after bin `b` is stored at the
    /// midpoint of `edges[f][b]` and `lows[f][b + 1]`, the gap no training value falls in, so
    /// prediction routes every training row as the histogram did. (The midpoint of two edges
    /// sent the lower part of a multi-value bin, >128 distinct values, to the wrong side: in
    /// sample, H200 embedding rows at 2-48 tokens came out 0.3-5x their measured time.)
    lows: Vec<Vec<f64>>,
}

impl Binned {
    fn new(x: &[Vec<f64>], p: usize, max_bins: usize) -> Binned {
        let max_bins = max_bins.clamp(2, 256);
        let mut cols = Vec::with_capacity(p);
        let mut edges = Vec::with_capacity(p);
        let mut lows = Vec::with_capacity(p);
        for f in 0..p {
            let mut vals: Vec<f64> = x.iter().map(|r| r[f]).collect();
            vals.sort_by(|a, b| a.total_cmp(b));
            vals.retain(|v| !v.is_nan());
            vals.dedup();
            if vals.is_empty() {
                // All NaN: one bin, never split.
                cols.push(vec![0; x.len()]);
                edges.push(vec![f64::NAN]);
                lows.push(vec![f64::NAN]);
                continue;
            }
            let e: Vec<f64> = if vals.len() <= max_bins {
                vals.clone()
            } else {
                let mut e: Vec<f64> = (1..=max_bins)
                    .map(|b| vals[(b * vals.len() / max_bins).min(vals.len()) - 1])
                    .collect();
                e.dedup();
                e
            };
            // NaN falls in the last bin: prediction sends it right at every split.
            let col = x
                .iter()
                .map(|r| if r[f].is_nan() { e.len() - 1 } else { e.partition_point(|&edge| edge < r[f]).min(e.len() - 1) } as u8)
                .collect();
            let low: Vec<f64> = std::iter::once(vals[0])
                .chain(e.iter().take(e.len() - 1).map(|&edge| vals[vals.partition_point(|&v| v <= edge).min(vals.len() - 1)]))
                .collect();
            cols.push(col);
            edges.push(e);
            lows.push(low);
        }
        Binned { cols, edges, lows }
    }
}

struct Split {
    feature: usize,
    bin: usize,
    gain: f64,
}

/// Residual sums and counts per (feature, bin), flattened; `offset[f]` starts feature `f`.
struct Hist {
    sum: Vec<f64>,
    cnt: Vec<u32>,
}

impl Hist {
    fn build(b: &Binned, offset: &[usize], resid: &[f64], rows: &[u32]) -> Hist {
        let total = *offset.last().unwrap_or(&0);
        let mut h = Hist { sum: vec![0.0; total], cnt: vec![0; total] };
        for (f, col) in b.cols.iter().enumerate() {
            let (s, c) = (&mut h.sum[offset[f]..offset[f + 1]], &mut h.cnt[offset[f]..offset[f + 1]]);
            for &r in rows {
                let bin = col[r as usize] as usize;
                s[bin] += resid[r as usize];
                c[bin] += 1;
            }
        }
        h
    }

    /// `self - other`: the sibling's histogram without a pass over its rows.
    fn minus(&self, other: &Hist) -> Hist {
        Hist {
            sum: self.sum.iter().zip(&other.sum).map(|(a, b)| a - b).collect(),
            cnt: self.cnt.iter().zip(&other.cnt).map(|(a, b)| a - b).collect(),
        }
    }
}

fn grow(b: &Binned, resid: &[f64], rows: Vec<u32>, params: &GbdtParams) -> Tree {
    let mut offset = vec![0usize];
    for e in &b.edges {
        offset.push(offset.last().unwrap() + e.len());
    }
    let mut tree = Tree { nodes: vec![LEAF] };
    let hist = Hist::build(b, &offset, resid, &rows);
    // (node index, rows, its histogram, depth)
    let mut stack = vec![(0usize, rows, hist, 0usize)];
    while let Some((node, rows, hist, depth)) = stack.pop() {
        let sum: f64 = rows.iter().map(|&r| resid[r as usize]).sum();
        let leaf = params.learning_rate * sum / (rows.len() as f64 + params.lambda);
        tree.nodes[node].value = round_sig(leaf, 4) as f32;
        if depth >= params.max_depth || rows.len() < 2 * params.min_leaf {
            continue;
        }
        let Some(split) = best_split(b, &offset, &hist, rows.len(), sum, params) else { continue };
        let col = &b.cols[split.feature];
        let (l, r): (Vec<u32>, Vec<u32>) =
            rows.into_iter().partition(|&i| (col[i as usize] as usize) <= split.bin);
        let left = tree.nodes.len();
        // Midpoint of the gap between the bins: robust to the f32 rounding of the threshold.
        let (hi, lo) = (b.edges[split.feature][split.bin], b.lows[split.feature][split.bin + 1]);
        tree.nodes[node] = Node { value: ((hi + lo) / 2.0) as f32, feature: split.feature as i16, left: left as u16 };
        tree.nodes.extend([LEAF, LEAF]);
        if depth + 1 < params.max_depth {
            let (small_is_left, small) = if l.len() <= r.len() { (true, &l) } else { (false, &r) };
            let hs = Hist::build(b, &offset, resid, small);
            let hb = hist.minus(&hs);
            let (hl, hr) = if small_is_left { (hs, hb) } else { (hb, hs) };
            stack.push((left, l, hl, depth + 1));
            stack.push((left + 1, r, hr, depth + 1));
        } else {
            // Children at max depth become leaves: no histograms needed.
            let empty = || Hist { sum: vec![], cnt: vec![] };
            stack.push((left, l, empty(), depth + 1));
            stack.push((left + 1, r, empty(), depth + 1));
        }
    }
    tree
}

fn best_split(b: &Binned, offset: &[usize], h: &Hist, n_rows: usize, sum: f64, params: &GbdtParams) -> Option<Split> {
    let n = n_rows as f64;
    let lam = params.lambda;
    let parent = sum * sum / (n + lam);
    let mut best: Option<Split> = None;
    for f in 0..b.cols.len() {
        let bins = b.edges[f].len();
        if bins < 2 {
            continue;
        }
        let (hs, hc) = (&h.sum[offset[f]..offset[f + 1]], &h.cnt[offset[f]..offset[f + 1]]);
        let (mut ls, mut lc) = (0.0, 0usize);
        for bin in 0..bins - 1 {
            ls += hs[bin];
            lc += hc[bin] as usize;
            let rc = n_rows - lc;
            if lc < params.min_leaf {
                continue;
            }
            if rc < params.min_leaf {
                break;
            }
            let rs = sum - ls;
            let gain = ls * ls / (lc as f64 + lam) + rs * rs / (rc as f64 + lam) - parent;
            if gain > best.as_ref().map(|s| s.gain).unwrap_or(1e-12) {
                best = Some(Split { feature: f, bin, gain });
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_route_training_rows_as_their_bins_did() {
        // 1,024 distinct values in 128 bins of 8 (edges 7, 15, ..., 511, 519, ...) and a step
        // between bins (x > 511): each training row must land on the side its bin trained on.
        // A threshold at the midpoint of two bin edges (515) sent 512-515 left.
        let x: Vec<Vec<f64>> = (0..1024).map(|i| vec![((i * 389) % 1024) as f64]).collect();
        let y: Vec<f64> = x.iter().map(|r| if r[0] > 511.0 { 1.0 } else { 0.0 }).collect();
        let m = Gbdt::fit(&x, &y, &GbdtParams { trees: 50, subsample: 1.0, ..Default::default() });
        let worst = x.iter().zip(&y).map(|(r, t)| (m.predict(r) - t).abs()).fold(0.0, f64::max);
        assert!(worst < 0.05, "worst in-sample error {worst}");
    }

    #[test]
    fn nan_features_train_where_prediction_sends_them() {
        // NaN goes right at every split when predicting; binning must put it on that side too.
        let x: Vec<Vec<f64>> = (0..400).map(|i| vec![if i % 4 == 0 { f64::NAN } else { (i % 50) as f64 }]).collect();
        let y: Vec<f64> = x.iter().map(|r| if r[0].is_nan() { 5.0 } else { r[0] / 50.0 }).collect();
        let m = Gbdt::fit(&x, &y, &GbdtParams { trees: 200, subsample: 1.0, ..Default::default() });
        assert!((m.predict(&[f64::NAN]) - 5.0).abs() < 0.3, "NaN row predicted {}", m.predict(&[f64::NAN]));
    }

    #[test]
    fn learns_a_step_and_a_ramp() {
        // y = 3 for x0 > 0.5 else 0, plus 2*x1: a tree ensemble should get close on both.
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..400 {
            let a = (i % 20) as f64 / 20.0;
            let c = (i / 20) as f64 / 20.0;
            x.push(vec![a, c]);
            y.push(if a > 0.5 { 3.0 } else { 0.0 } + 2.0 * c);
        }
        let m = Gbdt::fit(&x, &y, &GbdtParams { trees: 100, ..Default::default() });
        let mse: f64 = x.iter().zip(&y).map(|(r, t)| (m.predict(r) - t).powi(2)).sum::<f64>() / 400.0;
        assert!(mse < 0.01, "mse {mse}");
        assert!((m.predict(&[0.9, 0.0]) - 3.0).abs() < 0.15);
        assert!((m.predict(&[0.1, 0.5]) - 1.0).abs() < 0.15);
    }

    #[test]
    fn early_stopping_stops_where_noise_begins() {
        // y = 2*x0 plus noise that no feature explains: the inner rows stop boosting long
        // before the cap, and the stopped model predicts fresh rows better than the capped one.
        use rand::Rng;
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut draw = |n: usize| -> (Vec<Vec<f64>>, Vec<f64>) {
            let x: Vec<Vec<f64>> = (0..n).map(|_| vec![rng.gen::<f64>(), rng.gen::<f64>()]).collect();
            let y = x.iter().map(|r| 2.0 * r[0] + rng.gen_range(-0.5..0.5)).collect();
            (x, y)
        };
        let (x, y) = draw(2000);
        let (xf, yf) = draw(2000);
        let flags: Vec<bool> = (0..x.len()).map(|i| i % 10 == 0).collect();
        let p = GbdtParams { trees: 400, learning_rate: 0.1, ..Default::default() };
        let stopped = Gbdt::fit_early_stopped(&x, &y, &flags, &p, 20);
        let capped = Gbdt::fit(&x, &y, &p);
        assert!(stopped.trees.len() < 200, "{} trees", stopped.trees.len());
        let mae = |m: &Gbdt| xf.iter().zip(&yf).map(|(r, t)| (m.predict(r) - t).abs()).sum::<f64>() / yf.len() as f64;
        assert!(mae(&stopped) < mae(&capped), "{} vs {}", mae(&stopped), mae(&capped));
        // No validation rows: the fixed count.
        let none = Gbdt::fit_early_stopped(&x, &y, &vec![false; x.len()], &p, 20);
        assert_eq!(none.trees.len(), 400);
    }

    #[test]
    fn complete_layout_predicts_as_the_trees_do() {
        // Trees of mixed depths (leaves at every level), inputs on and around the thresholds.
        use rand::Rng;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let x: Vec<Vec<f64>> = (0..600).map(|_| (0..3).map(|_| (rng.gen_range(0..40) as f64) / 4.0).collect()).collect();
        let y: Vec<f64> = x.iter().map(|r| if r[0] > 5.0 { r[1] * r[2] } else { -r[2] }).collect();
        let m = Gbdt::fit(&x, &y, &GbdtParams { trees: 37, max_depth: 6, min_leaf: 3, ..Default::default() });
        let deep = Gbdt::fit(&x, &y, &GbdtParams { trees: 5, max_depth: 12, min_leaf: 1, ..Default::default() });
        assert!((deep.predict(&x[1]) - deep.base - deep.trees.iter().map(|t| t.predict(&x[1])).sum::<f64>()).abs() < 1e-9);
        let back: Gbdt = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        for r in x.iter().chain([vec![-1.0, 0.0, 1e9], vec![f64::NAN, 2.0, 3.0]].iter()) {
            let walked = m.base + m.trees.iter().map(|t| t.predict(r)).sum::<f64>();
            assert!((m.predict(r) - walked).abs() < 1e-9, "{r:?}: {} vs {walked}", m.predict(r));
            assert!((back.predict(r) - walked).abs() < 1e-9);
        }
        let mut cleared = m.clone();
        cleared.clear_trees();
        assert_eq!(cleared.predict(&x[0]), m.base);
    }

    #[test]
    fn same_seed_same_model_and_json_round_trip() {
        let x: Vec<Vec<f64>> = (0..100).map(|i| vec![(i as f64).sin(), i as f64]).collect();
        let y: Vec<f64> = x.iter().map(|r| r[0] * 2.0 + r[1] / 50.0).collect();
        let p = GbdtParams { trees: 20, ..Default::default() };
        let a = Gbdt::fit(&x, &y, &p);
        let b = Gbdt::fit(&x, &y, &p);
        assert_eq!(a, b);
        let back: Gbdt = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        for r in &x {
            assert!((back.predict(r) - a.predict(r)).abs() < 1e-4);
        }
    }
}
