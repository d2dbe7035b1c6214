//! Paged KV cache: a pool of fixed-size blocks with reference counts, a free queue that is
//! also the LRU of cached blocks (evict from the head, freed blocks join the tail), and a map
//! from block hash to cached block (vLLM v1 `BlockPool` + `FreeKVCacheBlockQueue`).
//!
//! Block hashes: vLLM chains each full block's hash with its parent's, so two blocks match only
//! if all tokens up to and including them match. Here tokens are synthetic: a request's first
//! `shared` tokens are its prefix group's stream, the rest are unique to it. So the chained hash
//! of block j is exactly identified by (group, j) when the block lies wholly inside the shared
//! part and by (request, j) otherwise, which is the key used (no collisions by construction).
//! Only group keys go into the hash map: a request-owned key can only be hit by its own request
//! after preemption, which checks its old block table instead (`holds`), keeping the map small.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub type BlockId = u32;
const NIL: u32 = u32::MAX;
const NO_KEY: u128 = u128::MAX;

/// Key of block `j` of a sequence: identifies its chained hash.
#[inline]
pub fn block_key(owner: u64, j: u32) -> u128 {
    ((owner as u128) << 32) | j as u128
}

/// Owner namespace: group streams and per-request tokens never collide.
#[inline]
pub fn group_owner(group: u64) -> u64 {
    group | (1 << 63)
}

/// Whether a key belongs to a prefix group's stream (other requests may hit it) rather than
/// to one request's own tokens (only that request, recomputing after preemption, can).
#[inline]
pub fn is_shared_key(key: u128) -> bool {
    (key >> 95) & 1 == 1
}

/// Multiplicative hasher for the u128 keys: fast and deterministic (no random state).
#[derive(Default)]
pub struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ *b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u128(&mut self, v: u128) {
        let x = (v as u64) ^ ((v >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        self.0 ^= self.0 >> 32;
    }
}

pub struct BlockPool {
    ref_cnt: Vec<u32>,
    key: Vec<u128>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: u32,
    cached: HashMap<u128, BlockId, BuildHasherDefault<KeyHasher>>,
    caching: bool,
}

impl BlockPool {
    pub fn new(num_blocks: u32, caching: bool) -> BlockPool {
        let n = num_blocks as usize;
        let mut p = BlockPool {
            ref_cnt: vec![0; n],
            key: vec![NO_KEY; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: HashMap::default(),
            caching,
        };
        for b in 0..num_blocks {
            p.push_tail(b);
        }
        p
    }

    pub fn num_blocks(&self) -> u32 {
        self.ref_cnt.len() as u32
    }
    /// Blocks that can be handed out (free, possibly holding evictable cached content).
    pub fn num_free(&self) -> u32 {
        self.num_free
    }
    pub fn num_used(&self) -> u32 {
        self.num_blocks() - self.num_free
    }
    pub fn caching(&self) -> bool {
        self.caching
    }

    fn push_tail(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.num_free -= 1;
    }

    /// Takes the least recently freed block, evicting its cached content. None when all are in use.
    #[inline]
    pub fn alloc(&mut self) -> Option<BlockId> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        let k = self.key[b as usize];
        if k != NO_KEY {
            if is_shared_key(k) && self.cached.get(&k) == Some(&b) {
                self.cached.remove(&k);
            }
            self.key[b as usize] = NO_KEY;
        }
        self.ref_cnt[b as usize] = 1;
        Some(b)
    }

    /// Whether block `b` still holds `key` (not evicted since it was registered).
    #[inline]
    pub fn holds(&self, b: BlockId, key: u128) -> bool {
        self.caching && self.key[b as usize] == key
    }

    /// The cached block holding the group key `key`, if any.
    #[inline]
    pub fn lookup(&self, key: u128) -> Option<BlockId> {
        if !self.caching {
            return None;
        }
        self.cached.get(&key).copied()
    }

    pub fn is_free(&self, b: BlockId) -> bool {
        self.ref_cnt[b as usize] == 0
    }

    /// Takes a reference to a cached block (a prefix hit), pulling it off the free queue.
    pub fn touch(&mut self, b: BlockId) {
        if self.ref_cnt[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_cnt[b as usize] += 1;
    }

    /// Drops a reference; at zero the block joins the tail of the free queue, content kept.
    #[inline]
    pub fn release(&mut self, b: BlockId) {
        let r = &mut self.ref_cnt[b as usize];
        debug_assert!(*r > 0, "double free of block {b}");
        *r -= 1;
        if *r == 0 {
            self.push_tail(b);
        }
    }

    /// Marks a full block as holding `key` so later requests can hit it. When two requests
    /// computed the same prefix at once, lookups go to the newest copy: free blocks are evicted
    /// oldest first, so it outlives the other (vLLM keeps every copy; one findable suffices).
    #[inline]
    pub fn register(&mut self, b: BlockId, key: u128) {
        if !self.caching || self.key[b as usize] != NO_KEY {
            return;
        }
        self.key[b as usize] = key;
        if is_shared_key(key) {
            self.cached.insert(key, b);
        }
    }

    /// Sum of reference counts (for leak checks in tests).
    pub fn total_refs(&self) -> u64 {
        self.ref_cnt.iter().map(|&r| r as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recently_freed_and_hits_survive_until_evicted() {
        let mut p = BlockPool::new(3, true);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        p.register(a, block_key(group_owner(1), 0));
        p.register(b, block_key(group_owner(1), 1));
        assert_eq!(p.num_free(), 1);
        p.release(b); // b freed first: evicted first
        p.release(a);
        assert_eq!(p.num_free(), 3);
        assert_eq!(p.lookup(block_key(group_owner(1), 0)), Some(a));
        let c = p.alloc().unwrap(); // the never-used block 2 is at the head
        assert_eq!(c, 2);
        let d = p.alloc().unwrap();
        assert_eq!(d, b, "least recently freed goes first");
        assert_eq!(p.lookup(block_key(group_owner(1), 1)), None, "evicted content is gone");
        p.touch(a);
        assert_eq!(p.num_free(), 0);
        assert!(p.alloc().is_none());
        p.release(a);
        p.release(c);
        p.release(d);
        assert_eq!(p.total_refs(), 0);
        assert_eq!(p.num_free(), 3);
    }

    #[test]
    fn duplicate_shared_blocks_stay_findable_until_the_last_copy_goes() {
        let mut p = BlockPool::new(3, true);
        let k = block_key(group_owner(5), 0);
        let (a, b) = (p.alloc().unwrap(), p.alloc().unwrap());
        p.register(a, k);
        p.register(b, k);
        p.release(a);
        p.release(b);
        assert_eq!(p.lookup(k), Some(b));
        assert_eq!(p.alloc(), Some(2));
        assert_eq!(p.alloc(), Some(a), "the older copy is evicted first");
        assert_eq!(p.lookup(k), Some(b), "the newer copy is still found");
        assert_eq!(p.alloc(), Some(b));
        assert_eq!(p.lookup(k), None);
    }

    #[test]
    fn request_keys_are_found_through_the_old_table_until_evicted() {
        let mut p = BlockPool::new(2, true);
        let a = p.alloc().unwrap();
        let k = block_key(42, 0);
        assert!(!is_shared_key(k) && is_shared_key(block_key(group_owner(42), 0)));
        p.register(a, k);
        p.release(a);
        assert!(p.holds(a, k));
        assert_eq!(p.lookup(k), None, "request-owned keys are not in the shared map");
        p.alloc().unwrap();
        assert_eq!(p.alloc(), Some(a));
        assert!(!p.holds(a, k), "evicted on reuse");
    }

    #[test]
    fn without_caching_nothing_is_found() {
        let mut p = BlockPool::new(2, false);
        let a = p.alloc().unwrap();
        p.register(a, block_key(group_owner(2), 0));
        assert_eq!(p.lookup(block_key(group_owner(2), 0)), None);
        assert!(!p.holds(a, block_key(group_owner(2), 0)));
    }
}

/// How a request's KV spreads over the pool's pages when the model mixes attention kinds
/// (vLLM's hybrid allocator, transformers' `PagedAttentionCache`): layers form groups of equal
/// size, one page holds a block of tokens for one group, and every group draws from the one
/// pool. A request of `b` blocks holds `b` pages in each full-attention group and at most
/// `sliding_cap_blocks` in each sliding-window group (blocks that left the window are reused).
/// The default (one full group) is a page per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub full_groups: u32,
    pub sliding_groups: u32,
    pub sliding_cap_blocks: u32,
}

impl Default for KvLayout {
    fn default() -> Self {
        KvLayout { full_groups: 1, sliding_groups: 0, sliding_cap_blocks: 0 }
    }
}

impl KvLayout {
    /// The layout of `model` at `block_size` tokens per block: its KV cache groups per kind
    /// (`ModelConfig::kv_cache_groups_by_kind`; linear-attention state takes no pages) and
    /// `ceil(window / block_size)` blocks per sliding group (transformers' cap).
    pub fn of(model: &crate::model::ModelConfig, block_size: u32) -> KvLayout {
        let [full, sliding, _] = model.kv_cache_groups_by_kind();
        if sliding == 0 {
            return KvLayout::default();
        }
        KvLayout {
            full_groups: full as u32,
            sliding_groups: sliding as u32,
            sliding_cap_blocks: model.max_sliding_window().div_ceil(block_size as u64).max(1) as u32,
        }
    }

    /// Groups holding pages.
    pub fn groups(&self) -> u32 {
        self.full_groups + self.sliding_groups
    }

    /// Pages a request of `blocks` blocks holds.
    pub fn pages(&self, blocks: u32) -> u64 {
        self.full_groups as u64 * blocks as u64 + self.sliding_groups as u64 * blocks.min(self.sliding_cap_blocks) as u64
    }

    /// Pages a KV budget of `capacity_tokens` holds when every layer's KV is counted per token
    /// (`kernels::memory::plan`): that many blocks in each group's share.
    pub fn pool_pages(&self, capacity_tokens: u64, block_size: u32) -> u32 {
        (capacity_tokens / block_size as u64 * self.groups() as u64).min(u32::MAX as u64) as u32
    }

    /// Pages beyond its block table (the other groups' share) a request of `blocks` blocks holds.
    pub fn extra_pages(&self, blocks: u32) -> u32 {
        (self.pages(blocks) - blocks as u64) as u32
    }
}
