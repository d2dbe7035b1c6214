//! `kernelsight models`: list the built-in model zoo, or describe one model.
use crate::model::{builtin_model_names, AttnKind, ModelConfig, QkNorm};
use crate::schema::Dtype;
use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

#[derive(Debug, Args)]
#[command(after_help = "Built-in models are Hugging Face config.json files (models/*.json, embedded in \
the binary). Any other model works too: pass the path of its config.json wherever a model name is \
accepted.\n\n\
Parameter counts cover the language model: embeddings, decoder layers, final norm, LM head; MTP \
layers and vision towers are excluded. Active = parameters one token multiplies by: every \
non-expert weight (both embedding tables) plus shared and top-k routed experts.\n\n\
Examples:\n  kernelsight models list\n  kernelsight models list --kv-dtype fp8\n  \
kernelsight models show deepseek-v3\n  kernelsight models show ./my-model/config.json --json")]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub command: ModelsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Table of built-in models: params, layers, heads, experts, attention mix, KV bytes/token.
    List {
        /// Data type of the KV cache for the KV bytes/token column (fp32, bf16, fp16, fp8, ...).
        #[arg(long, default_value = "bf16")]
        kv_dtype: Dtype,
        /// Print JSON (one object per model) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Describe one model: dimensions, layer pattern, parameter breakdown, KV cache, and the
    /// config features that are not modelled.
    Show {
        /// Built-in model name (see `models list`, case-insensitive) or path to a config.json.
        model: String,
        /// Print JSON: the parsed config plus derived counts.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: ModelsArgs) -> Result<()> {
    match args.command {
        ModelsCommand::List { kv_dtype, json } => {
            let models = builtin_models()?;
            if json {
                let rows: Vec<_> = models.iter().map(|m| summary_json(m, kv_dtype)).collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", list_table(&models, kv_dtype));
            }
        }
        ModelsCommand::Show { model, json } => {
            let m = ModelConfig::load(&model)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&show_json(&m))?);
            } else {
                print!("{}", show_text(&m));
            }
        }
    }
    Ok(())
}

pub fn builtin_models() -> Result<Vec<ModelConfig>> {
    builtin_model_names().iter().map(|n| ModelConfig::load(n)).collect()
}

fn billions(x: u64) -> String {
    format!("{:.2}", x as f64 / 1e9)
}

/// Parameter count with a unit that keeps three significant digits visible.
fn human(x: u64) -> String {
    match x {
        0 => "0".into(),
        x if x >= 1_000_000_000 => format!("{:.2} B", x as f64 / 1e9),
        x if x >= 1_000_000 => format!("{:.2} M", x as f64 / 1e6),
        x => format!("{:.2} K", x as f64 / 1e3),
    }
}

fn heads_label(m: &ModelConfig) -> String {
    if m.mla.is_some() {
        format!("{}/MLA", m.num_heads)
    } else {
        format!("{}/{}", m.num_heads, m.num_kv_heads)
    }
}

fn experts_label(m: &ModelConfig) -> String {
    match &m.moe {
        None => "-".into(),
        Some(e) if e.shared_inter > 0 => format!("{}/{}+shared", e.num_experts, e.topk),
        Some(e) => format!("{}/{}", e.num_experts, e.topk),
    }
}

/// The `models list` table, one row per model.
pub fn list_table(models: &[ModelConfig], kv_dtype: Dtype) -> String {
    let header = [
        "name".to_string(),
        "type".into(),
        "total_B".into(),
        "active_B".into(),
        "layers".into(),
        "hidden".into(),
        "heads/kv".into(),
        "experts/topk".into(),
        "attention".into(),
        format!("kv_bytes/token({kv_dtype})"),
    ];
    let mut rows = vec![header.to_vec()];
    for m in models {
        let (total, active) = m.param_counts();
        rows.push(vec![
            m.name.clone(),
            m.model_type.clone(),
            billions(total),
            billions(active),
            m.num_layers.to_string(),
            m.hidden.to_string(),
            heads_label(m),
            experts_label(m),
            m.attention_mix_label(),
            format!("{}", m.kv_bytes_per_token(kv_dtype)),
        ]);
    }
    // Numbers right-aligned, text left-aligned.
    let right = [false, false, true, true, true, true, false, false, false, true];
    let widths: Vec<usize> = (0..right.len()).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .zip(right)
            .map(|((cell, &w), right)| if right { format!("{cell:>w$}") } else { format!("{cell:<w$}") })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn summary_json(m: &ModelConfig, kv_dtype: Dtype) -> serde_json::Value {
    let (total, active) = m.param_counts();
    let (full, sliding, linear) = m.attention_mix();
    json!({
        "name": m.name,
        "model_type": m.model_type,
        "total_params": total,
        "active_params": active,
        "layers": m.num_layers,
        "hidden": m.hidden,
        "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads,
        "num_experts": m.moe.as_ref().map(|e| e.num_experts),
        "topk": m.moe.as_ref().map(|e| e.topk),
        "full_layers": full,
        "sliding_layers": sliding,
        "linear_layers": linear,
        "kv_dtype": kv_dtype.to_string(),
        "kv_bytes_per_token": m.kv_bytes_per_token(kv_dtype),
    })
}

/// One letter per layer: F full, S sliding, L linear; lower case for MoE layers.
pub fn layer_pattern(m: &ModelConfig) -> String {
    m.layers
        .iter()
        .map(|l| {
            let c = match l.attn {
                AttnKind::Full => 'F',
                AttnKind::Sliding { .. } => 'S',
                AttnKind::Linear => 'L',
            };
            if l.moe {
                c.to_ascii_lowercase()
            } else {
                c
            }
        })
        .collect()
}

/// The `models show` text.
pub fn show_text(m: &ModelConfig) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<26}{v}\n"));
    line("name", m.name.clone());
    line("model_type", m.model_type.clone());
    line("hidden / layers / vocab", format!("{} / {} / {}", m.hidden, m.num_layers, m.vocab));
    line("max context", m.max_context.to_string());
    line("tied embeddings", m.tie_embeddings.to_string());
    match &m.mla {
        Some(a) => line(
            "attention (MLA)",
            format!(
                "{} heads, q_lora_rank {}, kv_lora_rank {}, qk nope/rope {}/{}, v_head_dim {}",
                m.num_heads,
                a.q_lora_rank.map(|r| r.to_string()).unwrap_or_else(|| "none".into()),
                a.kv_lora_rank,
                a.qk_nope_head_dim,
                a.qk_rope_head_dim,
                a.v_head_dim
            ),
        ),
        None => {
            let mut extras = Vec::new();
            for (on, what) in [
                (m.attention_bias, "qkv bias"),
                (m.o_bias, "o bias"),
                (m.qk_norm == QkNorm::PerHead, "q/k norm"),
                (m.qk_norm == QkNorm::WholeWidth, "q/k norm over all heads"),
                (m.attention_sinks, "sinks"),
                (m.attn_output_gate, "output gate"),
            ] {
                if on {
                    extras.push(what);
                }
            }
            let extras = if extras.is_empty() { String::new() } else { format!(", {}", extras.join(", ")) };
            line(
                "attention",
                format!("{} heads / {} kv heads x {} head_dim{extras}", m.num_heads, m.num_kv_heads, m.head_dim),
            );
        }
    }
    if let Some(l) = &m.linear {
        line(
            "linear attention",
            format!(
                "gated DeltaNet: {} k-heads x {}, {} v-heads x {}, conv kernel {}",
                l.num_k_heads, l.k_head_dim, l.num_v_heads, l.v_head_dim, l.conv_kernel
            ),
        );
    }
    line("attention mix", m.attention_mix_label());
    match &m.moe {
        Some(e) => line(
            "MoE",
            format!(
                "{} experts, top-{}, expert width {}, shared width {}{}; dense width {}",
                e.num_experts,
                e.topk,
                e.expert_inter,
                e.shared_inter,
                format!(
                    "{}{}{}",
                    if e.expert_bias { ", expert biases" } else { "" },
                    if e.router_score_bias { ", router score bias" } else { "" },
                    if e.router_fp32 { ", fp32 router" } else { "" }
                ),
                m.dense_inter
            ),
        ),
        None => line("MLP width", m.dense_inter.to_string()),
    }
    line("layers", "F full, S sliding, L linear; lower case = MoE".into());
    let pattern = layer_pattern(m);
    for (i, chunk) in pattern.as_bytes().chunks(64).enumerate() {
        line(&format!("  {:>3}..", i * 64), String::from_utf8_lossy(chunk).into_owned());
    }
    let b = m.param_breakdown();
    line("params total / active", format!("{} / {}", human(b.total()), human(b.active())));
    line("  embedding / lm_head", format!("{} / {}", human(b.embedding), human(b.lm_head)));
    line("  attention / norms", format!("{} / {}", human(b.attention), human(b.norms)));
    if b.dense_mlp > 0 {
        line("  dense MLP", human(b.dense_mlp));
    }
    if m.moe.is_some() {
        line("  MoE total / active", format!("{} / {}", human(b.moe_total), human(b.moe_active)));
    }
    line(
        "KV bytes/token",
        format!("{} (bf16), {} (fp8)", m.kv_bytes_per_token(Dtype::Bf16), m.kv_bytes_per_token(Dtype::Fp8)),
    );
    line(
        "KV bytes/seq at max ctx",
        format!("{:.3} GiB (bf16, sliding layers capped at their window)", m.kv_bytes_per_seq(m.max_context, Dtype::Bf16) / (1u64 << 30) as f64),
    );
    if m.linear.is_some() {
        line("linear state bytes/seq", format!("{}", m.linear_state_bytes_per_seq()));
    }
    for (i, u) in m.unmodelled.iter().enumerate() {
        line(if i == 0 { "not modelled" } else { "" }, u.clone());
    }
    o
}

fn show_json(m: &ModelConfig) -> serde_json::Value {
    let mut v = serde_json::to_value(m).expect("ModelConfig serializes");
    let b = m.param_breakdown();
    v["derived"] = json!({
        "total_params": b.total(),
        "active_params": b.active(),
        "param_breakdown": b,
        "attention_mix": m.attention_mix_label(),
        "layer_pattern": layer_pattern(m),
        "kv_bytes_per_token_bf16": m.kv_bytes_per_token(Dtype::Bf16),
        "kv_bytes_per_seq_max_context_bf16": m.kv_bytes_per_seq(m.max_context, Dtype::Bf16),
        "linear_state_bytes_per_seq": m.linear_state_bytes_per_seq(),
    });
    v
}
