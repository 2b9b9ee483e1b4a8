//! `tandem serve` with the real Gemma 3 model, over HTTP on a loopback port: both OpenAI routes streamed
//! and not, concurrent clients equal to the same requests alone, a dropped stream freeing its KV, bad
//! inputs answered with their status while the server keeps serving, auth, graceful shutdown; and a
//! synthesized mixture of experts under the same scheduler, prefix cache and KV budget.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

use common::{serve, Server};

fn start(extra: &[&str]) -> Server {
    start_model("gemma3-270m", extra)
}

fn start_model(model: &str, extra: &[&str]) -> Server {
    let mut args: Vec<String> = ["-m", model, "--ctx", "2048", "--max-body-bytes", "64K"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    serve(&args, |port| {
        matches!(try_http(port, "GET", "/health", None, ""), Ok((200, _)))
    })
}

/// One HTTP/1.1 request; returns (status, body).
fn http(port: u16, method: &str, path: &str, key: Option<&str>, body: &str) -> (u16, String) {
    try_http(port, method, path, key, body).unwrap()
}

fn try_http(port: u16, method: &str, path: &str, key: Option<&str>, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    // The whole request in one write, rather than one small write per formatted piece.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn post(port: u16, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = http(port, "POST", path, None, &body.to_string());
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The concatenated text of an SSE stream, and whether it ended with [DONE].
fn sse_text(body: &str) -> (String, bool) {
    let mut text = String::new();
    let mut done = false;
    for line in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap();
        let c = &v["choices"][0];
        text.push_str(c["text"].as_str().or(c["delta"]["content"].as_str()).unwrap_or(""));
    }
    (text, done)
}

fn greedy(prompt: &str, n: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": n, "temperature": 0})
}

fn metric(port: u16, name: &str) -> f64 {
    let (_, text) = http(port, "GET", "/metrics", None, "");
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[test]
fn serves_gemma_over_http() {
    let server = start(&[]);
    let port = server.port;

    // Both routes, plain and streamed, agree with each other.
    let (status, plain) = post(port, "/v1/completions", greedy("The capital of France is", 12));
    assert_eq!(status, 200, "{plain}");
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.starts_with(" the capital of"), "{text:?}");
    assert_eq!(plain["usage"]["completion_tokens"], 12);
    let mut streamed = greedy("The capital of France is", 12);
    streamed["stream"] = json!(true);
    let (status, body) = http(port, "POST", "/v1/completions", None, &streamed.to_string());
    assert_eq!(status, 200);
    let (stext, done) = sse_text(&body);
    assert!(done, "stream ends with [DONE]");
    assert_eq!(stext, text);
    let chat = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0});
    let (status, reply) = post(port, "/v1/chat/completions", chat.clone());
    assert_eq!(status, 200, "{reply}");
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let (_, body) = http(port, "POST", "/v1/chat/completions", None, &chat_stream.to_string());
    let (chat_text, done) = sse_text(&body);
    assert!(done);
    assert_eq!(chat_text, reply["choices"][0]["message"]["content"].as_str().unwrap());
    // Every response says how its prompt was served (reused from the cache + read).
    assert!(
        reply["tandem"]["prompt_cache"].as_str().unwrap().starts_with("prompt "),
        "{reply}"
    );

    // Eight concurrent clients get what each gets alone (greedy, bit-identical logits).
    let prompts = [
        "Once upon a time",
        "fn main() {",
        "The sky is",
        "Water boils at",
        "1, 2, 3,",
        "Dear Sir,",
        "import numpy",
        "Rust is",
    ];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| post(port, "/v1/completions", greedy(p, 16)).1["choices"][0]["text"].to_string())
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let body = greedy(p, 16);
            std::thread::spawn(move || post(port, "/v1/completions", body).1["choices"][0]["text"].to_string())
        })
        .collect();
    let together: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(alone, together);

    // A client that drops its stream frees the sequence's KV (visible in /metrics).
    let kv_before = metric(port, "tandem_kv_cache_bytes_used");
    let mut long = greedy("Write a very long story about a dragon.", 1000);
    long["stream"] = json!(true);
    let body = long.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut events = 0;
    let mut line = String::new();
    while events < 3 && reader.read_line(&mut line).unwrap() > 0 {
        if line.starts_with("data: ") {
            events += 1;
        }
        line.clear();
    }
    assert_eq!(metric(port, "tandem_requests_running"), 1.0);
    let kv_during = metric(port, "tandem_kv_cache_bytes_used");
    assert!(
        kv_during > kv_before,
        "the running stream holds KV: {kv_before} → {kv_during}"
    );
    drop(reader);
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(port, "tandem_requests_running") != 0.0 {
        assert!(Instant::now() < deadline, "the dropped stream still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        metric(port, "tandem_kv_cache_bytes_used"),
        kv_before,
        "its KV is freed, not cached"
    );

    // Bad inputs get their status, and the server keeps serving.
    let cases: Vec<(&str, String, u16)> = vec![
        ("/v1/completions", "{not json".into(), 400),
        ("/v1/completions", json!({"prompt": 5}).to_string(), 400),
        (
            "/v1/completions",
            json!({"prompt": "x", "model": "no-such-model"}).to_string(),
            404,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x ".repeat(3000), "max_tokens": 1}).to_string(),
            400,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 100000}).to_string(),
            400,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(70_000)}).to_string(),
            413,
        ),
        ("/v1/chat/completions", json!({"messages": "hi"}).to_string(), 400),
    ];
    for (path, body, want) in cases {
        let (status, text) = http(port, "POST", path, None, &body);
        assert_eq!(status, want, "{path} {}: {text}", &body[..body.len().min(60)]);
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(
            v["error"]["message"].is_string(),
            "OpenAI-style error for {path}: {text}"
        );
    }
    let (status, text) = http(
        port,
        "POST",
        "/v1/completions",
        None,
        &json!({"prompt": "x ".repeat(3000), "max_tokens": 1}).to_string(),
    );
    assert!(
        status == 400 && text.contains("2048"),
        "prompt-too-long names the context: {text}"
    );
    assert_eq!(
        post(port, "/v1/completions", greedy("The capital of France is", 12)).1["choices"][0]["text"].as_str(),
        Some(text_of(&plain))
    );
}

fn text_of(v: &Value) -> &str {
    v["choices"][0]["text"].as_str().unwrap()
}

#[test]
fn auth_and_admin_keys() {
    let server = start(&["--api-key", "k1", "--admin-key", "boss"]);
    let port = server.port;
    assert_eq!(http(port, "GET", "/health", None, "").0, 200, "health needs no key");
    assert_eq!(http(port, "GET", "/v1/models", None, "").0, 401);
    assert_eq!(http(port, "GET", "/v1/models", Some("wrong"), "").0, 401);
    assert_eq!(http(port, "GET", "/v1/models", Some("k1"), "").0, 200);
    let body = greedy("Hi", 2).to_string();
    assert_eq!(http(port, "POST", "/v1/completions", Some("k1"), &body).0, 200);
    assert_eq!(
        http(port, "GET", "/slots", Some("k1"), "").0,
        403,
        "an API key is no admin key"
    );
    assert_eq!(http(port, "GET", "/slots", None, "").0, 401);
    assert_eq!(http(port, "GET", "/slots", Some("boss"), "").0, 200);
    assert_eq!(http(port, "POST", "/admin/cache/flush", Some("boss"), "").0, 200);
}

/// A mixture of experts (a synthesized Qwen3-MoE) under the ordinary scheduler: concurrent requests
/// batched into one pass get what each gets alone (the routing of a row depends on that row only), a
/// repeated prompt reuses its cached KV and gives the same reply, and a KV budget too small for a
/// request refuses it with a 4xx while the server keeps serving.
#[test]
fn serves_a_mixture_of_experts() {
    let model = common::reference_model("qwen3moe-tiny-skewed");
    let path = common::scratch("serve-moe").join("qwen3moe.gguf");
    common::synth(&common::synth_args(&model), &path);
    let server = start_model(path.to_str().unwrap(), &["--kv-budget", "1M"]);
    let port = server.port;

    let prompts = [
        "Once upon a time",
        "fn main() {",
        "The sky is",
        "1, 2, 3,",
        "Dear Sir,",
        "Rust is",
    ];
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| post(port, "/v1/completions", greedy(p, 24)).1)
        .collect();
    for reply in &alone {
        assert_eq!(reply["usage"]["completion_tokens"], 24, "{reply}");
    }
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let body = greedy(p, 24);
            std::thread::spawn(move || post(port, "/v1/completions", body).1)
        })
        .collect();
    let together: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (a, t) in alone.iter().zip(&together) {
        assert_eq!(text_of(a), text_of(t), "batched with others, a reply must not change");
    }

    let long = "The quick brown fox jumps over the lazy dog. ".repeat(6);
    let (status, first) = post(port, "/v1/completions", greedy(&long, 8));
    assert_eq!(status, 200, "{first}");
    let (_, again) = post(port, "/v1/completions", greedy(&long, 8));
    assert_eq!(text_of(&first), text_of(&again));
    let line = again["tandem"]["prompt_cache"].as_str().unwrap().to_string();
    let reused: usize = line
        .split(" = ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let total: usize = line.split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(
        reused + 1,
        total,
        "a repeated prompt reuses all but its last token: {line}"
    );

    // 1 MB of KV holds about 1,000 tokens of this model (its context is 512); three requests that
    // can reach 450 cannot all run at once, and none of them may fail for KV space once admitted.
    let big: Vec<_> = (0..3)
        .map(|i| {
            let body = greedy(&format!("{i} {}", "x y ".repeat(50)), 250);
            std::thread::spawn(move || post(port, "/v1/completions", body))
        })
        .collect();
    for h in big {
        let (status, reply) = h.join().unwrap();
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["usage"]["completion_tokens"], 250, "{reply}");
    }
    assert_eq!(
        text_of(&post(port, "/v1/completions", greedy(prompts[0], 24)).1),
        text_of(&alone[0])
    );
    std::fs::remove_file(&path).ok();
}

/// `serve --spec draft --draft-model` (the real Gemma 3 drafting for itself): greedy replies equal
/// a plain server's on every route's spelling of the setting, the drafts show in `/metrics`.
#[test]
fn serves_with_a_draft_model() {
    let plain = start(&[]);
    let spec = start(&["--spec", "draft", "--draft-model", "gemma3-270m", "--draft-max", "4"]);
    let prompt = "The GNU General Public License is a free, copyleft license for software and other kinds of \
                  works. The licenses for most software and other practical works are designed to take away";
    let (_, want) = post(plain.port, "/v1/completions", greedy(prompt, 24));
    for body in [
        greedy(prompt, 24),
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "speculative": {"mode": "lookup"}}),
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "speculative": {"mode": "off"}}),
    ] {
        let (status, got) = post(spec.port, "/v1/completions", body.clone());
        assert_eq!(status, 200, "{got}");
        assert_eq!(text_of(&got), text_of(&want), "{body}");
    }
    assert!(metric(spec.port, "tandem_spec_drafted_tokens_total") > 0.0);
    assert_eq!(
        metric(spec.port, "tandem_spec_acceptance_rate"),
        1.0,
        "a model agrees with itself"
    );
    let (status, reply) = post(
        plain.port,
        "/v1/completions",
        json!({"prompt": prompt, "speculative": {"mode": "draft"}}),
    );
    assert_eq!(status, 400, "no draft model: {reply}");
}
