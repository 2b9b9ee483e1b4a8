//! llama.cpp-server-compatible routes: `/completion`, `/tokenize`, `/detokenize`, and the admin `/slots`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tandem_engine::serve::RequestTimings;
use tandem_engine::SamplingParams;

use crate::errors::{ApiError, ApiJson};
use crate::generate::{End, GenParams, Generation, Piece, Stop, TokenEntry};
use crate::params::{self, SamplingFields, StopField};
use crate::stream::{sse_response, SseFormat, PROMPT_HEADER};
use crate::AppState;

/// A prompt: text, or a list mixing token ids and texts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum LlamaPrompt {
    Text(String),
    Mixed(Vec<PromptItem>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptItem {
    Id(u32),
    Text(String),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: LlamaPrompt,
    /// -1: as many as the limit allows; absent: the server's default.
    pub n_predict: Option<i64>,
    pub max_tokens: Option<i64>,
    pub stop: Option<StopField>,
    pub stream: Option<bool>,
    pub n_probs: Option<usize>,
    pub ignore_eos: Option<bool>,
    pub model: Option<String>,
    /// llama.cpp's most drafted tokens a step (0: no speculation).
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<i64>,
    /// Tandem's: speculative decoding for this request.
    pub speculative: Option<params::SpeculativeField>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

async fn prompt_ids(state: &AppState, prompt: LlamaPrompt) -> Result<Vec<u32>, ApiError> {
    let ids = match prompt {
        LlamaPrompt::Text(t) => params::encode(state, t, true, true, "prompt").await?,
        LlamaPrompt::Mixed(items) => {
            let mut ids = Vec::new();
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    PromptItem::Id(id) => ids.push(id),
                    // Like llama.cpp: BOS only when the prompt starts with text.
                    PromptItem::Text(t) => ids.extend(params::encode(state, t, i == 0, true, "prompt").await?),
                }
            }
            ids
        }
    };
    params::check_ids(state, &ids, "prompt")?;
    Ok(ids)
}

fn settings(p: &SamplingParams, n_predict: usize, stop: &[String], n_probs: usize, ignore_eos: bool) -> Value {
    json!({
        "n_predict": n_predict,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "repeat_penalty": p.repeat_penalty,
        "repeat_last_n": p.penalty_last_n,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "seed": p.seed,
        "stop": stop,
        "n_probs": n_probs,
        "ignore_eos": ignore_eos,
    })
}

fn probs(entries: &[TokenEntry]) -> Value {
    let one = |id: u32, bytes: &[u8], lp: f32| json!({"id": id, "token": String::from_utf8_lossy(bytes), "logprob": lp, "bytes": bytes});
    entries
        .iter()
        .map(|e| {
            let mut v = one(e.id, &e.bytes, e.logprob);
            v["top_logprobs"] = e.top.iter().map(|(id, b, lp)| one(*id, b, *lp)).collect();
            v
        })
        .collect()
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// llama.cpp's `timings`: prompt = prefill of the tokens read, predicted = the decode after the first token.
fn timings(g: &Generation, t: &RequestTimings) -> Value {
    let prompt_n = g.prompt_tokens.saturating_sub(g.reused);
    let prompt_ms = ms(t.ttft.saturating_sub(t.queued));
    let steps = g.completion_tokens.saturating_sub(1);
    let predicted_ms = ms(t.decode);
    let per = |n: usize, ms: f64| if n > 0 && ms > 0.0 { ms / n as f64 } else { 0.0 };
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "cache_n": g.reused,
        "queued_ms": ms(t.queued),
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_n, prompt_ms),
        "prompt_per_second": rate(prompt_n, prompt_ms),
        "predicted_n": g.completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per(steps, predicted_ms),
        "predicted_per_second": rate(steps, predicted_ms),
    })
}

/// The fields of the last message (stream) or of the whole response.
struct Final {
    model: String,
    settings: Value,
    prompt: String,
    n_probs: usize,
}

impl Final {
    fn fields(&self, g: &Generation, end: &End, text_so_far: &str, tail: &Piece) -> Value {
        let (stop_type, word) = match &end.reason {
            Stop::Eos => ("eos", String::new()),
            Stop::Length => ("limit", String::new()),
            Stop::Word(w) => ("word", w.clone()),
        };
        let mut v = json!({
            "index": 0,
            "id_slot": -1,
            "content": tail.text,
            "tokens": tail.ids,
            "stop": true,
            "model": self.model,
            "tokens_predicted": g.completion_tokens,
            "tokens_evaluated": g.prompt_tokens,
            "tokens_cached": g.prompt_tokens + g.completion_tokens,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": text_so_far.contains('\n') || tail.text.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": word,
            "timings": timings(g, &end.timings),
            "tandem": g.tandem_json(),
        });
        if self.n_probs > 0 {
            v["completion_probabilities"] = probs(&tail.logprobs);
        }
        v
    }
}

/// `POST /completion`.
pub(crate) async fn completion(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    params::check_model(&state, req.model.as_deref())?;
    let (param, n) = match (req.n_predict, req.max_tokens) {
        (Some(n), _) => ("n_predict", Some(n)),
        (None, n) => ("max_tokens", n),
    };
    let max_tokens = match n {
        Some(n) if n < 0 => state.config.max_tokens_limit.max(1),
        n => params::max_tokens(&state.config, n.map(|n| n as u64), param)?,
    };
    let mut fields = req.sampling.clone();
    // llama.cpp samples greedily at a negative temperature.
    fields.temperature = fields.temperature.map(|t| t.max(0.0));
    let sampling = fields.resolve(
        params::llamacpp_defaults(),
        || state.engine.stats().n_ctx,
        state.tokenizer.n_vocab(),
    )?;
    let stop = params::stop_strings(req.stop)?;
    let n_probs = params::top_logprobs(req.n_probs.unwrap_or(0), "n_probs")?;
    let ignore_eos = req.ignore_eos.unwrap_or(false);
    let speculative = params::speculative(req.speculative, req.speculative_n_max, state.config.spec)?;
    let prompt = prompt_ids(&state, req.prompt).await?;
    let fin = Final {
        model: state.config.model_name.clone(),
        settings: settings(&sampling, max_tokens, &stop, n_probs, ignore_eos),
        prompt: state.tokenizer.decode(&prompt, true),
        n_probs,
    };
    let gen = GenParams {
        prompt,
        max_tokens,
        sampling,
        stop,
        top_logprobs: (n_probs > 0).then_some(n_probs),
        ignore_eos,
        speculative,
    };
    let mut g = Generation::start(&state, gen).await?;
    if req.stream.unwrap_or(false) {
        return Ok(sse_response(
            g,
            LlamaStream {
                fin,
                text: String::new(),
            },
        ));
    }
    let out = g.collect().await?;
    let all = Piece {
        text: out.text,
        ids: out.ids,
        logprobs: out.logprobs,
    };
    let end = End {
        reason: out.reason,
        tail: Piece::default(),
        timings: out.timings,
    };
    let body = fin.fields(&g, &end, "", &all);
    Ok(([(PROMPT_HEADER, g.prompt_cache_line())], Json(body)).into_response())
}

struct LlamaStream {
    fin: Final,
    /// What was sent so far (for `has_new_line`).
    text: String,
}

impl SseFormat for LlamaStream {
    fn piece(&mut self, _g: &Generation, p: Piece) -> Vec<Value> {
        self.text.push_str(&p.text);
        let mut v = json!({"index": 0, "id_slot": -1, "content": p.text, "tokens": p.ids, "stop": false});
        if self.fin.n_probs > 0 {
            v["completion_probabilities"] = probs(&p.logprobs);
        }
        vec![v]
    }

    fn end(&mut self, g: &Generation, end: End) -> Vec<Value> {
        vec![self.fin.fields(g, &end, &self.text, &end.tail)]
    }

    /// llama.cpp clients read until `stop: true`, so a failed generation still ends with one, carrying
    /// the error (as llama.cpp's error events do, in an `error` object) and what was counted so far.
    fn failed(&mut self, g: &Generation, err: ApiError) -> Vec<Value> {
        let mut error = err.body()["error"].take();
        error["status"] = json!(err.status.as_u16());
        vec![json!({
            "index": 0,
            "id_slot": -1,
            "content": "",
            "tokens": [],
            "stop": true,
            "stop_type": "error",
            "stopping_word": "",
            "model": self.fin.model,
            "tokens_predicted": g.completion_tokens,
            "tokens_evaluated": g.prompt_tokens,
            "has_new_line": self.text.contains('\n'),
            "tandem": g.tandem_json(),
            "error": error,
        })]
    }

    fn done_marker(&self) -> bool {
        false
    }
}

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    pub add_special: Option<bool>,
    pub parse_special: Option<bool>,
    pub with_pieces: Option<bool>,
}

/// `POST /tokenize`: `{content, add_special = false, parse_special = true, with_pieces = false}`.
pub(crate) async fn tokenize(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let add_special = req.add_special.unwrap_or(false);
    let parse_special = req.parse_special.unwrap_or(true);
    let ids = params::encode(&state, req.content, add_special, parse_special, "content").await?;
    let tok = &state.tokenizer;
    if !req.with_pieces.unwrap_or(false) {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = tok.token_to_piece(id, true);
            let piece = match String::from_utf8(bytes) {
                Ok(s) => json!(s),
                Err(e) => json!(e.into_bytes()),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<i64>,
}

/// `POST /detokenize`: `{tokens}` → `{content}`; ids outside the vocabulary are a 400.
pub(crate) async fn detokenize(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let mut ids = Vec::with_capacity(req.tokens.len());
    for t in req.tokens {
        let id = u32::try_from(t).map_err(|_| ApiError::invalid("tokens", format!("token id {t} is out of range")))?;
        ids.push(id);
    }
    params::check_ids(&state, &ids, "tokens")?;
    Ok(Json(json!({ "content": state.tokenizer.decode(&ids, true) })))
}

/// `GET /slots` (admin): the engine's numbers.
pub(crate) async fn slots(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = state.engine.stats();
    Json(json!({
        "queued": s.queued,
        "running": s.running,
        "kv_bytes_used": s.kv_bytes_used,
        "kv_bytes_budget": s.kv_bytes_budget,
        "cached_sequences": s.cached_sequences,
        "prefill_tokens_total": s.prefill_tokens_total,
        "decode_tokens_total": s.decode_tokens_total,
        "prefix_hits_total": s.prefix_hits_total,
        "prefix_tokens_reused_total": s.prefix_tokens_reused_total,
        "requests_total": s.requests_total,
        "n_ctx": s.n_ctx,
        "speculative": {
            "steps": s.spec.steps,
            "verify_steps": s.spec.verify_steps,
            "drafted": s.spec.drafted,
            "accepted": s.spec.accepted,
            "acceptance": s.spec.acceptance(),
            "tokens_per_step": s.spec.tokens_per_step(),
        },
    }))
}

/// `POST /admin/cache/flush` (admin): drops every cached conversation.
pub(crate) async fn flush_cache(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({ "flushed": state.engine.flush_cache() }))
}
