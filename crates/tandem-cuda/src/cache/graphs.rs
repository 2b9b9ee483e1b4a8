//! Decode steps as CUDA graphs. A decode step launches a few hundred small kernels; launched one by
//! one, their launch costs outweigh the weight reads. So a sequence's second decode step is captured
//! into a graph (the first fills the buffer pool, so capture allocates nothing), and later steps
//! replay it: the layer graph runs "dry" on the host only (placement updates; per-step values such as
//! positions, cache rows and tile spans written to the parameter arena in the same order as during
//! capture), the arena is uploaded, and the graph is launched (the dry pass of the next step is made
//! while the GPU runs this one: `Ahead`); the logits come back in page-locked memory, lent to the
//! caller (`LentHost`). Kernels read every per-step value from the arena, so replays compute
//! exactly what a direct launch would (`tandem gpu-check` compares bits).
//!
//! A batched decode step (one row of each of several sequences, as the server's decoders take
//! turns) is captured the same way, keyed by its shape rather than its sequences (`GraphKey`): its
//! attention kernel finds each row's caches through tables in the arena, so the graph serves any
//! sequences of that count. Launched directly, such a step spent about 3 ms a step enqueueing its
//! kernels, more than the GPU's work for a few sequences.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::Instant;

use cudarc::driver::CudaGraph;
use tandem_model::backend::SequenceCache;
use tandem_model::kv::RingPlacement;
use tandem_model::{LogitRows, ModelError, Span};

use crate::cache::kv::GpuSequenceKv;
use crate::routes;
use crate::runtime::grid::i32_of;
use crate::runtime::pool::DevBuf;

/// A model's decode graphs (`CudaModel::graphs`): the cache, the dry pass made ahead, their
/// switches and the counters checks read.
pub struct GraphCache {
    /// Decode steps through captured CUDA graphs (`TANDEM_CUDA_GRAPHS=0` turns this off).
    pub enabled: Cell<bool>,
    /// Why this model never decodes through graphs, whatever `enabled` says (a mixture whose expert
    /// launches follow routing read back on the host: `model/experts.rs`).
    pub blocked: Option<&'static str>,
    /// Rows up to which a batched step is captured: `MAX_BATCH_ROWS`, or fewer where larger steps
    /// take a route a graph cannot replay (a mixture's experts past
    /// `routes::INDEXED_EXPERTS_MAX_ROWS` where they have no sorted route).
    pub max_batch_rows: usize,
    /// Batched decode steps through them too (`TANDEM_CUDA_BATCH_GRAPHS=0` turns only this off; a
    /// failed batched capture too).
    pub batch_enabled: Cell<bool>,
    pub(crate) captured_out: RefCell<Option<DevBuf<f32>>>,
    pub(crate) cache: RefCell<Vec<DecodeGraph>>,
    /// The next decode step's dry pass, made while the GPU ran this one (`decode_graph.rs`);
    /// `TANDEM_CUDA_AHEAD=0` turns it off.
    pub(crate) ahead: RefCell<Option<Ahead>>,
    pub ahead_enabled: bool,
    /// Replayed steps that took their parameters from a dry pass made ahead (for checks).
    pub ahead_taken: Cell<u64>,
    /// Batched decode steps replayed from a graph (for checks).
    pub batch_replays: Cell<u64>,
    pub(crate) warmed: RefCell<VecDeque<GraphKey>>,
}

/// Graphs kept at once (one per sequence being decoded, one per batch shape; the one replayed longest
/// ago goes first).
pub(crate) const MAX_GRAPHS: usize = 16;
/// Keys remembered as having taken their direct first step (the oldest is forgotten first, so a
/// long-running server holds a bounded list; a forgotten one takes one more direct step).
const MAX_WARMED: usize = 64;
/// Rows up to which a batched decode step is captured (`ARENA_INTS` holds their parameters; larger
/// batches spend more GPU time than their launches cost, and launch directly).
pub(crate) const MAX_BATCH_ROWS: usize = 64;

/// What a captured decode graph serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GraphKey {
    /// One sequence's step: its kernels take that sequence's caches as arguments.
    Sequence(u64),
    /// A batched step of `rows` sequences, whose kernels find each row's caches through the arena:
    /// any `rows` sequences whose furthest row spans at most `tiles` attention tiles
    /// (`routes::batch_tiles`) and whose largest context is `n_ctx` (the tile grid and partial
    /// buffers fixed at capture follow from these three alone: `CudaModel::batch_tile_cap`).
    Batch { rows: usize, tiles: usize, n_ctx: usize },
}

/// What a span of a pass is, as far as the choice of graph goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpanShape {
    rows: usize,
    logits: LogitRows,
    seq: u64,
    /// The position of its first row.
    position: usize,
    n_ctx: usize,
}

impl SpanShape {
    pub(crate) fn of(s: &Span<GpuSequenceKv>) -> Self {
        SpanShape {
            rows: s.tokens.len(),
            logits: s.logits,
            seq: s.kv.id,
            position: s.kv.len(),
            n_ctx: s.kv.n_ctx,
        }
    }
}

/// The graph a pass of `spans` takes, if any: a decode step of one row a span, each asking for its
/// logits (`batches`: also of several spans, up to `MAX_BATCH_ROWS`).
pub(crate) fn graph_key(spans: &[SpanShape], batches: bool) -> Option<GraphKey> {
    if !spans.iter().all(|s| s.rows == 1 && s.logits == LogitRows::Last) {
        return None;
    }
    match spans {
        [] => None,
        [one] => Some(GraphKey::Sequence(one.seq)),
        _ if !batches || spans.len() > MAX_BATCH_ROWS => None,
        _ => Some(GraphKey::Batch {
            rows: spans.len(),
            tiles: routes::batch_tiles(spans.iter().map(|s| s.position).max().unwrap_or(0)),
            n_ctx: spans.iter().map(|s| s.n_ctx).max().unwrap_or(0),
        }),
    }
}

/// Whether `key` is on its first decode step (then remembered, within `MAX_WARMED`).
pub(crate) fn warm_up(warmed: &mut VecDeque<GraphKey>, key: GraphKey) -> bool {
    if warmed.contains(&key) {
        return false;
    }
    if warmed.len() == MAX_WARMED {
        warmed.pop_front();
    }
    warmed.push_back(key);
    true
}

pub(crate) struct DecodeGraph {
    pub(crate) key: GraphKey,
    pub(crate) graph: CudaGraph,
    /// The logits buffer the graph writes (a row per span).
    pub(crate) out: DevBuf<f32>,
}

/// The dry pass of a sequence's next decode step, made while the GPU runs this one. What a dry pass
/// stages follows from the cache placements, the row count and the model alone, except the token
/// ids (`PassState::token_slot`): so when the sequence comes back with the placements the pass
/// started from and one token, its parameters, with the token written into its slot, are the ones a
/// dry pass would stage then, and its placements after are the step's. Anything else (another
/// sequence, a cache rolled back or grown by a prefill, a failed pass) leaves it unused.
pub(crate) struct Ahead {
    pub(crate) seq: u64,
    pub(crate) before: Vec<RingPlacement>,
    pub(crate) after: Vec<RingPlacement>,
    pub(crate) staging: Vec<i32>,
    pub(crate) token_slot: usize,
}

/// A step's staged parameters and its cache placements after it.
type StepParams = (Vec<i32>, Vec<RingPlacement>);

impl Ahead {
    /// This pass's parameters, with the token written into its slot, and the placements after it,
    /// for a step of sequence `seq` feeding `tokens` from placements `now`; `None` when the pass does
    /// not fit that step.
    pub(crate) fn take_for(
        self,
        seq: u64,
        tokens: &[u32],
        now: &[RingPlacement],
        n_vocab: usize,
    ) -> Result<Option<StepParams>, ModelError> {
        let &[id] = tokens else {
            return Ok(None);
        };
        if self.seq != seq || self.before != now {
            return Ok(None);
        }
        if id as usize >= n_vocab {
            return Err(ModelError::Token { id, n_vocab });
        }
        let mut staging = self.staging;
        match staging.get_mut(self.token_slot) {
            Some(slot) => *slot = i32_of(id as usize, "token id")?,
            None => return Ok(None),
        }
        Ok(Some((staging, self.after)))
    }
}

pub(crate) fn placements(kv: &GpuSequenceKv) -> Vec<RingPlacement> {
    kv.layers.iter().map(|l| l.placement).collect()
}

/// Every span's placements, to restore after a failed capture.
pub(crate) fn all_placements(spans: &[Span<GpuSequenceKv>]) -> Vec<Vec<RingPlacement>> {
    spans.iter().map(|s| placements(s.kv)).collect()
}

pub(crate) fn set_placements(kv: &mut GpuSequenceKv, to: &[RingPlacement]) {
    for (layer, p) in kv.layers.iter_mut().zip(to) {
        layer.placement = *p;
    }
}

/// Host times within a timed replay (`TANDEM_CUDA_PASS_TIMES=1`): the dry pass, the parameter
/// upload, the graph launch call, the wait for the graph and the logits' copy into page-locked
/// memory (lent to the caller from there: no copy into a vector).
pub(crate) struct ReplayMarks {
    start: Option<Instant>,
    at: [Option<Instant>; 5],
}

impl ReplayMarks {
    pub(crate) fn new(timed: bool) -> Self {
        ReplayMarks {
            start: timed.then(Instant::now),
            at: [None; 5],
        }
    }

    pub(crate) fn mark(&mut self, i: usize) {
        if self.start.is_some() {
            self.at[i] = Some(Instant::now());
        }
    }

    pub(crate) fn line(&self) -> String {
        let us = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.1}", 1e6 * (b - a).as_secs_f64()),
            _ => "-".into(),
        };
        format!(
            "replay us: dry {} upload {} launch {} wait {} copy {}",
            us(self.start, self.at[0]),
            us(self.at[0], self.at[1]),
            us(self.at[1], self.at[2]),
            us(self.at[2], self.at[3]),
            us(self.at[3], self.at[4]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_marks_time_only_when_asked_and_name_each_part() {
        let mut quiet = ReplayMarks::new(false);
        for i in 0..5 {
            quiet.mark(i);
        }
        assert_eq!(quiet.line(), "replay us: dry - upload - launch - wait - copy -");
        let mut timed = ReplayMarks::new(true);
        for i in 0..5 {
            timed.mark(i);
        }
        let line = timed.line();
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(parts.len(), 12, "{line}");
        for (name, value) in parts[2..].chunks(2).map(|c| (c[0], c[1])) {
            assert!(["dry", "upload", "launch", "wait", "copy"].contains(&name), "{line}");
            assert!(value.parse::<f64>().is_ok_and(|us| us >= 0.0), "{line}");
        }
    }

    #[test]
    fn parameters_made_ahead_serve_only_the_step_they_were_made_for() {
        let (before, after) = (vec![RingPlacement::new(16); 2], vec![RingPlacement::new(32); 2]);
        let ahead = || Ahead {
            seq: 7,
            before: before.clone(),
            after: after.clone(),
            staging: vec![5, 0, 9],
            token_slot: 1,
        };
        let (staging, placed) = ahead().take_for(7, &[42], &before, 100).unwrap().unwrap();
        assert_eq!(staging, vec![5, 42, 9]);
        assert_eq!(placed, after);
        // Another sequence, more than one token, other placements, a slot past the staging: unused.
        assert!(ahead().take_for(8, &[42], &before, 100).unwrap().is_none());
        assert!(ahead().take_for(7, &[42, 43], &before, 100).unwrap().is_none());
        assert!(ahead().take_for(7, &[], &before, 100).unwrap().is_none());
        assert!(ahead().take_for(7, &[42], &after, 100).unwrap().is_none());
        let past = Ahead {
            token_slot: 3,
            ..ahead()
        };
        assert!(past.take_for(7, &[42], &before, 100).unwrap().is_none());
        // A token past the vocabulary is the step's error, as a dry pass would give it.
        let err = ahead().take_for(7, &[100], &before, 100).unwrap_err();
        assert!(matches!(err, ModelError::Token { id: 100, n_vocab: 100 }), "{err}");
    }

    #[test]
    fn a_sequence_warms_up_once_and_the_list_stays_bounded() {
        let mut warmed = VecDeque::new();
        let seq = GraphKey::Sequence;
        assert!(warm_up(&mut warmed, seq(1)));
        assert!(!warm_up(&mut warmed, seq(1)));
        for id in 2..=(MAX_WARMED as u64 + 1) {
            assert!(warm_up(&mut warmed, seq(id)));
        }
        assert_eq!(warmed.len(), MAX_WARMED);
        // Sequence 1 was the oldest and is forgotten: one more direct step.
        assert!(warm_up(&mut warmed, seq(1)));
    }

    #[test]
    fn decode_steps_take_a_graph_per_sequence_and_batches_one_per_shape() {
        let span = |seq, position, n_ctx| SpanShape {
            rows: 1,
            logits: LogitRows::Last,
            seq,
            position,
            n_ctx,
        };
        assert_eq!(graph_key(&[span(7, 90, 2048)], true), Some(GraphKey::Sequence(7)));
        assert_eq!(graph_key(&[span(7, 90, 2048)], false), Some(GraphKey::Sequence(7)));
        let batch = [span(7, 90, 2048), span(8, 300, 4096), span(9, 5, 2048)];
        let key = Some(GraphKey::Batch {
            rows: 3,
            tiles: 4,
            n_ctx: 4096,
        });
        assert_eq!(graph_key(&batch, true), key);
        // Other sequences of the same count, furthest position's tiles and context share it.
        let others = [span(1, 383, 4096), span(2, 0, 16), span(3, 256, 4096)];
        assert_eq!(graph_key(&others, true), key);
        // Past a power of two of tiles: another graph.
        let further = [span(1, 512, 4096), span(2, 0, 16), span(3, 256, 4096)];
        assert!(matches!(
            graph_key(&further, true),
            Some(GraphKey::Batch { tiles: 8, .. })
        ));
        // No graph: batched graphs off, a chunk, a row without logits, too many rows, nothing.
        assert_eq!(graph_key(&batch, false), None);
        let chunk = SpanShape {
            rows: 2,
            ..span(7, 90, 2048)
        };
        assert_eq!(graph_key(&[chunk], true), None);
        let quiet = SpanShape {
            logits: LogitRows::None,
            ..span(8, 9, 2048)
        };
        assert_eq!(graph_key(&[span(7, 90, 2048), quiet], true), None);
        let many: Vec<_> = (0..=MAX_BATCH_ROWS as u64).map(|s| span(s, 10, 2048)).collect();
        assert_eq!(graph_key(&many, true), None);
        assert!(graph_key(&many[1..], true).is_some());
        assert_eq!(graph_key(&[], true), None);
    }
}
