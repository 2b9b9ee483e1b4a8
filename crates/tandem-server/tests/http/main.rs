//! The real router over a fake engine, spoken to over HTTP/1.1 (and HTTP/2: `protocols`) on 127.0.0.1.

mod common;
mod errors;
mod failures;
mod lifecycle;
mod limits;
mod llamacpp;
mod openai;
mod protocols;
