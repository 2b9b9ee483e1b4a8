//! Drafts from a smaller model that shares the target's vocabulary, run by the same engine with a KV
//! cache of its own. Each proposal first brings the draft's cache in line with the sequence (cutting
//! back past the drafts the target rejected, feeding what the target produced since), then decodes `k`
//! tokens one row at a time. With greedy sampling the draft's picks are certain; otherwise it samples
//! with the request's settings and hands its distributions to the acceptance rule.

use tandem_model::kv::RING_SLACK;
use tandem_model::{Backend, LogitRows, ServingBackend, ServingCache};

use super::{Draft, Proposer};
use crate::sampling::{Sampler, SamplingParams};
use crate::{Engine, EngineError};

pub struct DraftModel<B: Backend> {
    engine: Engine<B>,
    kv: B::Kv,
    /// Tokens whose K/V are in `kv`.
    fed: Vec<u32>,
    sampler: Sampler,
    n_ctx: usize,
    prefill_chunk: usize,
}

impl<B: ServingBackend> DraftModel<B> {
    /// A draft model for sequences of up to `n_ctx` positions, sampling as `sampling` says (its own
    /// draws: the seed is varied so the draft does not mirror the target's generator). Its rings keep
    /// `RING_SLACK` rows past their window, so its cache is cut back past rejected drafts, not refilled.
    pub fn new(
        mut engine: Engine<B>,
        n_ctx: usize,
        prefill_chunk: usize,
        sampling: SamplingParams,
    ) -> Result<Self, EngineError> {
        engine.model.set_ring_slack(RING_SLACK);
        let kv = engine.try_new_sequence(n_ctx)?;
        let sampling = SamplingParams {
            seed: sampling.seed ^ 0xD4AF_7000_0000_0001,
            ..sampling
        };
        Ok(DraftModel {
            engine,
            kv,
            fed: Vec::new(),
            sampler: Sampler::new(sampling),
            n_ctx,
            prefill_chunk,
        })
    }

    pub fn engine(&self) -> &Engine<B> {
        &self.engine
    }

    /// Starts over with other sampling settings (a new request on the same draft model).
    pub fn reset_sampling(&mut self, sampling: SamplingParams) {
        self.sampler = Sampler::new(SamplingParams {
            seed: sampling.seed ^ 0xD4AF_7000_0000_0001,
            ..sampling
        });
    }

    /// Cuts the draft's cache back to what it shares with `history` (keeping the last token to read
    /// again for its logits), from scratch when its rings cannot go back that far.
    fn sync(&mut self, history: &[u32]) -> Result<(), EngineError> {
        let limit = history.len().saturating_sub(1);
        let common = self
            .fed
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(limit);
        if !self.kv.truncate(common) {
            self.kv = self.engine.try_new_sequence(self.n_ctx)?;
            self.fed.clear();
            return Ok(());
        }
        self.fed.truncate(common);
        Ok(())
    }
}

impl<B: ServingBackend> Proposer for DraftModel<B> {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Draft, EngineError> {
        // The history and every draft but the last (never fed) must fit the draft's context.
        let k = k.min((self.n_ctx + 1).saturating_sub(history.len()));
        if history.is_empty() || k == 0 {
            return Ok(Draft::default());
        }
        self.sync(history)?;
        let from = self.fed.len();
        let mut logits = self
            .engine
            .prefill(&mut self.kv, &history[from..], self.prefill_chunk)?;
        self.fed.extend_from_slice(&history[from..]);
        let mut seen = history.to_vec();
        let greedy = self.sampler.params().temperature <= 0.0;
        let mut tokens = Vec::with_capacity(k);
        let mut dists = Vec::with_capacity(k);
        for i in 0..k {
            let dist = self.sampler.distribution(&logits, &seen);
            let token = self.sampler.draw(&dist);
            tokens.push(token);
            seen.push(token);
            if !greedy {
                dists.push(dist);
            }
            if i + 1 < k {
                logits = self.engine.forward(&mut self.kv, &[token], LogitRows::Last)?;
                self.fed.push(token);
            }
        }
        Ok(Draft {
            tokens,
            dists: (!greedy).then_some(dists),
        })
    }
}
