//! Model zoo: every shipped config parses, its parameter count matches the published figure,
//! its layer structure matches the architecture, and KV bytes match hand computation.
use kernelsight::model::{builtin_model_names, AttnKind, ModelConfig};
use kernelsight::schema::Dtype;

fn load(name: &str) -> ModelConfig {
    ModelConfig::load(name).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

fn assert_within(name: &str, what: &str, got: f64, published: f64, tol: f64) {
    let rel = got / published - 1.0;
    assert!(
        rel.abs() <= tol,
        "{name}: {what} {:.4}B vs published {:.4}B ({:+.2}%, allowed ±{:.1}%)",
        got / 1e9,
        published / 1e9,
        rel * 100.0,
        tol * 100.0
    );
}

/// (model, published total parameters, where the figure comes from).
/// Totals count the language model only: embeddings, decoder layers, final norm, LM head.
const PUBLISHED_TOTALS: &[(&str, f64, &str)] = &[
    ("llama-3.1-8b", 8.03e9, "Hugging Face Hub safetensors count, meta-llama/Llama-3.1-8B: 8.03B"),
    ("llama-3.1-70b", 70.6e9, "Hugging Face Hub safetensors count, meta-llama/Llama-3.1-70B: 70.6B"),
    ("llama-3.1-405b", 405e9, "Llama 3.1 model card: 405B"),
    ("llama-3.2-1b", 1.23e9, "Llama 3.2 model card, parameter column: 1B (1.23B)"),
    ("llama-3.2-3b", 3.21e9, "Llama 3.2 model card, parameter column: 3B (3.21B)"),
    ("qwen2.5-7b", 7.61e9, "Qwen2.5-7B-Instruct model card: Number of Parameters 7.61B"),
    ("qwen3-14b", 14.8e9, "Qwen3-14B model card: Number of Parameters 14.8B"),
    ("mistral-nemo-12b", 12.2e9, "Hugging Face Hub safetensors count, mistralai/Mistral-Nemo-Base-2407: 12.2B"),
    ("qwen3-0.6b", 0.6e9, "Qwen3-0.6B model card: Number of Parameters 0.6B"),
    ("qwen3-8b", 8.2e9, "Qwen3-8B model card: Number of Parameters 8.2B"),
    ("qwen3-32b", 32.8e9, "Qwen3-32B model card: Number of Parameters 32.8B"),
    ("qwen3-30b-a3b", 30.5e9, "Qwen3-30B-A3B model card: 30.5B in total"),
    ("qwen3-235b-a22b", 235e9, "Qwen3-235B-A22B model card: 235B in total"),
    ("mixtral-8x7b-v0.1", 46.7e9, "Mistral AI 'Mixtral of experts' announcement: 46.7B total"),
    ("mistral-7b-v0.1", 7.3e9, "Mistral AI 'Mistral 7B' announcement: 7.3B"),
    // The Hub shows 685B: that adds the 14B multi-token-prediction module, which we exclude.
    ("deepseek-v3", 671e9, "DeepSeek-V3 model card / technical report: 671B total (main model, MTP excluded)"),
    ("deepseek-v2-lite", 15.7e9, "DeepSeek-V2 paper, appendix (DeepSeek-V2-Lite): 15.7B total"),
    ("gpt-oss-20b", 20.91e9, "gpt-oss model card (arXiv 2508.10925), parameter table: 20.91B total"),
    ("gpt-oss-120b", 116.83e9, "gpt-oss model card (arXiv 2508.10925), parameter table: 116.83B total"),
    // Text only, like with like: Gemma 3 technical report Table 1 lists the 27B model as
    // 417M vision encoder + 1,416M embedding + 25,600M non-embedding; we compare the text part
    // (1,416M + 25,600M = 27.016B), the vision tower is not modelled.
    ("gemma-3-27b-it", 27.016e9, "Gemma 3 technical report, Table 1: 1,416M embedding + 25,600M non-embedding"),
    // M2.5 shares M2's architecture; the card's figure is rounded (MTP modules excluded).
    ("minimax-m2.5", 230e9, "MiniMax-M2 model card: 230B total parameters, 10B active"),
    ("qwen3-next-80b-a3b-instruct", 80e9, "Qwen3-Next-80B-A3B-Instruct model card: 80B in total (MTP excluded)"),
];

#[test]
fn every_shipped_model_has_a_published_total() {
    let mut shipped = builtin_model_names();
    shipped.sort();
    let mut listed: Vec<String> = PUBLISHED_TOTALS.iter().map(|(n, _, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(shipped, listed, "each models/*.json needs a published parameter figure in this test");
}

#[test]
fn total_params_within_one_percent_of_published() {
    for (name, published, source) in PUBLISHED_TOTALS {
        let m = load(name);
        let rel = m.total_params() as f64 / published - 1.0;
        assert!(rel.abs() <= 0.01, "{name}: {:.3}B vs {source} ({:+.2}%)", m.total_params() as f64 / 1e9, rel * 100.0);
    }
}

/// Non-embedding counts where the card gives them: checks the decoder stack separately from
/// the (large) embedding tables, so an error in one cannot hide in the other.
#[test]
fn non_embedding_params_match_qwen3_cards() {
    // Qwen3 model cards: "Number of Parameters (Non-Embedding)".
    for (name, published) in [("qwen3-0.6b", 0.44e9), ("qwen3-8b", 6.95e9), ("qwen3-32b", 31.2e9), ("qwen3-30b-a3b", 29.9e9)] {
        let m = load(name);
        let head = if m.tie_embeddings { 0 } else { m.embedding_params() };
        let non_embedding = (m.total_params() - m.embedding_params() - head) as f64;
        assert_within(name, "non-embedding", non_embedding, published, 0.01);
    }
}

/// Active parameters per token. Vendors round these to two significant digits and disagree on
/// whether the input embedding table counts, so the tolerance is 2% and the convention is
/// stated per model. Left out: Qwen3-Next's "3B activated" (ours 3.87B with both embedding
/// tables, 3.25B without either; its convention is not published) and DeepSeek-V2-Lite's 2.4B
/// (ours 2.66B with both tables, 2.45B without the input table).
#[test]
fn active_params_match_published() {
    // Mistral announcement: 12.9B used per token, embeddings included.
    assert_within("mixtral-8x7b-v0.1", "active", load("mixtral-8x7b-v0.1").param_counts().1 as f64, 12.9e9, 0.02);
    // Qwen3 model cards: 3.3B and 22B activated, embeddings included.
    assert_within("qwen3-30b-a3b", "active", load("qwen3-30b-a3b").param_counts().1 as f64, 3.3e9, 0.02);
    assert_within("qwen3-235b-a22b", "active", load("qwen3-235b-a22b").param_counts().1 as f64, 22e9, 0.02);
    // DeepSeek-V3 card: 37B activated.
    assert_within("deepseek-v3", "active", load("deepseek-v3").param_counts().1 as f64, 37e9, 0.02);
    // gpt-oss card parameter table: active 3.61B / 5.13B count the unembedding but not the
    // input embedding table.
    for (name, published) in [("gpt-oss-20b", 3.61e9), ("gpt-oss-120b", 5.13e9)] {
        let m = load(name);
        let active = (m.param_counts().1 - m.embedding_params()) as f64;
        assert_within(name, "active excl. input embedding", active, published, 0.01);
    }
}

#[test]
fn dense_models_are_fully_active() {
    for name in ["llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.1", "gemma-3-27b-it"] {
        let (total, active) = load(name).param_counts();
        assert_eq!(total, active, "{name}");
    }
}

#[test]
fn gpt_oss_alternates_sliding_and_full() {
    for (name, layers) in [("gpt-oss-20b", 24), ("gpt-oss-120b", 36)] {
        let m = load(name);
        assert_eq!(m.layers.len(), layers);
        for (i, l) in m.layers.iter().enumerate() {
            let want = if i % 2 == 0 { AttnKind::Sliding { window: 128 } } else { AttnKind::Full };
            assert_eq!(l.attn, want, "{name} layer {i}");
            assert!(l.moe, "{name} layer {i} is MoE");
        }
        assert!(m.attention_sinks && m.o_bias && m.attention_bias);
        let moe = m.moe.as_ref().unwrap();
        assert!(moe.expert_bias);
        assert_eq!((moe.topk, moe.expert_inter), (4, 2880));
    }
}

#[test]
fn gemma3_is_five_local_to_one_global() {
    let m = load("gemma-3-27b-it");
    // The Hub config nests the language model under text_config and omits vocab_size and
    // sliding_window_pattern; Gemma3TextConfig defaults are 262208 and 6.
    assert_eq!(m.vocab, 262_208);
    assert_eq!((m.hidden, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim), (5376, 62, 32, 16, 128));
    assert!(m.tie_embeddings);
    for (i, l) in m.layers.iter().enumerate() {
        let want = if (i + 1) % 6 == 0 { AttnKind::Full } else { AttnKind::Sliding { window: 1024 } };
        assert_eq!(l.attn, want, "layer {i}");
    }
    // 62 layers: globals at 5, 11, ..., 59 -> 10 global, 52 local.
    assert_eq!(m.attention_mix(), (10, 52, 0));
    assert!(m.unmodelled.iter().any(|u| u.starts_with("vision_config")));
}

#[test]
fn qwen3_next_is_three_linear_to_one_full() {
    let m = load("qwen3-next-80b-a3b-instruct");
    for (i, l) in m.layers.iter().enumerate() {
        let want = if i % 4 == 3 { AttnKind::Full } else { AttnKind::Linear };
        assert_eq!(l.attn, want, "layer {i}");
        assert!(l.moe);
    }
    assert_eq!(m.attention_mix(), (12, 0, 36));
    assert!(m.attn_output_gate);
    let moe = m.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.topk, moe.expert_inter, moe.shared_inter), (512, 10, 512, 512));
    assert!(moe.shared_expert_gate);
    // 36 linear layers x (32 v-heads x 128 x 128 fp32 state + conv cache of
    // (2 x 16 x 128 + 32 x 128) channels x (4 - 1) taps in bf16) = 36 x (2,097,152 + 49,152).
    assert_eq!(m.linear_state_bytes_per_seq(), 36.0 * (2_097_152.0 + 49_152.0));
}

#[test]
fn deepseek_first_layers_dense_then_moe() {
    for (name, dense) in [("deepseek-v3", 3), ("deepseek-v2-lite", 1)] {
        let m = load(name);
        for (i, l) in m.layers.iter().enumerate() {
            assert_eq!(l.moe, i >= dense, "{name} layer {i}");
            assert_eq!(l.attn, AttnKind::Full);
        }
    }
    let v3 = load("deepseek-v3");
    let mla = v3.mla.as_ref().unwrap();
    assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim), (Some(1536), 512, 64));
    let moe = v3.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.topk, moe.shared_inter), (256, 8, 2048));
    assert!(moe.router_score_bias);
    assert!(v3.unmodelled.iter().any(|u| u.contains("MTP")));
    // V2-Lite: no query compression, two shared experts of 1408.
    let lite = load("deepseek-v2-lite");
    assert_eq!(lite.mla.as_ref().unwrap().q_lora_rank, None);
    assert_eq!(lite.moe.as_ref().unwrap().shared_inter, 2 * 1408);
}

#[test]
fn mistral_slides_over_4096_and_qwen_without_sliding_is_full() {
    let m = load("mistral-7b-v0.1");
    assert!(m.layers.iter().all(|l| l.attn == AttnKind::Sliding { window: 4096 }));
    // Qwen3 configs carry use_sliding_window: false (and sliding_window: null).
    for name in ["qwen3-0.6b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b"] {
        assert!(load(name).layers.iter().all(|l| l.attn == AttnKind::Full), "{name}");
    }
    // Mixtral's sliding_window is null: full attention.
    assert!(load("mixtral-8x7b-v0.1").layers.iter().all(|l| l.attn == AttnKind::Full));
}

#[test]
fn qwen2_style_window_applies_from_max_window_layers_on() {
    // transformers Qwen2: layers below max_window_layers attend fully, later ones slide.
    let text = r#"{"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 10,
        "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 32,
        "use_sliding_window": true, "max_window_layers": 3}"#;
    let m = ModelConfig::from_hf_json(text, "t", "t.json").unwrap();
    let kinds: Vec<AttnKind> = m.layers.iter().map(|l| l.attn).collect();
    assert_eq!(kinds, [AttnKind::Full, AttnKind::Full, AttnKind::Full, AttnKind::Sliding { window: 32 }]);
}

#[test]
fn kv_bytes_per_token_match_hand_computation() {
    let bf16 = Dtype::Bf16;
    // Full GQA: layers x 2 (K and V) x kv_heads x head_dim x 2 bytes.
    assert_eq!(load("llama-3.1-8b").kv_bytes_per_token(bf16), (32 * 2 * 8 * 128 * 2) as f64);
    assert_eq!(load("llama-3.1-70b").kv_bytes_per_token(bf16), (80 * 2 * 8 * 128 * 2) as f64);
    assert_eq!(load("qwen3-8b").kv_bytes_per_token(bf16), (36 * 2 * 8 * 128 * 2) as f64);
    assert_eq!(load("gemma-3-27b-it").kv_bytes_per_token(bf16), (62 * 2 * 16 * 128 * 2) as f64);
    assert_eq!(load("gpt-oss-120b").kv_bytes_per_token(bf16), (36 * 2 * 8 * 64 * 2) as f64);
    // MLA caches one latent (kv_lora_rank) plus the shared rope key per layer.
    assert_eq!(load("deepseek-v3").kv_bytes_per_token(bf16), (61 * (512 + 64) * 2) as f64);
    assert_eq!(load("deepseek-v2-lite").kv_bytes_per_token(Dtype::Fp8), (27 * (512 + 64)) as f64);
    // Qwen3-Next: only the 12 full-attention layers hold KV (2 kv heads x 256).
    let next = load("qwen3-next-80b-a3b-instruct");
    assert_eq!(next.kv_bytes_per_token(bf16), (12 * 2 * 2 * 256 * 2) as f64);
    assert_eq!(next.kv_bytes_per_token_layer(AttnKind::Linear, bf16), 0.0);
}

#[test]
fn kv_bytes_per_seq_caps_sliding_layers_at_the_window() {
    let bf16 = Dtype::Bf16;
    // gpt-oss-20b at 8192 tokens: 12 full layers keep 8192 tokens, 12 sliding keep 128;
    // each token-layer is 2 x 8 x 64 x 2 = 2048 bytes.
    let m = load("gpt-oss-20b");
    assert_eq!(m.kv_bytes_per_seq(8192, bf16), (12 * 8192 * 2048 + 12 * 128 * 2048) as f64);
    // Below the window nothing is capped.
    assert_eq!(m.kv_bytes_per_seq(100, bf16), 100.0 * m.kv_bytes_per_token(bf16));
    // Mistral at 32768: every layer keeps 4096 tokens of 2 x 8 x 128 x 2 = 4096 bytes.
    assert_eq!(load("mistral-7b-v0.1").kv_bytes_per_seq(32768, bf16), (32 * 4096 * 4096) as f64);
}

#[test]
fn load_by_path_and_case_insensitive_name() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/qwen3-0.6b.json");
    let by_path = ModelConfig::load(path).unwrap();
    assert_eq!(by_path.name, "qwen3-0.6b");
    assert_eq!(by_path.total_params(), load("Qwen3-0.6B").total_params());
    let err = ModelConfig::load("no-such-model").unwrap_err().to_string();
    assert!(err.contains("unknown model 'no-such-model'") && err.contains("llama-3.1-8b"), "{err}");
}

fn parse_err(text: &str) -> String {
    format!("{:#}", ModelConfig::from_hf_json(text, "bad", "bad/config.json").unwrap_err())
}

#[test]
fn malformed_json_names_the_file() {
    let e = parse_err("{\"hidden_size\": 64,");
    assert!(e.contains("bad/config.json") && e.contains("malformed JSON"), "{e}");
}

#[test]
fn missing_hidden_size_names_file_and_field() {
    let e = parse_err(r#"{"num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4}"#);
    assert!(e.contains("bad/config.json") && e.contains("'hidden_size'"), "{e}");
}

#[test]
fn kv_heads_not_dividing_heads_names_file_and_field() {
    let e = parse_err(
        r#"{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10,
            "num_attention_heads": 6, "num_key_value_heads": 4}"#,
    );
    assert!(e.contains("bad/config.json") && e.contains("'num_key_value_heads'") && e.contains("6"), "{e}");
}

#[test]
fn wrong_types_and_bad_layer_types_are_errors_not_panics() {
    let base = r#""num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4"#;
    let e = parse_err(&format!(r#"{{"hidden_size": "big", {base}}}"#));
    assert!(e.contains("'hidden_size'") && e.contains("integer"), "{e}");
    let e = parse_err(&format!(r#"{{"hidden_size": 64, {base}, "layer_types": ["full_attention"]}}"#));
    assert!(e.contains("'layer_types'") && e.contains("1 entries"), "{e}");
    let e = parse_err(&format!(r#"{{"hidden_size": 64, {base}, "layer_types": ["full_attention", "chunked"]}}"#));
    assert!(e.contains("layer_types[1]") && e.contains("allowed"), "{e}");
    let e = parse_err(&format!(r#"{{"hidden_size": 64, {base}, "tie_word_embeddings": "yes"}}"#));
    assert!(e.contains("'tie_word_embeddings'") && e.contains("true or false"), "{e}");
    let e = parse_err(&format!(r#"{{"hidden_size": 64, {base}, "num_local_experts": 8}}"#));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = parse_err("[1, 2]");
    assert!(e.contains("JSON object"), "{e}");
}

#[test]
fn cli_list_has_a_row_per_model_with_hand_checked_cells() {
    use kernelsight::cli::models::{builtin_models, list_table};
    let table = list_table(&builtin_models().unwrap(), Dtype::Bf16);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 1 + builtin_model_names().len());
    assert!(lines[0].contains("kv_bytes/token(bf16)"));
    let row = |name: &str| -> Vec<String> {
        let l = lines.iter().find(|l| l.starts_with(&format!("{name} "))).unwrap();
        l.split("  ").map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()
    };
    // llama-3.1-8b: 8.03B dense, 32 layers, 32/8 heads, 32 x 2 x 8 x 128 x 2 = 131072 bytes.
    assert_eq!(row("llama-3.1-8b"), ["llama-3.1-8b", "llama", "8.03", "8.03", "32", "4096", "32/8", "-", "32 full", "131072"]);
    // gpt-oss-20b: alternating layers, 12 full x 2 x 8 x 64 x 2 + 12 sliding x same = 49152.
    let g = row("gpt-oss-20b");
    assert_eq!(&g[6..], ["64/8", "32/4", "12 full + 12 sliding(128)", "49152"]);
    // Qwen3-Next: 512 experts top-10 plus a shared expert; 36 linear layers hold no KV.
    let q = row("qwen3-next-80b-a3b-instruct");
    assert_eq!(&q[7..], ["512/10+shared", "12 full + 36 linear", "24576"]);
}

#[test]
fn cli_layer_pattern_marks_dense_and_moe_layers() {
    use kernelsight::cli::models::layer_pattern;
    assert_eq!(layer_pattern(&load("deepseek-v3")), format!("FFF{}", "f".repeat(58)));
    assert_eq!(layer_pattern(&load("gpt-oss-20b")), "sf".repeat(12));
    assert_eq!(layer_pattern(&load("qwen3-next-80b-a3b-instruct")), "lllf".repeat(12));
}

#[test]
fn cli_show_and_errors_through_the_binary() {
    use std::process::Command;
    let bin = env!("CARGO_BIN_EXE_kernelsight");
    let out = Command::new(bin).args(["models", "show", "gemma-3-27b-it"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("10 full + 52 sliding(1024)") && text.contains("vision_config"), "{text}");

    let out = Command::new(bin).args(["models", "show", "deepseek-v2-lite", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["derived"]["kv_bytes_per_token_bf16"], 27.0 * 576.0 * 2.0);
    assert_eq!(v["mla"]["q_lora_rank"], serde_json::Value::Null);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.json");
    std::fs::write(&bad, r#"{"num_hidden_layers": 2}"#).unwrap();
    let out = Command::new(bin).args(["models", "show", bad.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("config.json") && err.contains("'hidden_size'"), "{err}");
}
