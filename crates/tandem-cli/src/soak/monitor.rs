//! The server's memory over the soak: its resident set (`VmRSS` in `/proc/<pid>/status`) and the KV
//! gauges of its `/metrics`, sampled every few seconds. The server's pid is given, or found as the owner
//! of the socket listening on the soak's port (`/proc/net/tcp*` gives the socket's inode, a process's
//! `/proc/<pid>/fd` links name it), which works for servers run by the same user.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::http::Target;
use super::Soak;

/// The `/metrics` gauges the report follows.
pub const GAUGES: [&str; 5] = [
    "tandem_kv_cache_bytes_used",
    "tandem_kv_cache_bytes_budget",
    "tandem_cached_sequences",
    "tandem_requests_running",
    "tandem_requests_queued",
];

/// One sample of the server's memory.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Seconds since the soak started.
    pub at: f64,
    pub rss_kb: Option<u64>,
    /// The gauges of [`GAUGES`] that `/metrics` gave.
    pub gauges: HashMap<String, f64>,
}

/// The resident set of `pid`, in kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The process owning the socket listening on `port`, if this user can see it.
pub fn find_listener(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT; state 0A is LISTEN; the inode is the tenth field.
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let listening_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && listening_port == Some(port) && *inode != "0" {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let procs = std::fs::read_dir("/proc").ok()?;
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The gauges of [`GAUGES`] from the server's `/metrics`.
pub fn metrics(target: &Target) -> Result<HashMap<String, f64>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (head, body) = target.exchange("GET", "/metrics", b"", deadline)?;
    if head.status != 200 {
        bail!("/metrics answered {}", head.status);
    }
    let text = String::from_utf8_lossy(&body);
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, value)) = line.split_once(' ') {
            if GAUGES.contains(&name) {
                if let Ok(v) = value.trim().parse() {
                    out.insert(name.to_string(), v);
                }
            }
        }
    }
    Ok(out)
}

/// Takes one sample now.
pub fn sample(soak: &Soak) -> Sample {
    Sample {
        at: soak.log.start.elapsed().as_secs_f64(),
        rss_kb: soak.pid.and_then(rss_kb),
        // A /metrics that fails under load leaves a gap in the KV columns, not a failed soak.
        gauges: metrics(&soak.target).unwrap_or_default(),
    }
}

/// A sample every `sample_every` seconds until the soak's end.
pub fn sampler(soak: &Soak) {
    while soak.sleep_until(Instant::now() + Duration::from_secs_f64(soak.opts.sample_every)) {
        let s = sample(soak);
        soak.samples.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}
