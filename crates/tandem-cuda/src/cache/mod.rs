//! What the model keeps on the device between passes: per-sequence KV caches and checkpoints (`kv`),
//! the decode-graph cache's types (`graphs`), and page-locked logits lent to the caller
//! (`host_logits`).

pub(crate) mod graphs;
pub(crate) mod host_logits;
pub mod kv;
