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
        }
    }
}
