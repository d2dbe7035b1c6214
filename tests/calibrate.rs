//! Calibration end to end on synthetic measurements whose true kernel times are known:
//! t = 4 us + SOL / 0.7 on every GPU (a latency term plus a constant efficiency), so a correct
//! fit predicts held-out shapes and unseen GPUs almost exactly.

use kernelsight::kernels::cost::Routing;
use kernelsight::calibrate::dataset::Measurement;
use kernelsight::calibrate::model::FitParams;
use kernelsight::calibrate::store::Store;
use kernelsight::calibrate::{self, validate, Data};
use kernelsight::hardware::{builtin_specs, load_gpu};
use kernelsight::perf::efficiency::KernelModel;
use kernelsight::perf::sol::sol;
use kernelsight::perf::Tier;
use kernelsight::schema::{Dtype, Kernel, Op};

fn truth_us(k: &Kernel, gpu: &str) -> f64 {
    4.0 + sol(k, &load_gpu(gpu).unwrap()).sol_us / 0.7
}

fn synthetic(gpus: &[&str]) -> Data {
    let mut rows = Vec::new();
    if gpus.contains(&"h200_sxm") {
        for t in 1..=60u64 {
            let mut k = Kernel::new(Op::Rmsnorm, Dtype::Bf16);
            (k.num_tokens, k.hidden) = (t * 64, 4096);
            rows.push(Measurement {
                latency_us: truth_us(&k, "h200_sxm"),
                kernel: k,
                gpu: "h200_sxm".into(),
                backend: "lib".into(),
                source: "synthetic".into(),
                routing: Routing::Uniform,
            });
        }
    }
    for g in gpus {
        for m in [1u64, 4, 16, 64, 256, 1024, 4096, 16384] {
            for n in [512u64, 1024, 2048, 4096, 8192] {
                for k in [1024u64, 4096, 8192] {
                    let kern = Kernel::gemm(Dtype::Bf16, m, n, k);
                    rows.push(Measurement {
                        latency_us: truth_us(&kern, g),
                        kernel: kern,
                        gpu: g.to_string(),
                        backend: "lib".into(),
                        source: "synthetic".into(),
                        routing: Routing::Uniform,
                    });
                }
            }
        }
    }
    Data::from_rows(rows, builtin_specs().unwrap())
}

fn small_params() -> FitParams {
    let mut p = FitParams::default();
    p.gbdt.trees = 60;
    p
}

#[test]
fn held_out_shapes_and_gpus_are_predicted_from_the_physics() {
    let data = synthetic(&["a100_sxm", "h100_sxm", "h200_sxm"]);
    let rows = validate::validate_kernels(&data, &["h200_sxm".to_string()], &small_params()).unwrap().rows;
    let (pooled, _) = validate::summarize(&rows);
    let target = &pooled[&("target", "gemm".to_string())];
    let cross = &pooled[&("cross-gen", "gemm".to_string())];
    assert!(target.count > 10, "held-out fold has rows: {}", target.count);
    assert!(target.median_ape < 2.0, "target median APE {}", target.median_ape);
    assert!(cross.median_ape < 2.0, "cross-gen median APE {}", cross.median_ape);
    // Every held-out row is predicted by all three tiers, and never below SOL.
    assert_eq!(rows.iter().filter(|r| r.kernel.op == Op::Gemm).count(), 3 * target.count);
    // rmsnorm was measured on h200 alone: target and roofline rows, no cross-gen model exists.
    let norms: Vec<_> = rows.iter().filter(|r| r.kernel.op == Op::Rmsnorm).collect();
    assert!(!norms.is_empty() && norms.iter().all(|r| r.tier != Tier::CrossGen));
    assert!(rows.iter().all(|r| r.predicted_us >= r.sol_us * (1.0 - 1e-9)));
    // No held-out shape was in training: the fold is per shape.
    assert!(rows.iter().all(validate_is_fold0));

    // The log-log plot: one point per row and tier (few enough to draw all), in PNG and SVG.
    let dir = tempfile::tempdir().unwrap();
    kernelsight::calibrate::plot::predicted_vs_measured(dir.path(), "p", &rows).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("p.svg")).unwrap();
    assert!(svg.matches("<circle").count() >= rows.len(), "{} circles", svg.matches("<circle").count());
    assert!(svg.contains("cross-gen") && svg.contains("measured us"));
    assert!(std::fs::metadata(dir.path().join("p.png")).unwrap().len() > 1000);
}

fn validate_is_fold0(r: &validate::ValRow) -> bool {
    kernelsight::calibrate::dataset::shape_fold(&r.kernel, validate::FOLDS) == 0
}

#[test]
fn calibrate_writes_files_the_runtime_loads_with_fallbacks() {
    let data = synthetic(&["h100_sxm", "h200_sxm"]);
    let cal = calibrate::calibrate(&data, None, &small_params()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    calibrate::write_calibration(&cal, &data, dir.path(), "test").unwrap();
    let store = Store::Dir(dir.path().to_path_buf());

    let h200 = load_gpu("h200_sxm").unwrap();
    let m = KernelModel::load_from(&store, &h200, Tier::Target).unwrap();
    assert_eq!(m.tier_used(), Tier::Target);
    assert!(m.warnings().is_empty(), "{:?}", m.warnings());
    let k = Kernel::gemm(Dtype::Bf16, 512, 4096, 4096);
    let p = m.predict_us(&k);
    let t = truth_us(&k, "h200_sxm");
    assert!((p - t).abs() / t < 0.03, "predicted {p} vs true {t}");

    // A GPU with no measurements: target falls back to cross-gen and says so.
    let b200 = load_gpu("b200_sxm").unwrap();
    let m = KernelModel::load_from(&store, &b200, Tier::Target).unwrap();
    assert_eq!(m.tier_used(), Tier::CrossGen);
    assert!(m.warnings().iter().any(|w| w.contains("b200_sxm") && w.contains("cross-gen")), "{:?}", m.warnings());
    let p = m.predict_us(&k);
    assert!(p >= sol(&k, &b200).sol_us);

    // Ops with no data anywhere use the fitted roofline constants, still >= SOL.
    let mut add = Kernel::new(Op::Add, Dtype::Bf16);
    add.num_tokens = 4096;
    add.hidden = 8192;
    assert_eq!(m.tier_for(Op::Add), Tier::Roofline);
    assert!(m.predict_us(&add) >= sol(&add, &b200).sol_us);

    // The cross-gen model of a measured GPU is the one that never saw it.
    let m = KernelModel::load_from(&store, &h200, Tier::CrossGen).unwrap();
    assert_eq!(m.tier_used(), Tier::CrossGen);
    // rmsnorm was measured on h200 alone: the all-GPU set has a model of it, but that model
    // saw h200, so h200's cross-gen must not use it.
    assert!(dir.path().join("cross-gen/all.json.gz").exists());
    assert_eq!(m.tier_for(Op::Rmsnorm), Tier::Roofline);
    let h100 = load_gpu("h100_sxm").unwrap();
    let m100 = KernelModel::load_from(&store, &h100, Tier::CrossGen).unwrap();
    assert_eq!(m100.tier_for(Op::Rmsnorm), Tier::CrossGen);
    let set = store.model_set("cross-gen/no_h200_sxm.json").unwrap().expect("leave-h200-out set");
    assert_eq!(set.trained_on, vec!["h100_sxm".to_string()]);
}

#[test]
fn every_spec_gpu_gets_a_cross_gen_prediction_from_the_embedded_calibration() {
    for g in builtin_specs().unwrap() {
        let m = KernelModel::load(&g, Tier::CrossGen).unwrap();
        let k = Kernel::gemm(Dtype::Bf16, 128, 4096, 4096);
        let p = m.predict_us(&k);
        assert!(p.is_finite() && p >= sol(&k, &g).sol_us, "{}: {p}", g.id);
    }
}

#[test]
fn bad_files_are_named_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("x.csv"),
        "op,dtype,m,n,k,latency_us,gpu\ngemm,bf16,8,8,8,3.5,h200_sxm\ngemm,bf16,8,8,8,3.5,tpu_v9\n",
    )
    .unwrap();
    let err = Data::load(&[dir.path().to_path_buf()]).err().expect("unknown gpu must fail");
    let msg = format!("{err:#}");
    assert!(msg.contains("x.csv: line 3") && msg.contains("tpu_v9"), "{msg}");
    std::fs::write(dir.path().join("x.csv"), "op,dtype,m,n,k,latency_us,gpu\ngemm,bf16,8,8,8,-1,h200_sxm\n").unwrap();
    let msg = format!("{:#}", Data::load(&[dir.path().to_path_buf()]).err().unwrap());
    assert!(msg.contains("x.csv: line 2") && msg.contains("latency_us"), "{msg}");
}

/// The shipped target models grow with the work: doubling a kernel's size never makes its
/// predicted time drop by more than 20 % (the measured times are monotone within noise for
/// these series). Trees that chase one data source's noise break this first: the H100 model
/// once predicted vLLM's custom all-reduce on 4 GPUs at 15.8 us for 128 KiB and 3.0 us for
/// 256 KiB (measured 5.8, 7.1). Checked with each op's default library on five GPUs and with
/// vLLM's libraries on H100 (A100's custom all-reduce rows themselves jump at 4 KiB on 8 GPUs:
/// 5.6, 14.8, 6.3 us). The cross-gen tier (each GPU priced with its own rows left out) is held to
/// the same rule: until session 43 the README listed B200's cross-gen GEMMs as breaking it from
/// m = 16 to m = 32 (22-25 % drops, session 25).
#[test]
fn shipped_predictions_grow_with_size() {
    let vllm = kernelsight::sim::engine::EngineParams::load("vllm").unwrap().op_backends().unwrap();
    for gpu in ["h200_sxm", "h100_sxm", "b200_sxm", "a100_sxm", "l40s"] {
        let g = load_gpu(gpu).unwrap();
        let mut models = vec![KernelModel::load(&g, Tier::Target).unwrap(), KernelModel::load(&g, Tier::CrossGen).unwrap()];
        if gpu == "h100_sxm" {
            models.push(KernelModel::load(&g, Tier::Target).unwrap().with_op_backends(&vllm));
        }
        let mut series: Vec<(String, Vec<Kernel>)> = Vec::new();
        for (n, k) in [(4096u64, 4096u64), (14336, 4096), (4096, 14336)] {
            series.push((format!("gemm n={n} k={k}"), (1..=13).map(|p| Kernel::gemm(Dtype::Bf16, 1 << p, n, k)).collect()));
        }
        for n in [2u64, 4, 8] {
            let ar = |p: u32| Kernel { bytes: 1 << p, num_gpus: n, ..Kernel::new(Op::AllReduce, Dtype::Bf16) };
            series.push((format!("all_reduce x{n}"), (10..=30).map(ar).collect()));
        }
        for b in [1u64, 32] {
            let d = |p: u32| Kernel { batch: b, kv_len: 1 << p, num_heads: 32, num_kv_heads: 8, head_dim: 128, ..Kernel::new(Op::AttnDecode, Dtype::Bf16) };
            series.push((format!("attn_decode b={b}"), (7..=16).map(d).collect()));
        }
        let moe = |p: u32| Kernel { num_tokens: 1 << p, hidden: 4096, inter: 14336, topk: 2, num_experts: 8, tp: 1, ep: 1, ..Kernel::new(Op::Moe, Dtype::Bf16) };
        series.push(("moe".into(), (0..=13).map(moe).collect()));
        for km in &models {
            for (name, ks) in &series {
                let t: Vec<f64> = ks.iter().map(|k| km.predict_us(k)).collect();
                for (i, w) in t.windows(2).enumerate() {
                    assert!(w[1] >= 0.8 * w[0], "{gpu} {name}: step {i} {:.2} -> {:.2} us", w[0], w[1]);
                }
            }
        }
    }
}

#[test]
fn a_library_fitted_on_its_own_path_is_predicted_by_that_path() {
    // transformers' eager attention with sinks (gpt-oss) is a chain of torch kernels 20-30x
    // slower than the fused attention sharing its op; the shipped H200 model fits it apart
    // (`by_path["eager_sinks"]`) and a kernel naming that library must reach that model.
    // Measured (microbench/data/h200_sxm/h200_sxm_eager_sinks.csv): 1,999 us at 64 queries x
    // (16,384 + 64) keys, 64/8 heads of 64 dims.
    let g = load_gpu("h200_sxm").unwrap();
    let km = KernelModel::load(&g, Tier::Target).unwrap();
    let k = Kernel { batch: 1, seq_len: 64, kv_len: 16384, num_heads: 64, num_kv_heads: 8, head_dim: 64, ..Kernel::new(Op::AttnPrefill, Dtype::Bf16) };
    let eager = km.predict_us_with(&k, Some("torch_eager_sinks"));
    assert!((eager / 1999.0 - 1.0).abs() < 0.25, "eager sink attention predicted {eager:.0} us, measured 1999 us");
    let fused = km.predict_us(&k);
    assert!(eager > 5.0 * fused, "eager {eager:.0} us vs fused {fused:.0} us");
}
