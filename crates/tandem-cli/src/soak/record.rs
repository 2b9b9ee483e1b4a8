//! What each soak request was meant to do, what it got, and whether that was the right answer.

use std::sync::Mutex;
use std::time::Instant;

use super::requests::{Outcome, Route, Status};

/// Why a request was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// A short prompt, streamed or not.
    Short,
    /// A follow-up turn extending an earlier one (prefix reuse).
    FollowUp,
    /// The same prompt again (whole-prompt reuse).
    Repeat,
    /// A prompt of ~1,500-2,000 tokens.
    Long,
    /// The fixed greedy request whose text must never change.
    Canary,
    /// One of a burst of more concurrent requests than the server queues.
    Burst,
    /// A stream the client drops after its first tokens.
    Disconnect,
    BadJson,
    NegativeTemperature,
    UnknownField,
    HugeMaxTokens,
    /// Headers sent a byte at a time, then abandoned.
    StallHeaders,
    /// A body sent a byte at a time, then abandoned.
    StallBody,
    /// A connection opened and left silent.
    Idle,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Short => "short prompt",
            Scenario::FollowUp => "follow-up turn",
            Scenario::Repeat => "repeated prompt",
            Scenario::Long => "long prompt",
            Scenario::Canary => "greedy canary",
            Scenario::Burst => "burst",
            Scenario::Disconnect => "disconnect mid-stream",
            Scenario::BadJson => "malformed JSON",
            Scenario::NegativeTemperature => "negative temperature",
            Scenario::UnknownField => "unknown field",
            Scenario::HugeMaxTokens => "huge max_tokens",
            Scenario::StallHeaders => "stalled headers",
            Scenario::StallBody => "stalled body",
            Scenario::Idle => "idle connection",
        }
    }

    /// What the server should answer, as the report states it.
    pub fn expected(self) -> &'static str {
        match self {
            Scenario::Short | Scenario::FollowUp | Scenario::Repeat | Scenario::Long | Scenario::Canary => {
                "200 (or 503 queue_full)"
            }
            Scenario::Burst => "200 or 503 queue_full",
            Scenario::Disconnect => "200, then cut by the client",
            Scenario::BadJson | Scenario::NegativeTemperature | Scenario::HugeMaxTokens => "4xx JSON error",
            Scenario::UnknownField => "200 (ignored; or 503 queue_full) or 4xx JSON error",
            Scenario::StallHeaders | Scenario::StallBody | Scenario::Idle => "no answer, or a 4xx / close",
        }
    }

    /// A well-formed generation request read to its end.
    pub fn is_generation(self) -> bool {
        matches!(
            self,
            Scenario::Short
                | Scenario::FollowUp
                | Scenario::Repeat
                | Scenario::Long
                | Scenario::Canary
                | Scenario::Burst
        )
    }

    pub fn is_bad_input(self) -> bool {
        matches!(
            self,
            Scenario::BadJson | Scenario::NegativeTemperature | Scenario::UnknownField | Scenario::HugeMaxTokens
        )
    }

    /// Stalled and idle connections: slow clients the server must cut off.
    pub fn is_slow_client(self) -> bool {
        matches!(self, Scenario::StallHeaders | Scenario::StallBody | Scenario::Idle)
    }

    /// Whether `o` is a right answer to this scenario.
    pub fn met_by(self, o: &Outcome) -> bool {
        let json_4xx = matches!(&o.status, Status::Client { code, .. } if code != "-");
        match self {
            Scenario::Short
            | Scenario::FollowUp
            | Scenario::Repeat
            | Scenario::Long
            | Scenario::Canary
            | Scenario::Burst
            | Scenario::Disconnect => matches!(o.status, Status::Ok | Status::QueueFull) && !o.broken,
            Scenario::BadJson | Scenario::NegativeTemperature | Scenario::HugeMaxTokens => json_4xx,
            Scenario::UnknownField => (matches!(o.status, Status::Ok | Status::QueueFull) && !o.broken) || json_4xx,
            Scenario::StallHeaders | Scenario::StallBody | Scenario::Idle => {
                matches!(o.status, Status::NoAnswer | Status::Client { .. })
            }
        }
    }
}

/// One request of the soak.
#[derive(Clone, Debug)]
pub struct Record {
    pub scenario: Scenario,
    /// `None` for raw connections (stalls, idle ones).
    pub route: Option<Route>,
    pub stream: bool,
    /// Seconds since the soak started, when the request was sent.
    pub at: f64,
    pub outcome: Outcome,
}

/// Every request's record, shared by the client threads.
pub struct Log {
    pub start: Instant,
    records: Mutex<Vec<Record>>,
}

impl Log {
    pub fn new(start: Instant) -> Self {
        Log {
            start,
            records: Mutex::new(Vec::new()),
        }
    }

    pub fn push(&self, scenario: Scenario, route: Option<Route>, stream: bool, sent: Instant, outcome: Outcome) {
        let at = sent.duration_since(self.start).as_secs_f64();
        let r = Record {
            scenario,
            route,
            stream,
            at,
            outcome,
        };
        // A client thread that panicked while holding the lock left whole records behind: keep them.
        self.records.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
