//! The hostile part of the load: bursts of more concurrent requests than the server queues, clients that
//! send their request a byte at a time and give up, connections left idle; and the greedy canary, whose
//! text must come back the same every time.

use std::io::{Read, Write};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::record::Scenario;
use super::requests::{classify, generate, Gen, Outcome, Prompt, Reading, Route, Status};
use super::Soak;

/// The canary's request: greedy, so its text depends on nothing but the model and the prompt.
const CANARY_PROMPT: &str = "The three primary colors are";
const CANARY_TOKENS: usize = 32;
/// A canary turned away by a full queue is sent again, at most this many times.
const CANARY_TRIES: usize = 5;

/// Sends the canary until it is answered (a 503 `queue_full` is retried); every attempt is logged.
pub fn canary(soak: &Soak) {
    for attempt in 0..CANARY_TRIES {
        let g = Gen {
            route: Route::Completions,
            prompt: Prompt::Text(CANARY_PROMPT),
            max_tokens: CANARY_TOKENS,
            temperature: 0.0,
            seed: 0,
            stream: false,
        };
        let sent = Instant::now();
        let o = generate(&soak.target, &g, Reading::Whole, soak.request_deadline());
        let retry = o.status == Status::QueueFull;
        soak.log.push(Scenario::Canary, Some(g.route), false, sent, o);
        if !retry || attempt + 1 == CANARY_TRIES {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The canary every `canary_every` seconds (the first one is sent before the load starts).
pub fn canaries(soak: &Soak) {
    while soak.sleep_until(Instant::now() + Duration::from_secs_f64(soak.opts.canary_every)) {
        canary(soak);
    }
}

/// Every `burst_every` seconds (the first early, inside the warm-up) a burst of `burst` requests
/// released together; half-way between bursts, the stalled and idle clients.
pub fn chaos(soak: &Soak) {
    let period = Duration::from_secs_f64(soak.opts.burst_every);
    let mut next = Instant::now() + Duration::from_secs(2).min(period / 2);
    let mut round = 0;
    while soak.sleep_until(next) {
        burst(soak, round);
        if !soak.sleep_until(next + period / 2) {
            return;
        }
        stalls(soak);
        next += period;
        round += 1;
    }
}

fn burst(soak: &Soak, round: usize) {
    let n = soak.opts.burst;
    let gate = Barrier::new(n);
    std::thread::scope(|scope| {
        for i in 0..n {
            let gate = &gate;
            scope.spawn(move || {
                let prompt = format!("Burst {round}, request {i}: name a color.");
                let g = Gen {
                    route: Route::ALL[i % 3],
                    prompt: Prompt::Text(&prompt),
                    max_tokens: 8,
                    temperature: 0.8,
                    seed: i as u64,
                    stream: i % 2 == 0,
                };
                gate.wait();
                let sent = Instant::now();
                let o = generate(&soak.target, &g, Reading::Whole, soak.request_deadline());
                soak.log.push(Scenario::Burst, Some(g.route), g.stream, sent, o);
            });
        }
    });
}

/// A client stalling its headers, one stalling its body, and two idle connections, at once.
fn stalls(soak: &Soak) {
    let stall = Duration::from_secs_f64(soak.opts.stall_secs);
    std::thread::scope(|scope| {
        for (scenario, hold) in [
            (Scenario::StallHeaders, stall),
            (Scenario::StallBody, stall),
            (Scenario::Idle, stall * 2),
            (Scenario::Idle, stall * 2),
        ] {
            scope.spawn(move || {
                let sent = Instant::now();
                let o = misbehave(soak, scenario, hold);
                soak.log.push(scenario, None, false, sent, o);
            });
        }
    });
}

/// How long each poll of a misbehaving connection waits for the server.
const TICK: Duration = Duration::from_millis(250);

/// Opens a connection and, for `hold`, drips the request's headers (or, after whole headers, its body)
/// one byte a tick, or sends nothing (idle); then gives up. Notes whether the server answered or closed
/// the connection first.
fn misbehave(soak: &Soak, scenario: Scenario, hold: Duration) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome {
        status: Status::NoAnswer,
        broken: false,
        ttft: None,
        total: 0.0,
        text: String::new(),
        detail: None,
        prompt: None,
    };
    let mut s = match soak.target.connect() {
        Ok(s) => s,
        Err(e) => return Outcome::transport(start, &e),
    };
    let body = br#"{"prompt": "Say hello.", "max_tokens": 2}"#;
    let head = soak
        .target
        .head("POST", Route::Completions.path(), body.len())
        .into_bytes();
    let drip: &[u8] = match scenario {
        Scenario::StallHeaders => &head,
        Scenario::StallBody => {
            if let Err(e) = s.write_all(&head) {
                return Outcome::transport(start, &e.into());
            }
            body
        }
        _ => &[],
    };
    if s.set_read_timeout(Some(TICK)).is_err() {
        return out;
    }
    let mut got = Vec::new();
    let mut sent = 0;
    while start.elapsed() < hold {
        // Never the last byte: the request must stay unfinished.
        if sent + 1 < drip.len() {
            if s.write_all(&drip[sent..sent + 1]).is_err() {
                out.detail = Some(format!(
                    "closed by the server after {:.1} s",
                    start.elapsed().as_secs_f64()
                ));
                break;
            }
            sent += 1;
        }
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => {
                out.detail = Some(format!(
                    "closed by the server after {:.1} s",
                    start.elapsed().as_secs_f64()
                ));
                break;
            }
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.len() > 64 << 10 {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => {
                out.detail = Some(format!(
                    "reset by the server after {:.1} s",
                    start.elapsed().as_secs_f64()
                ));
                break;
            }
        }
    }
    if !got.is_empty() {
        answered(&mut out, &got, start);
    }
    out.total = start.elapsed().as_secs_f64();
    out
}

/// Classifies what the server sent to a stalled client (e.g. a 408).
fn answered(out: &mut Outcome, got: &[u8], start: Instant) {
    let text = String::from_utf8_lossy(got);
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok());
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let when = start.elapsed().as_secs_f64();
    match status {
        Some(status) => {
            let (class, detail) = classify(status, body.as_bytes());
            out.status = class;
            out.detail = detail.map(|d| format!("answered after {when:.1} s: {d}"));
        }
        None => {
            out.status = Status::Transport;
            out.detail = Some(format!(
                "{} bytes that are not an HTTP answer after {when:.1} s",
                got.len()
            ));
        }
    }
}
