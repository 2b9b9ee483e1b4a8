//! The route gate: which experts of a layer at least one row of the chunk routes to, published by the
//! compute thread once the layer's routing is known and read by the issuer to skip the rest.

use std::sync::atomic::{AtomicU8, Ordering};

use super::error::StreamError;

/// A layer whose routing is not known yet: nothing of it may be skipped.
const OPEN: u8 = 0;
/// A publisher has claimed the layer and is writing its bytes.
const WRITING: u8 = 1;
/// The layer's bytes are written and may be read.
const PUBLISHED: u8 = 2;

/// One byte per (layer, expert) and one state per layer, for one chunk. The compute thread writes a
/// layer's bytes and then its state with release ordering; the issuer reads the state with acquire and
/// only then the bytes, so a layer it sees published has all its bytes in place. A layer is published
/// at most once per chunk: an entry skipped on the first publication must never become routed.
#[derive(Debug)]
pub struct RouteGate {
    n_layers: usize,
    n_experts: usize,
    state: Vec<AtomicU8>,
    routed: Vec<AtomicU8>,
}

impl RouteGate {
    /// A gate with nothing published. `n_layers * n_experts` must fit in memory; a plan's shape does.
    pub fn new(n_layers: usize, n_experts: usize) -> Self {
        let cells = n_layers.saturating_mul(n_experts);
        RouteGate {
            n_layers,
            n_experts,
            state: (0..n_layers).map(|_| AtomicU8::new(OPEN)).collect(),
            routed: (0..cells).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    /// Forgets every publication, for the next chunk. Needs the gate to itself, so no issuer can be
    /// reading it.
    pub fn reset(&mut self) {
        for s in &mut self.state {
            *s.get_mut() = OPEN;
        }
        for r in &mut self.routed {
            *r.get_mut() = 0;
        }
    }

    /// Publishes layer `layer`'s routing: `routed(expert)` says whether at least one row routes to it.
    /// Once per layer per chunk; a second call is an error and changes nothing.
    pub fn publish_with(&self, layer: usize, mut routed: impl FnMut(usize) -> bool) -> Result<(), StreamError> {
        let state = self.state.get(layer).ok_or(StreamError::Layer {
            layer,
            n_layers: self.n_layers,
        })?;
        state
            .compare_exchange(OPEN, WRITING, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| StreamError::Republished { layer })?;
        let row = &self.routed[layer * self.n_experts..(layer + 1) * self.n_experts];
        for (expert, cell) in row.iter().enumerate() {
            cell.store(u8::from(routed(expert)), Ordering::Relaxed);
        }
        state.store(PUBLISHED, Ordering::Release);
        Ok(())
    }

    /// Publishes a layer's routing as one flag per expert.
    pub fn publish(&self, layer: usize, routed: &[bool]) -> Result<(), StreamError> {
        self.check_width(layer, routed.len())?;
        self.publish_with(layer, |e| routed[e])
    }

    /// Publishes a layer's routing from its per-expert row counts (routed where the count is not 0).
    pub fn publish_counts(&self, layer: usize, counts: &[u32]) -> Result<(), StreamError> {
        self.check_width(layer, counts.len())?;
        self.publish_with(layer, |e| counts[e] != 0)
    }

    fn check_width(&self, layer: usize, got: usize) -> Result<(), StreamError> {
        if got == self.n_experts {
            Ok(())
        } else {
            Err(StreamError::Width {
                layer,
                got,
                want: self.n_experts,
            })
        }
    }

    pub fn is_published(&self, layer: usize) -> bool {
        self.state
            .get(layer)
            .is_some_and(|s| s.load(Ordering::Acquire) == PUBLISHED)
    }

    /// Whether the layer's published routing sends a row to the expert; `None` before publication
    /// (or outside the gate).
    pub fn routed(&self, layer: usize, expert: usize) -> Option<bool> {
        if expert >= self.n_experts || !self.is_published(layer) {
            return None;
        }
        Some(self.routed[layer * self.n_experts + expert].load(Ordering::Relaxed) != 0)
    }

    /// Whether the issuer may skip the expert's entry: its layer is published and no row routes to it.
    /// Anything unknown is not skippable.
    pub fn is_skippable(&self, layer: usize, expert: usize) -> bool {
        self.routed(layer, expert) == Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_skippable_before_publication() {
        let gate = RouteGate::new(2, 3);
        assert!(!gate.is_skippable(0, 0));
        assert_eq!(gate.routed(0, 0), None);
        gate.publish(0, &[true, false, true]).unwrap();
        assert!(gate.is_published(0) && !gate.is_published(1));
        assert!(!gate.is_skippable(0, 0) && gate.is_skippable(0, 1) && !gate.is_skippable(0, 2));
        assert!(!gate.is_skippable(1, 1));
        assert!(!gate.is_skippable(0, 3) && !gate.is_skippable(2, 0));
    }

    #[test]
    fn a_layer_publishes_once_per_chunk() {
        let mut gate = RouteGate::new(2, 2);
        gate.publish_counts(1, &[0, 4]).unwrap();
        assert_eq!(
            gate.publish(1, &[true, true]),
            Err(StreamError::Republished { layer: 1 })
        );
        assert_eq!(gate.routed(1, 0), Some(false));
        gate.reset();
        assert!(!gate.is_published(1));
        gate.publish(1, &[true, true]).unwrap();
        assert_eq!(gate.routed(1, 0), Some(true));
    }

    #[test]
    fn bad_publications_are_errors() {
        let gate = RouteGate::new(2, 2);
        assert_eq!(
            gate.publish(2, &[true, true]),
            Err(StreamError::Layer { layer: 2, n_layers: 2 })
        );
        assert_eq!(
            gate.publish(0, &[true]),
            Err(StreamError::Width {
                layer: 0,
                got: 1,
                want: 2
            })
        );
        assert_eq!(
            gate.publish_counts(0, &[1, 2, 3]),
            Err(StreamError::Width {
                layer: 0,
                got: 3,
                want: 2
            })
        );
        assert!(!gate.is_published(0));
    }
}
