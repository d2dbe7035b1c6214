//! Simulator behaviour on small cases whose expected results are computed by hand from the
//! affine step model (100 us + 2 us per new token + 0.01 us per cached token).
mod sim_common;
use kernelsight::perf::SeqWork;
use kernelsight::sim::engine::{BlockGrowth, EngineParams, Policy};
use kernelsight::sim::kv::KvLayout;
use kernelsight::sim::reject::Rejection;
use kernelsight::sim::router::RouterKind;
use sim_common::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[test]
fn one_request_timeline_by_hand() {
    let cfg = config(engine(Policy::Continuous), 100);
    let (o, obs, _) = run(&cfg, vec![req(0, 0.0, 100, 3)], None);
    let r = &obs.records[0];
    // prefill 100: 100 + 200 = 300 us; decode at 100 cached: 103; at 101 cached: 103.01.
    assert!(close(r.ttft_ms, 0.300), "{}", r.ttft_ms);
    assert!(close(r.e2e_ms, 0.50601), "{}", r.e2e_ms);
    assert!(close(r.tpot_ms.unwrap(), (0.50601 - 0.300) / 2.0));
    assert_eq!(r.queue_ms, 0.0);
    assert_eq!(o.rec.completed, 1);
    assert_eq!(o.rec.steps, 3);
}

#[test]
fn chunked_prefill_splits_the_prompt_at_the_token_budget() {
    let mut e = engine(Policy::Continuous);
    e.max_num_batched_tokens = 64;
    let (_, obs, m) = run(&config(e.clone(), 100), vec![req(0, 0.0, 100, 2)], None);
    // 64 tokens (228 us), then 36 on top of 64 cached (100 + 72 + 0.64).
    assert!(close(obs.records[0].ttft_ms, (228.0 + 172.64) / 1e3), "{}", obs.records[0].ttft_ms);
    assert_eq!(m.batches.lock().unwrap()[0], vec![SeqWork { new_tokens: 64, cached_tokens: 0 }]);
    // Without chunking the request can never fit one step: rejected, not hung.
    e.chunked_prefill = false;
    let (o, obs, _) = run(&config(e, 100), vec![req(0, 0.0, 100, 2), req(1, 0.0, 30, 2)], None);
    assert_eq!(obs.records.iter().filter(|r| r.rejected == Some(Rejection::ExceedsBatchTokens)).count(), 1);
    assert_eq!(o.rec.completed, 1);
}

#[test]
fn shared_prefix_is_served_from_cache_in_full_blocks() {
    let mut a = req(0, 0.0, 80, 2);
    let mut b = req(1, 1.0, 80, 2);
    for r in [&mut a, &mut b] {
        r.prefix_group = Some(7);
        r.prefix_tokens = 64;
    }
    let (o, obs, _) = run(&config(engine(Policy::Continuous), 100), vec![a.clone(), b.clone()], None);
    let second = obs.records.iter().find(|r| r.id == 1).unwrap();
    assert_eq!(second.cached_tokens, 64);
    // 16 new tokens on 64 cached: 100 + 32 + 0.64.
    assert!(close(second.ttft_ms, 0.13264), "{}", second.ttft_ms);
    assert!((o.rec.prefix_hit_tokens as f64 / o.rec.prefix_query_tokens as f64 - 64.0 / 160.0).abs() < 1e-12);
    // Caching off: no hits.
    let mut e = engine(Policy::Continuous);
    e.prefix_caching = false;
    let (_, obs, _) = run(&config(e, 100), vec![a, b], None);
    assert!(obs.records.iter().all(|r| r.cached_tokens == 0));
}

#[test]
fn a_whole_prompt_in_cache_still_recomputes_its_last_block() {
    // Multi-turn style: the whole 64-token prompt is the group's stream.
    let mut a = req(0, 0.0, 64, 2);
    let mut b = req(1, 1.0, 64, 2);
    for r in [&mut a, &mut b] {
        r.prefix_group = Some(1);
        r.prefix_tokens = 66;
    }
    let (_, obs, _) = run(&config(engine(Policy::Continuous), 100), vec![a, b], None);
    // At most (64 - 1) / 16 = 3 full blocks may hit.
    assert_eq!(obs.records[1].cached_tokens, 48);
}

#[test]
fn running_out_of_blocks_preempts_the_newest_and_everyone_still_finishes() {
    let mut e = engine(Policy::Continuous);
    e.prefix_caching = false;
    // 10 blocks of 16 tokens; each request needs 8 blocks by its end.
    let reqs = vec![req(0, 0.0, 60, 60), req(1, 0.0, 60, 60)];
    let (o, obs, _) = run(&config(e, 10), reqs, None);
    assert!(o.rec.preemptions >= 1);
    assert_eq!(o.rec.completed, 2);
    let first = obs.records.iter().find(|r| r.id == 0).unwrap();
    let second = obs.records.iter().find(|r| r.id == 1).unwrap();
    assert_eq!(first.preemptions, 0, "the oldest request is never the victim");
    assert!(second.preemptions >= 1);
    assert_eq!(o.rec.series.buckets.iter().map(|b| b.output_tokens).sum::<u64>(), 120);
}

#[test]
fn impossible_requests_are_rejected_with_reasons() {
    let mut cfg = config(engine(Policy::Continuous), 10);
    cfg.max_model_len = 1000;
    let reqs = vec![req(0, 0.0, 900, 200), req(1, 0.0, 150, 20), req(2, 0.0, 20, 5)];
    let (o, obs, _) = run(&cfg, reqs, None);
    assert_eq!(o.rec.rejected.get(&Rejection::ExceedsContext), Some(&1));
    assert_eq!(o.rec.rejected.get(&Rejection::ExceedsKvCache), Some(&1));
    assert_eq!(o.rec.completed, 1);
    assert_eq!(obs.records.len(), 3);
}

#[test]
fn vllm_batches_respect_budget_and_sequence_limit_and_mix_prefill_with_decode() {
    let mut e = engine(Policy::Continuous);
    e.max_num_batched_tokens = 50;
    e.max_num_seqs = 3;
    let reqs: Vec<_> = (0..8).map(|i| req(i, i as f64 * 1e-4, 30 + i as u32, 6)).collect();
    let (o, _, m) = run(&config(e, 1000), reqs, None);
    assert_eq!(o.rec.completed, 8);
    let batches = m.batches.lock().unwrap();
    assert!(batches.iter().all(|b| b.len() <= 3 && b.iter().map(|s| s.new_tokens).sum::<u32>() <= 50));
    assert!(batches.iter().any(|b| b.iter().any(|s| s.new_tokens > 1) && b.iter().any(|s| s.new_tokens == 1 && s.cached_tokens > 0)));
}

#[test]
fn sglang_never_mixes_prefill_and_decode() {
    let reqs: Vec<_> = (0..20).map(|i| req(i, i as f64 * 2e-4, 40, 8)).collect();
    let (o, _, m) = run(&config(engine(Policy::PrefillFirst), 10_000), reqs, None);
    assert_eq!(o.rec.completed, 20);
    for b in m.batches.lock().unwrap().iter() {
        let prefill = b.iter().any(|s| s.new_tokens > 1);
        let decode = b.iter().any(|s| s.new_tokens == 1);
        assert!(!(prefill && decode), "mixed batch {b:?}");
    }
}

#[test]
fn static_batches_run_to_the_longest_with_padding() {
    let mut e = engine(Policy::Static);
    e.max_num_seqs = 2;
    let reqs = vec![req(0, 0.0, 10, 2), req(1, 0.0, 10, 5), req(2, 0.0, 10, 3), req(3, 0.0, 10, 3), req(4, 0.0, 10, 1)];
    let (o, obs, m) = run(&config(e, 1000), reqs, None);
    assert_eq!(o.rec.completed, 5);
    let sizes: Vec<(usize, u32)> = m.batches.lock().unwrap().iter().map(|b| (b.len(), b[0].new_tokens)).collect();
    // Batch [0,1]: prefill + 4 decodes (request 0 pads after its 2nd token); [2,3]: prefill + 2; [4]: prefill.
    assert_eq!(sizes, vec![(2, 10), (2, 1), (2, 1), (2, 1), (2, 1), (2, 10), (2, 1), (2, 1), (1, 10)]);
    // Request 2 waited for the whole first batch.
    let first_batch_end = obs.records.iter().find(|r| r.id == 1).unwrap().finish_s;
    let r2 = obs.records.iter().find(|r| r.id == 2).unwrap();
    assert!((r2.queue_ms / 1e3 - first_batch_end).abs() < 1e-12);
}

#[test]
fn closed_loop_never_exceeds_its_clients() {
    let reqs: Vec<_> = (0..40).map(|i| req(i, 0.0, 20 + (i as u32 % 7) * 5, 3 + i as u32 % 5)).collect();
    let (o, obs, _) = run(&config(engine(Policy::Continuous), 1000), reqs, Some(3));
    assert_eq!(o.rec.completed, 40);
    let mut ev: Vec<(f64, i32)> = obs.records.iter().flat_map(|r| [(r.arrival_s, 1), (r.finish_s, -1)]).collect();
    ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut live = 0;
    for (_, d) in ev {
        live += d;
        assert!(live <= 3);
    }
}

#[test]
fn round_robin_alternates_replicas() {
    let mut cfg = config(engine(Policy::Continuous), 1000);
    cfg.dp = 2;
    cfg.router = RouterKind::RoundRobin;
    let reqs: Vec<_> = (0..10).map(|i| req(i, i as f64 * 0.01, 20, 3)).collect();
    let (_, obs, _) = run(&cfg, reqs, None);
    assert!(obs.records.iter().all(|r| r.replica as u64 == r.id % 2));
}

#[test]
fn prefix_aware_routing_keeps_a_group_on_one_replica() {
    let mut cfg = config(engine(Policy::Continuous), 1000);
    cfg.dp = 3;
    cfg.router = RouterKind::PrefixAware;
    let reqs: Vec<_> = (0..30)
        .map(|i| {
            let mut r = req(i, i as f64 * 0.001, 100, 3);
            r.prefix_group = Some(i % 2);
            r.prefix_tokens = 64;
            r
        })
        .collect();
    let (o, obs, _) = run(&cfg, reqs, None);
    for g in 0..2 {
        let reps: std::collections::BTreeSet<_> = obs.records.iter().filter(|r| r.id % 2 == g).map(|r| r.replica).collect();
        assert_eq!(reps.len(), 1);
    }
    // 28 of 30 requests find the 64-token prefix cached.
    assert_eq!(o.rec.prefix_hit_tokens, 28 * 64);
}

#[test]
fn pipeline_stages_overlap_micro_batches() {
    // A 4-token budget splits the 16 running requests over several micro-batches (a request is
    // in at most one batch in flight, as in vLLM v1).
    let reqs: Vec<_> = (0..16).map(|i| req(i, 0.0, 4, 20)).collect();
    let mut e = engine(Policy::Continuous);
    e.max_num_batched_tokens = 4;
    let mut cfg = config(e, 1000);
    let (one, _, _) = run(&cfg, reqs.clone(), None);
    cfg.pp = 2;
    let (two, obs, _) = run(&cfg, reqs, None);
    assert_eq!(two.rec.completed, 16);
    // With the same whole-pipeline step time, two micro-batches in flight nearly halve the run.
    let ratio = two.end_us / one.end_us;
    assert!(ratio < 0.65, "pp=2 / pp=1 duration {ratio}");
    assert!(obs.step_starts_us.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn goodput_counts_requests_meeting_slos() {
    let mut cfg = config(engine(Policy::Continuous), 1000);
    // Each request: TTFT = 100 + 2*100 = 300 us alone; the SLO splits queued from unqueued ones.
    cfg.slo_ttft_ms = Some(0.35);
    let reqs = vec![req(0, 0.0, 100, 1), req(1, 1.0, 100, 1), req(2, 1.0, 100, 1)];
    let (o, obs, _) = run(&cfg, reqs, None);
    let within = obs.records.iter().filter(|r| r.ttft_ms <= 0.35).count() as u64;
    assert_eq!(o.rec.good, within);
    assert_eq!(within, 1, "requests 1 and 2 share one 500 us prefill step");
}

#[test]
fn sglang_prefix_hits_are_token_granular_vllm_block_granular() {
    let mk = || {
        let mut a = req(0, 0.0, 100, 2);
        let mut b = req(1, 1.0, 100, 2);
        for r in [&mut a, &mut b] {
            r.prefix_group = Some(3);
            r.prefix_tokens = 70;
        }
        vec![a, b]
    };
    // 70 shared tokens: vLLM hits the 4 full 16-token blocks (64), SGLang's 1-token pages all 70.
    let (_, obs, _) = run(&config(engine(Policy::Continuous), 100), mk(), None);
    assert_eq!(obs.records[1].cached_tokens, 64);
    let (_, obs, _) = run(&config(engine(Policy::PrefillFirst), 1000), mk(), None);
    assert_eq!(obs.records[1].cached_tokens, 70);
}

#[test]
fn a_preempted_request_finds_its_own_blocks_still_cached() {
    // 12 blocks: both requests hold 6 when request 0 needs a 7th; request 1 is preempted, its
    // last blocks are evicted first and its first 4 full blocks (64 tokens) survive until it is
    // readmitted after request 0 ends.
    let reqs = vec![req(0, 0.0, 60, 60), req(1, 0.0, 60, 60)];
    let (o, obs, _) = run(&config(engine(Policy::Continuous), 12), reqs, None);
    assert_eq!(o.rec.completed, 2);
    assert!(obs.records.iter().find(|r| r.id == 1).unwrap().preemptions >= 1);
    assert!(o.rec.prefix_hit_tokens >= 64, "hits {}", o.rec.prefix_hit_tokens);
}

#[test]
fn static_batches_with_pipelining_never_run_padding_alone() {
    let mut e = engine(Policy::Static);
    e.max_num_seqs = 2;
    let mut cfg = config(e, 1000);
    cfg.pp = 2;
    let reqs = vec![req(0, 0.0, 10, 2), req(1, 0.0, 10, 6), req(2, 0.0, 10, 3)];
    let (o, _, m) = run(&cfg, reqs, None);
    assert_eq!(o.rec.completed, 3);
    // Batch [0, 1]: prefill + 5 decodes of 2 sequences (one padded); batch [2]: prefill + 2.
    let sizes: Vec<usize> = m.batches.lock().unwrap().iter().map(|b| b.len()).collect();
    assert_eq!(sizes, vec![2, 2, 2, 2, 2, 2, 1, 1, 1]);
}

/// Found by `sim_props`: with two pipeline stages the oldest request, needing blocks that a
/// later request held while its step was in flight, preempted itself; the two then did so to
/// each other forever (no progress). It now waits for the in-flight step to land and preempts
/// the later request instead, so every request finishes.
#[test]
fn pipelined_requests_sharing_a_tight_cache_make_progress() {
    let mut e = engine(Policy::Continuous);
    e.block_size = 16;
    e.max_num_batched_tokens = 11;
    e.max_num_seqs = 2;
    e.chunked_prefill = true;
    e.prefix_caching = false;
    let mut cfg = config(e, 9);
    cfg.max_model_len = 140;
    cfg.dp = 2;
    cfg.pp = 2;
    let lens = [(96, 34), (1, 9), (56, 3), (46, 5), (92, 22), (1, 1)];
    let reqs: Vec<_> = lens.iter().enumerate().map(|(i, &(p, o))| req(i as u64, 0.0, p, o)).collect();
    let (o, obs, _) = run(&cfg, reqs, None);
    assert_eq!(o.rec.completed, 6);
    assert!(obs.records.iter().all(|r| r.rejected.is_none()));
}

#[test]
fn a_client_turnaround_makes_a_busy_engines_next_request_wait_a_step() {
    // Two clients with different answer lengths, so one is always decoding when the other's
    // next request comes. Sent the instant an answer ends, it joins the very next step; sent
    // a microsecond later, that step has started and it waits for the one after.
    let reqs: Vec<_> = (0..12).map(|i| req(i, 0.0, 20, if i % 2 == 0 { 4 } else { 7 })).collect();
    let cfg = config(engine(Policy::Continuous), 1000);
    let model = Affine::default();
    let ttft_ms = |turnaround_us: f64| {
        let mut obs = Collect::default();
        let closed = kernelsight::sim::ClosedLoop { clients: 2, turnaround_us };
        kernelsight::sim::run(&cfg, &model, &mut VecSource(reqs.clone().into_iter()), Some(closed), &mut obs).unwrap();
        let later: Vec<f64> = obs.records.iter().filter(|r| r.id >= 2).map(|r| r.ttft_ms).collect();
        (later.iter().sum::<f64>() / later.len() as f64, obs.records.iter().map(|r| r.arrival_s).fold(0.0, f64::max))
    };
    let (now, _) = ttft_ms(0.0);
    let (later, last_arrival_s) = ttft_ms(1.0);
    // Affine steps: a decode of one sequence takes ~102 us, so waiting out one adds about that.
    assert!(later > now + 0.05, "{later} vs {now} ms");
    assert!(last_arrival_s > 0.0);
    let bad = kernelsight::sim::ClosedLoop { clients: 2, turnaround_us: -1.0 };
    let Err(e) = kernelsight::sim::run(&cfg, &model, &mut VecSource(reqs.into_iter()), Some(bad), &mut Collect::default()) else {
        panic!("a negative turnaround must be rejected");
    };
    assert!(e.to_string().contains("turnaround"), "{e}");
}

/// transformers' engine (`Policy::DecodeFirst`) evicts the request that could not grow and
/// sends it to the back of the queue, holding admissions until a request finishes; vLLM's
/// (`Continuous`) preempts the newest running request and readmits it first. 4 blocks of 256
/// tokens: requests 0 and 1 (300 + 300 tokens) fill them, both need a third block at 512
/// tokens, request 1 is the victim either way; request 2 (300 + 50) arrived meanwhile.
#[test]
fn transformers_evicts_to_the_back_of_the_queue_and_vllm_readmits_first() {
    let reqs = || vec![req(0, 0.0, 300, 300), req(1, 0.0, 300, 300), req(2, 0.0001, 300, 50)];
    let finish = |obs: &Collect, id: u64| obs.records.iter().find(|r| r.id == id).unwrap().finish_s;
    let hf = engine(Policy::DecodeFirst);
    assert_eq!(hf.block_size, 256);
    let (o, obs, _) = run(&config(hf.clone(), 4), reqs(), None);
    assert_eq!(o.rec.completed, 3);
    assert_eq!(o.rec.preemptions, 1);
    assert_eq!(obs.records.iter().find(|r| r.id == 1).unwrap().preemptions, 1);
    assert!(finish(&obs, 2) < finish(&obs, 1), "evicted request 1 rejoins behind request 2");
    let vllm_like = EngineParams {
        policy: Policy::Continuous,
        admission_free_fraction: 0.0,
        block_growth: BlockGrowth::Exact,
        ..hf
    };
    let (o, obs, _) = run(&config(vllm_like, 4), reqs(), None);
    assert_eq!(o.rec.completed, 3);
    assert_eq!(obs.records.iter().find(|r| r.id == 1).unwrap().preemptions, 1);
    assert!(finish(&obs, 1) < finish(&obs, 2), "preempted request 1 is readmitted first");
}

/// transformers' scheduler admits no prefill into a non-empty batch while fewer than 15 % of
/// the blocks are free: of 25 one-block requests on 20 blocks the first step takes 18 (free
/// 20 - 17 = 3 is not below 3; free 2 is), without the margin 20.
#[test]
fn the_admission_margin_keeps_free_blocks_back() {
    let reqs: Vec<_> = (0..25).map(|i| req(i, 0.0, 10, 2)).collect();
    let hf = engine(Policy::DecodeFirst);
    let (_, _, m) = run(&config(hf.clone(), 20), reqs.clone(), None);
    assert_eq!(m.batches.lock().unwrap()[0].len(), 18);
    let (_, _, m) = run(&config(EngineParams { admission_free_fraction: 0.0, ..hf }, 20), reqs, None);
    assert_eq!(m.batches.lock().unwrap()[0].len(), 20);
}

#[test]
fn transformers_block_growth_takes_one_block_more_near_block_multiples() {
    let g = BlockGrowth::HfPlusOne;
    assert_eq!(g.blocks_to_add(0, 0, 512, 256), 3);
    assert_eq!(g.blocks_to_add(0, 0, 511, 256), 3);
    assert_eq!(g.blocks_to_add(0, 0, 500, 256), 2);
    assert_eq!(g.blocks_to_add(3, 512, 1, 256), 0, "free slots left: nothing to add");
    assert_eq!(g.blocks_to_add(2, 512, 1, 256), 1, "a full table takes one block for a decode token");
    assert_eq!(BlockGrowth::Exact.blocks_to_add(0, 0, 512, 256), 2);
    assert_eq!(BlockGrowth::Exact.blocks_to_add(2, 500, 20, 256), 1);
}

/// Sliding-window hybrids (vLLM's hybrid allocator, transformers' paged cache): every KV group
/// draws pages from one pool, a sliding group at most its window's worth per request. Two
/// 2,000-token requests (8 blocks of 256) on 60 pages: with 1 full and 5 sliding groups capped
/// at 4 blocks each takes 8 + 20 = 28 pages and both run at once; were all 6 groups full, each
/// would take 48 and the second would wait for the first.
#[test]
fn sliding_window_groups_hold_only_their_window() {
    let reqs = || vec![req(0, 0.0, 1800, 200), req(1, 0.0, 1800, 200)];
    let mut cfg = config(engine(Policy::DecodeFirst), 60);
    cfg.kv_layout = KvLayout { full_groups: 1, sliding_groups: 5, sliding_cap_blocks: 4 };
    let (o, obs, _) = run(&cfg, reqs(), None);
    assert_eq!(o.rec.completed, 2);
    assert!(obs.records.iter().all(|r| r.queue_ms == 0.0), "both admitted at once");
    cfg.kv_layout = KvLayout { full_groups: 6, sliding_groups: 0, sliding_cap_blocks: 0 };
    let (_, obs, _) = run(&cfg, reqs(), None);
    assert!(obs.records.iter().any(|r| r.queue_ms > 0.0), "one waits for the other's pages");
}

#[test]
fn kv_layouts_follow_the_models_layer_types() {
    use kernelsight::model::ModelConfig;
    // gemma-3-27b: 52 sliding (window 1024) and 10 full layers, groups of gcd = 2 layers.
    let gemma = KvLayout::of(&ModelConfig::load("gemma-3-27b-it").unwrap(), 256);
    assert_eq!(gemma, KvLayout { full_groups: 5, sliding_groups: 26, sliding_cap_blocks: 4 });
    assert_eq!(gemma.pages(8), 5 * 8 + 26 * 4);
    // gpt-oss-20b: alternating full and 128-token sliding layers.
    let oss = KvLayout::of(&ModelConfig::load("gpt-oss-20b").unwrap(), 16);
    assert_eq!(oss, KvLayout { full_groups: 1, sliding_groups: 1, sliding_cap_blocks: 8 });
    assert_eq!(KvLayout::of(&ModelConfig::load("llama-3.1-8b").unwrap(), 16), KvLayout::default());
}

/// The affine model, plus 1 ms for a step that starts on an idle engine.
struct IdleCostsMore(sim_common::Affine);
impl kernelsight::perf::StepTimeModel for IdleCostsMore {
    fn step_time(&self, seqs: &[SeqWork]) -> kernelsight::perf::StepCost {
        self.0.step_time(seqs)
    }
    fn step_time_from_idle(&self, seqs: &[SeqWork]) -> kernelsight::perf::StepCost {
        let mut c = self.0.step_time(seqs);
        c.add_class("host", 1000.0);
        c
    }
    fn describe(&self) -> String {
        "affine + 1 ms from idle".into()
    }
}

#[test]
fn only_a_step_that_starts_on_an_idle_engine_is_timed_as_from_idle() {
    let cfg = config(engine(Policy::Continuous), 100);
    let model = IdleCostsMore(Default::default());
    let mut obs = Collect::default();
    // Request 0 alone; request 1 arrives during request 0's decode; request 2 after both ended.
    let reqs = vec![req(0, 0.0, 100, 3), req(1, 0.0005, 100, 3), req(2, 1.0, 100, 3)];
    kernelsight::sim::run(&cfg, &model, &mut VecSource(reqs.into_iter()), None, &mut obs).unwrap();
    let ttft = |id: u64| obs.records.iter().find(|r| r.id == id).unwrap().ttft_ms;
    // Idle engine: prefill 300 us + 1 ms.
    assert!(close(ttft(0), 1.300), "{}", ttft(0));
    assert!(close(ttft(2), 1.300), "{}", ttft(2));
    // Joins a running engine: waits for request 0's first step (to 1.3 ms), then shares a step
    // with its decode and pays no idle cost: 100 + (2 + 1) + 200 us, ending at 1.603 ms.
    assert!(close(ttft(1), 1.103), "{}", ttft(1));
}

#[test]
fn async_scheduling_admits_an_arrival_one_step_late() {
    // Request 1 arrives at 100 us, while request 0's prefill runs (0-300 us).
    let reqs = || vec![req(0, 0.0, 100, 3), req(1, 0.0001, 100, 3)];
    let ttft1 = |e: EngineParams| {
        let (_, obs, _) = run(&config(e, 100), reqs(), None);
        obs.records.iter().find(|r| r.id == 1).unwrap().ttft_ms
    };
    let sync = engine(Policy::Continuous);
    assert!(!sync.async_scheduling);
    // Synchronous: joins the next step, request 0's decode + its prefill (100 + 3 + 200 us),
    // ending at 603 us.
    assert!(close(ttft1(sync.clone()), 0.503), "{}", ttft1(sync.clone()));
    // Async: the step after the prefill was formed when the prefill started, before the
    // arrival, so it decodes request 0 alone (103 us); the prefill joins the step after that
    // (100 + 3.01 + 200 us), ending at 706.01 us.
    let asynchronous = EngineParams { async_scheduling: true, ..sync };
    assert!(close(ttft1(asynchronous.clone()), 0.60601), "{}", ttft1(asynchronous));
}

/// An async-scheduling engine's step as `Predictor` times it, by hand: GPU 10 us + 2 us per new
/// token; the host launches a step with prompt tokens in 1 ms, a decode step in 100 us. A step
/// lasts max(GPU, launch), or their sum on an idle engine; a request costs `path_us` between the
/// client and the engine.
struct LaunchAhead {
    path_us: f64,
    wake_us: f64,
}
impl LaunchAhead {
    fn cost(seqs: &[SeqWork], from_idle: bool) -> kernelsight::perf::StepCost {
        let gpu = 10.0 + seqs.iter().map(|s| 2.0 * s.new_tokens as f64).sum::<f64>();
        let launch = if seqs.iter().any(|s| s.new_tokens > 1) { 1000.0 } else { 100.0 };
        let mut c = kernelsight::perf::StepCost::default();
        c.add_class("gemm", gpu);
        c.add_class("host", if from_idle { launch } else { (launch - gpu).max(0.0) });
        c.launch_us = launch;
        c
    }
}
impl kernelsight::perf::StepTimeModel for LaunchAhead {
    fn step_time(&self, seqs: &[SeqWork]) -> kernelsight::perf::StepCost {
        Self::cost(seqs, false)
    }
    fn step_time_from_idle(&self, seqs: &[SeqWork]) -> kernelsight::perf::StepCost {
        Self::cost(seqs, true)
    }
    fn describe(&self) -> String {
        "launch-ahead test model".into()
    }
    fn request_path_us(&self) -> f64 {
        self.path_us
    }
    fn idle_wake_us(&self) -> f64 {
        self.wake_us
    }
}

#[test]
fn after_idle_the_first_steps_tokens_wait_for_the_next_steps_launch() {
    let asynchronous = EngineParams { async_scheduling: true, ..engine(Policy::Continuous) };
    // Request 1 arrives at 500 us, while the host launches request 0's prefill (0-1000 us).
    let reqs = vec![req(0, 0.0, 100, 3), req(1, 0.0005, 100, 3)];
    let mut obs = Collect::default();
    let model = LaunchAhead { path_us: 0.0, wake_us: 0.0 };
    kernelsight::sim::run(&config(asynchronous, 100), &model, &mut VecSource(reqs.into_iter()), None, &mut obs).unwrap();
    let rec = |id: u64| obs.records.iter().find(|r| r.id == id).unwrap().clone();
    // Step 1 from idle: launch 1000 + GPU 210, done at 1210 us. The host formed step 2 when it
    // had launched step 1 (1000 us), so request 1 is in it: request 0's decode + request 1's
    // prefill, launched 1000-2000 us, GPU 212 us, done at 1210 + max(212, 1000) = 2210 us.
    assert!(close(rec(1).ttft_ms, 2.210 - 0.5), "{}", rec(1).ttft_ms);
    // Request 0's first token was handed out only after step 2's launch: at 2000 us, not 1210.
    assert!(close(rec(0).ttft_ms, 2.0), "{}", rec(0).ttft_ms);
    assert_eq!(obs.step_starts_us[..2], [0.0, 1210.0]);

    // Synchronously the same arrival joins step 2 as well, and step 1's tokens leave at its end.
    let mut obs = Collect::default();
    let reqs = vec![req(0, 0.0, 100, 3), req(1, 0.0005, 100, 3)];
    kernelsight::sim::run(&config(engine(Policy::Continuous), 100), &model, &mut VecSource(reqs.into_iter()), None, &mut obs).unwrap();
    let ttft0 = obs.records.iter().find(|r| r.id == 0).unwrap().ttft_ms;
    assert!(close(ttft0, 1.210), "{ttft0}");
}

#[test]
fn every_steps_tokens_wait_for_the_next_steps_launch_under_async_scheduling() {
    // Three prompts at once, one prefill per step (budget 103 tokens, no chunking): the host
    // launches the next prompt step (1 ms) before it hands out the tokens of the step before.
    let mut e = EngineParams { async_scheduling: true, chunked_prefill: false, ..engine(Policy::Continuous) };
    e.max_num_batched_tokens = 103;
    let reqs = vec![req(0, 0.0, 100, 3), req(1, 0.0, 100, 3), req(2, 0.0, 100, 3)];
    let mut obs = Collect::default();
    let model = LaunchAhead { path_us: 0.0, wake_us: 0.0 };
    kernelsight::sim::run(&config(e.clone(), 100), &model, &mut VecSource(reqs.into_iter()), None, &mut obs).unwrap();
    let rec = |id: u64| obs.records.iter().find(|r| r.id == id).unwrap().clone();
    // Step 1 from idle: prefill 0, launched 0-1000 us, done at 1210. Step 2 (prefill 1 + decode
    // 0) launched 1000-2000, done at 1210 + 1000. Step 3 (prefill 2 + two decodes) launched
    // 2000-3000 once step 1's tokens were out (2000), done at 3210; step 4 (decodes) launched
    // 3000-3100.
    assert_eq!(obs.step_starts_us[..4], [0.0, 1210.0, 2210.0, 3210.0]);
    assert!(close(rec(0).ttft_ms, 2.0), "{:?}", rec(0));
    // Request 1's token came out of the GPU at 2210 us but left after step 3's launch, at 3000:
    // a step behind a host-bound one waits for it.
    assert!(close(rec(1).ttft_ms, 3.0), "{:?}", rec(1));
    // Step 4's launch (100 us from 3000) ends before step 3's GPU work: its tokens leave at 3210.
    assert!(close(rec(2).ttft_ms, 3.21), "{:?}", rec(2));
    // Request 0 finished in step 3 (tokens at 2000, 3000, 3210 us): its record is handed out too.
    assert!(close(rec(0).e2e_ms, 3.21) && close(rec(0).tpot_ms.unwrap(), (3.21 - 2.0) / 2.0), "{:?}", rec(0));

    // A synchronous engine hands every step's tokens out as it ends.
    let mut obs = Collect::default();
    let reqs = vec![req(0, 0.0, 100, 3), req(1, 0.0, 100, 3), req(2, 0.0, 100, 3)];
    let sync = EngineParams { async_scheduling: false, ..e };
    kernelsight::sim::run(&config(sync, 100), &model, &mut VecSource(reqs.into_iter()), None, &mut obs).unwrap();
    let ttft1 = obs.records.iter().find(|r| r.id == 1).unwrap().ttft_ms;
    let second_step_end_us = obs.step_starts_us[2];
    assert!(close(ttft1, second_step_end_us / 1e3), "{ttft1} vs {second_step_end_us}");
}

#[test]
fn an_idle_engine_takes_in_what_arrives_while_it_wakes() {
    // Two prompts 300 us apart at an idle async engine.
    let asynchronous = EngineParams { async_scheduling: true, ..engine(Policy::Continuous) };
    let run_with = |wake_us: f64| {
        let reqs = vec![req(0, 0.0, 100, 3), req(1, 0.0003, 100, 3)];
        let mut obs = Collect::default();
        let model = LaunchAhead { path_us: 0.0, wake_us };
        kernelsight::sim::run(&config(asynchronous.clone(), 100), &model, &mut VecSource(reqs.into_iter()), None, &mut obs).unwrap();
        obs
    };
    // Woken 500 us after the first arrival, the engine has both: one step of two prompts
    // (launch 1000 + GPU 410 us) from 500 us.
    let woken = run_with(500.0);
    assert_eq!(woken.step_starts_us[0], 500.0);
    let ttft = |obs: &Collect, id: u64| obs.records.iter().find(|r| r.id == id).unwrap().ttft_ms;
    assert!(close(ttft(&woken, 0), 1.910) && close(ttft(&woken, 1), 1.610), "{:?}", woken.records);
    // At once, the first prompt goes alone and the second waits for the next step.
    let at_once = run_with(0.0);
    assert_eq!(at_once.step_starts_us[..2], [0.0, 1210.0]);
}

#[test]
fn the_request_path_adds_to_ttft_and_e2e_not_to_token_gaps() {
    let run_with = |path_us: f64, clients: Option<u32>| {
        let mut obs = Collect::default();
        let reqs: Vec<_> = (0..4).map(|i| req(i, 0.01 * i as f64, 100, 5)).collect();
        let closed = clients.map(kernelsight::sim::ClosedLoop::clients);
        let model = LaunchAhead { path_us, wake_us: 0.0 };
        kernelsight::sim::run(&config(EngineParams { async_scheduling: true, ..engine(Policy::Continuous) }, 1000), &model, &mut VecSource(reqs.into_iter()), closed, &mut obs).unwrap();
        obs.records.sort_by_key(|r| r.id);
        obs.records
    };
    let (bare, with_path) = (run_with(0.0, None), run_with(2500.0, None));
    for (a, b) in bare.iter().zip(&with_path) {
        assert!(close(b.ttft_ms, a.ttft_ms + 2.5) && close(b.e2e_ms, a.e2e_ms + 2.5), "{a:?} {b:?}");
        assert!(close(b.tpot_ms.unwrap(), a.tpot_ms.unwrap()));
        assert!(close(b.finish_s, a.finish_s + 0.0025));
    }
    // One closed-loop client sends again once the answer is back: 2.5 ms later per request.
    let (bare, with_path) = (run_with(0.0, Some(1)), run_with(2500.0, Some(1)));
    assert!(close(with_path[3].arrival_s - bare[3].arrival_s, 3.0 * 0.0025), "{} {}", with_path[3].arrival_s, bare[3].arrival_s);
}

#[test]
fn a_closed_loops_first_wave_goes_out_at_the_requests_own_times() {
    // A serving client sends a burst one request after another; the replay keeps their times.
    let asynchronous = EngineParams { async_scheduling: true, ..engine(Policy::Continuous) };
    let model = LaunchAhead { path_us: 0.0, wake_us: 0.0 };
    let run_with = |second_s: f64| {
        let reqs = vec![req(0, 0.0, 100, 3), req(1, second_s, 100, 3)];
        let mut obs = Collect::default();
        let closed = Some(kernelsight::sim::ClosedLoop::clients(2));
        kernelsight::sim::run(&config(asynchronous.clone(), 100), &model, &mut VecSource(reqs.into_iter()), closed, &mut obs).map(|_| obs)
    };
    let ttft = |obs: &Collect, id: u64| obs.records.iter().find(|r| r.id == id).unwrap().ttft_ms;
    // Sent together: one prefill step from idle takes both (launch 1000 + GPU 410 us).
    let together = run_with(0.0).unwrap();
    assert!(close(ttft(&together, 0), 1.410) && close(ttft(&together, 1), 1.410), "{:?}", together.records);
    // The second sent 500 us later, during the first step's launch: it joins the next step, and
    // the first step's tokens wait for that step's launch (as with open-loop arrivals).
    let staggered = run_with(0.0005).unwrap();
    let second = staggered.records.iter().find(|r| r.id == 1).unwrap();
    assert!(close(second.arrival_s, 0.0005), "{second:?}");
    assert!(close(ttft(&staggered, 1), 2.210 - 0.5) && close(ttft(&staggered, 0), 2.0), "{:?}", staggered.records);
    let err = run_with(-1.0).err().expect("a negative first-wave time is an error").to_string();
    assert!(err.contains("first-wave"), "{err}");
}
