//! The state one streamed chunk shares between its issuer thread and the compute thread that consumes
//! the ring: the plan, the route gate, and the counters that hand entries and slots back and forth.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use super::error::StreamError;
use super::gate::RouteGate;
use super::plan::StreamPlan;

/// What became of a stream entry, as the consumer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryState {
    /// Not issued yet; the issuer is still running.
    Pending,
    /// Its copy into slot `k % ring` is queued on the link (it may not have landed yet).
    Copied,
    /// Skipped: its layer was published and no row routes to its expert. Its slot holds nothing of it.
    Skipped,
    /// The issuer ended (stopped or failed) before reaching it.
    Ended,
}

const PENDING: u8 = 0;
const COPIED: u8 = 1;
const SKIPPED: u8 = 2;

/// One streamed chunk: its plan, its route gate, and its issue and release counters.
///
/// The issuer (`issue_walk`) settles entries in order, copied or skipped, and advances `issued` past
/// each. The consumer walks the layers: it publishes a layer's routing, waits for each routed entry
/// (`wait_copy`), reads its slot once the copy has landed, and releases entries in order
/// (`release_through`), routed or not, so the issuer may reuse their slots: entry k is copied only
/// while `k < released + ring`.
#[derive(Debug)]
pub struct ChunkStream {
    plan: StreamPlan,
    gate: RouteGate,
    /// Entries `0..issued` are settled: copied or skipped.
    issued: AtomicUsize,
    /// Entries `0..released` are done with: their slots may take later entries.
    released: AtomicUsize,
    /// One of PENDING, COPIED, SKIPPED per entry, written before `issued` passes it.
    fates: Vec<AtomicU8>,
    stop: AtomicBool,
    /// The issuer has returned; whatever it did not settle never will be.
    ended: AtomicBool,
}

impl ChunkStream {
    pub fn new(plan: StreamPlan) -> Self {
        let gate = RouteGate::new(plan.n_layers(), plan.n_experts());
        let fates = (0..plan.len()).map(|_| AtomicU8::new(PENDING)).collect();
        ChunkStream {
            plan,
            gate,
            issued: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            fates,
            stop: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }

    /// Back to the start for another chunk with the same plan. Needs the stream to itself, so no issuer
    /// can still be running.
    pub fn reset(&mut self) {
        self.gate.reset();
        *self.issued.get_mut() = 0;
        *self.released.get_mut() = 0;
        for f in &mut self.fates {
            *f.get_mut() = PENDING;
        }
        *self.stop.get_mut() = false;
        *self.ended.get_mut() = false;
    }

    pub fn plan(&self) -> &StreamPlan {
        &self.plan
    }

    pub fn gate(&self) -> &RouteGate {
        &self.gate
    }

    /// Publishes a layer's routing from its per-expert row counts (see `RouteGate::publish_counts`).
    pub fn publish_counts(&self, layer: usize, counts: &[u32]) -> Result<(), StreamError> {
        self.gate.publish_counts(layer, counts)
    }

    /// Publishes a layer's routing, one flag per expert (see `RouteGate::publish`).
    pub fn publish(&self, layer: usize, routed: &[bool]) -> Result<(), StreamError> {
        self.gate.publish(layer, routed)
    }

    /// Entries settled so far.
    pub fn issued(&self) -> usize {
        self.issued.load(Ordering::Acquire)
    }

    /// Entries released so far.
    pub fn released(&self) -> usize {
        self.released.load(Ordering::Acquire)
    }

    /// Whether the walk may copy entry k into its slot as far as the ring goes: the entry `ring` before it
    /// has been released.
    pub fn ring_allows(&self, k: usize) -> bool {
        k < self.released().saturating_add(self.plan.ring())
    }

    /// What became of entry k so far, without waiting.
    pub fn poll(&self, k: usize) -> Result<EntryState, StreamError> {
        let fate = self.fates.get(k).ok_or(StreamError::Entry {
            k,
            len: self.plan.len(),
        })?;
        let settled = |issued: usize| {
            (k < issued).then(|| match fate.load(Ordering::Relaxed) {
                SKIPPED => EntryState::Skipped,
                _ => EntryState::Copied,
            })
        };
        if let Some(s) = settled(self.issued.load(Ordering::Acquire)) {
            return Ok(s);
        }
        if !self.ended.load(Ordering::Acquire) {
            return Ok(EntryState::Pending);
        }
        // The issuer may have settled k just before it ended; `ended`'s acquire makes that visible.
        Ok(settled(self.issued.load(Ordering::Acquire)).unwrap_or(EntryState::Ended))
    }

    /// Waits until entry k's copy is issued and returns its slot. The compute stream must then wait for
    /// the copy itself to land (its copied event) before reading the slot. An error, never a hang, when
    /// the entry was skipped, the stream stopped, the issuer ended before it, or it needs ring room that
    /// only this caller can give (`k >= released + ring`: release earlier entries first).
    pub fn wait_copy(&self, k: usize) -> Result<usize, StreamError> {
        let mut round = 0;
        loop {
            match self.poll(k)? {
                EntryState::Copied => return Ok(self.plan.slot(k)),
                EntryState::Skipped => return Err(StreamError::Skipped { k }),
                EntryState::Ended => return Err(StreamError::IssuerEnded { k }),
                EntryState::Pending => {}
            }
            if self.is_stopped() {
                return Err(StreamError::Stopped { k });
            }
            if !self.ring_allows(k) {
                return Err(StreamError::RingStall {
                    k,
                    released: self.released(),
                    ring: self.plan.ring(),
                });
            }
            backoff(round);
            round = round.saturating_add(1);
        }
    }

    /// Releases entries `0..end`: the consumer is done with their slots (for the GPU: the event that
    /// marks the last read of each slot is recorded on the compute stream before this call). Entries
    /// are released in order, routed or not; an earlier `end` than before changes nothing.
    pub fn release_through(&self, end: usize) {
        self.released.fetch_max(end.min(self.plan.len()), Ordering::Release);
    }

    /// Asks the issuer to stop at its next check; waits for entries it has not settled then fail.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// A guard that stops the stream when dropped, so a consumer that leaves early (an error, a `?`)
    /// cannot leave the issuer waiting for ring room forever. Join the issuer before dropping it on the
    /// normal path, or the issuer may stop short of entries no one reads.
    pub fn stop_on_drop(&self) -> StopGuard<'_> {
        StopGuard(self)
    }

    pub fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Whether the issuer has returned.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Records entry k's fate and moves `issued` past it; entries are settled in order by one issuer.
    pub(super) fn settle(&self, k: usize, copied: bool) {
        if let Some(f) = self.fates.get(k) {
            f.store(if copied { COPIED } else { SKIPPED }, Ordering::Relaxed);
        }
        self.issued.store(k + 1, Ordering::Release);
    }

    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}

/// Stops its stream when dropped (`ChunkStream::stop_on_drop`).
#[must_use = "the stream stops when the guard is dropped"]
pub struct StopGuard<'a>(&'a ChunkStream);

impl Drop for StopGuard<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// How a thread waits for another without a lock to sleep on: spin briefly (the wait is usually short),
/// then yield, then sleep in short steps so a long wait costs no core. `round` counts the waits so far.
pub fn backoff(round: u32) {
    if round < 32 {
        std::hint::spin_loop();
    } else if round < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(layers: usize, experts: usize, ring: usize) -> ChunkStream {
        ChunkStream::new(StreamPlan::non_resident(layers, experts, ring, |_, _| false, |_, _| 1).unwrap())
    }

    #[test]
    fn waits_fail_rather_than_hang() {
        let c = chunk(1, 4, 2);
        assert_eq!(c.poll(4), Err(StreamError::Entry { k: 4, len: 4 }));
        assert_eq!(
            c.wait_copy(2),
            Err(StreamError::RingStall {
                k: 2,
                released: 0,
                ring: 2
            })
        );
        c.settle(0, true);
        c.settle(1, false);
        assert_eq!(c.wait_copy(0), Ok(0));
        assert_eq!(c.wait_copy(1), Err(StreamError::Skipped { k: 1 }));
        c.release_through(2);
        {
            let _guard = c.stop_on_drop();
        }
        assert_eq!(c.wait_copy(2), Err(StreamError::Stopped { k: 2 }));
        c.end();
        assert_eq!(c.poll(2), Ok(EntryState::Ended));
        assert_eq!(c.wait_copy(3), Err(StreamError::IssuerEnded { k: 3 }));
    }

    #[test]
    fn release_only_moves_forward() {
        let mut c = chunk(2, 2, 1);
        c.release_through(3);
        c.release_through(1);
        assert_eq!(c.released(), 3);
        c.release_through(99);
        assert_eq!(c.released(), 4);
        c.stop();
        c.reset();
        assert_eq!((c.released(), c.issued(), c.is_stopped()), (0, 0, false));
    }
}
