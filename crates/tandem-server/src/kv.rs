//! Disaggregated prefill over HTTP (`docs/KV-WIRE.md`): a prefill node's `POST /v1/kv/prefill`, which
//! reads a prompt and streams its KV as it is produced, and a decode node's client for it
//! ([`PeerClient`]), which checks every frame and hands the rows to the engine. Both sides use the
//! server's own hyper stack (HTTP/1.1, a streamed body) and the API's bearer keys.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tandem_engine::serve::{Event, PrefillPeers, RemoteMsg};
use tandem_model::kv::wire::{self, Decoder, Encoder, Frame, Hello};
use tokio::sync::mpsc;

use crate::errors::{ApiError, ApiJson};
use crate::AppState;

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
            format!("KV wire version {}, this node speaks {}", req.version, wire::VERSION),
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
    let to = req.tokens.len();
    let rx = state.engine.export_kv(req.tokens)?;
    let (enc, head) = Encoder::start(&Hello {
        version: wire::VERSION,
        fingerprint: id.fingerprint,
        n_layers: id.n_layers,
        width: id.width,
        to,
    });
    let body = futures_util::stream::unfold((rx, Some(enc), Some(head)), |(mut rx, enc, head)| async move {
        if let Some(head) = head {
            return Some((Ok::<_, Infallible>(Bytes::from(head)), (rx, enc, None)));
        }
        let mut enc = enc?;
        loop {
            let (bytes, enc) = match rx.recv().await {
                Some(Event::KvRows(rows)) => (enc.rows(&rows), Some(enc)),
                Some(Event::Done { .. }) => (enc.end(), None),
                Some(Event::Failed(msg)) => (Encoder::error(&msg), None),
                Some(_) => continue,
                None => (Encoder::error("the engine dropped the export"), None),
            };
            return Some((Ok(Bytes::from(bytes)), (rx, enc, None)));
        }
    });
    Ok(([(CONTENT_TYPE, KV_MEDIA_TYPE)], Body::from_stream(body)).into_response())
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
    peers: Vec<Peer>,
    next: AtomicUsize,
    key: Option<String>,
    fingerprint: [u8; 32],
    timeout: Duration,
    runtime: tokio::runtime::Handle,
}

impl PeerClient {
    /// `timeout` bounds a whole transfer, from the connect to the last frame.
    pub fn new(
        peers: Vec<Peer>,
        key: Option<String>,
        fingerprint: [u8; 32],
        timeout: Duration,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        assert!(!peers.is_empty(), "a decode node needs a prefill peer");
        PeerClient {
            peers,
            next: AtomicUsize::new(0),
            key,
            fingerprint,
            timeout,
            runtime,
        }
    }
}

type Wake = Arc<dyn Fn() + Send + Sync>;
type Failure = (&'static str, String);

impl PrefillPeers for PeerClient {
    fn fetch(&self, tokens: Vec<u32>, wake: Wake) -> mpsc::Receiver<RemoteMsg> {
        let (tx, rx) = mpsc::channel(64);
        let peer = self.peers[self.next.fetch_add(1, Ordering::Relaxed) % self.peers.len()].clone();
        let (key, fingerprint, timeout) = (self.key.clone(), self.fingerprint, self.timeout);
        self.runtime.spawn(async move {
            let fetched = tokio::time::timeout(timeout, fetch(&peer, key, fingerprint, tokens, &tx, &wake)).await;
            let failure = match fetched {
                Ok(Ok(())) => None,
                Ok(Err((cause, detail))) => Some((cause, format!("{}:{}: {detail}", peer.host, peer.port))),
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

/// One transfer: the request, then every frame checked and passed on; `Ok` once `Done` was sent (or the
/// engine no longer listens).
async fn fetch(
    peer: &Peer,
    key: Option<String>,
    fingerprint: [u8; 32],
    tokens: Vec<u32>,
    tx: &mpsc::Sender<RemoteMsg>,
    wake: &Wake,
) -> Result<(), Failure> {
    let unreachable = |e: &dyn std::fmt::Display| ("unreachable", e.to_string());
    let stream = tokio::net::TcpStream::connect((peer.host.as_str(), peer.port))
        .await
        .map_err(|e| unreachable(&e))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let to = tokens.len();
    let body = serde_json::json!({
        "version": wire::VERSION,
        "fingerprint": wire::hex(&fingerprint),
        "tokens": tokens,
    })
    .to_string();
    let mut request = Request::post("/v1/kv/prefill")
        .header(HOST, format!("{}:{}", peer.host, peer.port))
        .header(CONTENT_TYPE, "application/json");
    if let Some(key) = &key {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(body).map_err(|e| ("protocol", e.to_string()))?;
    let response = sender.send_request(request).await.map_err(|e| unreachable(&e))?;
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
        decoder.push(&data);
        while let Some(f) = decoder.next_frame().map_err(|e| (e.cause(), e.to_string()))? {
            let msg = match f {
                Frame::Hello(h) if h.to != to => {
                    return Err(("protocol", format!("the stream fills {} positions, not {to}", h.to)));
                }
                Frame::Hello(_) => continue,
                Frame::Rows(rows) => RemoteMsg::Rows(Box::new(rows)),
                Frame::End => RemoteMsg::Done,
                Frame::Error(m) => return Err(("refused", m)),
            };
            let done = matches!(msg, RemoteMsg::Done);
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
