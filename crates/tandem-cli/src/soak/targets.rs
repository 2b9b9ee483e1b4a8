//! The soak's targets: what must hold of the whole run for it to pass.

use super::record::{Record, Scenario};
use super::requests::Status;

/// RSS may grow to this multiple of its first sample after the warm-up.
pub const RSS_LIMIT: f64 = 1.10;

/// One target of the soak and whether it was met.
pub struct Target {
    pub name: &'static str,
    pub result: String,
    pub met: bool,
}

/// Every target, given the records and the RSS series after the warm-up (first sample's time, first, max,
/// last, in MiB).
pub fn check(records: &[Record], rss: Option<(f64, f64, f64, f64)>) -> Vec<Target> {
    let count = |f: &dyn Fn(&Record) -> bool| records.iter().filter(|r| f(r)).count();
    let server = count(&|r| matches!(r.outcome.status, Status::Server { .. }));
    let broken = count(&|r| r.outcome.broken);
    let transport = count(&|r| r.outcome.status == Status::Transport);
    let well_formed = count(&|r| r.scenario.is_generation() || r.scenario == Scenario::Disconnect);
    let refused = count(&|r| {
        (r.scenario.is_generation() || r.scenario == Scenario::Disconnect)
            && matches!(r.outcome.status, Status::Client { .. })
    });
    let bad = count(&|r| r.scenario.is_bad_input());
    let bad_met = count(&|r| r.scenario.is_bad_input() && r.scenario.met_by(&r.outcome));
    let slow = count(&|r| r.scenario.is_slow_client());
    let slow_cut = count(&|r| r.scenario.is_slow_client() && r.outcome.detail.is_some());
    let rss_name = "RSS within 110% of its post-warm-up level";
    let (canary_result, canary_met) = canary(records);
    vec![
        Target {
            name: "no 5xx",
            result: format!("{server} 5xx"),
            met: server == 0,
        },
        Target {
            name: "no broken stream",
            result: format!("{broken} broken"),
            met: broken == 0,
        },
        Target {
            name: "no transport error",
            result: format!("{transport} transport errors"),
            met: transport == 0,
        },
        Target {
            name: "well-formed requests never get a 4xx",
            result: format!("{refused} of {well_formed} got a 4xx"),
            met: refused == 0,
        },
        Target {
            name: "bad inputs get 4xx JSON errors",
            result: format!("{bad_met} of {bad}"),
            met: bad_met == bad,
        },
        // Holds when the server's head and body limits are below `--stall-secs` and its idle limit below
        // twice that (`scripts/soak.sh` starts the server so).
        Target {
            name: "stalled and idle connections cut by the server",
            result: format!("{slow_cut} of {slow}"),
            met: slow_cut == slow,
        },
        match rss {
            Some((_, first, max, last)) => Target {
                name: rss_name,
                result: format!("max {:.2}x, last {:.2}x of {first:.0} MiB", max / first, last / first),
                met: max <= first * RSS_LIMIT,
            },
            None => Target {
                name: rss_name,
                result: "not measured (no server pid, or no sample after the warm-up)".into(),
                met: true,
            },
        },
        Target {
            name: "greedy canary identical",
            result: canary_result,
            met: canary_met,
        },
    ]
}

/// Whether every answered canary gave the same text.
fn canary(records: &[Record]) -> (String, bool) {
    let texts: Vec<&str> = records
        .iter()
        .filter(|r| r.scenario == Scenario::Canary && r.outcome.status == Status::Ok && !r.outcome.broken)
        .map(|r| r.outcome.text.as_str())
        .collect();
    let Some(first) = texts.first() else {
        return ("no canary was answered".into(), false);
    };
    let differ = texts.iter().filter(|t| *t != first).count();
    let shown: String = first.chars().take(60).collect::<String>().replace(['\n', '|'], " ");
    if differ == 0 {
        (
            format!("{} of {} identical: \"{shown}…\"", texts.len(), texts.len()),
            true,
        )
    } else {
        (
            format!("{differ} of {} differ from the first: \"{shown}…\"", texts.len()),
            false,
        )
    }
}
