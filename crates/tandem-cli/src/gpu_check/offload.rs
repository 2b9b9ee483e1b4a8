//! A mixture with experts in host memory (`--gpu-expert-budget`) against the same model with every
//! expert resident, in deterministic mode: teacher-forced `logits_sha256` must be the same bits at
//! budgets that keep none or some experts on the device, with a long chunk streamed in `routed` and
//! `all` mode at depths 1, 16 and 256 or staged (`off`), and with every position a one-row step
//! through the slot cache. Then the same in default mode with every host expert of a one-row step
//! computed on the CPU (`--expert-decode cpu`, other bits by construction): top-1 equal to the
//! resident model's wherever its margin is at least `MARGIN`, and mean NLL within 1%.

use std::time::Instant;

use anyhow::Result;
use tandem_cuda::{ExpertBudget, ExpertDecode, ExpertOffload};
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
            decode: ExpertDecode::Gpu,
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

/// Top-1 margin above which the CPU-computed experts must agree with the resident model (the parity
/// contract's).
const MARGIN: f32 = 0.4;

/// Teacher-forced one-row steps (each a decode step) with every expert resident, against budget 0
/// and every non-resident expert on the CPU, in default mode: top-1 where the reference margin is at
/// least `MARGIN`, and mean NLL within 1%.
pub(super) fn cpu_expert_rows(
    args: &GpuCheckArgs,
    path: &std::path::Path,
    threads: usize,
    short: &str,
    table: &mut Vec<Row>,
) -> Result<()> {
    let len = 96;
    let mut reports = Vec::new();
    for (budget, decode) in [
        (ExpertBudget::All, ExpertDecode::Gpu),
        (ExpertBudget::Bytes(0), ExpertDecode::Cpu),
    ] {
        let model = Model::load(path, threads)?;
        let prompt = prompt_ids(len, model.config.n_vocab, 17);
        let offload = ExpertOffload {
            budget,
            decode,
            ..ExpertOffload::default()
        };
        let cuda = tandem_runtime::load_cuda(model, args.gpu, false, offload, |_, _| {})?;
        let mut engine = Engine::new(cuda);
        let mut kv = engine.try_new_sequence(prompt.len())?;
        let options = ScoreOptions {
            top_k: 2,
            positions: (0..len - 1).collect(),
            ..ScoreOptions::chunked(1)
        };
        let report = engine.score(&mut kv, &prompt, &options)?;
        let on_cpu = engine.model.expert_counters().map_or(0, |c| c.cpu_experts);
        reports.push((report, on_cpu));
    }
    let [(want, _), (got, on_cpu)] = <[_; 2]>::try_from(reports).map_err(|_| anyhow::anyhow!("two runs"))?;
    let (mut checked, mut wrong) = (0, 0);
    for ((_, w), (_, g)) in want.top.iter().zip(&got.top) {
        let (Some(w0), Some(w1), Some(g0)) = (w.first(), w.get(1), g.first()) else {
            continue;
        };
        if w0.1 - w1.1 >= MARGIN {
            checked += 1;
            wrong += usize::from(w0.0 != g0.0);
        }
    }
    let nll = (got.mean_nll - want.mean_nll).abs() / want.mean_nll.max(1e-9);
    let pass = wrong == 0 && nll <= 0.01 && on_cpu > 0;
    table.push(Row {
        check: format!("{short}: budget 0, experts of one-row steps on the CPU (default mode) vs all resident"),
        result: format!(
            "{on_cpu} experts on the CPU; top-1 {}/{checked} at margin >= {MARGIN}; mean NLL {:.4} vs {:.4} ({:.2}%)",
            checked - wrong,
            got.mean_nll,
            want.mean_nll,
            nll * 100.0
        ),
        pass,
    });
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
