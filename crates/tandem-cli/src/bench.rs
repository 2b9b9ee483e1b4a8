//! `tandem bench`: prompt processing (pp) and text generation (tg) throughput, measured the way
//! llama-bench measures them: pp feeds N random tokens to an empty context in chunks of `--ubatch` rows
//! (llama-bench's default micro-batch, 512); tg decodes N tokens one at a time after an empty context.
//! Each test runs once to warm up, then `-r` times.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde_json::json;
use tandem_model::LogitRows;

use crate::generate::{load, on_engine, AnyEngine, ModelArgs};
use tandem_engine::Engine;
use tandem_model::Backend;

/// `tandem bench …` runs the model benchmark; `tandem bench serve …` drives a running server.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCommand {
    #[command(subcommand)]
    pub sub: Option<BenchSub>,
    #[command(flatten)]
    pub args: BenchArgs,
}

#[derive(clap::Subcommand)]
pub enum BenchSub {
    /// Drive a running `tandem serve` with a mixed load; report TTFT and inter-token p50/p99, tokens/s.
    Serve(crate::bench_serve::BenchServeArgs),
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the pp test (0 skips it).
    #[arg(short = 'p', long, default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens for the tg test (0 skips it).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_gen: usize,
    /// Rows per forward pass of the pp test (llama-bench's `-ub`, whose default is also 512).
    #[arg(long = "ubatch", short = 'u', default_value_t = 512)]
    pub ubatch: usize,
    /// Repetitions.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    #[arg(long, value_enum, default_value_t = BenchFormat::Md)]
    pub output_format: BenchFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchFormat {
    Md,
    Json,
}

/// Deterministic pseudo-random token ids (speed does not depend on which tokens).
fn tokens(n: usize, n_vocab: usize, bos: Option<u32>) -> Vec<u32> {
    let mut state = 0x853c_49e6_748f_ea9bu64;
    let mut out: Vec<u32> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % n_vocab as u64) as u32
        })
        .collect();
    if let (Some(b), Some(first)) = (bos, out.first_mut()) {
        *first = b;
    }
    out
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len().max(2) - 1) as f64;
    (mean, var.sqrt())
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    let mut loaded = load(&args.model)?;
    let bos = loaded.tokenizer.bos().filter(|_| loaded.tokenizer.adds_bos());
    let results = on_engine!(&mut loaded.engine, |e| bench_on(e, bos, args))?;
    let where_ = match &loaded.engine {
        AnyEngine::Cpu(e) => format!("{} threads", e.model.pool.n_threads()),
        AnyEngine::Cuda(e) => format!(
            "{}{}",
            e.model.gpu.name,
            if e.model.deterministic { ", deterministic" } else { "" }
        ),
    };
    match args.output_format {
        BenchFormat::Json => {
            let rows: Vec<_> = results
                .iter()
                .map(|(t, (m, s))| json!({"test": t, "tok_s": m, "stddev": s}))
                .collect();
            println!("{}", serde_json::to_string(&rows)?);
        }
        BenchFormat::Md => {
            println!("| model | device | test | t/s |");
            println!("| --- | --- | ---: | ---: |");
            for (t, (m, s)) in &results {
                println!("| {} | {where_} | {t} | {m:.2} ± {s:.2} |", args.model.model);
            }
        }
    }
    Ok(())
}

type BenchRows = Vec<(String, (f64, f64))>;

/// The pp and tg tests on any backend. Device work is asynchronous, but every forward pass returns
/// logits to the host (a synchronization), so wall-clock time covers the work.
fn bench_on<B: Backend>(engine: &mut Engine<B>, bos: Option<u32>, args: &BenchArgs) -> Result<BenchRows> {
    let n_vocab = engine.model.config().n_vocab;
    let n_ctx = (args.n_prompt.max(args.n_gen) + 1).max(16);
    let mut results = Vec::new();
    let reps = args.repetitions.max(1);

    if args.n_prompt > 0 {
        let prompt = tokens(args.n_prompt, n_vocab, bos);
        let mut speeds = Vec::new();
        for rep in 0..=reps {
            let mut kv = engine.try_new_sequence(n_ctx)?;
            let start = Instant::now();
            engine.prefill(&mut kv, &prompt, args.ubatch.clamp(1, args.n_prompt))?;
            if rep > 0 {
                speeds.push(args.n_prompt as f64 / start.elapsed().as_secs_f64());
            }
        }
        results.push((format!("pp{}", args.n_prompt), mean_std(&speeds)));
    }
    if args.n_gen > 0 {
        let gen = tokens(args.n_gen, n_vocab, bos);
        let mut speeds = Vec::new();
        for rep in 0..=reps {
            let mut kv = engine.try_new_sequence(n_ctx)?;
            let start = Instant::now();
            for &t in &gen {
                engine.forward(&mut kv, &[t], LogitRows::Last)?;
            }
            if rep > 0 {
                speeds.push(args.n_gen as f64 / start.elapsed().as_secs_f64());
            }
        }
        results.push((format!("tg{}", args.n_gen), mean_std(&speeds)));
    }
    Ok(results)
}
