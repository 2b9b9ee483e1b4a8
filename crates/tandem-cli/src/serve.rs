//! `tandem serve`: the OpenAI- and llama.cpp-compatible HTTP server over the serving engine.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_cuda::CudaModel;
use tandem_engine::serve::{RemotePrefill, ServingConfig};
use tandem_model::{Model, ServingBackend};
use tandem_runtime::{on_model, Device, DeviceModel};
use tandem_server::{AppState, ServerConfig};
use tandem_tokenizer::{ChatTemplate, Tokenizer};

use crate::generate::{place, print_cuda_memory, print_model, DeviceArg, ExpertArgs};
use crate::spec::SpecArgs;

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
    /// Speculative decoding for requests that do not set their own `speculative`; with `--draft-model`,
    /// requests may also ask for drafts from it.
    #[command(flatten)]
    spec: SpecArgs,
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
    /// KV-cache bytes kept for reuse by finished conversations (default: the whole `--kv-budget`;
    /// cached conversations give way to admitted requests, least recently used first, so a cache as
    /// large as the budget never refuses work, and a long first turn stays for its follow-up).
    #[arg(long, value_parser = parse_bytes)]
    cache_budget: Option<usize>,
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
    /// Seconds a client may take to send a whole request head (from the connect for its first request,
    /// from the first byte for later ones); the connection is closed when it runs out. 0: no limit.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    timeout_head: f64,
    /// Seconds a client may take to send a whole request body; 408 when it runs out. 0: no limit.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    timeout_body: f64,
    /// Seconds a keep-alive connection may sit idle between requests before it is closed. 0: no limit.
    /// Responses, streamed generations included, are never cut by any of these limits.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    timeout_idle: f64,
    /// Connections open at once; beyond it new ones wait in the kernel's accept backlog until one
    /// closes (they are not refused). 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// Where the model runs. On the GPU every sequence's KV cache is allocated whole (the full
    /// context) when its request is admitted, and counts against --kv-budget as such.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Which GPU, with `--device cuda`.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// GPU: take the matvec route for every matmul, so a request's logits are bit-identical alone or
    /// batched (the CPU always is).
    #[arg(long)]
    deterministic: bool,
    #[command(flatten)]
    experts: ExpertArgs,
    /// Skip the throwaway pass run before serving (as llama-server's `--no-warmup`): then the first
    /// request pays the backend's first-use costs (on the GPU, cuBLAS loading its kernels).
    #[arg(long)]
    no_warmup: bool,
    /// Print model and memory details to stderr.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// `both`: read every prompt here. `prefill`: also answer decode nodes' KV requests
    /// (`POST /v1/kv/prefill`, docs/KV-WIRE.md). `decode`: read long prompts on a --prefill-peer.
    #[arg(long, value_enum, default_value_t = Role::Both)]
    role: Role,
    /// A prefill node, `http://host:port` (repeatable; taken in turn). With --role decode.
    #[arg(long = "prefill-peer", value_name = "URL")]
    prefill_peers: Vec<String>,
    /// The key sent to prefill peers (default: the first --api-key).
    #[arg(long)]
    prefill_key: Option<String>,
    /// Prompts with fewer new tokens (after prefix reuse) are read here: not worth the wire hop.
    #[arg(long, value_name = "N", default_value_t = 256)]
    remote_prefill_min_tokens: usize,
    /// Seconds a whole remote prefill may take before the prompt is read here instead.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    prefill_timeout: f64,
    /// Cap on the KV stream a prefill node sends, so that loopback stands for a real link: `10gbit`,
    /// `1gbit`, `500mbit`, `2.5gbit` or bits per second (default: no cap). With --role prefill.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    kv_send_rate: Option<u64>,
    /// KV bytes a prefill node queues per transfer ahead of its connection (`64M`, `512K`); past it
    /// the engine stops reading that prompt until the link catches up. With --role prefill.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    kv_send_buffer: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    Both,
    Prefill,
    Decode,
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

/// Bits per second: `10gbit`, `500mbit`, `64kbit`, `2.5gbit`, `1000000` (powers of 1000, as links are
/// rated).
fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (number, unit) = t.split_at(t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len()));
    let number = number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("{s:?} is not a rate (10gbit, 500mbit, or bits per second)"))?;
    let mult = match unit {
        "" | "bit" => 1e0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (bit, kbit, mbit, gbit)")),
    };
    let bits = number * mult;
    // Below 8 bit/s the pacer would wait years; above 1 Pbit/s it is no cap at all.
    if !(8.0..=1e15).contains(&bits) {
        return Err(format!("{s:?}: a rate is from 8 bit/s to 1000000gbit"));
    }
    Ok(bits.round() as u64)
}

/// Seconds, fractions allowed: `10`, `0.5`.
fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && Duration::try_from_secs_f64(v).is_ok() => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds (0 or more)")),
    }
}

/// A limit in seconds as the server takes it: 0 is none.
fn limit(secs: f64) -> Option<Duration> {
    (secs > 0.0).then(|| Duration::from_secs_f64(secs))
}

pub fn serve(args: &ServeArgs) -> Result<()> {
    // Before the model loads (or downloads): a wrong role or setting is known at once.
    let spec = args.spec.settings()?;
    if args.role == Role::Decode && args.prefill_peers.is_empty() {
        bail!("--role decode needs at least one --prefill-peer URL");
    }
    if args.role != Role::Decode && !args.prefill_peers.is_empty() {
        bail!("--prefill-peer is for --role decode");
    }
    if args.role != Role::Prefill && args.kv_send_rate.is_some() {
        bail!("--kv-send-rate is for --role prefill: it caps the KV stream a prefill node sends");
    }
    if args.role != Role::Prefill && args.kv_send_buffer.is_some() {
        bail!("--kv-send-buffer is for --role prefill: it bounds the KV a prefill node queues per transfer");
    }
    let path = crate::registry::resolve(&args.model)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // One mapping of the file: tokenizer and template first, then the model takes it.
    let file = tandem_gguf::GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let template = ChatTemplate::from_gguf(&file)?;
    let model = Model::from_file(file, threads)?;
    // A draft model (`--spec draft`) serves every request that speculates with one.
    let draft = match &args.spec.draft_model {
        Some(m) => {
            let draft_path = crate::registry::resolve(m)?;
            let draft = Model::from_file(tandem_gguf::GgufFile::open(&draft_path)?, threads)
                .with_context(|| format!("draft model {}", draft_path.display()))?;
            let (want, got) = (model.config.n_vocab, draft.config.n_vocab);
            if want != got {
                bail!("the draft model has {got} tokens in its vocabulary, the target {want}: they must share one");
            }
            Some(draft)
        }
        None => None,
    };
    let has_draft = draft.is_some();
    let peers = args
        .prefill_peers
        .iter()
        .map(|u| tandem_server::kv::Peer::parse(u).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    // Both sides of a KV exchange prove the model: the file's bytes and the derived configuration.
    // The file's digest is remembered across starts: hashing a large model takes a while.
    let digests = crate::registry::tandem_home().join("digests");
    let fingerprint = (args.role != Role::Both).then(|| model.fingerprint(Some(&digests)));
    let kv_identity = fingerprint.map(|fingerprint| tandem_server::kv::KvIdentity {
        fingerprint,
        n_layers: model.config.layers.len(),
        width: model.config.kv_width(),
    });
    let n_ctx = args.ctx.unwrap_or(model.config.context_length.min(8192)).max(16);
    if args.verbose {
        print_model(&path, &model, threads);
    }
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let kv_received = Arc::new(AtomicU64::new(0));
    let remote = match (args.role, fingerprint) {
        (Role::Decode, Some(fingerprint)) => Some(RemotePrefill {
            peers: Arc::new(tandem_server::kv::PeerClient::new(
                peers,
                args.prefill_key.clone().or_else(|| api_keys.first().cloned()),
                fingerprint,
                Duration::from_secs_f64(args.prefill_timeout),
                runtime.handle().clone(),
                kv_received.clone(),
            )),
            min_tokens: args.remote_prefill_min_tokens.max(1),
        }),
        _ => None,
    };
    let serving = ServingConfig {
        n_ctx,
        prefill_chunk: args.prefill_chunk,
        prefill_chunk_busy: args.prefill_chunk_busy,
        kv_budget_bytes: args.kv_budget,
        cache_budget_bytes: args.cache_budget.unwrap_or(args.kv_budget).min(args.kv_budget),
        max_queue: args.max_queue,
        max_tokens_limit: args.max_tokens_limit,
        remote,
        kv_send_buffer_bytes: args
            .kv_send_buffer
            .unwrap_or(ServingConfig::default().kv_send_buffer_bytes),
        spec,
    };
    // The CPU has no kernels to load: one row reads every weight in. The GPU warms each chunk size
    // the scheduler takes (each picks its own cuBLAS kernels), the one-row decode route, and decode
    // batches: 2-8 rows each take the route measured for them at load, larger ones cuBLAS, whose
    // kernels for nearby row counts are shared.
    let device = args.device.device(args.gpu, args.deterministic, args.experts.offload());
    let (rows, batches) = match (args.no_warmup, device) {
        (true, _) => (vec![], vec![]),
        (false, Device::Cpu) => (vec![1], vec![]),
        (false, Device::Cuda { .. }) => (
            vec![1, args.prefill_chunk_busy, args.prefill_chunk],
            WARM_UP_BATCHES.to_vec(),
        ),
    };
    let warm = WarmUp {
        rows,
        batches,
        n_ctx,
        verbose: args.verbose,
    };
    let gpu = GpuServe {
        verbose: args.verbose,
        n_ctx,
        kv_budget: args.kv_budget,
    };
    // The engine thread places the model: a GPU's context belongs to the thread that made it.
    let engine = tandem_runtime::start_serving_with_draft(
        device,
        move || {
            let placed = place(model, device, gpu.verbose)?;
            if let DeviceModel::Cuda(cuda) = &placed {
                check_gpu(cuda, &gpu)?;
            }
            warm.run(&placed)?;
            let draft = draft.map(|d| place(d, device, false)).transpose()?;
            Ok::<_, anyhow::Error>((placed, draft))
        },
        has_draft,
        serving,
    )?;
    let device = match device {
        Device::Cpu => format!("{threads} CPU threads"),
        Device::Cuda { gpu, deterministic, .. } => {
            let mode = if deterministic { ", deterministic" } else { "" };
            format!("GPU {gpu}{mode}")
        }
    };
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
        head_timeout: limit(args.timeout_head),
        body_timeout: limit(args.timeout_body),
        idle_timeout: limit(args.timeout_idle),
        max_connections: (args.max_connections > 0).then_some(args.max_connections),
        kv_export: kv_identity.filter(|_| args.role == Role::Prefill),
        kv_send_rate: args.kv_send_rate,
        spec,
        ..ServerConfig::default()
    };
    let mut state = AppState::new(Arc::new(engine), tokenizer, template, config);
    state.metrics.kv_received_bytes = kv_received;
    let state = Arc::new(state);
    runtime.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "tandem: serving {model_name} on http://{} ({device}, context {n_ctx}, KV budget {} MB, role {:?})",
            listener.local_addr()?,
            args.kv_budget >> 20,
            args.role
        );
        tandem_server::serve(listener, state, tandem_server::shutdown_signal()).await?;
        eprintln!("tandem: stopped");
        Ok(())
    })
}

/// Decode batch sizes the GPU warm-up steps through.
const WARM_UP_BATCHES: [usize; 10] = [2, 3, 4, 5, 6, 7, 8, 16, 32, 64];

/// The throwaway pass the engine thread runs on its backend before taking requests.
struct WarmUp {
    rows: Vec<usize>,
    batches: Vec<usize>,
    n_ctx: usize,
    verbose: bool,
}

impl WarmUp {
    fn run(&self, model: &DeviceModel) -> Result<()> {
        if self.rows.is_empty() && self.batches.is_empty() {
            return Ok(());
        }
        let took = on_model!(model, |m| tandem_engine::serve::warm_up(
            m,
            &self.rows,
            &self.batches,
            self.n_ctx
        ))
        .context("warming up the model")?;
        if self.verbose {
            eprintln!(
                "warm-up: chunks of {:?} rows, decode batches of {:?} in {:.0} ms",
                tandem_engine::serve::warm_up_rows(&self.rows, self.n_ctx),
                self.batches,
                took.as_secs_f64() * 1e3
            );
        }
        Ok(())
    }
}

/// What the engine thread needs to check the GPU.
struct GpuServe {
    verbose: bool,
    n_ctx: usize,
    kv_budget: usize,
}

/// On the engine thread, the weights on the GPU: a check that the KV budget holds a sequence.
fn check_gpu(cuda: &CudaModel, opts: &GpuServe) -> Result<()> {
    let per_sequence = cuda.kv_sizing(opts.n_ctx).bytes_at(opts.n_ctx);
    let mb = |b: usize| b as f64 / 1e6;
    if per_sequence > opts.kv_budget {
        bail!(
            "--kv-budget of {:.1} MB holds no sequence: on the GPU each one's KV cache is allocated whole, \
             {:.1} MB at context {}; raise --kv-budget or lower --ctx",
            mb(opts.kv_budget),
            mb(per_sequence),
            opts.n_ctx
        );
    }
    if opts.verbose {
        print_cuda_memory(cuda, 0);
        eprintln!(
            "kv: {:.1} MB per sequence on the GPU (the whole context of {}); the budget of {:.1} MB holds {} at once",
            mb(per_sequence),
            opts.n_ctx,
            mb(opts.kv_budget),
            opts.kv_budget / per_sequence
        );
    }
    if let Ok((free, _)) = cuda.gpu.mem_info() {
        if opts.kv_budget > free {
            eprintln!(
                "tandem: warning: --kv-budget ({:.1} MB) is more than the GPU's free memory ({:.1} MB): \
                 requests past what fits will fail to allocate",
                mb(opts.kv_budget),
                mb(free)
            );
        }
    }
    Ok(())
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

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("10gbit"), Ok(10_000_000_000));
        assert_eq!(parse_rate("1Gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("500mbit"), Ok(500_000_000));
        assert_eq!(parse_rate("2.5gbit"), Ok(2_500_000_000));
        assert_eq!(parse_rate("64kbit"), Ok(64_000));
        assert_eq!(parse_rate(" 1000000 "), Ok(1_000_000));
        assert_eq!(parse_rate("800bit"), Ok(800));
        for bad in [
            "", "fast", "10gb", "10 gbps", "-1gbit", "0", "4bit", "NaNgbit", "inf", "1e300", "gbit",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_in_seconds_parse() {
        assert_eq!(parse_secs("10"), Ok(10.0));
        assert_eq!(parse_secs("0.5"), Ok(0.5));
        for bad in ["-1", "soon", "NaN", "inf", "1e300"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
        assert_eq!(limit(0.0), None);
        assert_eq!(limit(0.25), Some(Duration::from_millis(250)));
    }
}
