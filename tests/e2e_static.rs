//! transformers' static `generate` batches: step time apart from scheduling.
use kernelsight::e2e::static_steps::{load, parse_line, validate, StaticKind};
use kernelsight::perf::Tier;
use serde_json::json;
use std::path::PathBuf;

fn dirs() -> Vec<PathBuf> {
    ["h200_sxm", "h200_sxm_cudagraph", "h200_sxm_tp2"].iter().map(|d| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("calibration/traces").join(d)).collect()
}

#[test]
fn bad_static_lines_name_the_file_line_and_field() {
    let ok = json!({"kind": "decode", "status": "ok", "batch": 8, "seq_len": 512, "new_tokens": 16, "decode_step_ms_median": 22.5});
    let s = parse_line(&ok, "m", "m", 1, "f: line 1").unwrap().expect("an ok line parses");
    assert_eq!((s.kind, s.batch, s.seq_len), (StaticKind::Decode, 8, 512));
    // The median step sits half-way through the generated tokens.
    assert!(s.batch_work().iter().all(|w| w.new_tokens == 1 && w.cached_tokens == 520));
    let failed = json!({"kind": "prefill", "status": "failed", "error": "OOM"});
    assert!(parse_line(&failed, "m", "m", 1, "f: line 2").unwrap().is_none(), "lines that did not run are left out");
    let cases = [
        (json!({"kind": "decode", "status": "ok", "batch": 8, "seq_len": 512, "new_tokens": 16, "decode_step_ms_median": -1.0}), "decode_step_ms_median"),
        (json!({"kind": "prefill", "status": "ok", "batch": 0, "seq_len": 512, "prefill_ms": 3.0}), "batch"),
        (json!({"kind": "prefil", "status": "ok"}), "'prefill' or 'decode'"),
        (json!({"kind": "prefill", "status": "ok", "batch": 1, "seq_len": 512}), "prefill_ms"),
    ];
    for (v, needle) in cases {
        let msg = format!("{:#}", parse_line(&v, "m", "m", 1, "static.jsonl: line 7").unwrap_err());
        assert!(msg.contains("static.jsonl: line 7") && msg.contains(needle), "{msg}");
    }
}

#[test]
fn models_the_profile_cannot_price_are_listed_with_the_reason() {
    let set = load(&dirs()).unwrap();
    let skipped: Vec<&str> = set.skipped.iter().map(|s| s.label.as_str()).collect();
    assert!(skipped.iter().any(|l| l.ends_with("/deepseek-v2-lite")), "MLA runs skipped: {skipped:?}");
    assert!(skipped.iter().any(|l| l.ends_with("/gpt-oss-20b")), "sink-attention runs skipped: {skipped:?}");
    assert!(set.steps.iter().all(|s| !s.label.starts_with("gpt-oss") && !s.label.starts_with("deepseek")));
    assert!(set.steps.iter().any(|s| s.tp == 2), "the TP2 folder's lines carry tp = 2");
}

/// Large static prefills keep the GPU busier than Python's launches: their time is the kernel
/// graph's. On families that fitted nothing, the calibrated tiers must price them within the
/// issue's 10 % (TTFT) and far better than the plain roofline.
#[test]
fn gpu_bound_static_prefills_of_held_out_families_beat_the_roofline() {
    let set = load(&dirs()).unwrap();
    let host = kernelsight::e2e::static_steps::fit_host(&set, Tier::Target).unwrap().expect("the folders hold static lines");
    let report = validate(&set, &[Tier::Target, Tier::CrossGen, Tier::Roofline], &host).unwrap();
    let median = |tier: &str| {
        let apes: Vec<f64> = report.rows.iter().filter(|r| r.tier == tier && r.split == "held-out" && r.kind == StaticKind::Prefill && r.gpu_bound).map(|r| r.ape).collect();
        assert!(apes.len() >= 5, "{tier}: {} GPU-bound held-out prefills", apes.len());
        kernelsight::quantile::median(&apes)
    };
    let (target, cross, roofline) = (median("target"), median("cross-gen"), median("roofline"));
    assert!(target < 10.0 && cross < 10.0, "median APE target {target:.1} %, cross-gen {cross:.1} %");
    assert!(roofline > 3.0 * target.max(cross), "roofline {roofline:.1} % vs target {target:.1} %, cross-gen {cross:.1} %");
}

/// `simulate --engine hf-generate` must time steps with the host model the static lines were
/// checked with, not a placeholder or a stale fit: the shipped file is `fit_host`'s (target
/// tier), with a dispatch cost per aten op and a tensor-parallel hook term of the size Python
/// gives (microseconds per op, hundreds per layer), and the hooks only where hooks run.
#[test]
fn the_shipped_generate_host_is_the_static_fit() {
    use kernelsight::e2e::static_steps::{fit_host, load, ENGINE};
    use kernelsight::perf::host::HostOverhead;
    let shipped = HostOverhead::for_engine(ENGINE).unwrap();
    let fitted = fit_host(&load(&dirs()).unwrap(), Tier::Target).unwrap().expect("the folders hold static lines");
    // Equal to the last digits a JSON round trip keeps.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    let same = close(shipped.per_step_us, fitted.per_step_us)
        && close(shipped.launch_per_host_op_us, fitted.launch_per_host_op_us)
        && close(shipped.tp_launch_per_layer_us, fitted.tp_launch_per_layer_us)
        && shipped.source == fitted.source;
    assert!(same, "calibration/host/{ENGINE}.json is stale: rerun `validate e2e --fit-host`\nshipped {shipped:?}\nfitted {fitted:?}");
    assert!((3.0..30.0).contains(&fitted.launch_per_host_op_us), "{} us per aten op", fitted.launch_per_host_op_us);
    assert!((100.0..2_000.0).contains(&fitted.tp_launch_per_layer_us), "{} us/layer", fitted.tp_launch_per_layer_us);
    assert!(close(HostOverhead::for_engine("hf").unwrap().tp_launch_per_layer_us, fitted.tp_launch_per_layer_us), "hf.json carries the same hook term");
    assert_eq!(HostOverhead::for_engine("hf-cudagraph").unwrap().tp_launch_per_layer_us, 0.0, "graph replay runs no hooks");
}

/// The eager profiles' aten-op counts (`[host_ops]`) are the probe's: one layer of each probed
/// model (its 4-layer forward less its 2-layer one, `h200_sxm_eager_host_ops.json`) against what
/// the `hf` profile counts for the same two layers of an 8-token step. Within 12 %: the profile
/// keeps one count per op where families differ a little (Gemma-3's norms, each family's router).
#[test]
fn the_eager_profile_counts_the_aten_ops_the_probe_counted() {
    use kernelsight::deployment::Deployment;
    use kernelsight::hardware::load_gpu;
    use kernelsight::model::ModelConfig;
    use kernelsight::perf::efficiency::KernelModel;
    use kernelsight::perf::host::HostOverhead;
    use kernelsight::perf::predictor::Predictor;
    use kernelsight::perf::SeqWork;
    use kernelsight::sim::engine::EngineParams;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("microbench/data/h200_sxm/h200_sxm_eager_host_ops.json");
    let probe: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (gpu, engine) = (load_gpu("h200_sxm").unwrap(), EngineParams::load("hf").unwrap());
    let mut checked = 0;
    for name in ["llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.1", "gemma-3-27b-it", "qwen3-30b-a3b", "mixtral-8x7b-v0.1", "gpt-oss-20b"] {
        let ops = |layers: u32| probe["models"][format!("{name}-L{layers}")]["aten_ops"].as_f64().unwrap();
        let measured = (ops(4) - ops(2)) / 2.0;
        let counted = |layers: usize| {
            let mut m = ModelConfig::load(name).unwrap();
            m.layers.truncate(layers);
            m.num_layers = layers as u64;
            let p = Predictor::for_engine(&m, &gpu, &Deployment::default(), KernelModel::load(&gpu, Tier::Target).unwrap(), &engine, HostOverhead::zero(), 1 << 16).unwrap();
            p.step_host_ops(&[SeqWork { new_tokens: 8, cached_tokens: 0 }]) as f64
        };
        let per_layer = (counted(4) - counted(2)) / 2.0;
        assert!((per_layer / measured - 1.0).abs() < 0.12, "{name}: the profile counts {per_layer} aten ops per layer, the probe {measured}");
        checked += 1;
    }
    assert_eq!(checked, 7);
}

/// The hook term reaches a step: at tp = 2 every layer of a host-bound eager decode pays it on
/// top of its launches, at tp = 1 none does.
#[test]
fn tensor_parallel_hooks_are_charged_per_layer_at_tp_above_one() {
    use kernelsight::deployment::Deployment;
    use kernelsight::hardware::load_gpu;
    use kernelsight::model::ModelConfig;
    use kernelsight::perf::efficiency::KernelModel;
    use kernelsight::perf::host::HostOverhead;
    use kernelsight::perf::predictor::Predictor;
    use kernelsight::perf::{SeqWork, StepTimeModel};
    use kernelsight::sim::engine::EngineParams;
    let (gpu, cfg) = (load_gpu("h200_sxm").unwrap(), ModelConfig::load("llama-3.1-8b").unwrap());
    let engine = EngineParams::load("hf-generate").unwrap();
    let work = vec![SeqWork { new_tokens: 1, cached_tokens: 512 }; 8];
    let step_ms = |tp: u64, host: HostOverhead| {
        let dep = Deployment { tp, ..Deployment::default() };
        let p = Predictor::for_engine(&cfg, &gpu, &dep, KernelModel::load(&gpu, Tier::Target).unwrap(), &engine, host, 8 * 520).unwrap();
        p.step_time(&work).total_us / 1e3
    };
    let hooks = HostOverhead::for_engine("hf-generate").unwrap();
    let none = HostOverhead { tp_launch_per_layer_us: 0.0, ..hooks.clone() };
    let added_ms = step_ms(2, hooks.clone()) - step_ms(2, none.clone());
    let expected_ms = hooks.tp_launch_per_layer_us * cfg.num_layers as f64 / 1e3;
    assert!(expected_ms > 1.0 && (added_ms - expected_ms).abs() < 1e-6 * expected_ms, "added {added_ms} ms, expected {expected_ms}");
    assert_eq!(step_ms(1, hooks), step_ms(1, none), "tp = 1 runs no hooks");
}
