//! Public-silicon validation (`e2e::silicon`): structure of the report, APE arithmetic,
//! rows that cannot be simulated, bad input, and that `kernelsight simulate` reproduces a point.

use kernelsight::e2e::silicon::{rows, run, validate_silicon};
use kernelsight::e2e::stats::ape;
use kernelsight::perf::Tier;
use std::io::Write;
use std::path::{Path, PathBuf};

const HEADER: &str = "id,backend,backend_version,model_path,system,mode,isl,osl,gemm_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,moe_ep_size,silicon_ttft_ms,silicon_tpot_ms";

fn csv_file(dir: &Path, lines: &[&str]) -> PathBuf {
    let p = dir.join("silicon.csv");
    let mut f = std::fs::File::create(&p).unwrap();
    writeln!(f, "{HEADER}").unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    p
}

/// Small Llama-3.1-8B points (short prompts and answers keep the debug build fast).
const LOW_C: &str = "a,trtllm,1.0,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,agg,128,16,,4,1,1,,1,1,20.0,5.0";
const HIGH_C: &str = "b,trtllm,1.0,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,agg,128,16,,64,1,1,,1,1,60.0,9.0";

#[test]
fn more_clients_give_a_longer_predicted_tpot_and_ape_is_relative_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = csv_file(dir.path(), &[LOW_C, HIGH_C]);
    let rep = validate_silicon(&path, &[Tier::Roofline], None, Default::default()).unwrap();
    assert_eq!((rep.rows_read, rep.rows_simulated, rep.rows_not_simulated), (2, 2, 0));
    let pred = |id: &str| rep.rows.iter().find(|r| r.row.id == id).unwrap().predictions["roofline"];
    let (lo, hi) = (pred("a"), pred("b"));
    // 64 sequences per decode step read 16x the KV and run 16x the tokens of 4: slower steps.
    assert!(hi.tpot_ms > lo.tpot_ms, "{} vs {}", hi.tpot_ms, lo.tpot_ms);
    assert!(hi.ttft_ms > lo.ttft_ms, "64 prompts at once take longer to prefill than 4");
    // The group statistics are APEs of these two predictions against the file's numbers.
    let apes = [ape(lo.tpot_ms, 5.0), ape(hi.tpot_ms, 9.0)];
    let s = &rep.tiers["roofline"]["trtllm"].all.tpot;
    assert_eq!(s.count, 2);
    assert!((s.median_ape - (apes[0] + apes[1]) / 2.0).abs() < 1e-9);
    assert!((s.max_ape - apes[0].max(apes[1])).abs() < 1e-9);
    assert!((ape(lo.tpot_ms, 5.0) - (lo.tpot_ms - 5.0).abs() / 5.0 * 100.0).abs() < 1e-12);
    // JSON: tier -> backend -> metric -> statistics.
    let j = serde_json::to_value(&rep).unwrap();
    assert_eq!(j["tiers"]["roofline"]["trtllm"]["tpot"]["count"], 2);
    assert!(j["tiers"]["roofline"]["trtllm"]["ttft"]["median_ape"].is_number());
    assert!(j["tiers"]["roofline"]["all_backends"]["splits"]["calibration"]["tpot"]["p90_ape"].is_number());
    // Calibrated tiers are either reported or listed as unavailable, never silently dropped.
    let rep2 = validate_silicon(&path, &[Tier::Roofline, Tier::Target], None, Default::default()).unwrap();
    assert!(rep2.tiers.contains_key("target") || rep2.unavailable_tiers.contains_key("target"));
    let text = rep.render();
    assert!(text.contains("trtllm") && text.contains("Worst runs by TPOT"), "{text}");
    rep.write_csv(dir.path()).unwrap();
    let out = std::fs::read_to_string(dir.path().join("silicon_rows.csv")).unwrap();
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains("kernelsight simulate --model llama-3.1-8b"));
}

#[test]
fn rows_that_cannot_be_simulated_are_listed_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = csv_file(
        dir.path(),
        &[
            LOW_C,
            "m,sglang,0.5,deepseek-ai/DeepSeek-R1,h100_sxm,agg,128,16,fp8,4,8,1,,8,1,20,5",
            "d,trtllm,0.8,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,disagg,128,16,,,,,,,,20,5",
            "p,sglang,0.5,Qwen/Qwen3-235B-A22B-FP8,h100_sxm,agg,128,16,fp8,4,8,1,8,1,8,20,5",
            "q,vllm,0.12,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,agg,128,16,int4_awq,4,1,1,,1,1,20,5",
        ],
    );
    let rep = validate_silicon(&path, &[Tier::Roofline], None, Default::default()).unwrap();
    assert_eq!((rep.rows_read, rep.rows_simulated, rep.rows_not_simulated), (5, 1, 4));
    let reason = |id: &str| rep.not_simulated.iter().find(|s| s.id == id).unwrap().reason.clone();
    assert!(reason("m").contains("no config"), "{}", reason("m"));
    assert!(reason("d").contains("disaggregated"), "{}", reason("d"));
    assert!(reason("p").contains("attention data parallelism"), "{}", reason("p"));
    assert!(reason("q").contains("int4_awq"), "{}", reason("q"));
    assert!(rep.render().contains("Not simulated (4 rows)"));
}

#[test]
fn bad_input_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = csv_file(dir.path(), &[LOW_C, "x,trtllm,1.0,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,agg,12x,16,,4,1,1,,1,1,20,5"]);
    let e = format!("{:#}", validate_silicon(&path, &[Tier::Roofline], None, Default::default()).unwrap_err());
    assert!(e.contains("silicon.csv") && e.contains("line 3") && e.contains("'isl'"), "{e}");
    let path = csv_file(dir.path(), &["y,trtllm,1.0,meta-llama/Llama-3.1-8B-Instruct,h100_sxm,agg,128,16,,4,1,1,,1,1,20,-5"]);
    let e = format!("{:#}", validate_silicon(&path, &[Tier::Roofline], None, Default::default()).unwrap_err());
    assert!(e.contains("line 2") && e.contains("silicon_tpot_ms"), "{e}");
    let p = dir.path().join("nocol.csv");
    std::fs::write(&p, "backend,model_path,silicon_ttft_ms\nvllm,x,1\n").unwrap();
    let e = format!("{:#}", validate_silicon(&p, &[Tier::Roofline], None, Default::default()).unwrap_err());
    assert!(e.contains("nocol.csv") && e.contains("missing column 'silicon_tpot_ms'"), "{e}");
}

#[test]
fn the_printed_simulate_command_reproduces_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let path = csv_file(dir.path(), &["e,trtllm,1.0,Qwen/Qwen3-235B-A22B-FP8,h100_sxm,agg,128,8,fp8_block,8,4,1,,1,4,20,5"]);
    let rep = validate_silicon(&path, &[Tier::Roofline], None, Default::default()).unwrap();
    let r = &rep.rows[0];
    assert_eq!((r.point.model.as_str(), r.point.tp, r.point.ep), ("qwen3-235b-a22b", 4, 4));
    // The same flags through the CLI's own code path give the same means.
    let args = run::simulate_args(&r.point, Tier::Roofline).unwrap();
    let report = kernelsight::cli::simulate::execute(&args).unwrap();
    assert_eq!(report.summary.tpot_ms.mean, r.predictions["roofline"].tpot_ms);
    assert_eq!(report.summary.ttft_ms.mean, r.predictions["roofline"].ttft_ms);
}

#[test]
fn shipped_sample_maps_every_model_and_limit_bounds_the_work() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/public/silicon_h100_sxm_agg.csv");
    let all = rows::load(&path, None).unwrap();
    assert_eq!(all.len(), 810);
    // Every row of the curated sample has a model under models/ and an engine profile; the only
    // rows not simulated are MiniMax-M2.5's 15 whose layout columns say attention DP 4 and
    // gpt-oss-120b's 5 TensorRT-LLM rows whose batch_size is a share of their clients.
    let (mut attention_dp, mut share) = (0, 0);
    for r in &all {
        if let Err(e) = rows::plan(r) {
            if e.contains("attention data parallelism") && r.model_path.contains("MiniMax-M2.5") {
                attention_dp += 1;
            } else {
                assert!(e.contains("per replica") && r.model_path.contains("gpt-oss") && r.backend == "trtllm", "line {}: {e}", r.line);
                share += 1;
            }
        }
    }
    assert_eq!((attention_dp, share), (15, 5));
    let rep = validate_silicon(&path, &[Tier::Roofline], Some(3), Default::default()).unwrap();
    assert_eq!(rep.rows_read, 3);
    assert_eq!(rep.rows_simulated + rep.rows_not_simulated, 3);
}

#[test]
fn the_benchmark_client_comes_from_the_provenance_and_sets_the_simulated_workload() {
    use rows::Client;
    // Upstream `silicon_data_source` strings, one of each campaign (shared/data/aiconfigurator).
    assert_eq!(Client::from_source("source_file=2026-04-06.csv; config_id=12; measured=2025-10-29T00:00:00Z; wip=False"), Client::InferenceMax);
    assert_eq!(Client::from_source("source_file=data/h100_sxm/vllm/0.12.0/Qwen3-32B.csv; silicon_concurrency=16"), Client::Undocumented);
    assert_eq!(Client::from_source("db-dump/2026-04-27; config_id=494; measured=2026-02-08"), Client::Undocumented);
    // The shipped copy records it per row: the vLLM InferenceX rows of the three models it has.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/public/silicon_h100_sxm_agg.csv");
    let all = rows::load(&path, None).unwrap();
    let imax: Vec<_> = all.iter().filter(|r| r.client == Client::InferenceMax).collect();
    assert_eq!(imax.len(), 45 + 69 + 30);
    assert!(imax.iter().all(|r| r.backend == "vllm" && ["Llama-3.1-70B", "gpt-oss-120b", "MiniMax-M2.5"].iter().any(|m| r.model_path.contains(m))));
    // An InferenceMAX point sends 10 requests per client with lengths in [0.8 L, L].
    let p = rows::plan(imax[0]).unwrap();
    assert_eq!(p.num_requests, 10 * p.concurrency);
    let flags = p.simulate_flags(Tier::Roofline).join(" ");
    assert!(flags.contains("--workload uniform-upto --range-ratio 0.8 --client-turnaround-ms 1"), "{flags}");
    let args = run::simulate_args(&p, Tier::Roofline).unwrap();
    let spec = args.workload.to_spec(1.0).unwrap();
    assert_eq!(spec.lengths, kernelsight::workload::Lengths::UniformUpTo { isl: p.isl, osl: p.osl, low_ratio: 0.8 });
    // InferenceX's H100 recipe for Llama-3.1-70B FP8 serves an fp8 KV cache; gpt-oss's does not.
    let llama = rows::plan(imax.iter().find(|r| r.model_path.contains("Llama-3.1-70B")).unwrap()).unwrap();
    assert!(llama.simulate_flags(Tier::Roofline).join(" ").contains("--kv-dtype fp8"));
    let gpt = rows::plan(imax.iter().find(|r| r.model_path.contains("gpt-oss")).unwrap()).unwrap();
    let gpt_flags = gpt.simulate_flags(Tier::Roofline).join(" ");
    assert!(!gpt_flags.contains("--kv-dtype") && gpt_flags.contains("--prefix-caching false"), "{gpt_flags}");
    // MiniMax-M2.5's recipe keeps vLLM 0.18's defaults (prefix caching on, async scheduling on)
    // and runs TP4 with expert parallelism.
    let mm = imax.iter().find(|r| r.model_path.contains("MiniMax-M2.5") && r.attention_dp_size.unwrap_or(1) == 1).unwrap();
    let mm = rows::plan(mm).unwrap();
    assert_eq!((mm.model.as_str(), mm.tp, mm.ep, mm.dtype), ("minimax-m2.5", 4, 4, kernelsight::schema::Dtype::Fp8));
    let mm_flags = mm.simulate_flags(Tier::Roofline).join(" ");
    assert!(mm_flags.contains("--async-scheduling true") && !mm_flags.contains("--prefix-caching"), "{mm_flags}");
    // An undocumented client keeps the row's fixed lengths.
    let u = rows::plan(all.iter().find(|r| r.client == Client::Undocumented).unwrap()).unwrap();
    assert!(!u.simulate_flags(Tier::Roofline).join(" ").contains("--workload"));
    assert_eq!(u.num_requests, (3 * u.concurrency).max(16));
    // Replayed as aiconfigurator's generator benchmarks (a hypothesis, not the default): 50
    // requests per client, and TensorRT-LLM / vLLM built for c clients and c + isl + 1500 tokens.
    use rows::UndocumentedClient::AiconfiguratorBench;
    let trt = all.iter().find(|r| r.client == Client::Undocumented && r.backend == "trtllm").unwrap();
    let b = rows::plan_assuming(trt, AiconfiguratorBench).unwrap();
    assert_eq!((b.client, b.num_requests), (Client::AiconfiguratorBench, 50 * b.concurrency));
    let budget = format!("--max-num-batched-tokens {} --max-num-seqs {}", b.concurrency + b.isl + 1500, b.concurrency);
    assert!(b.simulate_flags(Tier::Roofline).join(" ").contains(&budget), "{budget}");
    let args = run::simulate_args(&b, Tier::Roofline).unwrap();
    assert_eq!(args.scenario().unwrap().cfg.engine.max_num_batched_tokens, b.concurrency + b.isl + 1500);
    // InferenceMAX rows keep their documented client whatever is assumed for the others.
    assert_eq!(rows::plan_assuming(imax[0], AiconfiguratorBench).unwrap(), p);
    // A `client` column, when given, must name a known client.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("client.csv");
    std::fs::write(&bad, format!("{HEADER},client\n{LOW_C},vidur\n")).unwrap();
    let e = format!("{:#}", validate_silicon(&bad, &[Tier::Roofline], None, Default::default()).unwrap_err());
    assert!(e.contains("line 2") && e.contains("'client'") && e.contains("inferencemax"), "{e}");
}

#[test]
fn a_row_whose_batch_size_is_a_share_of_the_benchmark_concurrency_is_not_simulated() {
    // Upstream's gpt-oss-120b TensorRT-LLM rows: batch_size 48, the run's concurrency 192 (its
    // id says c192) at TP 4, no attention DP in the layout columns. The curated copy carries the
    // concurrency as a column; upstream's own file in its silicon_data_source.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/public/silicon_h100_sxm_agg.csv");
    let all = rows::load(&path, None).unwrap();
    let r = all.iter().find(|r| r.id.contains("gpt_oss_120b_h100_sxm_trtllm_agg_4000x1000_c192_tp4")).unwrap();
    assert_eq!((r.batch_size, r.silicon_concurrency), (Some(48), Some(192)));
    let e = rows::plan(r).unwrap_err();
    assert!(e.contains("silicon_concurrency") && e.contains("per replica"), "{e}");
    let differ = all.iter().filter(|r| r.silicon_concurrency.is_some_and(|c| Some(c) != r.batch_size)).count();
    assert_eq!(differ, 20, "the 5 gpt-oss TensorRT-LLM rows and the 15 attention-DP MiniMax rows");
    let dir = tempfile::tempdir().unwrap();
    let upstream = dir.path().join("up.csv");
    std::fs::write(
        &upstream,
        "backend,model_path,system,isl,osl,batch_size,tp_size,silicon_ttft_ms,silicon_tpot_ms,silicon_data_source\n\
         trtllm,openai/gpt-oss-120b,h100_sxm,4000,1000,48,4,1590,48.8,source_file=data/x.csv; gtl_job_id=1; silicon_concurrency=48\n\
         trtllm,openai/gpt-oss-120b,h100_sxm,4000,1000,48,4,1590,48.8,source_file=data/x.csv; silicon_concurrency=192\n\
         trtllm,openai/gpt-oss-120b,h100_sxm,4000,1000,48,4,1590,48.8,source_file=data/x.csv; silicon_concurrency=many\n",
    )
    .unwrap();
    let e = rows::load(&upstream, None).unwrap_err().to_string();
    assert!(e.contains("line 4") && e.contains("silicon_concurrency"), "{e}");
    let two = rows::load(&upstream, Some(2)).unwrap();
    assert_eq!(rows::plan(&two[0]).unwrap().concurrency, 48);
    assert!(rows::plan(&two[1]).is_err());
}
