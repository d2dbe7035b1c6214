//! Engine parameters: which scheduling policy and its limits, read from
//! `calibration/engines/NAME.toml` (embedded) or a TOML file path.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

include!(concat!(env!("OUT_DIR"), "/embedded_calibration.rs"));

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// vLLM v1: running requests first, then waiting FCFS, prefill and decode mixed in one step.
    Continuous,
    /// SGLang: a step is all prefill (if any request can be admitted) or all decode.
    PrefillFirst,
    /// Fixed batches formed when the engine is idle.
    Static,
    /// transformers' continuous batching (`FIFOScheduler` with `cpu_offload_space = 0`): decoding
    /// requests first, then those still prefilling, then waiting ones, prefill and decode mixed
    /// in one step. A running request that cannot get a block this step is skipped ("starved");
    /// after the step is formed the starved ones are evicted newest first until the rest fit
    /// (never the last one running) and rejoin the waiting queue at the back, to recompute
    /// prompt and generated tokens ("soft reset"); no waiting request is admitted again until
    /// one finishes.
    DecodeFirst,
}

/// How a request's block table grows to hold a step's `n` new tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockGrowth {
    /// To exactly `ceil(tokens / block_size)` blocks (vLLM, SGLang).
    #[default]
    Exact,
    /// transformers' `_allocate_blocks_if_needed`: when `n` exceeds the table's free slots
    /// `free` (or it has no block), add `(n - free + 1) / block_size + 1` blocks, one more than
    /// needed when `n - free` is within one token of a block multiple (a 512-token prompt takes
    /// three 256-token blocks).
    HfPlusOne,
}

impl BlockGrowth {
    /// Blocks to add to a table of `have` blocks holding `computed` tokens for `n` more tokens.
    #[inline]
    pub fn blocks_to_add(self, have: u32, computed: u32, n: u32, block_size: u32) -> u32 {
        match self {
            BlockGrowth::Exact => (computed + n).div_ceil(block_size).saturating_sub(have),
            BlockGrowth::HfPlusOne => {
                let free = (have * block_size).saturating_sub(computed);
                if free < n || have == 0 {
                    (n - free.min(n) + 1) / block_size + 1
                } else {
                    0
                }
            }
        }
    }

    /// Blocks a request of `tokens` KV tokens holds at the end of its life when its prompt of
    /// `prompt` tokens arrives in chunks of at most `chunk` and every later token one at a time:
    /// what admission checks against the pool. `HfPlusOne` over-allocates at every growth, so a
    /// request can need more blocks than its tokens fill.
    pub fn lifetime_blocks(self, prompt: u32, tokens: u64, chunk: u32, block_size: u32) -> u64 {
        let bs = block_size as u64;
        match self {
            BlockGrowth::Exact => tokens.div_ceil(bs),
            BlockGrowth::HfPlusOne => {
                let (mut have, mut computed) = (0u64, 0u64);
                let chunk = chunk.max(1) as u64;
                while computed < (prompt as u64).min(tokens) {
                    let n = chunk.min(prompt as u64 - computed);
                    have += self.blocks_to_add(have as u32, computed as u32, n as u32, block_size) as u64;
                    computed += n;
                }
                // Decode: a full table grows by the same amount each time it fills.
                while have * bs < tokens {
                    have += self.blocks_to_add(have as u32, (have * bs) as u32, 1, block_size) as u64;
                }
                have
            }
        }
    }
}

/// The KV cache's dtype when the user does not give one (`--kv-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvCacheDtype {
    /// 16-bit whatever the weights: vLLM's and SGLang's `kv_cache_dtype = auto` on a checkpoint
    /// that carries no KV-cache quantization.
    #[default]
    Bf16,
    /// The checkpoint's: FP8 when the weights are FP8. TensorRT-LLM runs FP8 from ModelOpt
    /// checkpoints, whose `hf_quant_config.json` sets `kv_cache_quant_algo = FP8`, and its
    /// `KvCacheConfig.dtype = "auto"` takes that.
    Checkpoint,
}

impl KvCacheDtype {
    /// The KV dtype of a deployment whose GEMM weights are `weights`.
    pub fn for_weights(self, weights: crate::schema::Dtype) -> crate::schema::Dtype {
        use crate::schema::Dtype;
        match (self, weights) {
            (KvCacheDtype::Checkpoint, Dtype::Fp8) => Dtype::Fp8,
            _ => Dtype::Bf16,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineParams {
    pub name: String,
    pub description: String,
    pub policy: Policy,
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
    pub block_size: u32,
    pub chunked_prefill: bool,
    pub prefix_caching: bool,
    pub gpu_memory_utilization: f64,
    pub pad_finished: bool,
    /// How attention runs over a batch (step-time model detail of the engine).
    #[serde(default)]
    pub attention_impl: crate::kernels::graph::AttentionImpl,
    /// CUDA graphs over padded shapes, captured on first use (transformers); absent = eager or
    /// shapes not padded.
    #[serde(default)]
    pub cuda_graphs: Option<crate::perf::graphs::GraphPadding>,
    /// Kernel libraries the engine runs, per op family: `op = "category prefix"` or a list of
    /// them in preference order, as the calibrated models name their measurements' libraries
    /// (see `KernelModel::with_op_backends`). Ops not listed use each model's most measured one.
    #[serde(default)]
    pub kernel_backends: BTreeMap<String, Backends>,
    /// Ops whose library the user named (`simulate --kernel-backend`): the library is priced
    /// even where this GPU never measured it (by the cross-gen model), where a profile's list
    /// is a fallback order over the libraries the GPU runs.
    #[serde(skip)]
    pub named_backends: std::collections::BTreeSet<String>,
    /// Eager engines that run an op as several small torch kernels (`op = kernels`, e.g.
    /// transformers' RMSNorm: cast, pow, mean, add, rsqrt, mul, cast, mul = 8): that many
    /// launches, timed as the engine's own module where `kernel_backends` names one the kernel
    /// model has measured, else each piece as one elementwise pass over the op's tensor.
    #[serde(default)]
    pub unfused_elementwise: BTreeMap<String, u32>,
    /// Ops whose one calibrated kernel is, as the engine runs it, several launches (`op =
    /// launches`, e.g. transformers' grouped-GEMM experts: routing sort, histogram, gathers,
    /// three grouped GEMMs, scatter): counted for the host's launch and capture terms only,
    /// timed as the one op.
    #[serde(default)]
    pub kernel_launches: BTreeMap<String, u32>,
    /// Eager engines: aten ops the engine's Python dispatches for one instance of an op (`op =
    /// ops`; `"op:library" = ops` for the op's instances the kernel graph times as that library,
    /// e.g. transformers' eager sink attention), the unit of the host's eager launch term
    /// (`HostOverhead::launch_per_host_op_us`). Ops not listed count their kernel launches.
    #[serde(default)]
    pub host_ops: BTreeMap<String, u32>,
    /// q, k, v, the MLP's gate and up and the per-head q and k norms as separate modules
    /// (transformers' Llama-family layers) instead of the fused kernels vLLM-style engines run.
    #[serde(default)]
    pub separate_modules: bool,
    /// transformers' `generate` switches grouped_mm experts to batched_mm for decode steps:
    /// each token's top-k experts' weights are gathered into a copy of their own and multiplied
    /// by one bmm, so a decode step moves tokens x top-k experts' weights three times (read,
    /// write, read) instead of reading each active expert once (`Predictor::batched_experts_us`).
    #[serde(default)]
    pub decode_batched_experts: bool,
    /// Fraction of the KV blocks that must be free for a prefill (a new request or a chunked
    /// prompt's next piece) to join a batch that already holds requests: transformers' FIFO
    /// scheduler `safety_margin` (0.15). 0: no margin.
    #[serde(default)]
    pub admission_free_fraction: f64,
    #[serde(default)]
    pub block_growth: BlockGrowth,
    /// vLLM's `async-scheduling`: the scheduler and input preparation of step n+1 run on the
    /// host while the GPU executes step n, so a step lasts max(GPU time, host time) instead of
    /// their sum (a step on an idle engine has nothing to overlap), and step n+1 is formed when
    /// step n starts, so requests arriving during step n join step n+2 (vLLM's batch queue of
    /// two, `EngineCore.step_with_batch_queue`). Off by default, as in vLLM <= 0.11's server.
    #[serde(default)]
    pub async_scheduling: bool,
    /// vLLM's compiled CUDA graphs (`FULL_AND_PIECEWISE`): a decode-only step replays one full
    /// graph; a step with prefill tokens replays the model's pieces, launching attention between
    /// them, up to this many tokens (`max_cudagraph_capture_size`), and runs the compiled model
    /// without graphs above it. Priced by `HostOverhead::{piecewise,eager}_launch_per_layer_us`.
    #[serde(default)]
    pub piecewise_graph_max_tokens: Option<u32>,
    /// The engine writes each attention layer's new keys and values into the paged cache with
    /// a kernel of its own (vLLM's `reshape_and_cache_flash`), priced as a row copy
    /// (`kernels::graph::engine_step_kernels`). False: the write is fused (or not modelled).
    #[serde(default)]
    pub kv_cache_write: bool,
    /// Small kernels the engine runs every step to prepare the model's inputs (vLLM 0.24 on the
    /// H200: about 20, ~40 us in all), each priced at a few-KB copy's launch floor.
    #[serde(default)]
    pub step_prep_kernels: u32,
    /// The KV cache's dtype where `--kv-dtype` is not given.
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
}

/// A table of per-op kernel counts (`field`), keyed by op; unknown ops and zero counts rejected.
fn kernel_counts(field: &str, table: &BTreeMap<String, u32>) -> Result<BTreeMap<crate::schema::Op, u32>> {
    table
        .iter()
        .map(|(op, &n)| {
            let op = op_key(field, op)?;
            if n == 0 {
                bail!("field '{field}': '{op}' must run as at least 1 kernel, got 0");
            }
            Ok((op, n))
        })
        .collect()
}

/// One kernel-library prefix or several in preference order.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Backends {
    One(String),
    Many(Vec<String>),
}

impl EngineParams {
    /// `named_backends` as ops, rejecting unknown op names.
    pub fn named_ops(&self) -> Result<std::collections::BTreeSet<crate::schema::Op>> {
        self.named_backends.iter().map(|op| op_key("kernel_backends", op)).collect()
    }

    /// `kernel_backends` keyed by op, rejecting unknown op names.
    pub fn op_backends(&self) -> Result<BTreeMap<crate::schema::Op, Vec<String>>> {
        self.kernel_backends
            .iter()
            .map(|(op, b)| {
                let op = op_key("kernel_backends", op)?;
                let list = match b {
                    Backends::One(p) => vec![p.clone()],
                    Backends::Many(v) => v.clone(),
                };
                Ok((op, list))
            })
            .collect()
    }

    /// `unfused_elementwise` keyed by op, rejecting unknown op names and zero counts.
    pub fn unfused_ops(&self) -> Result<BTreeMap<crate::schema::Op, u32>> {
        kernel_counts("unfused_elementwise", &self.unfused_elementwise)
    }

    /// `kernel_launches` keyed by op, rejecting unknown op names and zero counts.
    pub fn op_launches(&self) -> Result<BTreeMap<crate::schema::Op, u32>> {
        kernel_counts("kernel_launches", &self.kernel_launches)
    }

    /// `host_ops` keyed by op and, for `op:library` keys, the library; rejects unknown ops,
    /// libraries the kernel graph does not name and zero counts.
    pub fn op_host_ops(&self) -> Result<BTreeMap<(crate::schema::Op, Option<&'static str>), u32>> {
        self.host_ops
            .iter()
            .map(|(key, &n)| {
                let (op, library) = match key.split_once(':') {
                    Some((op, lib)) => {
                        let Some(&known) = crate::kernels::graph::INSTANCE_LIBRARIES.iter().find(|l| **l == lib) else {
                            bail!("field 'host_ops': unknown library '{lib}' in '{key}'; the kernel graph names {}", crate::kernels::graph::INSTANCE_LIBRARIES.join(", "));
                        };
                        (op_key("host_ops", op)?, Some(known))
                    }
                    None => (op_key("host_ops", key)?, None),
                };
                if n == 0 {
                    bail!("field 'host_ops': '{key}' must dispatch at least 1 op, got 0");
                }
                Ok(((op, library), n))
            })
            .collect()
    }

    /// By embedded name (`vllm`, `sglang`, `static`) or path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<EngineParams> {
        let (text, origin) = if name_or_path.ends_with(".toml") {
            (std::fs::read_to_string(name_or_path).with_context(|| format!("reading engine file {name_or_path}"))?, name_or_path.to_string())
        } else {
            let file = format!("engines/{name_or_path}.toml");
            let text = EMBEDDED_CALIBRATION
                .iter()
                .find(|(p, _)| *p == file)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| anyhow!("unknown engine '{name_or_path}'; known: {} (or a path to an engine .toml)", builtin_engines().join(", ")))?;
            (text, format!("calibration/{file}"))
        };
        let p: EngineParams = toml::from_str(&text).map_err(|e| anyhow!("{origin}: {e}"))?;
        p.validate().with_context(|| origin.clone())?;
        Ok(p)
    }

    /// The buffers this engine allocates besides weights and KV pages (`kernels::memory`).
    pub fn buffers(&self) -> crate::kernels::memory::EngineBuffers {
        crate::kernels::memory::EngineBuffers::of(self.attention_impl, self.cuda_graphs.map(|g| g.kv_tokens as u64))
    }

    /// Whether this engine sizes its own KV pool with its memory polynomial (transformers),
    /// rather than from a profiled peak (vLLM, SGLang, TRT-LLM: `kernels::memory::plan`).
    pub fn sizes_own_pool(&self) -> bool {
        matches!(self.buffers(), crate::kernels::memory::EngineBuffers::PackedSdpa { .. })
    }

    /// The KV pages (over every KV group) this engine allocates when nobody pins them: the
    /// memory plan's pool, or transformers' own sizing (`sizes_own_pool`).
    pub fn unpinned_pool_pages(
        &self,
        model: &crate::model::ModelConfig,
        gpu: &crate::hardware::GpuSpec,
        dep: &crate::deployment::Deployment,
        plan: &crate::kernels::memory::MemoryPlan,
    ) -> Result<u32> {
        let pages = if self.sizes_own_pool() {
            crate::kernels::memory::transformers_self_sized_pages(model, gpu, dep, self.block_size as u64, self.max_num_batched_tokens as u64, self.gpu_memory_utilization)?
        } else {
            crate::sim::kv::KvLayout::of(model, self.block_size).pool_pages(plan.kv_capacity_tokens, self.block_size) as u64
        };
        match u32::try_from(pages) {
            Ok(p) if p > 0 => Ok(p),
            _ => bail!("{} on {}: the KV budget holds {pages} pages of {} tokens", model.name, gpu.id, self.block_size),
        }
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("max_num_batched_tokens", self.max_num_batched_tokens), ("max_num_seqs", self.max_num_seqs), ("block_size", self.block_size)] {
            if v == 0 {
                bail!("'{name}' must be at least 1");
            }
        }
        if let Some(g) = &self.cuda_graphs {
            g.validate()?;
        }
        self.op_backends()?;
        self.unfused_ops()?;
        self.op_launches()?;
        self.op_host_ops()?;
        if !(0.0..1.0).contains(&self.admission_free_fraction) {
            bail!("'admission_free_fraction' must be in [0, 1), got {}", self.admission_free_fraction);
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            bail!("'gpu_memory_utilization' must be in (0, 1], got {}", self.gpu_memory_utilization);
        }
        Ok(())
    }
}

/// An op named as a key of table `field`, or an error naming the field and the allowed ops.
fn op_key(field: &str, name: &str) -> Result<crate::schema::Op> {
    name.parse::<crate::schema::Op>().map_err(|e| anyhow!("field '{field}': {e}"))
}

pub fn builtin_engines() -> Vec<String> {
    EMBEDDED_CALIBRATION
        .iter()
        .filter_map(|(p, _)| p.strip_prefix("engines/").and_then(|n| n.strip_suffix(".toml")).map(str::to_string))
        .collect()
}

#[cfg(test)]
mod kernel_backend_tests {
    use super::*;
    use crate::schema::Op;

    fn with_backends(table: &str) -> Result<EngineParams> {
        let mut text = EMBEDDED_CALIBRATION.iter().find(|(p, _)| *p == "engines/static.toml").unwrap().1.to_string();
        text.push_str(table);
        let p: EngineParams = toml::from_str(&text)?;
        p.validate()?;
        Ok(p)
    }

    #[test]
    fn kernel_backends_take_one_prefix_or_a_list_and_reject_unknown_ops() {
        let p = with_backends("\n[kernel_backends]\ngemm = \"cublas\"\nall_reduce = [\"vllm/custom_ar_graph\", \"nccl\"]\n").unwrap();
        let b = p.op_backends().unwrap();
        assert_eq!(b[&Op::Gemm], vec!["cublas".to_string()]);
        assert_eq!(b[&Op::AllReduce], vec!["vllm/custom_ar_graph".to_string(), "nccl".to_string()]);
        let e = with_backends("\n[kernel_backends]\ngemmm = \"cublas\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("kernel_backends") && format!("{e:#}").contains("gemmm"), "{e:#}");
    }

    #[test]
    fn kernel_launches_count_launches_and_reject_zero() {
        let p = with_backends("\n[kernel_launches]\nmoe = 34\n").unwrap();
        assert_eq!(p.op_launches().unwrap()[&Op::Moe], 34);
        let e = with_backends("\n[kernel_launches]\nmoe = 0\n").unwrap_err();
        assert!(format!("{e:#}").contains("kernel_launches") && format!("{e:#}").contains("at least 1"), "{e:#}");
    }

    #[test]
    fn host_ops_take_an_op_or_an_op_and_a_graph_library_and_reject_the_rest() {
        let p = with_backends("\n[host_ops]\ngemm = 4\n\"attn_prefill:torch_eager_sinks\" = 47\n").unwrap();
        let h = p.op_host_ops().unwrap();
        assert_eq!((h[&(Op::Gemm, None)], h[&(Op::AttnPrefill, Some("torch_eager_sinks"))]), (4, 47));
        for (bad, says) in [("gemmm = 4", "gemmm"), ("\"attn_prefill:flash\" = 4", "unknown library 'flash'"), ("moe = 0", "at least 1")] {
            let e = with_backends(&format!("\n[host_ops]\n{bad}\n")).unwrap_err();
            assert!(format!("{e:#}").contains("host_ops") && format!("{e:#}").contains(says), "{e:#}");
        }
    }

    #[test]
    fn serving_engines_name_their_all_reduce() {
        for (engine, lib) in [("vllm", "vllm/custom_ar_graph"), ("sglang", "vllm/custom_ar_graph"), ("trtllm", "trtllm/custom_ar")] {
            let b = EngineParams::load(engine).unwrap().op_backends().unwrap();
            assert_eq!(b[&Op::AllReduce][0], lib, "{engine}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_graph_profile_loads_with_padding_and_kernel_libraries() {
        let e = EngineParams::load("hf-cudagraph").unwrap();
        let pad = e.cuda_graphs.expect("hf-cudagraph pads its steps");
        assert_eq!((pad.q_tokens, pad.kv_tokens), (64, 16384));
        assert_eq!(e.op_backends().unwrap()[&crate::schema::Op::AttnPrefill], vec!["sdpa_cudnn_masked".to_string()]);
        assert!(EngineParams::load("hf").unwrap().cuda_graphs.is_none());
    }

    #[test]
    fn unknown_op_in_kernel_backends_is_named() {
        let dir = std::env::temp_dir().join(format!("ks-engine-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        let text = EMBEDDED_CALIBRATION.iter().find(|(p, _)| *p == "engines/hf.toml").unwrap().1.replace("gemm = \"cublas\"", "gemmm = \"cublas\"");
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", EngineParams::load(path.to_str().unwrap()).unwrap_err());
        assert!(err.contains("bad.toml") && err.contains("kernel_backends") && err.contains("gemmm") && err.contains("allowed"), "{err}");
    }

    #[test]
    fn lifetime_blocks_follow_each_growth_rule() {
        // One-token blocks, a 109-token prompt in one piece, 119 tokens in all. Exact: 119.
        // transformers: the prompt takes (109 + 1) / 1 + 1 = 111 blocks, every full table then
        // grows by (1 + 1) / 1 + 1 = 3: 114, 117, 120.
        assert_eq!(BlockGrowth::Exact.lifetime_blocks(109, 119, 109, 1), 119);
        assert_eq!(BlockGrowth::HfPlusOne.lifetime_blocks(109, 119, 109, 1), 120);
        // 256-token blocks: a 512-token prompt takes three, which hold 256 decoded tokens more.
        assert_eq!(BlockGrowth::HfPlusOne.lifetime_blocks(512, 768, 512, 256), 3);
        assert_eq!(BlockGrowth::HfPlusOne.lifetime_blocks(512, 769, 512, 256), 4);
        // Chunks grow the table once each: 512 tokens in 128-token chunks on 16-token blocks
        // take (128 + 1) / 16 + 1 = 9 blocks for the first chunk, then 8 per chunk (the
        // table's one spare block already holds 16 of the next 128): 9 + 3 x 8 = 33.
        assert_eq!(BlockGrowth::HfPlusOne.lifetime_blocks(512, 512, 128, 16), 33);
        assert_eq!(BlockGrowth::Exact.lifetime_blocks(512, 512, 128, 16), 32);
    }
}
