//! A request's state inside an engine.

use super::kv::{block_key, group_owner, BlockId};
use crate::workload::RequestSpec;

/// Owner value meaning "no prefix group".
pub const NO_GROUP: u64 = u64::MAX;

#[derive(Debug)]
pub struct Req {
    pub id: u64,
    pub arrival_us: f64,
    pub prompt: u32,
    pub output: u32,
    /// `group_owner(group)` or NO_GROUP.
    pub group: u64,
    /// Leading tokens (prompt then output) that are the group's stream.
    pub shared: u32,
    /// Tokens whose KV is computed.
    pub computed: u32,
    /// Output tokens produced so far.
    pub generated: u32,
    /// Block table.
    pub blocks: Vec<BlockId>,
    /// Pages the request holds for its other KV groups (`KvLayout::extra_pages`).
    pub extra_pages: Vec<BlockId>,
    /// Block table before the last preemption: where its own cached blocks may still be.
    pub prev_blocks: Vec<BlockId>,
    /// Leading blocks already offered to the prefix cache.
    pub registered: u32,
    /// Tokens scheduled in the batch in flight (0: not in flight).
    pub sched_new: u32,
    /// Which in-flight batch (pipeline parallelism keeps several).
    pub batch: u32,
    pub first_sched_us: f64,
    /// When its first and latest tokens were handed out (NaN before).
    pub first_token_us: f64,
    pub last_token_us: f64,
    /// Its latest token is computed but not yet handed out (`Replica::release_tokens`).
    pub token_held: bool,
    pub preemptions: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub hit_tokens: u32,
    pub client: u32,
}

impl Req {
    pub fn new(spec: &RequestSpec, arrival_us: f64, client: u32, blocks: Vec<BlockId>) -> Req {
        Req {
            id: spec.id,
            arrival_us,
            prompt: spec.prompt_tokens,
            output: spec.output_tokens,
            group: spec.prefix_group.map(group_owner).unwrap_or(NO_GROUP),
            shared: if spec.prefix_group.is_some() { spec.prefix_tokens } else { 0 },
            computed: 0,
            generated: 0,
            blocks,
            prev_blocks: Vec::new(),
            extra_pages: Vec::new(),
            registered: 0,
            sched_new: 0,
            batch: 0,
            first_sched_us: f64::NAN,
            first_token_us: f64::NAN,
            last_token_us: f64::NAN,
            token_held: false,
            preemptions: 0,
            hit_tokens: 0,
            client,
        }
    }

    /// Tokens in the sequence now: the prompt plus outputs so far.
    #[inline]
    pub fn num_tokens(&self) -> u32 {
        self.prompt + self.generated
    }

    /// Key of block `j` (chained-hash identity, see `kv.rs`).
    #[inline]
    pub fn key(&self, j: u32, block_size: u32) -> u128 {
        if self.group != NO_GROUP && (j as u64 + 1) * block_size as u64 <= self.shared as u64 {
            block_key(self.group, j)
        } else {
            block_key(self.id, j)
        }
    }

    /// Still computing its prompt (or recomputing after preemption) rather than decoding.
    #[inline]
    pub fn in_prefill(&self) -> bool {
        self.generated == 0 || self.computed + 1 < self.num_tokens()
    }
}
