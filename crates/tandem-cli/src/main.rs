//! `tandem`: thin subcommands over the crates.

mod bench;
mod bench_serve;
mod generate;
mod gpu_check;
mod inspect;
mod registry;
mod score;
mod serve;
mod soak;
mod spec;
mod synth;
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tandem_gguf::GgufFile;

#[derive(Parser)]
#[command(name = "tandem", version, about = "Tandem: an LLM inference engine for GGUF models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch a known model into $TANDEM_HOME/models (default ~/.cache/tandem); instant once cached.
    Pull {
        /// gemma3-270m or smollm2-135m; `all` fetches every known model.
        #[arg(default_value = registry::DEFAULT_MODEL)]
        alias: String,
    },
    /// Print a model file's metadata, tensor table and totals per type.
    Inspect {
        /// A GGUF path or a known model alias (pulled on first use).
        #[arg(default_value = registry::DEFAULT_MODEL)]
        model: String,
        /// List every tensor rather than the first 40.
        #[arg(long)]
        all_tensors: bool,
    },
    /// Generate text from a prompt, streaming it; prints TTFT and prefill/decode speed to stderr.
    Run(generate::RunArgs),
    /// An interactive conversation with the model's chat template.
    Chat(generate::ChatArgs),
    /// Teacher-forced scoring: mean NLL, perplexity, top logits, sha256 of all logits.
    Score(score::ScoreArgs),
    /// Serve the model over HTTP (OpenAI- and llama.cpp-compatible API).
    Serve(serve::ServeArgs),
    /// Prompt-processing and generation throughput, as llama-bench measures them.
    Bench(bench::BenchCommand),
    /// Check the CUDA backend against the CPU backend on a model: greedy tokens, CUDA-graph replay,
    /// deterministic hashes.
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Print the token ids that generation would see for a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Turn token ids back into text.
    Detokenize(tokenize::DetokenizeArgs),
    /// Write a model with random weights of a real architecture's shapes.
    Synth {
        /// llama, gemma3, qwen3 or qwen3moe.
        #[arg(long)]
        arch: String,
        /// tiny, smollm2-135m, llama3-8b (llama); tiny, gemma3-270m, gemma3-27b (gemma3); tiny,
        /// qwen3-0.6b (qwen3); qwen3-moe-tiny, qwen3-30b-a3b and its 16- and 4-layer slices
        /// qwen3-30b-a3b-16l, qwen3-30b-a3b-4l (qwen3moe).
        #[arg(long)]
        shape: String,
        /// A quantization mix: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k…q6_k, q4_k_m, q5_k_m.
        #[arg(long, default_value = "q4_k_m")]
        quant: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write `tokenizer.ggml.model = none` instead of a byte-level vocabulary.
        #[arg(long)]
        no_vocab: bool,
        /// Uneven expert popularity for a mixture's routers (0: uniform; about 1: realistic).
        #[arg(long, default_value_t = 0.0)]
        route_skew: f32,
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tandem: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn open_model(model: &str) -> Result<GgufFile> {
    let path = registry::resolve(model)?;
    Ok(GgufFile::open(&path)?)
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Pull { alias } => {
            let specs: Vec<_> = if alias == "all" {
                registry::MODELS.iter().collect()
            } else {
                vec![registry::find(&alias).with_context(|| {
                    format!(
                        "unknown model {alias:?}; known: {}, all",
                        registry::MODELS.iter().map(|m| m.alias).collect::<Vec<_>>().join(", ")
                    )
                })?]
            };
            for spec in specs {
                let path = registry::pull(spec)?;
                println!("{}", path.display());
            }
        }
        Command::Inspect { model, all_tensors } => {
            let file = open_model(&model)?;
            print!("{}", inspect::render(&file, all_tensors));
        }
        Command::Run(args) => generate::run(&args)?,
        Command::GpuCheck(args) => gpu_check::gpu_check(&args)?,
        Command::Chat(args) => generate::chat(&args)?,
        Command::Score(args) => score::score(&args)?,
        Command::Bench(cmd) => match &cmd.sub {
            Some(bench::BenchSub::Serve(args)) => bench_serve::bench_serve(args)?,
            None => bench::bench(&cmd.args)?,
        },
        Command::Serve(args) => serve::serve(&args)?,
        Command::Tokenize(args) => tokenize::tokenize(&args)?,
        Command::Detokenize(args) => tokenize::detokenize(&args)?,
        Command::Synth {
            arch,
            shape,
            quant,
            seed,
            no_vocab,
            route_skew,
            output,
        } => {
            if !(0.0..=8.0).contains(&route_skew) {
                anyhow::bail!("--route-skew must be in [0, 8], got {route_skew}");
            }
            let arch = synth::shapes::Arch::parse(&arch)?;
            let shape = synth::shapes::find(arch, &shape)?;
            let mix = synth::mix::QuantMix::parse(&quant)?;
            let opts = synth::SynthOptions {
                shape,
                mix,
                seed,
                no_vocab,
                route_skew,
                progress: true,
            };
            synth::write(&opts, &output)?;
            eprintln!("tandem: wrote {}", output.display());
        }
    }
    Ok(())
}
