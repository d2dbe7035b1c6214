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
    /// Per-head RMSNorm on q and k (Qwen3, Gemma-3).
    pub qk_norm: bool,
    /// Sigmoid output gate doubling the q projection (Qwen3-Next full-attention layers).
    pub attn_output_gate: bool,
    pub layers: Vec<LayerSpec>,
    pub moe: Option<MoeSpec>,
    pub mla: Option<MlaSpec>,
    pub linear: Option<LinearAttnSpec>,
}

fn get_u64(cfg: &Value, key: &str) -> Option<u64> {
    cfg.get(key).and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)))
}

fn get_bool(cfg: &Value, key: &str) -> Option<bool> {
    cfg.get(key).and_then(|v| v.as_bool())
}

fn require_u64(cfg: &Value, key: &str, origin: &str) -> Result<u64> {
    match cfg.get(key) {
        None | Some(Value::Null) => bail!("{origin}: missing field '{key}'"),
        Some(v) => match v.as_u64() {
            Some(0) | None => bail!("{origin}: field '{key}' must be a positive integer, got {v}"),
            Some(x) => Ok(x),
        },
    }
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json`. `name` is the model's short name.
    pub fn from_hf_json(text: &str, name: &str, origin: &str) -> Result<ModelConfig> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| anyhow!("{origin}: malformed JSON: {e}"))?;
        // Multimodal configs (Gemma-3) nest the language model under text_config.
        let cfg = root.get("text_config").filter(|v| v.is_object()).unwrap_or(&root);
        let model_type = cfg
            .get("model_type")
            .or_else(|| root.get("model_type"))
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_string();
        let hidden = require_u64(cfg, "hidden_size", origin)?;
        let num_layers = require_u64(cfg, "num_hidden_layers", origin)?;
        let vocab = require_u64(cfg, "vocab_size", origin)?;
        let num_heads = require_u64(cfg, "num_attention_heads", origin)?;
        let num_kv_heads = get_u64(cfg, "num_key_value_heads").unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            bail!("{origin}: field 'num_key_value_heads' = {num_kv_heads} must divide num_attention_heads = {num_heads}");
        }
        let head_dim = get_u64(cfg, "head_dim").filter(|&d| d > 0).unwrap_or(hidden / num_heads);
        let dense_inter = get_u64(cfg, "intermediate_size").unwrap_or(4 * hidden);
        let tie_embeddings = get_bool(cfg, "tie_word_embeddings")
            .or_else(|| get_bool(&root, "tie_word_embeddings"))
            .unwrap_or(false);
        let max_context = get_u64(cfg, "max_position_embeddings").unwrap_or(4096);

        // MoE: the field names differ per family.
        let num_experts = get_u64(cfg, "n_routed_experts")
            .or_else(|| get_u64(cfg, "num_local_experts"))
            .or_else(|| get_u64(cfg, "num_experts"))
            .unwrap_or(0);
        let moe = if num_experts > 1 {
            let topk = get_u64(cfg, "num_experts_per_tok")
                .or_else(|| get_u64(cfg, "experts_per_token"))
                .ok_or_else(|| anyhow!("{origin}: MoE model lacks 'num_experts_per_tok'"))?;
            if topk == 0 || topk > num_experts {
                bail!("{origin}: field 'num_experts_per_tok' = {topk} must be in 1..={num_experts}");
            }
            let expert_inter = get_u64(cfg, "moe_intermediate_size").unwrap_or(dense_inter);
            let n_shared = get_u64(cfg, "n_shared_experts").unwrap_or(0);
            let shared_inter = match get_u64(cfg, "shared_expert_intermediate_size") {
                Some(s) => s,
                None => n_shared * expert_inter,
            };
            Some(MoeSpec {
                num_experts,
                topk,
                expert_inter,
                shared_inter,
                expert_bias: model_type == "gpt_oss",
                shared_expert_gate: cfg.get("shared_expert_intermediate_size").is_some(),
            })
        } else {
            None
        };

        let mla = match get_u64(cfg, "kv_lora_rank") {
            Some(kv_lora_rank) if kv_lora_rank > 0 => Some(MlaSpec {
                q_lora_rank: get_u64(cfg, "q_lora_rank").filter(|&r| r > 0),
                kv_lora_rank,
                qk_nope_head_dim: require_u64(cfg, "qk_nope_head_dim", origin)?,
                qk_rope_head_dim: require_u64(cfg, "qk_rope_head_dim", origin)?,
                v_head_dim: require_u64(cfg, "v_head_dim", origin)?,
            }),
            _ => None,
        };

        let linear = match get_u64(cfg, "linear_num_value_heads") {
            Some(nv) => Some(LinearAttnSpec {
                num_k_heads: require_u64(cfg, "linear_num_key_heads", origin)?,
                num_v_heads: nv,
                k_head_dim: require_u64(cfg, "linear_key_head_dim", origin)?,
                v_head_dim: require_u64(cfg, "linear_value_head_dim", origin)?,
                conv_kernel: get_u64(cfg, "linear_conv_kernel_dim").unwrap_or(4),
            }),
            None => None,
        };

        let layers = parse_layers(cfg, &model_type, num_layers, moe.is_some(), linear.is_some(), origin)?;
        let attention_bias = get_bool(cfg, "attention_bias").unwrap_or(model_type == "qwen2");
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
            attention_bias,
            o_bias: model_type == "gpt_oss",
            mlp_bias: get_bool(cfg, "mlp_bias").unwrap_or(false),
            attention_sinks: model_type == "gpt_oss",
            qk_norm: matches!(model_type.as_str(), "qwen3" | "qwen3_moe" | "qwen3_next" | "gemma3_text" | "gemma3"),
            attn_output_gate: model_type == "qwen3_next",
            layers,
            moe,
            mla,
            linear,
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
        if self.qk_norm {
            p += 2 * self.head_dim;
        }
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
        let router = h * m.num_experts + if m.expert_bias { m.num_experts } else { 0 };
        let shared = 3 * h * m.shared_inter + if m.shared_expert_gate { h } else { 0 };
        let total = router + shared + m.num_experts * per_expert;
        let active = router + shared + m.topk * per_expert;
        (total, active)
    }

    /// (total, active-per-token) parameter counts.
    pub fn param_counts(&self) -> (u64, u64) {
        let embed = self.vocab * self.hidden;
        let head = if self.tie_embeddings { 0 } else { self.vocab * self.hidden };
        let mut total = embed + head + self.hidden;
        let mut active = total;
        for l in &self.layers {
            let attn = self.attention_params(l.attn) + 2 * self.hidden;
            let (mt, ma) = self.mlp_params(l.moe);
            total += attn + mt;
            active += attn + ma;
        }
        (total, active)
    }

    pub fn total_params(&self) -> u64 {
        self.param_counts().0
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

    /// Recurrent-state bytes per sequence for linear-attention layers (fp32 state + conv state).
    pub fn linear_state_bytes_per_seq(&self) -> f64 {
        let Some(l) = &self.linear else { return 0.0 };
        let n_linear = self.layers.iter().filter(|x| x.attn == AttnKind::Linear).count() as f64;
        let state = (l.num_v_heads * l.k_head_dim * l.v_head_dim) as f64 * 4.0;
        let conv = ((2 * l.num_k_heads * l.k_head_dim + l.num_v_heads * l.v_head_dim) * l.conv_kernel) as f64 * 2.0;
        n_linear * (state + conv)
    }
}

fn parse_layers(
    cfg: &Value,
    model_type: &str,
    num_layers: u64,
    has_moe: bool,
    has_linear: bool,
    origin: &str,
) -> Result<Vec<LayerSpec>> {
    let window = get_u64(cfg, "sliding_window").filter(|&w| w > 0);
    let use_sliding = get_bool(cfg, "use_sliding_window").unwrap_or(true);
    let n = num_layers as usize;
    let mut kinds: Vec<AttnKind> = Vec::with_capacity(n);
    if let Some(types) = cfg.get("layer_types").and_then(|v| v.as_array()) {
        if types.len() != n {
            bail!("{origin}: field 'layer_types' has {} entries, num_hidden_layers is {n}", types.len());
        }
        for (i, t) in types.iter().enumerate() {
            let kind = match t.as_str().unwrap_or("") {
                "full_attention" | "attention" => AttnKind::Full,
                "sliding_attention" | "sliding_window_attention" | "local_attention" => AttnKind::Sliding {
                    window: window.ok_or_else(|| anyhow!("{origin}: layer_types has sliding layers but no 'sliding_window'"))?,
                },
                "linear_attention" => AttnKind::Linear,
                other => bail!(
                    "{origin}: field 'layer_types[{i}]' = '{other}'; allowed: full_attention, sliding_attention, linear_attention"
                ),
            };
            kinds.push(kind);
        }
    } else if has_linear {
        let interval = get_u64(cfg, "full_attention_interval").unwrap_or(4).max(1);
        for i in 0..n {
            kinds.push(if (i as u64 + 1) % interval == 0 { AttnKind::Full } else { AttnKind::Linear });
        }
    } else if let (Some(w), Some(pattern)) = (window, get_u64(cfg, "sliding_window_pattern")) {
        // Gemma-style: every `pattern`-th layer is global, the rest local.
        for i in 0..n {
            kinds.push(if (i as u64 + 1) % pattern.max(1) == 0 { AttnKind::Full } else { AttnKind::Sliding { window: w } });
        }
    } else if let (Some(w), true) = (window, use_sliding) {
        let max_window_layers = get_u64(cfg, "max_window_layers").unwrap_or(num_layers);
        for i in 0..n {
            kinds.push(if (i as u64) < max_window_layers { AttnKind::Sliding { window: w } } else { AttnKind::Full });
        }
    } else {
        kinds = vec![AttnKind::Full; n];
    }

    let first_dense = get_u64(cfg, "first_k_dense_replace").unwrap_or(0);
    let moe_freq = get_u64(cfg, "moe_layer_freq").or_else(|| get_u64(cfg, "decoder_sparse_step")).unwrap_or(1).max(1);
    let mlp_only: Vec<u64> = cfg
        .get("mlp_only_layers")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    let layers = kinds
        .into_iter()
        .enumerate()
        .map(|(i, attn)| {
            let i = i as u64;
            let moe = has_moe
                && i >= first_dense
                && !mlp_only.contains(&i)
                && if model_type.starts_with("deepseek") { i % moe_freq == 0 } else { (i + 1) % moe_freq == 0 };
            LayerSpec { attn, moe }
        })
        .collect();
    Ok(layers)
}

include!(concat!(env!("OUT_DIR"), "/embedded_models.rs"));

pub fn builtin_model_names() -> Vec<String> {
    let mut v: Vec<String> = EMBEDDED_MODELS.iter().map(|(f, _)| f.trim_end_matches(".json").to_string()).collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_8b_counts() {
        let m = ModelConfig::load("llama-3.1-8b").unwrap();
        let p = m.total_params() as f64;
        assert!((p / 8.030e9 - 1.0).abs() < 0.01, "{p}");
        // 32 layers x 2 (K,V) x 8 heads x 128 dims x 2 bytes = 131072 bytes per token.
        assert_eq!(m.kv_bytes_per_token(Dtype::Bf16), 131072.0);
    }
}
