//! One generation request on any of the three routes, streamed or not, and what came of it: the status
//! class, whether a stream ended with its final event, time to first token, the text generated.

use std::time::Instant;

use anyhow::Result;
use serde_json::{json, Value};

use super::http::Target;

/// The generation routes the soak drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Route {
    Chat,
    Completions,
    /// llama.cpp's `/completion`.
    Llama,
}

impl Route {
    pub const ALL: [Route; 3] = [Route::Chat, Route::Completions, Route::Llama];

    pub fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Llama => "/completion",
        }
    }
}

/// What the server answered, as the report counts it.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Ok,
    /// A 4xx, with the error's `code` (`-` when the body was not an OpenAI-style JSON error).
    Client {
        status: u16,
        code: String,
    },
    /// 503 `queue_full`: the server shedding load, a correct answer under a burst.
    QueueFull,
    /// Any other 5xx (503s other than `queue_full` included).
    Server {
        status: u16,
        code: String,
    },
    /// No HTTP answer: refused, reset, timed out, malformed.
    Transport,
    /// No HTTP answer to a client that never finished its request and gave up (stalls, idle
    /// connections); `detail` says whether the server closed the connection first.
    NoAnswer,
}

/// One request's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub status: Status,
    /// A 200 stream that ended without its final event, or with an error event.
    pub broken: bool,
    pub ttft: Option<f64>,
    pub total: f64,
    /// The generated text (of a 200).
    pub text: String,
    /// What went wrong, for the report (an error message or a transport error).
    pub detail: Option<String>,
    /// `(prompt tokens, reused tokens)` from the `x-tandem-prompt` header.
    pub prompt: Option<(usize, usize)>,
}

impl Outcome {
    pub fn transport(start: Instant, e: &anyhow::Error) -> Self {
        Outcome {
            status: Status::Transport,
            broken: false,
            ttft: None,
            total: start.elapsed().as_secs_f64(),
            text: String::new(),
            detail: Some(format!("{e:#}")),
            prompt: None,
        }
    }
}

/// The prompt of one request: chat messages, or plain text for the completion routes.
pub enum Prompt<'a> {
    Messages(&'a [Value]),
    Text(&'a str),
}

/// A generation request's parameters.
pub struct Gen<'a> {
    pub route: Route,
    pub prompt: Prompt<'a>,
    pub max_tokens: usize,
    pub temperature: f64,
    pub seed: u64,
    pub stream: bool,
}

impl Gen<'_> {
    pub fn body(&self) -> Value {
        let prompt = match &self.prompt {
            Prompt::Messages(m) => json!(m),
            Prompt::Text(t) => json!(t),
        };
        let mut body = match (self.route, &self.prompt) {
            (Route::Chat, Prompt::Messages(_)) => json!({"messages": prompt}),
            (Route::Chat, Prompt::Text(t)) => json!({"messages": [{"role": "user", "content": t}]}),
            (Route::Completions, _) => json!({"prompt": prompt, "max_tokens": self.max_tokens}),
            (Route::Llama, _) => json!({"prompt": prompt, "n_predict": self.max_tokens, "cache_prompt": true}),
        };
        body["stream"] = json!(self.stream);
        body["temperature"] = json!(self.temperature);
        body["seed"] = json!(self.seed);
        if self.route == Route::Chat {
            body["max_tokens"] = json!(self.max_tokens);
        }
        body
    }
}

/// The text a response (or one stream event) carries on `route`.
pub fn text_of(route: Route, v: &Value, stream: bool) -> Option<&str> {
    match (route, stream) {
        (Route::Chat, true) => v["choices"][0]["delta"]["content"].as_str(),
        (Route::Chat, false) => v["choices"][0]["message"]["content"].as_str(),
        (Route::Completions, _) => v["choices"][0]["text"].as_str(),
        (Route::Llama, _) => v["content"].as_str(),
    }
}

/// `"prompt 120 = 100 reused + 20 read"` → (120, 100).
fn prompt_line(line: &str) -> Option<(usize, usize)> {
    let mut words = line.split_whitespace();
    let total = words.nth(1)?.parse().ok()?;
    let reused = words.nth(1)?.parse().ok()?;
    Some((total, reused))
}

/// The error code and message of an OpenAI-style error body.
fn error_of(v: &Value) -> Option<(String, String)> {
    let e = v.get("error")?;
    let code = e["code"].as_str().unwrap_or("-").to_string();
    let message = e["message"].as_str().unwrap_or("").to_string();
    Some((code, message))
}

/// The status class of a non-200 answer with its body.
pub fn classify(status: u16, body: &[u8]) -> (Status, Option<String>) {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let (code, message) = parsed.as_ref().and_then(error_of).unwrap_or_else(|| {
        (
            "-".into(),
            String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        )
    });
    let detail = Some(format!("{status} {code}: {message}"));
    let class = match status {
        503 if code == "queue_full" => Status::QueueFull,
        400..=499 => Status::Client { status, code },
        _ => Status::Server { status, code },
    };
    (class, detail)
}

/// What to do with a stream once it is open.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// To its end.
    Whole,
    /// Drop the connection after this many text events.
    CutAfter(usize),
}

/// Sends one generation request and reads its answer before `deadline`.
pub fn generate(target: &Target, g: &Gen, reading: Reading, deadline: Instant) -> Outcome {
    let start = Instant::now();
    match generate_inner(target, g, reading, deadline, start) {
        Ok(o) => o,
        Err(e) => Outcome::transport(start, &e),
    }
}

fn generate_inner(target: &Target, g: &Gen, reading: Reading, deadline: Instant, start: Instant) -> Result<Outcome> {
    let body = g.body().to_string();
    let (head, mut reader) = target.send("POST", g.route.path(), body.as_bytes())?;
    let prompt = head.get(tandem_server::PROMPT_HEADER).and_then(prompt_line);
    let mut out = Outcome {
        status: Status::Ok,
        broken: false,
        ttft: None,
        total: 0.0,
        text: String::new(),
        detail: None,
        prompt,
    };
    if head.status != 200 {
        let body = reader.read_all(deadline)?;
        (out.status, out.detail) = classify(head.status, &body);
        out.total = start.elapsed().as_secs_f64();
        return Ok(out);
    }
    if !g.stream {
        let body = reader.read_all(deadline)?;
        let v: Value = serde_json::from_slice(&body)?;
        out.text = text_of(g.route, &v, false).unwrap_or("").to_string();
        out.total = start.elapsed().as_secs_f64();
        return Ok(out);
    }
    let (mut finished, mut events) = (false, 0);
    while let Some(line) = reader.next_line()? {
        if Instant::now() > deadline {
            anyhow::bail!("the stream took longer than the request's time limit");
        }
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            finished = true;
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            out.broken = true;
            out.detail = Some(format!("an event that is not JSON: {data:.120}"));
            continue;
        };
        if let Some((code, message)) = error_of(&v) {
            out.broken = true;
            out.detail = Some(format!("error event {code}: {message}"));
            continue;
        }
        if let Some(t) = text_of(g.route, &v, true).filter(|t| !t.is_empty()) {
            out.ttft.get_or_insert_with(|| start.elapsed().as_secs_f64());
            out.text.push_str(t);
            events += 1;
        }
        if g.route == Route::Llama && v["stop"].as_bool() == Some(true) {
            finished = true;
            break;
        }
        if reading == Reading::CutAfter(events) {
            // Dropping the reader closes the connection mid-stream, as a client going away does.
            out.total = start.elapsed().as_secs_f64();
            return Ok(out);
        }
    }
    if !finished && !out.broken {
        out.broken = true;
        out.detail = Some("the stream ended without its final event".into());
    }
    out.total = start.elapsed().as_secs_f64();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_by_status_and_code() {
        let full = br#"{"error": {"message": "queue full", "type": "server_error", "code": "queue_full"}}"#;
        assert_eq!(classify(503, full).0, Status::QueueFull);
        let other = br#"{"error": {"message": "bye", "code": "shutting_down"}}"#;
        assert!(matches!(classify(503, other).0, Status::Server { status: 503, .. }));
        let bad = br#"{"error": {"message": "no", "code": "invalid_value"}}"#;
        assert_eq!(
            classify(400, bad).0,
            Status::Client {
                status: 400,
                code: "invalid_value".into()
            }
        );
        // A body that is not an OpenAI error has no code.
        assert_eq!(
            classify(408, b"timeout").0,
            Status::Client {
                status: 408,
                code: "-".into()
            }
        );
    }

    #[test]
    fn the_prompt_header_gives_total_and_reused() {
        assert_eq!(prompt_line("prompt 120 = 100 reused + 20 read"), Some((120, 100)));
        assert_eq!(prompt_line("nonsense"), None);
    }
}
