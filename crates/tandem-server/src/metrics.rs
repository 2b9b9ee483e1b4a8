//! Prometheus metrics. Latencies, token counts and rates are measured by the server from the events it
//! relays (so they are what clients saw); queue, running and KV-cache gauges come from `EngineStats`.
//!
//! The prefill and decode rates (`tandem_prefill_tokens_per_second`, `tandem_decode_tokens_per_second`)
//! are over the last 60 seconds: tokens counted into one-second buckets, summed over the buckets of the
//! last minute and divided by 60 s (by the uptime while the server is younger than a minute). Prefill
//! tokens (those read, not reused) count when the request's first token arrives.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use tandem_engine::serve::{EngineStats, FALLBACK_CAUSES};

use crate::AppState;

const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const WINDOW_SECS: u64 = 60;

struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), plus one for +Inf.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {cumulative}", self.sum);
    }
}

/// Token counts in one-second buckets over the last minute.
struct RateWindow {
    /// (second since start, prefill tokens, decode tokens), indexed by second % 60.
    buckets: [(u64, u64, u64); WINDOW_SECS as usize],
}

impl RateWindow {
    fn add(&mut self, sec: u64, prefill: u64, decode: u64) {
        let b = &mut self.buckets[(sec % WINDOW_SECS) as usize];
        if b.0 != sec {
            *b = (sec, 0, 0);
        }
        b.1 += prefill;
        b.2 += decode;
    }

    /// (prefill, decode) tokens per second over the last minute.
    fn rates(&self, now: Duration) -> (f64, f64) {
        let sec = now.as_secs();
        let live = self.buckets.iter().filter(|b| b.0 <= sec && sec - b.0 < WINDOW_SECS);
        let (p, d) = live.fold((0, 0), |(p, d), b| (p + b.1, d + b.2));
        let span = now.as_secs_f64().clamp(1.0, WINDOW_SECS as f64);
        (p as f64 / span, d as f64 / span)
    }
}

/// The server's counters and histograms; shared by every request.
pub struct Metrics {
    start: Instant,
    ttft: Mutex<Histogram>,
    tpot: Mutex<Histogram>,
    window: Mutex<RateWindow>,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub prefix_reused_tokens: AtomicU64,
    pub requests: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub requests_cancelled: AtomicU64,
    /// KV stream bytes a prefill node handed to its connections (frames with their framing).
    pub kv_sent_bytes: AtomicU64,
    /// KV stream bytes a decode node read from its prefill peers; shared with the peer client, which
    /// counts as it reads (`kv::PeerClient::new`).
    pub kv_received_bytes: Arc<AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            start: Instant::now(),
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            tpot: Mutex::new(Histogram::new(TPOT_BUCKETS)),
            window: Mutex::new(RateWindow {
                buckets: [(u64::MAX, 0, 0); WINDOW_SECS as usize],
            }),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_reused_tokens: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            requests_rejected: AtomicU64::new(0),
            requests_cancelled: AtomicU64::new(0),
            kv_sent_bytes: AtomicU64::new(0),
            kv_received_bytes: Arc::new(AtomicU64::new(0)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain numbers behind: keep using them.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn inc(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn observe_ttft(&self, d: Duration) {
        lock(&self.ttft).observe(d.as_secs_f64());
    }

    pub fn observe_tpot(&self, d: Duration) {
        lock(&self.tpot).observe(d.as_secs_f64());
    }

    /// Counts prefill / decode tokens into the rate window.
    pub fn add_tokens(&self, prefill: u64, decode: u64) {
        let sec = self.start.elapsed().as_secs();
        lock(&self.window).add(sec, prefill, decode);
    }

    /// The Prometheus text exposition of the server's metrics and the engine's gauges.
    pub fn render(&self, stats: &EngineStats) -> String {
        let mut out = String::new();
        lock(&self.ttft).render(
            &mut out,
            "tandem_time_to_first_token_seconds",
            "Submission to first token, as the server saw it.",
        );
        lock(&self.tpot).render(
            &mut out,
            "tandem_time_per_output_token_seconds",
            "Mean time between output tokens of a request, as the server saw it.",
        );
        let gauges: [(&str, &str, u64); 8] = [
            (
                "tandem_requests_queued",
                "Requests waiting for prefill.",
                stats.queued as u64,
            ),
            (
                "tandem_requests_running",
                "Requests being prefilled or decoded.",
                stats.running as u64,
            ),
            (
                "tandem_kv_cache_bytes_used",
                "KV-cache bytes in use.",
                stats.kv_bytes_used as u64,
            ),
            (
                "tandem_kv_cache_bytes_budget",
                "KV-cache bytes available in all.",
                stats.kv_bytes_budget as u64,
            ),
            (
                "tandem_kv_cache_bytes_reserved",
                "KV-cache bytes running requests may grow to, summed.",
                stats.kv_bytes_reserved as u64,
            ),
            (
                "tandem_kv_cache_bytes_cached",
                "KV-cache bytes held by cached conversations and checkpoints (given back first when needed).",
                stats.kv_bytes_cached as u64,
            ),
            (
                "tandem_cached_sequences",
                "Finished conversations kept for prefix reuse.",
                stats.cached_sequences as u64,
            ),
            ("tandem_context_size", "Tokens a sequence may hold.", stats.n_ctx as u64),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let (prefill, decode) = lock(&self.window).rates(self.start.elapsed());
        for (name, help, v) in [
            (
                "tandem_prefill_tokens_per_second",
                "Prompt tokens read per second over the last minute.",
                prefill,
            ),
            (
                "tandem_decode_tokens_per_second",
                "Tokens generated per second over the last minute.",
                decode,
            ),
            (
                "tandem_spec_acceptance_rate",
                "Accepted over drafted tokens, since start (0 before any draft).",
                stats.spec.acceptance(),
            ),
            (
                "tandem_spec_tokens_per_step",
                "Tokens per decode step of speculating requests, since start (0 before any).",
                if stats.spec.steps == 0 {
                    0.0
                } else {
                    stats.spec.tokens_per_step()
                },
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counters = [
            (
                "tandem_prompt_tokens_total",
                "Prompt tokens of started requests.",
                &self.prompt_tokens,
            ),
            (
                "tandem_generation_tokens_total",
                "Tokens generated.",
                &self.generation_tokens,
            ),
            (
                "tandem_prefix_cache_hits_total",
                "Requests that reused a cached prefix.",
                &self.prefix_hits,
            ),
            (
                "tandem_prefix_cache_reused_tokens_total",
                "Prompt tokens reused from the prefix cache.",
                &self.prefix_reused_tokens,
            ),
            (
                "tandem_requests_total",
                "Generation requests accepted by the engine.",
                &self.requests,
            ),
            (
                "tandem_requests_rejected_total",
                "Generation requests the engine refused (queue full, too long, ...).",
                &self.requests_rejected,
            ),
            (
                "tandem_requests_cancelled_total",
                "Requests cut before they finished (client gone, or shutdown).",
                &self.requests_cancelled,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", load(c));
        }
        let name = "tandem_kv_accounting_violations_total";
        let _ = writeln!(
            out,
            "# HELP {name} Engine steps that found KV memory promised past the budget (0 unless there is a bug).\n\
             # TYPE {name} counter\n{name} {}",
            stats.kv_accounting_violations
        );
        for (name, help, v) in [
            (
                "tandem_remote_prefill_total",
                "Prompts read from a prefill peer's KV.",
                stats.remote_prefills_total,
            ),
            (
                "tandem_remote_prefill_rows_total",
                "Positions installed from prefill peers.",
                stats.remote_rows_total,
            ),
            (
                "tandem_remote_prefill_short_total",
                "Prompts read here on a decode node: too few new tokens for the wire hop.",
                stats.local_short_prefills_total,
            ),
            (
                "tandem_remote_prefill_retries_total",
                "Prefill peers given up before they sent any rows, for the next peer.",
                stats.remote_retries_total,
            ),
            (
                "tandem_kv_exports_total",
                "KV exports a prefill node served.",
                stats.kv_exports_total,
            ),
            (
                "tandem_spec_decode_steps_total",
                "Decode steps of speculating requests (each feeds its token and any drafts in one pass).",
                stats.spec.steps,
            ),
            (
                "tandem_spec_verify_steps_total",
                "Decode steps that carried drafted tokens.",
                stats.spec.verify_steps,
            ),
            (
                "tandem_spec_drafted_tokens_total",
                "Tokens drafted for speculating requests.",
                stats.spec.drafted,
            ),
            (
                "tandem_spec_accepted_tokens_total",
                "Drafted tokens the target model accepted.",
                stats.spec.accepted,
            ),
            (
                "tandem_spec_emitted_tokens_total",
                "Tokens the decode steps of speculating requests produced.",
                stats.spec.emitted,
            ),
            (
                "tandem_spec_draft_prefix_tokens_reused_total",
                "Tokens new draft-model caches took over from finished requests' draft caches.",
                stats.draft_prefix_tokens_reused_total,
            ),
            (
                "tandem_kv_exported_rows_total",
                "Layer rows a prefill node sent.",
                stats.kv_exported_rows_total,
            ),
            (
                "tandem_kv_sent_bytes_total",
                "KV stream bytes a prefill node sent, framing included.",
                load(&self.kv_sent_bytes),
            ),
            (
                "tandem_kv_received_bytes_total",
                "KV stream bytes a decode node read from prefill peers, framing included.",
                load(&self.kv_received_bytes),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        if let Some(t) = stats.expert_traffic {
            for (name, help, v) in [
                (
                    "tandem_expert_cache_hits_total",
                    "Experts in host memory a step or short chunk found in a device slot.",
                    t.cache_hits,
                ),
                (
                    "tandem_expert_cache_copies_total",
                    "Experts in host memory copied to a device slot for a step or short chunk.",
                    t.cache_copies,
                ),
                (
                    "tandem_expert_cpu_total",
                    "Experts in host memory a decode step computed on the CPU.",
                    t.cpu_experts,
                ),
                (
                    "tandem_expert_stream_copies_total",
                    "Experts a long prefill chunk streamed from host memory.",
                    t.stream_copies,
                ),
                (
                    "tandem_expert_stream_skips_total",
                    "Experts a long prefill chunk skipped: no row routed to them.",
                    t.stream_skips,
                ),
                (
                    "tandem_expert_host_bytes_total",
                    "Bytes of experts copied from host memory to the device.",
                    t.bytes,
                ),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
            }
        }
        let name = "tandem_remote_prefill_fallback_total";
        let _ = writeln!(
            out,
            "# HELP {name} Remote prefills that fell back to a local one, by cause.\n# TYPE {name} counter"
        );
        for (cause, v) in FALLBACK_CAUSES.iter().zip(stats.remote_fallbacks_total) {
            let _ = writeln!(out, "{name}{{cause=\"{cause}\"}} {v}");
        }
        out
    }
}

/// `GET /metrics`.
pub(crate) async fn handler(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let text = state.metrics.render(&state.engine.stats());
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::ExpertTraffic;

    #[test]
    fn expert_traffic_is_exposed_only_for_a_model_with_experts_in_host_memory() {
        let m = Metrics::default();
        let resident = m.render(&EngineStats::default());
        assert!(!resident.contains("tandem_expert_"));
        let stats = EngineStats {
            expert_traffic: Some(ExpertTraffic {
                cache_hits: 7,
                cache_copies: 3,
                cpu_experts: 5,
                stream_copies: 40,
                stream_skips: 9,
                bytes: 123456,
            }),
            ..EngineStats::default()
        };
        let text = m.render(&stats);
        for line in [
            "tandem_expert_cache_hits_total 7",
            "tandem_expert_cache_copies_total 3",
            "tandem_expert_cpu_total 5",
            "tandem_expert_stream_copies_total 40",
            "tandem_expert_stream_skips_total 9",
            "tandem_expert_host_bytes_total 123456",
            "# TYPE tandem_expert_stream_skips_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
