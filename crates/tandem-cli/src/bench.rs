//! `tandem bench`: prompt processing (pp) and text generation (tg) throughput, measured the way
//! llama-bench measures them: pp feeds N random tokens to an empty context in chunks of `--ubatch` rows
//! (llama-bench's default micro-batch, 512); tg decodes N tokens one at a time after an empty context.
//! With `--depth D` (llama-bench's `-d`) each test starts after D tokens already in the context, prefilled
//! untimed, and is named as llama-bench names it ("tg128 @ d4096"). `-p`, `-n` and `-d` take
//! comma-separated lists, as llama-bench's do. `--parallel N` decodes N sequences together, one forward
//! pass a step for all of them, as the server batches its decoders (llama-batched-bench's `-npl`);
//! its test is named "tg128 x8" and counts every sequence's tokens. Each test runs once to warm up,
//! then `-r` times.
//!
//! `--prompt-file F` replaces the tg test's random tokens with text: the file's tokens are prefilled
//! untimed and N tokens are generated greedily after them ("tg128 @ F"), as `tandem run` would; with
//! `--spec` they are drafted and verified, and the row also reports the acceptance rate and tokens per
//! decode step.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use tandem_engine::spec::SpecStats;
use tandem_engine::{Engine, GenerateOptions, SamplingParams};
use tandem_model::LogitRows;
use tandem_runtime::{on_engine, AnyEngine, EngineBackend};

use crate::generate::{load, load_draft, ModelArgs};
use crate::spec::{SpecArgs, Speculator};

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

#[derive(Args, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the pp test (0 skips it; a list runs one test each).
    #[arg(short = 'p', long, value_delimiter = ',', default_value = "512")]
    pub n_prompt: Vec<usize>,
    /// Generated tokens for the tg test (0 skips it; a list runs one test each).
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "128")]
    pub n_gen: Vec<usize>,
    /// Rows per forward pass of the pp test (llama-bench's `-ub`, whose default is also 512).
    #[arg(long = "ubatch", short = 'u', default_value_t = 512)]
    pub ubatch: usize,
    /// Tokens already in the context when each test starts, prefilled untimed (llama-bench's `-d`; a
    /// list runs every test at each).
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<usize>,
    /// Sequences decoded together in the tg test, each with its own context (a list runs one test
    /// each).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub parallel: Vec<usize>,
    /// Repetitions.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Generate after this text in the tg test (prefilled untimed) instead of forcing random tokens.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    #[command(flatten)]
    pub spec: SpecArgs,
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
    let spec = args.spec.settings()?;
    let text = match &args.prompt_file {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None if spec.mode != tandem_engine::spec::SpecMode::Off => {
            bail!("--spec needs --prompt-file: drafts are checked against generated text, not forced tokens")
        }
        None => None,
    };
    if text.is_some() && args.parallel.iter().any(|&p| p > 1) {
        bail!("--prompt-file generates one sequence: drop --parallel");
    }
    let mut loaded = load(&args.model)?;
    let bos = loaded.tokenizer.bos().filter(|_| loaded.tokenizer.adds_bos());
    let context = match &text {
        Some(t) => Some(loaded.tokenizer.try_encode(t, true, false)?),
        None => None,
    };
    let mut draft = load_draft(&args.spec, &args.model)?;
    let results = on_engine!(&mut loaded.engine, |e| bench_on(
        e,
        bos,
        args,
        context.as_deref(),
        draft.take()
    ))?;
    let where_ = match &loaded.engine {
        AnyEngine::Cpu(e) => format!("{} threads", e.model.pool.n_threads()),
        AnyEngine::Cuda(e) => format!(
            "{}{}",
            e.model.gpu.name,
            if e.model.routes.deterministic {
                ", deterministic"
            } else {
                ""
            }
        ),
    };
    match args.output_format {
        BenchFormat::Json => {
            let rows: Vec<_> = results
                .iter()
                .map(|r| {
                    let mut row = json!({"test": r.test, "tok_s": r.mean, "stddev": r.stddev});
                    if let Some(s) = &r.spec {
                        row["acceptance"] = json!(s.acceptance());
                        row["tokens_per_step"] = json!(s.tokens_per_step());
                        row["drafted"] = json!(s.drafted);
                        row["accepted"] = json!(s.accepted);
                    }
                    row
                })
                .collect();
            println!("{}", serde_json::to_string(&rows)?);
        }
        BenchFormat::Md => {
            let drafts = results.iter().any(|r| r.spec.is_some());
            let extra = if drafts { " acceptance | tokens/step |" } else { "" };
            println!("| model | device | test | t/s |{extra}");
            println!(
                "| --- | --- | ---: | ---: |{}",
                if drafts { " ---: | ---: |" } else { "" }
            );
            for r in &results {
                let extra = match &r.spec {
                    Some(s) => format!(" {:.1}% | {:.2} |", 100.0 * s.acceptance(), s.tokens_per_step()),
                    None if drafts => " | |".to_string(),
                    None => String::new(),
                };
                println!(
                    "| {} | {where_} | {} | {:.2} ± {:.2} |{extra}",
                    args.model.model, r.test, r.mean, r.stddev
                );
            }
        }
    }
    Ok(())
}

/// One test's result: tokens per second over the repetitions, and with drafts what drafting did (summed
/// over the repetitions).
struct BenchRow {
    test: String,
    mean: f64,
    stddev: f64,
    spec: Option<SpecStats>,
}

type BenchRows = Vec<BenchRow>;

fn row(test: String, speeds: &[f64], spec: Option<SpecStats>) -> BenchRow {
    let (mean, stddev) = mean_std(speeds);
    BenchRow {
        test,
        mean,
        stddev,
        spec,
    }
}

/// The pp and tg tests on any backend, at every depth. Device work is asynchronous, but every forward
/// pass returns logits to the host (a synchronization), so wall-clock time covers the work.
fn bench_on<B: EngineBackend>(
    engine: &mut Engine<B>,
    bos: Option<u32>,
    args: &BenchArgs,
    context: Option<&[u32]>,
    draft: Option<AnyEngine>,
) -> Result<BenchRows> {
    let mut results = Vec::new();
    let Some(context) = context else {
        for &depth in &args.depth {
            bench_at_depth(engine, bos, args, depth, &mut results)?;
        }
        return Ok(results);
    };
    let n_pp: Vec<usize> = args.n_prompt.iter().copied().filter(|&n| n > 0).collect();
    if !n_pp.is_empty() {
        let pp_only = BenchArgs {
            n_gen: vec![],
            ..args.clone()
        };
        bench_at_depth(engine, bos, &pp_only, 0, &mut results)?;
    }
    let longest = args.n_gen.iter().copied().max().unwrap_or(0);
    let n_ctx = context.len() + longest + 1;
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let mut spec = Speculator::new(&args.spec, engine, draft, n_ctx, args.ubatch, &greedy)?;
    let name = args
        .prompt_file
        .as_ref()
        .and_then(|p| p.file_name())
        .map_or("text".into(), |n| n.to_string_lossy().into_owned());
    for &n_gen in args.n_gen.iter().filter(|&&n| n > 0) {
        let opts = GenerateOptions {
            max_tokens: n_gen + 1,
            prefill_chunk: args.ubatch.max(1),
            sampling: greedy.clone(),
            stop_ids: vec![],
        };
        let mut speeds = Vec::new();
        let mut stats = SpecStats::default();
        for rep in 0..=args.repetitions.max(1) {
            spec.reset();
            let mut kv = engine.try_new_sequence(n_ctx)?;
            let (_, timings) = spec.generate(engine, &mut kv, context, &opts, |_| true)?;
            if rep > 0 {
                speeds.push(timings.decode_tok_s());
                stats.add(&spec.stats);
            }
        }
        let mut test = format!("tg{n_gen} @ {name}");
        if spec.enabled() {
            test += &format!(" spec {:?}", args.spec.mode).to_lowercase();
        }
        results.push(row(test, &speeds, spec.enabled().then_some(stats)));
    }
    Ok(results)
}

fn bench_at_depth<B: EngineBackend>(
    engine: &mut Engine<B>,
    bos: Option<u32>,
    args: &BenchArgs,
    depth: usize,
    results: &mut BenchRows,
) -> Result<()> {
    let n_vocab = engine.model.config().n_vocab;
    let longest = args.n_prompt.iter().chain(&args.n_gen).copied().max().unwrap_or(0);
    let n_ctx = (depth + longest + 1).max(16);
    let reps = args.repetitions.max(1);
    // The context before a test: the same random tokens (BOS first) every repetition.
    let depth_tokens = tokens(depth, n_vocab, bos);
    let new_sequence = |engine: &mut Engine<B>| -> Result<_> {
        let mut kv = engine.try_new_sequence(n_ctx)?;
        if depth > 0 {
            engine.prefill(&mut kv, &depth_tokens, args.ubatch.clamp(1, depth))?;
        }
        Ok(kv)
    };
    // The test's own tokens follow the context, so only an empty context starts with BOS.
    let test_bos = bos.filter(|_| depth == 0);

    for &n_prompt in args.n_prompt.iter().filter(|&&n| n > 0) {
        let prompt = tokens(n_prompt, n_vocab, test_bos);
        let mut speeds = Vec::new();
        for rep in 0..=reps {
            let mut kv = new_sequence(engine)?;
            let start = Instant::now();
            engine.prefill(&mut kv, &prompt, args.ubatch.clamp(1, n_prompt))?;
            if rep > 0 {
                speeds.push(n_prompt as f64 / start.elapsed().as_secs_f64());
            }
        }
        results.push(row(test_name("pp", n_prompt, depth, 1), &speeds, None));
    }
    for &n_gen in args.n_gen.iter().filter(|&&n| n > 0) {
        let gen = tokens(n_gen, n_vocab, test_bos);
        for &parallel in &args.parallel {
            let parallel = parallel.max(1);
            let mut speeds = Vec::new();
            for rep in 0..=reps {
                let mut kvs = (0..parallel)
                    .map(|_| new_sequence(engine))
                    .collect::<Result<Vec<_>>>()?;
                let start = Instant::now();
                for &t in &gen {
                    if parallel == 1 {
                        engine.forward(&mut kvs[0], &[t], LogitRows::Last)?;
                    } else {
                        engine.forward_each(&mut kvs, &vec![t; parallel])?;
                    }
                }
                if rep > 0 {
                    speeds.push((n_gen * parallel) as f64 / start.elapsed().as_secs_f64());
                }
            }
            results.push(row(test_name("tg", n_gen, depth, parallel), &speeds, None));
        }
    }
    Ok(())
}

/// llama-bench's test names: "pp512", "tg128", and "tg128 @ d4096" after a context of 4096 tokens;
/// "tg128 x8" for eight sequences decoded together.
fn test_name(kind: &str, n: usize, depth: usize, parallel: usize) -> String {
    let mut name = format!("{kind}{n}");
    if depth > 0 {
        name += &format!(" @ d{depth}");
    }
    if parallel > 1 {
        name += &format!(" x{parallel}");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_are_named_as_llama_bench_names_them() {
        assert_eq!(test_name("pp", 512, 0, 1), "pp512");
        assert_eq!(test_name("tg", 128, 4096, 1), "tg128 @ d4096");
        assert_eq!(test_name("tg", 128, 0, 16), "tg128 x16");
        assert_eq!(test_name("tg", 64, 512, 4), "tg64 @ d512 x4");
    }

    #[test]
    fn only_the_first_token_is_bos() {
        let t = tokens(5, 100, Some(1));
        assert_eq!(t[0], 1);
        assert!(t[1..].iter().all(|&x| x < 100));
        assert_eq!(tokens(5, 100, None)[1..], t[1..]);
    }
}
