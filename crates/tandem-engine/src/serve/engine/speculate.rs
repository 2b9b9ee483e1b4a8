//! Speculative decode steps in the serving loop. A sequence that speculates feeds its waiting token and
//! up to `k` tokens drafted by prompt lookup as `k + 1` rows of the batch's decode pass; afterwards the
//! target's logits judge the drafts (`spec::verify`), the kept drafts and one more token are sent in
//! order, and the cache is cut back past the rest. The draft length follows the sequence's own
//! acceptance rate and the pass times (`DraftLength`), and never takes the sequence past its
//! `max_tokens` (so past its KV reservation), its context, or what its rings can be cut back from
//! (`ServingCache::rewind_room`).

use tandem_model::ServingCache;

use super::{emit, Phase, Sequence};
use crate::spec::{verify, DraftLength, PromptLookup, Proposer, SpecMode, SpecSettings, SpecStats};

/// A speculating sequence's drafter and draft-length estimates.
pub(super) struct SpecState {
    lookup: PromptLookup,
    length: DraftLength,
}

impl SpecState {
    /// The state `settings` ask for (`None`: no speculation). The serving engine drafts by lookup only
    /// (requests for a draft model are refused at submission).
    pub(super) fn new(settings: SpecSettings) -> Option<Self> {
        (settings.mode == SpecMode::Lookup).then(|| SpecState {
            lookup: PromptLookup::default(),
            length: DraftLength::new(settings.draft_max, settings.adaptive),
        })
    }
}

/// The rows sequence `s` (decoding) feeds this step: its waiting token, then its drafts.
pub(super) fn step_rows<K: ServingCache>(s: &mut Sequence<K>) -> Vec<u32> {
    let Phase::Decode { next } = s.phase else {
        unreachable!("only decoding sequences take a decode step")
    };
    let mut rows = vec![next];
    if let Some(spec) = &mut s.spec {
        // The step sends up to k + 1 tokens: within max_tokens, and its rows within the context.
        let left = s.request.max_tokens.saturating_sub(s.generated);
        let room = s.kv.n_ctx().saturating_sub(s.kv.len() + 1);
        let k = spec
            .length
            .choose()
            .min(left.saturating_sub(1))
            .min(room)
            .min(s.kv.rewind_room());
        if k > 0 {
            // Lookup cannot fail; a proposer that did would only cost this step its drafts.
            if let Ok(draft) = spec.lookup.propose(&s.history, k) {
                rows.extend(draft.tokens.iter().take(k));
            }
        }
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
    let verdict = verify(&mut s.sampler, logits, n_vocab, &s.history, drafts, None);
    if let Some(spec) = &mut s.spec {
        spec.length.record(drafts.len(), verdict.accepted, took);
    }
    stats.steps += 1;
    stats.verify_steps += u64::from(!drafts.is_empty());
    stats.drafted += drafts.len() as u64;
    stats.accepted += verdict.accepted as u64;
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
    stats.emitted += sent as u64;
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
