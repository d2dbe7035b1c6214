//! Attention: gqa_paged, gqa_ragged, mla_paged, mla_ragged (decode and causal prefill) and
//! dsa_paged (sparse attention and its top-k indexer).
//!
//! Invariants the lower bound relies on (FlashInfer semantics): every request of a prefill has
//! at least one query token and kv_len >= qo_len (the new tokens' keys are in the cache); a KV
//! page belongs to one request. Rows whose axes contradict the first are flagged and bounded
//! by a weaker rule that needs only qo_len >= 1.

use super::{narrowest, Counts, Ctx, WorkCost};
use crate::headroom::bound::OpClass;
use anyhow::{bail, Result};

/// Per-(query, key)-pair FLOPs, KV bytes per cached token, and the cache tensors.
struct Geometry {
    flops_per_pair: f64,
    kv_bytes_per_token: f64,
    caches: [&'static str; 2],
    query: &'static str,
}

fn geometry(c: &Ctx) -> Result<Geometry> {
    let op = c.def.op_type.as_str();
    Ok(match op {
        "gqa_paged" | "gqa_ragged" => {
            let (h, hk, d) = (c.axis("num_qo_heads")?, c.axis("num_kv_heads")?, c.axis("head_dim")?);
            let caches = if op == "gqa_paged" { ["k_cache", "v_cache"] } else { ["k", "v"] };
            let kvb = c.elem_bytes(caches[0], c.tensor(caches[0])?) + c.elem_bytes(caches[1], c.tensor(caches[1])?);
            // QK^T and PV: 2 FLOPs per multiply-add each, over head_dim.
            Geometry { flops_per_pair: 4.0 * h * d, kv_bytes_per_token: hk * d * kvb, caches, query: "q" }
        }
        "mla_paged" => {
            let (h, ckv, kpe) = (c.axis("num_qo_heads")?, c.axis("head_dim_ckv")?, c.axis("head_dim_kpe")?);
            let kvb = ckv * c.elem_bytes("ckv_cache", c.tensor("ckv_cache")?)
                + kpe * c.elem_bytes("kpe_cache", c.tensor("kpe_cache")?);
            // Absorbed MLA: scores over ckv + kpe, values are the ckv latent.
            Geometry {
                flops_per_pair: 2.0 * h * (ckv + kpe) + 2.0 * h * ckv,
                kv_bytes_per_token: kvb,
                caches: ["ckv_cache", "kpe_cache"],
                query: "q_nope",
            }
        }
        "mla_ragged" => {
            let (h, hk) = (c.axis("num_qo_heads")?, c.axis("num_kv_heads")?);
            let (qk, vo) = (c.axis("qk_dim")?, c.axis("vo_dim")?);
            let kvb = hk * (qk * c.elem_bytes("k", c.tensor("k")?) + vo * c.elem_bytes("v", c.tensor("v")?));
            Geometry { flops_per_pair: 2.0 * h * (qk + vo), kv_bytes_per_token: kvb, caches: ["k", "v"], query: "q" }
        }
        other => bail!("'{other}' is not a dense attention op type"),
    })
}

/// Cached tokens a paged request set holds: N page indices of P tokens over B requests, the
/// last page of each request holding 1..=P tokens. Returns (fewest possible, typical).
fn paged_tokens(n: f64, p: f64, b: f64) -> (f64, f64) {
    let last_pages = b.min(n);
    (n * p - last_pages * (p - 1.0), n * p - last_pages * (p - 1.0) / 2.0)
}

fn tri(x: f64) -> f64 {
    x * (x + 1.0) / 2.0
}

/// Sum of tri(part) when `x` is split into `n` parts as evenly as integers allow (no parts
/// can hold nothing but 0).
fn even_tri(x: u64, n: u64) -> f64 {
    if n == 0 {
        return if x == 0 { 0.0 } else { f64::INFINITY };
    }
    let (base, r) = (x / n, x % n);
    r as f64 * tri(base as f64 + 1.0) + (n - r) as f64 * tri(base as f64)
}

/// Causal (query, key) pairs of a prefill batch known only by totals: `b` requests, `q` query
/// tokens, `k` KV tokens. A request with q_i queries and kv_i >= q_i keys has
/// q_i (kv_i - q_i) + q_i (q_i + 1) / 2 pairs. Returns (minimum over all splits, equal split,
/// whether the totals admit kv_i >= q_i >= 1).
pub fn prefill_pairs(b: u64, q: u64, k: u64) -> (f64, f64, bool) {
    if b == 0 || q == 0 {
        return (0.0, 0.0, b <= q);
    }
    let consistent = b <= q && q <= k;
    let (bf, qf, kf) = (b as f64, q as f64, k.max(q) as f64);
    let nominal = bf * ((qf / bf) * (kf / bf - qf / bf) + tri(qf / bf));
    if !consistent {
        // Only q_i >= 1 holds: each request's last query sees all its keys.
        let lower = if b <= q { k as f64 } else { 0.0 };
        return (lower, nominal, false);
    }
    // The extra keys k - q go to the request with the fewest queries m; the other requests
    // share q - m as evenly as possible (convex cost). Minimize over m.
    let extra = (k - q) as f64;
    let lower = (1..=q / b)
        .map(|m| tri(m as f64) + even_tri(q - m, b - 1) + extra * m as f64)
        .fold(f64::INFINITY, f64::min);
    (lower, nominal, true)
}

pub(super) fn dense(c: &Ctx) -> Result<WorkCost> {
    let g = geometry(c)?;
    let paged = c.def.op_type.ends_with("_paged");
    let prefill = c.has("qo_indptr");
    let mut notes = Vec::new();
    let mut missing = Vec::new();

    let requests = if prefill {
        let len = c.axis("len_indptr")?;
        if len < 1.0 {
            bail!("workload axis 'len_indptr' = {len} must be >= 1 (batch_size + 1)");
        }
        len - 1.0
    } else {
        c.axis("batch_size")?
    };
    if let (Some(bs), Some(len)) = (c.shape.opt("batch_size"), c.shape.opt("len_indptr")) {
        if len != bs + 1 {
            bail!("workload axes contradict the constraint len_indptr == batch_size + 1 (len_indptr = {len}, batch_size = {bs})");
        }
    }

    // Cached tokens (fewest possible, typical).
    let (kv_lo, kv_nom) = if paged {
        let (n, p) = (c.axis("num_kv_indices")?, c.axis("page_size")?);
        let (lo, nom) = paged_tokens(n, p, requests);
        if p > 1.0 {
            missing.push(c.missing(&["kv_last_page_len"], "valid tokens in each request's last page; the bound assumes 1, nominal half a page"));
        }
        notes.push("assumes no KV page is shared between requests (no prefix-sharing kernel)".into());
        (lo, nom)
    } else {
        let k = c.axis("total_kv")?;
        (k, k)
    };

    let (pairs_lo, pairs_nom) = if prefill {
        let q = c.axis("total_q")?;
        let (lo, nom, consistent) = prefill_pairs(requests as u64, q as u64, kv_lo as u64);
        let nom = nom.max(prefill_pairs(requests as u64, q as u64, kv_nom as u64).1);
        if !consistent {
            notes.push(format!(
                "axes inconsistent with causal prefill: {requests} requests, total_q = {q}, KV tokens >= {kv_lo}; \
                 FlashInfer needs kv_len >= qo_len >= 1 per request (pages probably captured at another \
                 page size); the bound uses only qo_len >= 1"
            ));
        }
        if requests > 1.0 {
            missing.push(c.missing(&["qo_indptr", "kv_indptr"], "per-request query and KV lengths; the bound takes the split with the least causal work, nominal an equal split"));
        }
        (lo, nom)
    } else {
        // Decode: one query per request attends every cached token of its request.
        (kv_lo, kv_nom)
    };

    let io = c.io_bytes_except(&g.caches);
    let class = if prefill { OpClass::AttentionPrefill } else { OpClass::AttentionDecode };
    let dtype = narrowest(c.dtype(g.query)?, c.dtype(g.caches[0])?);
    Ok(WorkCost {
        class,
        compute_dtype: dtype,
        lower: Counts { flops: g.flops_per_pair * pairs_lo, bytes: io + kv_lo * g.kv_bytes_per_token },
        nominal: Counts { flops: g.flops_per_pair * pairs_nom, bytes: io + kv_nom * g.kv_bytes_per_token },
        notes,
        missing,
    })
}

/// DeepSeek sparse attention: each token attends up to `topk` selected cached tokens
/// (sparse_indices, -1 = padding); the indexer scores every cached token of each request.
pub(super) fn dsa(c: &Ctx) -> Result<WorkCost> {
    if c.has("sparse_indices") {
        let t = c.axis("num_tokens")?;
        let (h, ckv, kpe) = (c.axis("num_qo_heads")?, c.axis("head_dim_ckv")?, c.axis("head_dim_kpe")?);
        let topk = c.axis("topk")?;
        let pool = c.axis("num_pages")? * c.axis("page_size")?;
        let kvb = ckv * c.elem_bytes("ckv_cache", c.tensor("ckv_cache")?)
            + kpe * c.elem_bytes("kpe_cache", c.tensor("kpe_cache")?);
        let per_pair = 2.0 * h * (ckv + kpe) + 2.0 * h * ckv;
        let io = c.io_bytes_except(&["ckv_cache", "kpe_cache"]);
        let distinct_nom = if pool > 0.0 { (t * topk).min(pool) } else { t * topk };
        return Ok(WorkCost {
            class: OpClass::AttentionDecode,
            compute_dtype: narrowest(c.dtype("q_nope")?, c.dtype("ckv_cache")?),
            lower: Counts { flops: per_pair * t, bytes: io + kvb },
            nominal: Counts { flops: per_pair * t * topk, bytes: io + distinct_nom * kvb },
            notes: vec!["bound: one valid index per token (itself); nominal: all topk valid and distinct across tokens".into()],
            missing: vec![c.missing(&["sparse_indices"], "valid indices per token and their overlap across tokens")],
        });
    }
    // Top-k indexer: scores = sum_h w_h relu(q_h . k_t) over each request's seq_len tokens.
    let b = c.axis("batch_size")?;
    let (hi, d) = (c.axis("num_index_heads")?, c.axis("index_head_dim")?);
    let (p, max_pages) = (c.axis("page_size")?, c.axis("max_num_pages")?);
    let cache = "k_index_cache_fp8";
    let token_bytes = c.axis("head_dim_with_scale")? * c.axis("kv_cache_num_heads")? * c.elem_bytes(cache, c.tensor(cache)?);
    let table_entry = c.elem_bytes("block_table", c.tensor("block_table")?);
    let io = c.io_bytes_except(&[cache, "block_table"]);
    let tokens_nom = b * ((max_pages - 0.5) * p).max(1.0);
    let per_token = 2.0 * hi * d;
    Ok(WorkCost {
        class: OpClass::AttentionDecode,
        compute_dtype: c.dtype("q_index_fp8")?,
        lower: Counts { flops: per_token * b, bytes: io + b * (token_bytes + table_entry) },
        nominal: Counts {
            flops: per_token * tokens_nom,
            bytes: io + tokens_nom * token_bytes + b * max_pages * table_entry,
        },
        notes: vec![format!(
            "bound: one cached token per request; nominal: every request {}-{} tokens long (block_table width)",
            ((max_pages - 1.0) * p) as u64,
            (max_pages * p) as u64
        )],
        missing: vec![c.missing(&["seq_lens"], "per-request context lengths")],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: minimum causal pairs over every split of q queries and k keys into b
    /// requests with kv_i >= q_i >= 1.
    fn brute(b: u64, q: u64, k: u64) -> f64 {
        fn rec(b: u64, q: u64, k: u64) -> f64 {
            if b == 1 {
                return if k >= q && q >= 1 { (q * (k - q)) as f64 + tri(q as f64) } else { f64::INFINITY };
            }
            let mut best = f64::INFINITY;
            for qi in 1..=q.saturating_sub(b - 1) {
                for ki in qi..=k {
                    let here = (qi * (ki - qi)) as f64 + tri(qi as f64);
                    best = best.min(here + rec(b - 1, q - qi, k - ki));
                }
            }
            best
        }
        rec(b, q, k)
    }

    #[test]
    fn prefill_pairs_minimum_matches_brute_force() {
        for (b, q, k) in [(1, 5, 5), (1, 4, 9), (2, 6, 6), (2, 6, 10), (3, 7, 12), (3, 9, 9), (4, 9, 20), (2, 2, 15)] {
            let (lo, nom, ok) = prefill_pairs(b, q, k);
            assert!(ok);
            assert_eq!(lo, brute(b, q, k), "b={b} q={q} k={k}");
            assert!(nom >= lo);
        }
    }

    #[test]
    fn single_request_prefill_is_exact() {
        // 34 new tokens on top of 0 cached: 34*35/2 pairs; with 10 cached: + 34*10.
        assert_eq!(prefill_pairs(1, 34, 34).0, 595.0);
        assert_eq!(prefill_pairs(1, 34, 44), (935.0, 935.0, true));
    }

    #[test]
    fn inconsistent_prefill_falls_back_to_last_query_rule() {
        // 16384 queries over 2 KV tokens in one request: FlashInfer would reject it.
        let (lo, _, ok) = prefill_pairs(1, 16384, 2);
        assert!(!ok);
        assert_eq!(lo, 2.0);
    }

    #[test]
    fn paged_tokens_count_partial_last_pages() {
        // 10 pages of 64 over 3 requests: at least 7 full pages + 3 one-token pages.
        assert_eq!(paged_tokens(10.0, 64.0, 3.0).0, 7.0 * 64.0 + 3.0);
        assert_eq!(paged_tokens(7.0, 1.0, 1.0), (7.0, 7.0));
    }
}
