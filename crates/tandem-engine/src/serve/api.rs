//! What the serving engine offers the HTTP layer: submit a generation, receive its events, read stats.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tandem_model::kv::wire::LayerRows;
use tandem_model::ExpertTraffic;
use tokio::sync::mpsc;

use crate::spec::{SpecSettings, SpecStats};
use crate::SamplingParams;

/// One generation request, already tokenized (the server owns the tokenizer and the chat template).
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end the generation (the model's end-of-generation tokens).
    pub stop_ids: Vec<u32>,
    /// Report the chosen token's logprob and this many alternatives per step (`None`: no logprobs).
    pub top_logprobs: Option<usize>,
    /// Speculative decoding for this request (`None`: the server's `--spec`).
    pub speculative: Option<SpecSettings>,
}

/// The log-probability of a token, with the best alternatives when asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// An end-of-generation token was sampled (it is reported as the last `Token`).
    Stop,
    /// The context filled up.
    ContextFull,
}

/// What a submitted request hears back, in order: `Started`, zero or more `Token`s, then `Done` or
/// `Failed`. Dropping the receiver cancels the request and frees its KV cache at once.
#[derive(Clone, Debug)]
pub enum Event {
    /// Prefill began: `prompt_tokens = reused + remote + read` (`reused` came from the prefix cache,
    /// `remote` rows from a prefill peer: see `PrefillRoute`).
    Started {
        prompt_tokens: usize,
        reused: usize,
        prefill: PrefillRoute,
    },
    /// KV rows of an export (`EngineHandle::export_kv`), in the order they are to be installed.
    KvRows(Box<LayerRows>),
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        reason: FinishReason,
        timings: RequestTimings,
    },
    Failed(String),
}

/// A KV export as the engine hands it out (`EngineHandle::export_kv`): its events, and the books of its
/// send buffer, which whoever sends the stream keeps by calling `KvBacklog::sent`.
pub struct KvExport {
    pub events: mpsc::UnboundedReceiver<Event>,
    pub backlog: Arc<KvBacklog>,
}

/// An export's send buffer: the bytes of the `Rows` frames (`wire::rows_frame_len`) the engine has
/// queued as `KvRows` events and the sender has not yet handed on. The engine queues rows only while
/// they fit within `limit` (one frame at a time when the limit is below a frame), and reads no more of
/// the prompt until every row it wrote is queued, so the rows of a slow transfer wait in its KV cache,
/// which is reserved anyway, and not in copies. Once it stops for want of room it is woken when the
/// sender has drained the buffer to half the limit, so it queues in large steps, not per slice sent.
pub struct KvBacklog {
    queued: AtomicUsize,
    limit: usize,
    /// The engine found no room and waits to be woken.
    stalled: AtomicBool,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl KvBacklog {
    pub fn new(limit: usize, wake: Box<dyn Fn() + Send + Sync>) -> Self {
        KvBacklog {
            queued: AtomicUsize::new(0),
            limit,
            stalled: AtomicBool::new(false),
            wake,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes of `Rows` frames queued and not yet handed on.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// The sender handed on `n` bytes of `Rows` frames.
    pub fn sent(&self, n: usize) {
        let before = self
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| Some(q.saturating_sub(n)))
            .unwrap_or_else(|q| q);
        // `stall` sets the flag before it looks at the count again, so either it sees this drain or
        // this sees its flag: no wake-up is lost.
        if before.saturating_sub(n) <= self.resume_at() && self.stalled.swap(false, Ordering::SeqCst) {
            (self.wake)();
        }
    }

    /// Room for more frames within the limit.
    pub(crate) fn room(&self) -> usize {
        self.limit.saturating_sub(self.queued())
    }

    pub(crate) fn queue(&self, n: usize) {
        self.queued.fetch_add(n, Ordering::SeqCst);
    }

    /// The engine found no room: it is woken once the buffer drained to `resume_at`. True when it
    /// already has (the engine goes on at once).
    pub(crate) fn stall(&self) -> bool {
        self.stalled.store(true, Ordering::SeqCst);
        if self.queued() <= self.resume_at() {
            self.stalled.store(false, Ordering::SeqCst);
            return true;
        }
        false
    }

    fn resume_at(&self) -> usize {
        self.limit / 2
    }
}

impl std::fmt::Debug for KvBacklog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvBacklog")
            .field("queued", &self.queued())
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Where a request's prompt was read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillRoute {
    /// Here, with no prefill peer configured.
    #[default]
    Local,
    /// Here: fewer new tokens than `RemotePrefill::min_tokens`, not worth the wire hop.
    Short,
    /// A peer sent the KV of the first `rows` positions (all but the last prompt token, read here),
    /// after `retries` peers before it failed before sending any (`RemoteMsg::Retry`).
    Remote { rows: usize, retries: usize },
    /// Here, after the remote prefill failed for `cause` (one of `FALLBACK_CAUSES`) on the last peer
    /// tried, `retries` peers having failed before it.
    Fallback { cause: &'static str, retries: usize },
}

/// Why a remote prefill fell back to a local one: the peer refused (an HTTP error, or its own failure
/// mid-stream), could not be reached, took longer than the timeout, sent a frame whose checksum did not
/// match, serves another model, dropped the connection mid-transfer, sent frames that break the format
/// or the install rules, or the detached cache did not fit the KV budget.
pub const FALLBACK_CAUSES: [&str; 8] = [
    "refused",
    "unreachable",
    "timeout",
    "checksum",
    "identity",
    "dropped",
    "protocol",
    "kv_budget",
];

/// What a remote prefill's fetch reports to the engine, in order: `Retry`s, `Rows`, then `Done` or
/// `Failed`.
#[derive(Debug)]
pub enum RemoteMsg {
    /// A peer failed before it sent any rows, for `cause` (one of `FALLBACK_CAUSES`): the fetch goes on
    /// with the next peer, into the same (still empty) detached cache.
    Retry {
        cause: &'static str,
        detail: String,
    },
    Rows(Box<LayerRows>),
    /// Every frame came and checked out.
    Done,
    Failed {
        cause: &'static str,
        detail: String,
    },
}

/// Prefill peers: fetch the KV of a prompt's positions `from..tokens.len()` from one of them (the
/// caller holds `0..from`; the peer reads the whole prompt), trying the next when one fails before it
/// sent any rows.
pub trait PrefillPeers: Send + Sync + 'static {
    /// Starts a fetch; its messages arrive on the returned channel, and `wake` is called after each
    /// one is sent. Dropping the receiver cancels it.
    fn fetch(&self, tokens: Vec<u32>, from: usize, wake: Arc<dyn Fn() + Send + Sync>) -> mpsc::Receiver<RemoteMsg>;
}

/// A decode node's remote prefill: where, and from how many new prompt tokens on.
#[derive(Clone)]
pub struct RemotePrefill {
    pub peers: Arc<dyn PrefillPeers>,
    /// Prompts with fewer new tokens (after prefix reuse) are read locally.
    pub min_tokens: usize,
}

impl std::fmt::Debug for RemotePrefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePrefill")
            .field("min_tokens", &self.min_tokens)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestTimings {
    /// Waiting in the queue before prefill started.
    pub queued: Duration,
    /// Submission to first token.
    pub ttft: Duration,
    /// First token to last token.
    pub decode: Duration,
    pub completion_tokens: usize,
}

/// Why a request was refused before it ran.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt has {n_prompt} tokens but the context holds {n_ctx}")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens {requested} is over the limit of {limit}")]
    MaxTokens { requested: usize, limit: usize },
    #[error("the request needs {need} bytes of KV cache but the server's whole budget is {budget}")]
    KvBudget { need: usize, budget: usize },
    #[error("the server is busy: {queued} requests already wait")]
    QueueFull { queued: usize },
    #[error("the engine has stopped")]
    ShuttingDown,
    #[error("this server does not export KV")]
    NoKvExport,
    #[error("{0}")]
    Speculative(String),
}

/// A snapshot of the engine for `/metrics`, `/health` and `/slots`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub queued: usize,
    pub running: usize,
    pub kv_bytes_used: usize,
    pub kv_bytes_budget: usize,
    /// What running sequences may grow to, summed (their reservations).
    pub kv_bytes_reserved: usize,
    /// What cached conversations and checkpoints hold.
    pub kv_bytes_cached: usize,
    /// Steps after which the engine found its KV books broken (promised bytes past the budget, or the
    /// pool holding more than promised): always 0 unless there is a bug.
    pub kv_accounting_violations: u64,
    pub cached_sequences: usize,
    pub prefill_tokens_total: u64,
    pub decode_tokens_total: u64,
    pub prefix_hits_total: u64,
    pub prefix_tokens_reused_total: u64,
    /// Tokens request draft caches took over from finished requests' (a draft model's prefix reuse).
    pub draft_prefix_tokens_reused_total: u64,
    pub requests_total: u64,
    pub n_ctx: usize,
    /// Seconds spent in prefill chunks and in decode steps (for tokens/s).
    pub prefill_seconds_total: f64,
    pub decode_seconds_total: f64,
    /// The longest prefill chunk taken while a decoder was waiting, and the longest decode step.
    pub max_busy_prefill_chunk_seconds: f64,
    pub max_decode_step_seconds: f64,
    /// Prompts read from a peer's KV, with the rows installed.
    pub remote_prefills_total: u64,
    pub remote_rows_total: u64,
    /// Prompts read here because they were too short for the wire hop.
    pub local_short_prefills_total: u64,
    /// Remote prefills that fell back, by cause (`FALLBACK_CAUSES`, same order).
    pub remote_fallbacks_total: [u64; FALLBACK_CAUSES.len()],
    /// Prefill peers given up before they sent any rows, for the next peer (`RemoteMsg::Retry`).
    pub remote_retries_total: u64,
    /// KV exports served to decode nodes, and the rows they sent.
    pub kv_exports_total: u64,
    pub kv_exported_rows_total: u64,
    /// Speculative decoding over all requests: verify passes, drafted and accepted tokens, decode steps
    /// and the tokens they produced.
    pub spec: SpecStats,
    /// A mixture's experts in host memory: slot cache hits and copies, streamed and skipped experts,
    /// bytes copied (`None` when every expert is resident).
    pub expert_traffic: Option<ExpertTraffic>,
}

/// The interface the HTTP layer programs against (the real engine, or a fake in tests).
pub trait EngineHandle: Send + Sync + 'static {
    fn submit(&self, request: GenerationRequest) -> Result<mpsc::UnboundedReceiver<Event>, SubmitError>;
    fn stats(&self) -> EngineStats;
    /// Drops every cached (finished) conversation; returns how many.
    fn flush_cache(&self) -> usize;
    /// Reads `tokens` and sends the KV of positions `from..tokens.len()` (per layer those it keeps at the
    /// end) as `KvRows` events (`Started` first, `Done` or `Failed` last), for a decode node that holds
    /// `0..from` to install: what a prefill node serves. The events wait within the export's send
    /// buffer (`KvBacklog`): the sender reports what it handed on.
    fn export_kv(&self, tokens: Vec<u32>, from: usize) -> Result<KvExport, SubmitError> {
        let _ = (tokens, from);
        Err(SubmitError::NoKvExport)
    }
    /// Stops accepting work; running requests finish or are cancelled by their deadline.
    fn shutdown(&self);
}
