//! Where a layer's cached rows live. Pure index math, no storage: the CPU and GPU caches share it.
//!
//! A cache of `capacity` physical rows holds the logical positions
//! `origin_logical .. origin_logical + len`; the oldest sits at physical row `origin_physical` and the rest
//! follow, wrapping at `capacity`. Global layers have capacity = the context and never wrap; sliding-window
//! layers have capacity = the window and wrap once full. Rows are always found through this metadata,
//! never by taking an absolute position modulo the capacity.

/// Placement metadata of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPlacement {
    pub capacity: usize,
    pub len: usize,
    pub origin_logical: usize,
    pub origin_physical: usize,
}

/// How a chunk of `t` new rows meets a layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRoute {
    /// Store the chunk into the cache first, then attend from the cache: no row a query of the chunk
    /// needs is evicted by the store (the chunk fits, or it is a single row).
    StoreThenAttend,
    /// The chunk would overwrite rows its own early queries still need: stage the retained rows (in
    /// logical order) followed by the chunk in a detached buffer, attend there, commit afterwards.
    Staged { retained_from: usize },
}

impl RingPlacement {
    pub fn new(capacity: usize) -> Self {
        RingPlacement {
            capacity,
            len: 0,
            origin_logical: 0,
            origin_physical: 0,
        }
    }

    /// The next logical position to be written.
    pub fn end(&self) -> usize {
        self.origin_logical + self.len
    }

    pub fn is_wrapped(&self) -> bool {
        self.origin_physical != 0
    }

    /// The physical row of a cached logical position.
    pub fn physical(&self, logical: usize) -> Option<usize> {
        let offset = logical.checked_sub(self.origin_logical)?;
        (offset < self.len).then(|| (self.origin_physical + offset) % self.capacity)
    }

    /// Whether the layer still holds every row a query at `pos` would see once rows from `pos` on are
    /// dropped (`window`: the layer's; `None` sees every key).
    pub fn can_truncate(&self, pos: usize, window: Option<usize>) -> bool {
        let needed_from = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        self.origin_logical <= needed_from && self.origin_logical <= pos && pos <= self.end()
    }

    /// Rows a pass may write past the end and still be cut back to any position after the end
    /// (`window`: the layer's; `n_ctx`: the most positions the sequence holds). A ring keeps
    /// `capacity - window` rows past its window, and a pass of that many rows overwrites only rows
    /// older than any later query sees; a layer that keeps every key, or a ring as long as the
    /// context (it never wraps), has no limit.
    pub fn rewind_room(&self, window: Option<usize>, n_ctx: usize) -> usize {
        match window {
            Some(w) if self.capacity < n_ctx => self.capacity.saturating_sub(w),
            _ => usize::MAX,
        }
    }

    /// Drops every position from `pos` on (checked with `can_truncate` first).
    pub fn truncate(&mut self, pos: usize) {
        self.len = pos - self.origin_logical;
    }

    /// Picks the route for a chunk of `t` rows starting at `end()`, for a layer whose queries see keys
    /// from `p + 1 - window` (`window` = `None`: all keys).
    pub fn route(&self, t: usize, window: Option<usize>) -> ChunkRoute {
        if t <= 1 || self.len + t <= self.capacity {
            return ChunkRoute::StoreThenAttend;
        }
        let first_needed = match window {
            Some(w) => (self.end() + 1).saturating_sub(w),
            None => 0,
        };
        ChunkRoute::Staged {
            retained_from: first_needed.max(self.origin_logical),
        }
    }

    /// Physical rows that `t` appended positions land on, in order, with the placement after the append.
    /// Only the last `capacity` of them survive; earlier ones are returned as `None`.
    pub fn append(&self, t: usize) -> (Vec<Option<usize>>, RingPlacement) {
        let new_len = (self.len + t).min(self.capacity);
        let evicted = self.len + t - new_len;
        let after = RingPlacement {
            capacity: self.capacity,
            len: new_len,
            origin_logical: self.origin_logical + evicted,
            origin_physical: (self.origin_physical + evicted) % self.capacity.max(1),
        };
        let rows = (0..t)
            .map(|i| {
                let logical = self.end() + i;
                after.physical(logical)
            })
            .collect();
        (rows, after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays appends of the given chunk sizes and checks, after each, that every retained logical
    /// position maps to the physical row where it was written.
    fn replay(capacity: usize, chunks: &[usize]) {
        let mut p = RingPlacement::new(capacity);
        let mut physical_holds: Vec<Option<usize>> = vec![None; capacity];
        for &t in chunks {
            let start = p.end();
            let (rows, after) = p.append(t);
            for (i, r) in rows.iter().enumerate() {
                if let Some(r) = r {
                    physical_holds[*r] = Some(start + i);
                }
            }
            p = after;
            assert!(p.len <= capacity);
            for logical in p.origin_logical..p.end() {
                let phys = p.physical(logical).unwrap();
                assert_eq!(physical_holds[phys], Some(logical), "cap {capacity} chunks {chunks:?}");
            }
            assert_eq!(p.physical(p.end()), None);
            if p.origin_logical > 0 {
                assert_eq!(p.physical(p.origin_logical - 1), None);
            }
        }
    }

    #[test]
    fn appends_keep_logical_to_physical_consistent() {
        replay(8, &[3, 3, 3, 1, 1, 9, 2, 20, 1]);
        replay(512, &[1138]);
        replay(512, &[512, 512, 114]);
        replay(5, &[1; 17]);
        replay(4, &[7, 7, 7]);
    }

    #[test]
    fn truncation_keeps_what_a_query_needs() {
        let global = RingPlacement::new(4096).append(900).1;
        assert!(global.can_truncate(0, None) && global.can_truncate(900, None));
        assert!(!global.can_truncate(901, None), "past the end");
        let mut ring = RingPlacement::new(512).append(900).1;
        assert_eq!(ring.origin_logical, 388);
        // A query at 899 sees keys 388..=899: all still there; at 898 it would need 387.
        assert!(ring.can_truncate(899, Some(512)));
        assert!(!ring.can_truncate(898, Some(512)));
        ring.truncate(899);
        assert_eq!((ring.end(), ring.len), (899, 511));
        let young = RingPlacement::new(512).append(300).1;
        assert!(young.can_truncate(17, Some(512)), "an unwrapped ring cuts anywhere");
    }

    #[test]
    fn routes() {
        let p = RingPlacement::new(512);
        assert_eq!(p.route(512, Some(512)), ChunkRoute::StoreThenAttend);
        assert_eq!(p.route(513, Some(512)), ChunkRoute::Staged { retained_from: 0 });
        let (_, full) = p.append(600);
        assert!(full.is_wrapped() && full.len == 512 && full.origin_logical == 88);
        assert_eq!(
            full.route(1, Some(512)),
            ChunkRoute::StoreThenAttend,
            "decode attends the ring in place"
        );
        // A 64-row chunk at 600: its first query needs keys from 89 on.
        assert_eq!(full.route(64, Some(512)), ChunkRoute::Staged { retained_from: 89 });
    }
}
