//! The serving loop: one thread owns the model and every sequence.
//!
//! Each turn of the loop grants work in two classes, decode first:
//! 1. **Decode**: every sequence that has a sampled token waiting advances by one row, all of them in one
//!    forward pass (one pass over the weights for the whole batch). A sequence that speculates feeds its
//!    drafted tokens after that row in the same pass (`speculate`): a verify pass is decode work.
//! 2. **Prefill**: one chunk of prompt rows — `prefill_chunk` (512), or `prefill_chunk_busy` (64) while
//!    any decoder is running, so a long prompt never holds a decoder back by more than one short chunk.
//!    The chunk's rows go to the sequences still reading their prompts, least left first, so a short
//!    chat arriving during a long document is not queued behind all of it.
//!
//! A row's logits do not depend on what it was batched with (every kernel is row-exact), so a sequence
//! produces the same tokens alone or beside others, whatever the chunking.
//!
//! Memory: all KV storage (running sequences, cached conversations, checkpoints) comes from one pool
//! capped at `kv_budget_bytes`, and the loop keeps this invariant at every step:
//!
//! > **reserved + cached <= budget**, where *reserved* is the sum over running sequences of the bytes
//! > each can reach (prompt + max_tokens, capped by the context; a ring at most its capacity; measured
//! > from the storage it already holds when it continues a cached conversation), and *cached* is what
//! > finished conversations and every checkpoint hold. A running sequence never holds more than its
//! > reservation.
//!
//! So the pool always has room for a running sequence to grow, and no request fails for KV space once
//! admitted. Cached conversations are what gives way: an admission, or a checkpoint, that does not fit
//! gives back cached conversations least recently used first; a request that still does not fit waits
//! in a bounded queue (beyond it new ones are refused). The loop checks the invariant after every step
//! and counts any breach (`kv_accounting_violations`).
//!
//! Reuse: a finished conversation stays cached (within `cache_budget_bytes`) so a follow-up turn, a
//! regenerated reply or another conversation with the same long prefix continues from its KV: the cache
//! is cut back to the common prefix when every layer still holds what that needs, else restored from the
//! latest checkpoint of its sliding-window rings that reaches it (one is taken when each prompt has been
//! read; a ring keeps `RING_SLACK` rows past its window, so a checkpoint also serves positions up to that
//! many rows before its own, such as a repeated prompt's last token).
//!
//! The loop is generic over the backend (`ServingBackend`): the backend is made on the loop's thread
//! (`start_with`), since a GPU backend's context belongs to the thread that made it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tandem_model::kv::{wire, RING_SLACK};
use tandem_model::{
    Backend, KvSizing, LogitRows, Logits, Model, ModelError, SequenceCache, ServingBackend, ServingCache, Span,
};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::api::*;
use super::prefix_cache::{checkpoint_bytes, Conversation, PrefixCache};
use crate::spec::{SpecMode, SpecSettings};

mod speculate;
use crate::score::{log_sum_exp, top_k};
use crate::Sampler;

#[derive(Clone, Debug)]
pub struct ServingConfig {
    /// Context per sequence.
    pub n_ctx: usize,
    pub prefill_chunk: usize,
    /// Prefill chunk while any decoder is running.
    pub prefill_chunk_busy: usize,
    /// KV bytes all running sequences may reserve together.
    pub kv_budget_bytes: usize,
    /// KV bytes finished conversations may keep for reuse.
    pub cache_budget_bytes: usize,
    /// Requests waiting for memory beyond which new ones are refused.
    pub max_queue: usize,
    pub max_tokens_limit: usize,
    /// A decode node's prefill peers (`None`: every prompt is read here).
    pub remote: Option<RemotePrefill>,
    /// A KV export's send buffer (`KvBacklog`): the bytes of rows queued for the sender and not yet
    /// handed on, beyond which the engine stops reading that prompt until the sender catches up.
    pub kv_send_buffer_bytes: usize,
    /// Speculative decoding for requests that do not say (`--spec`).
    pub spec: SpecSettings,
}

impl Default for ServingConfig {
    fn default() -> Self {
        ServingConfig {
            n_ctx: 4096,
            prefill_chunk: 512,
            prefill_chunk_busy: 64,
            kv_budget_bytes: 1 << 30,
            // All of the KV budget: cached conversations give way to admitted requests anyway.
            cache_budget_bytes: 1 << 30,
            max_queue: 64,
            max_tokens_limit: 4096,
            remote: None,
            // Several 512-row chunks of a small model, one of an 8B model (128 KiB a position): the
            // link stays busy while the next chunk is read, and a slow one holds at most this much.
            kv_send_buffer_bytes: 64 << 20,
            spec: SpecSettings::default(),
        }
    }
}

struct Pending {
    request: GenerationRequest,
    events: UnboundedSender<Event>,
    submitted: Instant,
    /// A KV export (`export_kv`) from this row on, and its send buffer: read the prompt, send its rows,
    /// sample nothing.
    export: Option<(usize, Arc<KvBacklog>)>,
}

struct Shared {
    inbox: Mutex<VecDeque<Pending>>,
    wake: Condvar,
    stats: Mutex<EngineStats>,
    stopping: AtomicBool,
    flush: Mutex<Option<std::sync::mpsc::Sender<usize>>>,
    /// A remote prefill's fetch has sent something, or an export's sender drained its buffer, since the
    /// loop last looked.
    ready: AtomicBool,
}

/// The engine handle: cheap to share, talks to the loop thread.
pub struct ServingEngine {
    shared: Arc<Shared>,
    config: ServingConfig,
    /// Sizes a request's KV need (`bytes_at`) without the model.
    sizing: KvSizing,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// A draft model runs beside the target (`start_with_draft`).
    has_draft: bool,
}

impl ServingEngine {
    /// Starts the loop thread on the CPU model. KV blocks for all sequences (running and cached) come
    /// from one pool capped at `kv_budget_bytes`.
    pub fn start(model: Model, config: ServingConfig) -> Self {
        Self::start_with(move || Ok::<_, std::convert::Infallible>(model), config).unwrap_or_else(|e| match e {})
    }

    /// Starts the loop thread, which makes its backend with `load` and owns it from then on; a load
    /// error comes back here. KV for all sequences (running and cached) is capped at `kv_budget_bytes`.
    pub fn start_with<B, E>(
        load: impl FnOnce() -> Result<B, E> + Send + 'static,
        config: ServingConfig,
    ) -> Result<Self, E>
    where
        B: ServingBackend + 'static,
        E: Send + 'static,
    {
        Self::start_with_draft(move || load().map(|model| (model, None)), false, config)
    }

    /// `start_with`, where `load` also makes a draft model (sharing the target's vocabulary) for
    /// requests that speculate with one (`has_draft` says whether it will). The draft's caches come
    /// from a pool of its own, capped at `kv_budget_bytes` too; a request whose draft finds no room
    /// decodes without drafts.
    pub fn start_with_draft<B, E>(
        load: impl FnOnce() -> Result<(B, Option<B>), E> + Send + 'static,
        has_draft: bool,
        config: ServingConfig,
    ) -> Result<Self, E>
    where
        B: ServingBackend + 'static,
        E: Send + 'static,
    {
        let shared = Arc::new(Shared {
            inbox: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stats: Mutex::new(EngineStats {
                kv_bytes_budget: config.kv_budget_bytes,
                n_ctx: config.n_ctx,
                ..Default::default()
            }),
            stopping: AtomicBool::new(false),
            flush: Mutex::new(None),
            ready: AtomicBool::new(false),
        });
        let loop_shared = Arc::clone(&shared);
        let loop_config = config.clone();
        let (ready_tx, ready) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("tandem-engine".into())
            .spawn(move || {
                let (mut model, draft) = match load() {
                    Ok(models) => models,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                model.set_kv_budget(loop_config.kv_budget_bytes);
                model.set_ring_slack(RING_SLACK);
                let draft = draft.map(|mut d| {
                    d.set_kv_budget(loop_config.kv_budget_bytes);
                    d.set_ring_slack(RING_SLACK);
                    speculate::DraftRunner {
                        engine: crate::Engine::new(d),
                        n_ctx: loop_config.n_ctx,
                        read: crate::spec::draft_model::DraftRead {
                            chunk: loop_config.prefill_chunk_busy.max(1),
                            most: loop_config.prefill_chunk_busy.max(1),
                        },
                        kept: Vec::new(),
                        reused_tokens: 0,
                    }
                });
                let sizing = model.kv_sizing(loop_config.n_ctx);
                if ready_tx.send(Ok(sizing.clone())).is_ok() {
                    Loop::new(model, draft, sizing, loop_config, loop_shared).run();
                }
            })
            .expect("spawning the engine thread");
        let sizing = match ready.recv() {
            Ok(Ok(sizing)) => sizing,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            // The sender went away unused: only a panic while loading does that, and it is the caller's.
            Err(_) => std::panic::resume_unwind(
                thread
                    .join()
                    .err()
                    .unwrap_or_else(|| Box::new("the engine thread ended without reporting its load")),
            ),
        };
        Ok(ServingEngine {
            shared,
            config,
            sizing,
            thread: Mutex::new(Some(thread)),
            has_draft,
        })
    }

    fn enqueue(
        &self,
        request: GenerationRequest,
        export: Option<(usize, Arc<KvBacklog>)>,
    ) -> Result<tokio::sync::mpsc::UnboundedReceiver<Event>, SubmitError> {
        let mut inbox = self.shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
        if inbox.len() >= self.config.max_queue {
            return Err(SubmitError::QueueFull { queued: inbox.len() });
        }
        let (tx, rx) = unbounded_channel();
        inbox.push_back(Pending {
            request,
            events: tx,
            submitted: Instant::now(),
            export,
        });
        drop(inbox);
        self.shared.wake.notify_one();
        Ok(rx)
    }

    /// KV bytes a request reaching `positions` reserves (on the GPU: the whole cache at any length).
    pub fn kv_bytes_for(&self, positions: usize) -> usize {
        self.sizing.bytes_at(positions.min(self.config.n_ctx))
    }
}

impl EngineHandle for ServingEngine {
    fn submit(&self, request: GenerationRequest) -> Result<tokio::sync::mpsc::UnboundedReceiver<Event>, SubmitError> {
        if self.shared.stopping.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if request.prompt.len() >= self.config.n_ctx {
            return Err(SubmitError::PromptTooLong {
                n_prompt: request.prompt.len(),
                n_ctx: self.config.n_ctx,
            });
        }
        if request.max_tokens > self.config.max_tokens_limit {
            return Err(SubmitError::MaxTokens {
                requested: request.max_tokens,
                limit: self.config.max_tokens_limit,
            });
        }
        if let Some(spec) = request.speculative {
            spec.validated().map_err(|e| SubmitError::Speculative(e.to_string()))?;
            if spec.mode == SpecMode::Draft && !self.has_draft {
                return Err(SubmitError::Speculative(
                    "this server has no draft model (serve --draft-model): use mode \"lookup\"".into(),
                ));
            }
        }
        let need = self.kv_bytes_for(request.prompt.len() + request.max_tokens);
        if need > self.config.kv_budget_bytes {
            return Err(SubmitError::KvBudget {
                need,
                budget: self.config.kv_budget_bytes,
            });
        }
        self.enqueue(request, None)
    }

    fn export_kv(&self, tokens: Vec<u32>, from: usize) -> Result<KvExport, SubmitError> {
        if self.shared.stopping.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        if tokens.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if tokens.len() >= self.config.n_ctx {
            return Err(SubmitError::PromptTooLong {
                n_prompt: tokens.len(),
                n_ctx: self.config.n_ctx,
            });
        }
        let need = self.kv_bytes_for(tokens.len());
        if need > self.config.kv_budget_bytes {
            return Err(SubmitError::KvBudget {
                need,
                budget: self.config.kv_budget_bytes,
            });
        }
        let request = GenerationRequest {
            prompt: tokens,
            max_tokens: 0,
            sampling: Default::default(),
            stop_ids: Vec::new(),
            top_logprobs: None,
            speculative: None,
        };
        let backlog = Arc::new(KvBacklog::new(self.config.kv_send_buffer_bytes, waker(&self.shared)));
        let events = self.enqueue(request, Some((from, backlog.clone())))?;
        Ok(KvExport { events, backlog })
    }

    fn stats(&self) -> EngineStats {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn flush_cache(&self) -> usize {
        let (tx, rx) = std::sync::mpsc::channel();
        *self.shared.flush.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        self.shared.wake.notify_one();
        rx.recv_timeout(Duration::from_secs(10)).unwrap_or(0)
    }

    fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Wakes the loop from another thread (a fetch's message, an export's drained buffer). The flag is set
/// under the inbox lock, which `wait_for_work` holds from its look at the flag to its wait: no wake-up
/// is lost.
fn waker(shared: &Arc<Shared>) -> Box<dyn Fn() + Send + Sync> {
    let shared = Arc::clone(shared);
    Box::new(move || {
        let _inbox = shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
        shared.ready.store(true, Ordering::Release);
        shared.wake.notify_one();
    })
}

impl Drop for ServingEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

enum Phase {
    /// `read` prompt tokens are in the cache.
    Prefill { read: usize },
    /// `next` was sampled and sent, and is fed in the next decode step.
    Decode { next: u32 },
}

struct Sequence<K: ServingCache> {
    request: GenerationRequest,
    events: UnboundedSender<Event>,
    kv: K,
    /// Tokens whose K/V are in `kv`, in order.
    fed: Vec<u32>,
    phase: Phase,
    sampler: Sampler,
    history: Vec<u32>,
    generated: usize,
    /// Pool bytes the sequence may reach (see the invariant above).
    reserved: usize,
    /// Checkpoints at the ends of this conversation's prompts (oldest first, at most `MAX_CHECKPOINTS`).
    checkpoints: Vec<K::Checkpoint>,
    /// A forward pass failed: its cache may be half written, so it is not kept for reuse.
    failed: bool,
    submitted: Instant,
    started: Instant,
    first_token: Option<Instant>,
    /// Finished (its last event sent); leaves the running set at the end of the step.
    done: bool,
    /// A KV export's progress.
    export: Option<Export>,
    /// Drafting state when the request speculates.
    spec: Option<speculate::SpecState<K>>,
}

struct Export {
    /// Per layer, the first row not yet sent (none before the export's `from`).
    next: Vec<usize>,
    backlog: Arc<KvBacklog>,
    /// Every row written so far is queued: the next chunk may be read (a ring's rows must go out
    /// before it overwrites them).
    shipped: bool,
}

/// A remote prefill under way: the peer's rows go into `detached`, a cache no step reads, which
/// becomes the sequence's cache only once every frame came and checked out (`Loop::pump_remote`).
/// A continued conversation's detached cache starts as a copy of it (`ServingCache::copy_from`), so
/// only the new rows travel and the conversation itself stays as it was for the fallback.
struct RemoteFill<K: ServingCache> {
    pending: Pending,
    /// The cached conversation the prompt continues (cut back to `from`), kept for a local fallback.
    conversation: Option<Conversation<K>>,
    detached: K,
    /// The stream fills positions `from..to` (`to`: all but the last prompt token) on top of the
    /// conversation's `0..from`.
    from: usize,
    to: usize,
    rx: tokio::sync::mpsc::Receiver<RemoteMsg>,
    /// Pool bytes reserved: the detached cache's reach, plus the conversation's for the fallback.
    reserved: usize,
    /// What the conversation (or a fresh cache) reserves when the prompt is read here after all.
    need_local: usize,
    /// Peers that failed before sending any rows (`RemoteMsg::Retry`).
    retries: usize,
}

/// Checkpoints kept per conversation: the ends of its last few prompts.
const MAX_CHECKPOINTS: usize = 4;

/// One forward pass and the seconds it took.
fn timed_forward<B: Backend>(
    model: &B,
    ws: &mut B::Scratch,
    spans: &mut [Span<B::Kv>],
) -> (Result<Vec<Logits>, ModelError>, f64) {
    let t0 = Instant::now();
    let result = model.run(ws, spans);
    (result, t0.elapsed().as_secs_f64())
}

struct Loop<B: ServingBackend> {
    model: B,
    config: ServingConfig,
    shared: Arc<Shared>,
    ws: B::Scratch,
    queue: VecDeque<Pending>,
    running: Vec<Sequence<B::Kv>>,
    cache: PrefixCache<B::Kv>,
    /// The running sequences' reservations, summed.
    reserved: usize,
    /// Sizes a request's KV need (`bytes_at`).
    sizing: KvSizing,
    /// Remote prefills under way (invisible to the decode and prefill steps).
    remote: Vec<RemoteFill<B::Kv>>,
    /// The draft model of requests that speculate with one.
    draft: Option<speculate::DraftRunner<B>>,
}

impl<B: ServingBackend> Loop<B> {
    fn new(
        model: B,
        draft: Option<speculate::DraftRunner<B>>,
        sizing: KvSizing,
        config: ServingConfig,
        shared: Arc<Shared>,
    ) -> Self {
        Loop {
            sizing,
            model,
            draft,
            config,
            shared,
            ws: B::Scratch::default(),
            queue: VecDeque::new(),
            running: Vec::new(),
            cache: PrefixCache::default(),
            reserved: 0,
            remote: Vec::new(),
        }
    }

    fn run(mut self) {
        loop {
            self.take_inbox();
            if self.shared.stopping.load(Ordering::Acquire) {
                for s in self.running.drain(..) {
                    let _ = s.events.send(Event::Failed("the server is shutting down".into()));
                }
                for p in self.queue.drain(..) {
                    let _ = p.events.send(Event::Failed("the server is shutting down".into()));
                }
                for f in self.remote.drain(..) {
                    let _ = f
                        .pending
                        .events
                        .send(Event::Failed("the server is shutting down".into()));
                }
                return;
            }
            self.handle_flush();
            self.drop_cancelled();
            self.admit();
            self.pump_remote();
            self.pump_exports();
            let decoded = self.decode_step();
            let prefilled = self.prefill_step();
            self.publish_stats();
            if !decoded && !prefilled {
                self.wait_for_work();
            }
        }
    }

    fn take_inbox(&mut self) {
        let mut inbox = self.shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
        self.queue.extend(inbox.drain(..));
    }

    fn wait_for_work(&mut self) {
        let inbox = self.shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
        // A fetch sets the flag under the inbox lock before it notifies, so no wake-up is lost.
        let ready = self.shared.ready.swap(false, Ordering::AcqRel);
        if inbox.is_empty() && !ready && !self.shared.stopping.load(Ordering::Acquire) {
            let _ = self.shared.wake.wait_timeout(inbox, Duration::from_millis(50));
        }
    }

    fn handle_flush(&mut self) {
        let reply = self.shared.flush.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(reply) = reply {
            if let Some(d) = &mut self.draft {
                d.kept.clear();
            }
            let _ = reply.send(self.cache.clear());
        }
    }

    /// A client that went away frees its sequence at once.
    fn drop_cancelled(&mut self) {
        let before = self.running.len();
        let mut freed = 0;
        self.running.retain(|s| {
            let keep = !s.events.is_closed();
            if !keep {
                freed += s.reserved;
            }
            keep
        });
        self.remote.retain(|f| {
            let keep = !f.pending.events.is_closed();
            if !keep {
                freed += f.reserved;
            }
            keep
        });
        self.reserved -= freed;
        if self.running.len() != before {
            self.queue.retain(|p| !p.events.is_closed());
        }
    }

    /// Pool bytes promised: the running sequences' reservations, plus what cached conversations and
    /// every checkpoint hold. The invariant keeps it within the budget.
    fn committed(&self) -> usize {
        self.reserved
            + self.cache.bytes()
            + self
                .running
                .iter()
                .map(|s| checkpoint_bytes(&s.checkpoints))
                .sum::<usize>()
            + self
                .remote
                .iter()
                .filter_map(|f| f.conversation.as_ref())
                .map(|c| checkpoint_bytes(&c.checkpoints))
                .sum::<usize>()
    }

    /// Gives back cached conversations, least recently used first, until `extra` more bytes fit the
    /// budget; false when they cannot.
    fn make_room(&mut self, extra: usize) -> bool {
        while self.committed() + extra > self.config.kv_budget_bytes {
            if !self.cache.evict_lru() {
                return false;
            }
        }
        true
    }

    /// Moves queued requests into the running set while their reservations fit the budget (cached
    /// conversations giving way), continuing each from the cached conversation it shares the longest
    /// prefix with.
    fn admit(&mut self) {
        while let Some(p) = self.queue.front() {
            if p.events.is_closed() {
                self.queue.pop_front();
                continue;
            }
            let prompt = &p.request.prompt;
            let reach = (prompt.len() + p.request.max_tokens).min(self.config.n_ctx);
            let mut taken = self.cache.take_best(prompt);
            if let Some((mut c, last_used)) = taken.take() {
                match c.cut_back_for(prompt) {
                    0 => self.cache.put_back(c, last_used),
                    _ => taken = Some((c, last_used)),
                }
            }
            let mut need = match &taken {
                Some((c, _)) => c.kv.bytes_reaching(reach),
                None => self.sizing.bytes_at(reach),
            };
            let held = taken.as_ref().map_or(0, |(c, _)| checkpoint_bytes(&c.checkpoints));
            let reused = taken.as_ref().map_or(0, |(c, _)| c.kv.len());
            // The stream fills `reused..to`; the last prompt token is read here for its logits.
            let to = prompt.len().saturating_sub(1);
            let mut route = match &self.config.remote {
                None => PrefillRoute::Local,
                Some(_) if p.export.is_some() => PrefillRoute::Local,
                Some(r) if to <= reused || prompt.len() - reused < r.min_tokens => PrefillRoute::Short,
                Some(_) => PrefillRoute::Remote {
                    rows: to - reused,
                    retries: 0,
                },
            };
            // A fresh request's detached cache becomes its cache: the same reservation. One continuing a
            // conversation keeps the conversation for the fallback, so the detached copy of it comes on
            // top, reaching as far (the copy holds the conversation's storage and grows as it would).
            let mut detached_need = 0;
            if matches!(route, PrefillRoute::Remote { .. }) && taken.is_some() {
                if self.make_room(need + held + need) {
                    detached_need = need;
                } else {
                    route = PrefillRoute::Fallback {
                        cause: "kv_budget",
                        retries: 0,
                    };
                }
            }
            if !self.make_room(need + held) {
                if !self.running.is_empty() || !self.remote.is_empty() {
                    if let Some((c, last_used)) = taken {
                        self.cache.put_back(c, last_used);
                    }
                    return;
                }
                // Nothing runs and nothing else is cached: only the conversation taken over can stand in
                // the way. Start afresh (`submit` refused any request whose fresh reservation cannot fit).
                taken = None;
                need = self.sizing.bytes_at(reach);
            }
            let Some(p) = self.queue.pop_front() else { return };
            if let (PrefillRoute::Remote { .. }, Some(remote)) = (route, &self.config.remote) {
                let detached = self.model.new_kv(self.config.n_ctx).and_then(|mut kv| {
                    if let Some((c, _)) = &taken {
                        kv.copy_from(&c.kv)?;
                    }
                    Ok(kv)
                });
                match detached {
                    Ok(detached) => {
                        let wake: Arc<dyn Fn() + Send + Sync> = Arc::from(waker(&self.shared));
                        let rx = remote.peers.fetch(p.request.prompt[..to].to_vec(), reused, wake);
                        let reserved = need + detached_need;
                        self.reserved += reserved;
                        self.remote.push(RemoteFill {
                            pending: p,
                            conversation: taken.map(|(c, _)| c),
                            detached,
                            from: reused,
                            to,
                            rx,
                            reserved,
                            need_local: need,
                            retries: 0,
                        });
                        continue;
                    }
                    // Device memory can run out below the budget: read the prompt here instead.
                    Err(_) => {
                        route = PrefillRoute::Fallback {
                            cause: "kv_budget",
                            retries: 0,
                        }
                    }
                }
            }
            let conversation = match taken {
                Some((c, _)) => c,
                // Device memory can run out below the budget (the GPU is shared with the weights).
                None => match self.model.new_kv(self.config.n_ctx) {
                    Ok(kv) => Conversation {
                        fed: Vec::new(),
                        kv,
                        checkpoints: Vec::new(),
                    },
                    Err(e) => {
                        let _ = p.events.send(Event::Failed(format!("allocating the KV cache: {e}")));
                        continue;
                    }
                },
            };
            self.start(p, conversation, need, route);
        }
    }

    /// Puts an admitted request into the running set on `conversation` (its cache holds the prompt's
    /// first positions), reserving `need` bytes.
    fn start(&mut self, p: Pending, conversation: Conversation<B::Kv>, need: usize, route: PrefillRoute) {
        let read = conversation.kv.len();
        let reused = match route {
            PrefillRoute::Remote { rows, .. } => read - rows,
            _ => read,
        };
        let _ = p.events.send(Event::Started {
            prompt_tokens: p.request.prompt.len(),
            reused,
            prefill: route,
        });
        {
            let mut st = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
            st.requests_total += 1;
            if reused > 0 {
                st.prefix_hits_total += 1;
                st.prefix_tokens_reused_total += reused as u64;
            }
            match route {
                PrefillRoute::Local => {}
                PrefillRoute::Short => st.local_short_prefills_total += 1,
                PrefillRoute::Remote { rows, .. } => {
                    st.remote_prefills_total += 1;
                    st.remote_rows_total += rows as u64;
                }
                PrefillRoute::Fallback { cause, .. } => {
                    if let Some(i) = FALLBACK_CAUSES.iter().position(|c| *c == cause) {
                        st.remote_fallbacks_total[i] += 1;
                    }
                }
            }
        }
        self.reserved += need;
        let sampler = Sampler::new(p.request.sampling.clone());
        let export = p.export.map(|(from, backlog)| Export {
            next: vec![from; self.model.config().layers.len()],
            backlog,
            shipped: false,
        });
        let settings = p.request.speculative.unwrap_or(self.config.spec);
        let spec = speculate::SpecState::new(settings, &p.request.sampling);
        self.running.push(Sequence {
            spec,
            history: p.request.prompt.clone(),
            phase: Phase::Prefill { read },
            request: p.request,
            events: p.events,
            kv: conversation.kv,
            fed: conversation.fed,
            sampler,
            generated: 0,
            reserved: need,
            checkpoints: conversation.checkpoints,
            failed: false,
            submitted: p.submitted,
            started: Instant::now(),
            first_token: None,
            done: false,
            export,
        });
        // An export sends the rows it reused at once (as far as its buffer takes them).
        let last = self.running.len() - 1;
        self.ship(last);
        self.finish_export_if_done(last);
    }

    /// Queues an export's rows written since they were last queued, as far as its send buffer takes
    /// them: per layer, those its cache will still hold when the prompt is read (a ring's last rows), in
    /// frames of at most `MAX_FRAME_ROWS`. Records whether every written row is queued. A failure fails
    /// the export.
    fn ship(&mut self, i: usize) {
        let width = self.model.config().kv_width();
        let s = &mut self.running[i];
        let Some(export) = s.export.as_mut() else { return };
        let to = s.request.prompt.len();
        let end = s.kv.len();
        let mut rows = 0u64;
        export.shipped = true;
        'layers: for (layer, keep_from) in s.kv.export_from(to).into_iter().enumerate() {
            let mut from = keep_from.max(export.next[layer]);
            while from < end {
                let fit = |backlog: &KvBacklog| {
                    let room = backlog.room().saturating_sub(wire::rows_frame_len(0, width));
                    (room / (4 * width).max(1)).min(end - from).min(wire::MAX_FRAME_ROWS)
                };
                let mut n = fit(&export.backlog);
                if n == 0 {
                    if export.backlog.queued() > 0 && !export.backlog.stall() {
                        export.shipped = false;
                        break 'layers;
                    }
                    // The buffer drained meanwhile (to half, or empty). Should a one-row frame still
                    // not fit (a limit below two of them), one row goes anyway: the export goes on,
                    // a frame at a time, and the engine never spins waiting on the sender.
                    n = fit(&export.backlog).max(1);
                }
                match s.kv.export_rows(layer, from, from + n) {
                    Ok(r) => {
                        export.backlog.queue(wire::rows_frame_len(n, width));
                        let _ = s.events.send(Event::KvRows(Box::new(r)));
                        rows += n as u64;
                        from += n;
                        export.next[layer] = from;
                    }
                    Err(e) => {
                        let _ = s.events.send(Event::Failed(format!("exporting KV: {e}")));
                        s.failed = true;
                        s.done = true;
                        return;
                    }
                }
            }
        }
        let mut st = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.kv_exported_rows_total += rows;
    }

    /// Queues what exports waiting on their send buffers now have room for.
    fn pump_exports(&mut self) {
        for i in 0..self.running.len() {
            let s = &self.running[i];
            if !s.done && s.export.as_ref().is_some_and(|e| !e.shipped) {
                self.ship(i);
                self.finish_export_if_done(i);
            }
        }
        self.retire_finished();
    }

    /// Installs what the remote prefills' fetches sent; a fill that completed swaps its detached cache
    /// in, one that failed discards it (its blocks back to the pool) and reads the prompt here.
    fn pump_remote(&mut self) {
        let mut i = 0;
        while i < self.remote.len() {
            match Self::pump_one(&mut self.remote[i], &self.shared) {
                None => i += 1,
                Some(outcome) => {
                    let fill = self.remote.swap_remove(i);
                    self.finish_fill(fill, outcome);
                }
            }
        }
    }

    /// `None` while the fetch goes on; else whether the detached cache is complete (or why not).
    fn pump_one(f: &mut RemoteFill<B::Kv>, shared: &Shared) -> Option<Result<(), (&'static str, String)>> {
        loop {
            match f.rx.try_recv() {
                Ok(RemoteMsg::Rows(rows)) => {
                    if let Err(e) = f.detached.install_rows(&rows, f.to) {
                        let cause = match e {
                            ModelError::KvFull { .. } => "kv_budget",
                            _ => "protocol",
                        };
                        return Some(Err((cause, e.to_string())));
                    }
                }
                Ok(RemoteMsg::Done) => {
                    return Some(
                        f.detached
                            .check_installed(f.to)
                            .map_err(|e| ("protocol", e.to_string())),
                    );
                }
                Ok(RemoteMsg::Retry { cause, detail }) => {
                    // Nothing came from that peer: the detached cache is as it was, for the next.
                    eprintln!("tandem: remote prefill failed ({cause}), trying the next peer: {detail}");
                    f.retries += 1;
                    shared
                        .stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remote_retries_total += 1;
                }
                Ok(RemoteMsg::Failed { cause, detail }) => return Some(Err((cause, detail))),
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => {
                    return Some(Err(("dropped", "the fetch ended without its last message".into())));
                }
            }
        }
    }

    fn finish_fill(&mut self, f: RemoteFill<B::Kv>, outcome: Result<(), (&'static str, String)>) {
        let RemoteFill {
            pending: p,
            conversation,
            detached,
            from,
            to,
            rx,
            reserved,
            need_local,
            retries,
        } = f;
        drop(rx);
        self.reserved -= reserved;
        match outcome {
            Ok(()) => {
                // The conversation kept for the fallback gives its blocks back first; its checkpoints
                // (at or before `from`, of the same rows) serve the detached copy as well.
                let checkpoints = conversation.map_or_else(Vec::new, |c| c.checkpoints);
                let reach = (p.request.prompt.len() + p.request.max_tokens).min(self.config.n_ctx);
                let need = detached.bytes_reaching(reach);
                let fed = p.request.prompt[..to].to_vec();
                let c = Conversation {
                    fed,
                    kv: detached,
                    checkpoints,
                };
                self.start(
                    p,
                    c,
                    need,
                    PrefillRoute::Remote {
                        rows: to - from,
                        retries,
                    },
                );
            }
            Err((cause, detail)) => {
                drop(detached);
                eprintln!("tandem: remote prefill failed ({cause}), reading the prompt here: {detail}");
                let conversation = match conversation {
                    Some(c) => c,
                    None => match self.model.new_kv(self.config.n_ctx) {
                        Ok(kv) => Conversation {
                            fed: Vec::new(),
                            kv,
                            checkpoints: Vec::new(),
                        },
                        Err(e) => {
                            let _ = p.events.send(Event::Failed(format!("allocating the KV cache: {e}")));
                            return;
                        }
                    },
                };
                self.start(p, conversation, need_local, PrefillRoute::Fallback { cause, retries });
            }
        }
    }

    /// Checkpoints the rings of running sequence `i` when the budget has room for the copy (cached
    /// conversations giving way); a checkpoint only saves work later, so without room it is skipped.
    fn checkpoint(&mut self, i: usize) {
        let s = &mut self.running[i];
        if s.checkpoints.len() == MAX_CHECKPOINTS {
            s.checkpoints.remove(0);
        }
        let bytes = s.kv.checkpoint_bytes();
        if bytes == 0 || !self.make_room(bytes) {
            return;
        }
        let s = &mut self.running[i];
        if let Ok(cp) = s.kv.checkpoint() {
            s.checkpoints.push(cp);
        }
    }

    /// One decode step for every sequence with a token waiting: one forward pass for the whole batch,
    /// each sequence's waiting token followed by its drafts when it speculates.
    fn decode_step(&mut self) -> bool {
        let decoding: Vec<usize> = (0..self.running.len())
            .filter(|&i| matches!(self.running[i].phase, Phase::Decode { .. }))
            .collect();
        if decoding.is_empty() {
            return false;
        }
        let rows: Vec<Vec<u32>> = decoding
            .iter()
            .map(|&i| speculate::step_rows(&mut self.running[i], self.draft.as_mut()))
            .collect();
        let mut picked: Vec<&mut Sequence<B::Kv>> = Vec::with_capacity(decoding.len());
        for (i, s) in self.running.iter_mut().enumerate() {
            if decoding.contains(&i) {
                picked.push(s);
            }
        }
        let mut spans: Vec<Span<B::Kv>> = picked
            .iter_mut()
            .zip(&rows)
            .map(|(s, t)| Span {
                kv: &mut s.kv,
                tokens: t,
                logits: if t.len() > 1 { LogitRows::All } else { LogitRows::Last },
            })
            .collect();
        let (result, took) = timed_forward(&self.model, &mut self.ws, &mut spans);
        drop(spans);
        match result {
            Ok(logits) => {
                let n_vocab = self.model.config().n_vocab;
                let mut emitted = 0;
                let mut spec = crate::spec::SpecStats::default();
                for ((s, t), l) in picked.into_iter().zip(&rows).zip(logits) {
                    if s.spec.is_some() {
                        emitted += speculate::settle(s, t, &l, n_vocab, took, &mut spec);
                    } else {
                        s.fed.push(t[0]);
                        Self::emit_next(s, &l);
                        emitted += 1;
                    }
                }
                let mut st = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.decode_tokens_total += emitted as u64;
                st.decode_seconds_total += took;
                st.max_decode_step_seconds = st.max_decode_step_seconds.max(took);
                st.spec.add(&spec);
            }
            Err(e) => {
                for s in picked {
                    let _ = s.events.send(Event::Failed(e.to_string()));
                    s.failed = true;
                    s.done = true;
                }
            }
        }
        self.retire_finished();
        true
    }

    /// One prefill chunk: up to `chunk` prompt rows, shared among the sequences still reading their
    /// prompts, those with the least left first (a short chat is not held behind a long document).
    fn prefill_step(&mut self) -> bool {
        let busy = self.running.iter().any(|s| matches!(s.phase, Phase::Decode { .. }));
        let chunk = if busy {
            self.config.prefill_chunk_busy
        } else {
            self.config.prefill_chunk
        }
        .max(1);
        let mut order: Vec<(usize, usize)> = self
            .running
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s.phase {
                // An export reads on once its rows so far are queued (they may wait in its cache).
                _ if s.export.as_ref().is_some_and(|e| !e.shipped) => None,
                Phase::Prefill { read } if read < s.request.prompt.len() => Some((s.request.prompt.len() - read, i)),
                Phase::Prefill { .. } | Phase::Decode { .. } => None,
            })
            .collect();
        if order.is_empty() {
            return false;
        }
        order.sort();
        // (sequence index, first prompt row, end row) of each share, within the row budget.
        let mut budget = chunk;
        let mut shares = Vec::new();
        for (left, i) in order {
            if budget == 0 {
                break;
            }
            let Phase::Prefill { read } = self.running[i].phase else {
                continue;
            };
            let take = left.min(budget);
            budget -= take;
            shares.push((i, read, read + take));
        }
        let pieces: Vec<Vec<u32>> = shares
            .iter()
            .map(|&(i, from, to)| self.running[i].request.prompt[from..to].to_vec())
            .collect();
        let rows: usize = pieces.iter().map(Vec::len).sum();
        let mut picked: Vec<(&mut Sequence<B::Kv>, usize)> = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            if let Some(k) = shares.iter().position(|sh| sh.0 == i) {
                picked.push((s, k));
            }
        }
        let mut spans: Vec<Span<B::Kv>> = picked
            .iter_mut()
            .map(|(s, k)| {
                let last = shares[*k].2 == s.request.prompt.len();
                Span {
                    kv: &mut s.kv,
                    tokens: &pieces[*k],
                    logits: if last { LogitRows::Last } else { LogitRows::None },
                }
            })
            .collect();
        let (result, took) = timed_forward(&self.model, &mut self.ws, &mut spans);
        drop(spans);
        match result {
            Ok(logits) => {
                let mut read_whole = Vec::new();
                let mut exporting = Vec::new();
                for ((s, k), l) in picked.into_iter().zip(logits) {
                    let (i, _, end) = shares[k];
                    s.fed.extend_from_slice(&pieces[k]);
                    s.phase = Phase::Prefill { read: end };
                    if s.export.is_some() {
                        exporting.push(i);
                    }
                    if end == s.request.prompt.len() {
                        read_whole.push((i, l));
                    }
                }
                for i in exporting {
                    self.ship(i);
                }
                for (i, l) in read_whole {
                    self.checkpoint(i);
                    if self.running[i].export.is_some() {
                        self.finish_export_if_done(i);
                    } else {
                        Self::emit_next(&mut self.running[i], &l);
                    }
                }
                let mut st = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.prefill_tokens_total += rows as u64;
                st.prefill_seconds_total += took;
                if busy {
                    st.max_busy_prefill_chunk_seconds = st.max_busy_prefill_chunk_seconds.max(took);
                }
            }
            Err(e) => {
                for (s, _) in picked {
                    let _ = s.events.send(Event::Failed(e.to_string()));
                    s.failed = true;
                    s.done = true;
                }
            }
        }
        self.retire_finished();
        true
    }

    /// An export that has read its whole prompt and queued every row ends (its cache stays for reuse
    /// like a conversation's).
    fn finish_export_if_done(&mut self, i: usize) {
        let s = &mut self.running[i];
        let read_whole = matches!(s.phase, Phase::Prefill { read } if read == s.request.prompt.len());
        if s.done || !read_whole || !s.export.as_ref().is_some_and(|e| e.shipped) {
            return;
        }
        let now = Instant::now();
        let timings = RequestTimings {
            queued: s.started - s.submitted,
            ttft: now - s.submitted,
            decode: Duration::ZERO,
            completion_tokens: 0,
        };
        let _ = s.events.send(Event::Done {
            reason: FinishReason::Length,
            timings,
        });
        s.done = true;
        self.shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .kv_exports_total += 1;
    }

    /// Samples the next token from `logits`, sends it, and decides whether the sequence goes on.
    fn emit_next(s: &mut Sequence<B::Kv>, logits: &[f32]) {
        let token = s.sampler.sample(logits, &s.history);
        emit(s, token, logits);
    }

    /// Finished or failed sequences leave the running set; finished conversations go to the cache.
    fn retire_finished(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].done {
                let mut s = self.running.swap_remove(i);
                self.reserved -= s.reserved;
                if let (Some(d), Some(cache)) = (
                    self.draft.as_mut(),
                    s.spec.take().and_then(speculate::SpecState::into_draft_cache),
                ) {
                    d.keep(cache);
                }
                // Its storage, within its reservation, moves to the cache: the sum does not grow.
                if !s.failed {
                    let conversation = Conversation {
                        fed: s.fed,
                        kv: s.kv,
                        checkpoints: s.checkpoints,
                    };
                    self.cache.insert(conversation, self.config.cache_budget_bytes);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Publishes the step's stats and checks the memory invariant (see the module's documentation):
    /// promised bytes within the budget, the pool holding no more than promised, and no running
    /// sequence past its reservation.
    fn publish_stats(&self) {
        let committed = self.committed();
        let in_use = self.model.kv_bytes_in_use();
        let broken = committed > self.config.kv_budget_bytes
            || in_use > committed
            || self.running.iter().any(|s| s.kv.bytes_allocated() > s.reserved)
            || self.remote.iter().any(|f| {
                f.detached.bytes_allocated() + f.conversation.as_ref().map_or(0, |c| c.kv.bytes_allocated())
                    > f.reserved
            });
        let mut st = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.queued = self.queue.len() + self.shared.inbox.lock().map_or(0, |q| q.len());
        st.running = self.running.len() + self.remote.len();
        st.kv_bytes_used = in_use;
        st.kv_bytes_reserved = self.reserved;
        st.kv_bytes_cached = committed - self.reserved;
        st.cached_sequences = self.cache.len();
        st.expert_traffic = self.model.expert_traffic();
        st.draft_prefix_tokens_reused_total = self.draft.as_ref().map_or(0, |d| d.reused_tokens);
        if broken {
            st.kv_accounting_violations += 1;
        }
    }
}

/// Sends `token` (chosen from `logits`, which also give its logprob) and decides whether the sequence
/// goes on (`Decode { next: token }`) or is done.
fn emit<K: ServingCache>(s: &mut Sequence<K>, token: u32, logits: &[f32]) {
    let logprob = s.request.top_logprobs.map(|k| {
        let lse = log_sum_exp(logits);
        TokenLogprob {
            logprob: (logits[token as usize] as f64 - lse) as f32,
            top: top_k(logits, k)
                .into_iter()
                .map(|(id, l)| (id, (l as f64 - lse) as f32))
                .collect(),
        }
    });
    let now = Instant::now();
    s.first_token.get_or_insert(now);
    s.history.push(token);
    s.generated += 1;
    let _ = s.events.send(Event::Token { id: token, logprob });
    let reason = if s.request.stop_ids.contains(&token) {
        Some(FinishReason::Stop)
    } else if s.generated >= s.request.max_tokens {
        Some(FinishReason::Length)
    } else if s.fed.len() + 1 > s.kv.n_ctx() {
        Some(FinishReason::ContextFull)
    } else {
        None
    };
    match reason {
        Some(reason) => {
            let first = s.first_token.unwrap_or(now);
            let timings = RequestTimings {
                queued: s.started - s.submitted,
                ttft: first - s.submitted,
                decode: now - first,
                completion_tokens: s.generated,
            };
            let _ = s.events.send(Event::Done { reason, timings });
            s.done = true;
        }
        None => s.phase = Phase::Decode { next: token },
    }
}
