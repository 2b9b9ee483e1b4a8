//! Batched decode steps replayed from captured graphs against the same steps launched directly, as a
//! server runs them: one sequence decoding alone (its own graph), then joined by others (a graph per
//! batch shape, captured for some sequences and replayed for any of that count, across a growth of
//! the attention grid), then alone again (its graph replayed after the batch grew the attention
//! counters it was captured with).

use anyhow::Result;
use tandem_cuda::{CudaModel, GpuSequenceKv};
use tandem_engine::{sampling, Engine};
use tandem_model::{LogitRows, Logits};

use super::Row;

/// Steps in each phase. The first sequence's prompt is the longest: its row is the batch's furthest,
/// at position `FIRST_PROMPT + STEPS` when the batch starts, and crosses 256 (a grid of four tiles
/// from two, `routes::batch_tiles`) three steps before the batch ends, so the batch captures two
/// graphs.
const STEPS: usize = 12;
const FIRST_PROMPT: usize = 235;

/// The logits of every step of the three phases, each step's rows in sequence order.
fn run(gpu: &mut Engine<CudaModel>, prompt: &[u32], batch: usize, graphs: bool) -> Result<Vec<Vec<f32>>> {
    gpu.model.graphs_enabled.set(graphs);
    gpu.model.batch_graphs_enabled.set(graphs);
    let n_ctx = FIRST_PROMPT + 3 * STEPS + 1;
    let mut kvs: Vec<GpuSequenceKv> = Vec::with_capacity(batch);
    let mut next = Vec::with_capacity(batch);
    for i in 0..batch {
        let mut kv = gpu.try_new_sequence(n_ctx)?;
        // Prompts of different lengths: the rows sit at different positions of their caches.
        let len = FIRST_PROMPT - 9 * i.min(19);
        let logits = gpu.prefill(&mut kv, &prompt[..len.min(prompt.len())], 512)?;
        next.push(sampling::argmax(&logits));
        kvs.push(kv);
    }
    let mut seen = Vec::new();
    let mut keep = |logits: &[Logits], next: &mut [u32]| {
        let mut rows = Vec::new();
        for (l, t) in logits.iter().zip(next.iter_mut()) {
            rows.extend_from_slice(l);
            *t = sampling::argmax(l);
        }
        seen.push(rows);
    };
    for phase in [1, batch, 1] {
        for _ in 0..STEPS {
            let logits = match phase {
                1 => vec![gpu.forward(&mut kvs[0], &[next[0]], LogitRows::Last)?],
                _ => gpu.forward_each(&mut kvs, &next)?,
            };
            keep(&logits, &mut next[..phase]);
        }
    }
    Ok(seen)
}

/// One row for each batch size: graph replays bit-identical to direct launches.
pub(super) fn batch_graph_rows(
    gpu: &mut Engine<CudaModel>,
    short: &str,
    prompt: &[u32],
    batches: &[usize],
    table: &mut Vec<Row>,
) -> Result<()> {
    for &batch in batches {
        let direct = run(gpu, prompt, batch, false)?;
        let replays_before = gpu.model.batch_replays.get();
        let graphs = run(gpu, prompt, batch, true)?;
        let replays = gpu.model.batch_replays.get() - replays_before;
        let used = gpu.model.graphs_enabled.get() && gpu.model.batch_graphs_enabled.get();
        let same = direct.len() == graphs.len()
            && direct
                .iter()
                .zip(&graphs)
                .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        // Two graphs for the batch (a warm-up and a capture each): the other steps replay.
        let want = STEPS as u64 - 4;
        table.push(Row {
            check: format!(
                "{short}: {batch} sequences decoded together, CUDA graph replays vs direct launches (alone, batched, alone)"
            ),
            result: format!(
                "{}; {replays} batched steps replayed (at least {want}){}",
                if same { "bit-identical" } else { "DIFFERENT" },
                if used { "" } else { " (capture failed: graphs off)" }
            ),
            pass: same && used && replays >= want,
        });
    }
    gpu.model.graphs_enabled.set(true);
    gpu.model.batch_graphs_enabled.set(true);
    Ok(())
}
