//! FLOPs and compulsory bytes of one kernel: the inputs to its speed-of-light bound.
//! Bytes count each tensor moved to or from HBM once (a true lower bound); FLOPs count
//! multiply-adds as 2.

use crate::schema::{Dtype, Kernel, Op};

/// Bytes of one activation element: quantized matmuls still read/write bf16 activations
/// except their own quantized input, which the GEMM dtype covers.
fn act_bytes(d: Dtype) -> f64 {
    if d.is_quantized() {
        2.0
    } else {
        d.bytes()
    }
}

/// Causal attention: query i (0-based, after `prefix` cached tokens) attends
/// `min(prefix + i + 1, window)` keys. Returns the summed key count over the `s` queries.
pub fn causal_pairs(s: u64, prefix: u64, window: u64) -> f64 {
    if window == 0 || prefix + s <= window {
        let (s, p) = (s as f64, prefix as f64);
        return s * p + s * (s + 1.0) / 2.0;
    }
    let (s, p) = (s as f64, prefix as f64);
    let w = window as f64;
    // Queries whose causal span exceeds the window attend exactly w keys.
    let first_capped = (w - p).max(0.0); // queries with p + i + 1 <= w
    let uncapped = first_capped * p + first_capped * (first_capped + 1.0) / 2.0;
    uncapped + (s - first_capped) * w
}

/// Distinct keys a prefill reads per sequence: cached prefix + new, capped by the window
/// plus the new tokens.
fn keys_read(s: u64, prefix: u64, window: u64) -> f64 {
    let total = prefix + s;
    if window == 0 {
        total as f64
    } else {
        total.min(window + s) as f64
    }
}

/// Expected number of distinct experts hit when `assignments` routings fall uniformly on `e` experts.
pub fn expected_active_experts(e: f64, assignments: f64) -> f64 {
    if e <= 0.0 {
        return 0.0;
    }
    e * (1.0 - (1.0 - 1.0 / e).powf(assignments))
}

/// How a MoE kernel's tokens spread over its experts, which sets the expert weights it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Routing {
    /// Each token picks its k experts uniformly at random: the expected distinct count of one
    /// GPU's shard (the mean shard under expert parallelism: one kernel's expected work).
    #[default]
    Uniform,
    /// Served traffic under uniform routing, what the simulator assumes (and what the H200
    /// traces' random-weight routers do, `microbench/data/h200_sxm/router_stats/`): under
    /// expert parallelism the busiest of the `ep` shards, which every layer's combine waits for.
    UniformBusiest,
    /// Assignments spread over as many experts as exist (min(E, T*k)): the `balanced` rows of
    /// aiconfigurator's and kernelsight's collectors. At T*k = E this reads 1/(1-1/e) = 1.58x
    /// the uniform expectation, so an efficiency fitted on such rows must see these bytes.
    Balanced,
    /// kernelsight's collector's `power_law_<alpha>`: expert probability proportional to
    /// rank^-alpha over a random ranking, k distinct experts per token. Alpha in hundredths.
    PowerLaw { alpha_centi: u16 },
    /// aiconfigurator's collectors' `power_law_<alpha>`: per-expert token counts drawn from a
    /// power law bounded to [1, 0.8 T] ([0.01, 2] when T*k <= E) and scaled to T*k, and the
    /// expert-parallel shard with the most tokens is the one measured (their generator swaps
    /// it to rank 0). That shard does more than its 1/ep share of the work, which is what
    /// serving under EP waits for too. Alpha in hundredths.
    PowerLawLoads { alpha_centi: u16 },
}

impl Routing {
    /// What served traffic is priced for unless the user names another routing.
    pub const SERVED_DEFAULT: Routing = Routing::UniformBusiest;

    /// Distinct experts of one GPU's shard (`global / ep` of them) that `tokens` tokens of
    /// `topk` assignments each hit, in expectation.
    pub fn local_active_experts(self, tokens: f64, topk: f64, global: f64, ep: f64) -> f64 {
        let local = global / ep;
        let assignments = tokens * topk / ep;
        match self {
            Routing::UniformBusiest if ep > 1.0 => uniform_busiest_shard(tokens, topk, global, ep).active,
            Routing::Uniform | Routing::UniformBusiest => expected_active_experts(local, assignments.min(tokens * local)),
            Routing::Balanced => local.min(assignments.ceil()).max(0.0),
            Routing::PowerLaw { alpha_centi } => {
                // A random ranking makes every expert equally likely to be local: the shard
                // holds its share of the global expectation.
                let inclusion = power_law_inclusion(global as usize, topk, alpha_centi as f64 / 100.0);
                inclusion.iter().map(|p| 1.0 - (1.0 - p).powf(tokens)).sum::<f64>() / ep
            }
            Routing::PowerLawLoads { alpha_centi } => power_law_loads(tokens, topk, global, ep, alpha_centi).active,
        }
    }

    /// The routing of served traffic a user names: `uniform` (the default: a random-weight
    /// router, or a trained one on well-mixed prompts), `balanced`, or `power_law_<alpha>`
    /// (alpha in [0, 10]; skewed expert loads drawn as aiconfigurator's collectors draw them,
    /// its default being power_law_1.01, the busiest expert-parallel shard setting the step).
    pub fn parse_served(s: &str) -> Result<Routing, String> {
        match s.trim() {
            "uniform" => Ok(Routing::UniformBusiest),
            "balanced" => Ok(Routing::Balanced),
            other => alpha_centi_after(other, "power_law_")
                .map(|alpha_centi| Routing::PowerLawLoads { alpha_centi })
                .ok_or_else(|| format!("'{other}' is not a served MoE routing (allowed: uniform, balanced, power_law_<alpha> with alpha in [0, 10])")),
        }
    }

    /// How `parse_served` spells it.
    pub fn served_name(self) -> String {
        match self {
            Routing::Uniform | Routing::UniformBusiest => "uniform".into(),
            Routing::Balanced => "balanced".into(),
            Routing::PowerLaw { alpha_centi } | Routing::PowerLawLoads { alpha_centi } => format!("power_law_{}", alpha_centi as f64 / 100.0),
        }
    }

    /// Padded rows over assigned rows of one GPU's shard, per tile height of
    /// `row_tiles::ROW_TILES`: each expert's tokens padded up to whole tiles, for this routing's
    /// per-expert counts (the shard `local_assignments` prices).
    pub fn padding_ratios(self, tokens: f64, topk: f64, global: f64, ep: f64) -> [f64; 3] {
        use super::row_tiles::{binomial_tiles, padding_ratios};
        let (t, k, e) = (tokens.max(0.0), topk.min(global).max(1.0), global.max(1.0));
        let local = (e / ep.max(1.0)).max(1.0);
        let assignments = self.local_assignments(t, k, e, ep.max(1.0));
        let tiles = match self {
            Routing::Uniform | Routing::UniformBusiest => {
                // Each token picks an expert with probability k/E; the busiest shard's experts
                // share its larger count.
                let p = (k / e) * assignments / (t * k / ep.max(1.0)).max(1e-12);
                binomial_tiles(t, p).map(|x| x * local)
            }
            Routing::Balanced => {
                // Token i takes experts (i*k + j) mod E: every count is q or q + 1.
                let total = (t * k).round();
                let (q, r) = ((total / e).floor(), total % e);
                let tiles = |n: f64| super::row_tiles::count_tiles([n]);
                let (lo, hi) = (tiles(q), tiles(q + 1.0));
                std::array::from_fn(|i| local * ((r / e) * hi[i] + (1.0 - r / e) * lo[i]))
            }
            Routing::PowerLaw { alpha_centi } => power_law_tiles(t, k, e, ep.max(1.0), alpha_centi),
            Routing::PowerLawLoads { alpha_centi } => power_law_loads(t, k, e, ep.max(1.0), alpha_centi).tiles,
        };
        padding_ratios(tiles, assignments)
    }

    /// Token-expert assignments one GPU's shard computes, in expectation: its 1/ep share,
    /// except under `PowerLawLoads` and `UniformBusiest`, where the busiest shard's.
    pub fn local_assignments(self, tokens: f64, topk: f64, global: f64, ep: f64) -> f64 {
        match self {
            Routing::PowerLawLoads { alpha_centi } => power_law_loads(tokens, topk, global, ep, alpha_centi).assignments,
            Routing::UniformBusiest if ep > 1.0 => uniform_busiest_shard(tokens, topk, global, ep).assignments,
            _ => tokens * topk / ep,
        }
    }
}

/// The power-law exponent, in hundredths, of a routing name `<prefix><alpha>` (alpha in [0, 10]).
pub fn alpha_centi_after(name: &str, prefix: &str) -> Option<u16> {
    name.strip_prefix(prefix)?.parse::<f64>().ok().filter(|a| (0.0..=10.0).contains(a)).map(|a| (a * 100.0).round() as u16)
}

/// The busiest expert-parallel shard under `Routing::PowerLawLoads`: its assignments and its
/// experts that got any, averaged over draws.
#[derive(Debug, Clone, Copy)]
struct ShardLoad {
    assignments: f64,
    active: f64,
    /// Row tiles of its experts (`row_tiles::ROW_TILES`), from the drawn counts; the uniform
    /// busiest shard leaves them to `Routing::padding_ratios`, which needs no draws.
    tiles: [f64; 3],
}

/// Draws of aiconfigurator's per-expert counts averaged for `ShardLoad`. The busiest shard's
/// share is heavy-tailed: at 64 draws it still moves 3-7 % between seeds (8,192 tokens x top-8
/// of 256 over 8 shards: 1.66-1.90x the even share at six seeds). 256 draws moved no held-out
/// MoE median by more than 0.15 points (`validate kernels --ops moe`, session 15), so the
/// fits absorb that noise.
const POWER_LAW_DRAWS: usize = 64;

/// `ShardLoad` of `tokens` tokens of `topk` picks on `global` experts over `ep` shards, with
/// counts drawn as aiconfigurator's `_generate_power_law_distribution` draws them: inverse-CDF
/// samples of a bounded power law scaled to T*k and rounded, the rounding's shortfall added one
/// each to the largest (ties in random order), the busiest shard swapped to the front. Its router logits are one-hot
/// sums, so a token keeps k *distinct* experts: an expert takes at most T picks, and each
/// token's extra picks land on experts it had none of (ties in its top-k, taken as spread over
/// the idle experts). Deterministic (fixed seed) and cached: every fit
/// asks again for the same few shapes.
fn power_law_loads(tokens: f64, topk: f64, global: f64, ep: f64, alpha_centi: u16) -> ShardLoad {
    use rand::{seq::SliceRandom, Rng, SeedableRng};
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Key = (u64, u64, u64, u64, u16);
    static CACHE: OnceLock<Mutex<HashMap<Key, ShardLoad>>> = OnceLock::new();
    let (t, k, e, shards) = (tokens.round().max(1.0) as u64, topk.round().max(1.0) as u64, global.round().max(1.0) as u64, ep.round().max(1.0) as u64);
    let key = (t, k.min(e), e, shards, alpha_centi);
    if let Some(&load) = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return load;
    }
    let (t, k, e) = (t as i64, k.min(e) as i64, e as usize);
    let alpha = alpha_centi as f64 / 100.0;
    let total = t * k;
    let (lo, hi) = if total > e as i64 { (1.0, 0.8 * t as f64) } else { (0.01, 2.0) };
    let per_shard = (e / shards as usize).max(1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    let (mut sum_assign, mut sum_active, mut sum_tiles) = (0.0, 0.0, [0.0; 3]);
    for _ in 0..POWER_LAW_DRAWS {
        let x: Vec<f64> = (0..e).map(|_| bounded_power_law(rng.gen::<f64>(), alpha, lo, hi.max(lo))).collect();
        let norm: f64 = x.iter().sum();
        let mut counts: Vec<i64> = x.iter().map(|v| (v / norm * total as f64).round() as i64).collect();
        // Their argsort is not stable: experts tied on a count (all of them at decode sizes,
        // where every scaled sample rounds to 0) come out in no particular order.
        let mut order: Vec<usize> = (0..e).collect();
        order.shuffle(&mut rng);
        order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        let delta = total - counts.iter().sum::<i64>();
        for i in 0..delta.unsigned_abs() as usize {
            if delta > 0 {
                counts[order[i % e]] += 1;
            } else if let Some(&j) = order.iter().rev().find(|&&j| counts[j] > 0) {
                counts[j] -= 1;
            }
        }
        // The busiest shard first, as their swap leaves it.
        let shard_sum = |c: &[i64], s: usize| c[s * per_shard..((s + 1) * per_shard).min(e)].iter().sum::<i64>();
        let busiest = (0..e.div_ceil(per_shard)).max_by_key(|&s| (shard_sum(&counts, s), std::cmp::Reverse(s))).unwrap_or(0);
        for i in 0..per_shard.min(e - busiest * per_shard) {
            counts.swap(i, busiest * per_shard + i);
        }
        // At most one pick per token: the excess lands on experts the token had none of,
        // spread over the idle ones (expected counts).
        let surplus: i64 = counts.iter().map(|c| (c - t).max(0)).sum();
        counts.iter_mut().for_each(|c| *c = (*c).min(t));
        let shard = &counts[..per_shard.min(e)];
        let idle = counts.iter().filter(|c| **c == 0).count() as f64;
        let shard_idle = shard.iter().filter(|c| **c == 0).count() as f64;
        let (extra, woken) = if idle > 0.0 {
            (surplus as f64 * shard_idle / idle, shard_idle * (1.0 - (1.0 - 1.0 / idle).powf(surplus as f64)))
        } else {
            (0.0, 0.0)
        };
        sum_assign += shard.iter().sum::<i64>() as f64 + extra;
        sum_active += shard.iter().filter(|c| **c > 0).count() as f64 + woken;
        // A woken expert holds a token or a few: one tile of any height.
        let tiles = super::row_tiles::count_tiles(shard.iter().map(|&c| c as f64));
        for (s, x) in sum_tiles.iter_mut().zip(tiles) {
            *s += x + woken;
        }
    }
    let n = POWER_LAW_DRAWS as f64;
    let load = ShardLoad { assignments: sum_assign / n, active: sum_active / n, tiles: sum_tiles.map(|x| x / n) };
    CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).insert(key, load);
    load
}

/// The busiest of `ep` shards of `global` experts under uniform routing, in expectation. A
/// token's k distinct picks put a hypergeometric count on each shard, so a shard's count is
/// near normal with mean T*k/ep; the ep counts sum to T*k, and the largest of ep such
/// exchangeable deviations exceeds the mean by the largest of ep independent standard normals
/// times sigma / sqrt(1 - 1/ep). Its distinct experts as for any shard with that many picks.
fn uniform_busiest_shard(tokens: f64, topk: f64, global: f64, ep: f64) -> ShardLoad {
    let (t, k, e) = (tokens.max(0.0), topk.min(global).max(1.0), global.max(1.0));
    let local = e / ep;
    let share = local / e;
    let mean = t * k * share;
    let var_per_token = if e > 1.0 { k * share * (1.0 - share) * (e - k) / (e - 1.0) } else { 0.0 };
    let excess = (t * var_per_token).sqrt() * expected_max_of_std_normals(ep.round() as usize) / (1.0 - 1.0 / ep).sqrt();
    // A token puts at most min(k, local) picks on one shard.
    let assignments = (mean + excess).min(t * k.min(local));
    ShardLoad { assignments, active: expected_active_experts(local, assignments.min(t * local)), tiles: [0.0; 3] }
}

/// Row tiles of one shard under `Routing::PowerLaw`: each expert's count is binomial with its
/// inclusion probability; a random ranking gives the shard its 1/ep share. Cached (the fits ask
/// for the same few shapes again and again).
fn power_law_tiles(tokens: f64, topk: f64, global: f64, ep: f64, alpha_centi: u16) -> [f64; 3] {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<(u64, u64, u64, u64, u16), [f64; 3]>>> = OnceLock::new();
    let key = (tokens.round() as u64, topk.round() as u64, global.round() as u64, ep.round() as u64, alpha_centi);
    if let Some(&t) = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return t;
    }
    let inclusion = power_law_inclusion(global as usize, topk, alpha_centi as f64 / 100.0);
    let mut tiles = [0.0; 3];
    for p in inclusion {
        for (s, x) in tiles.iter_mut().zip(super::row_tiles::binomial_tiles(tokens, p)) {
            *s += x / ep;
        }
    }
    CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).insert(key, tiles);
    tiles
}

/// E[max of n independent standard normals] (0 for n <= 1; 1/sqrt(pi) for 2), by quadrature of
/// x n phi(x) Phi(x)^(n-1), tabulated once for n up to 1024.
fn expected_max_of_std_normals(n: usize) -> f64 {
    use std::sync::OnceLock;
    const N_MAX: usize = 1024;
    static TABLE: OnceLock<Vec<f64>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let (lo, hi, steps) = (-10.0f64, 10.0f64, 4000usize);
        let h = (hi - lo) / steps as f64;
        let grid: Vec<(f64, f64, f64)> = (0..=steps)
            .map(|i| {
                let x = lo + i as f64 * h;
                let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
                (x, pdf, 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)))
            })
            .collect();
        (0..=N_MAX)
            .map(|n| {
                if n <= 1 {
                    return 0.0;
                }
                // Trapezoid rule; the integrand vanishes at both ends.
                grid.iter().map(|&(x, pdf, cdf)| x * n as f64 * pdf * cdf.powi(n as i32 - 1)).sum::<f64>() * h
            })
            .collect()
    });
    match table.get(n) {
        Some(&c) => c,
        None => (2.0 * (n as f64).ln()).sqrt(),
    }
}

/// Inverse CDF of a power law of exponent `alpha` bounded to [lo, hi] at quantile `u`.
fn bounded_power_law(u: f64, alpha: f64, lo: f64, hi: f64) -> f64 {
    if (alpha - 1.0).abs() < 1e-9 {
        return lo * (hi / lo).powf(u);
    }
    let a = 1.0 - alpha;
    ((hi.powf(a) - lo.powf(a)) * u + lo.powf(a)).powf(1.0 / a)
}

/// Probability that one token's `k` distinct picks (weighted by rank^-alpha, without
/// replacement) include each expert: the weights scaled to sum to k, capped at 1, the excess
/// spread over the rest (inclusion probabilities of proportional-to-size sampling).
fn power_law_inclusion(experts: usize, k: f64, alpha: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=experts).map(|r| (r as f64).powf(-alpha)).collect();
    let mut p = vec![0.0; experts];
    let mut capped = 0usize; // weights are decreasing: the first `capped` are at 1
    loop {
        let rest: f64 = w[capped..].iter().sum();
        let scale = (k - capped as f64) / rest;
        if capped < experts && w[capped] * scale > 1.0 {
            capped += 1;
            continue;
        }
        for (i, pi) in p.iter_mut().enumerate() {
            *pi = if i < capped { 1.0 } else { (w[i] * scale).min(1.0) };
        }
        return p;
    }
}

/// Geometry of a whole MLA module (DeepSeek-V2/V3 attention block, hidden states in, hidden
/// states out): the attention core of an `mla_prefill` / `mla_decode` kernel plus its
/// projections. Used for measurements that time the module (aiconfigurator's
/// `mla_*_module_perf` tables); the step graph emits the projections as GEMMs of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaModule {
    pub hidden: u64,
    pub q_lora_rank: u64,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

impl MlaModule {
    /// DeepSeek-V3 (`deepseek-ai/DeepSeek-V3` config.json), the model of every module table.
    pub const DEEPSEEK_V3: MlaModule =
        MlaModule { hidden: 7168, q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128 };

    /// The projection GEMMs around the attention core `k` (heads = `k.num_heads`, the heads
    /// on this GPU), each with the number of times it runs, linear weights in `weights`:
    /// the fused q_a + kv_a down-projection (replicated, not split by heads), q_b, o_proj and
    /// the latent up-projection. Prefill decompresses every key's latent with kv_b (MHA form);
    /// decode runs absorbed: per head a `[tokens, nope] x [nope, kv_lora]` (W_UK) and a
    /// `[tokens, kv_lora] x [kv_lora, v]` (W_UV) batched GEMM whose weights vLLM keeps in the
    /// activation dtype (dequantized at load). Norms and RoPE are left out: elementwise, a few
    /// tokens x 2k bytes each.
    pub fn projections(&self, k: &Kernel, weights: Dtype) -> Vec<(Kernel, u64)> {
        let h = k.num_heads;
        let decode = k.op == Op::MlaDecode;
        let tokens = if decode { k.batch } else { k.batch * k.seq_len };
        let mut v = vec![
            (Kernel::gemm(weights, tokens, self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim, self.hidden), 1),
            (Kernel::gemm(weights, tokens, h * (self.qk_nope_head_dim + self.qk_rope_head_dim), self.q_lora_rank), 1),
            (Kernel::gemm(weights, tokens, self.hidden, h * self.v_head_dim), 1),
        ];
        if decode {
            let a = if k.dtype.is_quantized() { Dtype::Bf16 } else { k.dtype };
            v.push((Kernel::gemm(a, tokens, self.kv_lora_rank, self.qk_nope_head_dim), h));
            v.push((Kernel::gemm(a, tokens, self.v_head_dim, self.kv_lora_rank), h));
        } else {
            let keys = k.batch * (k.kv_len + k.seq_len);
            v.push((Kernel::gemm(weights, keys, h * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank), 1));
        }
        v
    }
}

pub fn flops(k: &Kernel) -> f64 {
    flops_routed(k, Routing::Uniform)
}

/// As `flops`, a MoE kernel's assignments those `routing` gives its GPU's shard.
pub fn flops_routed(k: &Kernel, routing: Routing) -> f64 {
    let f = |x: u64| x as f64;
    match k.op {
        Op::Gemm => 2.0 * f(k.m) * f(k.n) * f(k.k),
        Op::AttnPrefill => {
            let pairs = causal_pairs(k.seq_len, k.kv_len, k.window);
            4.0 * f(k.batch) * f(k.num_heads) * f(k.head_dim) * pairs
        }
        Op::AttnDecode => {
            let kv = if k.window > 0 { k.kv_len.min(k.window) } else { k.kv_len };
            4.0 * f(k.batch) * f(k.num_heads) * f(k.head_dim) * f(kv)
        }
        // MLA prefill runs the decompressed (MHA) form: per head QK over nope + rope dims and
        // PV over v dims. With the schema's latent head_dim = kv_lora_rank + rope (576 for
        // DeepSeek-V2/V3: 512 + 64, nope 128, v 128) those are head_dim - 384 and head_dim - 448.
        Op::MlaPrefill => {
            let pairs = causal_pairs(k.seq_len, k.kv_len, 0);
            let (qk, v) = ((f(k.head_dim) - 384.0).max(64.0), (f(k.head_dim) - 448.0).max(64.0));
            2.0 * f(k.batch) * f(k.num_heads) * (qk + v) * pairs
        }
        // MLA decode in latent (absorbed) form: QK over head_dim (576), PV over kv_lora_rank (512).
        Op::MlaDecode => 2.0 * f(k.batch) * f(k.num_heads) * (2.0 * f(k.head_dim) - 64.0) * f(k.kv_len),
        // Gated DeltaNet: per token and value head a d_k x d_v state update and readout (~4 MACs/elem).
        Op::LinearAttn => 8.0 * f(k.num_tokens) * f(k.num_heads) * f(k.head_dim) * f(k.head_dim),
        Op::Moe => {
            let tp = k.tp.max(1) as f64;
            let assignments = routing.local_assignments(f(k.num_tokens), f(k.topk), f(k.num_experts), k.ep.max(1) as f64);
            // gate+up (2*inter) and down (inter), each a 2-FLOP MAC per element.
            2.0 * assignments * f(k.hidden) * 3.0 * f(k.inter) / tp
        }
        Op::MoeRouter => 2.0 * f(k.num_tokens) * f(k.hidden) * f(k.num_experts),
        Op::AllReduce | Op::ReduceScatter => f(k.bytes) / k.dtype.bytes(),
        Op::Rmsnorm | Op::FusedAddRmsnorm => 4.0 * f(k.num_tokens) * f(k.hidden),
        Op::SiluMul => 4.0 * f(k.num_tokens) * f(k.hidden),
        Op::Rope => 3.0 * f(k.num_tokens) * f(k.num_heads + k.num_kv_heads) * f(k.head_dim),
        Op::Add => f(k.num_tokens) * f(k.hidden),
        Op::Sampling => 5.0 * f(k.num_tokens) * f(k.hidden),
        Op::AllGather | Op::AllToAll | Op::P2p | Op::Embedding | Op::Copy => 0.0,
    }
}

/// Compulsory HBM bytes (collectives: the per-GPU message, moved over links, not HBM), MoE
/// experts hit by uniform routing.
pub fn bytes(k: &Kernel) -> f64 {
    bytes_routed(k, Routing::Uniform)
}

/// As `bytes`, a MoE kernel's experts hit as `routing` spreads its tokens.
pub fn bytes_routed(k: &Kernel, routing: Routing) -> f64 {
    let f = |x: u64| x as f64;
    let d = k.dtype.bytes();
    let a = act_bytes(k.dtype);
    match k.op {
        Op::Gemm => {
            // Weight (k x n) in the GEMM dtype; quantized GEMMs read quantized activations
            // and write bf16.
            let scale = if matches!(k.dtype, Dtype::Fp4) { 1.0 + 1.0 / 16.0 } else { 1.0 };
            (f(k.m) * f(k.k) + f(k.k) * f(k.n)) * d * scale + f(k.m) * f(k.n) * a
        }
        Op::AttnPrefill => {
            let kvb = k.kv_dtype().bytes();
            let q_o = 2.0 * f(k.batch) * f(k.seq_len) * f(k.num_heads) * f(k.head_dim) * a;
            let keys = keys_read(k.seq_len, k.kv_len, k.window);
            q_o + 2.0 * f(k.batch) * keys * f(k.num_kv_heads) * f(k.head_dim) * kvb
        }
        Op::AttnDecode => {
            let kvb = k.kv_dtype().bytes();
            let kv = if k.window > 0 { k.kv_len.min(k.window) } else { k.kv_len };
            let q_o = 2.0 * f(k.batch) * f(k.num_heads) * f(k.head_dim) * a;
            q_o + 2.0 * f(k.batch) * f(kv) * f(k.num_kv_heads) * f(k.head_dim) * kvb
        }
        Op::MlaPrefill => {
            let kvb = k.kv_dtype().bytes();
            let q_o = f(k.batch) * f(k.seq_len) * f(k.num_heads) * (2.0 * f(k.head_dim) - 64.0) * a;
            q_o + f(k.batch) * f(k.kv_len + k.seq_len) * f(k.head_dim) * kvb
        }
        Op::MlaDecode => {
            let kvb = k.kv_dtype().bytes();
            let q_o = f(k.batch) * f(k.num_heads) * (2.0 * f(k.head_dim) - 64.0) * a;
            q_o + f(k.batch) * f(k.kv_len) * f(k.head_dim) * kvb
        }
        Op::LinearAttn => {
            // q, k, v, gates in and out once, plus the fp32 state read and written per
            // sequence (batch); state = heads * d * d.
            let io = 4.0 * f(k.num_tokens) * f(k.num_heads) * f(k.head_dim) * a;
            io + 2.0 * f(k.batch.max(1)) * f(k.num_heads) * f(k.head_dim) * f(k.head_dim) * 4.0
        }
        Op::Moe => {
            let tp = k.tp.max(1) as f64;
            let active = routing.local_active_experts(f(k.num_tokens), f(k.topk), f(k.num_experts), k.ep.max(1) as f64);
            let w = active * 3.0 * f(k.hidden) * f(k.inter) / tp * d;
            // tokens in, their routed copies' results out (combined in place).
            w + 2.0 * f(k.num_tokens) * f(k.hidden) * a
        }
        Op::MoeRouter => f(k.num_tokens) * f(k.hidden) * a + f(k.hidden) * f(k.num_experts) * a,
        Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::AllToAll | Op::P2p => f(k.bytes),
        Op::Rmsnorm => 2.0 * f(k.num_tokens) * f(k.hidden) * a + f(k.hidden) * a,
        Op::FusedAddRmsnorm => 4.0 * f(k.num_tokens) * f(k.hidden) * a + f(k.hidden) * a,
        // reads gate and up (2 x hidden), writes hidden.
        Op::SiluMul => 3.0 * f(k.num_tokens) * f(k.hidden) * a,
        Op::Rope => 2.0 * f(k.num_tokens) * f(k.num_heads + k.num_kv_heads) * f(k.head_dim) * a,
        Op::Add => 3.0 * f(k.num_tokens) * f(k.hidden) * a,
        Op::Embedding => 2.0 * f(k.num_tokens) * f(k.hidden) * a,
        // fp32 logits over the vocabulary (hidden = vocab size) read once.
        Op::Sampling => f(k.num_tokens) * f(k.hidden) * 4.0,
        Op::Copy => 2.0 * f(k.bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_counts() {
        let k = Kernel::gemm(Dtype::Bf16, 8192, 8192, 8192);
        assert_eq!(flops(&k), 2.0 * 8192f64.powi(3));
        assert_eq!(bytes(&k), 3.0 * 8192f64 * 8192.0 * 2.0);
    }

    #[test]
    fn causal_pairs_match_brute_force() {
        for (s, p, w) in [(7u64, 0u64, 0u64), (7, 5, 0), (10, 3, 4), (10, 0, 4), (3, 10, 4), (16, 16, 64)] {
            let brute: u64 = (0..s).map(|i| if w == 0 { p + i + 1 } else { (p + i + 1).min(w) }).sum();
            assert_eq!(causal_pairs(s, p, w), brute as f64, "s={s} p={p} w={w}");
        }
    }

    #[test]
    fn decode_reads_the_kv_cache() {
        let mut k = Kernel::new(Op::AttnDecode, Dtype::Bf16);
        (k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim) = (64, 4096, 32, 8, 128);
        let kv = 64.0 * 4096.0 * 8.0 * 128.0 * 2.0 * 2.0;
        let qo = 2.0 * 64.0 * 32.0 * 128.0 * 2.0;
        assert_eq!(bytes(&k), kv + qo);
        k.window = 1024;
        assert_eq!(bytes(&k), kv / 4.0 + qo);
    }

    #[test]
    fn mla_prefill_counts_the_mha_form() {
        let mut k = Kernel::new(Op::MlaPrefill, Dtype::Bf16);
        (k.batch, k.seq_len, k.num_heads, k.num_kv_heads, k.head_dim) = (1, 1024, 128, 1, 576);
        // DeepSeek-V3: QK over 192 dims, PV over 128, per head and causal pair.
        let pairs = 1024.0 * 1025.0 / 2.0;
        assert_eq!(flops(&k), 2.0 * 128.0 * (192.0 + 128.0) * pairs);
    }

    #[test]
    fn mla_module_projections_of_deepseek_v3() {
        // Decode, 4 sequences, 16 heads, bf16 linears. Per token: fused q_a+kv_a 7168 x 2112,
        // q_b 1536 x 16*192, o_proj 16*128 x 7168, absorbed W_UK / W_UV 16 x (128 x 512) each.
        let mut k = Kernel::new(Op::MlaDecode, Dtype::Bf16);
        (k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim) = (4, 1024, 16, 1, 576);
        let p = MlaModule::DEEPSEEK_V3.projections(&k, Dtype::Bf16);
        let fl: f64 = p.iter().map(|(g, n)| flops(g) * *n as f64).sum();
        let per_token = 7168.0 * 2112.0 + 1536.0 * 3072.0 + 2048.0 * 7168.0 + 2.0 * 16.0 * 128.0 * 512.0;
        assert_eq!(fl, 2.0 * 4.0 * per_token);
        let weights: f64 = p.iter().map(|(g, n)| (g.k * g.n * *n) as f64).sum();
        assert_eq!(weights, per_token);
        // Prefill decompresses each key's latent with kv_b (512 x 16*256): same per-token
        // weight count; fp8 linears halve the weight bytes of q_a, q_b, o and kv_b.
        let mut k = Kernel::new(Op::MlaPrefill, Dtype::Bf16);
        (k.batch, k.seq_len, k.num_heads, k.num_kv_heads, k.head_dim) = (2, 512, 16, 1, 576);
        let p = MlaModule::DEEPSEEK_V3.projections(&k, Dtype::Fp8);
        let fl: f64 = p.iter().map(|(g, n)| flops(g) * *n as f64).sum();
        assert_eq!(fl, 2.0 * 1024.0 * per_token);
        assert!(p.iter().all(|(g, _)| g.dtype == Dtype::Fp8));
    }

    #[test]
    fn uniform_routing_under_ep_prices_the_busiest_shard() {
        use rand::{seq::index::sample, SeedableRng};
        assert_eq!(expected_max_of_std_normals(1), 0.0);
        assert!((expected_max_of_std_normals(2) - 1.0 / std::f64::consts::PI.sqrt()).abs() < 1e-6);
        assert!((expected_max_of_std_normals(4) - 1.029375).abs() < 1e-5);
        // Monte Carlo: each token takes k distinct experts uniformly; the busiest shard by
        // assignments, and its distinct experts, averaged over draws.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (tokens, topk, experts, ep) in [(1usize, 8usize, 256usize, 4usize), (4, 8, 256, 4), (16, 8, 256, 4), (64, 8, 256, 8), (512, 8, 256, 4), (32, 4, 128, 2)] {
            let local = experts / ep;
            let draws = 4000;
            let (mut sum_assign, mut sum_active) = (0.0, 0.0);
            for _ in 0..draws {
                let mut counts = vec![0usize; experts];
                for _ in 0..tokens {
                    sample(&mut rng, experts, topk).iter().for_each(|x| counts[x] += 1);
                }
                let busiest = (0..ep).max_by_key(|s| counts[s * local..(s + 1) * local].iter().sum::<usize>()).unwrap();
                let shard = &counts[busiest * local..(busiest + 1) * local];
                sum_assign += shard.iter().sum::<usize>() as f64;
                sum_active += shard.iter().filter(|c| **c > 0).count() as f64;
            }
            let (t, k, e, p) = (tokens as f64, topk as f64, experts as f64, ep as f64);
            let (mc_assign, mc_active) = (sum_assign / draws as f64, sum_active / draws as f64);
            let assign = Routing::UniformBusiest.local_assignments(t, k, e, p);
            let active = Routing::UniformBusiest.local_active_experts(t, k, e, p);
            assert!((assign / mc_assign - 1.0).abs() < 0.06, "T={tokens} ep={ep}: {assign} vs {mc_assign}");
            assert!((active / mc_active - 1.0).abs() < 0.06, "T={tokens} ep={ep}: {active} vs {mc_active}");
            // Above the mean shard wherever the shards can differ; a kernel's own expected work
            // (`Uniform`) stays the mean shard's.
            assert!(assign > t * k / p);
            assert_eq!(Routing::Uniform.local_assignments(t, k, e, p), t * k / p);
        }
        // One shard holds everything: the plain expectation.
        assert_eq!(Routing::UniformBusiest.local_assignments(16.0, 8.0, 256.0, 1.0), 128.0);
        assert_eq!(Routing::parse_served("uniform"), Ok(Routing::UniformBusiest));
        assert_eq!(Routing::UniformBusiest.served_name(), "uniform");
    }

    #[test]
    fn moe_reads_only_active_experts() {
        let mut k = Kernel::new(Op::Moe, Dtype::Bf16);
        (k.num_tokens, k.hidden, k.inter, k.topk, k.num_experts) = (1, 4096, 1024, 2, 64);
        // One token routed to 2 experts reads ~2 experts' weights (expected distinct ~1.98).
        let one_expert = 3.0 * 4096.0 * 1024.0 * 2.0;
        let b = bytes(&k);
        assert!(b > 1.9 * one_expert && b < 2.1 * one_expert, "{b}");
        k.num_tokens = 100_000;
        assert!(bytes(&k) > 63.9 * one_expert);
    }

    #[test]
    fn balanced_routing_reads_every_expert_it_can_reach() {
        // 128 experts, top-4: 32 tokens make 128 assignments. Balanced routing (the collectors')
        // hits all 128 experts; uniform routing ~81 (128 * (1 - (127/128)^128)).
        let mut k = Kernel::new(Op::Moe, Dtype::Bf16);
        (k.num_tokens, k.hidden, k.inter, k.topk, k.num_experts, k.tp, k.ep) = (32, 2880, 2880, 4, 128, 1, 1);
        let one_expert = 3.0 * 2880.0 * 2880.0 * 2.0;
        let io = 2.0 * 32.0 * 2880.0 * 2.0;
        assert_eq!(bytes_routed(&k, Routing::Balanced), 128.0 * one_expert + io);
        let uniform = (bytes_routed(&k, Routing::Uniform) - io) / one_expert;
        assert!((uniform - 81.1).abs() < 0.1, "{uniform}");
        // Few assignments: balanced hits one expert per assignment; with expert parallelism
        // each GPU holds 128/8 experts and gets 1/8 of the assignments.
        k.num_tokens = 3;
        assert_eq!(bytes_routed(&k, Routing::Balanced), 12.0 * one_expert + 2.0 * 3.0 * 2880.0 * 2.0);
        (k.num_tokens, k.ep) = (64, 8);
        assert_eq!(Routing::Balanced.local_active_experts(64.0, 4.0, 128.0, 8.0), 16.0);
        // Many tokens: both read every expert.
        k.num_tokens = 100_000;
        let (b, u) = (bytes_routed(&k, Routing::Balanced), bytes_routed(&k, Routing::Uniform));
        assert!((b - u).abs() < 1e-6 * b, "{b} {u}");
    }

    #[test]
    fn power_law_loads_put_more_than_a_share_on_the_busiest_shard() {
        let pl = Routing::PowerLawLoads { alpha_centi: 120 };
        // One shard: every assignment is local, whatever the draw.
        let all = pl.local_assignments(4096.0, 8.0, 256.0, 1.0);
        assert!((all / (4096.0 * 8.0) - 1.0).abs() < 0.01, "{all}");
        // Eight shards: the busiest holds well over its eighth, never more than everything.
        for (t, e) in [(8192.0, 256.0), (1024.0, 128.0), (64.0, 128.0)] {
            let busiest = pl.local_assignments(t, 8.0, e, 8.0);
            let share = t * 8.0 / 8.0;
            assert!(busiest > 1.3 * share && busiest < 8.0 * share, "T={t} E={e}: {busiest} vs share {share}");
        }
        // Other routings keep the even share.
        assert_eq!(Routing::Balanced.local_assignments(64.0, 8.0, 128.0, 8.0), 64.0);
        // A decode token reads at most its k experts; skew leaves some shard experts idle.
        let active = pl.local_active_experts(1.0, 8.0, 128.0, 1.0);
        assert!(active > 1.0 && active <= 8.5, "{active}");
        // Deterministic: the cache and a fresh draw agree.
        assert_eq!(pl.local_assignments(8192.0, 8.0, 256.0, 8.0), pl.local_assignments(8192.0, 8.0, 256.0, 8.0));
    }

    #[test]
    fn power_law_routing_reads_fewer_experts_than_uniform() {
        let pl = Routing::PowerLaw { alpha_centi: 120 };
        // One token always reads exactly its k distinct experts.
        assert!((pl.local_active_experts(1.0, 8.0, 128.0, 1.0) - 8.0).abs() < 1e-9);
        // Skew concentrates tokens: 16 tokens x top-8 of 128 hit fewer experts than uniform
        // routing (~81), and the count grows with the tokens towards all 128.
        let (a16, a1k) = (pl.local_active_experts(16.0, 8.0, 128.0, 1.0), pl.local_active_experts(1024.0, 8.0, 128.0, 1.0));
        let u16 = Routing::Uniform.local_active_experts(16.0, 8.0, 128.0, 1.0);
        assert!(a16 < 0.8 * u16 && a16 > 8.0, "{a16} vs uniform {u16}");
        assert!(a1k > a16 && a1k <= 128.0, "{a1k}");
        // Expert parallelism: each shard holds its share of the expectation.
        assert!((pl.local_active_experts(16.0, 8.0, 128.0, 8.0) - a16 / 8.0).abs() < 1e-9);
        // No skew is uniform routing with k distinct picks per token: 1 - (1 - k/E)^T per expert.
        let flat = Routing::PowerLaw { alpha_centi: 0 }.local_active_experts(16.0, 8.0, 128.0, 1.0);
        assert!((flat - 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powi(16))).abs() < 1e-6, "{flat}");
    }

    #[test]
    fn padding_follows_how_counts_fall_against_the_tiles() {
        // 8,192 tokens x top-8 of 256 experts on 4 shards: 256 rows per expert when balanced,
        // whole 64- and 128-row tiles; scattered counts spill experts into one more tile.
        let balanced = Routing::Balanced.padding_ratios(8192.0, 8.0, 256.0, 4.0);
        assert_eq!(balanced, [1.0, 1.0, 1.0]);
        let uniform = Routing::Uniform.padding_ratios(8192.0, 8.0, 256.0, 4.0);
        assert!(uniform[2] > 1.15 && uniform[2] < 1.35, "{uniform:?}");
        // aiconfigurator's power law leaves many experts a few tokens each, a tile apiece.
        let skewed = Routing::PowerLawLoads { alpha_centi: 101 }.padding_ratios(8192.0, 8.0, 256.0, 4.0);
        assert!(skewed[2] > uniform[2], "{skewed:?} vs {uniform:?}");
        // Decode: 32 picks on 256 experts, nearly one token per expert hit, a whole tile each.
        let decode = Routing::Uniform.padding_ratios(4.0, 8.0, 256.0, 1.0);
        // (k distinct picks per token: an expert is hit with probability 1 - (1 - k/E)^T.)
        let one_tile_each = 128.0 * 256.0 * (1.0 - (1.0 - 8.0 / 256.0f64).powi(4)) / 32.0;
        assert!((decode[2] / one_tile_each - 1.0).abs() < 0.01, "{decode:?} vs {one_tile_each}");
    }
}
