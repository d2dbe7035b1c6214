//! One engine replica: its queues, KV block pool and scheduling policy (what runs in the next
//! step), and what happens when a step ends (tokens out, blocks cached, requests finished).

use super::engine::{EngineParams, Policy};
use super::kv::{is_shared_key, BlockId, BlockPool, KvLayout};
use super::record::{Recorder, RequestRecord};
use super::request::Req;
use crate::perf::SeqWork;
use std::collections::VecDeque;

pub struct Replica {
    pub idx: u32,
    params: EngineParams,
    pub pool: BlockPool,
    layout: KvLayout,
    /// Admitted requests in admission order (preemption takes from the back).
    pub running: Vec<Req>,
    pub waiting: VecDeque<Req>,
    /// Batches in flight (up to `pp` with pipeline parallelism).
    pub in_flight: u32,
    next_batch: u32,
    /// When the first pipeline stage can take the next batch.
    pub stage_free_us: f64,
    /// Requests that arrived after this time wait for a later step: under async scheduling a
    /// step is formed when the host turns to it (`HostTimeline::launch_start_us`), so it cannot
    /// see later arrivals. Infinite for synchronous engines and steps from idle.
    pub admit_arrived_by_us: f64,
    /// Async scheduling: where the engine's host is (`HostTimeline`).
    pub host: HostTimeline,
    /// Tokens of the last finished step not yet handed out (async scheduling holds them until
    /// the next step is launched): when that step ended, and its requests that finished.
    held_done_us: Option<f64>,
    held_finished: Vec<HeldFinish>,
    /// `StepTimeModel::request_path_us`: client <-> engine time added to each request's TTFT
    /// and end-to-end latency.
    request_path_us: f64,
    pub kick_pending: bool,
    /// The batch being formed (reused, no allocation per step).
    pub work: Vec<SeqWork>,
    /// Static batching: KV lengths of finished sequences still computed as padding.
    padding: Vec<u32>,
    hit_buf: Vec<BlockId>,
    spare_tables: Vec<Vec<BlockId>>,
    /// `Policy::DecodeFirst`: running requests (index, blocks wanted) that could not grow in the
    /// step being formed, in scheduling order.
    starved: Vec<(usize, u32)>,
    /// `Policy::DecodeFirst`: an eviction holds admissions until a request finishes.
    hold_admission: bool,
}

/// The host side of an async-scheduling engine (vLLM's batch queue of two,
/// `EngineCore.step_with_batch_queue`): the host launches step k+1, then waits for step k and
/// hands out its tokens, then forms and launches step k+2. So step k's tokens leave when both
/// the GPU has finished it and the host has launched step k+1; step k+2 is formed (and sees
/// arrivals) only then. Steps whose host time exceeds their GPU time (prompts without CUDA
/// graphs, small models) thereby delay the tokens of the step before them.
#[derive(Debug, Clone, Copy)]
pub struct HostTimeline {
    /// When the host finished launching the last step (-inf: idle).
    pub launch_end_us: f64,
    /// When the tokens of the step before the last were handed out (-inf: none).
    pub prev_out_us: f64,
}

impl HostTimeline {
    pub const IDLE: HostTimeline = HostTimeline { launch_end_us: f64::NEG_INFINITY, prev_out_us: f64::NEG_INFINITY };

    /// When the host turns to the next step: after launching the last one and handing out the
    /// tokens of the one before it; `now_us` from idle.
    pub fn launch_start_us(&self, now_us: f64) -> f64 {
        let t = self.launch_end_us.max(self.prev_out_us);
        if t.is_finite() { t } else { now_us }
    }
}

/// A request that finished in a step whose tokens are held: its record as if handed out when
/// the step ended, shifted when they are.
struct HeldFinish {
    record: RequestRecord,
    /// Its first token is the held one (one-token answers).
    first_here: bool,
    /// When its previous token was handed out (NaN for none).
    prev_token_us: f64,
}

#[inline]
fn div_ceil(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}

impl Replica {
    pub fn new(idx: u32, params: EngineParams, num_blocks: u32, layout: KvLayout, request_path_us: f64) -> Replica {
        let caching = params.prefix_caching && params.policy != Policy::Static;
        Replica {
            idx,
            pool: BlockPool::new(num_blocks, caching),
            layout,
            params,
            running: Vec::new(),
            waiting: VecDeque::new(),
            in_flight: 0,
            next_batch: 0,
            stage_free_us: 0.0,
            admit_arrived_by_us: f64::INFINITY,
            host: HostTimeline::IDLE,
            held_done_us: None,
            held_finished: Vec::new(),
            request_path_us,
            kick_pending: false,
            work: Vec::new(),
            padding: Vec::new(),
            hit_buf: Vec::new(),
            spare_tables: Vec::new(),
            starved: Vec::new(),
            hold_admission: false,
        }
    }

    /// Requests queued or running (the router's load measure).
    pub fn load(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// A fresh (recycled) block table.
    pub fn table(&mut self) -> Vec<BlockId> {
        self.spare_tables.pop().unwrap_or_default()
    }

    /// Blocks request `i` must add to hold `n` more tokens, and the pages they take (its other
    /// KV groups' share included).
    fn blocks_wanted(&self, i: usize, n: u32) -> (u32, u32) {
        let r = &self.running[i];
        let add = self.params.block_growth.blocks_to_add(r.blocks.len() as u32, r.computed, n, self.params.block_size);
        let extra = self.layout.extra_pages(r.blocks.len() as u32 + add).saturating_sub(r.extra_pages.len() as u32);
        (add, add + extra)
    }

    /// Grows request `i`'s block table to hold `n` more tokens. False when pages run out.
    fn grow(&mut self, i: usize, n: u32) -> bool {
        let (add, pages) = self.blocks_wanted(i, n);
        if self.pool.num_free() < pages {
            return false;
        }
        for k in 0..pages {
            let b = self.pool.alloc().expect("counted free pages");
            let r = &mut self.running[i];
            if k < add { r.blocks.push(b) } else { r.extra_pages.push(b) }
        }
        true
    }

    /// Whether free blocks are below the admission margin while the batch already holds work:
    /// then no prefill joins it (`EngineParams::admission_free_fraction`).
    fn below_admission_margin(&self) -> bool {
        !self.work.is_empty() && (self.pool.num_free() as f64) < self.params.admission_free_fraction * self.pool.num_blocks() as f64
    }

    /// Frees a request's blocks, last block first so a sequence's tail is evicted first; the
    /// table is kept in `prev_blocks` to find its own still-cached blocks on readmission.
    fn free_blocks(&mut self, r: &mut Req) {
        for &b in r.blocks.iter().rev() {
            self.pool.release(b);
        }
        for b in r.extra_pages.drain(..) {
            self.pool.release(b);
        }
        std::mem::swap(&mut r.blocks, &mut r.prev_blocks);
        r.blocks.clear();
        r.registered = 0;
    }

    /// Takes running request `j` out to be recomputed: blocks freed, progress reset, counted.
    fn take_for_recompute(&mut self, j: usize, rec: &mut Recorder) -> Req {
        let mut r = self.running.remove(j);
        self.free_blocks(&mut r);
        r.computed = 0;
        r.preemptions += 1;
        rec.preemptions += 1;
        r
    }

    /// Preempts running request `j` by recompute: back to the front of waiting.
    fn preempt(&mut self, j: usize, rec: &mut Recorder) {
        let r = self.take_for_recompute(j, rec);
        self.waiting.push_front(r);
    }

    fn schedule_one(&mut self, i: usize, n: u32, tag: u32) {
        let r = &mut self.running[i];
        r.sched_new = n;
        r.batch = tag;
        self.work.push(SeqWork { new_tokens: n, cached_tokens: r.computed });
    }

    /// Schedules running requests (those `pick` accepts) in order under `budget`, preempting
    /// from the back when blocks run out (`Policy::DecodeFirst`: skipping the request, listed in
    /// `starved`, and stopping at a prefill below the admission margin). Returns (budget left,
    /// whether blocks ran out: someone was preempted or must wait).
    fn schedule_running(&mut self, mut budget: u32, tag: u32, pick: fn(&Req) -> bool, rec: &mut Recorder) -> (u32, bool) {
        let starve = self.params.policy == Policy::DecodeFirst;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let r = &self.running[i];
            if r.sched_new > 0 || !pick(r) {
                i += 1;
                continue;
            }
            if starve && r.in_prefill() && self.below_admission_margin() {
                break;
            }
            let n = (r.num_tokens() - r.computed).min(budget);
            let mut fits = self.grow(i, n);
            if !fits && starve {
                self.starved.push((i, self.blocks_wanted(i, n).1));
                preempted = true;
                i += 1;
                continue;
            }
            while !fits {
                // The lowest-priority request is the most recently admitted one not in flight.
                let Some(j) = self.running.iter().rposition(|x| x.sched_new == 0) else { break };
                preempted = true;
                if j == i && self.running[i + 1..].iter().any(|x| x.sched_new > 0) {
                    // The blocks it needs are held by lower-priority requests whose step is in
                    // flight (pipeline parallelism): wait for them to land, when they become
                    // preemptible, instead of preempting itself, which two pipelined requests
                    // would otherwise do to each other forever.
                    break;
                }
                self.preempt(j, rec);
                if j == i {
                    break;
                }
                fits = self.grow(i, n);
            }
            if !fits {
                break;
            }
            self.schedule_one(i, n, tag);
            budget -= n;
            i += 1;
        }
        (budget, preempted)
    }

    /// Admits waiting requests FCFS while budget, sequence slots and blocks allow (stopping at
    /// the admission margin; `Policy::DecodeFirst` passes over a request whose blocks do not fit
    /// to the next one while any block is free, as transformers' scheduler does).
    fn admit_waiting(&mut self, mut budget: u32, tag: u32, rec: &mut Recorder, now_us: f64) -> u32 {
        let bs = self.params.block_size;
        let skip_unfit = self.params.policy == Policy::DecodeFirst;
        let mut k = 0;
        while budget > 0 && self.running.len() < self.params.max_num_seqs as usize {
            if self.below_admission_margin() {
                break;
            }
            let Some(front) = self.waiting.get(k) else { break };
            if front.arrival_us > self.admit_arrived_by_us {
                k += 1;
                continue;
            }
            let num_tokens = front.num_tokens();
            // Prefix-cache hits: full blocks only, never the whole sequence (at least one token
            // is computed so the step yields logits).
            self.hit_buf.clear();
            if self.pool.caching() {
                let max_hit = (num_tokens - 1) / bs;
                for j in 0..max_hit {
                    let key = front.key(j, bs);
                    let hit = if is_shared_key(key) {
                        self.pool.lookup(key)
                    } else {
                        front.prev_blocks.get(j as usize).copied().filter(|&b| self.pool.holds(b, key))
                    };
                    match hit {
                        Some(b) => self.hit_buf.push(b),
                        None => break,
                    }
                }
            }
            let hit_tokens = self.hit_buf.len() as u32 * bs;
            let remaining = num_tokens - hit_tokens;
            if !self.params.chunked_prefill && remaining > budget {
                break;
            }
            let n = remaining.min(budget);
            // vLLM allocates for this step's tokens only. SGLang admits a request only if its
            // whole prompt fits (so a chunked prefill never stalls half-way and starves decode);
            // static batching reserves prompt + output up front.
            let hits = self.hit_buf.len() as u32;
            let need = match self.params.policy {
                Policy::Continuous | Policy::DecodeFirst => self.params.block_growth.blocks_to_add(hits, hit_tokens, n, bs),
                Policy::PrefillFirst => div_ceil(num_tokens, bs) - hits,
                Policy::Static => div_ceil(front.prompt + front.output, bs) - hits,
            } as usize;
            let extra = self.layout.extra_pages(hits + need as u32) as usize;
            let hits_free = self.hit_buf.iter().filter(|&&b| self.pool.is_free(b)).count();
            if (self.pool.num_free() as usize) < need + extra + hits_free {
                if skip_unfit && self.pool.num_free() > 0 {
                    k += 1;
                    continue;
                }
                break;
            }
            let mut r = self.waiting.remove(k).expect("candidate exists");
            for &b in &self.hit_buf {
                self.pool.touch(b);
                r.blocks.push(b);
            }
            for _ in 0..need {
                r.blocks.push(self.pool.alloc().expect("counted free blocks"));
            }
            for _ in 0..extra {
                r.extra_pages.push(self.pool.alloc().expect("counted free pages"));
            }
            r.computed = hit_tokens;
            r.registered = self.hit_buf.len() as u32;
            rec.prefix_query_tokens += num_tokens as u64;
            rec.prefix_hit_tokens += hit_tokens as u64;
            if r.first_sched_us.is_nan() {
                r.first_sched_us = now_us;
                r.hit_tokens = hit_tokens;
            }
            self.running.push(r);
            let i = self.running.len() - 1;
            self.schedule_one(i, n, tag);
            budget -= n;
        }
        budget
    }

    /// Evicts starved requests newest first until the others' blocks fit, never the last one
    /// running (transformers' `OffloadingManager.offload_requests` with no CPU pool): each
    /// rejoins the waiting queue at the back to recompute, and admissions wait until a request
    /// finishes. Returns how many were evicted.
    fn evict_starved(&mut self, rec: &mut Recorder) -> usize {
        let mut free = self.pool.num_free() as u64;
        let mut demand: u64 = self.starved.iter().map(|&(_, b)| b as u64).sum();
        let mut victims: Vec<usize> = Vec::new();
        while demand > free && self.running.len() - victims.len() > 1 {
            let Some((j, wanted)) = self.starved.pop() else { break };
            victims.push(j);
            demand -= wanted as u64;
            free += (self.running[j].blocks.len() + self.running[j].extra_pages.len()) as u64;
        }
        victims.sort_unstable_by(|a, b| b.cmp(a));
        for &j in &victims {
            let r = self.take_for_recompute(j, rec);
            self.waiting.push_back(r);
        }
        if !victims.is_empty() {
            self.hold_admission = true;
        }
        victims.len()
    }

    /// Forms the next batch into `self.work`; returns its tag, or None if nothing can run.
    pub fn schedule(&mut self, rec: &mut Recorder, now_us: f64) -> Option<u32> {
        self.work.clear();
        let tag = self.next_batch;
        let budget = self.params.max_num_batched_tokens;
        match self.params.policy {
            Policy::Continuous => {
                let (left, preempted) = self.schedule_running(budget, tag, |_| true, rec);
                // As vLLM: no new admissions in a step that had to preempt.
                if !preempted {
                    self.admit_waiting(left, tag, rec, now_us);
                }
            }
            Policy::DecodeFirst => loop {
                self.starved.clear();
                let (left, _) = self.schedule_running(budget, tag, |r| !r.in_prefill(), rec);
                let (left, _) = self.schedule_running(left, tag, Req::in_prefill, rec);
                if !self.hold_admission {
                    self.admit_waiting(left, tag, rec, now_us);
                }
                // Nothing could run: evict and form the step again (transformers' offload loop).
                if self.starved.is_empty() || self.evict_starved(rec) == 0 || !self.work.is_empty() {
                    break;
                }
            },
            Policy::PrefillFirst => {
                let (left, _) = self.schedule_running(budget, tag, Req::in_prefill, rec);
                self.admit_waiting(left, tag, rec, now_us);
                if self.work.is_empty() {
                    self.schedule_running(u32::MAX, tag, |_| true, rec);
                }
            }
            Policy::Static => {
                if self.running.is_empty() {
                    self.padding.clear();
                    if self.in_flight == 0 {
                        self.admit_waiting(budget, tag, rec, now_us);
                    }
                } else {
                    self.schedule_running(u32::MAX, tag, |_| true, rec);
                    // Padding rides along with the batch's live sequences, never alone (with
                    // pipelining the live ones may all be in flight).
                    let padding = if self.work.is_empty() { &mut [][..] } else { &mut self.padding[..] };
                    for p in padding {
                        self.work.push(SeqWork { new_tokens: 1, cached_tokens: *p });
                        *p += 1;
                    }
                }
            }
        }
        if self.work.is_empty() {
            return None;
        }
        self.next_batch = self.next_batch.wrapping_add(1);
        self.in_flight += 1;
        Some(tag)
    }

    /// Applies batch `tag`, which ended at `now_us`: KV computed, full blocks cached, one
    /// token for each sequence whose tokens are all computed, finished requests released.
    pub fn complete(&mut self, tag: u32, now_us: f64, rec: &mut Recorder) {
        self.in_flight -= 1;
        let bs = self.params.block_size;
        let now_s = now_us * 1e-6;
        let mut out_tokens = 0u64;
        let mut prompt_tokens = 0u64;
        let mut any_done = false;
        for i in 0..self.running.len() {
            let done = {
                let r = &mut self.running[i];
                if r.sched_new > 0 && r.batch == tag {
                    if r.in_prefill() {
                        prompt_tokens += r.sched_new as u64;
                    }
                    r.computed += r.sched_new;
                    r.sched_new = 0;
                    let full = r.computed / bs;
                    while r.registered < full {
                        let key = r.key(r.registered, bs);
                        self.pool.register(r.blocks[r.registered as usize], key);
                        r.registered += 1;
                    }
                    if r.computed >= r.num_tokens() {
                        r.generated += 1;
                        out_tokens += 1;
                        r.token_held = true;
                        self.held_done_us = Some(now_us);
                    }
                    r.generated == r.output
                } else {
                    false
                }
            };
            if done {
                any_done = true;
                let mut r = std::mem::take(&mut self.running[i].blocks);
                for b in self.running[i].extra_pages.drain(..) {
                    self.pool.release(b);
                }
                let req = &self.running[i];
                for &b in r.iter().rev() {
                    self.pool.release(b);
                }
                r.clear();
                self.spare_tables.push(r);
                if self.params.pad_finished {
                    self.padding.push(req.computed);
                }
                // Recorded as if its last token left now; `release_tokens` moves it to when it does.
                let first_here = req.first_token_us.is_nan();
                let first_us = if first_here { now_us } else { req.first_token_us };
                let e2e_ms = (now_us + self.request_path_us - req.arrival_us) * 1e-3;
                let ttft_ms = (first_us + self.request_path_us - req.arrival_us) * 1e-3;
                let record = RequestRecord {
                    id: req.id,
                    replica: self.idx,
                    arrival_s: req.arrival_us * 1e-6,
                    prompt_tokens: req.prompt,
                    output_tokens: req.output,
                    cached_tokens: req.hit_tokens,
                    queue_ms: (req.first_sched_us - req.arrival_us) * 1e-3,
                    ttft_ms,
                    tpot_ms: (req.output > 1).then(|| (e2e_ms - ttft_ms) / (req.output - 1) as f64),
                    e2e_ms,
                    finish_s: (now_us + self.request_path_us) * 1e-6,
                    preemptions: req.preemptions,
                    rejected: None,
                    client: req.client,
                    out_us: now_us,
                };
                self.held_finished.push(HeldFinish { record, first_here, prev_token_us: req.last_token_us });
            }
        }
        if any_done {
            self.hold_admission = false;
            // One pass that keeps admission order (preemption priority).
            self.running.retain(|r| r.generated < r.output);
        }
        let b = rec.series.at(now_s);
        b.output_tokens += out_tokens;
        b.prompt_tokens += prompt_tokens;
    }

    /// When the tokens held since the last step ended (`complete`) leave, if any are held.
    pub fn held_since_us(&self) -> Option<f64> {
        self.held_done_us
    }

    /// Hands out the held tokens at `out_us` (>= when their step ended): first-token and
    /// inter-token times, and the records of the requests they finished.
    pub fn release_tokens(&mut self, out_us: f64, rec: &mut Recorder) {
        let Some(done_us) = self.held_done_us.take() else { return };
        // A request preempted since its token came out waits with it.
        for r in self.running.iter_mut().chain(self.waiting.iter_mut()).filter(|r| r.token_held) {
            r.token_held = false;
            if r.first_token_us.is_nan() {
                r.first_token_us = out_us;
            } else {
                rec.itl(out_us - r.last_token_us);
            }
            r.last_token_us = out_us;
        }
        let shift_ms = (out_us - done_us) * 1e-3;
        for HeldFinish { mut record, first_here, prev_token_us } in self.held_finished.drain(..) {
            if !prev_token_us.is_nan() {
                rec.itl(out_us - prev_token_us);
            }
            if first_here {
                record.ttft_ms += shift_ms;
            }
            record.e2e_ms += shift_ms;
            record.finish_s += shift_ms * 1e-3;
            record.out_us = out_us;
            record.tpot_ms = (record.output_tokens > 1).then(|| (record.e2e_ms - record.ttft_ms) / (record.output_tokens - 1) as f64);
            rec.output_tokens += record.output_tokens as u64;
            rec.finish(record);
        }
        rec.flush_itl();
    }

    /// Pages a request needs for its whole life under the engine's block growth.
    pub fn pages_for(&self, prompt: u32, output: u32) -> u64 {
        let p = &self.params;
        let chunk = if p.chunked_prefill { p.max_num_batched_tokens } else { prompt };
        let blocks = p.block_growth.lifetime_blocks(prompt, prompt as u64 + output as u64, chunk, p.block_size);
        self.layout.pages(blocks.min(u32::MAX as u64) as u32)
    }
}
