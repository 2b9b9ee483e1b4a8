//! OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tandem_tokenizer::ChatMessage;

use crate::errors::{ApiError, ApiJson};
use crate::generate::{Collected, End, GenParams, Generation, Piece, TokenEntry};
use crate::params::{self, SamplingFields, StopField};
use crate::stream::{sse_response, SseFormat, PROMPT_HEADER};
use crate::AppState;

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields both OpenAI routes take.
#[derive(Debug, Deserialize)]
pub struct CommonFields {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub n: Option<u64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StopField>,
    /// Tandem's: speculative decoding for this request.
    pub speculative: Option<params::SpeculativeField>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<InMessage>,
    pub max_completion_tokens: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    #[serde(flatten)]
    pub common: CommonFields,
}

#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Option<MessageContent>,
}

/// A message's content: a string, or parts of which only `text` ones are understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    pub logprobs: Option<usize>,
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub common: CommonFields,
}

/// `prompt`: a string, token ids, or a list of one of those (only one prompt per request).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// What every response and chunk repeats.
#[derive(Clone)]
struct Meta {
    id: String,
    created: u64,
    model: String,
}

impl Meta {
    fn new(state: &AppState, prefix: &str) -> Self {
        Meta {
            id: params::response_id(prefix),
            created: params::unix_time(),
            model: state.config.model_name.clone(),
        }
    }

    fn object(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

fn usage(g: &Generation) -> Value {
    json!({
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": g.reused},
    })
}

fn chat_logprobs(entries: &[TokenEntry]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let top: Vec<Value> = e
                .top
                .iter()
                .map(|(_, bytes, lp)| json!({"token": String::from_utf8_lossy(bytes), "logprob": lp, "bytes": bytes}))
                .collect();
            json!({"token": e.text(), "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// The legacy completions shape: parallel lists, alternatives as `{token: logprob}` maps.
fn completion_logprobs(entries: &[TokenEntry]) -> Value {
    let tops: Vec<Value> = entries
        .iter()
        .map(|e| {
            let map: Map<String, Value> = e
                .top
                .iter()
                .map(|(_, bytes, lp)| (String::from_utf8_lossy(bytes).into_owned(), json!(lp)))
                .collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": entries.iter().map(TokenEntry::text).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": tops,
        "text_offset": entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
    })
}

/// Renders the conversation with the chat template and encodes it; a BOS the template wrote is not doubled.
async fn chat_prompt(state: &AppState, messages: Vec<InMessage>) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut chat = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let content = match m.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t,
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content"),
                                format!(
                                "content parts of type `{kind}` are not supported (only `text` with a `text` field)"
                            ),
                            ))
                        }
                    }
                }
                text
            }
        };
        chat.push(ChatMessage::new(m.role, content));
    }
    let text = state
        .template
        .render(&chat, true)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed: {e}")))?;
    let mut ids = params::encode(state, text, true, true, "messages").await?;
    if let Some(bos) = state.tokenizer.bos() {
        if state.tokenizer.adds_bos() && ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

fn with_header(line: String, body: Value) -> Response {
    ([(PROMPT_HEADER, line)], Json(body)).into_response()
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let c = &req.common;
    params::check_model(&state, c.model.as_deref())?;
    params::check_n(c.n)?;
    let max_tokens = match req.max_completion_tokens {
        Some(n) => params::max_tokens(&state.config, Some(n), "max_completion_tokens")?,
        None => params::max_tokens(&state.config, c.max_tokens, "max_tokens")?,
    };
    let top_logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, n) => Some(params::top_logprobs(n.unwrap_or(0), "top_logprobs")?),
        (false, Some(n)) if n > 0 => {
            return Err(ApiError::invalid("top_logprobs", "top_logprobs needs `logprobs: true`"))
        }
        (false, _) => None,
    };
    let sampling = c.sampling.resolve(
        params::openai_defaults(),
        || state.engine.stats().n_ctx,
        state.tokenizer.n_vocab(),
    )?;
    let stop = params::stop_strings(c.stop.clone())?;
    let speculative = params::speculative(c.speculative.clone(), None, state.config.spec)?;
    let stream = c.stream.unwrap_or(false);
    let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let prompt = chat_prompt(&state, req.messages).await?;
    let gen = GenParams {
        prompt,
        max_tokens,
        sampling,
        stop,
        top_logprobs,
        ignore_eos: false,
        speculative,
    };
    respond::<ChatStream>(&state, gen, stream, include_usage).await
}

/// What differs between the chat and the completions responses; `respond` does the rest.
trait ResponseKind: SseFormat + Sized {
    /// The id prefix (`chatcmpl-…`, `cmpl-…`).
    const ID_PREFIX: &'static str;
    /// The `object` of a whole (not streamed) response.
    const OBJECT: &'static str;
    fn stream(meta: Meta, logprobs: bool, include_usage: bool) -> Self;
    /// The one choice of a whole response.
    fn choice(out: &Collected, logprobs: bool) -> Value;
}

/// Starts the generation, then streams it as SSE or answers with the whole response.
async fn respond<K: ResponseKind>(
    state: &Arc<AppState>,
    gen: GenParams,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let logprobs = gen.top_logprobs.is_some();
    let mut g = Generation::start(state, gen).await?;
    let meta = Meta::new(state, K::ID_PREFIX);
    if stream {
        return Ok(sse_response(g, K::stream(meta, logprobs, include_usage)));
    }
    let out = g.collect().await?;
    let mut body = meta.object(K::OBJECT, json!([K::choice(&out, logprobs)]));
    body["usage"] = usage(&g);
    body["tandem"] = g.tandem_json();
    Ok(with_header(g.prompt_cache_line(), body))
}

impl ResponseKind for ChatStream {
    const ID_PREFIX: &'static str = "chatcmpl";
    const OBJECT: &'static str = "chat.completion";

    fn stream(meta: Meta, logprobs: bool, include_usage: bool) -> Self {
        ChatStream {
            meta,
            logprobs,
            include_usage,
        }
    }

    fn choice(out: &Collected, logprobs: bool) -> Value {
        json!({
            "index": 0,
            "message": {"role": "assistant", "content": out.text},
            "logprobs": if logprobs { chat_logprobs(&out.logprobs) } else { Value::Null },
            "finish_reason": out.reason.finish_reason(),
        })
    }
}

impl ResponseKind for CompletionStream {
    const ID_PREFIX: &'static str = "cmpl";
    const OBJECT: &'static str = "text_completion";

    fn stream(meta: Meta, logprobs: bool, include_usage: bool) -> Self {
        CompletionStream {
            meta,
            logprobs,
            include_usage,
        }
    }

    fn choice(out: &Collected, logprobs: bool) -> Value {
        json!({
            "index": 0,
            "text": out.text,
            "logprobs": if logprobs { completion_logprobs(&out.logprobs) } else { Value::Null },
            "finish_reason": out.reason.finish_reason(),
        })
    }
}

struct ChatStream {
    meta: Meta,
    logprobs: bool,
    include_usage: bool,
}

impl ChatStream {
    fn chunk(&self, delta: Value, logprobs: Option<&[TokenEntry]>, finish: Option<&str>) -> Value {
        let choice = json!({
            "index": 0,
            "delta": delta,
            "logprobs": logprobs.filter(|_| self.logprobs).map_or(Value::Null, chat_logprobs),
            "finish_reason": finish,
        });
        let mut v = self.meta.object("chat.completion.chunk", json!([choice]));
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn content(&self, p: &Piece) -> Option<Value> {
        (!p.text.is_empty() || !p.logprobs.is_empty())
            .then(|| self.chunk(json!({"content": p.text}), Some(&p.logprobs), None))
    }
}

impl SseFormat for ChatStream {
    fn first(&mut self, _g: &Generation) -> Vec<Value> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None, None)]
    }

    fn piece(&mut self, _g: &Generation, p: Piece) -> Vec<Value> {
        self.content(&p).into_iter().collect()
    }

    fn end(&mut self, g: &Generation, end: End) -> Vec<Value> {
        let mut out: Vec<Value> = self.content(&end.tail).into_iter().collect();
        let mut last = self.chunk(json!({}), None, Some(end.reason.finish_reason()));
        last["tandem"] = g.tandem_json();
        out.push(last);
        if self.include_usage {
            let mut u = self.meta.object("chat.completion.chunk", json!([]));
            u["usage"] = usage(g);
            u["tandem"] = g.tandem_json();
            out.push(u);
        }
        out
    }

    fn done_marker(&self) -> bool {
        true
    }
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let c = &req.common;
    params::check_model(&state, c.model.as_deref())?;
    params::check_n(c.n)?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let max_tokens = params::max_tokens(&state.config, c.max_tokens, "max_tokens")?;
    let top_logprobs = req.logprobs.map(|n| params::top_logprobs(n, "logprobs")).transpose()?;
    let sampling = c.sampling.resolve(
        params::openai_defaults(),
        || state.engine.stats().n_ctx,
        state.tokenizer.n_vocab(),
    )?;
    let stop = params::stop_strings(c.stop.clone())?;
    let speculative = params::speculative(c.speculative.clone(), None, state.config.spec)?;
    let stream = c.stream.unwrap_or(false);
    let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let one = |n: usize| {
        (n == 1)
            .then_some(())
            .ok_or_else(|| ApiError::invalid("prompt", format!("only one prompt per request is supported, got {n}")))
    };
    let prompt = match req.prompt {
        PromptField::Text(t) => params::encode(&state, t, true, true, "prompt").await?,
        PromptField::Tokens(ids) => ids,
        PromptField::Texts(mut v) => {
            one(v.len())?;
            params::encode(&state, v.remove(0), true, true, "prompt").await?
        }
        PromptField::TokenLists(mut v) => {
            one(v.len())?;
            v.remove(0)
        }
    };
    params::check_ids(&state, &prompt, "prompt")?;
    let gen = GenParams {
        prompt,
        max_tokens,
        sampling,
        stop,
        top_logprobs,
        ignore_eos: false,
        speculative,
    };
    respond::<CompletionStream>(&state, gen, stream, include_usage).await
}

struct CompletionStream {
    meta: Meta,
    logprobs: bool,
    include_usage: bool,
}

impl CompletionStream {
    fn chunk(&self, p: &Piece, finish: Option<&str>) -> Value {
        let choice = json!({
            "index": 0,
            "text": p.text,
            "logprobs": if self.logprobs { completion_logprobs(&p.logprobs) } else { Value::Null },
            "finish_reason": finish,
        });
        let mut v = self.meta.object("text_completion", json!([choice]));
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

impl SseFormat for CompletionStream {
    fn piece(&mut self, _g: &Generation, p: Piece) -> Vec<Value> {
        vec![self.chunk(&p, None)]
    }

    fn end(&mut self, g: &Generation, end: End) -> Vec<Value> {
        let mut last = self.chunk(&end.tail, Some(end.reason.finish_reason()));
        last["tandem"] = g.tandem_json();
        let mut out = vec![last];
        if self.include_usage {
            let mut u = self.meta.object("text_completion", json!([]));
            u["usage"] = usage(g);
            u["tandem"] = g.tandem_json();
            out.push(u);
        }
        out
    }

    fn done_marker(&self) -> bool {
        true
    }
}

/// `GET /v1/models`.
pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let stats = state.engine.stats();
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "tandem",
            "max_model_len": stats.n_ctx,
            "meta": {"n_ctx": stats.n_ctx, "n_vocab": state.tokenizer.n_vocab()},
        }],
    }))
}
