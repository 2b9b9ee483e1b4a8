//! The engine: sequences over a model, chunked prefill, decode, sampling and teacher-forced scoring.

pub mod sampling;
pub mod score;
pub mod serve;
pub mod spec;

use std::time::{Duration, Instant};

use tandem_model::{Backend, LogitRows, Logits, Model, ModelError, SequenceCache, SequenceKv, Span};

pub use sampling::{Sampler, SamplingParams};

/// Rows per prefill chunk when nothing else is waiting.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("empty prompt: generation needs at least one token")]
    EmptyPrompt,
    #[error("{0}")]
    Invalid(String),
}

/// Wall-clock figures of one generation.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prefill: Duration,
    /// Time to first token: prefill plus the first sample.
    pub ttft: Duration,
    pub decode_tokens: usize,
    pub decode: Duration,
}

impl Timings {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    pub fn decode_tok_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

pub struct GenerateOptions {
    pub max_tokens: usize,
    pub prefill_chunk: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (the model's end-of-generation tokens).
    pub stop_ids: Vec<u32>,
}

/// A model on a backend (the CPU unless said otherwise) with the scratch its forward passes reuse.
pub struct Engine<B: Backend = Model> {
    pub model: B,
    ws: B::Scratch,
}

impl Engine<Model> {
    pub fn new_sequence(&self, n_ctx: usize) -> SequenceKv {
        self.model.new_sequence(n_ctx)
    }
}

impl<B: Backend> Engine<B> {
    pub fn new(model: B) -> Self {
        Engine {
            model,
            ws: B::Scratch::default(),
        }
    }

    /// A fresh KV cache on the model's backend (device memory can run out, hence the Result).
    pub fn try_new_sequence(&self, n_ctx: usize) -> Result<B::Kv, EngineError> {
        Ok(self.model.new_kv(n_ctx)?)
    }

    /// One forward pass of one sequence's tokens.
    pub fn forward(&mut self, kv: &mut B::Kv, tokens: &[u32], logits: LogitRows) -> Result<Logits, EngineError> {
        let mut spans = [Span { kv, tokens, logits }];
        let mut out = self.model.run(&mut self.ws, &mut spans)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// One decode step for several sequences at once: `tokens[i]` goes to `kvs[i]`, all in one forward
    /// pass (one pass over the weights), as the serving engine batches its decoders. Returns each
    /// sequence's logits, in order.
    pub fn forward_each(&mut self, kvs: &mut [B::Kv], tokens: &[u32]) -> Result<Vec<Logits>, EngineError> {
        if kvs.len() != tokens.len() {
            return Err(EngineError::Invalid(format!(
                "a batched step needs one token per sequence: {} sequences, {} tokens",
                kvs.len(),
                tokens.len()
            )));
        }
        let mut spans: Vec<Span<B::Kv>> = kvs
            .iter_mut()
            .zip(tokens)
            .map(|(kv, t)| Span {
                kv,
                tokens: std::slice::from_ref(t),
                logits: LogitRows::Last,
            })
            .collect();
        Ok(self.model.run(&mut self.ws, &mut spans)?)
    }

    /// Feeds `tokens` in chunks of `chunk` rows; returns the logits of the last token.
    pub fn prefill(&mut self, kv: &mut B::Kv, tokens: &[u32], chunk: usize) -> Result<Logits, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        kv.check_room(tokens.len())?;
        let chunk = chunk.max(1);
        let mut logits = Logits::default();
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= tokens.len();
            let want = if last { LogitRows::Last } else { LogitRows::None };
            logits = self.forward(kv, piece, want)?;
        }
        Ok(logits)
    }

    /// Prefills the prompt, then samples up to `max_tokens`, calling `on_token` with each new token
    /// (return false to stop). Returns the completion and the timings.
    pub fn generate(
        &mut self,
        kv: &mut B::Kv,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Timings), EngineError> {
        let start = Instant::now();
        let mut logits = self.prefill(kv, prompt, opts.prefill_chunk)?;
        let mut timings = Timings {
            prompt_tokens: prompt.len(),
            prefill: start.elapsed(),
            ..Default::default()
        };
        let mut sampler = Sampler::new(opts.sampling.clone());
        let mut history = prompt.to_vec();
        let mut completion = Vec::new();
        let mut first_token_at = Instant::now();
        while completion.len() < opts.max_tokens {
            let token = sampler.sample(&logits, &history);
            if completion.is_empty() {
                timings.ttft = start.elapsed();
                first_token_at = Instant::now();
            }
            completion.push(token);
            history.push(token);
            let stop = opts.stop_ids.contains(&token);
            if !on_token(token) || stop || completion.len() == opts.max_tokens || kv.len() >= kv.n_ctx() {
                break;
            }
            logits = self.forward(kv, &[token], LogitRows::Last)?;
            timings.decode_tokens += 1;
        }
        // Decode speed: every step after the first token (forward pass and sampling).
        timings.decode = first_token_at.elapsed();
        Ok((completion, timings))
    }
}
