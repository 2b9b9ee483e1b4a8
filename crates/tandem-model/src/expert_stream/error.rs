//! What can go wrong building a chunk's stream, publishing its routing, reading the options, or waiting
//! for an entry. Every one is returned, never panicked on: a bad option or a consumer's mistake must not
//! take the engine down.

/// An error of the expert stream (its plan, gate, options or consumer waits).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("expert stream plan: {0}")]
    Plan(String),
    #[error("layer {layer} is outside the {n_layers} layers of the route gate")]
    Layer { layer: usize, n_layers: usize },
    #[error("layer {layer}'s routing is already published for this chunk")]
    Republished { layer: usize },
    #[error("layer {layer}'s routing names {got} experts, the route gate holds {want}")]
    Width { layer: usize, got: usize, want: usize },
    #[error("expert stream mode {0:?}: expected off, all or routed")]
    Mode(String),
    #[error("expert stream depth {0:?}: expected a whole number from 1 to 256")]
    Depth(String),
    #[error("entry {k} is outside the chunk's {len} stream entries")]
    Entry { k: usize, len: usize },
    #[error("entry {k} was skipped as unrouted, yet its copy is waited for")]
    Skipped { k: usize },
    #[error("the expert stream was stopped before entry {k} was issued")]
    Stopped { k: usize },
    #[error("the expert stream's issuer ended before entry {k}")]
    IssuerEnded { k: usize },
    #[error("entry {k} needs ring room only its waiter can give: {released} entries released, a ring of {ring}")]
    RingStall { k: usize, released: usize, ring: usize },
}
