//! The HTTP API over the serving engine ([`tandem_engine::serve::EngineHandle`]).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/chat/completions` (`/chat/completions`) | OpenAI chat, streamed (SSE, `data: [DONE]`) or not |
//! | `POST /v1/completions` (`/completions`) | OpenAI text completion, streamed or not |
//! | `GET /v1/models` (`/models`) | the served model |
//! | `POST /completion` | llama.cpp server completion, streamed (SSE, last message `stop: true`) or not |
//! | `POST /tokenize`, `POST /detokenize` | llama.cpp's `{content, add_special, parse_special, with_pieces}` / `{tokens}` |
//! | `GET /health` | `{"status":"ok"}`, never behind a key |
//! | `GET /metrics` | Prometheus text (see [`metrics`]) |
//! | `POST /v1/kv/prefill` | a prefill node's KV export, streamed (`docs/KV-WIRE.md`, [`kv`]) |
//! | `GET /slots`, `POST /admin/cache/flush` | admin key only: engine stats, drop the prefix cache |
//!
//! A generation that fails after its stream started (the engine failed, or shutdown cut it) still ends
//! the stream as its clients expect: OpenAI streams with an error event, then `data: [DONE]`;
//! `/completion` with a last message `stop: true`, `stop_type: "error"` and an `error` object.
//!
//! With `api_keys` set, every route but `/health` needs `Authorization: Bearer <key>` (an admin key works
//! too); admin routes always need an admin key. Every error is OpenAI-shaped:
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! Sampling defaults: the OpenAI routes sample plainly at temperature 1 (top-k, min-p off, top-p 1, as
//! OpenAI and vLLM do); `/completion` uses llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95,
//! min-p 0.05). A missing or negative `seed` draws a random one. `max_tokens` / `n_predict` default to
//! `default_max_tokens`; `n_predict: -1` means `max_tokens_limit`. Stop strings are matched on the
//! generated text across token boundaries and never sent; `logit_bias` (OpenAI's `{"id": bias}` or
//! llama.cpp's `[[id, bias]]`, `false` banning the token) is checked against the vocabulary and
//! [-100, 100] on every generation route; end-of-generation tokens stop generation
//! (`ignore_eos` on `/completion` turns that off).
//!
//! Every generation response reports how its prompt met the prefix cache, as the `x-tandem-prompt` header
//! and as `tandem.prompt_cache` (in streams: in the last chunks): `"prompt 120 = 100 reused + 20 read"`.

mod auth;
pub mod config;
mod conn;
pub mod errors;
mod generate;
pub mod kv;
mod llamacpp;
pub mod metrics;
mod openai;
mod params;
mod stop;
pub mod stream;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::server::graceful::GracefulShutdown;
use tandem_engine::serve::EngineHandle;
use tandem_tokenizer::{ChatTemplate, Tokenizer};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

pub use config::ServerConfig;
pub use errors::ApiError;
pub use metrics::Metrics;
pub use stop::StopMatcher;
pub use stream::PROMPT_HEADER;

/// Everything a request handler needs; shared by all of them.
pub struct AppState {
    pub engine: Arc<dyn EngineHandle>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub config: ServerConfig,
    pub metrics: Metrics,
    keys: auth::Keys,
    /// Unix time the state was made (`created` of the model in `/v1/models`).
    created: u64,
    /// Set when the shutdown signal came: new generations are refused.
    shutting_down: AtomicBool,
    /// Set when the shutdown grace ran out: running generations end at once.
    kill: watch::Sender<bool>,
}

impl AppState {
    pub fn new(
        engine: Arc<dyn EngineHandle>,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        config: ServerConfig,
    ) -> Self {
        AppState {
            engine,
            tokenizer,
            template,
            keys: auth::Keys::new(&config.api_keys, &config.admin_keys),
            config,
            metrics: Metrics::default(),
            created: params::unix_time(),
            shutting_down: AtomicBool::new(false),
            kill: watch::channel(false).0,
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    fn kill_signal(&self) -> watch::Receiver<bool> {
        self.kill.subscribe()
    }
}

/// All routes. Unknown paths and methods get OpenAI-style 404 / 405 errors; bodies over
/// `max_body_bytes` a 413.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/models", get(openai::models))
        .route("/completion", post(llamacpp::completion))
        .route("/tokenize", post(llamacpp::tokenize))
        .route("/detokenize", post(llamacpp::detokenize))
        .route("/metrics", get(metrics::handler))
        .route("/v1/kv/prefill", post(kv::prefill))
        .route_layer(from_fn_with_state(state.clone(), auth::require_api_key));
    let admin = Router::new()
        .route("/slots", get(llamacpp::slots))
        .route("/admin/cache/flush", post(llamacpp::flush_cache))
        .route_layer(from_fn_with_state(state.clone(), auth::require_admin_key));
    Router::new()
        .route("/health", get(health))
        .merge(api)
        .merge(admin)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

/// `GET /health`: never needs a key.
async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this method is not allowed on this route",
    )
    .with_code("method_not_allowed")
}

/// How long connections may take to close once running generations were cut.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How long to pause accepting after an accept error that is not the client's (such as running out of
/// file descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serves until `shutdown` resolves, then shuts down gracefully: no new connections (and new generations
/// on open ones are refused with 503), running requests may finish for up to `shutdown_grace`, then the
/// engine is shut down and whatever still runs is cut (streams end with an error event).
///
/// At most `max_connections` connections are open at once: beyond it the listener is not accepted
/// from, so new clients wait in the kernel's accept backlog (as nginx does at `worker_connections`)
/// until one closes. The head, idle and body limits are described in [`config::ServerConfig`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let timeouts = conn::Timeouts {
        head: state.config.head_timeout,
        idle: state.config.idle_timeout,
    };
    let slots = state.config.max_connections.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let slot = match &slots {
            Some(s) => tokio::select! {
                // The semaphore is never closed; were it, connections would go uncounted.
                slot = s.clone().acquire_owned() => slot.ok(),
                _ = &mut shutdown => break,
            },
            None => None,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => break,
        };
        while connections.try_join_next().is_some() {}
        let socket = match accepted {
            Ok((socket, _)) => socket,
            Err(e) if conn::is_connection_error(&e) => continue,
            Err(e) => {
                eprintln!("tandem-server: accept failed: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let served = conn::serve_connection(socket, app.clone(), timeouts, &graceful);
        connections.spawn(async move {
            served.await;
            drop(slot);
        });
    }
    drop(listener);
    state.shutting_down.store(true, Ordering::Relaxed);
    let closed = graceful.shutdown();
    tokio::pin!(closed);
    let finished = tokio::time::timeout(state.config.shutdown_grace, &mut closed).await;
    state.engine.shutdown();
    if finished.is_err() {
        state.kill.send_replace(true);
        // Connections whose client does not read may never close; stop waiting for them.
        let _ = tokio::time::timeout(CLOSE_WAIT, &mut closed).await;
    }
    // Whatever is left is cut here rather than left running without a server.
    connections.shutdown().await;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
