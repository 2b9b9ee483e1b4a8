//! Speculative decoding: a cheap proposer drafts the next few tokens, the target model verifies all of
//! them in one forward pass of `k + 1` rows through the ordinary layer graph, and the tokens it agrees
//! with are kept. Decode is memory-bound, so reading the weights once for `k + 1` rows costs about one
//! step; each accepted draft is a token gained.
//!
//! - `lookup`: drafts from the sequence's own context (an n-gram seen before, and what followed it).
//! - `draft_model`: drafts from a smaller model sharing the target's vocabulary, with its own KV.
//! - `accept`: the acceptance rule. Greedy: a draft is kept when it is the target's argmax. Sampled:
//!   rejection sampling, which leaves the target's distribution exactly as without drafts.
//! - `length`: how many tokens to draft, from the running acceptance rate and the measured cost of a
//!   wider verify pass.
//! - `decode`: the generation loop that ties them together, and rolls the KV back past rejected rows.
//!
//! Greedy output is bit-identical with speculation on and off because a row's logits do not depend on
//! how many rows share its pass (the chunk invariance the backends promise): the verify pass computes,
//! for every row the target keeps, the very logits a one-row step would have.

pub mod accept;
pub mod decode;
pub mod draft_model;
pub mod length;
pub mod lookup;

use crate::sampling::Distribution;
use crate::EngineError;

pub use accept::{verify, Verdict};
pub use draft_model::{DraftCache, DraftModel};
pub use length::DraftLength;
pub use lookup::PromptLookup;

/// Rows a sliding-window ring keeps past its window: a verify pass may overwrite this many retained rows
/// and still be rolled back by cutting the cache (`ServingCache::truncate`), so drafts are capped here.
pub const MAX_DRAFT: usize = tandem_model::kv::RING_SLACK;

/// Where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpecMode {
    #[default]
    Off,
    /// N-grams matched in the sequence's own context.
    Lookup,
    /// A draft model sharing the target's vocabulary.
    Draft,
}

impl std::str::FromStr for SpecMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "none" => Ok(SpecMode::Off),
            "lookup" | "ngram" => Ok(SpecMode::Lookup),
            "draft" => Ok(SpecMode::Draft),
            other => Err(format!("speculative mode {other:?}: expected off, lookup or draft")),
        }
    }
}

/// How a sequence speculates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecSettings {
    pub mode: SpecMode,
    /// The most tokens drafted a step (1 to `MAX_DRAFT`).
    pub draft_max: usize,
    /// Choose the draft length from the acceptance rate and the cost of wider passes (else always
    /// `draft_max`, as far as the proposer reaches).
    pub adaptive: bool,
}

impl Default for SpecSettings {
    fn default() -> Self {
        SpecSettings {
            mode: SpecMode::Off,
            draft_max: 8,
            adaptive: true,
        }
    }
}

impl SpecSettings {
    /// Checks the draft length's range.
    pub fn validated(self) -> Result<Self, EngineError> {
        if self.draft_max == 0 || self.draft_max > MAX_DRAFT {
            return Err(EngineError::Invalid(format!(
                "draft length {} is outside 1..={MAX_DRAFT} (a sliding-window ring keeps {MAX_DRAFT} rows past \
                 its window, as far as a verify pass can be rolled back)",
                self.draft_max
            )));
        }
        Ok(self)
    }
}

/// Proposed tokens, with the proposer's distribution for each when it sampled them (`None`: each token
/// was certain, as a lookup's or a greedy draft model's are).
#[derive(Clone, Debug, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub dists: Option<Vec<Distribution>>,
}

/// A source of drafts.
pub trait Proposer {
    /// Up to `k` tokens that may follow `history` (the prompt and everything generated so far).
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Draft, EngineError>;
}

/// Counters of a sequence's (or a server's) speculation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify passes (steps that carried at least one draft).
    pub verify_steps: u64,
    /// Decode steps of any kind, verify passes included.
    pub steps: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Tokens produced by all steps.
    pub emitted: u64,
}

impl SpecStats {
    /// Accepted drafts over drafted ones.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Tokens a decode step produced on average.
    pub fn tokens_per_step(&self) -> f64 {
        self.emitted as f64 / self.steps.max(1) as f64
    }

    /// Counts one decode step: `drafted` tokens fed after its token, `accepted` of them kept, `emitted`
    /// tokens sent.
    pub fn record_step(&mut self, drafted: usize, accepted: usize, emitted: usize) {
        self.steps += 1;
        self.verify_steps += u64::from(drafted > 0);
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.emitted += emitted as u64;
    }

    pub fn add(&mut self, other: &SpecStats) {
        self.verify_steps += other.verify_steps;
        self.steps += other.steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.emitted += other.emitted;
    }
}
