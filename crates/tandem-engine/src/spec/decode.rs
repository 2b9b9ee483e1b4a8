//! Generation with drafts: each step feeds the last token and up to `k` drafted ones as one pass of
//! `k + 1` rows, keeps what the target agrees with, and cuts the KV cache back past the rest.
//!
//! Rolling back: the rows of rejected drafts are dropped by cutting the cache (`ServingCache::truncate`).
//! A sliding-window ring keeps some rows past its window (`RING_SLACK` in the server, and wherever
//! speculation is on), and a draft is at most that many tokens (`ServingCache::rewind_room`), so a verify
//! pass that wrapped a ring overwrote only rows older than any query after the cut can see: the cut
//! always succeeds, with no staging and no checkpoint copy. (Staging would cost a copy of `k + 1` rows a
//! layer every step; a checkpoint a copy of the whole ring.) A ring with no slack gets no drafts.

use std::time::Instant;

use tandem_model::{Backend, LogitRows, SequenceCache, ServingCache};

use super::{verify, DraftLength, Proposer, SpecStats};
use crate::sampling::Sampler;
use crate::{Engine, EngineError, GenerateOptions, Timings};

impl<B: Backend> Engine<B>
where
    B::Kv: ServingCache,
{
    /// `generate`, with drafts from `proposer` verified in passes of up to `length`'s choice plus one
    /// rows. Greedy output is the same as `generate`'s, token for token.
    pub fn generate_speculative(
        &mut self,
        kv: &mut B::Kv,
        prompt: &[u32],
        opts: &GenerateOptions,
        proposer: &mut dyn Proposer,
        length: &mut DraftLength,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Timings, SpecStats), EngineError> {
        self.generate_speculative_after(&[], kv, prompt, opts, proposer, length, on_token)
    }

    /// `generate_speculative` on a cache that already holds `earlier` (a conversation's previous
    /// turns): the proposer sees them before `prompt`, so it drafts from the whole conversation; the
    /// sampler's history is `prompt` on, as `generate`'s is.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_speculative_after(
        &mut self,
        earlier: &[u32],
        kv: &mut B::Kv,
        prompt: &[u32],
        opts: &GenerateOptions,
        proposer: &mut dyn Proposer,
        length: &mut DraftLength,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Timings, SpecStats), EngineError> {
        if opts.max_tokens == 0 {
            return Ok((Vec::new(), Timings::default(), SpecStats::default()));
        }
        let start = Instant::now();
        let mut logits = self.prefill(kv, prompt, opts.prefill_chunk)?.into_vec();
        let n_vocab = logits.len();
        let mut timings = Timings {
            prompt_tokens: prompt.len(),
            prefill: start.elapsed(),
            ..Default::default()
        };
        let mut sampler = Sampler::new(opts.sampling.clone());
        let mut stats = SpecStats::default();
        let mut history = prompt.to_vec();
        // What the proposer sees: the earlier turns, then `history`.
        let mut context = [earlier, prompt].concat();
        let mut completion = Vec::new();
        // The first token comes from the prompt's logits, as without drafts.
        let first = sampler.sample(&logits, &history);
        timings.ttft = start.elapsed();
        let first_token_at = Instant::now();
        let mut pending = vec![first];
        // The position `pending[0]` takes once fed: tokens `pending[..i]` are in the cache (as the
        // verify pass's drafts) when `pending[i]` is emitted.
        let mut base = kv.len();
        loop {
            // Emit this step's tokens in order; the last one emitted is the next to feed.
            let mut fed_through = 0;
            let mut stop = false;
            for (i, &token) in pending.iter().enumerate() {
                completion.push(token);
                history.push(token);
                context.push(token);
                fed_through = i;
                let full = base + i >= kv.n_ctx();
                if !on_token(token) || opts.stop_ids.contains(&token) || completion.len() >= opts.max_tokens || full {
                    stop = true;
                    break;
                }
            }
            // Tokens before the last emitted one were fed as drafts: keep their rows, drop the rest.
            let keep = base + fed_through;
            if kv.len() > keep && !kv.truncate(keep) {
                return Err(EngineError::Invalid(format!(
                    "could not roll the KV cache back to {keep} after a verify pass"
                )));
            }
            if stop {
                break;
            }
            let token = *completion.last().unwrap_or(&first);
            let k = length.choose_within(opts.max_tokens - completion.len(), kv);
            let draft = if k > 0 {
                proposer.propose(&context, k)?
            } else {
                Default::default()
            };
            let drafts = &draft.tokens[..draft.tokens.len().min(k)];
            let mut rows = Vec::with_capacity(drafts.len() + 1);
            rows.push(token);
            rows.extend_from_slice(drafts);
            let want = if drafts.is_empty() {
                LogitRows::Last
            } else {
                LogitRows::All
            };
            base = kv.len() + 1;
            let t0 = Instant::now();
            logits = self.forward(kv, &rows, want)?.into_vec();
            let seconds = t0.elapsed().as_secs_f64();
            let verdict = verify(&mut sampler, &logits, n_vocab, &history, drafts, draft.dists.as_deref());
            length.record(drafts.len(), verdict.accepted, seconds);
            stats.record_step(drafts.len(), verdict.accepted, verdict.tokens.len());
            pending = verdict.tokens;
        }
        timings.decode = first_token_at.elapsed();
        timings.decode_tokens = completion.len().saturating_sub(1);
        Ok((completion, timings, stats))
    }
}
