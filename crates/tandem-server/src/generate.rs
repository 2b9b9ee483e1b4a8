//! One generation as the HTTP layer sees it: submit, wait for prefill to start, then turn engine events into
//! text (whole UTF-8 characters, stop strings held back and cut), logprobs and a finish reason. The
//! `Generation` owns the engine's receiver: dropping it (a client gone, a stop string) cancels the request.

use std::sync::Arc;
use std::time::Instant;

use tandem_engine::serve::{
    Event, FinishReason, GenerationRequest, PrefillRoute, RequestTimings, SubmitError, TokenLogprob,
};
use tandem_engine::SamplingParams;
use tandem_tokenizer::StreamDecoder;
use tokio::sync::{mpsc, watch};

use crate::errors::ApiError;
use crate::metrics::Metrics;
use crate::stop::StopMatcher;
use crate::AppState;

/// What a route asks for, once its parameters are checked.
pub struct GenParams {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's logprob and its `n` best alternatives.
    pub top_logprobs: Option<usize>,
    /// Keep generating past end-of-generation tokens (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Speculative decoding (`None`: the server's).
    pub speculative: Option<tandem_engine::spec::SpecSettings>,
}

/// One generated token's logprob, with the pieces as bytes (a piece may be part of a character).
#[derive(Clone, Debug)]
pub struct TokenEntry {
    pub id: u32,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(u32, Vec<u8>, f32)>,
    /// Byte offset of the token's text in the completion.
    pub offset: usize,
}

impl TokenEntry {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Text released to the client, the ids that came in since the last piece, and the logprobs of the tokens
/// whose text is now visible.
#[derive(Debug, Default)]
pub struct Piece {
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<TokenEntry>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// `max_tokens` or the context ran out.
    Length,
    /// An end-of-generation token.
    Eos,
    /// A stop string (not part of the text).
    Word(String),
}

impl Stop {
    /// OpenAI's `finish_reason`.
    pub fn finish_reason(&self) -> &'static str {
        match self {
            Stop::Length => "length",
            Stop::Eos | Stop::Word(_) => "stop",
        }
    }
}

pub struct End {
    pub reason: Stop,
    /// The text still held back when the generation ended.
    pub tail: Piece,
    pub timings: RequestTimings,
}

pub enum Step {
    Piece(Piece),
    End(End),
    Failed(ApiError),
}

pub struct Generation {
    state: Arc<AppState>,
    rx: mpsc::UnboundedReceiver<Event>,
    /// An event read while waiting for prefill to start, not yet handled.
    early: Option<Event>,
    kill: watch::Receiver<bool>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    top_logprobs: Option<usize>,
    pub prompt_tokens: usize,
    pub reused: usize,
    /// Where the prompt was read (a decode node's remote prefill).
    pub prefill: PrefillRoute,
    pub completion_tokens: usize,
    submitted: Instant,
    started: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Bytes of text decoded / released so far.
    decoded: usize,
    released: usize,
    ids: Vec<u32>,
    held_logprobs: Vec<TokenEntry>,
    finished: bool,
}

impl Generation {
    /// Submits the request and waits until prefill starts, so that refusals and early failures are plain
    /// HTTP errors and the prompt-cache line is known before any response header goes out.
    pub async fn start(state: &Arc<AppState>, p: GenParams) -> Result<Generation, ApiError> {
        if state.is_shutting_down() {
            return Err(SubmitError::ShuttingDown.into());
        }
        if p.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt.into());
        }
        let n_prompt = p.prompt.len();
        let request = GenerationRequest {
            prompt: p.prompt,
            max_tokens: p.max_tokens,
            sampling: p.sampling,
            stop_ids: if p.ignore_eos {
                Vec::new()
            } else {
                state.tokenizer.eog_ids()
            },
            top_logprobs: p.top_logprobs,
            speculative: p.speculative,
        };
        let submitted = Instant::now();
        let rx = state.engine.submit(request).map_err(|e| {
            Metrics::inc(&state.metrics.requests_rejected, 1);
            ApiError::from(e)
        })?;
        Metrics::inc(&state.metrics.requests, 1);
        let mut g = Generation {
            state: state.clone(),
            rx,
            early: None,
            kill: state.kill_signal(),
            decoder: state.tokenizer.stream_decoder(false),
            stop: StopMatcher::new(p.stop),
            top_logprobs: p.top_logprobs,
            prompt_tokens: n_prompt,
            reused: 0,
            prefill: PrefillRoute::Local,
            completion_tokens: 0,
            submitted,
            started: None,
            first_token: None,
            last_token: None,
            decoded: 0,
            released: 0,
            ids: Vec::new(),
            held_logprobs: Vec::new(),
            finished: false,
        };
        match g.recv().await {
            Some(Event::Started {
                prompt_tokens,
                reused,
                prefill,
            }) => g.on_started(prompt_tokens, reused, prefill),
            Some(Event::Failed(msg)) => {
                g.finished = true;
                return Err(ApiError::internal(format!("generation failed: {msg}")));
            }
            None if *g.kill.borrow() => {
                g.finished = true;
                return Err(shutdown_error());
            }
            None => {
                g.finished = true;
                return Err(ApiError::internal("the engine dropped the request"));
            }
            // No `Started` (not what the interface promises): go on with what is known.
            Some(other) => g.early = Some(other),
        }
        Ok(g)
    }

    /// `"prompt N = R reused + K read"`, for the `x-tandem-prompt` header and the `tandem` object; on a
    /// decode node `"prompt N = R reused + M remote + K read"` with the route in parentheses, and before
    /// it `after 1 retry` (`after N retries`) when peers failed before the one that sent or the last.
    pub fn prompt_cache_line(&self) -> String {
        let (n, reused) = (self.prompt_tokens, self.reused);
        let retried = |retries: usize| match retries {
            0 => String::new(),
            1 => " after 1 retry".to_string(),
            r => format!(" after {r} retries"),
        };
        match self.prefill {
            PrefillRoute::Local => format!("prompt {n} = {reused} reused + {} read", n.saturating_sub(reused)),
            PrefillRoute::Remote { rows, retries } => format!(
                "prompt {n} = {reused} reused + {rows} remote + {} read{} (remote prefill)",
                n.saturating_sub(reused + rows),
                retried(retries)
            ),
            PrefillRoute::Short => format!(
                "prompt {n} = {reused} reused + 0 remote + {} read (local: short)",
                n.saturating_sub(reused)
            ),
            PrefillRoute::Fallback { cause, retries } => format!(
                "prompt {n} = {reused} reused + 0 remote + {} read{} (local: fallback {cause})",
                n.saturating_sub(reused),
                retried(retries)
            ),
        }
    }

    pub fn tandem_json(&self) -> serde_json::Value {
        serde_json::json!({ "prompt_cache": self.prompt_cache_line() })
    }

    /// The next thing to tell the client; `None` once the generation has ended.
    pub async fn next(&mut self) -> Option<Step> {
        while !self.finished {
            let Some(event) = self.recv().await else {
                self.finished = true;
                let err = if *self.kill.borrow() {
                    Metrics::inc(&self.state.metrics.requests_cancelled, 1);
                    shutdown_error()
                } else {
                    ApiError::internal("the engine dropped the request")
                };
                return Some(Step::Failed(err));
            };
            match event {
                Event::Started {
                    prompt_tokens,
                    reused,
                    prefill,
                } => self.on_started(prompt_tokens, reused, prefill),
                // Only exports send rows; a generation never does.
                Event::KvRows(_) => {}
                Event::Token { id, logprob } => {
                    if let Some(step) = self.on_token(id, logprob) {
                        return Some(step);
                    }
                }
                Event::Done { reason, timings } => {
                    self.finished = true;
                    let reason = match reason {
                        FinishReason::Stop => Stop::Eos,
                        FinishReason::Length | FinishReason::ContextFull => Stop::Length,
                    };
                    let rest = self.decoder.flush();
                    let (mut text, word) = self.stop.push(&rest);
                    let reason = match word {
                        Some(w) => Stop::Word(w),
                        None => {
                            text.push_str(&self.stop.finish());
                            reason
                        }
                    };
                    self.decoded += rest.len();
                    let tail = self.release(text, true);
                    self.observe_end();
                    return Some(Step::End(End { reason, tail, timings }));
                }
                Event::Failed(msg) => {
                    self.finished = true;
                    return Some(Step::Failed(ApiError::internal(format!("generation failed: {msg}"))));
                }
            }
        }
        None
    }

    /// The next event, or `None` when the engine closed the channel or shutdown cut the request.
    async fn recv(&mut self) -> Option<Event> {
        if let Some(e) = self.early.take() {
            return Some(e);
        }
        tokio::select! {
            biased;
            event = self.rx.recv() => event,
            _ = self.kill.wait_for(|k| *k) => None,
        }
    }

    fn on_started(&mut self, prompt_tokens: usize, reused: usize, prefill: PrefillRoute) {
        if self.started.is_some() {
            return;
        }
        self.started = Some(Instant::now());
        self.prompt_tokens = prompt_tokens;
        self.reused = reused;
        self.prefill = prefill;
        let m = &self.state.metrics;
        Metrics::inc(&m.prompt_tokens, prompt_tokens as u64);
        if reused > 0 {
            Metrics::inc(&m.prefix_hits, 1);
            Metrics::inc(&m.prefix_reused_tokens, reused as u64);
        }
    }

    fn on_token(&mut self, id: u32, logprob: Option<TokenLogprob>) -> Option<Step> {
        let now = Instant::now();
        let m = &self.state.metrics;
        if self.first_token.is_none() {
            self.first_token = Some(now);
            m.observe_ttft(now - self.submitted);
            m.add_tokens(self.prompt_tokens.saturating_sub(self.reused) as u64, 0);
        }
        self.last_token = Some(now);
        self.completion_tokens += 1;
        Metrics::inc(&m.generation_tokens, 1);
        m.add_tokens(0, 1);
        self.ids.push(id);

        let text = self.decoder.push(id);
        let tok = &self.state.tokenizer;
        if let (Some(_), Some(lp)) = (self.top_logprobs, logprob) {
            if !tok.is_eog(id) {
                let piece = |id: u32| tok.token_to_piece(id, true);
                self.held_logprobs.push(TokenEntry {
                    id,
                    bytes: piece(id),
                    logprob: lp.logprob,
                    top: lp.top.iter().map(|&(t, l)| (t, piece(t), l)).collect(),
                    offset: self.decoded,
                });
            }
        }
        self.decoded += text.len();
        let (out, word) = self.stop.push(&text);
        if let Some(word) = word {
            // Cancel at once: the engine sees the receiver gone.
            self.finished = true;
            self.rx = mpsc::unbounded_channel().1;
            let tail = self.release(out, false);
            self.observe_end();
            let timings = self.server_timings();
            return Some(Step::End(End {
                reason: Stop::Word(word),
                tail,
                timings,
            }));
        }
        // Logprobs wait for their text, so nothing is sent until some text is.
        (!out.is_empty()).then(|| Step::Piece(self.release(out, false)))
    }

    /// Releases `text`, with the ids so far and the logprobs of the tokens that start inside the released
    /// text (`all`: every held one).
    fn release(&mut self, text: String, all: bool) -> Piece {
        self.released += text.len();
        let released = self.released;
        let logprobs = if all {
            std::mem::take(&mut self.held_logprobs)
        } else {
            let keep = self.held_logprobs.iter().position(|e| e.offset >= released);
            let n = keep.unwrap_or(self.held_logprobs.len());
            self.held_logprobs.drain(..n).collect()
        };
        Piece {
            text,
            ids: std::mem::take(&mut self.ids),
            logprobs,
        }
    }

    /// Timings measured here, for a generation that ended without the engine's `Done`.
    fn server_timings(&self) -> RequestTimings {
        let since = |a: Option<Instant>, b: Instant| a.map(|a| a.saturating_duration_since(b)).unwrap_or_default();
        RequestTimings {
            queued: since(self.started, self.submitted),
            ttft: since(self.first_token, self.submitted),
            decode: self.first_token.map(|f| since(self.last_token, f)).unwrap_or_default(),
            completion_tokens: self.completion_tokens,
        }
    }

    fn observe_end(&self) {
        if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
            if self.completion_tokens >= 2 {
                let steps = u32::try_from(self.completion_tokens - 1).unwrap_or(u32::MAX);
                let per = last.saturating_duration_since(first) / steps;
                self.state.metrics.observe_tpot(per);
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away mid-generation (dropping `rx` with `self` cancels it).
            Metrics::inc(&self.state.metrics.requests_cancelled, 1);
            self.observe_end();
        }
    }
}

fn shutdown_error() -> ApiError {
    ApiError::unavailable("the server is shutting down", "shutting_down")
}

/// A whole generation, for the non-streaming responses.
pub struct Collected {
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<TokenEntry>,
    pub reason: Stop,
    pub timings: RequestTimings,
}

impl Generation {
    /// Runs the generation to its end.
    pub async fn collect(&mut self) -> Result<Collected, ApiError> {
        let mut all = Piece::default();
        let mut add = |p: Piece| {
            all.text.push_str(&p.text);
            all.ids.extend(p.ids);
            all.logprobs.extend(p.logprobs);
        };
        loop {
            match self.next().await {
                Some(Step::Piece(p)) => add(p),
                Some(Step::End(end)) => {
                    add(end.tail);
                    return Ok(Collected {
                        text: all.text,
                        ids: all.ids,
                        logprobs: all.logprobs,
                        reason: end.reason,
                        timings: end.timings,
                    });
                }
                Some(Step::Failed(e)) => return Err(e),
                None => return Err(ApiError::internal("the generation ended early")),
            }
        }
    }
}
