//! Model architecture parsed from a Hugging Face `config.json` (dense, GQA, MoE, MLA, sliding
//! window, sinks, linear-attention hybrids), with parameter and KV-cache accounting.

use crate::schema::Dtype;
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// How one decoder layer attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttnKind {
    Full,
    Sliding { window: u64 },
    /// Linear attention / gated DeltaNet: fixed-size recurrent state, no KV growth.
    Linear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerSpec {
    pub attn: AttnKind,
    /// true: the MLP is a mixture of experts; false: dense MLP of `dense_inter` width.
    pub moe: bool,
}

/// Multi-head latent attention (DeepSeek-V2/V3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MlaSpec {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MoeSpec {
    pub num_experts: u64,
    pub topk: u64,
    /// Intermediate width of one routed expert.
    pub expert_inter: u64,
    /// Total intermediate width of the shared expert(s) (0 = none).
    pub shared_inter: u64,
    /// Experts carry biases (gpt-oss).
    pub expert_bias: bool,
    /// A sigmoid gate on the shared expert (Qwen-MoE style), one hidden-sized vector.
    pub shared_expert_gate: bool,
    /// Per-expert score-correction bias on the router (DeepSeek-V3 `noaux_tc` routing,
    /// MiniMax-M2 `use_routing_bias`).
    pub router_score_bias: bool,
    /// The router GEMM runs in fp32 on fp32 weights (vLLM's MiniMax-M2 gate).
    pub router_fp32: bool,
}

/// RMSNorm on queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    None,
    /// Over each head's vector, one weight of `head_dim` each for q and k (Qwen3, Gemma-3).
    PerHead,
    /// Over a token's whole query (and whole key) width, weights that wide (MiniMax-M2's
    /// `qk_norm_type = per_layer`): under tensor parallelism each rank holds a slice, so the
    /// sums of squares are all-reduced first (vLLM's `MiniMaxText01RMSNormTP`).
    WholeWidth,
}

/// Gated DeltaNet linear attention (Qwen3-Next).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinearAttnSpec {
    pub num_k_heads: u64,
    pub num_v_heads: u64,
    pub k_head_dim: u64,
    pub v_head_dim: u64,
    pub conv_kernel: u64,
}

/// Parameter counts by part of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ParamBreakdown {
    pub embedding: u64,
    /// 0 when the LM head is tied to the embedding.
    pub lm_head: u64,
    /// Attention (or linear-attention) blocks of all layers, biases, sinks and q/k norms included.
    pub attention: u64,
    /// Layer norms and the final norm.
    pub norms: u64,
    pub dense_mlp: u64,
    /// MoE layers: routers, shared experts and all routed experts.
    pub moe_total: u64,
    /// MoE layers: routers, shared experts and top-k routed experts.
    pub moe_active: u64,
}

impl ParamBreakdown {
    fn common(&self) -> u64 {
        self.embedding + self.lm_head + self.attention + self.norms + self.dense_mlp
    }
    pub fn total(&self) -> u64 {
        self.common() + self.moe_total
    }
    pub fn active(&self) -> u64 {
        self.common() + self.moe_active
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub model_type: String,
    pub hidden: u64,
    pub num_layers: u64,
    pub vocab: u64,
    pub num_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    /// Width of the dense MLP (layers without MoE).
    pub dense_inter: u64,
    pub tie_embeddings: bool,
    pub max_context: u64,
    pub attention_bias: bool,
    /// Output projection has a bias (gpt-oss).
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Per-head learned attention sinks (gpt-oss).
    pub attention_sinks: bool,
    pub qk_norm: QkNorm,
    /// Sigmoid output gate doubling the q projection (Qwen3-Next full-attention layers).
    pub attn_output_gate: bool,
    /// RMSNorms per decoder layer: 2 (pre-attention, pre-MLP), 4 in Gemma-2/3 (also post-).
    pub norms_per_layer: u64,
    pub layers: Vec<LayerSpec>,
    pub moe: Option<MoeSpec>,
    pub mla: Option<MlaSpec>,
    pub linear: Option<LinearAttnSpec>,
    /// Features present in the config that the counts and kernels do not model (rope scaling,
    /// partial rotary, MTP layers, vision tower, checkpoint quantization), for honest reporting.
    pub unmodelled: Vec<String>,
}

/// Reads fields of one HF config: the language-model object (`text_config` for multimodal
/// configs), falling back to the family's documented default where the Hub file omits a field.
struct Fields<'a> {
    cfg: &'a Value,
    root: &'a Value,
    model_type: String,
    origin: &'a str,
}

impl Fields<'_> {
    /// Defaults of the transformers config class for fields the published files leave out.
    /// Gemma-3's `config.json` omits these (values of `Gemma3TextConfig.__init__`).
    fn family_default(&self, key: &str) -> Option<Value> {
        if self.model_type != "gemma3_text" {
            return None;
        }
        match key {
            "vocab_size" => Some(262_208.into()),
            "max_position_embeddings" => Some(131_072.into()),
            "sliding_window_pattern" => Some(6.into()),
            "tie_word_embeddings" => Some(true.into()),
            _ => None,
        }
    }

    fn value(&self, key: &str) -> Option<Value> {
        match self.cfg.get(key) {
            Some(Value::Null) | None => self.family_default(key),
            Some(v) => Some(v.clone()),
        }
    }

    fn u64(&self, key: &str) -> Result<Option<u64>> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) => Ok(Some(x)),
                None => bail!("{}: field '{key}' must be a non-negative integer, got {v}", self.origin),
            },
        }
    }

    fn require(&self, key: &str) -> Result<u64> {
        match self.u64(key)? {
            None => bail!("{}: missing field '{key}'", self.origin),
            Some(0) => bail!("{}: field '{key}' must be a positive integer, got 0", self.origin),
            Some(x) => Ok(x),
        }
    }

    /// A boolean in the language-model object, else at the top level, else the family default.
    fn bool(&self, key: &str) -> Result<Option<bool>> {
        let v = match (self.cfg.get(key), self.root.get(key)) {
            (Some(v), _) if !v.is_null() => Some(v.clone()),
            (_, Some(v)) if !v.is_null() => Some(v.clone()),
            _ => self.family_default(key),
        };
        match v {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => bail!("{}: field '{key}' must be true or false, got {v}", self.origin),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.cfg.get(key).map(|v| !v.is_null()).unwrap_or(false)
    }
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json`. `name` is the model's short name; `origin` (a file
    /// name) prefixes every error.
    pub fn from_hf_json(text: &str, name: &str, origin: &str) -> Result<ModelConfig> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| anyhow!("{origin}: malformed JSON: {e}"))?;
        if !root.is_object() {
            bail!("{origin}: expected a JSON object (a Hugging Face config.json)");
        }
        // Multimodal configs (Gemma-3) nest the language model under text_config.
        let cfg = root.get("text_config").filter(|v| v.is_object()).unwrap_or(&root);
        let model_type = cfg
            .get("model_type")
            .or_else(|| root.get("model_type"))
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_string();
        let f = Fields { cfg, root: &root, model_type: model_type.clone(), origin };
        let hidden = f.require("hidden_size")?;
        let num_layers = f.require("num_hidden_layers")?;
        let vocab = f.require("vocab_size")?;
        let num_heads = f.require("num_attention_heads")?;
        let num_kv_heads = f.u64("num_key_value_heads")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            bail!(
                "{origin}: field 'num_key_value_heads' = {num_kv_heads} must be positive and divide \
                 num_attention_heads = {num_heads}"
            );
        }
        let head_dim = f.u64("head_dim")?.filter(|&d| d > 0).unwrap_or(hidden / num_heads);
        let dense_inter = f.u64("intermediate_size")?.unwrap_or(4 * hidden);
        let tie_embeddings = f.bool("tie_word_embeddings")?.unwrap_or(false);
        let max_context = f.u64("max_position_embeddings")?.unwrap_or(4096);

        // MoE: the field names differ per family.
        let num_experts = match f.u64("n_routed_experts")? {
            Some(n) => n,
            None => match f.u64("num_local_experts")? {
                Some(n) => n,
                None => f.u64("num_experts")?.unwrap_or(0),
            },
        };
        let moe = if num_experts > 1 {
            let topk = match f.u64("num_experts_per_tok")? {
                Some(k) => k,
                None => f
                    .u64("experts_per_token")?
                    .ok_or_else(|| anyhow!("{origin}: MoE model lacks field 'num_experts_per_tok'"))?,
            };
            if topk == 0 || topk > num_experts {
                bail!("{origin}: field 'num_experts_per_tok' = {topk} must be in 1..={num_experts}");
            }
            let expert_inter = f.u64("moe_intermediate_size")?.unwrap_or(dense_inter);
            let n_shared = f.u64("n_shared_experts")?.unwrap_or(0);
            let shared_inter = match f.u64("shared_expert_intermediate_size")? {
                Some(s) => s,
                None => n_shared * expert_inter,
            };
            Some(MoeSpec {
                num_experts,
                topk,
                expert_inter,
                shared_inter,
                expert_bias: model_type == "gpt_oss",
                shared_expert_gate: f.has("shared_expert_intermediate_size"),
                router_score_bias: cfg.get("topk_method").and_then(|v| v.as_str()) == Some("noaux_tc")
                    || f.bool("use_routing_bias")?.unwrap_or(false),
                router_fp32: model_type == "minimax_m2",
            })
        } else {
            None
        };

        let mla = match f.u64("kv_lora_rank")? {
            Some(kv_lora_rank) if kv_lora_rank > 0 => Some(MlaSpec {
                q_lora_rank: f.u64("q_lora_rank")?.filter(|&r| r > 0),
                kv_lora_rank,
                qk_nope_head_dim: f.require("qk_nope_head_dim")?,
                qk_rope_head_dim: f.require("qk_rope_head_dim")?,
                v_head_dim: f.require("v_head_dim")?,
            }),
            _ => None,
        };

        let linear = match f.u64("linear_num_value_heads")? {
            Some(nv) => Some(LinearAttnSpec {
                num_k_heads: f.require("linear_num_key_heads")?,
                num_v_heads: nv,
                k_head_dim: f.require("linear_key_head_dim")?,
                v_head_dim: f.require("linear_value_head_dim")?,
                conv_kernel: f.u64("linear_conv_kernel_dim")?.unwrap_or(4),
            }),
            None => None,
        };

        let layers = parse_layers(&f, num_layers, moe.is_some(), linear.is_some())?;
        let gemma = model_type.starts_with("gemma");
        Ok(ModelConfig {
            name: name.to_string(),
            model_type: model_type.clone(),
            hidden,
            num_layers,
            vocab,
            num_heads,
            num_kv_heads,
            head_dim,
            dense_inter,
            tie_embeddings,
            max_context,
            attention_bias: f.bool("attention_bias")?.unwrap_or(model_type == "qwen2"),
            o_bias: model_type == "gpt_oss",
            mlp_bias: f.bool("mlp_bias")?.unwrap_or(false),
            attention_sinks: model_type == "gpt_oss",
            qk_norm: match model_type.as_str() {
                "qwen3" | "qwen3_moe" | "qwen3_next" | "gemma3_text" | "gemma3" => QkNorm::PerHead,
                "minimax_m2" if f.bool("use_qk_norm")?.unwrap_or(false) => QkNorm::WholeWidth,
                _ => QkNorm::None,
            },
            attn_output_gate: f.bool("attn_output_gate")?.unwrap_or(model_type == "qwen3_next"),
            norms_per_layer: if gemma { 4 } else { 2 },
            layers,
            moe,
            mla,
            linear,
            unmodelled: unmodelled_features(&f),
        })
    }

    /// Loads a model by short name (embedded `models/NAME.json`) or from a `config.json` path.
    pub fn load(name_or_path: &str) -> Result<ModelConfig> {
        let p = Path::new(name_or_path);
        if name_or_path.ends_with(".json") || p.is_file() {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading model config {name_or_path}"))?;
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .filter(|s| s != "config")
                .or_else(|| p.parent().and_then(|d| d.file_name()).map(|s| s.to_string_lossy().to_lowercase()))
                .unwrap_or_else(|| "custom".into());
            return ModelConfig::from_hf_json(&text, &stem, name_or_path);
        }
        let wanted = name_or_path.to_ascii_lowercase();
        for (file, text) in EMBEDDED_MODELS {
            if file.trim_end_matches(".json") == wanted {
                return ModelConfig::from_hf_json(text, &wanted, &format!("models/{file}"));
            }
        }
        bail!(
            "unknown model '{name_or_path}'; known: {} (or give a path to a Hugging Face config.json)",
            builtin_model_names().join(", ")
        )
    }

    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.layers[i].moe
    }

    /// Width of the attention output before o_proj.
    pub fn q_width(&self) -> u64 {
        match &self.mla {
            Some(m) => self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.num_heads * self.head_dim,
        }
    }

    fn attention_params(&self, kind: AttnKind) -> u64 {
        let h = self.hidden;
        if kind == AttnKind::Linear {
            let l = self.linear.as_ref().expect("linear layer without linear spec");
            let key = l.num_k_heads * l.k_head_dim;
            let val = l.num_v_heads * l.v_head_dim;
            let in_proj = h * (2 * key + 2 * val) + h * 2 * l.num_v_heads;
            let conv = (2 * key + val) * l.conv_kernel;
            let per_head = 2 * l.num_v_heads; // dt_bias, A_log
            return in_proj + conv + per_head + l.v_head_dim + val * h;
        }
        if let Some(m) = &self.mla {
            let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
            let q = match m.q_lora_rank {
                Some(r) => h * r + r + r * self.num_heads * qk,
                None => h * self.num_heads * qk,
            };
            let kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank;
            let kv_b = m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim);
            let o = self.num_heads * m.v_head_dim * h;
            return q + kv_a + kv_b + o;
        }
        let q_out = self.num_heads * self.head_dim * if self.attn_output_gate { 2 } else { 1 };
        let kv_out = 2 * self.num_kv_heads * self.head_dim;
        let mut p = h * (q_out + kv_out) + self.num_heads * self.head_dim * h;
        if self.attention_bias {
            p += q_out + kv_out;
        }
        if self.o_bias {
            p += h;
        }
        p += match self.qk_norm {
            QkNorm::None => 0,
            QkNorm::PerHead => 2 * self.head_dim,
            QkNorm::WholeWidth => (self.num_heads + self.num_kv_heads) * self.head_dim,
        };
        if self.attention_sinks {
            p += self.num_heads;
        }
        p
    }

    fn mlp_params(&self, moe_layer: bool) -> (u64, u64) {
        let h = self.hidden;
        if !moe_layer {
            let p = 3 * h * self.dense_inter + if self.mlp_bias { 2 * self.dense_inter + h } else { 0 };
            return (p, p);
        }
        let m = self.moe.as_ref().expect("moe layer without moe spec");
        let per_expert = 3 * h * m.expert_inter + if m.expert_bias { 2 * m.expert_inter + h } else { 0 };
        let router_bias = if m.expert_bias || m.router_score_bias { m.num_experts } else { 0 };
        let router = h * m.num_experts + router_bias;
        let shared = 3 * h * m.shared_inter + if m.shared_expert_gate { h } else { 0 };
        let total = router + shared + m.num_experts * per_expert;
        let active = router + shared + m.topk * per_expert;
        (total, active)
    }

    /// Parameters by part, language model only (MTP layers and vision towers excluded).
    pub fn param_breakdown(&self) -> ParamBreakdown {
        let mut b = ParamBreakdown {
            embedding: self.embedding_params(),
            lm_head: if self.tie_embeddings { 0 } else { self.vocab * self.hidden },
            norms: self.hidden, // final norm
            ..ParamBreakdown::default()
        };
        for l in &self.layers {
            b.attention += self.attention_params(l.attn);
            b.norms += self.norms_per_layer * self.hidden;
            let (total, active) = self.mlp_params(l.moe);
            if l.moe {
                b.moe_total += total;
                b.moe_active += active;
            } else {
                b.dense_mlp += total;
            }
        }
        b
    }

    /// (total, active-per-token) parameter counts. Active counts every non-expert parameter
    /// (both embedding tables included) plus the shared and top-k routed experts.
    pub fn param_counts(&self) -> (u64, u64) {
        let b = self.param_breakdown();
        (b.total(), b.active())
    }

    pub fn total_params(&self) -> u64 {
        self.param_counts().0
    }

    /// Parameters of the input embedding table (shared with the LM head when tied).
    pub fn embedding_params(&self) -> u64 {
        self.vocab * self.hidden
    }

    /// KV-cache bytes one token adds in one layer of this kind (0 for linear layers).
    pub fn kv_bytes_per_token_layer(&self, kind: AttnKind, kv_dtype: Dtype) -> f64 {
        match (kind, &self.mla) {
            (AttnKind::Linear, _) => 0.0,
            (_, Some(m)) => (m.kv_lora_rank + m.qk_rope_head_dim) as f64 * kv_dtype.bytes(),
            _ => (2 * self.num_kv_heads * self.head_dim) as f64 * kv_dtype.bytes(),
        }
    }

    /// KV bytes per token summed over all layers (no window capping).
    pub fn kv_bytes_per_token(&self, kv_dtype: Dtype) -> f64 {
        self.layers.iter().map(|l| self.kv_bytes_per_token_layer(l.attn, kv_dtype)).sum()
    }

    /// KV bytes one sequence of `context_tokens` holds: sliding layers keep at most `window`
    /// tokens, linear layers none (their fixed state is `linear_state_bytes_per_seq`).
    pub fn kv_bytes_per_seq(&self, context_tokens: u64, kv_dtype: Dtype) -> f64 {
        self.layers
            .iter()
            .map(|l| {
                let kept = match l.attn {
                    AttnKind::Sliding { window } => context_tokens.min(window),
                    _ => context_tokens,
                };
                kept as f64 * self.kv_bytes_per_token_layer(l.attn, kv_dtype)
            })
            .sum()
    }

    /// Short description of the layer mix, e.g. "12 full + 12 sliding(128)" or "61 MLA".
    pub fn attention_mix_label(&self) -> String {
        let (full, sliding, linear) = self.attention_mix();
        let mut parts = Vec::new();
        if full > 0 {
            parts.push(format!("{full} {}", if self.mla.is_some() { "MLA" } else { "full" }));
        }
        if sliding > 0 {
            let mut windows: Vec<u64> = self
                .layers
                .iter()
                .filter_map(|l| match l.attn {
                    AttnKind::Sliding { window } => Some(window),
                    _ => None,
                })
                .collect();
            windows.sort_unstable();
            windows.dedup();
            let w: Vec<String> = windows.iter().map(|w| w.to_string()).collect();
            parts.push(format!("{sliding} sliding({})", w.join(",")));
        }
        if linear > 0 {
            parts.push(format!("{linear} linear"));
        }
        parts.join(" + ")
    }

    /// Counts of (full, sliding, linear) attention layers.
    pub fn attention_mix(&self) -> (usize, usize, usize) {
        let count = |p: fn(&AttnKind) -> bool| self.layers.iter().filter(|l| p(&l.attn)).count();
        (
            count(|a| *a == AttnKind::Full),
            count(|a| matches!(a, AttnKind::Sliding { .. })),
            count(|a| *a == AttnKind::Linear),
        )
    }

    /// KV cache layer groups under vLLM's hybrid-allocator rule, as transformers' continuous
    /// batching groups them (`group_layers_by_attn_type`): every group holds layers of one
    /// attention kind and all groups have the same size, the gcd of the per-kind layer counts.
    /// The engine's per-request block bookkeeping runs once per group.
    pub fn kv_cache_groups(&self) -> u64 {
        self.kv_cache_groups_by_kind().iter().sum::<u64>().max(1)
    }

    /// The groups of `kv_cache_groups` per attention kind: [full, sliding, linear].
    pub fn kv_cache_groups_by_kind(&self) -> [u64; 3] {
        let (full, sliding, linear) = self.attention_mix();
        let counts = [full as u64, sliding as u64, linear as u64];
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        let size = counts.iter().copied().fold(0, gcd).max(1);
        counts.map(|c| c / size)
    }

    /// The longest sliding window of any layer (tokens); 0 without sliding layers.
    pub fn max_sliding_window(&self) -> u64 {
        self.layers.iter().filter_map(|l| if let AttnKind::Sliding { window } = l.attn { Some(window) } else { None }).max().unwrap_or(0)
    }

    /// Recurrent-state bytes per sequence for linear-attention layers (fp32 state + conv state).
    pub fn linear_state_bytes_per_seq(&self) -> f64 {
        let Some(l) = &self.linear else { return 0.0 };
        let n_linear = self.layers.iter().filter(|x| x.attn == AttnKind::Linear).count() as f64;
        let state = (l.num_v_heads * l.k_head_dim * l.v_head_dim) as f64 * 4.0;
        // The causal conv caches the last (kernel - 1) inputs of its q, k, v channels (bf16).
        let conv_dim = 2 * l.num_k_heads * l.k_head_dim + l.num_v_heads * l.v_head_dim;
        let conv = (conv_dim * l.conv_kernel.saturating_sub(1)) as f64 * 2.0;
        n_linear * (state + conv)
    }
}

fn parse_layers(f: &Fields, num_layers: u64, has_moe: bool, has_linear: bool) -> Result<Vec<LayerSpec>> {
    let origin = f.origin;
    let window = f.u64("sliding_window")?.filter(|&w| w > 0);
    let use_sliding = f.bool("use_sliding_window")?.unwrap_or(true);
    let n = num_layers as usize;
    let mut kinds: Vec<AttnKind> = Vec::with_capacity(n);
    if let Some(types) = f.cfg.get("layer_types").and_then(|v| v.as_array()) {
        if types.len() != n {
            bail!("{origin}: field 'layer_types' has {} entries, num_hidden_layers is {n}", types.len());
        }
        for (i, t) in types.iter().enumerate() {
            let kind = match t.as_str().unwrap_or("") {
                "full_attention" | "attention" => AttnKind::Full,
                "sliding_attention" | "sliding_window_attention" | "local_attention" => AttnKind::Sliding {
                    window: window
                        .ok_or_else(|| anyhow!("{origin}: layer_types has sliding layers but no 'sliding_window'"))?,
                },
                "linear_attention" => AttnKind::Linear,
                _ => bail!(
                    "{origin}: field 'layer_types[{i}]' = {t}; allowed: full_attention, sliding_attention, linear_attention"
                ),
            };
            kinds.push(kind);
        }
    } else if has_linear {
        // Qwen3-Next: every `full_attention_interval`-th layer is full attention.
        let interval = f.u64("full_attention_interval")?.unwrap_or(4).max(1);
        for i in 0..num_layers {
            kinds.push(if (i + 1) % interval == 0 { AttnKind::Full } else { AttnKind::Linear });
        }
    } else if let (Some(w), Some(pattern)) = (window, f.u64("sliding_window_pattern")?) {
        // Gemma-style: every `pattern`-th layer is global, the rest local.
        for i in 0..num_layers {
            kinds.push(if (i + 1) % pattern.max(1) == 0 { AttnKind::Full } else { AttnKind::Sliding { window: w } });
        }
    } else if let (Some(w), true) = (window, use_sliding) {
        // Qwen2-style: the first `max_window_layers` layers attend fully, later ones slide.
        // Mistral has no such field: every layer slides.
        let full_below = f.u64("max_window_layers")?.unwrap_or(0);
        for i in 0..num_layers {
            kinds.push(if i < full_below { AttnKind::Full } else { AttnKind::Sliding { window: w } });
        }
    } else {
        kinds = vec![AttnKind::Full; n];
    }

    let first_dense = f.u64("first_k_dense_replace")?.unwrap_or(0);
    let deepseek = f.model_type.starts_with("deepseek");
    let moe_freq = match f.u64("moe_layer_freq")? {
        Some(x) => x,
        None => f.u64("decoder_sparse_step")?.unwrap_or(1),
    }
    .max(1);
    let mlp_only: Vec<u64> = f
        .cfg
        .get("mlp_only_layers")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    let layers = kinds
        .into_iter()
        .zip(0u64..)
        .map(|(attn, i)| {
            // DeepSeek: MoE from layer first_k_dense_replace on, every moe_layer_freq-th layer;
            // Qwen-MoE: every decoder_sparse_step-th layer (1-based), except mlp_only_layers.
            let moe = has_moe
                && i >= first_dense
                && !mlp_only.contains(&i)
                && if deepseek { i % moe_freq == 0 } else { (i + 1) % moe_freq == 0 };
            LayerSpec { attn, moe }
        })
        .collect();
    Ok(layers)
}

/// Config features that change a model's cost or numerics but that this crate does not model.
fn unmodelled_features(f: &Fields) -> Vec<String> {
    let mut v = Vec::new();
    let rope = f.cfg.get("rope_scaling").filter(|r| r.is_object());
    if let Some(r) = rope {
        let kind = r.get("rope_type").or_else(|| r.get("type")).and_then(|t| t.as_str()).unwrap_or("?");
        v.push(format!("rope_scaling ({kind}): no cost, positions only"));
    }
    if let Some(p) = f.cfg.get("partial_rotary_factor").and_then(|p| p.as_f64()).filter(|&p| p < 1.0) {
        v.push(format!("partial_rotary_factor {p}: RoPE cost counted over the full head"));
    }
    let head_dim = f.cfg.get("head_dim").and_then(|d| d.as_u64()).unwrap_or(0);
    if let Some(r) = f.cfg.get("rotary_dim").and_then(|r| r.as_u64()).filter(|&r| r < head_dim) {
        v.push(format!("rotary_dim {r} of head_dim {head_dim}: RoPE cost counted over the full head"));
    }
    if let Some(n) = f.cfg.get("num_nextn_predict_layers").and_then(|n| n.as_u64()).filter(|&n| n > 0) {
        v.push(format!("num_nextn_predict_layers {n}: MTP layers excluded from counts"));
    }
    if let Some(n) = f.cfg.get("num_mtp_modules").and_then(|n| n.as_u64()).filter(|&n| n > 0) {
        v.push(format!("num_mtp_modules {n}: MTP layers excluded from counts"));
    }
    if f.root.get("vision_config").is_some() {
        v.push("vision_config: vision tower and projector excluded from counts".into());
    }
    if let Some(q) = f.root.get("quantization_config") {
        let m = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("?");
        v.push(format!("quantization_config ({m}): counts are parameters, not checkpoint bytes"));
    }
    if f.cfg.get("swiglu_limit").is_some() {
        v.push("swiglu_limit: activation clamp, no cost".into());
    }
    v
}

include!(concat!(env!("OUT_DIR"), "/embedded_models.rs"));

pub fn builtin_model_names() -> Vec<String> {
    let mut v: Vec<String> = EMBEDDED_MODELS.iter().map(|(f, _)| f.trim_end_matches(".json").to_string()).collect();
    v.sort();
    v
}
