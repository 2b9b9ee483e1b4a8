//! Batched decode steps replayed from captured graphs against the same steps launched directly, as a
//! server runs them: one sequence decoding alone (its own graph), then joined by others (a graph per
//! batch shape, captured for some sequences and replayed for any of that count, across a growth of
//! the attention grid), then alone again (its graph replayed after the batch grew the attention
//! counters it was captured with). And batched decode against each of its sequences decoded alone on
//! the same tokens (`batch_vs_lone_rows`): the batch routes compute what the one-row route computes.

use anyhow::Result;
use tandem_cuda::{CudaModel, GpuSequenceKv};
use tandem_engine::{sampling, Engine};
use tandem_model::{LogitRows, Logits};

use super::{rel_err, top2_margin, Row};

/// Steps in each phase. The first sequence's prompt is the longest: its row is the batch's furthest,
/// at position `FIRST_PROMPT + STEPS` when the batch starts, and crosses 256 (a grid of four tiles
/// from two, `routes::batch_tiles`) three steps before the batch ends, so the batch captures two
/// graphs.
const STEPS: usize = 12;
const FIRST_PROMPT: usize = 235;

/// Sequence i's prompt length: prompts of different lengths, so the rows of a batch sit at different
/// positions of their caches; the first is the longest.
fn prompt_len(i: usize, prompt: &[u32]) -> usize {
    (FIRST_PROMPT - 9 * i.min(19)).min(prompt.len())
}

/// `batch` sequences of `n_ctx` positions, sequence i prefilled with `prompt_len(i)` tokens of
/// `prompt`, and each one's greedy pick after its prompt.
fn start_batch(
    gpu: &mut Engine<CudaModel>,
    prompt: &[u32],
    batch: usize,
    n_ctx: usize,
) -> Result<(Vec<GpuSequenceKv>, Vec<u32>)> {
    let mut kvs = Vec::with_capacity(batch);
    let mut next = Vec::with_capacity(batch);
    for i in 0..batch {
        let mut kv = gpu.try_new_sequence(n_ctx)?;
        let logits = gpu.prefill(&mut kv, &prompt[..prompt_len(i, prompt)], 512)?;
        next.push(sampling::argmax(&logits));
        kvs.push(kv);
    }
    Ok((kvs, next))
}

/// The logits of every step of the three phases, each step's rows in sequence order.
fn run(gpu: &mut Engine<CudaModel>, prompt: &[u32], batch: usize, graphs: bool) -> Result<Vec<Vec<f32>>> {
    gpu.model.graphs.enabled.set(graphs);
    gpu.model.graphs.batch_enabled.set(graphs);
    let (mut kvs, mut next) = start_batch(gpu, prompt, batch, FIRST_PROMPT + 3 * STEPS + 1)?;
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
        let replays_before = gpu.model.graphs.batch_replays.get();
        let graphs = run(gpu, prompt, batch, true)?;
        let replays = gpu.model.graphs.batch_replays.get() - replays_before;
        let used = gpu.model.graphs.enabled.get() && gpu.model.graphs.batch_enabled.get();
        let same = direct.len() == graphs.len()
            && direct
                .iter()
                .zip(&graphs)
                .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        // Two graphs for the batch (a warm-up and a capture each): the other steps replay. Past the
        // model's capture limit (a mixture's indexed route ends at a few rows) every step launches
        // directly, and those launches must give the same bits.
        let captured = batch <= gpu.model.graphs.max_batch_rows;
        let want = if captured { STEPS as u64 - 4 } else { 0 };
        table.push(Row {
            check: format!(
                "{short}: {batch} sequences decoded together, CUDA graph replays vs direct launches (alone, batched, alone)"
            ),
            result: format!(
                "{}; {replays} batched steps replayed ({}){}",
                if same { "bit-identical" } else { "DIFFERENT" },
                if captured {
                    format!("at least {want}")
                } else {
                    format!("none wanted: past the model's {} rows a step is captured for", gpu.model.graphs.max_batch_rows)
                },
                if used { "" } else { " (capture failed: graphs off)" }
            ),
            pass: same && used && replays >= want && (captured || replays == 0),
        });
    }
    gpu.model.graphs.enabled.set(true);
    gpu.model.graphs.batch_enabled.set(true);
    Ok(())
}

/// Decode steps a batch is compared over against its sequences alone.
const COMPARED_STEPS: usize = 8;

/// Greedy picks are compared only where the lone step's top two logits are this far apart (the
/// issue's margin rule: below it, which of the two wins is within either route's rounding).
const MARGIN: f32 = 0.1;

/// The largest relative difference (L2 over a row) allowed between a batched row and the same row
/// decoded alone. The routes differ in kernel (the batched matvec, qmma or cuBLAS over the f16 copy
/// against the one-row matvec) and so in rounding, not in what they compute; through 32 layers of
/// random weights that reads 2.1-2.5e-2 on the synthetic 8B Q4_K_M and 5.8e-3 on gemma3-270m, as
/// the lone GPU does against the CPU (2.6e-2 on the 8B). A wrong product reads near 1.
const BATCH_REL_BOUND: f64 = 0.1;

/// What a batch of sequences decoded together must give against each decoded alone.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Compare {
    /// The default routes: within `BATCH_REL_BOUND`, the greedy picks equal. Of a mixture, up to
    /// `MIXTURE_ROWS_OVER` of the rows may be over the bound: a row whose router logits sit near a
    /// tie between its k-th and (k+1)-th experts may route differently under the batch routes'
    /// rounding (through the residual stream), and one other expert moves its logits by far more
    /// than rounding (2.7e-1 read on the synthetic qwen3moe-tiny files, one row of 128-192).
    Rounding { mixture: bool },
    /// `--deterministic`: bit-identical logits.
    Exact,
}

/// Of a mixture's batched rows, the fraction that may be over `BATCH_REL_BOUND` (`Compare`).
const MIXTURE_ROWS_OVER: f64 = 0.05;

/// One row for each batch size: `batch` sequences decoded together (the routes the load-time timing
/// chose for that many rows) against each sequence decoded alone on the same tokens, the batch's
/// own greedy picks fed to both: the relative difference of every step's logits, and the greedy
/// picks where the lone step's margin is at least `MARGIN`.
pub(super) fn batch_vs_lone_rows(
    gpu: &mut Engine<CudaModel>,
    short: &str,
    prompt: &[u32],
    batches: &[usize],
    compare: Compare,
    table: &mut Vec<Row>,
) -> Result<()> {
    for &batch in batches {
        let n_ctx = FIRST_PROMPT + COMPARED_STEPS + 1;
        let (mut kvs, mut next) = start_batch(gpu, prompt, batch, n_ctx)?;
        // tokens[i][s]: sequence i's input at step s; batched[i][s]: its logits there.
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); batch];
        let mut batched: Vec<Vec<Logits>> = vec![Vec::new(); batch];
        for _ in 0..COMPARED_STEPS {
            let logits = gpu.forward_each(&mut kvs, &next)?;
            for (i, l) in logits.into_iter().enumerate() {
                tokens[i].push(next[i]);
                next[i] = sampling::argmax(&l);
                batched[i].push(l);
            }
        }
        drop(kvs);
        let (mut worst, mut compared, mut agreed) = (0f64, 0usize, 0usize);
        let (mut rows, mut over, mut identical) = (0usize, 0usize, true);
        for i in 0..batch {
            let mut kv = gpu.try_new_sequence(n_ctx)?;
            gpu.prefill(&mut kv, &prompt[..prompt_len(i, prompt)], 512)?;
            for (s, &token) in tokens[i].iter().enumerate() {
                let alone = gpu.forward(&mut kv, &[token], LogitRows::Last)?;
                let b = &batched[i][s];
                let reference: Vec<f64> = alone.iter().map(|&v| v as f64).collect();
                let err = rel_err(b, &reference);
                worst = worst.max(err);
                rows += 1;
                over += usize::from(err >= BATCH_REL_BOUND);
                identical &=
                    b.len() == alone.len() && b.iter().zip(alone.iter()).all(|(x, y)| x.to_bits() == y.to_bits());
                if top2_margin(&alone) >= MARGIN {
                    compared += 1;
                    agreed += usize::from(sampling::argmax(&alone) == sampling::argmax(b));
                }
            }
        }
        let picks = format!("greedy picks equal {agreed} of {compared} (lone margin >= {MARGIN})");
        let (mode, result, pass) = match compare {
            Compare::Exact => (
                "deterministic, ",
                format!(
                    "{}; max rel logit diff {worst:.2e}; {picks}",
                    if identical { "bit-identical" } else { "DIFFERENT" }
                ),
                identical,
            ),
            Compare::Rounding { mixture } => {
                let allowed = if mixture {
                    (rows as f64 * MIXTURE_ROWS_OVER) as usize
                } else {
                    0
                };
                (
                    "",
                    format!(
                        "max rel logit diff {worst:.2e} (bound {BATCH_REL_BOUND:.0e}; {over} of {rows} rows over it, {allowed} allowed{}); {picks}",
                        if mixture { ": routing near ties" } else { "" }
                    ),
                    over <= allowed && agreed == compared,
                )
            }
        };
        table.push(Row {
            check: format!(
                "{short}: {batch} sequences decoded together vs each alone ({mode}{COMPARED_STEPS} steps, the batch's tokens)"
            ),
            result,
            pass,
        });
    }
    Ok(())
}
