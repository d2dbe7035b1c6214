//! Hardware-normalized features of a kernel on a GPU: what carries across GPU generations
//! (arithmetic intensity over the ridge point, waves of tiles over the SM count, working set over
//! L2, log sizes) plus the spec-sheet figures themselves. Sizes enter as log2 so that trees split
//! on ratios, not absolute magnitudes.

use crate::hardware::{GpuSpec, LinkKind};
use crate::kernels::cost::{MlaModule, Routing};
use crate::perf::sol::{collective_wire_bytes, mla_module_sol, scaleout_us, sol, sol_routed, Sol};
use crate::schema::{Dtype, Kernel, Op};

/// The class of link a collective runs over: the scale-up fabric (NVLink through NVSwitch, or
/// the GPU's only link when that is PCIe), an NVLink bridge joining one pair of PCIe cards, PCIe,
/// the scale-out network of the GPU's own board (one NIC per GPU, the spec sheet's), or the
/// network of a PCIe server (`HostNet`: Vidur's pairwise-NVLink clusters, whose NICs are not the
/// HGX board's; both such clusters measured, A100 and A40, send 2.2-2.5 GB/s between nodes,
/// 10 % of an HGX NIC). Each has its own bandwidth (spec sheet) and fitted latency. The
/// declaration order (the feature's code) runs from the fastest fabric to the slowest, so a
/// class missing from the training rows falls between its neighbours in the trees' splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    ScaleUp,
    Bridge,
    Pcie,
    ScaleOut,
    HostNet,
}

impl LinkClass {
    /// The class a collective over `num_gpus` GPUs of one deployment of `gpu` uses.
    pub fn of(gpu: &GpuSpec, num_gpus: u64) -> LinkClass {
        if num_gpus > gpu.interconnect.gpus_per_node as u64 {
            LinkClass::ScaleOut
        } else if gpu.interconnect.scaleup_kind == LinkKind::Pcie {
            LinkClass::Pcie
        } else {
            LinkClass::ScaleUp
        }
    }

    /// As `of`, but from the measured row's topology where its backend names one (Vidur's
    /// cluster profiles): `.../internode` runs on the scale-out network whatever its GPU count;
    /// `pairwise_nvlink` nodes are four PCIe cards joined in pairs by NVLink bridges, so two
    /// GPUs talk over the bridge and four cross PCIe between the pairs (a GPU whose spec has
    /// no NVLink gets PCIe throughout).
    pub fn of_row(gpu: &GpuSpec, num_gpus: u64, backend: &str) -> LinkClass {
        let has = |seg: &str| backend.split('/').any(|s| s == seg);
        if has("internode") {
            if has("pairwise_nvlink") {
                LinkClass::HostNet
            } else {
                LinkClass::ScaleOut
            }
        } else if has("pairwise_nvlink") {
            if num_gpus <= 2 && gpu.interconnect.scaleup_kind != LinkKind::Pcie {
                LinkClass::Bridge
            } else {
                LinkClass::Pcie
            }
        } else {
            LinkClass::of(gpu, num_gpus)
        }
    }

    /// Spec-sheet bandwidth of this class on `gpu`, bytes/s per direction, for one GPU. A
    /// bridge is taken at the spec's NVLink-bridge rate (the GPU's PCIe cards), else at its
    /// NVLink rate. A PCIe server's NIC is not on the spec sheet; it sits behind the host's
    /// PCIe link, which bounds it.
    pub fn bytes_per_s(self, gpu: &GpuSpec) -> f64 {
        let ic = &gpu.interconnect;
        match self {
            LinkClass::Bridge if ic.nvlink_bridge_gbps_per_dir.is_some() => ic.nvlink_bridge_gbps_per_dir.unwrap_or(0.0) * 1e9,
            LinkClass::ScaleUp | LinkClass::Bridge if ic.scaleup_kind != LinkKind::Pcie => gpu.scaleup_bytes_per_s(),
            LinkClass::ScaleOut => ic.scaleout_gbps_per_dir * 1e9,
            _ => ic.pcie_gbps_per_dir * 1e9,
        }
    }

    /// GPUs per node of a collective over `num_gpus` GPUs measured with `backend`: Vidur's
    /// `internode` profiles all span two nodes (upstream `devices_per_node` is half of
    /// `num_workers` in every network file: 1 of 2, 2 of 4, 4 of 8, 8 of 16); otherwise nodes
    /// are filled, `gpus_per_node` at a time.
    pub fn gpus_per_node_of_row(gpu: &GpuSpec, num_gpus: u64, backend: &str) -> u64 {
        if backend.split('/').any(|s| s == "internode") {
            (num_gpus / 2).max(1)
        } else {
            num_gpus.min(gpu.interconnect.gpus_per_node as u64).max(1)
        }
    }

    /// The class whose fitted base stands in when the training rows have none of this one: a
    /// bridge and the NVSwitch fabric are both NVLink; a PCIe server's network is a network.
    pub fn nearest(self) -> Option<LinkClass> {
        match self {
            LinkClass::Bridge => Some(LinkClass::ScaleUp),
            LinkClass::ScaleUp => Some(LinkClass::Bridge),
            LinkClass::HostNet => Some(LinkClass::ScaleOut),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LinkClass::ScaleUp => "scaleup",
            LinkClass::Pcie => "pcie",
            LinkClass::ScaleOut => "scaleout",
            LinkClass::Bridge => "bridge",
            LinkClass::HostNet => "hostnet",
        }
    }
}

/// Whether a collective row was timed as the NCCL kernel of an eager `torch.distributed` call
/// (Vidur's profiles: kineto kernel time of un-graphed launches, which includes waiting for the
/// slowest rank to arrive) rather than by a benchmark loop (nccl-tests, CUDA-graph replays).
pub fn is_eager_kernel_timed(backend: &str) -> bool {
    backend.split('/').next() == Some("vidur")
}

/// Linear-weight format of an MLA row that times the whole module (backend segment
/// `module_gemm_<type>`, see `ingest::aiconfigurator`); None for attention-core rows.
pub fn mla_module_weights(op: Op, backend: &str) -> Option<Dtype> {
    if !matches!(op, Op::MlaPrefill | Op::MlaDecode) {
        return None;
    }
    let t = backend.split('/').find_map(|s| s.strip_prefix("module_gemm_"))?;
    Some(match t {
        "fp8_block" | "fp8" | "fp8_static" => Dtype::Fp8,
        "nvfp4" | "fp4" => Dtype::Fp4,
        other => other.parse().unwrap_or(Dtype::Bf16),
    })
}

/// The measurement path of an MLA row, each with its own fitted base: `core` (attention kernel
/// alone), `module` (whole module, projections and norms included), or `module/norm_<how>`
/// where the collector ran the module's RMSNorms another way than the other GPUs' tables did
/// (upstream's `norm_dispatch` deviation, carried in the backend as `/norm_<how>`).
pub fn mla_path(backend: &str) -> String {
    if !backend.split('/').any(|s| s.starts_with("module_gemm_")) {
        return "core".to_string();
    }
    match backend.split('/').find(|s| s.starts_with("norm_")) {
        Some(n) => format!("module/{n}"),
        None => "module".to_string(),
    }
}

/// The backend as the learned correction sees it (its one-hot category): an MLA row's norm
/// path is held by its base (`mla_path`), so the same module kernels measured with either norm
/// path share one category.
pub fn backend_category(op: Op, backend: &str) -> std::borrow::Cow<'_, str> {
    if matches!(op, Op::MlaPrefill | Op::MlaDecode) && backend.contains("/norm_") {
        return backend.split('/').filter(|s| !s.starts_with("norm_")).collect::<Vec<_>>().join("/").into();
    }
    backend.into()
}

fn lg(x: f64) -> f64 {
    x.max(1e-12).log2()
}

fn lg1(x: u64) -> f64 {
    (x as f64 + 1.0).log2()
}

/// Fraction of the last wave that does useful work: `tiles / (ceil(tiles / sms) * sms)`.
fn wave_fill(tiles: f64, sms: f64) -> f64 {
    if tiles <= 0.0 {
        return 1.0;
    }
    tiles / ((tiles / sms).ceil() * sms)
}

fn ceil_div(a: u64, b: u64) -> f64 {
    a.div_ceil(b.max(1)) as f64
}

/// Features of a collective: only what describes the link and the message. Compute peaks, SM
/// counts and power would let the trees tell GPUs apart by identity, which does not transfer
/// to a GPU left out of training.
const COLLECTIVE_NAMES: [&str; 7] =
    ["lg_sol_us", "lg_bytes", "num_gpus", "link_class", "lg_link_gbps", "lg_hbm_tbps", "eager_kernel_timed"];

/// Names of the features `extract` returns for `op`, in order.
pub fn names(op: Op) -> Vec<&'static str> {
    if op.is_collective() {
        return COLLECTIVE_NAMES.to_vec();
    }
    let mut v = vec![
        "lg_sol_us",
        "lg_compute_over_memory",
        "lg_bytes_over_l2",
        "lg_dtype_bytes",
        "lg_peak_tflops",
        "lg_hbm_tbps",
        "lg_sm_count",
        "lg_watts_per_bf16_tflops",
        "dram_gddr",
    ];
    if !has_spec_features(op) {
        v.truncate(4);
    }
    v.extend(op_names(op));
    v
}

/// Whether an op's correction sees the spec-sheet figures themselves (peak, bandwidth, SMs,
/// power). MLA does not: its rows come from six GPUs that each ran their own kernel set
/// (Triton on A100 and L40S, FlashMLA on Hopper, FlashInfer on Blackwell), so those figures
/// name the GPU rather than describe it; it keeps the hardware-normalized ratios.
fn has_spec_features(op: Op) -> bool {
    !matches!(op, Op::MlaPrefill | Op::MlaDecode)
}

fn op_names(op: Op) -> Vec<&'static str> {
    match op {
        Op::Gemm => vec!["lg_m", "lg_n", "lg_k", "lg_waves_128", "fill_128", "lg_waves_64", "fill_64", "lg_m_per_sm"],
        Op::AttnPrefill => vec![
            "lg_batch", "lg_seq_len", "lg_kv_len", "lg_heads", "lg_gqa", "lg_head_dim", "lg_window",
            "lg_kv_dtype_bytes", "lg_waves_128", "fill_128",
        ],
        Op::MlaPrefill => vec![
            "lg_batch", "lg_seq_len", "lg_kv_len", "lg_heads", "lg_gqa", "lg_head_dim", "lg_window",
            "lg_kv_dtype_bytes", "lg_waves_128", "fill_128", "projection_sol_share",
        ],
        Op::AttnDecode => vec![
            "lg_batch", "lg_kv_len", "lg_heads", "lg_gqa", "lg_head_dim", "lg_window",
            "lg_kv_dtype_bytes", "lg_ctas_per_sm", "lg_kv_bytes_per_seq",
        ],
        Op::MlaDecode => vec![
            "lg_batch", "lg_kv_len", "lg_heads", "lg_gqa", "lg_head_dim", "lg_window",
            "lg_kv_dtype_bytes", "lg_ctas_per_sm", "lg_kv_bytes_per_seq", "projection_sol_share",
        ],
        Op::Moe => vec![
            "lg_tokens", "lg_hidden", "lg_inter", "lg_topk", "lg_experts", "lg_tp", "lg_ep",
            "lg_tokens_per_expert", "lg_experts_per_token_per_gpu", "lg_local_experts", "lg_tokens_per_sm",
            "lg_pad_16", "lg_pad_64", "lg_pad_128",
        ],
        _ => vec!["lg_tokens", "lg_hidden", "lg_batch", "lg_heads", "lg_head_dim", "lg_bytes_field"],
    }
}

/// Features of kernel `k` on `gpu` measured with `backend` (a MoE kernel under `routing`); `s`
/// is its speed-of-light bound.
pub fn extract(k: &Kernel, gpu: &GpuSpec, s: &Sol, backend: &str, routing: Routing) -> Vec<f64> {
    if k.op.is_collective() {
        let class = LinkClass::of_row(gpu, k.num_gpus, backend);
        return vec![
            lg(s.sol_us),
            lg1(k.bytes),
            k.num_gpus as f64,
            class as u8 as f64,
            lg(class.bytes_per_s(gpu) / 1e9),
            lg(gpu.memory.hbm_bandwidth_tbps),
            f64::from(u8::from(is_eager_kernel_timed(backend))),
        ];
    }
    let sms = gpu.compute.sm_count as f64;
    let peak_tflops = gpu.peak_flops(k.dtype) / 1e12;
    let mut v = vec![
        lg(s.sol_us),
        lg(s.compute_us.max(1e-9) / s.memory_us.max(1e-9)),
        lg(s.bytes / gpu.l2_bytes()),
        lg(k.dtype.bytes()),
        lg(peak_tflops),
        lg(gpu.memory.hbm_bandwidth_tbps),
        lg(sms),
        // Power headroom: GPUs with few watts per peak FLOP throttle on heavy kernels.
        lg(gpu.tdp_w / gpu.peak.bf16_tflops),
        // GDDR cards stream at a different fraction of their spec bandwidth than HBM GPUs.
        f64::from(u8::from(gpu.memory.dram == crate::hardware::DramKind::Gddr)),
    ];
    if !has_spec_features(k.op) {
        v.truncate(4);
    }
    let gqa = |k: &Kernel| k.num_heads as f64 / k.num_kv_heads.max(1) as f64;
    match k.op {
        Op::Gemm => {
            let t128 = ceil_div(k.m, 128) * ceil_div(k.n, 128);
            let t64 = ceil_div(k.m, 64) * ceil_div(k.n, 128);
            v.extend([
                lg1(k.m),
                lg1(k.n),
                lg1(k.k),
                lg(t128 / sms),
                wave_fill(t128, sms),
                lg(t64 / sms),
                wave_fill(t64, sms),
                lg(k.m as f64 / sms),
            ]);
        }
        Op::AttnPrefill | Op::MlaPrefill => {
            let ctas = (k.batch * k.num_heads) as f64 * ceil_div(k.seq_len, 128);
            v.extend([
                lg1(k.batch),
                lg1(k.seq_len),
                lg1(k.kv_len),
                lg1(k.num_heads),
                lg(gqa(k)),
                lg1(k.head_dim),
                lg1(k.window),
                lg(k.kv_dtype().bytes()),
                lg(ctas / sms),
                wave_fill(ctas, sms),
            ]);
        }
        Op::AttnDecode | Op::MlaDecode => {
            let ctas = (k.batch * k.num_kv_heads.max(1)) as f64;
            let kv = if k.window > 0 { k.kv_len.min(k.window) } else { k.kv_len };
            let kv_bytes = kv as f64 * k.num_kv_heads.max(1) as f64 * k.head_dim as f64 * 2.0 * k.kv_dtype().bytes();
            v.extend([
                lg1(k.batch),
                lg1(k.kv_len),
                lg1(k.num_heads),
                lg(gqa(k)),
                lg1(k.head_dim),
                lg1(k.window),
                lg(k.kv_dtype().bytes()),
                lg(ctas / sms),
                lg(kv_bytes),
            ]);
        }
        Op::Moe => {
            let ep = k.ep.max(1) as f64;
            let assignments = k.num_tokens as f64 * k.topk as f64;
            v.extend([
                lg1(k.num_tokens),
                lg1(k.hidden),
                lg1(k.inter),
                lg1(k.topk),
                lg1(k.num_experts),
                lg1(k.tp),
                lg1(k.ep),
                lg(assignments / k.num_experts.max(1) as f64),
                lg(k.topk as f64 / ep),
                lg(k.num_experts as f64 / ep),
                lg(k.num_tokens as f64 / sms),
            ]);
            // Rows padded to whole tiles per expert, over the rows routed (see `row_tiles`).
            let pad = routing.padding_ratios(k.num_tokens as f64, k.topk as f64, k.num_experts.max(1) as f64, ep);
            v.extend(pad.map(lg));
        }
        _ => {
            v.extend([
                lg1(k.num_tokens),
                lg1(k.hidden),
                lg1(k.batch),
                lg1(k.num_heads),
                lg1(k.head_dim),
                lg1(k.bytes),
            ]);
        }
    }
    if matches!(k.op, Op::MlaPrefill | Op::MlaDecode) {
        // Share of the bound in the module's projections (0 for attention-core rows).
        v.push((1.0 - sol(k, gpu).sol_us / s.sol_us.max(1e-12)).clamp(0.0, 1.0));
    }
    v
}

/// SOL of a collective on the link class it actually ran over (`perf::sol` assumes the
/// deployment's own fabric; a measured row may have crossed a bridge, PCIe or the network).
/// A network class with no row topology puts one GPU on each node unless the GPUs outnumber a
/// node.
pub fn collective_sol(k: &Kernel, gpu: &GpuSpec, class: LinkClass) -> Sol {
    let gpus_per_node = gpu.interconnect.gpus_per_node as u64;
    collective_sol_on(k, gpu, class, if k.num_gpus > gpus_per_node { gpus_per_node } else { 1 })
}

/// As `collective_sol`, with `per_node` GPUs on each node: the network classes share a node's
/// NICs among its GPUs' traffic (`perf::sol::scaleout_us`), bounded below by the scale-up
/// fabric inside the node.
pub fn collective_sol_on(k: &Kernel, gpu: &GpuSpec, class: LinkClass, per_node: u64) -> Sol {
    let s = sol(k, gpu);
    let wire_us = |c: LinkClass| collective_wire_bytes(k) / c.bytes_per_s(gpu) * 1e6;
    let net_us = match class {
        LinkClass::ScaleOut | LinkClass::HostNet => {
            let inside = if per_node > 1 { wire_us(LinkClass::of(gpu, per_node)) } else { 0.0 };
            scaleout_us(k, per_node, class.bytes_per_s(gpu)).max(inside)
        }
        _ => wire_us(class),
    };
    Sol { memory_us: net_us, sol_us: net_us.max(s.compute_us), ..s }
}

/// Features and SOL together (the SOL is needed again to turn a predicted ratio into time),
/// MoE experts hit by uniform routing (served traffic).
pub fn extract_with_sol(k: &Kernel, gpu: &GpuSpec, backend: &str) -> (Vec<f64>, Sol) {
    extract_with_sol_routed(k, gpu, backend, Routing::Uniform)
}

/// As `extract_with_sol` for a row measured with `routing`.
pub fn extract_with_sol_routed(k: &Kernel, gpu: &GpuSpec, backend: &str, routing: Routing) -> (Vec<f64>, Sol) {
    let s = row_sol_routed(k, gpu, backend, routing);
    (extract(k, gpu, &s, backend, routing), s)
}

/// SOL of a row from its provenance: a collective on the link class it ran over, an MLA
/// module row with its projections (`mla_module_weights`), anything else `perf::sol`.
pub fn row_sol(k: &Kernel, gpu: &GpuSpec, backend: &str) -> Sol {
    row_sol_routed(k, gpu, backend, Routing::Uniform)
}

/// As `row_sol`, a MoE row's expert reads counted for the routing it was measured with.
pub fn row_sol_routed(k: &Kernel, gpu: &GpuSpec, backend: &str, routing: Routing) -> Sol {
    if k.op.is_collective() {
        let class = LinkClass::of_row(gpu, k.num_gpus, backend);
        collective_sol_on(k, gpu, class, LinkClass::gpus_per_node_of_row(gpu, k.num_gpus, backend))
    } else if let Some(w) = mla_module_weights(k.op, backend) {
        mla_module_sol(k, gpu, &MlaModule::DEEPSEEK_V3, w)
    } else {
        sol_routed(k, gpu, routing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::load_gpu;
    use crate::schema::Dtype;

    #[test]
    fn names_match_values_for_every_op() {
        let g = load_gpu("h200_sxm").unwrap();
        for op in Op::ALL {
            let mut k = Kernel::new(op, Dtype::Bf16);
            for f in Kernel::required_fields(op) {
                match *f {
                    "m" => k.m = 64,
                    "n" => k.n = 64,
                    "k" => k.k = 64,
                    "batch" => k.batch = 2,
                    "seq_len" => k.seq_len = 128,
                    "kv_len" => k.kv_len = 128,
                    "num_heads" => k.num_heads = 8,
                    "num_kv_heads" => k.num_kv_heads = 8,
                    "head_dim" => k.head_dim = 128,
                    "num_tokens" => k.num_tokens = 16,
                    "hidden" => k.hidden = 1024,
                    "inter" => k.inter = 512,
                    "topk" => k.topk = 2,
                    "num_experts" => k.num_experts = 8,
                    "bytes" => k.bytes = 1 << 20,
                    "num_gpus" => k.num_gpus = 8,
                    _ => {}
                }
            }
            let (x, _) = extract_with_sol(&k, &g, "lib");
            assert_eq!(x.len(), names(op).len(), "{op}");
            assert!(x.iter().all(|v| v.is_finite()), "{op}: {x:?}");
        }
    }

    #[test]
    fn mla_module_rows_are_known_by_their_backend() {
        let b = "vllm/module_gemm_fp8_block/norm_vllm_c_eager_surrogate/FLASHINFER_MLA";
        assert_eq!(mla_module_weights(Op::MlaDecode, b), Some(Dtype::Fp8));
        assert_eq!(mla_module_weights(Op::MlaPrefill, "vllm/module_gemm_nvfp4/FLASH_ATTN"), Some(Dtype::Fp4));
        assert_eq!(mla_module_weights(Op::MlaPrefill, "vllm/module_gemm_bfloat16/FLASH_ATTN"), Some(Dtype::Bf16));
        assert_eq!(mla_module_weights(Op::MlaDecode, "vllm/vllm_flashmla"), None);
        assert_eq!(mla_module_weights(Op::Gemm, "vllm/module_gemm_bfloat16"), None);
        assert_eq!(mla_path(b), "module/norm_vllm_c_eager_surrogate");
        assert_eq!(mla_path("vllm/module_gemm_bfloat16/FLASH_ATTN"), "module");
        assert_eq!(mla_path("vllm/vllm_flashmla"), "core");
        assert_eq!(backend_category(Op::MlaDecode, b), "vllm/module_gemm_fp8_block/FLASHINFER_MLA");
        assert_eq!(backend_category(Op::AllReduce, "x/norm_y"), "x/norm_y");
        // A module row's SOL is the module's, the core's is perf::sol; the projection share
        // feature says which.
        let g = load_gpu("h200_sxm").unwrap();
        let mut k = Kernel::new(Op::MlaDecode, Dtype::Bf16);
        (k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim) = (1, 1024, 128, 1, 576);
        let (xm, sm) = extract_with_sol(&k, &g, "vllm/module_gemm_bfloat16/FLASHMLA");
        let (xc, sc) = extract_with_sol(&k, &g, "vllm/vllm_flashmla");
        assert!(sm.sol_us > 50.0 * sc.sol_us, "{sm:?} {sc:?}");
        let i = names(Op::MlaDecode).iter().position(|n| *n == "projection_sol_share").unwrap();
        assert!(xm[i] > 0.98 && xc[i] == 0.0, "{} {}", xm[i], xc[i]);
        // MLA features carry no spec-sheet figures.
        assert!(!names(Op::MlaDecode).contains(&"lg_peak_tflops"));
        assert!(names(Op::AttnDecode).contains(&"lg_peak_tflops"));
    }

    #[test]
    fn gemm_ai_over_ridge_and_wave_fill() {
        let g = load_gpu("h200_sxm").unwrap();
        // 8192^3 bf16: AI = 2*8192^3 / (3*8192^2*2) = 8192/3 FLOP/B; ridge = 989.4e12 / 4.8e12.
        let k = Kernel::gemm(Dtype::Bf16, 8192, 8192, 8192);
        let (x, _) = extract_with_sol(&k, &g, "lib");
        let i = names(Op::Gemm).iter().position(|n| *n == "lg_compute_over_memory").unwrap();
        let expected = ((8192.0f64 / 3.0) / (989.4e12 / 4.8e12)).log2();
        assert!((x[i] - expected).abs() < 1e-9, "{} vs {expected}", x[i]);
        // 64 x 64 output tiles of 128 on 132 SMs: 4096 tiles = 31.03 waves -> fill 4096/(32*132).
        let j = names(Op::Gemm).iter().position(|n| *n == "fill_128").unwrap();
        assert!((x[j] - 4096.0 / (32.0 * 132.0)).abs() < 1e-12);
    }
}
