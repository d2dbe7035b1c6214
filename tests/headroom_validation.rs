//! The hard SOL never exceeds a real measured time: over the project's measurement data (public
//! tables and the collector's own CSVs), every row measured below SOL x (1 - noise margin) must
//! be possible with a warm L2 or be a listed, evidenced upstream anomaly. The default ceilings
//! and latency floor are re-derived from the same data.

use kernelsight::hardware::load_gpu;
use kernelsight::headroom::bound::{default_ceiling, OpClass, BEST_COMPUTE, BEST_MEMORY, LATENCY_FLOOR_US};
use kernelsight::headroom::validate::{best_efficiency, project_measurements, timed_vidur_way, validate};
use kernelsight::schema::KernelRow;
use std::sync::OnceLock;

fn rows() -> &'static [KernelRow] {
    static ROWS: OnceLock<Vec<KernelRow>> = OnceLock::new();
    ROWS.get_or_init(|| project_measurements().unwrap())
}

#[test]
fn hard_sol_is_a_lower_bound_over_all_measurements() {
    let rep = validate(rows());
    assert!(rep.rows > 1_000_000, "expected the public tables, got {} rows", rep.rows);
    let unexplained: Vec<String> = rep
        .violations
        .iter()
        .filter(|v| !v.warm_l2 && v.anomaly.is_none())
        .take(10)
        .map(|v| format!("{} {} [{}]: {:.3}x SOL", v.gpu, v.kernel, v.source, v.ratio))
        .collect();
    assert_eq!(rep.unexplained(), 0, "worst: {unexplained:#?}");
    // 255 vidur A100 p2p rows (an H100 file under an A100 label) and 8 single-token MoE rows.
    assert!(rep.anomalies() <= 263, "{} known-anomaly rows", rep.anomalies());
    for g in &rep.groups {
        assert!(g.rows > 0 && g.min > 0.0 && g.p50 >= 1.0, "{}/{} median below SOL", g.gpu, g.op);
    }
}

#[test]
fn default_ceilings_and_floor_are_the_best_observed_on_h200() {
    let gpu = load_gpu("h200_sxm").unwrap();
    let best = best_efficiency(rows(), &gpu);
    let near = |a: f64, b: f64| (a - b).abs() < 0.0015;
    for (class, compute, memory) in [
        (OpClass::Gemm, true, true),
        (OpClass::AttentionPrefill, true, true),
        (OpClass::AttentionDecode, true, true),
        (OpClass::Moe, true, true),
        (OpClass::Elementwise, false, true),
        (OpClass::Communication, false, true),
    ] {
        let (c, m) = best[&class];
        let d = default_ceiling(class);
        assert!(!compute || near(d.compute, c), "{class:?} compute: default {} observed {c:.4}", d.compute);
        assert!(!memory || near(d.memory, m), "{class:?} memory: default {} observed {m:.4}", d.memory);
        assert!(c <= 1.0 && m <= 1.0, "{class:?} beats the hard SOL: {c} {m}");
    }
    let max_c = best.values().map(|x| x.0).fold(0.0, f64::max);
    let max_m = best.values().map(|x| x.1).fold(0.0, f64::max);
    assert!(near(BEST_COMPUTE, max_c) && near(BEST_MEMORY, max_m), "{max_c} {max_m}");
    let fastest = rows()
        .iter()
        .filter(|r| r.gpu.as_deref() == Some("h200_sxm") && !timed_vidur_way(r))
        .filter_map(|r| r.latency_us)
        .fold(f64::INFINITY, f64::min);
    assert!(fastest >= LATENCY_FLOOR_US && fastest < LATENCY_FLOOR_US * 1.05, "fastest H200 kernel {fastest} us");
}
