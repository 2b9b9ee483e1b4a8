//! The issuer's walk over a chunk's stream entries: the one function the engine runs on its issuer
//! thread and the tests run against a simulated link.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use super::chunk::{backoff, ChunkStream};
use super::options::{StreamDepth, WalkMode};
use super::plan::StreamEntry;

/// The copy engine the walk drives: an in-order queue of copies from host memory into ring slots.
///
/// A GPU implementation issues on one copy stream: `issue_copy` makes the stream wait on the slot's
/// slot-free event (recorded by the compute stream after the slot's last read, before the consumer
/// released the entries that used it), enqueues the copy and records the entry's copied event;
/// `landed` queries that event without blocking.
pub trait Link {
    type Error;

    /// Queues entry k's bytes into ring slot `slot` (always `k % ring`), behind every copy queued before.
    fn issue_copy(&mut self, k: usize, entry: &StreamEntry, slot: usize) -> Result<(), Self::Error>;

    /// Whether entry k's copy has landed; must not block. Asked only of copied entries, in order.
    fn landed(&mut self, k: usize) -> Result<bool, Self::Error>;

    /// Called when the walk can do nothing until the consumer releases a slot or a copy lands;
    /// `round` counts such calls in a row. Spins, yields, then sleeps by default.
    fn idle(&mut self, round: u32) {
        backoff(round);
    }
}

/// What one walk did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Entries copied over the link.
    pub copied: usize,
    /// Entries skipped as unrouted.
    pub skipped: usize,
    /// Bytes the copies moved.
    pub bytes: u64,
    /// Bytes the skips saved.
    pub skipped_bytes: u64,
    /// The stream was stopped before every entry was settled.
    pub stopped: bool,
}

impl WalkStats {
    /// The link's rate over `elapsed` (the chunk's streaming time), in bytes per second.
    pub fn link_bytes_per_s(&self, elapsed: Duration) -> f64 {
        let s = elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s
        } else {
            0.0
        }
    }
}

impl WalkStats {
    /// The line `--trace` prints for a streamed chunk of `rows` rows whose stream took `elapsed`.
    pub fn trace_line(&self, rows: usize, elapsed: Duration) -> String {
        let gb_s = self.link_bytes_per_s(elapsed) / 1e9;
        format!(
            "expert stream: {rows} rows, {self}, link {gb_s:.2} GB/s over {:.1} ms",
            elapsed.as_secs_f64() * 1e3
        )
    }
}

impl fmt::Display for WalkStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = 1024.0 * 1024.0;
        write!(
            f,
            "copied {} ({:.1} MiB), skipped {} ({:.1} MiB)",
            self.copied,
            self.bytes as f64 / MIB,
            self.skipped,
            self.skipped_bytes as f64 / MIB
        )?;
        if self.stopped {
            f.write_str(", stopped")?;
        }
        Ok(())
    }
}

/// Marks the stream's issuer as ended however the walk leaves (done, stopped, a link error, a panic),
/// so no consumer waits for an entry that will never be settled.
struct EndOnDrop<'a>(&'a ChunkStream);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Settles every entry of the chunk in order, copying or skipping each, and returns what it did.
///
/// Entry k is copied into slot `k % ring` once both rules hold: the ring rule (`k < released + ring`:
/// the entry that used the slot before has been released) and the depth rule (fewer than `depth`
/// copies queued and not yet seen to land). In `WalkMode::Routed` an entry is skipped instead when its
/// layer's routing is published and no row routes to its expert; the skip is re-checked on every round
/// of a wait, so an entry is skipped exactly when its layer is published before it is issued. Copies
/// already issued stay. `issued` moves past every entry either way. Returns early, with
/// `stats.stopped`, once the stream is stopped; a link error is returned as is. Either way the stream
/// is marked ended, so the consumer's waits fail instead of hanging.
pub fn issue_walk<L: Link + ?Sized>(
    chunk: &ChunkStream,
    link: &mut L,
    mode: WalkMode,
    depth: StreamDepth,
) -> Result<WalkStats, L::Error> {
    let _end = EndOnDrop(chunk);
    let plan = chunk.plan();
    let depth = depth.get();
    // Copied entries not yet seen to land, oldest first. The link is in order, so only the oldest is
    // asked: while it has not landed, nothing queued after it has either.
    let mut queued: VecDeque<usize> = VecDeque::with_capacity(depth);
    let mut stats = WalkStats::default();
    for (k, entry) in plan.entries().iter().enumerate() {
        let mut round = 0u32;
        loop {
            if chunk.is_stopped() {
                stats.stopped = true;
                return Ok(stats);
            }
            if queued.len() >= depth {
                if let Some(&oldest) = queued.front() {
                    if link.landed(oldest)? {
                        queued.pop_front();
                    }
                }
            }
            // Checked after the link query and right before the copy, so the routing seen is as late
            // as it can be.
            if mode == WalkMode::Routed && chunk.gate().is_skippable(entry.layer, entry.expert) {
                chunk.settle(k, false);
                stats.skipped += 1;
                stats.skipped_bytes += entry.bytes;
                break;
            }
            if queued.len() < depth && chunk.ring_allows(k) {
                link.issue_copy(k, entry, plan.slot(k))?;
                queued.push_back(k);
                chunk.settle(k, true);
                stats.copied += 1;
                stats.bytes += entry.bytes;
                break;
            }
            link.idle(round);
            round = round.saturating_add(1);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_print_what_was_copied_and_skipped() {
        let stats = WalkStats {
            copied: 3,
            skipped: 2,
            bytes: 3 << 20,
            skipped_bytes: 1 << 19,
            stopped: false,
        };
        assert_eq!(stats.to_string(), "copied 3 (3.0 MiB), skipped 2 (0.5 MiB)");
        assert_eq!(
            stats.link_bytes_per_s(Duration::from_millis(500)),
            6.0 * 1024.0 * 1024.0
        );
        assert_eq!(stats.link_bytes_per_s(Duration::ZERO), 0.0);
        assert_eq!(
            WalkStats { stopped: true, ..stats }.trace_line(1024, Duration::from_millis(2)),
            "expert stream: 1024 rows, copied 3 (3.0 MiB), skipped 2 (0.5 MiB), stopped, link 1.57 GB/s over 2.0 ms"
        );
    }

    #[test]
    fn a_stream_is_shared_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<ChunkStream>();
    }
}
