//! Drafts from a smaller model that shares the target's vocabulary, run by the same engine with a KV
//! cache of its own. Each proposal first brings the draft's cache in line with the sequence (cutting
//! back past the drafts the target rejected, feeding what the target produced since), then decodes `k`
//! tokens one row at a time. With greedy sampling the draft's picks are certain; otherwise it samples
//! with the request's settings and hands its distributions to the acceptance rule.
//!
//! [`DraftCache`] is one sequence's place in a draft model (the serving loop keeps one per speculating
//! request beside a shared draft engine); [`DraftModel`] is a draft engine with one such cache, the
//! proposer of `tandem run`.

use tandem_model::kv::RING_SLACK;
use tandem_model::{Backend, LogitRows, ServingBackend, ServingCache};

use super::{Draft, Proposer};
use crate::sampling::{Sampler, SamplingParams};
use crate::{Engine, EngineError};

/// A sequence's cache in a draft model and the tokens in it (made on first use).
pub struct DraftCache<K> {
    kv: Option<K>,
    /// Tokens whose K/V are in `kv`.
    fed: Vec<u32>,
}

impl<K> Default for DraftCache<K> {
    fn default() -> Self {
        DraftCache {
            kv: None,
            fed: Vec::new(),
        }
    }
}

impl<K: ServingCache> DraftCache<K> {
    /// Tokens whose K/V the cache holds (none before its first proposal).
    pub fn tokens(&self) -> &[u32] {
        &self.fed
    }

    /// Whether the cache has been made (by a proposal).
    pub fn is_made(&self) -> bool {
        self.kv.is_some()
    }

    /// Up to `k` tokens after `history` from the draft model `engine`, picked by `sampler` (whose
    /// distributions come along unless it is greedy). The cache keeps what it shares with `history`
    /// (all but its last token, read again for its logits), from scratch when a ring cannot go back
    /// that far; it holds up to `n_ctx` positions and reads new history in chunks of `read.chunk`.
    /// When more than `read.most` tokens are new, it reads that many and drafts nothing this time (a
    /// serving step stays short while a request's draft catches up with its prompt).
    pub fn propose<B: Backend<Kv = K>>(
        &mut self,
        engine: &mut Engine<B>,
        sampler: &mut Sampler,
        history: &[u32],
        k: usize,
        n_ctx: usize,
        read: DraftRead,
    ) -> Result<Draft, EngineError> {
        // The history and every draft but the last (never fed) must fit the draft's context.
        let k = k.min((n_ctx + 1).saturating_sub(history.len()));
        if history.is_empty() || k == 0 {
            return Ok(Draft::default());
        }
        let limit = history.len() - 1;
        let common = self
            .fed
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(limit);
        let kept = self.kv.take().and_then(|mut kv| kv.truncate(common).then_some(kv));
        let kv = match kept {
            Some(kv) => {
                self.fed.truncate(common);
                kv
            }
            // (The old cache, if any, is given back before a new one is taken.)
            None => {
                self.fed.clear();
                engine.try_new_sequence(n_ctx)?
            }
        };
        let kv = self.kv.insert(kv);
        let from = self.fed.len();
        if history.len() - from > read.most {
            let part = &history[from..from + read.most];
            for piece in part.chunks(read.chunk.max(1)) {
                engine.forward(kv, piece, LogitRows::None)?;
            }
            self.fed.extend_from_slice(part);
            return Ok(Draft::default());
        }
        let mut logits = engine.prefill(kv, &history[from..], read.chunk)?;
        self.fed.extend_from_slice(&history[from..]);
        let mut seen = history.to_vec();
        let greedy = sampler.params().temperature <= 0.0;
        let mut tokens = Vec::with_capacity(k);
        let mut dists = Vec::with_capacity(k);
        for i in 0..k {
            let dist = sampler.distribution(&logits, &seen);
            let token = sampler.draw(&dist);
            tokens.push(token);
            seen.push(token);
            if !greedy {
                dists.push(dist);
            }
            if i + 1 < k {
                logits = engine.forward(kv, &[token], LogitRows::Last)?;
                self.fed.push(token);
            }
        }
        Ok(Draft {
            tokens,
            dists: (!greedy).then_some(dists),
        })
    }
}

/// How a draft cache reads the history it has not seen: in chunks of `chunk` rows, at most `most` rows
/// a proposal.
#[derive(Clone, Copy, Debug)]
pub struct DraftRead {
    pub chunk: usize,
    pub most: usize,
}

/// The draft model's seed: varied from the request's so the draft does not mirror the target's
/// generator.
pub fn draft_sampling(sampling: SamplingParams) -> SamplingParams {
    SamplingParams {
        seed: sampling.seed ^ 0xD4AF_7000_0000_0001,
        ..sampling
    }
}

/// A draft engine with the cache of one sequence at a time.
pub struct DraftModel<B: Backend> {
    engine: Engine<B>,
    cache: DraftCache<B::Kv>,
    sampler: Sampler,
    n_ctx: usize,
    prefill_chunk: usize,
}

impl<B: ServingBackend> DraftModel<B> {
    /// A draft model for sequences of up to `n_ctx` positions, sampling as `sampling` says (with its
    /// own draws). Its rings keep `RING_SLACK` rows past their window, so its cache is cut back past
    /// rejected drafts, not refilled; the cache is made here, so a KV budget too small shows at once.
    pub fn new(
        mut engine: Engine<B>,
        n_ctx: usize,
        prefill_chunk: usize,
        sampling: SamplingParams,
    ) -> Result<Self, EngineError> {
        engine.model.set_ring_slack(RING_SLACK);
        let cache = DraftCache {
            kv: Some(engine.try_new_sequence(n_ctx)?),
            fed: Vec::new(),
        };
        Ok(DraftModel {
            engine,
            cache,
            sampler: Sampler::new(draft_sampling(sampling)),
            n_ctx,
            prefill_chunk,
        })
    }

    pub fn engine(&self) -> &Engine<B> {
        &self.engine
    }

    /// Starts over with other sampling settings (a new request on the same draft model).
    pub fn reset_sampling(&mut self, sampling: SamplingParams) {
        self.sampler = Sampler::new(draft_sampling(sampling));
    }
}

impl<B: ServingBackend> Proposer for DraftModel<B> {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Draft, EngineError> {
        let read = DraftRead {
            chunk: self.prefill_chunk,
            most: usize::MAX,
        };
        self.cache
            .propose(&mut self.engine, &mut self.sampler, history, k, self.n_ctx, read)
    }
}
