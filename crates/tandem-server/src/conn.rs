//! One connection, HTTP/1.1 or HTTP/2: the router behind hyper, with the time limits hyper cannot tell
//! apart.
//!
//! Both protocols share the port: a connection that opens with the HTTP/2 preface is served as HTTP/2
//! over cleartext (h2c with prior knowledge: what a decode node's KV client speaks, `kv.rs`), any other
//! as HTTP/1.1 (hyper_util's `auto` builder reads the first bytes to tell). There is no `Upgrade: h2c`.
//!
//! hyper's own `header_read_timeout` starts when it wants the next request head, which on a keep-alive
//! connection is the moment the previous response ended: it would close idle connections as soon as
//! slow heads, so one limit could not be long for the first and short for the second. Here the socket
//! is wrapped ([`WatchedIo`]) and told by the service ([`ConnWatch::begin`]) whether a request is in
//! flight, and it applies, while none is:
//!
//! - before the first request: the head limit, counted from the accept (a client that connects and
//!   sends nothing is a slow head);
//! - after a response: the idle limit until the next request's first byte, then the head limit from it.
//!
//! While a request is in flight (from its parsed head until its response body is dropped, so a
//! streamed generation of any length) the socket has no limit; the body limit is the extractor's
//! ([`crate::errors::ApiJson`]). A limit that runs out fails the socket's read, and hyper closes the
//! connection without answering (a head may not even be parseable yet).
//!
//! On HTTP/2 many requests may be in flight at once (the count below), and the limits see bytes, not
//! frames: a flow-control or ping frame after the last response counts as a next request's first byte,
//! so an idle HTTP/2 connection may be closed after the head limit rather than the idle limit. Its
//! client connects again (the KV client does).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The socket-level limits (`None`: no limit).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub head: Option<Duration>,
    pub idle: Option<Duration>,
}

/// Where a connection stands between requests.
#[derive(Debug)]
struct Phase {
    /// Requests in flight (one at a time in HTTP/1.1, any number of HTTP/2 streams).
    busy: usize,
    /// When the connection was accepted or its last response ended.
    since: Instant,
    /// Whether a response was sent already (then `since` starts an idle period).
    served: bool,
    /// The first byte read since `since`, while no request was in flight.
    first_byte: Option<Instant>,
    /// The connection's task, when its read waited without a deadline: hyper may poll the socket for the
    /// next head before it drops the last response body, and would not poll again until a byte came, so
    /// the end of a request wakes it to arm the idle limit.
    waker: Option<Waker>,
}

/// Shared by a connection's socket wrapper and its service.
#[derive(Clone, Debug)]
pub struct ConnWatch {
    phase: Arc<Mutex<Phase>>,
    timeouts: Timeouts,
}

impl ConnWatch {
    pub fn new(timeouts: Timeouts) -> Self {
        let phase = Phase {
            busy: 0,
            since: Instant::now(),
            served: false,
            first_byte: None,
            waker: None,
        };
        ConnWatch {
            phase: Arc::new(Mutex::new(phase)),
            timeouts,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Phase) -> R) -> R {
        // The phase is plain data; a panic elsewhere cannot leave it inconsistent.
        f(&mut self.phase.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// When the socket's read must have made its progress; `None` while a request is in flight (then
    /// `cx` is woken when it ends).
    fn deadline(&self, cx: &Context<'_>) -> Option<Instant> {
        let t = self.timeouts;
        self.with(|p| {
            if p.busy > 0 {
                p.waker = Some(cx.waker().clone());
                None
            } else if !p.served {
                t.head.map(|h| p.since + h)
            } else if let Some(first) = p.first_byte {
                t.head.map(|h| first + h)
            } else {
                t.idle.map(|i| p.since + i)
            }
        })
    }

    fn on_bytes(&self) {
        self.with(|p| {
            if p.busy == 0 && p.first_byte.is_none() {
                p.first_byte = Some(Instant::now());
            }
        });
    }

    /// A request head was parsed; the returned guard ends the request when dropped.
    pub fn begin(&self) -> BusyGuard {
        self.with(|p| p.busy += 1);
        BusyGuard(self.clone())
    }
}

/// Held by a response body: the request counts as in flight until hyper drops it (sent or abandoned).
#[derive(Debug)]
pub struct BusyGuard(ConnWatch);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let waker = self.0.with(|p| {
            p.busy = p.busy.saturating_sub(1);
            if p.busy > 0 {
                return None;
            }
            p.since = Instant::now();
            p.served = true;
            p.first_byte = None;
            p.waker.take()
        });
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A socket whose reads fail with `TimedOut` once the connection's deadline passed.
pub struct WatchedIo<S> {
    io: S,
    watch: ConnWatch,
    sleep: Pin<Box<Sleep>>,
    /// The deadline `sleep` is set to.
    armed: Option<Instant>,
}

impl<S> WatchedIo<S> {
    pub fn new(io: S, watch: ConnWatch) -> Self {
        WatchedIo {
            io,
            watch,
            // Re-armed before its first poll.
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }

    /// Called when the socket has nothing to read: fails the read if the deadline passed, else makes
    /// sure this task wakes up at it.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(deadline) = self.watch.deadline(cx) else {
            return Poll::Pending;
        };
        if self.armed != Some(deadline) {
            self.sleep.as_mut().reset(deadline);
            self.armed = Some(deadline);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection's time limit ran out (request head or idle keep-alive)",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WatchedIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.watch.on_bytes();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WatchedIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request in flight until it is dropped.
struct TrackedBody {
    inner: Body,
    _busy: BusyGuard,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// HTTP/2 streams one connection may have open at once. `max_connections` bounds connections, this what
/// one of them holds; beyond it a client waits for a stream to end (the engine's queue refuses
/// generations past its own limit either way).
const MAX_STREAMS: u32 = 128;

/// Serves one accepted socket until the client or the server closes it; `graceful` asks it to close
/// once its running request is answered.
pub fn serve_connection<S>(
    socket: S,
    router: Router,
    timeouts: Timeouts,
    graceful: &GracefulShutdown,
) -> impl Future<Output = ()> + Send + 'static
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = ConnWatch::new(timeouts);
    let io = TokioIo::new(WatchedIo::new(socket, watch.clone()));
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = watch.begin();
        let mut router = router.clone();
        async move {
            let response = match tower_service::Service::call(&mut router, req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(response.map(|inner| TrackedBody { inner, _busy: busy }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The head limit is `WatchedIo`'s (see the module's comment); hyper's would also cut idle time.
    builder.http1().header_read_timeout(None);
    builder.http2().max_concurrent_streams(MAX_STREAMS);
    let conn = graceful.watch(builder.serve_connection(io, service).into_owned());
    async move {
        // A failed connection (a client gone, a limit run out) concerns only that client.
        let _ = conn.await;
    }
}

/// Whether an accept error concerns only the connection being accepted (then the next accept may go
/// on at once; others, such as running out of file descriptors, call for a pause).
pub fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}
