//! Property tests: the simulator's invariants on random small workloads and engines, including
//! tight KV caches that force preemption.
mod sim_common;
use kernelsight::sim::engine::Policy;
use kernelsight::sim::kv::KvLayout;
use kernelsight::sim::reject::Rejection;
use kernelsight::sim::router::RouterKind;
use kernelsight::workload::RequestSpec;
use proptest::prelude::*;
use sim_common::*;
use std::collections::BTreeMap;

fn workload() -> impl Strategy<Value = Vec<RequestSpec>> {
    prop::collection::vec((0.0f64..0.02, 1u32..120, 1u32..40, prop::option::of(0u64..3), 0u32..80), 1..40).prop_map(|v| {
        let mut t = 0.0;
        v.into_iter()
            .enumerate()
            .map(|(i, (gap, p, o, g, shared))| {
                t += gap;
                RequestSpec {
                    id: i as u64,
                    arrival_s: t,
                    prompt_tokens: p,
                    output_tokens: o,
                    prefix_group: g,
                    prefix_tokens: if g.is_some() { shared.min(p + o) } else { 0 },
                }
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
struct Setup {
    policy: Policy,
    blocks: u32,
    block_size: u32,
    budget: u32,
    seqs: u32,
    chunked: bool,
    caching: bool,
    dp: u32,
    pp: u32,
    router: RouterKind,
    concurrency: Option<u32>,
    layout: KvLayout,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![Just(Policy::Continuous), Just(Policy::PrefillFirst), Just(Policy::Static), Just(Policy::DecodeFirst)],
        4u32..60,
        prop_oneof![Just(1u32), Just(4), Just(16)],
        8u32..300,
        1u32..10,
        any::<bool>(),
        any::<bool>(),
        1u32..4,
        1u32..3,
        prop_oneof![Just(RouterKind::RoundRobin), Just(RouterKind::LeastLoaded), Just(RouterKind::PrefixAware)],
        (prop::option::of(1u32..6), 1u32..3, 0u32..4, 1u32..5),
    )
        .prop_map(|(policy, blocks, block_size, budget, seqs, chunked, caching, dp, pp, router, (concurrency, full, sliding, cap))| Setup {
            policy,
            blocks,
            block_size,
            budget,
            seqs,
            chunked,
            caching,
            dp,
            pp,
            router,
            concurrency,
            // Sliding-window hybrids: several KV groups share the pages.
            layout: if sliding == 0 && full == 1 { KvLayout::default() } else { KvLayout { full_groups: full, sliding_groups: sliding, sliding_cap_blocks: cap } },
        })
}

fn config_of(s: &Setup) -> kernelsight::sim::SimConfig {
    let mut e = engine(s.policy);
    e.block_size = s.block_size;
    e.max_num_batched_tokens = if s.policy == Policy::Static { 1 << 20 } else { s.budget };
    e.max_num_seqs = s.seqs;
    e.chunked_prefill = s.chunked && s.policy != Policy::Static;
    e.prefix_caching = s.caching;
    let mut c = config(e, (s.blocks * 16 / s.block_size).max(1) * s.layout.groups());
    c.kv_layout = s.layout;
    c.max_model_len = 140;
    c.dp = s.dp;
    c.pp = s.pp;
    c.router = s.router;
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold(reqs in workload(), s in setup()) {
        let cfg = config_of(&s);
        let (o, obs, model) = run(&cfg, reqs.clone(), s.concurrency);

        // Every request ends exactly once: finished or rejected with a reason.
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        for r in &obs.records {
            *seen.entry(r.id).or_default() += 1;
        }
        prop_assert_eq!(seen.len(), reqs.len());
        prop_assert!(seen.values().all(|&n| n == 1));
        prop_assert_eq!(o.num_requests as usize, reqs.len());
        let finished: Vec<_> = obs.records.iter().filter(|r| r.rejected.is_none()).collect();
        prop_assert_eq!(finished.len() as u64, o.rec.completed);
        for r in &obs.records {
            let spec = &reqs[r.id as usize];
            prop_assert_eq!((r.prompt_tokens, r.output_tokens), (spec.prompt_tokens, spec.output_tokens));
            if let Some(why) = r.rejected {
                let total = spec.prompt_tokens + spec.output_tokens;
                // Under the engine's block growth (transformers' rule over-allocates a block at
                // every growth, so a request can need more blocks than its tokens fill).
                let e = &cfg.engine;
                let chunk = if e.chunked_prefill { e.max_num_batched_tokens } else { spec.prompt_tokens };
                let blocks = e.block_growth.lifetime_blocks(spec.prompt_tokens, total as u64, chunk, e.block_size);
                let fits_kv = cfg.kv_layout.pages(blocks as u32) <= cfg.num_gpu_blocks as u64;
                let fits_step = cfg.engine.chunked_prefill || total <= cfg.engine.max_num_batched_tokens;
                // The reason names the first limit broken, in the order context, KV, step budget.
                let fits_context = total <= cfg.max_model_len;
                let expected = if !fits_context {
                    Rejection::ExceedsContext
                } else if !fits_kv {
                    Rejection::ExceedsKvCache
                } else {
                    prop_assert!(!fits_step, "rejected without cause: {}", why);
                    Rejection::ExceedsBatchTokens
                };
                prop_assert_eq!(why, expected);
            } else {
                // Prefix hits never cover the whole prompt; time runs forward for each request.
                prop_assert!(r.cached_tokens < r.prompt_tokens);
                prop_assert!(r.queue_ms >= 0.0 && r.ttft_ms >= r.queue_ms && r.e2e_ms >= r.ttft_ms);
                prop_assert!((r.arrival_s + r.e2e_ms / 1e3 - r.finish_s).abs() < 1e-9);
            }
        }
        // Tokens produced one by one add up to exactly the requested outputs.
        let produced: u64 = o.rec.series.buckets.iter().map(|b| b.output_tokens).sum();
        let asked: u64 = finished.iter().map(|r| r.output_tokens as u64).sum();
        prop_assert_eq!(produced, asked);
        // Simulated time is monotone: records and steps come out in time order.
        prop_assert!(obs.records.windows(2).all(|w| w[0].finish_s <= w[1].finish_s));
        prop_assert!(obs.step_starts_us.windows(2).all(|w| w[0] <= w[1]));
        // Blocks never over-allocated (run() also fails on leaks at the end).
        prop_assert!(o.rec.kv_peak_frac <= 1.0);
        // Batches respect the engine's limits.
        for b in model.batches.lock().unwrap().iter() {
            let padded = if cfg.engine.pad_finished { usize::MAX } else { cfg.engine.max_num_seqs as usize };
            prop_assert!(b.len() <= padded);
            if matches!(s.policy, Policy::Continuous | Policy::DecodeFirst) {
                prop_assert!(b.iter().map(|w| w.new_tokens).sum::<u32>() <= cfg.engine.max_num_batched_tokens);
            }
        }
    }

    #[test]
    fn same_inputs_same_outputs(reqs in workload(), s in setup()) {
        let cfg = config_of(&s);
        let (a, oa, _) = run(&cfg, reqs.clone(), s.concurrency);
        let (b, ob, _) = run(&cfg, reqs, s.concurrency);
        // Debug text compares NaN fields of rejected requests too.
        prop_assert_eq!(format!("{:?}", oa.records), format!("{:?}", ob.records));
        prop_assert_eq!(a.end_us, b.end_us);
        prop_assert_eq!(a.rec.steps, b.rec.steps);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Under light load (requests 10 s apart) every engine serves a request alone, so its TTFT
    /// is exactly one prefill step: 100 us + 2 us per prompt token in the affine model.
    #[test]
    fn light_load_ttft_is_one_prefill_step(
        lens in prop::collection::vec((1u32..2000, 1u32..50), 1..20),
        policy in prop_oneof![Just(Policy::Continuous), Just(Policy::PrefillFirst), Just(Policy::Static)],
    ) {
        let reqs: Vec<_> = lens.iter().enumerate().map(|(i, &(p, o))| req(i as u64, i as f64 * 10.0, p, o)).collect();
        let (o, obs, _) = run(&config(engine(policy), 10_000), reqs, None);
        prop_assert_eq!(o.rec.completed as usize, lens.len());
        for r in &obs.records {
            let want_ms = (100.0 + 2.0 * r.prompt_tokens as f64) / 1e3;
            prop_assert!((r.ttft_ms - want_ms).abs() < 1e-9, "TTFT {} vs {}", r.ttft_ms, want_ms);
            prop_assert_eq!(r.queue_ms, 0.0);
        }
    }
}
