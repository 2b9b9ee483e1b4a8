//! The serving engine: many sequences at once on one model, decode first, prefill in chunks.

pub mod api;
mod engine;
mod prefix_cache;
mod warm_up;

pub use api::{
    EngineHandle, EngineStats, Event, FinishReason, GenerationRequest, KvBacklog, KvExport, PrefillPeers, PrefillRoute,
    RemoteMsg, RemotePrefill, RequestTimings, SubmitError, TokenLogprob, FALLBACK_CAUSES,
};
pub use engine::{ServingConfig, ServingEngine};
pub use warm_up::{warm_up, warm_up_rows};
