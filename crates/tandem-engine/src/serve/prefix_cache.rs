//! Finished conversations kept for reuse: their KV caches and checkpoints, least recently used given
//! back first. The serving loop owns the budget (`engine.rs` states the invariant); this module only
//! keeps the entries, counts their bytes and finds the one a new prompt can continue.

use std::time::Instant;

use tandem_model::{KvCheckpoint, ServingCache};

/// A cached conversation is taken over only for a shared prefix at least this long: a few common tokens
/// (a BOS, a system prompt's first words) are cheap to read again and not worth evicting it for.
pub(super) const MIN_REUSE: usize = 16;

/// A sequence's KV cache with the tokens in it and the checkpoints of its rings (oldest first).
pub(super) struct Conversation<K: ServingCache> {
    pub fed: Vec<u32>,
    pub kv: K,
    pub checkpoints: Vec<K::Checkpoint>,
}

impl<K: ServingCache> Conversation<K> {
    /// Pool bytes it holds: the cache and its checkpoints.
    pub fn bytes(&self) -> usize {
        self.kv.bytes_allocated() + checkpoint_bytes(&self.checkpoints)
    }

    /// Cuts the cache back to the longest prefix of `prompt` it can serve, keeping at least one prompt
    /// token to read: directly when every layer still holds what that position needs, else from the
    /// latest checkpoint that reaches it. Returns the positions kept (0: nothing reusable, and the
    /// cache may then have been emptied).
    pub fn cut_back_for(&mut self, prompt: &[u32]) -> usize {
        let common = common_prefix(&self.fed, prompt);
        if !self.kv.truncate(common) {
            let mut restored = false;
            for cp in self.checkpoints.iter().rev() {
                if self.kv.restore(cp, cp.pos().min(common)) {
                    restored = true;
                    break;
                }
                if self.kv.is_empty() {
                    break;
                }
            }
            if !restored {
                return 0;
            }
        }
        let kept = self.kv.len();
        self.fed.truncate(kept);
        // A checkpoint past the cut holds tokens the new prompt does not share.
        self.checkpoints.retain(|cp| cp.pos() <= kept);
        kept
    }
}

/// Tokens `fed` shares with `prompt`, leaving the prompt's last token to read (its logits are needed).
pub(super) fn common_prefix(fed: &[u32], prompt: &[u32]) -> usize {
    let limit = prompt.len().saturating_sub(1);
    fed.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(limit)
}

pub(super) fn checkpoint_bytes<C: KvCheckpoint>(checkpoints: &[C]) -> usize {
    checkpoints.iter().map(KvCheckpoint::bytes).sum()
}

struct Entry<K: ServingCache> {
    conversation: Conversation<K>,
    last_used: Instant,
}

pub(super) struct PrefixCache<K: ServingCache> {
    entries: Vec<Entry<K>>,
}

impl<K: ServingCache> Default for PrefixCache<K> {
    fn default() -> Self {
        PrefixCache { entries: Vec::new() }
    }
}

impl<K: ServingCache> PrefixCache<K> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Pool bytes held by every entry.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.conversation.bytes()).sum()
    }

    /// Gives back the least recently used entry; false when there is none.
    pub fn evict_lru(&mut self) -> bool {
        match (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) {
            Some(i) => {
                self.entries.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Keeps a finished conversation as the most recently used entry, then gives back the least
    /// recently used ones until the cache is within `budget` bytes.
    pub fn insert(&mut self, conversation: Conversation<K>, budget: usize) {
        self.insert_used_at(conversation, Instant::now());
        while self.bytes() > budget && self.evict_lru() {}
    }

    fn insert_used_at(&mut self, conversation: Conversation<K>, last_used: Instant) {
        self.entries.push(Entry {
            conversation,
            last_used,
        });
    }

    /// Takes out the entry sharing the longest prefix (at least `MIN_REUSE` tokens) with `prompt`,
    /// with when it was last used (to put it back as it was if it cannot be admitted yet).
    pub fn take_best(&mut self, prompt: &[u32]) -> Option<(Conversation<K>, Instant)> {
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.conversation.fed, prompt)))
            .filter(|&(_, common)| common >= MIN_REUSE)
            .max_by_key(|&(i, common)| (common, std::cmp::Reverse(i)))?;
        let e = self.entries.swap_remove(i);
        Some((e.conversation, e.last_used))
    }

    /// Puts back an entry taken out by `take_best` with its old place in the LRU order.
    pub fn put_back(&mut self, conversation: Conversation<K>, last_used: Instant) {
        if !conversation.kv.is_empty() {
            self.insert_used_at(conversation, last_used);
        }
    }

    /// Drops every entry; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.entries.len();
        self.entries.clear();
        n
    }
}
