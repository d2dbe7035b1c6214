//! aiconfigurator importer on small synthetic parquet tables written here. Expected values are
//! hand-computed from the upstream conventions (latency ms, NCCL sizes in elements, decode
//! `step` = cached tokens).

use kernelsight::ingest::{self, aiconfigurator};
use kernelsight::schema::{Dtype, KernelRow, Op};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::path::{Path, PathBuf};
use std::sync::Arc;

enum Col<'a> {
    S(&'a str, Vec<&'a str>),
    I(&'a str, Vec<i64>),
    F(&'a str, Vec<f64>),
}

/// Writes `cols` as one row group at `root/rel`.
fn write_parquet(root: &Path, rel: &str, cols: &[Col]) -> PathBuf {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let fields: Vec<String> = cols
        .iter()
        .map(|c| match c {
            Col::S(n, _) => format!("REQUIRED BYTE_ARRAY {n} (UTF8);"),
            Col::I(n, _) => format!("REQUIRED INT64 {n};"),
            Col::F(n, _) => format!("REQUIRED DOUBLE {n};"),
        })
        .collect();
    let schema = Arc::new(parse_message_type(&format!("message t {{ {} }}", fields.join(" "))).unwrap());
    let file = std::fs::File::create(&path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, Arc::new(WriterProperties::builder().build())).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let mut i = 0;
    while let Some(mut cw) = rg.next_column().unwrap() {
        match &cols[i] {
            Col::S(_, v) => {
                let vals: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(*s)).collect();
                cw.typed::<ByteArrayType>().write_batch(&vals, None, None).unwrap();
            }
            Col::I(_, v) => {
                cw.typed::<Int64Type>().write_batch(v, None, None).unwrap();
            }
            Col::F(_, v) => {
                cw.typed::<DoubleType>().write_batch(v, None, None).unwrap();
            }
        }
        cw.close().unwrap();
        i += 1;
    }
    rg.close().unwrap();
    w.close().unwrap();
    path
}

fn find(rows: &[KernelRow], pred: impl Fn(&KernelRow) -> bool) -> Vec<&KernelRow> {
    rows.iter().filter(|r| pred(r)).collect()
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.abs().max(1.0)
}

fn gemm_table(root: &Path) -> PathBuf {
    write_parquet(
        root,
        "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
        &[
            Col::S("framework", vec!["VLLM"; 7]),
            Col::S("kernel_source", vec!["lin", "lin", "lin", "lin", "blk", "fp4k", "wo"]),
            Col::S("gemm_dtype", vec!["bfloat16", "bfloat16", "bfloat16", "bfloat16", "fp8_block", "nvfp4", "int4_wo"]),
            Col::I("m", vec![1, 16, 16, 16, 16, 16, 16]),
            Col::I("n", vec![8192, 4096, 4096, 4096, 4096, 4096, 4096]),
            Col::I("k", vec![8192, 4096, 4096, 4096, 4096, 4096, 4096]),
            // three re-measurements of m=16 bf16: median 0.020 ms
            Col::F("latency", vec![0.05, 0.010, 0.030, 0.020, 0.040, 0.060, 0.070]),
        ],
    )
}

#[test]
fn gemm_units_dtypes_median_and_skips() {
    let dir = tempfile::tempdir().unwrap();
    let path = gemm_table(dir.path());
    let out = aiconfigurator::import_file(&path).unwrap();
    assert_eq!(out.rows.len(), 4, "3 distinct bf16/fp8_block/nvfp4 shapes + m=1: {:?}", out.rows);
    let m1 = find(&out.rows, |r| r.kernel.m == 1)[0];
    assert!(approx(m1.latency_us.unwrap(), 50.0), "0.05 ms = 50 us");
    assert_eq!((m1.kernel.op, m1.kernel.dtype, m1.kernel.n, m1.kernel.k), (Op::Gemm, Dtype::Bf16, 8192, 8192));
    assert_eq!(m1.gpu.as_deref(), Some("h200_sxm"));
    assert_eq!(m1.source.as_deref(), Some("aiconfigurator"));
    assert_eq!(m1.backend.as_deref(), Some("vllm-0.24.0"));
    assert_eq!(m1.extra, vec![("kernel".to_string(), "lin".to_string())]);
    let med = find(&out.rows, |r| r.kernel.m == 16 && r.kernel.dtype == Dtype::Bf16)[0];
    assert!(approx(med.latency_us.unwrap(), 20.0), "median of 10, 30, 20 us");
    let blk = find(&out.rows, |r| r.kernel.dtype == Dtype::Fp8)[0];
    assert_eq!(blk.backend.as_deref(), Some("vllm-0.24.0/fp8_block"));
    assert!(approx(blk.latency_us.unwrap(), 40.0));
    assert_eq!(find(&out.rows, |r| r.kernel.dtype == Dtype::Fp4).len(), 1);
    assert_eq!(out.skipped.get("gemm_perf: gemm_dtype int4_wo"), Some(&1));
}

#[test]
fn attention_decode_attends_step_plus_one_and_keeps_kv_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let common = |n: usize| {
        vec![
            Col::I("batch_size", vec![64; n]),
            Col::I("isl", vec![1; n]),
            Col::I("num_heads", vec![32; n]),
            Col::I("num_key_value_heads", vec![8; n]),
            Col::I("head_dim", vec![128; n]),
            Col::I("beam_width", vec![1; n]),
            Col::S("attn_dtype", vec!["bfloat16"; n]),
        ]
    };
    let mut cols = common(2);
    cols.extend([
        Col::S("kv_cache_dtype", vec!["bfloat16", "fp8"]),
        Col::I("step", vec![4095, 4095]),
        Col::I("window_size", vec![0, 128]),
        Col::F("latency", vec![0.1, 0.06]),
    ]);
    let p = write_parquet(dir.path(), "b200_sxm/attention/vllm/0.24.0/generation_attention_perf.parquet", &cols);
    let out = aiconfigurator::import_file(&p).unwrap();
    assert_eq!(out.rows.len(), 2);
    for r in &out.rows {
        assert_eq!(r.kernel.op, Op::AttnDecode);
        assert_eq!(r.kernel.kv_len, 4096, "step 4095 cached + 1 new token");
        assert_eq!(r.kernel.seq_len, 0);
        assert_eq!((r.kernel.batch, r.kernel.num_heads, r.kernel.num_kv_heads, r.kernel.head_dim), (64, 32, 8, 128));
    }
    let fp8 = find(&out.rows, |r| r.kernel.kv_dtype == Some(Dtype::Fp8))[0];
    assert_eq!(fp8.kernel.window, 128);
    assert!(approx(fp8.latency_us.unwrap(), 60.0));
    let bf = find(&out.rows, |r| r.kernel.kv_dtype.is_none())[0];
    assert_eq!(bf.kernel.window, 0);

    // Prefill: seq_len = isl, no cached prefix; older tables have no window column.
    let mut cols = common(1);
    cols[1] = Col::I("isl", vec![2048]);
    cols.extend([
        Col::S("kv_cache_dtype", vec!["bfloat16"]),
        Col::I("step", vec![0]),
        Col::F("latency", vec![1.5]),
    ]);
    let p = write_parquet(dir.path(), "a100_sxm/attention/vllm/0.14.0/context_attention_perf.parquet", &cols);
    let out = aiconfigurator::import_file(&p).unwrap();
    let r = &out.rows[0];
    assert_eq!((r.kernel.op, r.kernel.seq_len, r.kernel.kv_len, r.kernel.window), (Op::AttnPrefill, 2048, 0, 0));
    assert!(approx(r.latency_us.unwrap(), 1500.0));
    assert_eq!(r.backend.as_deref(), Some("vllm-0.14.0"));
}

#[test]
fn nccl_elements_become_bytes_and_version_column_names_backend() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        // Folder says 2.26.2, rows say 2.29.2 (as upstream h200_sxm): the row label wins.
        "h200_sxm/comm/nccl/2.26.2/nccl_perf.parquet",
        &[
            Col::S("version", vec!["2.29.2", "2.29.2", "2.29.2"]),
            Col::S("op_name", vec!["all_reduce", "all_reduce", "alltoall"]),
            Col::S("kernel_source", vec!["NCCL"; 3]),
            Col::S("nccl_dtype", vec!["half", "int8", "half"]),
            Col::I("num_gpus", vec![8, 8, 4]),
            Col::I("message_size", vec![1048576, 1048576, 256]),
            Col::F("latency", vec![0.02, 0.015, 0.01]),
        ],
    );
    let out = aiconfigurator::import_file(&p).unwrap();
    let half = find(&out.rows, |r| r.kernel.op == Op::AllReduce && r.kernel.dtype == Dtype::Fp16)[0];
    assert_eq!(half.kernel.bytes, 2 * 1048576, "fp16: 2 bytes per element");
    assert_eq!(half.kernel.num_gpus, 8);
    assert_eq!(half.backend.as_deref(), Some("nccl-2.29.2"));
    let int8 = find(&out.rows, |r| r.kernel.dtype == Dtype::Int8)[0];
    assert_eq!(int8.kernel.bytes, 1048576);
    let a2a = find(&out.rows, |r| r.kernel.op == Op::AllToAll)[0];
    assert_eq!((a2a.kernel.bytes, a2a.kernel.num_gpus), (512, 4));
    assert!(approx(a2a.latency_us.unwrap(), 10.0));

    // A table without a version column takes the folder name.
    let p = write_parquet(
        dir.path(),
        "h100_sxm/comm/nccl/2.23/nccl_perf.parquet",
        &[
            Col::S("nccl_dtype", vec!["half"]),
            Col::I("num_gpus", vec![2]),
            Col::I("message_size", vec![256]),
            Col::S("kernel_source", vec!["NCCL"]),
            Col::S("op_name", vec!["all_gather"]),
            Col::F("latency", vec![0.005]),
        ],
    );
    let out = aiconfigurator::import_file(&p).unwrap();
    assert_eq!(out.rows[0].backend.as_deref(), Some("nccl-2.23"));
}

#[test]
fn custom_allreduce_launch_mode_in_backend() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet",
        &[
            Col::S("allreduce_dtype", vec!["bfloat16", "bfloat16"]),
            Col::I("num_gpus", vec![4, 4]),
            Col::I("message_size", vec![4096, 4096]),
            Col::F("latency", vec![0.004, 0.02]),
            Col::S("backend", vec!["vllm_graph", "vllm_eager"]),
        ],
    );
    let out = aiconfigurator::import_file(&p).unwrap();
    let graph = find(&out.rows, |r| r.backend.as_deref() == Some("vllm-0.24.0/custom_ar_graph"))[0];
    assert_eq!((graph.kernel.op, graph.kernel.bytes, graph.kernel.num_gpus), (Op::AllReduce, 8192, 4));
    assert!(approx(graph.latency_us.unwrap(), 4.0));
    assert_eq!(find(&out.rows, |r| r.backend.as_deref() == Some("vllm-0.24.0/custom_ar_eager")).len(), 1);
}

#[test]
fn moe_distribution_folds_into_backend() {
    let dir = tempfile::tempdir().unwrap();
    let n = 3;
    let p = write_parquet(
        dir.path(),
        "h200_sxm/moe/vllm/0.24.0/moe_perf.parquet",
        &[
            Col::S("moe_dtype", vec!["bfloat16", "fp8", "w4a16_mxfp4"]),
            Col::I("num_tokens", vec![128; n]),
            Col::I("hidden_size", vec![4096; n]),
            Col::I("inter_size", vec![14336; n]),
            Col::I("topk", vec![2; n]),
            Col::I("num_experts", vec![8; n]),
            Col::I("moe_tp_size", vec![2; n]),
            Col::I("moe_ep_size", vec![1; n]),
            Col::S("distribution", vec!["balanced", "power_law_1.2", "balanced"]),
            Col::F("latency", vec![0.3, 0.2, 0.1]),
        ],
    );
    let out = aiconfigurator::import_file(&p).unwrap();
    assert_eq!(out.rows.len(), 3);
    let bal = find(&out.rows, |r| r.kernel.dtype == Dtype::Bf16)[0];
    assert_eq!(bal.backend.as_deref(), Some("vllm-0.24.0"));
    let k = &bal.kernel;
    assert_eq!((k.num_tokens, k.hidden, k.inter, k.topk, k.num_experts, k.tp, k.ep), (128, 4096, 14336, 2, 8, 2, 1));
    let pl = find(&out.rows, |r| r.kernel.dtype == Dtype::Fp8)[0];
    assert_eq!(pl.backend.as_deref(), Some("vllm-0.24.0/power_law_1.2"));
    // The H200 has no fp4 tensor cores: MXFP4 weights with bf16 activations are its fp4.
    let w4 = find(&out.rows, |r| r.kernel.dtype == Dtype::Fp4)[0];
    assert_eq!(w4.backend.as_deref(), Some("vllm-0.24.0/w4a16_mxfp4"));
    assert!(out.skipped.is_empty(), "{:?}", out.skipped);
    // On B200 fp4 means fp4 math, which weight-only rows are not: skipped and counted.
    let p = write_parquet(
        dir.path(),
        "b200_sxm/moe/vllm/0.24.0/moe_perf.parquet",
        &[
            Col::S("moe_dtype", vec!["w4a16_mxfp4"]),
            Col::I("num_tokens", vec![128]),
            Col::I("hidden_size", vec![4096]),
            Col::I("inter_size", vec![14336]),
            Col::I("topk", vec![2]),
            Col::I("num_experts", vec![8]),
            Col::I("moe_tp_size", vec![2]),
            Col::I("moe_ep_size", vec![1]),
            Col::S("distribution", vec!["balanced"]),
            Col::F("latency", vec![0.1]),
        ],
    );
    let out = aiconfigurator::import_file(&p).unwrap();
    assert!(out.rows.is_empty());
    assert_eq!(out.skipped.get("moe_perf: moe_dtype w4a16_mxfp4"), Some(&1));
}

#[test]
fn mla_latent_convention() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "h200_sxm/mla/vllm/0.14.0/generation_mla_perf.parquet",
        &[
            Col::S("mla_dtype", vec!["bfloat16"]),
            Col::S("kv_cache_dtype", vec!["fp8"]),
            Col::I("num_heads", vec![16]),
            Col::I("batch_size", vec![32]),
            Col::I("isl", vec![1]),
            Col::I("tp_size", vec![8]),
            Col::I("step", vec![1023]),
            Col::F("latency", vec![0.05]),
        ],
    );
    let r = &aiconfigurator::import_file(&p).unwrap().rows[0];
    let k = &r.kernel;
    assert_eq!(k.op, Op::MlaDecode);
    assert_eq!((k.batch, k.kv_len, k.num_heads, k.num_kv_heads, k.head_dim), (32, 1024, 16, 1, 576));
    assert_eq!(k.kv_dtype, Some(Dtype::Fp8));
}

#[test]
fn errors_name_file_column_and_row() {
    let dir = tempfile::tempdir().unwrap();
    // Missing column.
    let p = write_parquet(
        dir.path(),
        "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
        &[Col::S("gemm_dtype", vec!["bfloat16"]), Col::I("n", vec![1]), Col::I("k", vec![1]), Col::F("latency", vec![1.0])],
    );
    let msg = format!("{:#}", aiconfigurator::import_file(&p).unwrap_err());
    assert!(msg.contains("gemm_perf.parquet") && msg.contains("missing column 'm'"), "{msg}");
    // Unknown column.
    let p = write_parquet(
        dir.path(),
        "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
        &[
            Col::S("gemm_dtype", vec!["bfloat16"]),
            Col::I("m", vec![1]),
            Col::I("n", vec![1]),
            Col::I("k", vec![1]),
            Col::I("splitk", vec![2]),
            Col::F("latency", vec![1.0]),
        ],
    );
    let msg = format!("{:#}", aiconfigurator::import_file(&p).unwrap_err());
    assert!(msg.contains("unknown column 'splitk'"), "{msg}");
    // Unknown dtype names the row.
    let p = write_parquet(
        dir.path(),
        "l40s/gemm/vllm/0.24.0/gemm_perf.parquet",
        &[
            Col::S("gemm_dtype", vec!["bfloat16", "int2"]),
            Col::I("m", vec![1, 1]),
            Col::I("n", vec![1, 1]),
            Col::I("k", vec![1, 1]),
            Col::F("latency", vec![1.0, 1.0]),
        ],
    );
    let msg = format!("{:#}", aiconfigurator::import_file(&p).unwrap_err());
    assert!(msg.contains("row 2") && msg.contains("'gemm_dtype' = 'int2'"), "{msg}");
    // Unknown GPU folder.
    let p = write_parquet(dir.path(), "v100/gemm/vllm/0.24.0/gemm_perf.parquet", &[Col::I("m", vec![1])]);
    let msg = format!("{:#}", aiconfigurator::import_file(&p).unwrap_err());
    assert!(msg.contains("unknown GPU id 'v100'") && msg.contains("h200_sxm"), "{msg}");
    // Non-positive latency.
    let p = write_parquet(
        dir.path(),
        "b200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
        &[
            Col::S("gemm_dtype", vec!["bfloat16"]),
            Col::I("m", vec![1]),
            Col::I("n", vec![1]),
            Col::I("k", vec![1]),
            Col::F("latency", vec![0.0]),
        ],
    );
    let msg = format!("{:#}", aiconfigurator::import_file(&p).unwrap_err());
    assert!(msg.contains("'latency'") && msg.contains("positive"), "{msg}");
}

#[test]
fn import_dir_writes_gzip_that_load_public_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    gemm_table(dir.path());
    let imported = aiconfigurator::import_dir(dir.path()).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("aic.csv.gz");
    ingest::write_rows_file(&out, &imported.rows).unwrap();
    let back = ingest::load_public_from(out_dir.path()).unwrap();
    assert_eq!(back.len(), imported.rows.len());
    for (a, b) in back.iter().zip(&imported.rows) {
        assert_eq!((&a.kernel, &a.gpu, &a.backend, &a.extra), (&b.kernel, &b.gpu, &b.backend, &b.extra));
        // The CSV keeps 4 decimals of a microsecond.
        assert!((a.latency_us.unwrap() - b.latency_us.unwrap()).abs() < 1e-4);
    }
    let summary = ingest::summary(&back);
    assert_eq!(summary.get(&("h200_sxm".to_string(), "gemm".to_string())), Some(&4));
}
