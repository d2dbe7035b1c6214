//! The host-speed probe script and the reader of `--host-probe` agree on the file format: the
//! probe runs here (no GPU, maybe no numpy or torch: those readings are left out) and its output
//! loads as one reading.

use kernelsight::perf::host::HostProbe;
use std::path::Path;
use std::process::Command;

#[test]
fn the_probe_script_writes_a_reading_the_simulator_reads() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("probe.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("microbench/e2e/host_speed_probe.py");
    let run = Command::new("python3").arg(&script).args(["--repeats", "1", "--out"]).arg(&out).output().expect("python3 runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for field in ["python_loop_ns", "dict_list_ns", "thread_handoff_us", "process_pipe_us"] {
        assert!(json[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {json}");
    }
    // Pinned to each CPU in turn (Linux): one positive reading per CPU the test may run on.
    let per_cpu = json["python_loop_ns_per_cpu"].as_object().expect("python_loop_ns_per_cpu");
    assert!(!per_cpu.is_empty() && per_cpu.values().all(|v| v.as_f64().is_some_and(|ns| ns > 0.0)), "{json}");
    let probe = HostProbe::load(&[out]).unwrap();
    assert_eq!(probe.python_loop_ns.len(), 1);
    assert_eq!(probe.median_python_loop_ns(), json["python_loop_ns"].as_f64().unwrap());
}
