//! Speculative decode steps in the serving loop. A sequence that speculates feeds its waiting token and
//! up to `k` drafted tokens as `k + 1` rows of the batch's decode pass; afterwards the target's logits
//! judge the drafts (`spec::verify`), the kept drafts and one more token are sent in order, and the
//! cache is cut back past the rest. Drafts come from prompt lookup or from the server's draft model
//! (`--draft-model`: one engine shared by every request, a cache of its own per sequence, made on its
//! first draft). The draft length follows the sequence's own acceptance rate and the pass times
//! (`DraftLength`), and never takes the sequence past its `max_tokens` (so past its KV reservation),
//! its context, or what its rings can be cut back from (`ServingCache::rewind_room`).
//!
//! The draft model's caches come from its own pool, capped like the target's; a sequence whose draft
//! cannot get one (or whose draft pass fails) goes on without drafts, never fails for it.
//!
//! A finished request's draft cache is kept (`DraftRunner::keep`), as its target cache is kept for
//! prefix reuse: a follow-up turn's draft starts from the kept cache that shares the longest prefix
//! with its conversation and drafts from its first step, rather than reading the conversation again a
//! busy chunk a step. Kept caches are given back oldest first when the draft pool is full, and past
//! `MAX_KEPT_DRAFTS`.

use tandem_model::{ModelError, ServingBackend, ServingCache};

use super::{emit, Phase, Sequence};
use crate::sampling::{Distribution, Sampler, SamplingParams};
use crate::serve::prefix_cache::{common_prefix, MIN_REUSE};
use crate::spec::draft_model::{draft_sampling, DraftRead};
use crate::spec::{verify, Draft, DraftCache, DraftLength, PromptLookup, Proposer, SpecMode, SpecSettings, SpecStats};
use crate::{Engine, EngineError};

/// Finished requests' draft caches kept at most.
const MAX_KEPT_DRAFTS: usize = 16;

/// The server's draft model.
pub(super) struct DraftRunner<B: ServingBackend> {
    pub engine: Engine<B>,
    pub n_ctx: usize,
    /// How a request's draft cache catches up with its history: at most a busy prefill chunk a step,
    /// so a decode step with a fresh draft cache is not held up by reading a whole prompt.
    pub read: DraftRead,
    /// Finished requests' draft caches, oldest first.
    pub kept: Vec<DraftCache<B::Kv>>,
    /// Tokens new draft caches took over from kept ones, since the start.
    pub reused_tokens: u64,
}

impl<B: ServingBackend> DraftRunner<B> {
    /// Keeps a finished request's draft cache for a later turn to continue from.
    pub fn keep(&mut self, cache: DraftCache<B::Kv>) {
        if cache.is_made() {
            self.kept.push(cache);
            if self.kept.len() > MAX_KEPT_DRAFTS {
                self.kept.remove(0);
            }
        }
    }

    /// Up to `k` drafts after `history` into `cache`. A cache not yet made starts as the kept one
    /// sharing the longest prefix with `history` (at least `MIN_REUSE` tokens); when the draft pool is
    /// full, kept caches are given back, oldest first, and the proposal is tried again.
    fn propose(
        &mut self,
        cache: &mut DraftCache<B::Kv>,
        sampler: &mut Sampler,
        history: &[u32],
        k: usize,
    ) -> Result<Draft, EngineError> {
        if !cache.is_made() {
            let best = self
                .kept
                .iter()
                .enumerate()
                .map(|(i, c)| (common_prefix(c.tokens(), history), i))
                .max();
            if let Some((shared, i)) = best.filter(|&(shared, _)| shared >= MIN_REUSE) {
                *cache = self.kept.remove(i);
                self.reused_tokens += shared as u64;
            }
        }
        loop {
            match cache.propose(&mut self.engine, sampler, history, k, self.n_ctx, self.read) {
                Err(EngineError::Model(ModelError::KvFull { .. })) if !self.kept.is_empty() => {
                    self.kept.remove(0);
                }
                outcome => return outcome,
            }
        }
    }
}

enum Source<K> {
    Lookup(PromptLookup),
    Draft { cache: DraftCache<K>, sampler: Sampler },
}

/// A speculating sequence's drafter, draft-length estimates, and the distributions of the drafts now
/// in flight (a sampling draft model's).
pub(super) struct SpecState<K> {
    source: Source<K>,
    length: DraftLength,
    dists: Option<Vec<Distribution>>,
}

impl<K: ServingCache> SpecState<K> {
    /// The state `settings` ask for (`None`: no speculation); a draft model samples with the request's
    /// settings and draws of its own.
    pub(super) fn new(settings: SpecSettings, sampling: &SamplingParams) -> Option<Self> {
        let source = match settings.mode {
            SpecMode::Off => return None,
            SpecMode::Lookup => Source::Lookup(PromptLookup::default()),
            SpecMode::Draft => Source::Draft {
                cache: DraftCache::default(),
                sampler: Sampler::new(draft_sampling(sampling.clone())),
            },
        };
        Some(SpecState {
            source,
            length: DraftLength::new(settings.draft_max, settings.adaptive),
            dists: None,
        })
    }

    /// The draft model's cache, when the sequence drafts with one.
    pub(super) fn into_draft_cache(self) -> Option<DraftCache<K>> {
        match self.source {
            Source::Draft { cache, .. } => Some(cache),
            Source::Lookup(_) => None,
        }
    }
}

/// The rows sequence `s` (decoding) feeds this step: its waiting token, then its drafts.
pub(super) fn step_rows<B: ServingBackend>(s: &mut Sequence<B::Kv>, draft: Option<&mut DraftRunner<B>>) -> Vec<u32> {
    let Phase::Decode { next } = s.phase else {
        unreachable!("only decoding sequences take a decode step")
    };
    let mut rows = vec![next];
    let Some(spec) = &mut s.spec else {
        return rows;
    };
    let k = spec
        .length
        .choose_within(s.request.max_tokens.saturating_sub(s.generated), &s.kv);
    spec.dists = None;
    if k == 0 {
        return rows;
    }
    let drafted = match (&mut spec.source, draft) {
        (Source::Lookup(lookup), _) => lookup.propose(&s.history, k),
        (Source::Draft { cache, sampler }, Some(d)) => d.propose(cache, sampler, &s.history, k),
        (Source::Draft { .. }, None) => unreachable!("draft requests are refused without a draft model"),
    };
    match drafted {
        Ok(draft) => {
            let n = draft.tokens.len().min(k);
            rows.extend_from_slice(&draft.tokens[..n]);
            spec.dists = draft.dists.map(|mut d| {
                d.truncate(n);
                d
            });
        }
        // No room for the draft's cache, or its pass failed: this sequence goes on without drafts.
        Err(_) => s.spec = None,
    }
    rows
}

/// After the pass over `rows` (the waiting token and the drafts) gave `logits` (one row of `n_vocab`
/// per fed row) in `took` seconds: sends the step's tokens, keeps the rows of the accepted drafts and
/// cuts the cache back past the others. Returns the tokens sent and adds the step to `stats`.
pub(super) fn settle<K: ServingCache>(
    s: &mut Sequence<K>,
    rows: &[u32],
    logits: &[f32],
    n_vocab: usize,
    took: f64,
    stats: &mut SpecStats,
) -> usize {
    let drafts = &rows[1..];
    let dists = s.spec.as_mut().and_then(|spec| spec.dists.take());
    let verdict = verify(&mut s.sampler, logits, n_vocab, &s.history, drafts, dists.as_deref());
    if let Some(spec) = &mut s.spec {
        spec.length.record(drafts.len(), verdict.accepted, took);
    }
    s.fed.push(rows[0]);
    let mut sent = 0;
    for (j, &token) in verdict.tokens.iter().enumerate() {
        // Token j follows row j; the drafts before it were accepted, so their rows stay.
        if j > 0 {
            s.fed.push(drafts[j - 1]);
        }
        emit(s, token, &logits[j * n_vocab..(j + 1) * n_vocab]);
        sent += 1;
        if s.done {
            break;
        }
    }
    stats.record_step(drafts.len(), verdict.accepted, sent);
    if s.kv.len() > s.fed.len() && !s.kv.truncate(s.fed.len()) {
        // Not reachable: drafts are capped at what the rings can be cut back from. Were it reached,
        // the cache would hold rejected rows, so the sequence stops rather than decode from them.
        if !s.done {
            let _ = s.events.send(crate::serve::api::Event::Failed(format!(
                "could not cut the KV cache back to {} after a verify pass",
                s.fed.len()
            )));
        }
        s.failed = true;
        s.done = true;
    }
    sent
}
