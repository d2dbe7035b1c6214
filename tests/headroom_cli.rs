//! `kernelsight sol` as a process: --serve keeps answering after bad lines, --input/--output
//! adds bound columns, `budget` allocates trials.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_kernelsight");

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/flashinfer/{rel}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn serve_answers_every_line_and_survives_bad_ones() {
    let def = fixture("definitions/rmsnorm/rmsnorm_h4096.json");
    let requests = [
        r#"{"id": 1, "gpu": "h200_sxm", "op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "measured_us": 2000}"#.to_string(),
        "{not json".to_string(),
        r#"{"id": 3, "gpu": "h200_sxm", "op": "gemm", "m": 1, "n": 2, "k": 3, "measured_us": -5}"#.to_string(),
        format!(r#"{{"id": 4, "gpu": "h200_sxm", "definition": "{def}", "workload": {{"batch_size": 16384}}}}"#),
        r#"{"id": 5, "gpu": "h900", "op": "gemm", "m": 1, "n": 2, "k": 3}"#.to_string(),
        r#"{"id": 6, "op": "conv", "gpu": "h200_sxm"}"#.to_string(),
    ];
    let mut child = Command::new(BIN)
        .args(["sol", "--serve"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(requests.join("\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let answers: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 6);
    // 8192^3 bf16: SOL = 2*8192^3 / 989.4e12 s = 1111.3 us; 2000 us -> headroom.
    let sol = 2.0 * 8192f64.powi(3) / 989.4e12 * 1e6;
    assert!((answers[0]["sol_us"].as_f64().unwrap() - sol).abs() < 1e-6);
    assert_eq!(answers[0]["verdict"], "headroom");
    assert_eq!(answers[0]["bound"], "compute");
    assert!(answers[1]["error"].as_str().unwrap().contains("malformed request JSON"));
    assert!(answers[2]["error"].as_str().unwrap().contains("measured_us"));
    assert_eq!(answers[2]["id"], 3);
    let bytes = (2.0 * 16384.0 * 4096.0 + 4096.0) * 2.0;
    assert!((answers[3]["sol_us"].as_f64().unwrap() - bytes / 4.8e12 * 1e6).abs() < 1e-6);
    assert!(answers[3].get("verdict").is_none());
    assert!(answers[4]["error"].as_str().unwrap().contains("unknown GPU 'h900'"));
    assert!(answers[5]["error"].as_str().unwrap().contains("allowed: gemm"));
}

#[test]
fn csv_mode_appends_bound_columns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("shapes.csv");
    let output = dir.path().join("sol.csv");
    std::fs::write(&input, "op,dtype,m,n,k,note\ngemm,bf16,1,8192,8192,gemv\ngemm,bf16,8192,8192,8192,big\n").unwrap();
    let st = Command::new(BIN)
        .args(["sol", "--gpu", "h200_sxm", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .status()
        .unwrap();
    assert!(st.success());
    let mut rdr = csv::Reader::from_path(&output).unwrap();
    let h = rdr.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|x| x == n).unwrap();
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.unwrap()).collect();
    assert_eq!(&rows[0][col("note")], "gemv");
    // GEMV: (8192 + 8192^2 + 8192) * 2 bytes at 4.8 TB/s.
    let gemv = (8192.0 + 8192.0 * 8192.0 + 8192.0) * 2.0 / 4.8e12 * 1e6;
    let got: f64 = rows[0][col("sol_us")].parse().unwrap();
    assert!((got - gemv).abs() < 1e-3, "{got} vs {gemv}");
    let practical: f64 = rows[0][col("practical_us")].parse().unwrap();
    assert!((practical - gemv / 0.921).abs() < 1e-3, "{practical}");
}

#[test]
fn budget_prints_allocation_and_geomean_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("problems.csv");
    let def = fixture("definitions/gemm/gemm_n4096_k4096.json");
    let wl = fixture("workloads/gemm/gemm_n4096_k4096.jsonl");
    std::fs::write(
        &csv,
        format!(
            "name,measured_us,practical_us,sol_us,op,dtype,m,n,k,definition,workload,workload_index\n\
             done,105,100,90,,,,,,,,\n\
             slow,400,100,90,,,,,,,,\n\
             shape,5000,,,gemm,bf16,8192,8192,8192,,,\n\
             trace,1000,,,,,,,,{def},{wl},0\n"
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["sol", "budget"])
        .arg(&csv)
        .args(["--trials", "40", "--gpu", "h200_sxm", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = plan["allocations"].as_array().unwrap();
    assert_eq!(a[0]["verdict"], "near-sol");
    assert_eq!(a[0]["trials"], 0);
    assert_eq!(plan["trials_allocated"], 40);
    assert!(a.iter().skip(1).all(|x| x["trials"].as_u64().unwrap() > 0));
    assert!(plan["expected_geomean_speedup"].as_f64().unwrap() > 1.0);

    std::fs::write(&csv, "name,measured_us\nx,-1\n").unwrap();
    let out = Command::new(BIN).args(["sol", "budget"]).arg(&csv).args(["--trials", "4"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2") && err.contains("measured_us"), "{err}");
}

#[test]
fn definition_mode_rejects_malformed_json() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"name\": \"x\", \"op_type\": ").unwrap();
    let out = Command::new(BIN).args(["sol", "--gpu", "h200_sxm", "--definition"]).arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("bad.json") && err.contains("malformed definition JSON"), "{err}");
}
