//! Test harness: a scripted fake engine, a small byte-level BPE tokenizer built in memory, the real server on
//! 127.0.0.1:0, and a minimal HTTP/1.1 client over a plain TcpStream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tandem_engine::serve::{
    EngineHandle, EngineStats, Event, FinishReason, GenerationRequest, RequestTimings, SubmitError, TokenLogprob,
};
use tandem_gguf::{Array, GgufFile, GgufWriter, Value as GgufValue};
use tandem_server::{AppState, ServerConfig};
use tandem_tokenizer::{ChatTemplate, Tokenizer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub const MODEL: &str = "test-model";
pub const BOS: u32 = 0;
pub const IM_END: u32 = 2;
pub const N_CTX: usize = 64;

/// What the fake engine does with the next requests.
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// Tokens to generate, then finish with `Stop`; `None`: echo the prompt (without BOS) over and over.
    pub tokens: Option<Vec<u32>>,
    /// Pause before each token.
    pub delay: Duration,
    /// Pause before `Started` (time in the queue).
    pub queue_delay: Duration,
    /// Reported as `Started::reused`.
    pub reused: usize,
    /// Refuse every submission with this.
    pub refuse: Option<SubmitError>,
    /// After this many tokens, fail the generation with this message (`Event::Failed`).
    pub fail_after: Option<(usize, String)>,
}

#[derive(Default)]
pub struct FakeEngine {
    pub script: Mutex<Script>,
    pub submitted: Mutex<Vec<GenerationRequest>>,
    /// Requests whose receiver was dropped before they finished.
    pub cancelled: AtomicUsize,
    pub running: AtomicUsize,
    pub shutdown_called: AtomicBool,
}

impl FakeEngine {
    pub fn set_script(&self, s: Script) {
        *self.script.lock().unwrap() = s;
    }

    pub fn last_request(&self) -> GenerationRequest {
        self.submitted
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a submitted request")
    }

    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// The fake's generation: tokens at the script's pace until `max_tokens`, a stop id or the script's end;
/// notices a dropped receiver at once, even while pausing.
async fn run(engine: Arc<FakeEngine>, req: GenerationRequest, script: Script, tx: mpsc::UnboundedSender<Event>) {
    let prompt_tokens = req.prompt.len();
    tokio::select! {
        _ = tx.closed() => {}
        _ = tokio::time::sleep(script.queue_delay) => {}
    }
    let _ = tx.send(Event::Started {
        prompt_tokens,
        reused: script.reused.min(prompt_tokens),
        prefill: Default::default(),
    });
    let mut echo: Vec<u32> = req.prompt.iter().copied().filter(|&t| t != BOS).collect();
    if echo.is_empty() {
        echo = req.prompt.clone();
    }
    let mut reason = FinishReason::Length;
    for i in 0..req.max_tokens {
        if let Some((n, msg)) = &script.fail_after {
            if i == *n {
                let _ = tx.send(Event::Failed(msg.clone()));
                engine.running.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        if !script.delay.is_zero() {
            tokio::select! {
                _ = tx.closed() => break,
                _ = tokio::time::sleep(script.delay) => {}
            }
        }
        let id = match &script.tokens {
            Some(t) if i >= t.len() => {
                reason = FinishReason::Stop;
                break;
            }
            Some(t) => t[i],
            None => echo[i % echo.len()],
        };
        let logprob = req.top_logprobs.map(|n| TokenLogprob {
            logprob: -0.25 * (i as f32 + 1.0),
            top: (0..n as u32).map(|k| (id + k, -0.5 * (k as f32 + 1.0))).collect(),
        });
        if tx.send(Event::Token { id, logprob }).is_err() {
            break;
        }
        if req.stop_ids.contains(&id) {
            reason = FinishReason::Stop;
            break;
        }
    }
    if tx.is_closed() {
        engine.cancelled.fetch_add(1, Ordering::SeqCst);
    } else {
        let timings = RequestTimings {
            queued: Duration::from_millis(1),
            ttft: Duration::from_millis(5),
            decode: Duration::from_millis(20),
            completion_tokens: 0,
        };
        let _ = tx.send(Event::Done { reason, timings });
    }
    engine.running.fetch_sub(1, Ordering::SeqCst);
}

/// The engine as the server holds it (an `Arc` to the shared fake).
pub struct Handle(pub Arc<FakeEngine>);

impl EngineHandle for Handle {
    fn submit(&self, req: GenerationRequest) -> Result<mpsc::UnboundedReceiver<Event>, SubmitError> {
        let script = self.0.script.lock().unwrap().clone();
        if let Some(e) = script.refuse.clone() {
            return Err(e);
        }
        if req.prompt.len() > N_CTX {
            return Err(SubmitError::PromptTooLong {
                n_prompt: req.prompt.len(),
                n_ctx: N_CTX,
            });
        }
        if self.0.shutdown_called.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        self.0.submitted.lock().unwrap().push(req.clone());
        self.0.running.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(self.0.clone(), req, script, tx));
        Ok(rx)
    }

    fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.0.running.load(Ordering::SeqCst),
            kv_bytes_budget: 1 << 20,
            n_ctx: N_CTX,
            spec: tandem_engine::spec::SpecStats {
                steps: 10,
                verify_steps: 4,
                drafted: 12,
                accepted: 9,
                emitted: 19,
            },
            ..Default::default()
        }
    }

    fn flush_cache(&self) -> usize {
        3
    }

    fn shutdown(&self) {
        self.0.shutdown_called.store(true, Ordering::SeqCst);
    }
}

/// A byte-level BPE vocabulary: `<s>` (BOS), `<|im_start|>`, `<|im_end|>`, `<|endoftext|>` (EOS), the 256
/// byte tokens and a few merges. `add_bos_token` is on.
pub fn tokenizer() -> Tokenizer {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("tokenizer.ggml.model", "gpt2").unwrap();
    w.add_metadata("tokenizer.ggml.pre", "smollm").unwrap();
    let mut tokens: Vec<String> = ["<s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3, 3, 3, 3];
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    for b in 0u8..=255 {
        let c = if printable(b) {
            char::from(b)
        } else {
            char::from_u32(256 + (0u8..b).filter(|&x| !printable(x)).count() as u32).unwrap()
        };
        tokens.push(c.to_string());
        types.push(1);
    }
    for t in ["ab", "Ġa", "Ġab"] {
        tokens.push(t.into());
        types.push(1);
    }
    let merges = Array::String(vec!["a b".into(), "Ġ a".into(), "Ġa b".into()]);
    w.add_metadata("tokenizer.ggml.merges", merges).unwrap();
    w.add_metadata("tokenizer.ggml.tokens", Array::String(tokens)).unwrap();
    w.add_metadata("tokenizer.ggml.token_type", Array::I32(types)).unwrap();
    w.add_metadata("tokenizer.ggml.bos_token_id", GgufValue::U32(BOS))
        .unwrap();
    w.add_metadata("tokenizer.ggml.eos_token_id", GgufValue::U32(3))
        .unwrap();
    w.add_metadata("tokenizer.ggml.add_bos_token", GgufValue::Bool(true))
        .unwrap();
    let bytes = w.write_all(Vec::new(), |_| &[]).unwrap();
    Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

/// ChatML that writes BOS itself (so the server must not double it).
pub fn template() -> ChatTemplate {
    let src = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
               {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    ChatTemplate::from_source(src, "<s>", "<|endoftext|>").unwrap()
}

pub fn config() -> ServerConfig {
    ServerConfig {
        model_name: MODEL.into(),
        api_keys: Vec::new(),
        admin_keys: Vec::new(),
        max_body_bytes: 4096,
        max_tokens_limit: 100,
        default_max_tokens: 16,
        shutdown_grace: Duration::from_secs(5),
        ..ServerConfig::default()
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub engine: Arc<FakeEngine>,
    pub tokenizer: Tokenizer,
    shutdown: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    pub async fn start(config: ServerConfig, script: Script) -> TestServer {
        let engine = Arc::new(FakeEngine::default());
        engine.set_script(script);
        let tokenizer = tokenizer();
        let state = Arc::new(AppState::new(
            Arc::new(Handle(engine.clone())),
            tokenizer.clone(),
            template(),
            config,
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(tandem_server::serve(listener, state, async move {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            engine,
            tokenizer,
            shutdown: Some(tx),
            task,
        }
    }

    pub async fn open() -> TestServer {
        Self::start(config(), Script::default()).await
    }

    /// Ids of `text` without BOS (one byte-level token per byte, but for the merges).
    pub fn ids(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, false, false)
    }

    pub fn script_text(&self, text: &str, end: Option<u32>) -> Vec<u32> {
        let mut ids = self.ids(text);
        ids.extend(end);
        ids
    }

    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub async fn post(&self, path: &str, body: &str) -> Resp {
        request(self.addr, "POST", path, &[], Some(body)).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.post(path, &body.to_string()).await
    }

    pub async fn get(&self, path: &str) -> Resp {
        request(self.addr, "GET", path, &[], None).await
    }
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("a UTF-8 body")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse(&self) -> Vec<String> {
        sse_events(&self.text())
    }

    /// The SSE payloads that are JSON (all but `[DONE]`).
    pub fn sse_json(&self) -> Vec<Value> {
        self.sse()
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk ({e}): {d}")))
            .collect()
    }

    /// The error object of an OpenAI-style error body, checking its shape.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "body: {}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string(), "error without message: {v}");
        assert!(e["type"].is_string(), "error without type: {v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "error shape: {v}");
        e
    }
}

pub fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.trim_start())
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.unwrap_or_default());
    out
}

pub async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes(method, path, headers, body.map(str::as_bytes)))
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw))
        .await
        .expect("the response within 20 s")
        .unwrap();
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Resp {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Resp { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        let start = nl + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// Opens a streaming request and reads until `n` SSE events arrived; returns the open socket and the bytes.
pub async fn stream_until(addr: SocketAddr, path: &str, body: &Value, n: usize) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    s.write_all(&request_bytes("POST", path, &[], Some(body.as_bytes())))
        .await
        .unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&raw).matches("data:").count() < n {
        let k = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("stream data within 10 s")
            .unwrap();
        assert!(k > 0, "the stream ended early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..k]);
    }
    (s, raw)
}

/// Waits up to `secs` for `cond`.
pub async fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}
