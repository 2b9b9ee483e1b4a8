//! `tandem bench`: prompt processing (pp) and text generation (tg) throughput, measured the way
//! llama-bench measures them: pp feeds N random tokens to an empty context in chunks of `--ubatch` rows
//! (llama-bench's default micro-batch, 512); tg decodes N tokens one at a time after an empty context.
//! With `--depth D` (llama-bench's `-d`) each test starts after D tokens already in the context, prefilled
//! untimed, and is named as llama-bench names it ("tg128 @ d4096"). Each test runs once to warm up, then
//! `-r` times.

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
    /// Tokens already in the context when each test starts, prefilled untimed (llama-bench's `-d`).
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
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
    let n_ctx = (args.depth + args.n_prompt.max(args.n_gen) + 1).max(16);
    let reps = args.repetitions.max(1);
    // The context before a test: the same random tokens (BOS first) every repetition.
    let depth_tokens = tokens(args.depth, n_vocab, bos);
    let new_sequence = |engine: &mut Engine<B>| -> Result<_> {
        let mut kv = engine.try_new_sequence(n_ctx)?;
        if args.depth > 0 {
            engine.prefill(&mut kv, &depth_tokens, args.ubatch.clamp(1, args.depth))?;
        }
        Ok(kv)
    };
    // The test's own tokens follow the context, so only an empty context starts with BOS.
    let test_bos = bos.filter(|_| args.depth == 0);
    let mut results = Vec::new();

    if args.n_prompt > 0 {
        let prompt = tokens(args.n_prompt, n_vocab, test_bos);
        let mut speeds = Vec::new();
        for rep in 0..=reps {
            let mut kv = new_sequence(engine)?;
            let start = Instant::now();
            engine.prefill(&mut kv, &prompt, args.ubatch.clamp(1, args.n_prompt))?;
            if rep > 0 {
                speeds.push(args.n_prompt as f64 / start.elapsed().as_secs_f64());
            }
        }
        results.push((test_name("pp", args.n_prompt, args.depth), mean_std(&speeds)));
    }
    if args.n_gen > 0 {
        let gen = tokens(args.n_gen, n_vocab, test_bos);
        let mut speeds = Vec::new();
        for rep in 0..=reps {
            let mut kv = new_sequence(engine)?;
            let start = Instant::now();
            for &t in &gen {
                engine.forward(&mut kv, &[t], LogitRows::Last)?;
            }
            if rep > 0 {
                speeds.push(args.n_gen as f64 / start.elapsed().as_secs_f64());
            }
        }
        results.push((test_name("tg", args.n_gen, args.depth), mean_std(&speeds)));
    }
    Ok(results)
}

/// llama-bench's test names: "pp512", "tg128", and "tg128 @ d4096" after a context of 4096 tokens.
fn test_name(kind: &str, n: usize, depth: usize) -> String {
    match depth {
        0 => format!("{kind}{n}"),
        d => format!("{kind}{n} @ d{d}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_are_named_as_llama_bench_names_them() {
        assert_eq!(test_name("pp", 512, 0), "pp512");
        assert_eq!(test_name("tg", 128, 4096), "tg128 @ d4096");
    }

    #[test]
    fn only_the_first_token_is_bos() {
        let t = tokens(5, 100, Some(1));
        assert_eq!(t[0], 1);
        assert!(t[1..].iter().all(|&x| x < 100));
        assert_eq!(tokens(5, 100, None)[1..], t[1..]);
    }
}
