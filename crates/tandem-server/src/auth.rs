//! Bearer-key checks. Keys are kept as SHA-256 digests and a presented key's digest is compared with every
//! stored one in constant time, so neither the content nor the length of a key leaks through timing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::errors::ApiError;
use crate::AppState;

type KeyDigest = [u8; 32];

/// The configured keys, as digests.
pub(crate) struct Keys {
    api: Vec<KeyDigest>,
    admin: Vec<KeyDigest>,
}

fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `key` is one of `set`, looking at every entry whatever matches.
fn contains(set: &[KeyDigest], key: &KeyDigest) -> bool {
    set.iter().fold(Choice::from(0), |acc, k| acc | k.ct_eq(key)).into()
}

impl Keys {
    /// Empty strings are not keys (a config with `api_keys = [""]` is an open server).
    pub(crate) fn new(api: &[String], admin: &[String]) -> Self {
        let digests = |keys: &[String]| keys.iter().filter(|k| !k.is_empty()).map(|k| digest(k)).collect();
        Keys {
            api: digests(api),
            admin: digests(admin),
        }
    }
}

/// The key of an `Authorization: Bearer <key>` header, if there is one.
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// A refusal sent after reading the request body (up to the body limit): closing a connection with
/// unread bytes makes the kernel reset it, and the client can lose the response to that reset.
async fn refuse(state: &AppState, req: Request, error: ApiError) -> Response {
    let _ = axum::body::to_bytes(req.into_body(), state.config.max_body_bytes).await;
    error.into_response()
}

/// Routes for API users: open when no API key is configured, else an API or admin key is needed.
pub(crate) async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let keys = &state.keys;
    if keys.api.is_empty() {
        return next.run(req).await;
    }
    let Some(key) = bearer(&req) else {
        let e = ApiError::unauthorized("missing API key: send `Authorization: Bearer <key>`");
        return refuse(&state, req, e).await;
    };
    let d = digest(key);
    // Both sets are always checked, so timing does not tell which one a key is in.
    if contains(&keys.api, &d) | contains(&keys.admin, &d) {
        next.run(req).await
    } else {
        refuse(&state, req, ApiError::unauthorized("invalid API key")).await
    }
}

/// Admin routes: an admin key is always needed; with no admin key configured they are refused.
pub(crate) async fn require_admin_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let keys = &state.keys;
    let Some(key) = bearer(&req) else {
        let e = ApiError::unauthorized("missing admin key: send `Authorization: Bearer <key>`");
        return refuse(&state, req, e).await;
    };
    if keys.admin.is_empty() {
        let e = ApiError::forbidden("admin routes are disabled: the server has no admin key");
        return refuse(&state, req, e).await;
    }
    let d = digest(key);
    let admin = contains(&keys.admin, &d);
    if admin {
        next.run(req).await
    } else if contains(&keys.api, &d) {
        refuse(&state, req, ApiError::forbidden("this key is not an admin key")).await
    } else {
        refuse(&state, req, ApiError::unauthorized("invalid admin key")).await
    }
}
