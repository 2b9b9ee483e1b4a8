//! `tandem gpu-check`: the CUDA backend against the CPU backend on a model, as a user would check an
//! install. For each model:
//! 1. A prompt prefilled and then greedy decoding on both backends; tokens must agree up to the first
//!    step whose CPU top-2 margin is below 0.1; the largest relative logit error is reported.
//! 2. Decode steps replayed from captured CUDA graphs must give the bits of direct launches, alone
//!    and batched (`batch_graphs.rs`; skipped for a model that decodes without graphs, a mixture of
//!    experts), and batched decode must agree with each sequence alone.
//! 3. Deterministic mode (the model loaded again as `--deterministic` loads it): `logits_sha256` of
//!    teacher-forced scoring must match across chunk sizes, and batched decode must give each
//!    sequence's logits alone to the bit.
//! 4. A mixture with experts beyond `--gpu-expert-budget` (`offload.rs`): deterministic hashes at
//!    budgets, stream modes and depths must equal the all-resident model's.
//!
//! Each kernel against f64 references is a test of `tandem-cuda` (`cargo test -p tandem-cuda --test
//! kernels` on a GPU machine); kernel timings and GPU probes are `tandem-dev bench`.

mod batch_graphs;
mod offload;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_cuda::ExpertOffload;
use tandem_engine::score::ScoreOptions;
use tandem_engine::{sampling, Engine};
use tandem_model::{LogitRows, Model};

use crate::registry;

#[derive(Args)]
pub struct GpuCheckArgs {
    /// GGUF files or model aliases to compare end to end (pulled on first use).
    #[arg(long = "model", short = 'm', default_value = registry::DEFAULT_MODEL)]
    pub models: Vec<String>,
    /// Prompt length for the model comparison.
    #[arg(long, default_value_t = 1500)]
    pub prompt: usize,
    /// Rows per prefill chunk of the greedy comparison (both backends).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Greedy steps after the prompt.
    #[arg(long, default_value_t = 64)]
    pub gen: usize,
    /// Chunk sizes whose deterministic-mode logits must hash the same.
    #[arg(long, value_delimiter = ',', default_value = "1,64,512")]
    pub chunks: Vec<usize>,
    /// Prompt length for the deterministic hashes (chunk size 1 decodes every position).
    #[arg(long, default_value_t = 1500)]
    pub hash_prompt: usize,
    /// CPU threads for the oracle.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
}

/// A small xorshift generator for the prompts' token ids.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    let mut num = 0f64;
    let mut den = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        num += (o as f64 - r).powi(2);
        den += r * r;
    }
    (num / den.max(1e-300)).sqrt()
}

/// One line of the report.
struct Row {
    check: String,
    result: String,
    pass: bool,
}

pub fn gpu_check(args: &GpuCheckArgs) -> Result<()> {
    let mut table: Vec<Row> = Vec::new();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    for m in &args.models {
        // A check that cannot run (no GPU, a model that does not load) is a failed row: the rows
        // before it still print.
        if let Err(e) = model_checks(args, m, threads, &mut table) {
            table.push(Row {
                check: format!("{m}: checks stopped"),
                result: format!("{e:#}"),
                pass: false,
            });
        }
    }
    println!("\n| check | result | pass |");
    println!("|---|---|---|");
    for r in &table {
        println!("| {} | {} | {} |", r.check, r.result, if r.pass { "yes" } else { "NO" });
    }
    if table.iter().any(|r| !r.pass) {
        bail!(
            "{} of {} GPU checks failed",
            table.iter().filter(|r| !r.pass).count(),
            table.len()
        );
    }
    Ok(())
}

/// Deterministic pseudo-random token ids (BOS first when the vocabulary has one).
fn prompt_ids(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed | 1);
    (0..n).map(|_| (rng.next() % n_vocab as u64) as u32).collect()
}

fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > a {
            b = a;
            a = l;
        } else if l > b {
            b = l;
        }
    }
    a - b
}

fn model_checks(args: &GpuCheckArgs, name: &str, threads: usize, table: &mut Vec<Row>) -> Result<()> {
    let path = registry::resolve(name)?;
    let short = path
        .file_name()
        .map_or(name.to_string(), |f| f.to_string_lossy().into_owned());
    let cpu_model = Model::load(&path, threads).with_context(|| format!("loading {}", path.display()))?;
    let n_vocab = cpu_model.config.n_vocab;
    let mut cpu = Engine::new(cpu_model);
    let gpu_model = tandem_runtime::load_cuda(
        Model::load(&path, threads)?,
        args.gpu,
        false,
        ExpertOffload::default(),
        |_, _| {},
    )?;
    let mut gpu = Engine::new(gpu_model);
    let n_ctx = args.prompt + args.gen + 1;
    let prompt = prompt_ids(args.prompt, n_vocab, 7);

    // Greedy: prefill then decode on each backend independently.
    let mut kv_c = cpu.new_sequence(n_ctx);
    let mut kv_g = gpu.try_new_sequence(n_ctx)?;
    let t0 = Instant::now();
    let mut lc = cpu.prefill(&mut kv_c, &prompt, args.prefill_chunk)?;
    let cpu_prefill = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut lg = gpu.prefill(&mut kv_g, &prompt, args.prefill_chunk)?;
    let gpu_prefill = t0.elapsed().as_secs_f64();
    let mut max_rel = 0f64;
    let mut agreed = 0;
    let mut stopped_at = None;
    let mut diverged = None;
    for step in 0..args.gen {
        let reference: Vec<f64> = lc.iter().map(|&v| v as f64).collect();
        max_rel = max_rel.max(rel_err(&lg, &reference));
        let (tc, tg) = (sampling::argmax(&lc), sampling::argmax(&lg));
        let margin = top2_margin(&lc);
        if margin < 0.1 {
            stopped_at = Some((step, margin));
            break;
        }
        if tc != tg {
            diverged = Some((step, margin));
            break;
        }
        agreed += 1;
        lc = cpu.forward(&mut kv_c, &[tc], LogitRows::Last)?;
        lg = gpu.forward(&mut kv_g, &[tg], LogitRows::Last)?;
    }
    let how = match (diverged, stopped_at) {
        (Some((s, m)), _) => format!("DIVERGED at step {s} (CPU margin {m:.3})"),
        (None, Some((s, m))) => format!("stopped at step {s}: CPU margin {m:.3} < 0.1"),
        _ => "all steps".into(),
    };
    table.push(Row {
        check: format!(
            "{short}: greedy CPU vs GPU, {}-token prompt in chunks of {}",
            args.prompt, args.prefill_chunk
        ),
        result: format!(
            "{agreed} of {} steps equal ({how}); max rel logit err {max_rel:.2e}; prefill CPU {cpu_prefill:.1}s, GPU {gpu_prefill:.2}s",
            args.gen
        ),
        pass: diverged.is_none(),
    });

    // Decode steps replayed from a captured CUDA graph give the bits of direct launches (none to
    // compare where the model never decodes through graphs: a passing row that says why).
    if let Some(why) = gpu.model.graphs.blocked {
        table.push(Row {
            check: format!("{short}: decode steps and batches, CUDA graph replays vs direct launches"),
            result: format!("skipped: no decode graphs for this model ({why})"),
            pass: true,
        });
    } else {
        graph_rows(&mut gpu, &short, &prompt, args.gen, n_ctx, table)?;
    }
    // Batched decode against the same sequences alone: the batch routes' rounding, at sizes the
    // small-batch kernels (4 rows) and cuBLAS (12, 16, 24) take.
    let mixture = gpu.model.cpu.config.moe.is_some();
    let compare = batch_graphs::Compare::Rounding { mixture };
    batch_graphs::batch_vs_lone_rows(&mut gpu, &short, &prompt, &[4, 12, 16, 24], compare, table)?;
    deterministic_rows(args, &path, threads, gpu, &short, &prompt, table)?;
    if mixture {
        offload::offload_rows(args, &path, threads, &short, table)?;
        offload::cpu_expert_rows(args, &path, threads, &short, table)?;
    }
    Ok(())
}

/// Decode steps, alone and batched, replayed from captured graphs against direct launches.
fn graph_rows(
    gpu: &mut Engine<tandem_cuda::CudaModel>,
    short: &str,
    prompt: &[u32],
    gen: usize,
    n_ctx: usize,
    table: &mut Vec<Row>,
) -> Result<()> {
    let steps = 24.min(gen);
    let ahead_before = gpu.model.graphs.ahead_taken.get();
    let mut runs = Vec::new();
    for graphs in [false, true] {
        gpu.model.graphs.enabled.set(graphs);
        let mut kv = gpu.try_new_sequence(n_ctx)?;
        let mut logits = gpu.prefill(&mut kv, &prompt[..prompt.len().min(600)], 512)?;
        let mut rows = Vec::new();
        let t0 = Instant::now();
        for _ in 0..steps {
            let next = sampling::argmax(&logits);
            logits = gpu.forward(&mut kv, &[next], LogitRows::Last)?;
            rows.push(logits.clone());
        }
        runs.push((rows, t0.elapsed().as_secs_f64() / steps as f64));
    }
    let graphs_used = gpu.model.graphs.enabled.get();
    // From the fourth replayed step on (capture, one replay, then one made ahead), unless turned off.
    let ahead = gpu.model.graphs.ahead_taken.get() - ahead_before;
    let ahead_ok = !graphs_used || !gpu.model.graphs.ahead_enabled || steps < 4 || ahead > 0;
    let same = runs[0]
        .0
        .iter()
        .zip(&runs[1].0)
        .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    table.push(Row {
        check: format!("{short}: {steps} decode steps, CUDA graph replay vs direct launches"),
        result: format!(
            "{}; {:.2} ms/step direct, {:.2} ms/step with graphs ({ahead} steps with parameters made ahead){}",
            if same { "bit-identical" } else { "DIFFERENT" },
            runs[0].1 * 1e3,
            runs[1].1 * 1e3,
            if graphs_used {
                ""
            } else {
                " (capture failed: graphs off)"
            }
        ),
        pass: same && graphs_used && ahead_ok,
    });

    // Batched decode steps: on the tensor cores over the quantized weights (3 and 8 rows) and through
    // cuBLAS (20 rows), each replayed from graphs.
    batch_graphs::batch_graph_rows(gpu, short, prompt, &[3, 8, 20], table)
}

/// Teacher-forced scoring's `logits_sha256` across chunk sizes, in default mode (reported) and in
/// deterministic mode (must match).
fn deterministic_rows(
    args: &GpuCheckArgs,
    path: &std::path::Path,
    threads: usize,
    mut gpu: Engine<tandem_cuda::CudaModel>,
    short: &str,
    prompt: &[u32],
    table: &mut Vec<Row>,
) -> Result<()> {
    let n_vocab = gpu.model.cpu.config.n_vocab;
    // Default mode first: its hashes differ across chunkings (the GEMM and flash routes).
    let hash_prompt = prompt_ids(args.hash_prompt, n_vocab, 11);
    let fast: Vec<String> = args
        .chunks
        .iter()
        .map(|&chunk| -> Result<String> {
            let mut kv = gpu.try_new_sequence(hash_prompt.len())?;
            Ok(gpu
                .score(&mut kv, &hash_prompt, &ScoreOptions::chunked(chunk))?
                .logits_sha256)
        })
        .collect::<Result<_>>()?;
    // Deterministic mode as `--deterministic` loads it: the kernels fixed by weight type and summation
    // order, so the hash does not depend on this run's timings. (Setting the flag on the default load
    // would keep whatever its timing picked, split-K variants included: still chunk-invariant, but a
    // hash that moves between runs.)
    drop(gpu);
    let det_model = tandem_runtime::load_cuda(
        Model::load(path, threads)?,
        args.gpu,
        true,
        ExpertOffload::default(),
        |_, _| {},
    )?;
    let mut det = Engine::new(det_model);
    let mut hashes = Vec::new();
    for &chunk in &args.chunks {
        let mut kv = det.try_new_sequence(hash_prompt.len())?;
        let t0 = Instant::now();
        let r = det.score(&mut kv, &hash_prompt, &ScoreOptions::chunked(chunk))?;
        hashes.push((chunk, r.logits_sha256, t0.elapsed().as_secs_f64()));
    }
    let same = hashes.iter().all(|h| h.1 == hashes[0].1);
    let fast_same = fast.iter().all(|h| *h == fast[0]);
    table.push(Row {
        check: format!("{short}: deterministic logits_sha256, chunks {:?}", args.chunks),
        result: format!(
            "{} ({}); default mode {}",
            if same { "identical" } else { "DIFFERENT" },
            hashes
                .iter()
                .map(|(c, h, s)| format!("{c}: {}… {s:.1}s", &h[..12]))
                .collect::<Vec<_>>()
                .join(", "),
            if fast_same {
                "identical too"
            } else {
                "differs across chunkings, as expected of the GEMM and flash routes"
            }
        ),
        pass: same,
    });
    // And batched decode gives each sequence's logits alone, to the bit (with a mixture: the same
    // routing, whatever the batch).
    batch_graphs::batch_vs_lone_rows(&mut det, short, prompt, &[4, 16], batch_graphs::Compare::Exact, table)
}
