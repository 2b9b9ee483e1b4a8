//! The soak's report: markdown tables of requests by route and status, by scenario, 4xx codes, the
//! server's memory over time, the targets ([`targets`]) and whether each was met; the same as JSON for
//! scripts.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{json, Value};

use super::monitor::Sample;
use super::record::{Record, Scenario};
use super::requests::{Route, Status};
use super::targets;

/// Nearest-rank percentile; `None` when there are no values.
fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[((v.len() - 1) as f64 * p).round() as usize])
}

fn ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.0}", x * 1e3))
}

/// Requests whose latency says something about generation: answered whole, by well-formed traffic.
fn timed(r: &Record) -> bool {
    r.scenario.is_generation() && r.outcome.status == Status::Ok && !r.outcome.broken
}

#[derive(Default)]
struct Counts {
    n: usize,
    ok: usize,
    client: usize,
    queue_full: usize,
    server: usize,
    transport: usize,
    broken: usize,
    ttft: Vec<f64>,
    total: Vec<f64>,
}

impl Counts {
    fn add(&mut self, r: &Record) {
        let o = &r.outcome;
        self.n += 1;
        match o.status {
            Status::Ok => self.ok += 1,
            Status::Client { .. } => self.client += 1,
            Status::QueueFull => self.queue_full += 1,
            Status::Server { .. } => self.server += 1,
            Status::Transport => self.transport += 1,
            Status::NoAnswer => {}
        }
        self.broken += o.broken as usize;
        if let Some(t) = o.ttft.filter(|_| !o.broken) {
            self.ttft.push(t);
        }
        if timed(r) {
            self.total.push(o.total);
        }
    }

    fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
            self.n,
            self.ok,
            self.client,
            self.queue_full,
            self.server,
            self.transport,
            self.broken,
            ms(percentile(&self.ttft, 0.5)),
            ms(percentile(&self.ttft, 0.99)),
            ms(percentile(&self.total, 0.5)),
            ms(percentile(&self.total, 0.99)),
        )
    }

    fn json(&self) -> Value {
        json!({
            "requests": self.n, "ok": self.ok, "4xx": self.client, "queue_full": self.queue_full,
            "5xx": self.server, "transport": self.transport, "broken_streams": self.broken,
            "ttft_p50_s": percentile(&self.ttft, 0.5), "ttft_p99_s": percentile(&self.ttft, 0.99),
            "total_p50_s": percentile(&self.total, 0.5), "total_p99_s": percentile(&self.total, 0.99),
        })
    }
}

/// The report: markdown, JSON, and the targets missed.
pub struct Report {
    pub markdown: String,
    pub json: Value,
    pub missed: Vec<String>,
}

/// First sample at or after `warmup` seconds, the largest and the last of those, for one series.
fn series(samples: &[Sample], warmup: f64, f: impl Fn(&Sample) -> Option<f64>) -> Option<(f64, f64, f64, f64)> {
    let after: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.at >= warmup)
        .filter_map(|s| f(s).map(|v| (s.at, v)))
        .collect();
    let &(at, first) = after.first()?;
    let max = after.iter().map(|&(_, v)| v).fold(f64::MIN, f64::max);
    let last = after.last()?.1;
    Some((at, first, max, last))
}

pub fn build(records: &[Record], samples: &[Sample], warmup: f64, pid_note: &str, elapsed: f64) -> Report {
    let mut md = String::new();

    // Requests by route and status.
    let mut by_route: BTreeMap<(Route, bool), Counts> = BTreeMap::new();
    let mut all = Counts::default();
    for r in records {
        if let Some(route) = r.route {
            by_route.entry((route, r.stream)).or_default().add(r);
        }
        all.add(r);
    }
    let _ = writeln!(md, "### Requests by route ({} in {elapsed:.0} s)\n", records.len());
    let header = "| TTFT p50 / p99 ms | total p50 / p99 ms |";
    let _ = writeln!(
        md,
        "| route | requests | 200 | 4xx | 503 queue_full | 5xx | transport errors | broken streams {header}"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut routes_json = Vec::new();
    for ((route, stream), c) in &by_route {
        let name = format!("`{}` {}", route.path(), if *stream { "stream" } else { "plain" });
        let _ = writeln!(md, "{}", c.row(&name));
        routes_json.push(json!({"route": route.path(), "stream": stream, "counts": c.json()}));
    }
    let _ = writeln!(md, "{}", all.row("**all** (raw connections included)"));

    // 4xx by code.
    let mut codes: BTreeMap<(u16, String), usize> = BTreeMap::new();
    for r in records {
        if let Status::Client { status, code } = &r.outcome.status {
            *codes.entry((*status, code.clone())).or_default() += 1;
        }
    }
    if !codes.is_empty() {
        let _ = writeln!(md, "\n| 4xx status | code | requests |\n|---:|---|---:|");
        for ((status, code), n) in &codes {
            let _ = writeln!(md, "| {status} | `{code}` | {n} |");
        }
    }

    // By scenario.
    let mut by_scenario: BTreeMap<Scenario, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_scenario.entry(r.scenario).or_default().push(r);
    }
    let _ = writeln!(
        md,
        "\n### Requests by scenario\n\n| scenario | expected | requests | as expected | notes |\n|---|---|---:|---:|---|"
    );
    let mut scenarios_json = Vec::new();
    for (scenario, rs) in &by_scenario {
        let met = rs.iter().filter(|r| scenario.met_by(&r.outcome)).count();
        let note = scenario_note(*scenario, rs);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {met} | {note} |",
            scenario.name(),
            scenario.expected(),
            rs.len()
        );
        scenarios_json
            .push(json!({"scenario": scenario.name(), "requests": rs.len(), "as_expected": met, "note": note}));
    }

    // Memory over time.
    let _ = writeln!(
        md,
        "\n### Server memory (a sample every few seconds; warm-up {warmup:.0} s)\n\n\
         | series | first after warm-up | max | last | last / first |\n|---|---:|---:|---:|---:|"
    );
    let mb = |kb: u64| kb as f64 / 1024.0;
    let rss = series(samples, warmup, |s| s.rss_kb.map(mb));
    let gauge = |name: &'static str| move |s: &Sample| s.gauges.get(name).copied();
    let kv = series(samples, warmup, |s| {
        gauge("tandem_kv_cache_bytes_used")(s).map(|b| b / (1 << 20) as f64)
    });
    let cached = series(samples, warmup, gauge("tandem_cached_sequences"));
    for (name, s) in [
        ("RSS (MiB)", rss),
        ("KV in use (MiB)", kv),
        ("cached sequences", cached),
    ] {
        match s {
            Some((at, first, max, last)) => {
                let ratio = if first > 0.0 {
                    format!("{:.2}", last / first)
                } else {
                    "-".into()
                };
                let _ = writeln!(
                    md,
                    "| {name} | {first:.1} (at {at:.0} s) | {max:.1} | {last:.1} | {ratio} |"
                );
            }
            None => {
                let _ = writeln!(md, "| {name} | - | - | - | - |");
            }
        }
    }
    if let Some(budget) = samples
        .iter()
        .rev()
        .find_map(|s| s.gauges.get("tandem_kv_cache_bytes_budget"))
    {
        let _ = writeln!(md, "\nKV budget: {:.0} MiB. {pid_note}", budget / (1 << 20) as f64);
    } else {
        let _ = writeln!(md, "\n{pid_note}");
    }
    // At most about 24 points, evenly spaced, so an hour's soak still fits on a line (the JSON has all).
    let step = samples.len().div_ceil(24).max(1);
    let points: Vec<String> = samples
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || i + 1 == samples.len())
        .map(|(_, s)| s)
        .map(|s| {
            let rss = s.rss_kb.map_or("-".into(), |kb| format!("{:.0}", mb(kb)));
            let kv = s
                .gauges
                .get("tandem_kv_cache_bytes_used")
                .map_or("-".into(), |b| format!("{:.0}", b / (1 << 20) as f64));
            format!("{:.0}s {rss}/{kv}", s.at)
        })
        .collect();
    let _ = writeln!(md, "\nRSS / KV in use (MiB) over time: {}", points.join(", "));

    let targets = targets::check(records, rss);
    let _ = writeln!(md, "\n### Targets\n\n| target | result | met |\n|---|---|---|");
    for t in &targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            t.name,
            t.result,
            if t.met { "yes" } else { "**NO**" }
        );
    }

    // What went wrong, grouped.
    let mut failures: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.scenario.met_by(&r.outcome)) {
        let route = r.route.map_or("raw", |x| x.path());
        let what = r.outcome.detail.as_deref().unwrap_or("unexpected answer");
        let key = format!("{} on `{route}`: {}", r.scenario.name(), shorten(what));
        let e = failures.entry(key).or_insert((0, r.at));
        e.0 += 1;
        e.1 = e.1.min(r.at);
    }
    if !failures.is_empty() {
        let _ = writeln!(
            md,
            "\n### Unexpected answers\n\n| count | first at | what |\n|---:|---:|---|"
        );
        let mut list: Vec<_> = failures.iter().collect();
        list.sort_by_key(|f| std::cmp::Reverse(f.1 .0));
        for (what, (n, at)) in list.iter().take(12) {
            let _ = writeln!(md, "| {n} | {at:.0} s | {} |", what.replace('|', "\\|"));
        }
    }

    let missed: Vec<String> = targets
        .iter()
        .filter(|t| !t.met)
        .map(|t| format!("{}: {}", t.name, t.result))
        .collect();
    let json = json!({
        "elapsed_s": elapsed,
        "warmup_s": warmup,
        "routes": routes_json,
        "all": all.json(),
        "client_errors": codes.iter().map(|((s, c), n)| json!({"status": s, "code": c, "requests": n})).collect::<Vec<_>>(),
        "scenarios": scenarios_json,
        "samples": samples.iter().map(|s| json!({"at_s": s.at, "rss_kb": s.rss_kb, "gauges": s.gauges})).collect::<Vec<_>>(),
        "targets": targets.iter().map(|t| json!({"target": t.name, "result": t.result, "met": t.met})).collect::<Vec<_>>(),
        "unexpected": failures.iter().map(|(w, (n, at))| json!({"what": w, "count": n, "first_at_s": at})).collect::<Vec<_>>(),
        "passed": missed.is_empty(),
    });
    Report {
        markdown: md,
        json,
        missed,
    }
}

/// An error message with its numbers kept but cut to a line.
fn shorten(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > 160 {
        format!("{}…", line.chars().take(160).collect::<String>())
    } else {
        line.to_string()
    }
}

/// What a scenario's table row adds: prefix reuse, prompt lengths, who closed stalled connections.
fn scenario_note(scenario: Scenario, rs: &[&Record]) -> String {
    let prompts: Vec<(usize, usize)> = rs.iter().filter_map(|r| r.outcome.prompt).collect();
    match scenario {
        Scenario::FollowUp | Scenario::Repeat => {
            let reused = prompts.iter().filter(|p| p.1 > 0).count();
            format!("{reused} of {} reused a cached prefix", prompts.len())
        }
        Scenario::Long => {
            let lens: Vec<f64> = prompts.iter().map(|p| p.0 as f64).collect();
            percentile(&lens, 0.5).map_or(String::new(), |p| format!("prompt {p:.0} tokens (median)"))
        }
        Scenario::StallHeaders | Scenario::StallBody | Scenario::Idle => {
            let closed = rs.iter().filter(|r| r.outcome.detail.is_some()).count();
            format!(
                "server closed or answered first: {closed}; still open when the client gave up: {}",
                rs.len() - closed
            )
        }
        Scenario::Disconnect => {
            let cut = rs
                .iter()
                .filter(|r| r.outcome.status == Status::Ok && !r.outcome.broken)
                .count();
            format!("{cut} cut by the client after their first tokens")
        }
        _ => String::new(),
    }
}
