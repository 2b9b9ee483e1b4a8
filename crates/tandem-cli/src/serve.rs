//! `tandem serve`: the OpenAI- and llama.cpp-compatible HTTP server over the serving engine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tandem_engine::serve::{ServingConfig, ServingEngine};
use tandem_model::Model;
use tandem_server::{AppState, ServerConfig};
use tandem_tokenizer::{ChatTemplate, Tokenizer};

#[derive(Args)]
pub struct ServeArgs {
    /// A GGUF path or a known model alias (pulled on first use).
    #[arg(long, short = 'm', default_value = crate::registry::DEFAULT_MODEL)]
    model: String,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    /// Context per sequence, in tokens (default: the model's, at most 8192).
    #[arg(long)]
    ctx: Option<usize>,
    /// Rows per prefill chunk while no decoder waits.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Rows per prefill chunk while any decoder waits.
    #[arg(long, default_value_t = 64)]
    prefill_chunk_busy: usize,
    /// KV-cache bytes all running sequences may reserve (suffixes K, M, G allowed).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    kv_budget: usize,
    /// KV-cache bytes kept for reuse by finished conversations.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    cache_budget: usize,
    /// Requests that may wait for memory; beyond this new ones get 503.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// An API key clients must send as `Authorization: Bearer …` (repeatable).
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// A file of API keys, one per line.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// A key for the admin routes (`/slots`, `/admin/cache/flush`; repeatable).
    #[arg(long = "admin-key")]
    admin_keys: Vec<String>,
    /// Largest request body accepted, in bytes (413 above).
    #[arg(long, default_value = "4M", value_parser = parse_bytes)]
    max_body_bytes: usize,
    /// Largest max_tokens a request may ask for.
    #[arg(long, default_value_t = 4096)]
    max_tokens_limit: usize,
    /// Seconds running requests may go on after SIGTERM before they are cut.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
}

/// `512`, `64K`, `1M`, `2G` (powers of 1024).
fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a byte count"))?;
    let mult = match unit.to_ascii_uppercase().trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (K, M, G)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

pub fn serve(args: &ServeArgs) -> Result<()> {
    let path = crate::registry::resolve(&args.model)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // One mapping of the file: tokenizer and template first, then the model takes it.
    let file = tandem_gguf::GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let template = ChatTemplate::from_gguf(&file)?;
    let model = Model::from_file(file, threads)?;
    let n_ctx = args.ctx.unwrap_or(model.config.context_length.min(8192)).max(16);
    let mut api_keys = args.api_keys.clone();
    if let Some(f) = &args.api_key_file {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        api_keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from),
        );
    }
    let engine = ServingEngine::start(
        model,
        ServingConfig {
            n_ctx,
            prefill_chunk: args.prefill_chunk,
            prefill_chunk_busy: args.prefill_chunk_busy,
            kv_budget_bytes: args.kv_budget,
            cache_budget_bytes: args.cache_budget,
            max_queue: args.max_queue,
            max_tokens_limit: args.max_tokens_limit,
        },
    );
    let model_name = match crate::registry::find(&args.model) {
        Some(spec) => spec.alias.to_string(),
        None => path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    };
    let config = ServerConfig {
        model_name: model_name.clone(),
        api_keys,
        admin_keys: args.admin_keys.clone(),
        max_body_bytes: args.max_body_bytes,
        max_tokens_limit: args.max_tokens_limit,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        ..ServerConfig::default()
    };
    let state = Arc::new(AppState::new(Arc::new(engine), tokenizer, template, config));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "tandem: serving {model_name} on http://{} (context {n_ctx}, KV budget {} MB)",
            listener.local_addr()?,
            args.kv_budget >> 20
        );
        tandem_server::serve(listener, state, tandem_server::shutdown_signal()).await?;
        eprintln!("tandem: stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("512"), Ok(512));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("2MB"), Ok(2 << 20));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("1T").is_err());
    }
}
