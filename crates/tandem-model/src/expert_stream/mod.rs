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
//! The gate's bytes and flags are atomics and its flags are published with release and read with acquire,
//! so it is `Sync` without unsafe code.

mod error;
mod gate;
mod options;
mod plan;

pub use error::StreamError;
pub use gate::RouteGate;
pub use options::{ExpertStreamMode, StreamDepth, WalkMode, STREAM_MIN_ROWS};
pub use plan::{StreamEntry, StreamPlan};
