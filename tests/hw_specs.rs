//! The embedded GPU spec sheets against independent anchors: published datasheet figures and
//! per-SM tensor throughput from the architecture whitepapers, not values read back from the
//! TOML files.
use kernelsight::cli::hw::{render_list, render_show};
use kernelsight::hardware::{builtin_specs, load_gpu, GpuSpec, LinkKind};
use kernelsight::schema::Dtype;
use std::io::Write;
use std::process::Command;

const REQUIRED: [&str; 16] = [
    "a100_sxm",
    "a100_pcie",
    "h100_sxm",
    "h100_pcie",
    "h200_sxm",
    "h20",
    "b200_sxm",
    "gb200",
    "b300_sxm",
    "gb300",
    "l40s",
    "l4",
    "rtx_pro_6000_server",
    "mi300x",
    "mi325x",
    "mi355x",
];

fn gpu(id: &str) -> GpuSpec {
    load_gpu(id).unwrap_or_else(|e| panic!("{id}: {e:#}"))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn all_required_gpus_load_and_are_listed() {
    let specs = builtin_specs().unwrap();
    let table = render_list(&specs);
    for id in REQUIRED {
        assert!(
            specs.iter().any(|s| s.id == id),
            "{id} missing from builtin_specs"
        );
        assert!(
            table.lines().any(|l| l.starts_with(&format!("{id} "))),
            "{id} not in table:\n{table}"
        );
    }
    // One header row, one row per spec, then three footnote lines.
    assert_eq!(table.lines().count(), specs.len() + 4);
}

#[test]
fn datasheet_anchors() {
    // NVIDIA H100 datasheet: BF16 1,979 TFLOP/s "with sparsity" -> 989.4 dense; FP8 3,958 -> 1978.9.
    let h100 = gpu("h100_sxm");
    assert!(
        close(h100.peak.bf16_tflops, 989.4, 1e-3),
        "{}",
        h100.peak.bf16_tflops
    );
    assert!(close(h100.peak.fp8_tflops.unwrap(), 1978.9, 1e-3));
    assert!(close(h100.memory.hbm_bandwidth_tbps, 3.35, 1e-3));
    // H100 PCIe: 1,513 sparse -> 756.5 dense.
    assert!(close(gpu("h100_pcie").peak.bf16_tflops, 756.5, 1e-3));
    // A100: no FP8 tensor cores; an fp8 matmul runs at the bf16 rate (312 TFLOP/s).
    let a100 = gpu("a100_sxm");
    assert_eq!(a100.peak.fp8_tflops, None);
    assert_eq!(a100.peak.fp4_tflops, None);
    assert!(close(a100.peak_flops(Dtype::Fp8), 312e12, 1e-3));
    // B200: FP4 18 PF with sparsity -> 9 PF dense.
    let b200 = gpu("b200_sxm");
    assert!(close(b200.peak.fp4_tflops.unwrap(), 9000.0, 1e-3));
    assert!(close(b200.peak_flops(Dtype::Fp4), 9e15, 1e-3));
    // AMD MI300X datasheet: 1307.4 dense FP16; MI355X adds FP4 (10 PF dense).
    assert!(close(gpu("mi300x").peak.bf16_tflops, 1307.4, 1e-3));
    assert!(close(gpu("mi355x").peak.fp4_tflops.unwrap(), 10066.4, 1e-3));
    // L40S: 733 TFLOP/s FP16 "with sparsity" -> 362 dense.
    assert!(close(gpu("l40s").peak.bf16_tflops, 362.05, 1e-3));
}

#[test]
fn memory_capacities_and_bandwidths_match_datasheets() {
    let gb = [
        ("a100_sxm", 80.0, 2.039),
        ("a100_pcie", 80.0, 1.935),
        ("h100_sxm", 80.0, 3.35),
        ("h100_pcie", 80.0, 2.0),
        ("h200_sxm", 141.0, 4.8),
        ("h20", 96.0, 4.0),
        ("b200_sxm", 180.0, 7.7),
        ("gb200", 186.0, 8.0),
        ("b300_sxm", 288.0, 7.75),
        ("gb300", 288.0, 8.0),
        ("l40s", 48.0, 0.864),
        ("l4", 24.0, 0.3),
        ("rtx_pro_6000_server", 96.0, 1.792),
        ("mi300x", 192.0, 5.3),
        ("mi325x", 256.0, 6.0),
        ("mi355x", 288.0, 8.0),
    ];
    for (id, cap, tbps) in gb {
        let g = gpu(id);
        assert!(
            close(g.memory.hbm_gb, cap, 1e-6),
            "{id}: {} GB, datasheet {cap}",
            g.memory.hbm_gb
        );
        assert!(
            close(g.memory.hbm_bandwidth_tbps, tbps, 1e-6),
            "{id}: {} TB/s",
            g.memory.hbm_bandwidth_tbps
        );
    }
}

/// Dense FP16 tensor FLOP per SM (CU) per clock from the architecture whitepapers: Ampere A100
/// 2048, Hopper 4096, datacenter Blackwell 8192, Ada and GB202 (RTX PRO) 1024, CDNA3 2048,
/// CDNA4 4096. The datasheet peak may not exceed SMs x clock x this, and sits within 15% below
/// it (datasheets quote a sustained tensor clock a little under the max boost). A sparse figure
/// entered by mistake would be 2x over.
#[test]
fn bf16_peak_agrees_with_sm_count_and_clock() {
    let per_sm_clk = [
        ("a100_sxm", 2048.0),
        ("a100_pcie", 2048.0),
        ("h100_sxm", 4096.0),
        ("h100_pcie", 4096.0),
        ("h200_sxm", 4096.0),
        ("b200_sxm", 8192.0),
        ("gb200", 8192.0),
        ("b300_sxm", 8192.0),
        ("gb300", 8192.0),
        ("l40s", 1024.0),
        ("l4", 1024.0),
        ("rtx_pro_6000_server", 1024.0),
        ("mi300x", 2048.0),
        ("mi325x", 2048.0),
        ("mi355x", 4096.0),
    ];
    for (id, flop_per_clk) in per_sm_clk {
        let g = gpu(id);
        let bound = g.compute.sm_count as f64 * g.compute.boost_clock_mhz * 1e6 * flop_per_clk;
        let ratio = g.peak_flops(Dtype::Bf16) / bound;
        assert!(
            (0.85..=1.01).contains(&ratio),
            "{id}: bf16 peak / (SMs x clock x {flop_per_clk}) = {ratio:.3}"
        );
    }
    // H20's tensor rate is capped for export rules: far below its SMs x clock.
    let h20 = gpu("h20");
    let bound = h20.compute.sm_count as f64 * h20.compute.boost_clock_mhz * 1e6 * 4096.0;
    assert!(h20.peak_flops(Dtype::Bf16) < 0.5 * bound);
}

#[test]
fn ridge_points_are_plausible() {
    // Hand computation: 989.4e12 FLOP/s / 3.35e12 B/s = 295.3 FLOP/B.
    assert!(close(
        gpu("h100_sxm").ridge_flops_per_byte(Dtype::Bf16),
        295.3,
        1e-3
    ));
    // 312e12 / 2.039e12 = 153.0; fp8 on A100 has the same ridge (runs as bf16).
    let a100 = gpu("a100_sxm");
    assert!(close(a100.ridge_flops_per_byte(Dtype::Bf16), 153.0, 1e-3));
    assert_eq!(
        a100.ridge_flops_per_byte(Dtype::Fp8),
        a100.ridge_flops_per_byte(Dtype::Bf16)
    );
    for s in builtin_specs().unwrap() {
        let bf16 = s.ridge_flops_per_byte(Dtype::Bf16);
        // Every accelerator here sits between H20 (148 / 4.0 = 37) and L4 (121 / 0.3 = 403).
        assert!(
            (30.0..=450.0).contains(&bf16),
            "{}: bf16 ridge {bf16:.0} FLOP/B",
            s.id
        );
        // Lower precision is never slower where the tensor cores have it; fp8 at most doubles
        // bf16 within datasheet rounding (L40S prints bf16 362.05 dense next to fp8 733);
        // Blackwell Ultra fp4 is ~3x fp8. Without fp4 tensor cores 4-bit weights run
        // weight-only in bf16 math.
        let fp8 = s.ridge_flops_per_byte(Dtype::Fp8);
        let fp4 = s.ridge_flops_per_byte(Dtype::Fp4);
        assert!(bf16 <= fp8, "{}: {bf16} {fp8}", s.id);
        if s.peak.fp4_tflops.is_some() {
            assert!(fp8 <= fp4, "{}: {fp8} {fp4}", s.id);
        } else {
            assert_eq!(fp4, bf16, "{}: 4-bit weights without fp4 tensor cores run in bf16", s.id);
        }
        assert!(
            fp8 <= 2.0 * bf16 * 1.03 && fp4 <= 3.2 * fp8,
            "{}: {bf16} {fp8} {fp4}",
            s.id
        );
    }
}

#[test]
fn formats_links_and_sources_follow_the_hardware() {
    for s in builtin_specs().unwrap() {
        // FP4 tensor cores arrived with Blackwell (NVIDIA) and CDNA 4 (AMD).
        let fp4_arch = s.arch == "blackwell" || s.arch == "cdna4";
        assert_eq!(
            s.peak.fp4_tflops.is_some(),
            fp4_arch,
            "{}: fp4 on {}",
            s.id,
            s.arch
        );
        // FP8 everywhere except Ampere.
        assert_eq!(
            s.peak.fp8_tflops.is_none(),
            s.arch == "ampere",
            "{}: fp8",
            s.id
        );
        match s.vendor.as_str() {
            "amd" => assert_eq!(s.interconnect.scaleup_kind, LinkKind::Xgmi, "{}", s.id),
            "nvidia" => assert_ne!(s.interconnect.scaleup_kind, LinkKind::Xgmi, "{}", s.id),
            v => panic!("{}: unexpected vendor {v}", s.id),
        }
        for key in [
            "peak",
            "memory",
            "compute",
            "interconnect",
            "tdp_w",
            "price_usd_per_hour",
        ] {
            assert!(
                s.sources.contains_key(key),
                "{}: no source note for '{key}'",
                s.id
            );
        }
        // A PCIe-linked box has no scale-up fabric faster than its PCIe link.
        if s.interconnect.scaleup_kind == LinkKind::Pcie {
            assert_eq!(
                s.interconnect.scaleup_gbps_per_dir, s.interconnect.pcie_gbps_per_dir,
                "{}",
                s.id
            );
        }
    }
    for id in [
        "l40s",
        "l4",
        "rtx_pro_6000_server",
        "a100_pcie",
        "h100_pcie",
    ] {
        assert_eq!(gpu(id).interconnect.scaleup_kind, LinkKind::Pcie, "{id}");
    }
    // NVLink 4 = 900 GB/s bidirectional, NVLink 5 = 1.8 TB/s bidirectional, per GPU.
    assert_eq!(gpu("h100_sxm").interconnect.scaleup_gbps_per_dir, 450.0);
    assert_eq!(gpu("b200_sxm").interconnect.scaleup_gbps_per_dir, 900.0);
    assert_eq!(gpu("gb200").interconnect.gpus_per_node, 72);
}

fn write_spec(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn malformed_spec_names_file_and_field() {
    let good = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/hw_specs/h100_sxm.toml"
    ))
    .unwrap();
    // A copy on disk loads by path.
    let ok = write_spec(&good);
    assert_eq!(
        load_gpu(ok.path().to_str().unwrap()).unwrap().id,
        "h100_sxm"
    );

    let cases = [
        (
            good.replace("sm_count = 132", "sm_count = \"many\""),
            "sm_count",
        ),
        (
            good.replace("l2_mb = 50.0", "l2_mb = 50.0\nl3_mb = 256.0"),
            "l3_mb",
        ),
        (
            good.replace("hbm_gb = 80.0", "hbm_gb = 0.0"),
            "memory.hbm_gb",
        ),
        (
            good.replace("scaleup_kind = \"nvlink\"", "scaleup_kind = \"infiniband\""),
            "scaleup_kind",
        ),
        (good.replace("[compute]", "[compute"), "line"),
    ];
    for (text, field) in cases {
        let f = write_spec(&text);
        let path = f.path().to_str().unwrap();
        let err = format!("{:#}", load_gpu(path).unwrap_err());
        assert!(err.contains(path), "error does not name the file: {err}");
        assert!(err.contains(field), "error does not name '{field}': {err}");
    }
}

#[test]
fn show_text_and_json_cover_every_field() {
    let a100 = gpu("a100_sxm");
    let text = render_show(&a100);
    assert!(
        text.contains("fp8    -  (no native support; runs as bf16)"),
        "{text}"
    );
    assert!(text.contains("2.039 TB/s") && text.contains("164 KB") && text.contains("Sources"));
    for note in a100.sources.values() {
        assert!(text.contains(note.as_str()));
    }
    // The measured power-limit GEMM rate: none for the A100, the H100's own for the H100.
    assert!(text.contains("bf16 GEMMs held   - (not measured for this die)"), "{text}");
    // The H100's line gives the shipped cap's two rates (from the measurement file) and its source.
    let h100 = gpu("h100_sxm");
    let rates = kernelsight::perf::power_cap::shipped_rates().unwrap();
    let cap = kernelsight::perf::power_cap::power_cap(&h100, kernelsight::perf::Tier::Target, &rates).unwrap().expect("the H100 has a measured rate");
    let text = render_show(&h100);
    let line = text.lines().find(|l| l.contains("bf16 GEMMs held")).expect("a power-limit line");
    let shown: Vec<f64> = line.split([' ', ',']).filter_map(|w| w.parse().ok()).collect();
    assert!(shown.len() >= 2 && (shown[0] - cap.sustained_tflops()).abs() < 0.01 && (shown[1] - cap.tflops_at(0.0)).abs() < 0.01, "{line}");
    assert!(shown[1] > shown[0] && line.contains("back to back at the power limit") && line.contains("(h100_sxm measured"), "{line}");
    // JSON round-trips to the same spec.
    let json = serde_json::to_string(&a100).unwrap();
    let back: GpuSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a100);
}

#[test]
fn binary_lists_and_shows() {
    let bin = env!("CARGO_BIN_EXE_kernelsight");
    let out = Command::new(bin).args(["hw", "list"]).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    for id in REQUIRED {
        assert!(stdout.contains(id), "{id} not listed");
    }
    let out = Command::new(bin)
        .args(["hw", "show", "gb200", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let spec: GpuSpec = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(spec.compute.sm_count, 152);
    let out = Command::new(bin)
        .args(["hw", "show", "h900"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("unknown GPU 'h900'") && stderr.contains("mi355x"),
        "{stderr}"
    );
}

#[test]
fn same_compute_die_pairs_h100_sxm_with_h200_only() {
    // H100 SXM and H200: one GH100 die at the same clocks; only the memory differs.
    assert!(gpu("h100_sxm").same_compute_die(&gpu("h200_sxm")));
    assert!(gpu("h200_sxm").same_compute_die(&gpu("h100_sxm")));
    // H100 PCIe has fewer SMs and lower clocks; GB200's peaks differ from B200's; other
    // architectures never match.
    assert!(!gpu("h100_sxm").same_compute_die(&gpu("h100_pcie")));
    assert!(!gpu("b200_sxm").same_compute_die(&gpu("gb200")));
    assert!(!gpu("h200_sxm").same_compute_die(&gpu("b200_sxm")));
    // The same A100 die and clocks, but a 300 W PCIe card against a 400 W SXM module.
    assert!(!gpu("a100_sxm").same_compute_die(&gpu("a100_pcie")));
}
