//! `tandem-dev`: developer tools, not shipped to users. `tandem-dev bench` times the CUDA kernels on
//! the shapes of real models and probes the GPU itself (hand-overs between dependent steps, memory
//! round trips under load); what a kernel computes is checked by `tandem-cuda`'s kernel tests, and a
//! model end to end by `tandem gpu-check`.

mod common;
mod dqmma;
mod flash;
mod gemm;
mod int8;
mod matvec;
mod probes;
mod qmma;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use tandem_cuda::{CudaOptions, Gpu};

use common::Row;

#[derive(Parser)]
#[command(
    name = "tandem-dev",
    about = "Tandem's developer tools: kernel benchmarks and GPU probes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Time kernels and probe the GPU; prints a table of the timings.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// What to time (several may be given; each runs once, in the order listed here).
    #[arg(required = true, value_enum)]
    what: Vec<Bench>,
    /// The GPU to run on.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Bench {
    /// matvec, flash, gemm, qmma, dqmma and l2 (not the probes).
    Kernels,
    /// The decode matvecs per weight type (GB/s against the bytes they must read), float and integer.
    Matvec,
    /// The prefill attention variants.
    Flash,
    /// The prefill GEMM shapes through cuBLAS.
    Gemm,
    /// The decode batches' tensor-core kernels against the batched matvec and cuBLAS.
    Qmma,
    /// The decode batches past qmma's rows: the f16 tensor-core kernel over dequantized Q4_K weights
    /// against cuBLAS over the f16 copy.
    Dqmma,
    /// The 8B files' decode matvecs from a flushed L2 and from a hot L2: a kernel barely faster hot is
    /// bound by its instructions, not memory.
    L2,
    /// A hand-over between dependent steps: launches under programmatic edges, plain graph edges,
    /// and one resident grid crossing grid-wide barriers (what a persistent decode kernel would pay).
    Handover,
    /// A dependent memory round trip alone and while the rest of the GPU streams weights (what an
    /// overlapping decode step's latency-bound work would pay: docs/OVERLAPPED-DECODE.md).
    Latency,
    /// The page-locked host-to-device copy rate, whole and in an expert stream's piece sizes.
    Link,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Command::Bench(args) => bench(args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tandem-dev: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

type BenchFn = fn(&Gpu, &mut Vec<Row>) -> Result<()>;

fn bench(args: &BenchArgs) -> Result<()> {
    let gpu = Gpu::new(args.gpu, CudaOptions::from_env()?)?;
    eprintln!("gpu: {} ({})", gpu.name, gpu.arch);
    let kernels = [
        Bench::Matvec,
        Bench::Flash,
        Bench::Gemm,
        Bench::Qmma,
        Bench::Dqmma,
        Bench::L2,
    ];
    let asked = |b: Bench| args.what.contains(&b) || (args.what.contains(&Bench::Kernels) && kernels.contains(&b));
    let benches: [(Bench, BenchFn); 9] = [
        (Bench::Matvec, matvec::matvec_bench),
        (Bench::Flash, flash::flash_bench),
        (Bench::Gemm, gemm::gemm_bench),
        (Bench::Qmma, qmma::qmma_bench),
        (Bench::Dqmma, dqmma::dqmma_bench),
        (Bench::L2, int8::l2_bench),
        (Bench::Handover, probes::handover_bench),
        (Bench::Latency, probes::latency_bench),
        (Bench::Link, probes::link_bench),
    ];
    let mut table = Vec::new();
    for (b, run) in benches {
        if asked(b) {
            run(&gpu, &mut table)?;
        }
    }
    println!("\n| measurement | result |");
    println!("|---|---|");
    for r in &table {
        println!("| {} | {} |", r.what, r.result);
    }
    Ok(())
}
