//! Workload generator and trace reader behaviour.
use kernelsight::workload::{trace, Arrival, Lengths, RequestSpec, Sharing, WorkloadSpec};
use std::io::Write;

fn spec(n: u64, arrival: Arrival, lengths: Lengths, sharing: Sharing) -> WorkloadSpec {
    WorkloadSpec { num_requests: Some(n), arrival, lengths, sharing, seed: 7, trace: None }
}

fn all(s: &WorkloadSpec) -> Vec<RequestSpec> {
    let mut src = s.build().unwrap();
    let mut v = Vec::new();
    while let Some(r) = src.next_request().unwrap() {
        v.push(r);
    }
    v
}

fn gaps(v: &[RequestSpec]) -> Vec<f64> {
    v.windows(2).map(|w| w[1].arrival_s - w[0].arrival_s).collect()
}

fn mean_cv(x: &[f64]) -> (f64, f64) {
    let m = x.iter().sum::<f64>() / x.len() as f64;
    let var = x.iter().map(|g| (g - m).powi(2)).sum::<f64>() / x.len() as f64;
    (m, var.sqrt() / m)
}

#[test]
fn poisson_gaps_have_mean_one_over_rate_and_cv_one() {
    let v = all(&spec(20_000, Arrival::Rate { rate_per_s: 4.0, burstiness: 1.0 }, Lengths::Fixed { isl: 10, osl: 5 }, Sharing::None));
    assert_eq!(v.len(), 20_000);
    let (m, cv) = mean_cv(&gaps(&v));
    assert!((m - 0.25).abs() < 0.01, "mean gap {m}");
    assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    assert!(v.iter().all(|r| r.prompt_tokens == 10 && r.output_tokens == 5));
}

#[test]
fn gamma_burstiness_sets_cv_to_one_over_sqrt_shape() {
    let v = all(&spec(20_000, Arrival::Rate { rate_per_s: 2.0, burstiness: 0.25 }, Lengths::ShareGpt, Sharing::None));
    let (m, cv) = mean_cv(&gaps(&v));
    assert!((m - 0.5).abs() < 0.03, "mean gap {m}");
    assert!((cv - 2.0).abs() < 0.15, "cv {cv}");
}

#[test]
fn sharegpt_lengths_match_published_means() {
    let v = all(&spec(50_000, Arrival::Rate { rate_per_s: f64::INFINITY, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None));
    let mi = v.iter().map(|r| r.prompt_tokens as f64).sum::<f64>() / v.len() as f64;
    let mo = v.iter().map(|r| r.output_tokens as f64).sum::<f64>() / v.len() as f64;
    // vLLM paper, Fig. 11: 161 input / 338 output tokens on average (clamping trims a little).
    assert!((mi - 161.0).abs() / 161.0 < 0.05, "mean input {mi}");
    assert!((mo - 338.0).abs() / 338.0 < 0.05, "mean output {mo}");
    assert!(v.iter().all(|r| r.arrival_s == 0.0));
}

#[test]
fn uniform_lengths_stay_in_range() {
    let v = all(&spec(5000, Arrival::Rate { rate_per_s: 1.0, burstiness: 1.0 }, Lengths::Uniform { isl: 100, osl: 40, range_ratio: 0.5 }, Sharing::None));
    assert!(v.iter().all(|r| (50..=150).contains(&r.prompt_tokens) && (20..=60).contains(&r.output_tokens)));
    let mi = v.iter().map(|r| r.prompt_tokens as f64).sum::<f64>() / v.len() as f64;
    assert!((mi - 100.0).abs() < 2.0);
}

#[test]
fn same_seed_same_stream_and_rate_does_not_change_lengths() {
    let a = all(&spec(500, Arrival::Rate { rate_per_s: 3.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None));
    let b = all(&spec(500, Arrival::Rate { rate_per_s: 3.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None));
    assert_eq!(a, b);
    let c = all(&spec(500, Arrival::Rate { rate_per_s: 9.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None));
    assert!(a.iter().zip(&c).all(|(x, y)| x.prompt_tokens == y.prompt_tokens && x.output_tokens == y.output_tokens));
    assert_ne!(a[5].arrival_s, c[5].arrival_s);
}

#[test]
fn groups_prepend_their_system_prompt() {
    let v = all(&spec(1000, Arrival::Rate { rate_per_s: 5.0, burstiness: 1.0 }, Lengths::Fixed { isl: 30, osl: 4 }, Sharing::Groups { groups: 4, prefix_tokens: 200 }));
    assert!(v.iter().all(|r| r.prompt_tokens == 230 && r.prefix_tokens == 200 && r.prefix_group.unwrap() < 4));
    for g in 0..4 {
        assert!(v.iter().filter(|r| r.prefix_group == Some(g)).count() > 150);
    }
}

#[test]
fn sessions_grow_the_conversation_turn_by_turn() {
    let v = all(&spec(300, Arrival::Rate { rate_per_s: 2.0, burstiness: 1.0 }, Lengths::Fixed { isl: 50, osl: 20 }, Sharing::Sessions { turns: 3, think_time_s: 4.0 }));
    assert_eq!(v.len(), 300);
    assert!(v.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s), "arrival order");
    // Turn k of a session has prompt 50 + 70 k and shares all of prompt+output with its session.
    let s0: Vec<_> = v.iter().filter(|r| r.prefix_group == Some(0)).collect();
    assert_eq!(s0.len(), 3);
    assert_eq!(s0.iter().map(|r| r.prompt_tokens).collect::<Vec<_>>(), vec![50, 120, 190]);
    assert!((s0[1].arrival_s - s0[0].arrival_s - 4.0).abs() < 1e-9);
    assert!(v.iter().all(|r| r.prefix_tokens == r.prompt_tokens + r.output_tokens));
    // Overall request rate is --rate: 300 requests over about 150 s (+ think time tail).
    let span = v.last().unwrap().arrival_s;
    assert!(span > 120.0 && span < 190.0, "span {span}");
}

#[test]
fn generated_csv_replays_identically() {
    let s = spec(400, Arrival::Rate { rate_per_s: 7.0, burstiness: 0.5 }, Lengths::ShareGpt, Sharing::Groups { groups: 3, prefix_tokens: 64 });
    let orig = all(&s);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.csv");
    let mut f = std::fs::File::create(&path).unwrap();
    let n = trace::write_csv(s.build().unwrap().as_mut(), &mut f).unwrap();
    assert_eq!(n, 400);
    drop(f);
    let replay = WorkloadSpec { trace: Some(path), num_requests: None, ..s };
    let back = all(&replay);
    assert_eq!(orig, back);
}

fn trace_err(name: &str, text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
    let s = WorkloadSpec { trace: Some(path), ..spec(10, Arrival::Rate { rate_per_s: 1.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None) };
    let mut src = match s.build() {
        Ok(src) => src,
        Err(e) => return format!("{e:#}"),
    };
    loop {
        match src.next_request() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("trace {name} was accepted"),
            Err(e) => return format!("{e:#}"),
        }
    }
}

#[test]
fn bad_traces_name_the_line() {
    let e = trace_err("a.csv", "arrival_s,prompt_tokens\n0,5\n");
    assert!(e.contains("line 1") && e.contains("output_tokens"), "{e}");
    let e = trace_err("b.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,3\n0.5,-4,3\n");
    assert!(e.contains("line 3") && e.contains("prompt_tokens"), "{e}");
    let e = trace_err("c.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,3\n2,5,3\n1,5,3\n");
    assert!(e.contains("line 4") && e.contains("sorted"), "{e}");
    let e = trace_err("d.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,3\n1,5\n");
    assert!(e.contains("line 3") && e.contains("output_tokens"), "{e}");
    let e = trace_err("e.jsonl", "{\"arrival_s\":0,\"prompt_tokens\":5,\"output_tokens\":2}\n{\"arrival_s\":1,\"prompt_tokens\":5}\n");
    assert!(e.contains("line 2") && e.contains("output_tokens"), "{e}");
}

#[test]
fn jsonl_trace_with_named_groups() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, "{\"arrival_s\":0.5,\"prompt_tokens\":100,\"output_tokens\":3,\"prefix_group\":\"sys\",\"prefix_tokens\":40}\n\n{\"arrival_s\":0.7,\"prompt_tokens\":8,\"output_tokens\":1}\n").unwrap();
    let s = WorkloadSpec { trace: Some(path), num_requests: None, ..spec(1, Arrival::Rate { rate_per_s: 1.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None) };
    let v = all(&s);
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].prefix_tokens, 40);
    assert!(v[0].prefix_group.is_some());
    assert_eq!((v[1].prefix_group, v[1].prefix_tokens, v[1].arrival_s), (None, 0, 0.7));
}

#[test]
fn invalid_specs_are_rejected() {
    let bad = [
        spec(10, Arrival::Rate { rate_per_s: 0.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None),
        spec(10, Arrival::Rate { rate_per_s: -1.0, burstiness: 1.0 }, Lengths::ShareGpt, Sharing::None),
        spec(10, Arrival::Closed { concurrency: 0, turnaround_s: 0.0 }, Lengths::ShareGpt, Sharing::None),
        spec(0, Arrival::Closed { concurrency: 1, turnaround_s: 0.0 }, Lengths::ShareGpt, Sharing::None),
        spec(10, Arrival::Closed { concurrency: 1, turnaround_s: 0.0 }, Lengths::Fixed { isl: 0, osl: 3 }, Sharing::None),
    ];
    for s in bad {
        assert!(s.validate().is_err(), "{s:?}");
    }
}

#[derive(clap::Parser)]
struct GenCmd {
    #[command(subcommand)]
    command: kernelsight::cli::workload::WorkloadCommand,
}

#[test]
fn workload_gen_command_writes_the_csv() {
    use clap::Parser;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.csv");
    let cmd = GenCmd::try_parse_from(["x", "gen", "--rate", "4", "--num-requests", "25", "--turns", "5", "--out", out.to_str().unwrap()]).unwrap();
    kernelsight::cli::workload::run(kernelsight::cli::workload::WorkloadCmdArgs { command: cmd.command }).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(trace::CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 25);
    // Multi-turn rows carry their session as prefix group and share prompt + output.
    assert!(rows.iter().all(|r| r.len() == 5 && !r[3].is_empty()));
    assert!(rows.iter().all(|r| r[4].parse::<u64>().unwrap() == r[1].parse::<u64>().unwrap() + r[2].parse::<u64>().unwrap()));
    let bad = GenCmd::try_parse_from(["x", "gen", "--rate", "0", "--out", out.to_str().unwrap()]).unwrap();
    let e = kernelsight::cli::workload::run(kernelsight::cli::workload::WorkloadCmdArgs { command: bad.command }).unwrap_err();
    assert!(format!("{e}").contains("--rate must be a positive"), "{e}");
}

#[test]
fn uniform_up_to_lengths_are_the_benchmark_clients_range_below_the_nominal_length() {
    // SGLang's / InferenceMAX's --random-range-ratio 0.8: integers in [int(0.8 L), L].
    let v = all(&spec(5000, Arrival::Rate { rate_per_s: 1.0, burstiness: 1.0 }, Lengths::UniformUpTo { isl: 1000, osl: 100, low_ratio: 0.8 }, Sharing::None));
    assert!(v.iter().all(|r| (800..=1000).contains(&r.prompt_tokens) && (80..=100).contains(&r.output_tokens)));
    let mi = v.iter().map(|r| r.prompt_tokens as f64).sum::<f64>() / v.len() as f64;
    assert!((mi - 900.0).abs() < 5.0, "mean prompt {mi}");
    assert!(v.iter().any(|r| r.prompt_tokens == 1000) && v.iter().any(|r| r.prompt_tokens == 800), "both ends are drawn");
    let bad = spec(10, Arrival::Rate { rate_per_s: 1.0, burstiness: 1.0 }, Lengths::UniformUpTo { isl: 100, osl: 10, low_ratio: 1.5 }, Sharing::None);
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("uniform-upto") && e.contains("(0, 1]"), "{e}");
}
