//! A mixture with experts in host memory (`--gpu-expert-budget`) against the same model with every
//! expert resident, in deterministic mode: teacher-forced `logits_sha256` must be the same bits at
//! budgets that keep none or some experts on the device, with a long chunk streamed in `routed` and
//! `all` mode at depths 1, 16 and 256 or staged (`off`), and with every position a one-row step
//! through the slot cache.

use std::time::Instant;

use anyhow::Result;
use tandem_cuda::{ExpertBudget, ExpertOffload};
use tandem_engine::score::ScoreOptions;
use tandem_engine::Engine;
use tandem_model::expert_stream::{ExpertStreamMode, StreamDepth, STREAM_MIN_ROWS};
use tandem_model::Model;

use super::{prompt_ids, GpuCheckArgs, Row};

/// One placement to hash: its budget, stream mode and depth, and the chunk it scores in.
struct Placement {
    budget: ExpertBudget,
    stream: ExpertStreamMode,
    depth: usize,
    chunk: usize,
}

pub(super) fn offload_rows(
    args: &GpuCheckArgs,
    path: &std::path::Path,
    threads: usize,
    short: &str,
    table: &mut Vec<Row>,
) -> Result<()> {
    // Long enough for one chunk to stream.
    let len = STREAM_MIN_ROWS + 100;
    let long = len;
    let mut reference = None;
    let placements = [
        (ExpertBudget::All, ExpertStreamMode::Routed, 16, long),
        (ExpertBudget::Bytes(0), ExpertStreamMode::Routed, 16, long),
        (ExpertBudget::Bytes(0), ExpertStreamMode::All, 1, long),
        (ExpertBudget::Bytes(0), ExpertStreamMode::Routed, 256, long),
        (ExpertBudget::Bytes(0), ExpertStreamMode::Off, 16, long),
        (ExpertBudget::Bytes(0), ExpertStreamMode::Routed, 16, 1),
        // About half the experts resident (a budget the model's size sets below).
        (ExpertBudget::Auto, ExpertStreamMode::Routed, 16, long),
    ]
    .map(|(budget, stream, depth, chunk)| Placement {
        budget,
        stream,
        depth,
        chunk,
    });
    for p in placements {
        let model = Model::load(path, threads)?;
        let budget = match p.budget {
            // Half of the experts' bytes: some of every layer resident, the rest streamed.
            ExpertBudget::Auto => ExpertBudget::Bytes(expert_bytes(&model) / 2),
            b => b,
        };
        let n_vocab = model.config.n_vocab;
        let offload = ExpertOffload {
            budget,
            stream: p.stream,
            depth: StreamDepth::new(p.depth)?,
            trace: false,
        };
        let cuda = tandem_runtime::load_cuda(model, args.gpu, true, offload, |_, _| {})?;
        let mut engine = Engine::new(cuda);
        let prompt = prompt_ids(len, n_vocab, 13);
        let mut kv = engine.try_new_sequence(prompt.len())?;
        let t0 = Instant::now();
        let hash = engine
            .score(&mut kv, &prompt, &ScoreOptions::chunked(p.chunk))?
            .logits_sha256;
        let secs = t0.elapsed().as_secs_f64();
        let counters = engine.model.expert_counters();
        let what = format!(
            "budget {budget:?}, stream {}, depth {}, chunks of {}",
            p.stream, p.depth, p.chunk
        );
        let Some(want) = &reference else {
            table.push(Row {
                check: format!("{short}: experts placed ({len}-token prompt, deterministic): reference"),
                result: format!("{what}: {}… {secs:.1}s", &hash[..12]),
                pass: true,
            });
            reference = Some(hash);
            continue;
        };
        let same = *want == hash;
        table.push(Row {
            check: format!("{short}: experts placed, {what}"),
            result: format!(
                "{} ({}… {secs:.1}s){}",
                if same {
                    "same logits_sha256 as all resident"
                } else {
                    "DIFFERENT"
                },
                &hash[..12],
                counters.map_or(String::new(), |c| format!(
                    "; cache {} hits, {} copies; stream {} copied, {} skipped; {:.1} MB from host",
                    c.cache_hits,
                    c.cache_copies,
                    c.stream_copies,
                    c.stream_skips,
                    c.bytes as f64 / 1e6
                ))
            ),
            pass: same,
        });
    }
    Ok(())
}

/// Bytes of every expert of every layer.
fn expert_bytes(model: &Model) -> u64 {
    model
        .weights
        .layers
        .iter()
        .map(|l| match &l.ffn {
            tandem_model::weights::FeedForward::Experts(e) => (e.expert_bytes() * e.gate.n_expert()) as u64,
            _ => 0,
        })
        .sum()
}
