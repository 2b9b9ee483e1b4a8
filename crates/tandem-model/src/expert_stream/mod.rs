//! Streaming a prefill chunk's non-resident experts through a ring of GPU slots, with the issuer's
//! walk written once, generic over the copy link, so it runs against a simulated link in tests.
//!
//! A chunk of `STREAM_MIN_ROWS` rows or more lists every non-resident expert of every layer in layer
//! order (`StreamPlan`); entry k goes to ring slot `k % ring`. An issuer thread runs `issue_walk`, which
//! queues each entry's copy on the link as soon as the ring has room (the entry `ring` before it was
//! released by the consumer) and fewer than `depth` queued copies have not yet landed. In
//! `WalkMode::Routed` the compute thread publishes each layer's routing on the `RouteGate` as soon as it
//! knows it, and the issuer skips an entry it has not issued yet whose layer is published and whose
//! expert no row routes to. The consumer never reads an unrouted entry's slot, so the chunk's products
//! are the same bits with or without the skip.
//!
//! How a backend drives one chunk (`ChunkStream` is shared by reference, e.g. in `std::thread::scope`):
//!
//! - Issuer thread: `issue_walk(&chunk, &mut link, mode, depth)`, where the link wraps the copy stream
//!   (see `Link`). The walk returns once every entry is settled, the stream is stopped, or the link
//!   fails; then the consumer's waits for entries it never settled fail rather than hang.
//! - Compute thread, per layer: route the rows, `chunk.publish_counts(layer, &counts)`, then for each
//!   entry k of `plan.layer_entries(layer)` in order: if no row routes to its expert,
//!   `chunk.release_through(k + 1)`; else `slot = chunk.wait_copy(k)?`, make the compute stream wait on
//!   entry k's copied event, run the expert from `slot`, record the slot's slot-free event, and
//!   `chunk.release_through(k + 1)`. A consumer that holds several entries before releasing them must
//!   never wait for an entry a ring or more past its releases (`wait_copy` says so with an error).
//! - On an early exit the consumer calls `chunk.stop()` (or holds `chunk.stop_on_drop()`), then joins
//!   the issuer. Copies already queued still land; sync the copy stream before reusing the slots.
//!
//! The gate's bytes and flags are atomics and the counters are published with release and read with
//! acquire, so the whole stream is `Sync` without unsafe code.

mod chunk;
mod error;
mod gate;
mod options;
mod plan;
mod walk;

pub use chunk::{backoff, ChunkStream, EntryState, StopGuard};
pub use error::StreamError;
pub use gate::RouteGate;
pub use options::{ExpertStreamMode, StreamDepth, WalkMode, STREAM_MIN_ROWS};
pub use plan::{StreamEntry, StreamPlan};
pub use walk::{issue_walk, Link, WalkStats};
