//! The SSE bodies of streaming responses.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::errors::ApiError;
use crate::generate::{End, Generation, Piece, Step};

/// The header every generation response carries: `prompt N = R reused + K read`.
pub const PROMPT_HEADER: &str = "x-tandem-prompt";

/// How a route writes its stream: the JSON of each chunk.
pub trait SseFormat: Send + 'static {
    /// Chunks sent before any text (e.g. the assistant's role).
    fn first(&mut self, _g: &Generation) -> Vec<Value> {
        Vec::new()
    }
    fn piece(&mut self, g: &Generation, piece: Piece) -> Vec<Value>;
    fn end(&mut self, g: &Generation, end: End) -> Vec<Value>;
    /// The last chunks of a generation that failed after the stream started (the engine failed, or
    /// shutdown cut it); by default the error object alone.
    fn failed(&mut self, _g: &Generation, err: ApiError) -> Vec<Value> {
        vec![err.body()]
    }
    /// Whether the stream ends with `data: [DONE]` (OpenAI) or not (llama.cpp).
    fn done_marker(&self) -> bool;
}

struct SseState<F> {
    g: Generation,
    fmt: F,
    queue: VecDeque<SseEvent>,
    done: bool,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// The streaming response of a started generation. The body owns the generation (and with it the engine's
/// receiver), so a client that disconnects cancels the request when hyper drops the body.
pub fn sse_response<F: SseFormat>(g: Generation, mut fmt: F) -> Response {
    let header = HeaderValue::from_str(&g.prompt_cache_line()).ok();
    let queue = fmt.first(&g).iter().map(data).collect();
    let state = SseState {
        g,
        fmt,
        queue,
        done: false,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.done {
                return None;
            }
            let chunks = match st.g.next().await {
                Some(Step::Piece(p)) => st.fmt.piece(&st.g, p),
                Some(Step::End(e)) => {
                    st.done = true;
                    st.fmt.end(&st.g, e)
                }
                Some(Step::Failed(err)) => {
                    st.done = true;
                    st.fmt.failed(&st.g, err)
                }
                None => {
                    st.done = true;
                    st.fmt.failed(&st.g, ApiError::internal("the generation ended early"))
                }
            };
            st.queue.extend(chunks.iter().map(data));
            if st.done && st.fmt.done_marker() {
                st.queue.push_back(SseEvent::default().data("[DONE]"));
            }
        }
    });
    let mut response = Sse::new(stream).keep_alive(KeepAlive::default()).into_response();
    if let Some(h) = header {
        response.headers_mut().insert(PROMPT_HEADER, h);
    }
    response
}
