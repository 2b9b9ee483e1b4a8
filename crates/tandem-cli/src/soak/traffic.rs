//! The well-behaved part of the load, and the bad inputs: each client thread loops over short prompts,
//! multi-turn conversations, repeated prompts, streams it drops early and malformed requests, on all three
//! routes, until the soak's end; one more thread sends a long prompt every few seconds.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::record::Scenario;
use super::requests::{classify, generate, text_of, Gen, Outcome, Prompt, Reading, Route, Status};
use super::Soak;

/// A small deterministic generator, so a soak's mix of requests repeats from run to run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi.saturating_sub(lo) as u64 + 1)) as usize
    }

    /// A sampling seed: the routes take a non-negative i64.
    pub fn seed(&mut self) -> u64 {
        self.next() >> 33
    }

    pub fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }

    pub fn route(&mut self) -> Route {
        Route::ALL[self.range(0, 2)]
    }
}

const TOPICS: [&str; 6] = [
    "tell me about the sea",
    "how do bees make honey",
    "describe a quiet morning in a small town",
    "what is a prime number",
    "write two lines about autumn",
    "why is the sky blue",
];

/// Prompts sent again and again, word for word, each always on the same route (`Route::ALL[i]`) so the
/// server's prefix cache can serve it; longer than the 16 tokens the cache needs in common before it
/// reuses a conversation.
const REPEATED: [&str; 3] = [
    "You are a careful assistant who answers briefly and plainly. List three facts about the moon, \
     one per line, without any introduction.",
    "You are a careful assistant who answers briefly and plainly. Explain in one sentence what a \
     compiler does, for a reader who has never programmed.",
    "You are a careful assistant who answers briefly and plainly. Name four rivers of Europe and the \
     sea each one flows into.",
];

/// A prompt of about `words` words, different for each `n` from its first token (so it is read whole,
/// not reused from the cache).
pub fn long_prompt(n: usize, words: usize) -> String {
    let mut s = format!("Document {n}. Summarize it.");
    let mut i = 0;
    while s.split_whitespace().count() < words {
        s.push_str(&format!(" The river {i} runs past the old mill and the quiet town,"));
        i += 1;
    }
    s
}

/// One client: picks a kind of request at random (seeded by `client`) until the soak's end.
pub fn client(soak: &Soak, client: usize) {
    let mut rng = Rng::new(client as u64 + 1);
    let mut i = 0;
    while Instant::now() < soak.deadline {
        i += 1;
        match rng.range(0, 99) {
            0..=39 => {
                let prompt = format!("Client {client}, question {i}: {}.", TOPICS[rng.range(0, 5)]);
                one(soak, &mut rng, Scenario::Short, None, Prompt::Text(&prompt));
            }
            40..=59 => conversation(soak, &mut rng, client, i),
            60..=71 => {
                let k = rng.range(0, 2);
                let route = Some(Route::ALL[k]);
                let prompt = Prompt::Text(REPEATED[k]);
                one(soak, &mut rng, Scenario::Repeat, route, prompt);
            }
            72..=83 => {
                let prompt = format!("Client {client}, story {i}: tell me a long story about a ship.");
                let g = Gen {
                    route: rng.route(),
                    prompt: Prompt::Text(&prompt),
                    max_tokens: soak.short_tokens.max(8),
                    temperature: 0.8,
                    seed: rng.seed(),
                    stream: true,
                };
                let sent = Instant::now();
                let o = generate(&soak.target, &g, Reading::CutAfter(2), soak.request_deadline());
                record(soak, &mut rng, Scenario::Disconnect, g.route, true, sent, o);
            }
            _ => bad_input(soak, &mut rng),
        }
    }
}

/// Logs a client's request; after a 503 `queue_full` the client waits 0.5-1.5 s before its next one, as
/// a real client backs off: one that retried at once would turn a full queue into a flood of 503s.
fn record(soak: &Soak, rng: &mut Rng, scenario: Scenario, route: Route, stream: bool, sent: Instant, o: Outcome) {
    let full = o.status == Status::QueueFull;
    soak.log.push(scenario, Some(route), stream, sent, o);
    if full {
        let pause = Duration::from_millis(rng.range(500, 1500) as u64);
        soak.sleep_until(Instant::now() + pause);
    }
}

/// A short generation on `route` (else a random one) of random length, streamed or not.
fn one(soak: &Soak, rng: &mut Rng, scenario: Scenario, route: Option<Route>, prompt: Prompt) {
    let g = Gen {
        route: route.unwrap_or_else(|| rng.route()),
        prompt,
        max_tokens: rng.range(8, soak.short_tokens.max(8)),
        temperature: 0.8,
        seed: rng.seed(),
        stream: rng.coin(),
    };
    let sent = Instant::now();
    let o = generate(&soak.target, &g, Reading::Whole, soak.request_deadline());
    record(soak, rng, scenario, g.route, g.stream, sent, o);
}

/// Three turns, each extending the one before with the answer and a new question, on one route: chat
/// messages on `/v1/chat/completions`, a growing transcript on the completion routes.
fn conversation(soak: &Soak, rng: &mut Rng, client: usize, i: usize) {
    let route = rng.route();
    let mut messages: Vec<Value> = Vec::new();
    let mut transcript = String::new();
    for turn in 0..3 {
        if Instant::now() >= soak.deadline {
            return;
        }
        let question = format!("Client {client}, chat {i}, turn {turn}: {}?", TOPICS[rng.range(0, 5)]);
        messages.push(json!({"role": "user", "content": question}));
        transcript.push_str(&format!("User: {question}\nAssistant:"));
        let prompt = match route {
            Route::Chat => Prompt::Messages(&messages),
            _ => Prompt::Text(&transcript),
        };
        let g = Gen {
            route,
            prompt,
            max_tokens: rng.range(8, soak.short_tokens.max(8)),
            temperature: 0.8,
            seed: rng.seed(),
            stream: rng.coin(),
        };
        let sent = Instant::now();
        let o = generate(&soak.target, &g, Reading::Whole, soak.request_deadline());
        let ok = o.status == Status::Ok && !o.broken;
        let answer = o.text.clone();
        let scenario = if turn == 0 { Scenario::Short } else { Scenario::FollowUp };
        record(soak, rng, scenario, route, g.stream, sent, o);
        if !ok {
            return;
        }
        messages.push(json!({"role": "assistant", "content": answer}));
        transcript.push_str(&format!("{answer}\n"));
    }
}

/// A request the server must refuse with a 4xx JSON error (or, for an unknown field, may accept).
fn bad_input(soak: &Soak, rng: &mut Rng) {
    let kind = [
        Scenario::BadJson,
        Scenario::NegativeTemperature,
        Scenario::UnknownField,
        Scenario::HugeMaxTokens,
    ][rng.range(0, 3)];
    // llama.cpp samples greedily at a negative temperature, so only the OpenAI routes must refuse it.
    let route = match kind {
        Scenario::NegativeTemperature => [Route::Chat, Route::Completions][rng.range(0, 1)],
        _ => rng.route(),
    };
    let good = Gen {
        route,
        prompt: Prompt::Text("Say hello."),
        max_tokens: 2,
        temperature: 0.8,
        seed: rng.seed(),
        stream: false,
    };
    let mut body = good.body();
    let text = match kind {
        Scenario::BadJson => {
            let s = body.to_string();
            s.chars().take(s.chars().count() / 2).collect()
        }
        Scenario::NegativeTemperature => {
            body["temperature"] = json!(-1.0);
            body.to_string()
        }
        Scenario::UnknownField => {
            body["definitely_not_a_field"] = json!({"x": [1, 2, 3]});
            body.to_string()
        }
        _ => {
            let field = if route == Route::Llama {
                "n_predict"
            } else {
                "max_tokens"
            };
            body[field] = json!(1_000_000_000u64);
            body.to_string()
        }
    };
    let sent = Instant::now();
    let o = raw(soak, route, &text);
    record(soak, rng, kind, route, false, sent, o);
}

/// Posts `body` as is to `route`, not streamed.
fn raw(soak: &Soak, route: Route, body: &str) -> Outcome {
    let start = Instant::now();
    match soak
        .target
        .exchange("POST", route.path(), body.as_bytes(), soak.request_deadline())
    {
        Err(e) => Outcome::transport(start, &e),
        Ok((head, bytes)) => {
            let mut o = Outcome {
                status: Status::Ok,
                broken: false,
                ttft: None,
                total: start.elapsed().as_secs_f64(),
                text: String::new(),
                detail: None,
                prompt: None,
            };
            if head.status == 200 {
                let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                o.text = text_of(route, &v, false).unwrap_or("").to_string();
            } else {
                (o.status, o.detail) = classify(head.status, &bytes);
            }
            o
        }
    }
}

/// A long prompt every `long_every` seconds, streamed, on a route taken in turn.
pub fn long_prompts(soak: &Soak) {
    let mut n = 0;
    while soak.sleep_until(Instant::now() + Duration::from_secs_f64(soak.long_every)) {
        n += 1;
        let prompt = long_prompt(n, soak.long_words);
        let g = Gen {
            route: Route::ALL[n % 3],
            prompt: Prompt::Text(&prompt),
            max_tokens: 16,
            temperature: 0.8,
            seed: n as u64,
            stream: true,
        };
        let sent = Instant::now();
        let o = generate(&soak.target, &g, Reading::Whole, soak.request_deadline());
        soak.log.push(Scenario::Long, Some(g.route), true, sent, o);
    }
}
