//! What the operator sets: the served model name, keys, limits.

use std::time::Duration;

/// Server settings. `Default` gives an open server (no keys) with modest limits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and requests must use (or leave out).
    pub model_name: String,
    /// Bearer keys for every route but `/health`; empty: those routes are open.
    pub api_keys: Vec<String>,
    /// Bearer keys for `/slots` and `/admin/*` (they work as API keys too); empty: admin routes are refused.
    pub admin_keys: Vec<String>,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Largest `max_tokens` / `n_predict` a request may ask for (400 above it).
    pub max_tokens_limit: usize,
    /// `max_tokens` when a request gives none (capped by `max_tokens_limit`).
    pub default_max_tokens: usize,
    /// After the shutdown signal, how long running requests may go on before they are cut.
    pub shutdown_grace: Duration,
    /// How long a client may take to send a whole request head: from the accept for a connection's
    /// first request, from the first byte for a later one. The connection is closed without an answer
    /// when it runs out (the head may not even parse). `None`: no limit.
    pub head_timeout: Option<Duration>,
    /// How long a client may take to send a whole request body, from the moment the route starts reading
    /// it; 408 `request_timeout` when it runs out. `None`: no limit.
    pub body_timeout: Option<Duration>,
    /// How long a keep-alive connection may sit idle between a response and the next request before it
    /// is closed. `None`: no limit.
    pub idle_timeout: Option<Duration>,
    /// Connections open at once; beyond it new ones wait in the accept backlog until one closes.
    /// `None`: no limit.
    pub max_connections: Option<usize>,
    /// A prefill node's model identity: with it, `POST /v1/kv/prefill` exports KV (`kv.rs`).
    pub kv_export: Option<crate::kv::KvIdentity>,
    /// A prefill node's cap on the KV stream it sends, in bits per second, so that a fast local
    /// connection stands for a real link. `None`: as fast as the connection takes it.
    pub kv_send_rate: Option<u64>,
    /// Speculative decoding for requests that do not ask (`--spec`); a request's `speculative` fields
    /// fill in from it.
    pub spec: tandem_engine::spec::SpecSettings,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_name: "tandem".into(),
            api_keys: Vec::new(),
            admin_keys: Vec::new(),
            max_body_bytes: 4 << 20,
            max_tokens_limit: 4096,
            default_max_tokens: 512,
            shutdown_grace: Duration::from_secs(30),
            // A head is one packet for any real client; hyper's own default is 30 s, nginx's 60 s.
            head_timeout: Some(Duration::from_secs(10)),
            // A 4 MiB body (the default limit) in 30 s is 140 KB/s, slower than any client that matters.
            body_timeout: Some(Duration::from_secs(30)),
            // Long enough that OpenAI clients' connection pools keep their connections between turns of
            // a conversation (nginx keeps 75 s), short enough that idle ones do not pile up.
            idle_timeout: Some(Duration::from_secs(60)),
            // Far above what one engine can serve at once; a cap on file descriptors and memory.
            max_connections: Some(512),
            kv_export: None,
            kv_send_rate: None,
            spec: Default::default(),
        }
    }
}
