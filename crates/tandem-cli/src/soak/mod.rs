//! `tandem bench serve --soak MINUTES`: drives a running `tandem serve` for minutes with mixed traffic and
//! chaos, then reports by route and status, latency, the server's memory over time and the canary, and
//! fails (exit status 1) when a target is missed: any 5xx, a broken stream, a transport error, a bad
//! input not refused with a 4xx JSON error, RSS over 110% of its level after the warm-up, or a greedy
//! canary whose text changed.
//!
//! Threads: `--clients` clients of mixed requests ([`traffic`]), one of long prompts, one of bursts and
//! stalled or idle connections ([`chaos`]), the canary, and the memory sampler ([`monitor`]). Requests
//! go only to `--addr`, which must be a loopback address; each is cut after `--request-timeout` seconds,
//! so the soak ends at most that long after its last minute.

mod chaos;
mod http;
mod monitor;
mod record;
mod report;
mod requests;
mod targets;
mod traffic;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use http::Target;
use monitor::Sample;
use record::Log;

/// The soak's own flags (the rest are `tandem bench serve`'s).
#[derive(Args, Clone)]
pub struct SoakArgs {
    /// Run a soak of this many minutes instead of the benchmark: mixed traffic, chaos, a greedy canary;
    /// exits non-zero if a target is missed.
    #[arg(long, value_name = "MINUTES")]
    pub soak: Option<f64>,
    /// The server's pid, for its RSS (default: the process listening on --addr's port, if visible).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Seconds of load before the first memory sample the RSS target compares against (default: a
    /// quarter of the soak, at most 30).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Seconds between greedy canaries.
    #[arg(long, default_value_t = 10.0)]
    pub canary_every: f64,
    /// Seconds between memory samples (RSS and /metrics).
    #[arg(long, default_value_t = 3.0)]
    pub sample_every: f64,
    /// Concurrent requests released together in each burst (more than the server's queue).
    #[arg(long, default_value_t = 32)]
    pub burst: usize,
    /// Seconds between bursts; stalled and idle clients come half-way between them.
    #[arg(long, default_value_t = 20.0)]
    pub burst_every: f64,
    /// Seconds a stalled client drips its request before giving up (idle connections stay twice that).
    /// The soak expects the server to cut them first: its head and body limits below this, its idle
    /// limit below twice this.
    #[arg(long, default_value_t = 4.0)]
    pub stall_secs: f64,
    /// Seconds after which any one request is abandoned as a transport error.
    #[arg(long, default_value_t = 120.0)]
    pub request_timeout: f64,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
}

/// The load `tandem bench serve` shares with the soak.
pub struct Load<'a> {
    pub addr: &'a str,
    pub api_key: Option<String>,
    pub clients: usize,
    pub short_tokens: usize,
    pub long_words: usize,
    pub long_every: f64,
}

/// Everything the soak's threads share.
pub struct Soak {
    pub opts: SoakArgs,
    pub target: Target,
    pub log: Log,
    /// No request starts after this.
    pub deadline: Instant,
    pub short_tokens: usize,
    pub long_words: usize,
    pub long_every: f64,
    pub pid: Option<u32>,
    pub samples: Mutex<Vec<Sample>>,
}

impl Soak {
    /// When a request sent now is abandoned.
    pub fn request_deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs_f64(self.opts.request_timeout)
    }

    /// Sleeps until `t`; false (at once) when the soak ends first.
    pub fn sleep_until(&self, t: Instant) -> bool {
        if t >= self.deadline {
            if let Some(left) = self.deadline.checked_duration_since(Instant::now()) {
                std::thread::sleep(left);
            }
            return false;
        }
        if let Some(left) = t.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        true
    }
}

pub fn run(load: &Load, opts: &SoakArgs, minutes: f64) -> Result<()> {
    if !(minutes > 0.0 && minutes <= 24.0 * 60.0) {
        bail!("--soak takes minutes between 0 and 1440, not {minutes}");
    }
    for (name, v) in [
        ("--canary-every", opts.canary_every),
        ("--sample-every", opts.sample_every),
        ("--burst-every", opts.burst_every),
        ("--stall-secs", opts.stall_secs),
        ("--request-timeout", opts.request_timeout),
        ("--long-every", load.long_every),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            bail!("{name} must be a positive number of seconds, not {v}");
        }
    }
    if load.clients == 0 || load.clients > 256 || opts.burst > 1024 {
        bail!("--clients must be 1-256 and --burst at most 1024");
    }
    let seconds = minutes * 60.0;
    let warmup = opts.warmup.unwrap_or((seconds / 4.0).min(30.0)).clamp(0.0, seconds);
    let io_timeout = Duration::from_secs_f64(opts.request_timeout.min(60.0));
    let target = Target::new(load.addr, load.api_key.clone(), io_timeout)?;
    let (pid, pid_note) = match opts.server_pid {
        Some(pid) => (Some(pid), format!("Server pid {pid} (given).")),
        None => match monitor::find_listener(target.addr.port()) {
            Some(pid) => (
                Some(pid),
                format!("Server pid {pid} (listening on port {}).", target.addr.port()),
            ),
            None => (
                None,
                "RSS not measured: no --server-pid, and no process of this user listens on the port.".into(),
            ),
        },
    };
    if let Some(pid) = pid {
        monitor::rss_kb(pid).with_context(|| format!("reading /proc/{pid}/status"))?;
    }
    monitor::metrics(&target).context("the server's /metrics (is it running?)")?;
    let start = Instant::now();
    let soak = Soak {
        opts: opts.clone(),
        target,
        log: Log::new(start),
        deadline: start + Duration::from_secs_f64(seconds),
        short_tokens: load.short_tokens,
        long_words: load.long_words,
        long_every: load.long_every,
        pid,
        samples: Mutex::new(Vec::new()),
    };
    eprintln!(
        "soak: {minutes} min against {} with {} clients (warm-up {warmup:.0} s); {pid_note}",
        load.addr, load.clients
    );
    let first = monitor::sample(&soak);
    soak.samples.lock().unwrap_or_else(|e| e.into_inner()).push(first);
    // The canary's reference answer comes from an idle server.
    chaos::canary(&soak);
    std::thread::scope(|scope| {
        let soak = &soak;
        for c in 0..load.clients {
            scope.spawn(move || traffic::client(soak, c));
        }
        scope.spawn(|| traffic::long_prompts(soak));
        scope.spawn(|| chaos::chaos(soak));
        scope.spawn(|| chaos::canaries(soak));
        scope.spawn(|| monitor::sampler(soak));
    });
    let last = monitor::sample(&soak);
    let elapsed = start.elapsed().as_secs_f64();
    let samples = {
        let mut s = soak.samples.lock().unwrap_or_else(|e| e.into_inner());
        s.push(last);
        s.clone()
    };
    let records = soak.log.records();
    let report = report::build(&records, &samples, warmup, &pid_note, elapsed);
    println!("{}", report.markdown);
    if let Some(path) = &opts.json {
        let text = serde_json::to_string_pretty(&report.json)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.missed.is_empty() {
        bail!(
            "the soak missed {} target(s): {}",
            report.missed.len(),
            report.missed.join("; ")
        );
    }
    println!("soak passed: every target met");
    Ok(())
}
