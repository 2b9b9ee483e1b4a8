//! A streamed chunk's entry list: every non-resident expert of every layer, in layer order, each with
//! the ring slot it lands in.

use std::ops::Range;

use super::error::StreamError;

/// One expert the chunk streams: entry k of the plan goes to ring slot `k % ring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamEntry {
    pub layer: usize,
    pub expert: usize,
    /// What its copy moves over the link.
    pub bytes: u64,
}

/// The ordered entries of one streamed chunk and the ring they pass through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPlan {
    n_layers: usize,
    n_experts: usize,
    ring: usize,
    entries: Vec<StreamEntry>,
    /// Layer l's entries are `layer_start[l]..layer_start[l + 1]`.
    layer_start: Vec<usize>,
}

impl StreamPlan {
    /// A plan from its entries, which must be in layer order, each (layer, expert) at most once and
    /// inside `n_layers` x `n_experts`, through a ring of at least one slot.
    pub fn new(n_layers: usize, n_experts: usize, ring: usize, entries: Vec<StreamEntry>) -> Result<Self, StreamError> {
        if ring == 0 {
            return Err(StreamError::Plan("a ring of 0 slots".into()));
        }
        let cells = n_layers
            .checked_mul(n_experts)
            .ok_or_else(|| StreamError::Plan(format!("{n_layers} layers of {n_experts} experts overflow")))?;
        let starts = n_layers
            .checked_add(1)
            .ok_or_else(|| StreamError::Plan(format!("{n_layers} layers overflow")))?;
        let mut seen = vec![false; cells];
        let mut layer_start = vec![0; starts];
        let mut last_layer = 0;
        for (k, e) in entries.iter().enumerate() {
            if e.layer >= n_layers || e.expert >= n_experts {
                return Err(StreamError::Plan(format!(
                    "entry {k} (layer {}, expert {}) is outside {n_layers} layers of {n_experts} experts",
                    e.layer, e.expert
                )));
            }
            if e.layer < last_layer {
                return Err(StreamError::Plan(format!(
                    "entry {k} (layer {}) comes after layer {last_layer}: entries must be in layer order",
                    e.layer
                )));
            }
            let cell = &mut seen[e.layer * n_experts + e.expert];
            if *cell {
                return Err(StreamError::Plan(format!(
                    "entry {k}: layer {} expert {} is listed twice",
                    e.layer, e.expert
                )));
            }
            *cell = true;
            last_layer = e.layer;
            layer_start[e.layer + 1] += 1;
        }
        for l in 0..n_layers {
            layer_start[l + 1] += layer_start[l];
        }
        Ok(StreamPlan {
            n_layers,
            n_experts,
            ring,
            entries,
            layer_start,
        })
    }

    /// Every expert `resident(layer, expert)` says is not resident, layer by layer and in expert order
    /// within a layer, each `bytes(layer, expert)` long.
    pub fn non_resident(
        n_layers: usize,
        n_experts: usize,
        ring: usize,
        mut resident: impl FnMut(usize, usize) -> bool,
        mut bytes: impl FnMut(usize, usize) -> u64,
    ) -> Result<Self, StreamError> {
        let mut entries = Vec::new();
        for layer in 0..n_layers {
            for expert in 0..n_experts {
                if !resident(layer, expert) {
                    entries.push(StreamEntry {
                        layer,
                        expert,
                        bytes: bytes(layer, expert),
                    });
                }
            }
        }
        Self::new(n_layers, n_experts, ring, entries)
    }

    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    /// Slots in the ring.
    pub fn ring(&self) -> usize {
        self.ring
    }

    /// The ring slot of entry k.
    pub fn slot(&self, k: usize) -> usize {
        k % self.ring
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[StreamEntry] {
        &self.entries
    }

    pub fn entry(&self, k: usize) -> Option<&StreamEntry> {
        self.entries.get(k)
    }

    /// The indices of layer `layer`'s entries (empty past the last layer).
    pub fn layer_entries(&self, layer: usize) -> Range<usize> {
        match (self.layer_start.get(layer), self.layer_start.get(layer + 1)) {
            (Some(&a), Some(&b)) => a..b,
            _ => self.len()..self.len(),
        }
    }

    /// The most entries any one layer has. A consumer that holds a whole layer's slots before releasing
    /// any needs a ring at least this large.
    pub fn max_layer_entries(&self) -> usize {
        (0..self.n_layers)
            .map(|l| self.layer_entries(l).len())
            .max()
            .unwrap_or(0)
    }

    /// What copying every entry moves.
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(layer: usize, expert: usize) -> StreamEntry {
        StreamEntry {
            layer,
            expert,
            bytes: 10,
        }
    }

    #[test]
    fn non_resident_lists_layers_in_order() {
        let plan = StreamPlan::non_resident(3, 4, 5, |l, e| (l + e) % 2 == 0, |l, e| (l * 4 + e) as u64).unwrap();
        let got: Vec<(usize, usize)> = plan.entries().iter().map(|e| (e.layer, e.expert)).collect();
        assert_eq!(got, [(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (2, 3)]);
        assert_eq!(plan.layer_entries(1), 2..4);
        assert_eq!(plan.layer_entries(3), 6..6);
        assert_eq!(plan.max_layer_entries(), 2);
        assert_eq!(plan.total_bytes(), 1 + 3 + 4 + 6 + 9 + 11);
        assert_eq!(plan.slot(7), 2);
    }

    #[test]
    fn empty_layers_have_empty_ranges() {
        let plan = StreamPlan::new(4, 2, 1, vec![entry(1, 0), entry(1, 1), entry(3, 0)]).unwrap();
        assert_eq!(plan.layer_entries(0), 0..0);
        assert_eq!(plan.layer_entries(1), 0..2);
        assert_eq!(plan.layer_entries(2), 2..2);
        assert_eq!(plan.layer_entries(3), 2..3);
        assert!(StreamPlan::new(0, 0, 1, vec![]).unwrap().is_empty());
    }

    #[test]
    fn bad_plans_are_errors() {
        assert!(StreamPlan::new(2, 2, 0, vec![]).is_err());
        assert!(StreamPlan::new(2, 2, 1, vec![entry(2, 0)]).is_err());
        assert!(StreamPlan::new(2, 2, 1, vec![entry(0, 2)]).is_err());
        assert!(StreamPlan::new(2, 2, 1, vec![entry(1, 0), entry(0, 0)]).is_err());
        assert!(StreamPlan::new(2, 2, 1, vec![entry(0, 1), entry(0, 1)]).is_err());
        assert!(StreamPlan::new(usize::MAX, 2, 1, vec![]).is_err());
        assert!(StreamPlan::new(usize::MAX, 0, 1, vec![]).is_err());
    }
}
