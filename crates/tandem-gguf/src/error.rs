use std::path::PathBuf;

/// Why a GGUF file could not be read or written. Malformed-file errors say what was being read (a field,
/// a key, a tensor) and at which byte offset.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    // The inner errors are part of the message, not a `source`, so error chains do not print them twice.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: {inner}")]
    InFile { path: PathBuf, inner: Box<GgufError> },
    #[error("malformed GGUF: {what} at byte {offset}: {reason}")]
    Malformed { what: String, offset: u64, reason: String },
    #[error("metadata key {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("writing GGUF: {0}")]
    Write(String),
    #[error("writing GGUF: {0}")]
    WriteIo(#[from] std::io::Error),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
