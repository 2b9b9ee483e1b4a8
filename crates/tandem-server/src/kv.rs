//! Disaggregated prefill over HTTP (`docs/KV-WIRE.md`): a prefill node's `POST /v1/kv/prefill`, which
//! reads a prompt and streams its KV as it is produced, and a decode node's client for it
//! ([`PeerClient`]), which checks every frame and hands the rows to the engine. Both sides use the
//! server's own hyper stack and the API's bearer keys: the client speaks HTTP/2 with prior knowledge
//! (the server takes it beside HTTP/1.1, `conn.rs`), one connection per peer, a stream per transfer.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use tandem_engine::serve::{Event, KvBacklog, PrefillPeers, RemoteMsg};
use tandem_model::kv::wire::{self, Decoder, Encoder, Frame, Hello};
use tokio::sync::mpsc;

use crate::errors::{ApiError, ApiJson};
use crate::{AppState, Metrics};

/// The media type of a KV stream.
pub const KV_MEDIA_TYPE: &str = "application/x-tandem-kv";

/// What a prefill node tells decode nodes about its model.
#[derive(Clone, Debug)]
pub struct KvIdentity {
    pub fingerprint: [u8; 32],
    pub n_layers: usize,
    /// Values per KV row.
    pub width: usize,
}

#[derive(Deserialize)]
pub(crate) struct KvRequest {
    version: u32,
    fingerprint: String,
    tokens: Vec<u32>,
    /// The first row to send: the decode node holds `0..from` (a continued conversation).
    #[serde(default)]
    from: usize,
}

/// `POST /v1/kv/prefill`: 404 unless this is a prefill node; 409 for another model.
pub(crate) async fn prefill(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<KvRequest>,
) -> Result<Response, ApiError> {
    let Some(id) = state.config.kv_export.clone() else {
        return Err(ApiError::not_found(
            "this server is not a prefill node (--role prefill)",
        ));
    };
    if req.version != wire::VERSION {
        return Err(ApiError::invalid(
            "version",
            format!(
                "KV wire version {}, this node speaks only {} (both nodes must speak the same)",
                req.version,
                wire::VERSION
            ),
        ));
    }
    let (from, to) = (req.from, req.tokens.len());
    if from >= to {
        return Err(ApiError::invalid(
            "from",
            format!("the stream would start at row {from} of {to}: nothing to send"),
        ));
    }
    let ours = wire::hex(&id.fingerprint);
    if !req.fingerprint.eq_ignore_ascii_case(&ours) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            format!(
                "model mismatch: this node serves fingerprint {ours}, the request is for {}",
                req.fingerprint
            ),
        )
        .with_code("model_mismatch"));
    }
    let export = state.engine.export_kv(req.tokens, from)?;
    let (enc, head) = Encoder::start(&Hello {
        version: wire::VERSION,
        fingerprint: id.fingerprint,
        n_layers: id.n_layers,
        width: id.width,
        from,
        to,
    });
    let export = Export {
        rx: export.events,
        backlog: export.backlog,
        enc: Some(enc),
        pending: Bytes::from(head),
        counted: false,
        pacer: state.config.kv_send_rate.map(Pacer::new),
        state: state.clone(),
    };
    let body = futures_util::stream::unfold(export, |mut export| async move {
        let bytes = export.next().await?;
        Some((Ok::<_, Infallible>(bytes), export))
    });
    Ok(([(CONTENT_TYPE, KV_MEDIA_TYPE)], Body::from_stream(body)).into_response())
}

/// A KV stream on its way out: the engine's rows encoded as they come, let go at the link's pace. When
/// the client goes away the body is dropped with `rx`, and the engine drops the export's sequence.
struct Export {
    rx: mpsc::UnboundedReceiver<Event>,
    /// The export's send buffer: `pending` and the rows in `rx` are queued in it until handed on.
    backlog: Arc<KvBacklog>,
    /// `None` once the last frame (`End` or `Error`) is encoded.
    enc: Option<Encoder>,
    /// Encoded bytes not yet handed to the connection.
    pending: Bytes,
    /// `pending` is a `Rows` frame, whose bytes the engine counted in `backlog`.
    counted: bool,
    pacer: Option<Pacer>,
    state: Arc<AppState>,
}

impl Export {
    /// The next bytes to send, `None` after the last frame. Paced, a frame goes out in slices, each once
    /// the capped link would have carried it; the engine is never waited on by the pacing (its events
    /// queue in `rx` meanwhile, up to the send buffer: `KvBacklog`).
    async fn next(&mut self) -> Option<Bytes> {
        while self.pending.is_empty() {
            let mut enc = self.enc.take()?;
            self.counted = false;
            let bytes = match self.rx.recv().await {
                Some(Event::KvRows(rows)) => {
                    let bytes = enc.rows(&rows);
                    self.enc = Some(enc);
                    self.counted = true;
                    bytes
                }
                Some(Event::Done { .. }) => enc.end(),
                Some(Event::Failed(msg)) => Encoder::error(&msg),
                Some(_) => {
                    self.enc = Some(enc);
                    continue;
                }
                None => Encoder::error("the engine dropped the export"),
            };
            self.pending = Bytes::from(bytes);
        }
        let out = match &mut self.pacer {
            Some(pacer) => {
                let slice = self.pending.split_to(self.pending.len().min(PACE_SLICE));
                tokio::time::sleep_until(pacer.reserve(slice.len()).into()).await;
                slice
            }
            None => std::mem::take(&mut self.pending),
        };
        if self.counted {
            self.backlog.sent(out.len());
        }
        Metrics::inc(&self.state.metrics.kv_sent_bytes, out.len() as u64);
        Some(out)
    }
}

/// The most bytes a paced stream lets go at once: at 1 Gbit/s half a millisecond of the link.
const PACE_SLICE: usize = 64 << 10;

/// How far behind its schedule the link may fall and still catch up at full speed. Timer wake-ups come
/// late (tokio's by up to a millisecond), and without slack every late one would slow the link down; the
/// price is that a link idle this long may send this much of its rate at once.
const PACE_SLACK: Duration = Duration::from_millis(2);

/// A sender-side rate cap (`--kv-send-rate`), so that loopback stands for a real link: a token bucket
/// whose depth is `PACE_SLACK` of the rate.
struct Pacer {
    bytes_per_second: f64,
    /// When the link has carried every byte let go so far.
    free_at: Instant,
}

impl Pacer {
    fn new(bits_per_second: u64) -> Self {
        Pacer {
            bytes_per_second: bits_per_second as f64 / 8.0,
            free_at: Instant::now(),
        }
    }

    /// When the link has carried `n` more bytes, queued now: when they may go out.
    fn reserve(&mut self, n: usize) -> Instant {
        let now = Instant::now();
        let start = self.free_at.max(now.checked_sub(PACE_SLACK).unwrap_or(now));
        self.free_at = start + Duration::from_secs_f64(n as f64 / self.bytes_per_second);
        self.free_at
    }
}

/// A prefill peer: `http://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub host: String,
    pub port: u16,
}

impl Peer {
    pub fn parse(url: &str) -> Result<Peer, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: a prefill peer is an http:// URL"))?;
        let authority = rest.trim_end_matches('/');
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| format!("{url:?}: name the port (http://host:port)"))?;
        let port = port.parse().map_err(|_| format!("{url:?}: bad port {port:?}"))?;
        if host.is_empty() || host.contains('/') {
            return Err(format!("{url:?}: bad host"));
        }
        Ok(Peer {
            host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            port,
        })
    }
}

/// A decode node's client of its prefill peers, taken in turn.
pub struct PeerClient {
    peers: Vec<Arc<PeerConn>>,
    next: AtomicUsize,
    key: Option<String>,
    fingerprint: [u8; 32],
    timeout: Duration,
    runtime: tokio::runtime::Handle,
    received: Arc<AtomicU64>,
}

impl PeerClient {
    /// `timeout` bounds a whole transfer, from the connect to the last frame; `received` counts the KV
    /// stream bytes read (`Metrics::kv_received_bytes`).
    pub fn new(
        peers: Vec<Peer>,
        key: Option<String>,
        fingerprint: [u8; 32],
        timeout: Duration,
        runtime: tokio::runtime::Handle,
        received: Arc<AtomicU64>,
    ) -> Self {
        assert!(!peers.is_empty(), "a decode node needs a prefill peer");
        PeerClient {
            peers: peers
                .into_iter()
                .map(|peer| {
                    Arc::new(PeerConn {
                        peer,
                        sender: Mutex::new(None),
                    })
                })
                .collect(),
            next: AtomicUsize::new(0),
            key,
            fingerprint,
            timeout,
            runtime,
            received,
        }
    }
}

type Wake = Arc<dyn Fn() + Send + Sync>;
type Failure = (&'static str, String);

impl PrefillPeers for PeerClient {
    /// Starts at the next peer in turn; a peer that fails before any of its rows reached the engine
    /// (unreachable, refused, another model: nothing was installed) gives way to the next, each peer
    /// tried once. A failure after rows came ends the fetch: the detached cache holds that peer's rows.
    /// `timeout` bounds all the tries together, as the request waits on all of them.
    fn fetch(&self, tokens: Vec<u32>, from: usize, wake: Wake) -> mpsc::Receiver<RemoteMsg> {
        let (tx, rx) = mpsc::channel(64);
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let conns: Vec<Arc<PeerConn>> = (0..self.peers.len())
            .map(|k| self.peers[(first + k) % self.peers.len()].clone())
            .collect();
        let (key, fingerprint, timeout) = (self.key.clone(), self.fingerprint, self.timeout);
        let received = self.received.clone();
        self.runtime.spawn(async move {
            let tries = async {
                for (k, conn) in conns.iter().enumerate() {
                    let mut installed = false;
                    let fetched = fetch(
                        conn,
                        key.clone(),
                        fingerprint,
                        (tokens.clone(), from),
                        (&tx, &wake, &mut installed),
                        &received,
                    )
                    .await;
                    let Err((cause, detail)) = fetched else { return None };
                    let peer = &conn.peer;
                    let detail = format!("{}:{}: {detail}", peer.host, peer.port);
                    if installed || k + 1 == conns.len() {
                        return Some((cause, detail));
                    }
                    if tx.send(RemoteMsg::Retry { cause, detail }).await.is_err() {
                        return None;
                    }
                    wake();
                }
                None
            };
            let failure = match tokio::time::timeout(timeout, tries).await {
                Ok(failure) => failure,
                Err(_) => Some(("timeout", format!("no whole stream within {timeout:?}"))),
            };
            if let Some((cause, detail)) = failure {
                let _ = tx.send(RemoteMsg::Failed { cause, detail }).await;
                wake();
            }
        });
        rx
    }
}

/// HTTP/2 flow-control windows the client grants a peer: a stream may send this much ahead of what the
/// engine took (h2's default of 64 KiB would hold a transfer to a window per round trip), the
/// connection this much over all its streams.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;
/// The largest DATA frame the client accepts: fewer frames (9 bytes of framing each) than h2's 16 KiB.
const MAX_FRAME: u32 = 256 << 10;

/// How long a TCP connect to a peer may take before the peer counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One prefill peer and the HTTP/2 connection to it, kept between transfers (each one stream).
struct PeerConn {
    peer: Peer,
    /// `None` before the first transfer and after the connection failed.
    sender: Mutex<Option<http2::SendRequest<String>>>,
}

impl PeerConn {
    /// The kept connection while it is open (a peer that closed it idle, or died, is connected again).
    fn kept(&self) -> Option<http2::SendRequest<String>> {
        let mut kept = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.as_ref().is_some_and(|s| s.is_closed()) {
            *kept = None;
        }
        kept.clone()
    }

    async fn connect(&self) -> Result<http2::SendRequest<String>, String> {
        let peer = &self.peer;
        // A peer that drops SYNs would otherwise hold the transfer to the whole --prefill-timeout and
        // leave the next peer no time.
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((peer.host.as_str(), peer.port)),
        )
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender.clone());
        Ok(sender)
    }

    /// Sends `request()` on the kept connection, or on a new one when there is none or the kept one
    /// fails before the response head (the peer may have closed it just now): a failure on a new
    /// connection is the peer's being unreachable.
    async fn send(
        &self,
        request: impl Fn() -> Result<Request<String>, Failure>,
    ) -> Result<Response<Incoming>, Failure> {
        if let Some(mut sender) = self.kept() {
            if sender.ready().await.is_ok() {
                if let Ok(response) = sender.send_request(request()?).await {
                    return Ok(response);
                }
            }
        }
        let unreachable = |e: String| ("unreachable", e);
        let mut sender = self.connect().await.map_err(unreachable)?;
        sender.ready().await.map_err(|e| unreachable(e.to_string()))?;
        sender
            .send_request(request()?)
            .await
            .map_err(|e| unreachable(e.to_string()))
    }
}

/// One transfer: the request, then every frame checked and passed on; `Ok` once `Done` was sent (or the
/// engine no longer listens). `installed` is set once a message went to the engine.
async fn fetch(
    conn: &PeerConn,
    key: Option<String>,
    fingerprint: [u8; 32],
    (tokens, from): (Vec<u32>, usize),
    (tx, wake, installed): (&mpsc::Sender<RemoteMsg>, &Wake, &mut bool),
    received: &AtomicU64,
) -> Result<(), Failure> {
    let peer = &conn.peer;
    let to = tokens.len();
    let body = serde_json::json!({
        "version": wire::VERSION,
        "fingerprint": wire::hex(&fingerprint),
        "tokens": tokens,
        "from": from,
    })
    .to_string();
    let authority = if peer.host.contains(':') {
        format!("[{}]:{}", peer.host, peer.port)
    } else {
        format!("{}:{}", peer.host, peer.port)
    };
    let uri = format!("http://{authority}/v1/kv/prefill");
    let request = || {
        let mut request = Request::post(&uri).header(CONTENT_TYPE, "application/json");
        if let Some(key) = &key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        request.body(body.clone()).map_err(|e| ("protocol", e.to_string()))
    };
    let response = conn.send(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    if status != StatusCode::OK {
        let mut text = Vec::new();
        while let Some(Ok(frame)) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            if let Ok(data) = frame.into_data() {
                text.extend_from_slice(&data);
            }
            if text.len() > 4096 {
                break;
            }
        }
        let cause = if status == StatusCode::CONFLICT {
            "identity"
        } else {
            "refused"
        };
        return Err((cause, format!("{status}: {}", String::from_utf8_lossy(&text))));
    }
    let mut decoder = Decoder::new(fingerprint);
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| ("dropped", e.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        received.fetch_add(data.len() as u64, Ordering::Relaxed);
        decoder.push(&data);
        while let Some(f) = decoder.next_frame().map_err(|e| (e.cause(), e.to_string()))? {
            let msg = match f {
                Frame::Hello(h) if (h.from, h.to) != (from, to) => {
                    return Err((
                        "protocol",
                        format!("the stream fills positions {}..{}, not {from}..{to}", h.from, h.to),
                    ));
                }
                Frame::Hello(_) => continue,
                Frame::Rows(rows) => RemoteMsg::Rows(Box::new(rows)),
                Frame::End => RemoteMsg::Done,
                Frame::Error(m) => return Err(("refused", m)),
            };
            let done = matches!(msg, RemoteMsg::Done);
            *installed = true;
            if tx.send(msg).await.is_err() {
                return Ok(());
            }
            wake();
            if done {
                return Ok(());
            }
        }
    }
    decoder.finish().map_err(|e| (e.cause(), e.to_string()))?;
    Err(("dropped", "the stream closed after its end frame was read".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_keeps_to_its_rate_and_banks_only_its_slack() {
        // 8 Mbit/s: a megabyte a second.
        let mut pacer = Pacer::new(8_000_000);
        let t0 = pacer.free_at;
        let after = |at: Instant| at.duration_since(t0).as_secs_f64();
        let first = pacer.reserve(500_000);
        assert!((0.499..0.51).contains(&after(first)), "{}", after(first));
        // Queued behind the first: the link is busy until then.
        let second = pacer.reserve(250_000);
        assert!((after(second) - after(first) - 0.25).abs() < 1e-9);
        // A link idle long since has banked no more than its slack.
        let mut idle = Pacer::new(8_000_000);
        idle.free_at = Instant::now() - Duration::from_secs(10);
        let now = Instant::now();
        let at = idle.reserve(1_000_000);
        assert!(at >= now + Duration::from_secs(1) - PACE_SLACK, "{:?}", at - now);
    }

    #[test]
    fn peers_parse() {
        assert_eq!(
            Peer::parse("http://127.0.0.1:8081/"),
            Ok(Peer {
                host: "127.0.0.1".into(),
                port: 8081
            })
        );
        assert_eq!(Peer::parse("http://[::1]:9").unwrap().host, "::1");
        for bad in ["127.0.0.1:80", "https://a:1", "http://a", "http://a:x", "http://:1"] {
            assert!(Peer::parse(bad).is_err(), "{bad}");
        }
    }
}
