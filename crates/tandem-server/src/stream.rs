//! Stop strings matched on the generated text, and the SSE bodies of streaming responses.

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

/// Finds stop strings in text that arrives in pieces. Text that could be the start of a stop string is held
/// back until it is known not to be one; the stop string itself and whatever follows it are never released.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds text; returns what can be released and, when a stop string was found, which one (the
    /// earliest in the text; nothing is released after it).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), None);
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, word)) = found {
            let word = word.clone();
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, Some(word));
        }
        let cut = self.held.len() - self.partial_suffix();
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, None)
    }

    /// Releases what is held back (the text ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The length of the longest end of the held text that begins some stop string.
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let longest = (s.len() - 1).min(held.len());
            for k in (best + 1..=longest).rev() {
                let at = held.len() - k;
                if self.held.is_char_boundary(at) && s.as_bytes().starts_with(&held[at..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

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

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    /// Feeds the pieces; returns the released text and the stop string found.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (text, word) = m.push(p);
            out.push_str(&text);
            if word.is_some() {
                return (out, word);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn finds_stop_strings_across_pieces() {
        assert_eq!(
            run(&["STOP"], &["ab", "cS", "TO", "Pxyz"]),
            ("abc".into(), Some("STOP".into()))
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some("\n\n".into())));
        // The earliest match wins, whichever stop string it is.
        assert_eq!(run(&["xyz", "b"], &["abxyz"]), ("a".into(), Some("b".into())));
    }

    #[test]
    fn releases_partial_matches_that_fail() {
        assert_eq!(run(&["STOP"], &["ST", "OR", "E"]), ("STORE".into(), None));
        assert_eq!(run(&["STOP"], &["abcST"]), ("abcST".into(), None));
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("abcST"), ("abc".into(), None));
        assert_eq!(m.push("x"), ("STx".into(), None));
    }

    #[test]
    fn multibyte_text_and_stops() {
        assert_eq!(run(&["é!"], &["caf", "é", "!", "x"]), ("caf".into(), Some("é!".into())));
        assert_eq!(
            run(&["日本"], &["日", "x日", "本"]),
            ("日x".into(), Some("日本".into()))
        );
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), None));
        assert_eq!(run(&[], &["abc"]), ("abc".into(), None));
    }
}
