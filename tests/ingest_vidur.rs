//! Vidur importer on synthetic CSVs laid out like upstream `data/profiling/`. GEMM shapes are
//! hand-derived from the model columns (Llama-2-7B: 32 heads of 128, FFN 11008, TP 2).

use kernelsight::ingest::vidur;
use kernelsight::schema::{Dtype, KernelRow, Op};
use std::path::{Path, PathBuf};

fn write(root: &Path, rel: &str, text: &str) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

/// One mlp.csv row; operator i has median latency `medians_ms[i]`.
fn mlp_csv(medians_ms: [f64; 10], shape: &str) -> String {
    let mut header: Vec<String> = Vec::new();
    let mut row: Vec<String> = Vec::new();
    for (op, med) in vidur::MLP_OPS.iter().zip(medians_ms) {
        for s in ["min", "max", "mean", "median", "std"] {
            header.push(format!("time_stats.{op}.{s}"));
            row.push(if s == "median" { med.to_string() } else { "0.5".to_string() });
        }
    }
    header.extend(
        ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"]
            .map(String::from),
    );
    format!("{}\n{},{}\n", header.join(","), row.join(","), shape)
}

fn one(rows: &[KernelRow], pred: impl Fn(&KernelRow) -> bool) -> &KernelRow {
    let hits: Vec<&KernelRow> = rows.iter().filter(|r| pred(r)).collect();
    assert_eq!(hits.len(), 1, "{rows:?}");
    hits[0]
}

fn close(a: Option<f64>, b: f64) -> bool {
    (a.unwrap() - b).abs() < 1e-6
}

#[test]
fn mlp_shapes_per_tp_shard_and_units() {
    let dir = tempfile::tempdir().unwrap();
    let medians = [0.001, 0.010, 0.2, 0.003, 0.05, 0.020, 0.4, 0.004, 0.3, 0.002];
    let p = write(
        dir.path(),
        "profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
        &mlp_csv(medians, "32,32,4096,11008,32000,True,128,2"),
    );
    let rows = vidur::import_file(&p).unwrap().rows;
    for r in &rows {
        assert_eq!(r.gpu.as_deref(), Some("a100_sxm"));
        assert_eq!(r.source.as_deref(), Some("vidur"));
        assert_eq!(r.kernel.dtype, Dtype::Fp16);
    }
    let g = |name: &str| one(&rows, |r| r.extra[0].1 == name);
    let qkv = g("attn_pre_proj");
    // (32 + 2*32) heads * 128 / TP 2 = 6144 outputs.
    assert_eq!((qkv.kernel.op, qkv.kernel.m, qkv.kernel.n, qkv.kernel.k), (Op::Gemm, 128, 6144, 4096));
    assert!(close(qkv.latency_us, 200.0), "0.2 ms = 200 us");
    let o = &g("attn_post_proj").kernel;
    assert_eq!((o.n, o.k), (4096, 2048));
    let up = &g("mlp_up_proj").kernel;
    assert_eq!((up.n, up.k), (11008, 4096), "gated: 2 * 11008 / 2");
    let down = &g("mlp_down_proj").kernel;
    assert_eq!((down.n, down.k), (4096, 5504));
    let act = g("mlp_act");
    assert_eq!((act.kernel.op, act.kernel.num_tokens, act.kernel.hidden), (Op::SiluMul, 128, 5504));
    let rope = &g("attn_rope").kernel;
    assert_eq!((rope.op, rope.num_heads, rope.num_kv_heads, rope.head_dim), (Op::Rope, 16, 16, 128));
    assert_eq!(g("add").kernel.op, Op::Add);
    assert_eq!(g("emb").kernel.op, Op::Embedding);
    // Both layer norms are the same rmsnorm shape: median of 10 and 20 us = 15 us.
    let norm = g("rmsnorm");
    assert_eq!((norm.kernel.op, norm.kernel.hidden), (Op::Rmsnorm, 4096));
    assert!(close(norm.latency_us, 15.0));
}

#[test]
fn non_gated_models_keep_only_gemm_add_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "profiling/compute/h100/microsoft/phi-2/mlp.csv",
        &mlp_csv([0.1; 10], "32,32,2560,10240,51200,False,64,1"),
    );
    let out = vidur::import_file(&p).unwrap();
    assert!(out.rows.iter().all(|r| matches!(r.kernel.op, Op::Gemm | Op::Add | Op::Embedding)));
    let up = one(&out.rows, |r| r.extra[0].1 == "mlp_up_proj");
    assert_eq!((up.kernel.n, up.kernel.k), (10240, 2560), "not gated: one FFN width");
    assert_eq!(out.rows[0].gpu.as_deref(), Some("h100_sxm"));
    assert_eq!(out.skipped.values().sum::<usize>(), 4, "2 norms, act, rope");
}

#[test]
fn network_bytes_workers_and_internode_backend() {
    let dir = tempfile::tempdir().unwrap();
    let text = ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,time_stats.all_reduce.median,time_stats.all_reduce.std,rank,num_workers,size,collective,devices_per_node,max_devices_per_node\n\
0,0.01,0.1,0.05,0.040,0.01,0,2,2048,all_reduce,1,8\n\
1,0.01,0.1,0.05,0.020,0.01,0,8,1048576,all_reduce,8,8\n\
2,0.01,0.1,0.05,0.030,0.01,1,8,1048576,all_reduce,8,8\n\
3,0.01,0.1,0.05,0.070,0.01,2,8,1048576,all_reduce,8,8\n";
    let p = write(dir.path(), "profiling/network/h100_dgx/all_reduce.csv", text);
    let rows = vidur::import_file(&p).unwrap().rows;
    assert_eq!(rows.len(), 2);
    let inter = one(&rows, |r| r.kernel.num_gpus == 2);
    assert_eq!(inter.backend.as_deref(), Some("vidur/h100_dgx/internode"));
    assert_eq!((inter.kernel.op, inter.kernel.bytes), (Op::AllReduce, 2048));
    let intra = one(&rows, |r| r.kernel.num_gpus == 8);
    assert_eq!(intra.backend.as_deref(), Some("vidur/h100_dgx"));
    assert!(close(intra.latency_us, 30.0), "median over ranks of 20, 30, 70 us");
    assert_eq!(intra.gpu.as_deref(), Some("h100_sxm"));

    let sr = ",time_stats.send_recv.min,time_stats.send_recv.max,time_stats.send_recv.mean,time_stats.send_recv.median,time_stats.send_recv.std,rank,num_workers,size,collective,devices_per_node,max_devices_per_node\n\
0,0.01,0.1,0.05,0.024,0.01,0,2,10240,send_recv,2,8\n";
    let p = write(dir.path(), "profiling/network/a40_pairwise_nvlink/send_recv.csv", sr);
    let r = &vidur::import_file(&p).unwrap().rows[0];
    assert_eq!((r.kernel.op, r.kernel.bytes, r.kernel.num_gpus), (Op::P2p, 10240, 2));
    assert_eq!(r.gpu.as_deref(), Some("a40"));
}

#[test]
fn errors_name_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let text = mlp_csv([0.1; 10], "32,32,4096,11008,32000,True,128,2").replace("num_tokens", "tokens");
    let p = write(dir.path(), "profiling/compute/a100/x/y/mlp.csv", &text);
    let msg = format!("{:#}", vidur::import_file(&p).unwrap_err());
    assert!(msg.contains("mlp.csv") && msg.contains("missing column 'num_tokens'"), "{msg}");

    let p = write(dir.path(), "profiling/compute/v100/x/y/mlp.csv", &mlp_csv([0.1; 10], "32,32,4096,11008,32000,True,128,2"));
    let msg = format!("{:#}", vidur::import_file(&p).unwrap_err());
    assert!(msg.contains("unknown Vidur GPU 'v100'"), "{msg}");

    // TP that does not divide the heads.
    let p = write(dir.path(), "profiling/compute/a40/x/y/mlp.csv", &mlp_csv([0.1; 10], "32,32,4096,11008,32000,True,128,3"));
    let msg = format!("{:#}", vidur::import_file(&p).unwrap_err());
    assert!(msg.contains("line 2") && msg.contains("not divisible"), "{msg}");

    // Bad number names the line and column.
    let text = mlp_csv([0.1; 10], "32,32,4096,11008,32000,True,many,2");
    let p = write(dir.path(), "profiling/compute/h100/x/z/mlp.csv", &text);
    let msg = format!("{:#}", vidur::import_file(&p).unwrap_err());
    assert!(msg.contains("line 2") && msg.contains("'num_tokens' = 'many'"), "{msg}");
}

/// Rows of the `raw` folders of `gpu` (imported as `import vidur` does) for `ops`, against a
/// committed CSV whose rows name the replica's kernel `kernel` (None: Vidur's own names).
fn assert_reproduces(gpu: &str, raw: &[PathBuf], ops: &[Op], committed: &Path, kernel: Option<&str>) {
    let imported = kernelsight::ingest::import_dirs(raw, vidur::import_dir).unwrap();
    assert!(imported.rows.iter().all(|r| r.gpu.as_deref() == Some(gpu)));
    let key = |r: &KernelRow| (format!("{:?}", r.kernel), r.latency_us.unwrap());
    let mut from_raw: Vec<(String, f64)> = imported.rows.iter().filter(|r| ops.contains(&r.kernel.op)).map(key).collect();
    let rows = kernelsight::schema::read_rows(committed).unwrap();
    let mut from_file: Vec<(String, f64)> = rows.iter().map(key).collect();
    from_raw.sort_by(|a, b| a.partial_cmp(b).unwrap());
    from_file.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(from_raw.len(), from_file.len(), "{}", committed.display());
    for (a, b) in from_raw.iter().zip(&from_file) {
        assert_eq!(a.0, b.0);
        assert!((a.1 - b.1).abs() < 1e-3, "{a:?} vs {b:?}");
    }
    assert!(rows.iter().all(|r| r.backend.as_deref() == Some("vidur") && r.source.as_deref().unwrap().starts_with("kernelsight-collect")));
    if let Some(k) = kernel {
        assert!(rows.iter().all(|r| r.extra_value("kernel") == Some(k)), "{}", committed.display());
    }
}

/// The committed H200 re-measurement of Vidur's operators (`microbench/vidur_ops.py`, two
/// device calls) imports from its raw Vidur-format files to exactly the rows calibration reads:
/// all calls' medians for the sarathi kernels and the add, the second and third calls' embedding
/// (the first timed torch 2.11's own gather, not Vidur's kernel), named `emb_replica`: on the
/// H100 the replica runs 0.80x Vidur's own `emb` kernel, so it is another library. The H100's
/// replica embedding rows likewise.
#[test]
fn committed_replica_rows_come_from_their_raw_files() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("microbench/data");
    let root = data.join("h200_sxm");
    let raw = root.join("vidur_replica");
    let four = [Op::Rmsnorm, Op::Rope, Op::SiluMul, Op::Add];
    assert_reproduces("h200_sxm", std::slice::from_ref(&raw), &four, &root.join("h200_sxm_vidur_ops.csv"), None);
    assert_reproduces("h200_sxm", &[raw.join("call2"), raw.join("call3")], &[Op::Embedding], &root.join("h200_sxm_vidur_embedding.csv"), Some("emb_replica"));
    let blind = [root.join("vidur_blind")];
    assert_reproduces("h200_sxm", &blind, &four, &root.join("h200_sxm_vidur_blind.csv"), None);
    assert_reproduces("h200_sxm", &blind, &[Op::Embedding], &root.join("h200_sxm_vidur_blind_embedding.csv"), Some("emb_replica"));
    let h100 = data.join("h100_sxm");
    assert_reproduces("h100_sxm", &[h100.join("vidur_replica")], &[Op::Embedding], &h100.join("h100_sxm_vidur_embedding.csv"), Some("emb_replica"));
}
