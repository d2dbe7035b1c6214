//! Data-parallel router: which replica gets an arriving request.

use super::replica::Replica;
use crate::workload::RequestSpec;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum RouterKind {
    /// Replicas in turn.
    RoundRobin,
    /// The replica with the fewest queued + running requests (lowest index on ties).
    LeastLoaded,
    /// Requests of one prefix group stick to the replica that served the group first (so its
    /// cached prefix is reused); others go least-loaded.
    PrefixAware,
}

pub struct Router {
    kind: RouterKind,
    n: u32,
    next: u32,
    group_home: HashMap<u64, u32>,
}

impl Router {
    pub fn new(kind: RouterKind, n: u32) -> Router {
        Router { kind, n, next: 0, group_home: HashMap::new() }
    }

    pub fn pick(&mut self, spec: &RequestSpec, replicas: &[Replica]) -> u32 {
        if self.n == 1 {
            return 0;
        }
        let least = || replicas.iter().enumerate().min_by_key(|(i, r)| (r.load(), *i)).map(|(i, _)| i as u32).unwrap_or(0);
        match self.kind {
            RouterKind::RoundRobin => {
                let r = self.next;
                self.next = (self.next + 1) % self.n;
                r
            }
            RouterKind::LeastLoaded => least(),
            RouterKind::PrefixAware => match spec.prefix_group.and_then(|g| self.group_home.get(&g)) {
                Some(&r) => r,
                None => least(),
            },
        }
    }

    /// Remembers where a group's first request went (prefix-aware routing only).
    pub fn assigned(&mut self, spec: &RequestSpec, replica: u32) {
        if self.kind == RouterKind::PrefixAware {
            if let Some(g) = spec.prefix_group {
                self.group_home.entry(g).or_insert(replica);
            }
        }
    }
}
