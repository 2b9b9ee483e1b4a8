//! OpenAI-style errors (`{"error": {"message", "type", "param", "code"}}`) and the JSON extractor whose
//! rejections are such errors, so axum's plain-text rejections never reach a client.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::json;
use tandem_engine::serve::SubmitError;

use crate::AppState;

/// An error response; every failure the server reports is one of these.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `permission_error`, `server_error`.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 400 naming the parameter at fault.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param).with_code("invalid_value")
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{model}` does not exist"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message).with_code("not_found")
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message).with_code("invalid_api_key")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", message).with_code("forbidden")
    }

    pub fn unavailable(message: impl Into<String>, code: &'static str) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code(code)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message).with_code("internal_error")
    }

    /// The JSON body (also sent as an SSE event when a stream fails after it started).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let message = e.to_string();
        match e {
            SubmitError::PromptTooLong { .. } => ApiError::bad_request(message)
                .with_param("prompt")
                .with_code("context_length_exceeded"),
            SubmitError::EmptyPrompt => ApiError::invalid("prompt", message),
            SubmitError::MaxTokens { .. } => ApiError::invalid("max_tokens", message),
            SubmitError::KvBudget { .. } => ApiError::bad_request(message).with_code("kv_budget_exceeded"),
            SubmitError::QueueFull { .. } => ApiError::unavailable(message, "queue_full"),
            SubmitError::ShuttingDown => ApiError::unavailable(message, "shutting_down"),
            SubmitError::NoKvExport => ApiError::not_found(message),
            SubmitError::Speculative(_) => ApiError::invalid("speculative", message),
        }
    }
}

/// A JSON body: no content type is required (llama.cpp clients often send none), a body over the limit
/// is a 413, one that does not arrive within `body_timeout` a 408, anything that does not parse into `T`
/// a 400 naming the field at fault.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let read = Bytes::from_request(req, state);
        let read = match state.config.body_timeout {
            Some(limit) => tokio::time::timeout(limit, read)
                .await
                .map_err(|_| body_timeout(limit))?,
            None => read.await,
        };
        let bytes = read.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "the request body is larger than the server accepts",
                )
                .with_code("payload_too_large")
            } else {
                ApiError::bad_request(format!("could not read the request body: {}", e.body_text()))
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

fn body_timeout(limit: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        format!("the request body did not arrive within {limit:?} (shorter than its Content-Length?)"),
    )
    .with_code("request_timeout")
}

/// Parses a body, naming the path of the offending field in the error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid JSON body: {inner}")).with_code("invalid_json")
        } else {
            ApiError::bad_request(format!("invalid JSON body at `{path}`: {inner}"))
                .with_param(path)
                .with_code("invalid_json")
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")).with_code("invalid_json"))?;
    Ok(value)
}
