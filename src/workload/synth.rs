//! Seeded synthetic request stream: arrivals, lengths, shared-prefix groups and sessions.

use super::lengths::LengthSampler;
use super::{Arrival, RequestSource, RequestSpec, Sharing, WorkloadSpec, DEFAULT_NUM_REQUESTS};
use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A later turn of a session, waiting for its arrival time.
#[derive(Debug, Clone, PartialEq)]
struct PendingTurn {
    arrival_s: f64,
    session: u64,
    /// Conversation tokens before this turn's new user message.
    history_tokens: u32,
    turns_left: u32,
}

impl Eq for PendingTurn {}
impl Ord for PendingTurn {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (arrival, session) for a deterministic order.
        o.arrival_s.total_cmp(&self.arrival_s).then(o.session.cmp(&self.session))
    }
}
impl PartialOrd for PendingTurn {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

pub struct Synthetic {
    spec: WorkloadSpec,
    total: u64,
    emitted: u64,
    lengths: LengthSampler,
    gaps: Option<Gamma<f64>>,
    // Separate streams so that changing the rate does not change the lengths.
    rng_arrival: ChaCha8Rng,
    rng_length: ChaCha8Rng,
    rng_group: ChaCha8Rng,
    /// Arrival time of the next new request (or new session).
    next_start_s: f64,
    next_session: u64,
    pending: BinaryHeap<PendingTurn>,
}

fn stream(seed: u64, n: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(n);
    r
}

impl Synthetic {
    /// `spec` must be valid (`WorkloadSpec::validate`).
    pub fn new(spec: WorkloadSpec) -> Self {
        let gaps = match spec.arrival {
            Arrival::Rate { rate_per_s, burstiness } if rate_per_s.is_finite() => {
                // Sessions start at rate/turns so that requests arrive at `rate` overall.
                let turns = match spec.sharing {
                    Sharing::Sessions { turns, .. } => turns as f64,
                    _ => 1.0,
                };
                let start_rate = rate_per_s / turns;
                Some(Gamma::new(burstiness, 1.0 / (start_rate * burstiness)).expect("validated gamma parameters"))
            }
            _ => None,
        };
        let mut s = Synthetic {
            total: spec.num_requests.unwrap_or(DEFAULT_NUM_REQUESTS),
            emitted: 0,
            lengths: LengthSampler::new(spec.lengths.clone()),
            gaps,
            rng_arrival: stream(spec.seed, 1),
            rng_length: stream(spec.seed, 2),
            rng_group: stream(spec.seed, 3),
            next_start_s: 0.0,
            next_session: 0,
            pending: BinaryHeap::new(),
            spec,
        };
        s.next_start_s = s.gap();
        s
    }

    fn gap(&mut self) -> f64 {
        match &self.gaps {
            Some(g) => g.sample(&mut self.rng_arrival),
            None => 0.0,
        }
    }

    fn make(&mut self, arrival_s: f64, prompt: u32, output: u32, group: Option<u64>, prefix: u32) -> RequestSpec {
        let id = self.emitted;
        self.emitted += 1;
        RequestSpec { id, arrival_s, prompt_tokens: prompt, output_tokens: output, prefix_group: group, prefix_tokens: prefix }
    }

    fn session_turn(&mut self, arrival_s: f64, session: u64, history: u32, turns_left: u32) -> RequestSpec {
        let Sharing::Sessions { think_time_s, .. } = self.spec.sharing else { unreachable!("sessions only") };
        let (msg, out) = self.lengths.sample(&mut self.rng_length);
        let prompt = history.saturating_add(msg);
        if turns_left > 1 {
            self.pending.push(PendingTurn {
                arrival_s: arrival_s + think_time_s,
                session,
                history_tokens: prompt.saturating_add(out),
                turns_left: turns_left - 1,
            });
        }
        let shared = prompt.saturating_add(out);
        self.make(arrival_s, prompt, out, Some(session), shared)
    }
}

impl RequestSource for Synthetic {
    fn next_request(&mut self) -> Result<Option<RequestSpec>> {
        if self.emitted >= self.total {
            return Ok(None);
        }
        let now = self.next_start_s;
        if let Sharing::Sessions { turns, .. } = self.spec.sharing {
            if self.pending.peek().is_some_and(|p| p.arrival_s <= now) {
                let p = self.pending.pop().expect("peeked");
                return Ok(Some(self.session_turn(p.arrival_s, p.session, p.history_tokens, p.turns_left)));
            }
            let session = self.next_session;
            self.next_session += 1;
            self.next_start_s = now + self.gap();
            return Ok(Some(self.session_turn(now, session, 0, turns)));
        }
        self.next_start_s = now + self.gap();
        let (i, o) = self.lengths.sample(&mut self.rng_length);
        let req = match self.spec.sharing {
            Sharing::Groups { groups, prefix_tokens } => {
                let g = self.rng_group.gen_range(0..groups) as u64;
                self.make(now, prefix_tokens.saturating_add(i), o, Some(g), prefix_tokens)
            }
            _ => self.make(now, i, o, None, 0),
        };
        Ok(Some(req))
    }
}
