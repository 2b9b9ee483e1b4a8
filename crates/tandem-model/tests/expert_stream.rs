//! The expert stream's issuer walk, `issue_walk` (the function the engine runs on its issuer thread),
//! without a GPU: against a step-driven simulated link in one thread (fixed and random cases, every
//! interleaving drawn from a seeded generator so a failure replays), and against a link thread and a
//! consumer thread with real atomics. The consumer walks the layers as prefill does: route, publish,
//! then wait for each routed entry, read its slot and release it, releasing unrouted entries unread.
//!
//! On every walk: each routed entry is copied once, into slot k % ring, and read with its own bytes;
//! only unrouted entries of published layers are skipped; never more than depth copies are queued; no
//! slot is overwritten before its entry is released; `All` copies everything; and the walk ends when the
//! consumer stops early.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use tandem_model::expert_stream::{
    backoff, issue_walk, ChunkStream, EntryState, Link, StreamDepth, StreamEntry, StreamError, StreamPlan, WalkMode,
    WalkStats,
};

/// xorshift64*: enough randomness for schedules and shapes, and no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Word `i` of the bytes entry k's copy puts in its slot: a reader can tell whose bytes a slot holds.
fn word(k: usize, entry: &StreamEntry, i: usize) -> u64 {
    mix(((k as u64) << 32) ^ ((entry.layer as u64) << 20) ^ ((entry.expert as u64) << 8) ^ entry.bytes ^ mix(i as u64))
}

/// One chunk to stream: its shape, which experts are resident and which are routed, the ring and the
/// walk's settings, and (for the simulation) how fast the link and the consumer go.
#[derive(Clone, Debug)]
struct Case {
    n_layers: usize,
    n_experts: usize,
    resident: Vec<bool>,
    routed: Vec<bool>,
    ring: usize,
    depth: usize,
    mode: WalkMode,
    /// The consumer stops the stream after handling this many entries.
    stop_after: Option<usize>,
    seed: u64,
    /// Ticks one copy occupies the link: `latency.0 + below(latency.1)`.
    latency: (u64, u64),
    /// Chance per tick that the consumer takes a step.
    consumer_p: f64,
}

impl Case {
    fn new(n_layers: usize, n_experts: usize, ring: usize, depth: usize, mode: WalkMode) -> Self {
        let cells = n_layers * n_experts;
        Case {
            n_layers,
            n_experts,
            resident: vec![false; cells],
            routed: vec![true; cells],
            ring,
            depth,
            mode,
            stop_after: None,
            seed: 1,
            latency: (2, 4),
            consumer_p: 0.5,
        }
    }

    fn routed_where(mut self, f: impl Fn(usize, usize) -> bool) -> Self {
        for l in 0..self.n_layers {
            for e in 0..self.n_experts {
                self.routed[l * self.n_experts + e] = f(l, e);
            }
        }
        self
    }

    fn resident_where(mut self, f: impl Fn(usize, usize) -> bool) -> Self {
        for l in 0..self.n_layers {
            for e in 0..self.n_experts {
                self.resident[l * self.n_experts + e] = f(l, e);
            }
        }
        self
    }

    fn random(seed: u64) -> Self {
        let mut r = Rng::new(seed);
        let n_layers = 1 + r.below(6) as usize;
        let n_experts = 1 + r.below(12) as usize;
        let resident_p = [0.0, 0.3, 0.7, 1.0][r.below(4) as usize];
        let routed_p = [0.0, 0.1, 0.4, 0.8, 1.0][r.below(5) as usize];
        let ring = match r.below(4) {
            0 => 1,
            1 => 1 + r.below(4) as usize,
            2 => 1 + r.below(n_experts as u64 + 2) as usize,
            _ => 1 + r.below((n_layers * n_experts) as u64 + 4) as usize,
        };
        let depth = match r.below(4) {
            0 => 1,
            1 => 256,
            _ => 1 + r.below(20) as usize,
        };
        let mode = if r.chance(0.7) { WalkMode::Routed } else { WalkMode::All };
        let mut case = Case::new(n_layers, n_experts, ring, depth, mode);
        for c in 0..n_layers * n_experts {
            case.resident[c] = r.chance(resident_p);
            case.routed[c] = r.chance(routed_p);
        }
        case.stop_after = r
            .chance(0.15)
            .then(|| r.below((n_layers * n_experts) as u64 + 1) as usize);
        case.seed = seed;
        case.latency = (1 + r.below(4), 1 + r.below(8));
        case.consumer_p = [0.1, 0.4, 0.9][r.below(3) as usize];
        case
    }

    fn plan(&self) -> StreamPlan {
        let e = self.n_experts;
        StreamPlan::non_resident(
            self.n_layers,
            e,
            self.ring,
            |l, x| self.resident[l * e + x],
            |l, x| 1000 + ((l * 31 + x * 17) % 5000) as u64,
        )
        .unwrap()
    }

    fn is_routed(&self, entry: &StreamEntry) -> bool {
        self.routed[entry.layer * self.n_experts + entry.expert]
    }

    fn layer_routing(&self, layer: usize) -> &[bool] {
        &self.routed[layer * self.n_experts..(layer + 1) * self.n_experts]
    }

    fn depth(&self) -> StreamDepth {
        StreamDepth::new(self.depth).unwrap()
    }
}

/// What a finished walk left, for the checks every walk shares.
struct Outcome {
    stats: WalkStats,
    /// Copies of each entry issued on the link.
    copies: Vec<u32>,
    /// Reads of each entry's slot by the consumer.
    reads: Vec<u32>,
    /// The most copies queued on the link and not landed at once.
    max_queued: usize,
    /// The consumer stopped the stream.
    consumer_stopped: bool,
}

/// The checks every walk must pass, whatever the schedule.
fn check(case: &Case, chunk: &ChunkStream, out: &Outcome) {
    let plan = chunk.plan();
    let ctx = format!("{case:?}");
    assert!(chunk.has_ended(), "the issuer did not mark its end: {ctx}");
    assert!(
        out.max_queued <= case.depth,
        "{} copies queued past a depth of {}: {ctx}",
        out.max_queued,
        case.depth
    );
    let mut copied = 0;
    let mut bytes = 0;
    for (k, entry) in plan.entries().iter().enumerate() {
        let state = chunk.poll(k).unwrap();
        assert!(out.copies[k] <= 1, "entry {k} copied {} times: {ctx}", out.copies[k]);
        assert!(out.reads[k] <= 1, "entry {k} read {} times: {ctx}", out.reads[k]);
        assert_eq!(
            state == EntryState::Copied,
            out.copies[k] == 1,
            "entry {k} is {state:?}: {ctx}"
        );
        if state == EntryState::Skipped {
            assert_eq!(case.mode, WalkMode::Routed, "entry {k} skipped by an All walk: {ctx}");
            assert!(!case.is_routed(entry), "routed entry {k} was skipped: {ctx}");
            assert!(
                chunk.gate().is_published(entry.layer),
                "entry {k} skipped, its layer unpublished: {ctx}"
            );
        }
        if !case.is_routed(entry) {
            assert_eq!(out.reads[k], 0, "unrouted entry {k} was read: {ctx}");
        }
        if out.reads[k] == 1 {
            assert_eq!(state, EntryState::Copied, "entry {k} read without a copy: {ctx}");
        }
        if out.copies[k] == 1 {
            copied += 1;
            bytes += entry.bytes;
        }
    }
    assert_eq!((out.stats.copied, out.stats.bytes), (copied, bytes), "{ctx}");
    assert_eq!(out.stats.skipped, chunk.issued() - copied, "{ctx}");
    if !out.consumer_stopped {
        assert!(!out.stats.stopped, "{ctx}");
        assert_eq!(chunk.issued(), plan.len(), "the walk left entries unsettled: {ctx}");
        for (k, entry) in plan.entries().iter().enumerate() {
            if case.is_routed(entry) {
                assert_eq!((out.copies[k], out.reads[k]), (1, 1), "routed entry {k}: {ctx}");
            }
        }
        if case.mode == WalkMode::All {
            assert_eq!(out.stats.copied, plan.len(), "All did not copy everything: {ctx}");
        }
    } else {
        for k in chunk.issued()..plan.len() {
            assert_eq!(chunk.poll(k).unwrap(), EntryState::Ended, "{ctx}");
            assert_eq!(out.copies[k], 0, "{ctx}");
        }
    }
}

// ---- The step-driven simulation: one thread, time passes inside the link's calls. ----

/// The link and the consumer of one simulated chunk. Every call the walk makes on the link lets a few
/// ticks pass; in each tick queued copies land in order once their time has come and the consumer may
/// take one step of its walk.
struct Sim<'a> {
    case: &'a Case,
    chunk: &'a ChunkStream,
    rng: Rng,
    tick: u64,
    /// Copies on the link, oldest first, with the tick each lands.
    queue: VecDeque<(usize, u64)>,
    link_free_at: u64,
    /// Per slot, the entry whose bytes it holds (the words of a copy that has landed).
    slot_holds: Vec<Option<(usize, u64)>>,
    /// Per slot, the last entry whose copy was issued into it.
    slot_last: Vec<Option<usize>>,
    landed: Vec<bool>,
    copies: Vec<u32>,
    reads: Vec<u32>,
    max_queued: usize,
    // The consumer's place in its walk.
    layer: usize,
    published: bool,
    next: usize,
    handled: usize,
    done: bool,
    stopped: bool,
    idle_rounds: u64,
}

const SIM_IDLE_LIMIT: u64 = 1_000_000;

impl<'a> Sim<'a> {
    fn new(case: &'a Case, chunk: &'a ChunkStream) -> Self {
        let n = chunk.plan().len();
        Sim {
            case,
            chunk,
            rng: Rng::new(case.seed ^ 0x5EED),
            tick: 0,
            queue: VecDeque::new(),
            link_free_at: 0,
            slot_holds: vec![None; case.ring],
            slot_last: vec![None; case.ring],
            landed: vec![false; n],
            copies: vec![0; n],
            reads: vec![0; n],
            max_queued: 0,
            layer: 0,
            published: false,
            next: 0,
            handled: 0,
            done: false,
            stopped: false,
            idle_rounds: 0,
        }
    }

    fn advance(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.tick += 1;
            while let Some(&(k, at)) = self.queue.front() {
                if at > self.tick {
                    break;
                }
                self.queue.pop_front();
                let entry = self.chunk.plan().entries()[k];
                self.slot_holds[self.chunk.plan().slot(k)] = Some((k, word(k, &entry, 0)));
                self.landed[k] = true;
            }
            if self.rng.chance(self.case.consumer_p) {
                self.consumer_step();
            }
        }
    }

    /// One step of the consumer's walk, as prefill takes it: publish a layer's routing when it reaches
    /// the layer, then handle its entries in order.
    fn consumer_step(&mut self) {
        let (case, chunk) = (self.case, self.chunk);
        let plan = chunk.plan();
        if self.done || self.stopped {
            return;
        }
        if case.stop_after.is_some_and(|n| self.handled >= n) {
            chunk.stop();
            self.stopped = true;
            return;
        }
        if self.layer == plan.n_layers() {
            self.done = true;
            return;
        }
        let entries = plan.layer_entries(self.layer);
        if !self.published {
            // The issuer may skip only what is published: nothing of this layer is skipped yet.
            for k in entries.clone() {
                assert_ne!(
                    chunk.poll(k).unwrap(),
                    EntryState::Skipped,
                    "entry {k} skipped early: {case:?}"
                );
            }
            chunk.publish(self.layer, case.layer_routing(self.layer)).unwrap();
            self.published = true;
            self.next = entries.start;
            return;
        }
        if self.next == entries.end {
            self.layer += 1;
            self.published = false;
            return;
        }
        let k = self.next;
        let entry = plan.entries()[k];
        if case.is_routed(&entry) {
            match chunk.poll(k).unwrap() {
                EntryState::Pending => {
                    // Still to be issued, and the ring leaves it room: the wait is one the issuer ends.
                    assert!(chunk.ring_allows(k), "entry {k} waits past the ring: {case:?}");
                    return;
                }
                EntryState::Copied => {}
                other => panic!("routed entry {k} is {other:?}: {case:?}"),
            }
            assert_eq!(chunk.wait_copy(k), Ok(plan.slot(k)));
            if !self.landed[k] {
                return; // the compute stream waits on the copied event
            }
            assert_eq!(
                self.slot_holds[plan.slot(k)],
                Some((k, word(k, &entry, 0))),
                "slot {} does not hold entry {k}'s bytes: {case:?}",
                plan.slot(k)
            );
            self.reads[k] += 1;
        }
        chunk.release_through(k + 1);
        self.next += 1;
        self.handled += 1;
    }

    fn outcome(self, stats: WalkStats) -> Outcome {
        Outcome {
            stats,
            copies: self.copies,
            reads: self.reads,
            max_queued: self.max_queued,
            consumer_stopped: self.stopped,
        }
    }
}

impl Link for Sim<'_> {
    type Error = Infallible;

    fn issue_copy(&mut self, k: usize, entry: &StreamEntry, slot: usize) -> Result<(), Infallible> {
        let case = self.case;
        assert_eq!(slot, k % case.ring, "entry {k} into the wrong slot: {case:?}");
        assert_eq!(self.chunk.plan().entries()[k], *entry);
        assert_eq!(self.copies[k], 0, "entry {k} copied twice: {case:?}");
        // No time passes between the walk's last look at the gate and this call, so a copy of an entry
        // the gate already lets it skip is a skip missed.
        if case.mode == WalkMode::Routed {
            assert!(
                !self.chunk.gate().is_skippable(entry.layer, entry.expert),
                "entry {k} not skipped: {case:?}"
            );
        }
        let released = self.chunk.released();
        if let Some(prev) = self.slot_last[slot] {
            assert!(
                prev < released,
                "slot {slot} overwritten by {k} before entry {prev} was released: {case:?}"
            );
        }
        assert!(
            k < released + case.ring,
            "entry {k} issued past the ring ({released} released): {case:?}"
        );
        assert!(
            self.queue.len() < case.depth,
            "a copy queued past a depth of {}: {case:?}",
            case.depth
        );
        self.copies[k] += 1;
        self.slot_last[slot] = Some(k);
        let start = self.link_free_at.max(self.tick);
        self.link_free_at = start + case.latency.0 + self.rng.below(case.latency.1);
        self.queue.push_back((k, self.link_free_at));
        self.max_queued = self.max_queued.max(self.queue.len());
        let ticks = self.rng.below(3);
        self.advance(ticks);
        Ok(())
    }

    fn landed(&mut self, k: usize) -> Result<bool, Infallible> {
        assert_eq!(
            self.copies[k], 1,
            "asked whether entry {k} landed, never copied: {:?}",
            self.case
        );
        let ticks = self.rng.below(2);
        self.advance(ticks);
        Ok(self.landed[k])
    }

    fn idle(&mut self, _round: u32) {
        self.idle_rounds += 1;
        assert!(
            self.idle_rounds < SIM_IDLE_LIMIT,
            "the walk never ends (deadlock): {:?}",
            self.case
        );
        let ticks = 1 + self.rng.below(3);
        self.advance(ticks);
    }
}

/// Streams one simulated chunk: the consumer may start before the issuer, the issuer walks, then the
/// link and the consumer run on until the consumer is done or has stopped.
fn simulate(case: &Case) -> (WalkStats, ChunkStream, Outcome) {
    let chunk = ChunkStream::new(case.plan());
    let mut sim = Sim::new(case, &chunk);
    let head_start = sim.rng.below(4);
    sim.advance(head_start);
    let stats = issue_walk(&chunk, &mut sim, case.mode, case.depth()).unwrap();
    while !(sim.done || sim.stopped) {
        sim.idle(0);
    }
    let out = sim.outcome(stats);
    check(case, &chunk, &out);
    (stats, chunk, out)
}

#[test]
fn nothing_routed() {
    // A ring of one slot: the issuer waits for each release, and the consumer publishes a layer before
    // it releases any of its entries, so every entry of a layer but its first is skipped.
    let case = Case::new(3, 6, 1, 16, WalkMode::Routed).routed_where(|_, _| false);
    let (stats, ..) = simulate(&case);
    assert_eq!(stats.copied + stats.skipped, 18);
    assert!(stats.skipped >= 15, "{stats:?}");
    for ring in [2, 5, 40] {
        simulate(&Case { ring, ..case.clone() });
    }
}

#[test]
fn everything_routed() {
    for mode in [WalkMode::Routed, WalkMode::All] {
        for ring in [1, 3, 8, 100] {
            let (stats, ..) = simulate(&Case::new(4, 5, ring, 4, mode));
            assert_eq!((stats.copied, stats.skipped), (20, 0));
        }
    }
}

#[test]
fn all_copies_every_entry() {
    let case = Case::new(4, 6, 3, 2, WalkMode::All).routed_where(|l, e| (l + e) % 3 == 0);
    let (stats, ..) = simulate(&case);
    assert_eq!((stats.copied, stats.skipped), (24, 0));
    let (stats, ..) = simulate(&case.routed_where(|_, _| false));
    assert_eq!((stats.copied, stats.skipped), (24, 0));
}

#[test]
fn one_layer() {
    for mode in [WalkMode::Routed, WalkMode::All] {
        simulate(&Case::new(1, 8, 3, 2, mode).routed_where(|_, e| e % 2 == 0));
    }
}

#[test]
fn ring_of_one() {
    for depth in [1, 2, 16] {
        for mode in [WalkMode::Routed, WalkMode::All] {
            let case = Case::new(3, 4, 1, depth, mode).routed_where(|l, e| (l * 4 + e) % 3 != 1);
            simulate(&case);
        }
    }
}

#[test]
fn ring_larger_than_the_chunk() {
    // The issuer never waits for the ring; only the depth rule holds it back.
    for depth in [1, 4, 256] {
        let case = Case::new(3, 5, 64, depth, WalkMode::Routed).routed_where(|_, e| e == 2);
        let (stats, ..) = simulate(&case);
        assert_eq!(stats.copied + stats.skipped, 15);
    }
}

#[test]
fn depth_of_one_skips_behind_a_slow_link() {
    // One copy at a time on a slow link with a fast consumer: the routing of a layer lands while the
    // issuer still waits to queue its entries, and re-checking the skip during that wait skips them.
    let mut case = Case::new(4, 8, 64, 1, WalkMode::Routed).routed_where(|_, e| e == 0);
    case.latency = (40, 1);
    case.consumer_p = 1.0;
    let (stats, _, out) = simulate(&case);
    assert_eq!(out.max_queued, 1);
    assert!(stats.skipped > 0, "{stats:?}");
}

#[test]
fn depth_of_256() {
    // A slow link: the issuer queues far ahead of it, as deep as the ring lets it.
    let mut case = Case::new(6, 12, 80, 256, WalkMode::All);
    case.latency = (30, 1);
    let (_, _, out) = simulate(&case);
    assert!(out.max_queued > 16, "{}", out.max_queued);
    simulate(
        &Case {
            mode: WalkMode::Routed,
            ..case
        }
        .routed_where(|l, e| (l ^ e) & 1 == 0),
    );
}

#[test]
fn resident_experts_are_not_streamed() {
    let case = Case::new(3, 6, 4, 4, WalkMode::Routed).resident_where(|l, e| e < l * 2);
    let (stats, chunk, _) = simulate(&case);
    assert_eq!(chunk.plan().len(), 18 - 6);
    assert_eq!(stats.copied, 12);
    let (stats, chunk, _) = simulate(&case.resident_where(|_, _| true));
    assert!(chunk.plan().is_empty());
    assert_eq!(stats, WalkStats::default());
}

#[test]
fn consumer_stops_early() {
    for stop_after in [0, 1, 5, 17] {
        for ring in [1, 4, 50] {
            for mode in [WalkMode::Routed, WalkMode::All] {
                let case = Case {
                    stop_after: Some(stop_after),
                    ..Case::new(4, 6, ring, 3, mode)
                };
                let case = case.routed_where(|l, e| (l + e) % 2 == 0);
                let (stats, chunk, _) = simulate(&case);
                if ring == 1 {
                    // Ring room runs out long before the end: the stop is what ends the walk.
                    assert!(stats.stopped, "{stats:?}");
                }
                assert!(chunk.is_stopped());
            }
        }
    }
}

#[test]
fn random_walks() {
    let (mut skipped, mut stopped, mut stalled) = (0, 0, 0);
    for seed in 1..=400 {
        let case = Case::random(seed);
        let (stats, ..) = simulate(&case);
        skipped += stats.skipped;
        stopped += usize::from(stats.stopped);
        stalled += usize::from(case.ring == 1);
    }
    // The cases reach the paths they are drawn to reach.
    assert!(
        skipped > 100 && stopped > 5 && stalled > 50,
        "{skipped} skipped, {stopped} stopped, {stalled}"
    );
}

#[test]
fn a_link_error_ends_the_consumers_waits() {
    struct Failing(usize);
    impl Link for Failing {
        type Error = &'static str;
        fn issue_copy(&mut self, k: usize, _: &StreamEntry, _: usize) -> Result<(), &'static str> {
            if k == self.0 {
                Err("copy failed")
            } else {
                Ok(())
            }
        }
        fn landed(&mut self, _: usize) -> Result<bool, &'static str> {
            Ok(true)
        }
    }
    let chunk = ChunkStream::new(Case::new(2, 4, 8, 4, WalkMode::All).plan());
    assert_eq!(
        issue_walk(&chunk, &mut Failing(3), WalkMode::All, StreamDepth::default()),
        Err("copy failed")
    );
    assert_eq!(chunk.wait_copy(2), Ok(2));
    assert_eq!(chunk.wait_copy(3), Err(StreamError::IssuerEnded { k: 3 }));
    assert_eq!(chunk.poll(7), Ok(EntryState::Ended));
}

// ---- Three threads with real atomics: issuer, link, consumer. ----

/// The link as a thread: the issuer's `issue_copy` queues an entry, the link thread writes its words
/// into the slot (after a random delay) and then marks it landed with release ordering, in order.
struct Wire {
    ring: usize,
    words: usize,
    depth: usize,
    entries: Vec<StreamEntry>,
    queue: Mutex<VecDeque<usize>>,
    wake: Condvar,
    slots: Vec<AtomicU64>,
    landed: Vec<AtomicBool>,
    landed_count: AtomicUsize,
    queued_count: AtomicUsize,
    copies: Vec<AtomicU32>,
    reads: Vec<AtomicU32>,
    max_queued: AtomicUsize,
    /// The issuer has returned: nothing more will be queued.
    closed: AtomicBool,
}

impl Wire {
    fn new(plan: &StreamPlan, depth: usize, words: usize) -> Self {
        let n = plan.len();
        Wire {
            ring: plan.ring(),
            words,
            depth,
            entries: plan.entries().to_vec(),
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            slots: (0..plan.ring() * words).map(|_| AtomicU64::new(0)).collect(),
            landed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            landed_count: AtomicUsize::new(0),
            queued_count: AtomicUsize::new(0),
            copies: (0..n).map(|_| AtomicU32::new(0)).collect(),
            reads: (0..n).map(|_| AtomicU32::new(0)).collect(),
            max_queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    fn run_link(&self, seed: u64) {
        let mut rng = Rng::new(seed);
        loop {
            let next = {
                let mut q = self.queue.lock().unwrap();
                loop {
                    if let Some(k) = q.pop_front() {
                        break Some(k);
                    }
                    if self.closed.load(Ordering::Acquire) {
                        break None;
                    }
                    q = self.wake.wait_timeout(q, Duration::from_millis(1)).unwrap().0;
                }
            };
            let Some(k) = next else { return };
            for _ in 0..rng.below(200) {
                std::hint::spin_loop();
            }
            if rng.chance(0.05) {
                thread::yield_now();
            }
            let slot = k % self.ring;
            for i in 0..self.words {
                self.slots[slot * self.words + i].store(word(k, &self.entries[k], i), Ordering::Relaxed);
            }
            self.landed[k].store(true, Ordering::Release);
            self.landed_count.fetch_add(1, Ordering::Release);
        }
    }
}

/// The issuer's end of the wire.
struct WireLink<'a> {
    wire: &'a Wire,
    chunk: &'a ChunkStream,
}

impl Link for WireLink<'_> {
    type Error = Infallible;

    fn issue_copy(&mut self, k: usize, _: &StreamEntry, slot: usize) -> Result<(), Infallible> {
        let w = self.wire;
        assert_eq!(slot, k % w.ring);
        let released = self.chunk.released();
        assert!(
            k < released + w.ring,
            "entry {k} issued past the ring ({released} released)"
        );
        // Copies land concurrently, so this overstates what is queued: still never past the depth.
        let queued = w.queued_count.load(Ordering::Relaxed) - w.landed_count.load(Ordering::Acquire);
        assert!(queued < w.depth, "a copy queued past a depth of {}", w.depth);
        w.max_queued.fetch_max(queued + 1, Ordering::Relaxed);
        assert_eq!(w.copies[k].fetch_add(1, Ordering::Relaxed), 0, "entry {k} copied twice");
        w.queued_count.fetch_add(1, Ordering::Relaxed);
        w.queue.lock().unwrap().push_back(k);
        w.wake.notify_one();
        Ok(())
    }

    fn landed(&mut self, k: usize) -> Result<bool, Infallible> {
        Ok(self.wire.landed[k].load(Ordering::Acquire))
    }
}

/// The consumer thread's walk, as prefill takes it. Stops the stream if it leaves early, by choice or
/// by a failed check, so the issuer never waits for ring room that will not come.
fn consume(case: &Case, chunk: &ChunkStream, wire: &Wire) -> bool {
    let _stop = chunk.stop_on_drop();
    let plan = chunk.plan();
    let mut rng = Rng::new(case.seed ^ 0xC0);
    let mut handled = 0;
    for layer in 0..plan.n_layers() {
        for _ in 0..rng.below(2000) {
            std::hint::spin_loop(); // routing the layer's rows
        }
        chunk.publish(layer, case.layer_routing(layer)).unwrap();
        for k in plan.layer_entries(layer) {
            if case.stop_after.is_some_and(|n| handled >= n) {
                return true;
            }
            let entry = plan.entries()[k];
            if case.is_routed(&entry) {
                let slot = chunk.wait_copy(k).unwrap();
                assert_eq!(slot, k % plan.ring());
                let mut round = 0;
                while !wire.landed[k].load(Ordering::Acquire) {
                    backoff(round);
                    round += 1;
                }
                for i in 0..wire.words {
                    let got = wire.slots[slot * wire.words + i].load(Ordering::Relaxed);
                    assert_eq!(got, word(k, &entry, i), "slot {slot} word {i} is not entry {k}'s");
                }
                wire.reads[k].fetch_add(1, Ordering::Relaxed);
            }
            chunk.release_through(k + 1);
            handled += 1;
        }
    }
    // The engine joins the issuer before the guard stops it: wait for the walk to finish by itself.
    let mut round = 0;
    while !chunk.has_ended() {
        backoff(round);
        round += 1;
    }
    false
}

/// Runs `f` on a thread of its own and fails the test if it has not returned within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the walk did not end within {secs} s (deadlock)"),
        _ => worker.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
    }
}

/// One chunk streamed by three threads; returns the walk's stats after the shared checks.
fn threaded(case: Case) -> WalkStats {
    within(30, move || {
        let chunk = ChunkStream::new(case.plan());
        let wire = Wire::new(chunk.plan(), case.depth, 8);
        let (stats, consumer_stopped) = thread::scope(|s| {
            let link = s.spawn(|| wire.run_link(case.seed));
            let consumer = s.spawn(|| consume(&case, &chunk, &wire));
            let issuer = s.spawn(|| {
                // Closes the wire however the walk leaves, a failed check included, so the link thread ends.
                struct Close<'a>(&'a Wire);
                impl Drop for Close<'_> {
                    fn drop(&mut self) {
                        self.0.closed.store(true, Ordering::Release);
                    }
                }
                let _close = Close(&wire);
                issue_walk(
                    &chunk,
                    &mut WireLink {
                        wire: &wire,
                        chunk: &chunk,
                    },
                    case.mode,
                    case.depth(),
                )
            });
            let stats = issuer.join().unwrap().unwrap();
            let stopped = consumer.join().unwrap();
            link.join().unwrap();
            (stats, stopped)
        });
        let load = |v: &[AtomicU32]| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let out = Outcome {
            stats,
            copies: load(&wire.copies),
            reads: load(&wire.reads),
            max_queued: wire.max_queued.load(Ordering::Relaxed),
            consumer_stopped,
        };
        check(&case, &chunk, &out);
        eprintln!(
            "ring {} depth {} {:?}: {stats} of {}",
            case.ring,
            case.depth,
            case.mode,
            chunk.plan().len()
        );
        stats
    })
}

fn threaded_case(seed: u64, ring: usize, depth: usize, mode: WalkMode) -> Case {
    let mut r = Rng::new(seed);
    let mut case = Case::new(16, 32, ring, depth, mode);
    for c in 0..case.resident.len() {
        case.resident[c] = r.chance(0.5);
        case.routed[c] = r.chance(0.3);
    }
    case.seed = seed;
    case
}

#[test]
fn threads_routed() {
    for seed in 0..4 {
        for (ring, depth) in [(8, 4), (16, 16), (3, 256), (40, 1)] {
            threaded(threaded_case(100 + seed, ring, depth, WalkMode::Routed));
        }
    }
}

#[test]
fn threads_all() {
    for seed in 0..3 {
        for (ring, depth) in [(8, 4), (500, 1), (2, 256)] {
            let case = threaded_case(200 + seed, ring, depth, WalkMode::All);
            let n = case.plan().len();
            assert_eq!(threaded(case).copied, n);
        }
    }
}

#[test]
fn threads_ring_of_one_skip_every_unrouted_entry_but_a_layers_first() {
    // With one slot, an entry after a layer's first is issued only after the consumer released the
    // entry before it, which it does only after publishing the layer: so the skip is certain.
    let case = threaded_case(31, 1, 2, WalkMode::Routed);
    let plan = case.plan();
    let certain = (0..plan.n_layers())
        .flat_map(|l| plan.layer_entries(l).skip(1))
        .filter(|&k| !case.is_routed(&plan.entries()[k]))
        .count();
    let stats = threaded(case);
    assert!(stats.skipped >= certain, "{} skipped, {certain} certain", stats.skipped);
}

#[test]
fn threads_consumer_stops_early() {
    for (seed, ring, stop_after, mode) in [
        (41, 8, 10, WalkMode::Routed),
        (42, 4, 0, WalkMode::All),
        (43, 1, 30, WalkMode::Routed),
        (44, 16, 120, WalkMode::Routed),
        (45, 16, 120, WalkMode::All),
    ] {
        // Far fewer entries released than the chunk has, so only the stop can end the walk.
        let case = Case {
            stop_after: Some(stop_after),
            ..threaded_case(seed, ring, 4, mode)
        };
        let stats = threaded(case);
        assert!(stats.stopped, "{stats:?}");
    }
}

#[test]
fn threads_link_error_ends_the_consumer() {
    struct Failing;
    impl Link for Failing {
        type Error = String;
        fn issue_copy(&mut self, k: usize, _: &StreamEntry, _: usize) -> Result<(), String> {
            if k == 5 {
                Err(format!("copy of entry {k} failed"))
            } else {
                Ok(())
            }
        }
        fn landed(&mut self, _: usize) -> Result<bool, String> {
            Ok(true)
        }
    }
    within(30, || {
        let case = Case::new(3, 6, 4, 4, WalkMode::All);
        let chunk = ChunkStream::new(case.plan());
        thread::scope(|s| {
            let consumer = s.spawn(|| {
                chunk.publish(0, case.layer_routing(0)).unwrap();
                for k in 0..5 {
                    chunk.wait_copy(k).unwrap();
                    chunk.release_through(k + 1);
                }
                chunk.wait_copy(5)
            });
            let issuer = s.spawn(|| issue_walk(&chunk, &mut Failing, WalkMode::All, StreamDepth::default()));
            assert_eq!(issuer.join().unwrap(), Err("copy of entry 5 failed".to_string()));
            assert_eq!(consumer.join().unwrap(), Err(StreamError::IssuerEnded { k: 5 }));
        });
    });
}
